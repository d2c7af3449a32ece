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


def pytest_collection_modifyitems(config, items):
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU; none is available on this machine")
    for item in items:
        if "cuda" in item.keywords:
            item.add_marker(skip)
