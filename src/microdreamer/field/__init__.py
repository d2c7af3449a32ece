"""Density field: the Gaussian splat sampled on a regular grid (DreamGaussian's ``extract_fields``).

Stage function :func:`density_field`. Implementations, chosen explicitly with ``backend=``:

* ``"torch"``: vectorised, chunked PyTorch (CPU or CUDA), :mod:`microdreamer.field.torch_impl`.
* ``"cuda"``: the fused CUDA kernels (CUDA tensors only), through :mod:`microdreamer.field.cuda`, which
  holds their options and the policy that picks them.
* ``"cpp"``: the C++ CPU kernel (CPU tensors; built with the system's C++ compiler on first use),
  :mod:`microdreamer.field.cpp_impl`: each Gaussian scattered into its box, 5-10x faster than
  ``"torch"`` on the CPU (``benchmarks/README.md``).
* ``"auto"``: ``"cuda"`` when the splat is on a CUDA device and the kernels load (built with ``nvcc`` on
  first use; without one, ``"torch"`` on the GPU and a one-line notice, :mod:`microdreamer.fallback`),
  else ``"cpp"`` where the C++ kernels build, else ``"torch"``.

:mod:`microdreamer.field.reference` holds the float64 brute-force reference that defines the
semantics (see :mod:`microdreamer.field.common` for the modes and the exact mode's error bound).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from microdreamer.config import FieldConfig
from microdreamer.field.common import (
    GridSpec,
    PreparedGaussians,
    auto_resolution,
    prepare_gaussians,
    resolve_resolution,
)
from microdreamer.field.torch_impl import density_field_torch
from microdreamer.splat import Splat

__all__ = [
    "BACKENDS",
    "DensityField",
    "FieldConfig",
    "GridSpec",
    "PreparedGaussians",
    "auto_resolution",
    "compute_field",
    "density_field",
    "prepare_gaussians",
    "resolve_resolution",
]

BACKENDS = ("auto", "torch", "cuda", "cpp")


@dataclass
class DensityField:
    """A sampled density field.

    Attributes:
        values: [R, R, R] float32 (on the device it was computed on); [i, j, k] is the world point
            ``grid.origin + grid.spacing * (i, j, k)``.
        grid: the grid, with the map back to the splat's coordinates.
        num_gaussians: N, the Gaussians kept (opacity > min_opacity).
        mode: the field mode.
        backend: the implementation that ran.
    """

    values: torch.Tensor
    grid: GridSpec
    num_gaussians: int
    mode: str
    backend: str


def _field_backend(backend: str, device: torch.device) -> str:
    if backend not in BACKENDS:
        raise ValueError(f"unknown field backend {backend!r}; use one of {', '.join(BACKENDS)}")
    if backend == "auto":
        if device.type == "cuda":
            from microdreamer import fallback

            # without a compiler (or when the build fails): the PyTorch path, and one line saying so
            return "cuda" if fallback.kernels_usable() else "torch"
        from microdreamer.kernels import cpu

        return "cpp" if device.type == "cpu" and cpu.usable() else "torch"
    if backend == "cuda" and device.type != "cuda":
        raise ValueError("backend='cuda' needs the splat on a CUDA device")
    if backend == "cpp" and device.type != "cpu":
        raise ValueError("backend='cpp' needs the splat on the CPU")
    return backend


def compute_field(
    prepared: PreparedGaussians, grid: GridSpec, config: FieldConfig, backend: str = "auto", progress=None
) -> tuple[torch.Tensor, str]:
    """[R, R, R] float32 field of already-prepared Gaussians, and the backend that ran."""
    chosen = _field_backend(backend, prepared.means.device)
    if chosen == "cuda":
        from microdreamer.field.cuda import extract_fields

        return extract_fields(prepared, grid, config), chosen
    if chosen == "cpp":
        from microdreamer.field.cpp_impl import density_field_cpp

        values = density_field_cpp(prepared, grid, config)
        if progress is not None:
            progress(1.0)
        return values, chosen
    return density_field_torch(prepared, grid, config, progress=progress), chosen


def density_field(
    splat: Splat,
    config: FieldConfig | None = None,
    backend: str = "auto",
    device: str | torch.device | None = None,
    progress=None,
) -> DensityField:
    """Sample the splat's density on a grid.

    Args:
        splat: N Gaussians (any device).
        config: resolution (a number, or ``"auto"``: :func:`auto_resolution`), mode and their
            parameters (defaults: 128^3, exact mode).
        backend: ``"auto" | "torch" | "cuda" | "cpp"``.
        device: where to compute (defaults to the splat's device).
        progress: optional callable ``progress(done_fraction)`` (torch backend).
    """
    config = config or FieldConfig()
    if device is not None:
        splat = splat.to(device)
    config = resolve_resolution(splat, config)
    prepared, grid = prepare_gaussians(splat, config)
    values, chosen = compute_field(prepared, grid, config, backend, progress)
    return DensityField(values, grid, len(prepared), config.mode, chosen)
