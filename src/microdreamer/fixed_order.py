"""Small products summed in a fixed order: the same bits for a row whatever the batch around it.

A matrix product on float32 CPU tensors (``@``, ``torch.matmul``, ``bmm``, ``einsum``) goes to the BLAS
(MKL in PyTorch's wheels), which chooses its kernel, blocking and order of summation from the matrices'
shapes and the CPU. The same camera's row can then come out with other last bits when more or fewer
cameras share the call: on a 2-core AMD EPYC (AVX-512) with MKL's default code path (``MKL_CBWR`` unset,
``AUTO``, ``AVX2``, ``AVX512`` or even ``SSE4_2``), ``einsum("cij,vj->cvi")`` on 7 cameras differs from
the same cameras in groups of 1, 2 or 3, and on 1000 points from the points in ranges of 333; only
``MKL_CBWR=COMPATIBLE`` gave equal bits. Work that is split into groups of cameras or of texels (threads,
chunks) must give each group the bits the whole gives, so its 3x3 and 4x4 products go through these
functions instead: every output element is the same sequence of float32 multiplications and additions,
left to right over the summed index, whatever the batch's shape, size, strides or thread count.
PyTorch's elementwise kernels round every operation on its own (nothing fused), so the result depends on
the operands alone.

Cost: one elementwise pass per term instead of one BLAS call, so about 2-3x the product's own time on
one CPU thread (26 views of 100k vertices: 56 ms against the einsum's 19 ms; 4 views of 100k Gaussian
covariances: 0.20 s against 0.10 s), small beside the rasterisation that follows. Paths that are not
split into groups, and products whose reduction is long (the Gaussian compositing's sums over a tile's
list), keep the BLAS.
"""

from __future__ import annotations

import torch


def dot(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """``(a * b).sum(-1)`` summed left to right: a [..., n], b [..., n] (broadcast) -> [...]."""
    n = a.shape[-1]
    if b.shape[-1] != n:
        raise ValueError(f"dot of [..., {n}] and [..., {b.shape[-1]}]: the last sizes must match")
    out = a[..., 0] * b[..., 0]
    for j in range(1, n):
        out = out + a[..., j] * b[..., j]
    return out


def total(x: torch.Tensor, dim: int = -1) -> torch.Tensor:
    """``x.sum(dim)`` added left to right (for small dimensions: one pass per entry)."""
    parts = x.unbind(dim)
    out = parts[0]
    for p in parts[1:]:
        out = out + p
    return out


def norm(a: torch.Tensor) -> torch.Tensor:
    """Euclidean length over the last dimension: a [..., n] -> [...], ``sqrt(dot(a, a))``."""
    return torch.sqrt(dot(a, a))


def matmul(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """``a @ b`` with each entry summed left to right over the inner index.

    Args:
        a: [..., m, n]; b: [..., n, p] (batch dimensions broadcast).

    Returns:
        [..., m, p], ``out[..., i, k] = (a[..., i, 0] b[..., 0, k] + a[..., i, 1] b[..., 1, k]) + ...``.
    """
    n = a.shape[-1]
    if b.shape[-2] != n:
        raise ValueError(f"matmul of [..., {a.shape[-2]}, {n}] and [..., {b.shape[-2]}, {b.shape[-1]}]")
    out = a[..., :, 0:1] * b[..., 0:1, :]
    for j in range(1, n):
        out = out + a[..., :, j : j + 1] * b[..., j : j + 1, :]
    return out


def transform_points(rotation: torch.Tensor, translation: torch.Tensor | None, points: torch.Tensor):
    """Points into C frames: ``R_c p + t_c`` for every camera c and point p.

    Args:
        rotation: [C, 3, 3] (any linear part, e.g. a view matrix's top-left block).
        translation: [C, 3], or None for no translation.
        points: [N, 3].

    Returns:
        [C, N, 3]: ``((R[c, i, 0] x + R[c, i, 1] y) + R[c, i, 2] z) + t[c, i]`` for row i.
    """
    x, y, z = points[:, 0], points[:, 1], points[:, 2]
    rows = []
    for i in range(3):
        r = (rotation[:, i, 0, None] * x + rotation[:, i, 1, None] * y) + rotation[:, i, 2, None] * z
        rows.append(r if translation is None else r + translation[:, i, None])
    return torch.stack(rows, dim=-1)
