from pathlib import Path

import pytest
import torch

SAMPLES = Path(__file__).resolve().parents[1] / ".." / "shared" / "samples"


def sample(rel: str) -> Path:
    """Path of a file under ../shared/samples; skips the test when it is absent."""
    path = SAMPLES / rel
    if not path.exists():
        pytest.skip(f"sample data {rel} not found at {SAMPLES} (the read-only ../shared/samples folder)")
    return path


# the bound for every density-field implementation against the float64 reference (float32
# exponentials and sums give ~1e-7..1e-6)
FIELD_REL_TOL = 1e-5


def rel_err(out: torch.Tensor, ref: torch.Tensor) -> float:
    """Relative L2 error ||out - ref|| / ||ref|| in float64 on the CPU; ``out`` must be finite."""
    assert torch.isfinite(out).all(), "non-finite (or unwritten NaN) values"
    out, ref = out.double().cpu(), ref.double().cpu()
    return float((out - ref).norm() / ref.norm().clamp_min(1e-300))


def assert_field_matches(out: torch.Tensor, ref: torch.Tensor) -> float:
    """A density field against its float64 reference: all zeros where the reference is, else within
    FIELD_REL_TOL; returns the relative error."""
    if ref.abs().max() == 0:
        assert out.abs().max() == 0
        return 0.0
    err = rel_err(out, ref)
    assert err <= FIELD_REL_TOL, err
    return err


def pytest_collection_modifyitems(config, items):
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU; none is available on this machine")
    for item in items:
        if "cuda" in item.keywords:
            item.add_marker(skip)
