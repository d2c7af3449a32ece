"""A GPU without a CUDA compiler (or whose kernel build fails): the ``"auto"`` choices take the PyTorch
paths and one warning line says what is slower and how to get the fast path. The decision logic, run on
the CPU with the missing compiler, the GPU and the failing build simulated."""

from __future__ import annotations

import logging
import sys
import types

import pytest
import torch

from microdreamer import fallback
from microdreamer.field import _field_backend
from microdreamer.kernels import _backend
from microdreamer.render import _gsplat, gaussians

CUDA = torch.device("cuda")


@pytest.fixture
def fresh(monkeypatch):
    """No kernels loaded or failed, nothing said, gsplat's decision forgotten; a CUDA build of torch with
    a visible GPU, pretended."""
    monkeypatch.setattr(_backend, "_module", None)
    monkeypatch.setattr(_backend, "_failure", None)
    monkeypatch.setattr(torch.version, "cuda", "13.0")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(_backend, "finished_build_exists", lambda: False)
    fallback.reset()
    _gsplat.usable.cache_clear()
    yield
    fallback.reset()
    _gsplat.usable.cache_clear()


def _fake_gsplat(monkeypatch, c_module):
    """A stand-in gsplat whose ``gsplat.cuda._backend._C`` is ``c_module``."""
    pkg, cuda, backend = (types.ModuleType(n) for n in ("gsplat", "gsplat.cuda", "gsplat.cuda._backend"))
    backend._C = c_module
    cuda._backend = backend
    pkg.cuda = cuda
    for name, mod in (("gsplat", pkg), ("gsplat.cuda", cuda), ("gsplat.cuda._backend", backend)):
        monkeypatch.setitem(sys.modules, name, mod)
    monkeypatch.setattr(_gsplat, "installed", lambda: True)
    monkeypatch.setattr(gaussians, "gsplat_available", lambda: True)


def _warnings(caplog):
    """The fallback notices (a build's own "compiling ..." line is another logger's)."""
    return [
        r.getMessage() for r in caplog.records if r.levelno == logging.WARNING and r.name == "microdreamer"
    ]


def test_no_compiler_takes_the_pytorch_paths_and_says_so_once(fresh, monkeypatch, caplog):
    monkeypatch.setattr(_backend, "toolkit", lambda: None)
    monkeypatch.setattr(_gsplat, "prebuilt", lambda: False)
    _fake_gsplat(monkeypatch, None)
    caplog.set_level(logging.WARNING)
    assert _field_backend("auto", CUDA) == "torch"
    assert gaussians.resolve_backend("auto", CUDA) == "torch"
    assert _field_backend("auto", CUDA) == "torch"  # the failure is remembered: no second attempt
    lines = _warnings(caplog)
    assert len(lines) == 1, lines
    line = lines[0]
    assert "\n" not in line
    assert line.startswith("no CUDA compiler (nvcc) found: ")
    # what is slower, and how to get the fast path
    assert "the density field and silhouette carving and splat rendering (gsplat)" in line
    assert "install the CUDA toolkit matching torch's CUDA 13.0" in line
    with pytest.raises(_backend.NoCompiler):
        _backend.load()


def test_no_compiler_with_a_finished_build_keeps_the_kernels(fresh, monkeypatch, caplog):
    """A cached build loads without a compiler: only gsplat (no prebuilt extension) falls back."""
    monkeypatch.setattr(_backend, "toolkit", lambda: None)
    monkeypatch.setattr(_backend, "finished_build_exists", lambda: True)
    monkeypatch.setattr(_backend, "build_folder", lambda: __import__("pathlib").Path("/nonexistent"))
    sentinel = types.ModuleType("microdreamer_kernels")
    monkeypatch.setattr(_backend, "_import_built", lambda path: sentinel)
    monkeypatch.setattr(_gsplat, "prebuilt", lambda: False)
    _fake_gsplat(monkeypatch, None)
    caplog.set_level(logging.WARNING)
    assert _field_backend("auto", CUDA) == "cuda"
    assert gaussians.resolve_backend("auto", CUDA) == "torch"
    lines = _warnings(caplog)
    assert len(lines) == 1 and "no CUDA compiler" in lines[0], lines
    assert "splat rendering (gsplat)" in lines[0] and "density field" not in lines[0]


def test_a_prebuilt_gsplat_needs_no_compiler(fresh, monkeypatch, caplog):
    monkeypatch.setattr(_backend, "toolkit", lambda: None)
    monkeypatch.setattr(_gsplat, "prebuilt", lambda: True)
    _fake_gsplat(monkeypatch, types.ModuleType("csrc"))
    caplog.set_level(logging.WARNING)
    assert gaussians.resolve_backend("auto", CUDA) == "gsplat"
    assert _warnings(caplog) == []


def test_a_failed_build_is_said_once_per_component_and_not_retried(fresh, monkeypatch, caplog):
    from torch.utils import cpp_extension

    calls = []

    def failing_build(**kwargs):
        calls.append(kwargs["name"])
        raise RuntimeError(
            "Error building extension 'microdreamer_kernels'\nfatal error: cuda_runtime.h: missing"
        )

    monkeypatch.setattr(_backend, "toolkit", lambda: "/usr/local/cuda/bin/nvcc")
    monkeypatch.setattr(_backend, "build_folder", lambda: __import__("pathlib").Path("/tmp/md_fallback_test"))
    monkeypatch.setattr(cpp_extension, "load", failing_build)

    def gsplat_build_fails(name, *args, **kwargs):
        if name == "gsplat.cuda._backend":
            raise OSError("ninja: build stopped: subcommand failed.")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(_gsplat, "installed", lambda: True)
    monkeypatch.setattr(_gsplat, "prebuilt", lambda: False)
    monkeypatch.setattr(gaussians, "gsplat_available", lambda: True)
    monkeypatch.delitem(sys.modules, "gsplat.cuda._backend", raising=False)
    real_import = __builtins__["__import__"] if isinstance(__builtins__, dict) else __builtins__.__import__
    monkeypatch.setattr("builtins.__import__", gsplat_build_fails)
    caplog.set_level(logging.WARNING)
    for _ in range(3):
        assert _field_backend("auto", CUDA) == "torch"
        assert gaussians.resolve_backend("auto", CUDA) == "torch"
    assert calls == ["microdreamer_kernels"]
    lines = _warnings(caplog)
    assert len(lines) == 2, lines
    assert all("\n" not in ln for ln in lines)
    assert lines[0].startswith("building the microdreamer CUDA kernels failed (fatal error: cuda_runtime.h")
    assert lines[1].startswith("building gsplat's CUDA code failed (OSError: ninja: build stopped")
    with pytest.raises(RuntimeError, match="could not load its CUDA code"):
        gaussians.resolve_backend("gsplat", CUDA)


def test_explicit_backends_are_unchanged_on_the_cpu():
    assert _field_backend("torch", CUDA) == "torch"
    assert _field_backend("cuda", CUDA) == "cuda"  # explicit: no fallback (its errors say why)
    with pytest.raises(ValueError):
        _field_backend("cuda", torch.device("cpu"))


def test_prebuilt_looks_for_the_extension_file(monkeypatch, tmp_path):
    import importlib.util

    pkg = tmp_path / "gsplat"
    pkg.mkdir()
    spec = types.SimpleNamespace(submodule_search_locations=[str(pkg)])
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: spec if name == "gsplat" else None)
    assert not _gsplat.prebuilt()
    (pkg / "csrc.cpython-312-x86_64-linux-gnu.so").write_bytes(b"")
    assert _gsplat.prebuilt()
