"""Quality metrics: PSNR and SSIM between images, Chamfer-L1 and F-score between meshes.

Image metrics take images ``[..., H, W, 3]`` float in [0, 1] (any leading batch dimensions, e.g. C
views) and return one value per image, shape ``[...]``.

Mesh metrics compare two surfaces through points sampled uniformly (area-weighted) on each, and
nearest-neighbour distances between the two point sets (``scipy.spatial.cKDTree``). A "mesh" is
anything with ``vertices`` [V, 3] and ``faces`` [F, 3] attributes (``microdreamer.mesh.Mesh``,
``trimesh.Trimesh``) or a ``(vertices, faces)`` pair, as NumPy
arrays or tensors. The definitions:

* ``d(p, B)``: Euclidean distance from a point ``p`` sampled on A to the nearest point sampled on B.
* Chamfer-L1 (as in Occupancy Networks and most reconstruction papers):
  ``0.5 * (mean_{p in A} d(p, B) + mean_{q in B} d(q, A))``, in the meshes' units. It is the
  symmetric mean surface distance, so no separate function is given for that.
* F-score at ``tau`` (Knapitsch et al., Tanks and Temples): precision = fraction of the predicted
  mesh's points within ``tau`` of the ground truth, recall = fraction of the ground truth's points
  within ``tau`` of the prediction, F = 2 P R / (P + R) (0 when both are 0).

Sampling both surfaces with n points adds a bias of order the sampling spacing
(``sqrt(area / n)``) to the distances; use the same n when comparing numbers.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

# ---------------------------------------------------------------------------------------------
# images


def psnr(a: torch.Tensor, b: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
    """Peak signal-to-noise ratio in dB for images in [0, 1] (peak value 1).

    Args:
        a, b: [..., H, W, 3] float images in [0, 1].
        mask: optional [..., H, W] or [..., H, W, 1] bool or float weights; the MSE is averaged over
            the masked pixels only (weighted by the mask).

    Returns:
        [...] float32, ``-10 log10(MSE)`` per image; ``inf`` for identical images (no cap).
    """
    a, b = _check_images(a, b, "psnr")
    se = (a - b).square()
    if mask is None:
        mse = se.mean(dim=(-3, -2, -1))
    else:
        m = torch.as_tensor(mask, device=a.device).to(torch.float32)
        if m.dim() == a.dim():
            m = m[..., 0]
        if m.shape != a.shape[:-1]:
            raise ValueError(f"psnr: mask has shape {tuple(m.shape)}, expected {tuple(a.shape[:-1])}")
        mse = (se.sum(dim=-1) * m).sum(dim=(-2, -1)) / (3.0 * m.sum(dim=(-2, -1)).clamp_min(1e-12))
    return -10.0 * torch.log10(mse)


def _gaussian_window(size: int, sigma: float, device, dtype) -> torch.Tensor:
    x = torch.arange(size, device=device, dtype=torch.float64) - (size - 1) / 2
    g = torch.exp(-(x**2) / (2 * sigma**2))
    return (g / g.sum()).to(dtype)


def ssim(
    a: torch.Tensor,
    b: torch.Tensor,
    window_size: int = 11,
    sigma: float = 1.5,
    k1: float = 0.01,
    k2: float = 0.03,
) -> torch.Tensor:
    """Structural similarity (Wang et al. 2004) for images in [0, 1] (data range 1).

    Local statistics use a normalised Gaussian window (11 taps, sigma 1.5) over the positions where
    the window fits inside the image ("valid" filtering, as in the reference implementation), with
    population (biased) variances and C1 = (k1)^2, C2 = (k2)^2. The SSIM map is averaged over
    positions and channels. This equals ``skimage.metrics.structural_similarity(a, b,
    gaussian_weights=True, sigma=1.5, use_sample_covariance=False, data_range=1, channel_axis=-1)``.

    Args:
        a, b: [..., H, W, 3] float images in [0, 1], H and W >= ``window_size``.

    Returns:
        [...] float32, SSIM per image (1 for identical images).
    """
    a, b = _check_images(a, b, "ssim")
    h, w = a.shape[-3], a.shape[-2]
    if h < window_size or w < window_size:
        raise ValueError(f"ssim: images of {h}x{w} are smaller than the {window_size}-pixel window")
    batch = a.shape[:-3]
    x = a.reshape(-1, h, w, 3).permute(0, 3, 1, 2).reshape(-1, 1, h, w).double()
    y = b.reshape(-1, h, w, 3).permute(0, 3, 1, 2).reshape(-1, 1, h, w).double()
    g = _gaussian_window(window_size, sigma, x.device, x.dtype)
    gx, gy = g.view(1, 1, 1, -1), g.view(1, 1, -1, 1)

    def blur(t: torch.Tensor) -> torch.Tensor:  # separable valid Gaussian filter
        return torch.nn.functional.conv2d(torch.nn.functional.conv2d(t, gx), gy)

    mu_x, mu_y = blur(x), blur(y)
    sxx = blur(x * x) - mu_x**2
    syy = blur(y * y) - mu_y**2
    sxy = blur(x * y) - mu_x * mu_y
    c1, c2 = k1**2, k2**2
    s = ((2 * mu_x * mu_y + c1) * (2 * sxy + c2)) / ((mu_x**2 + mu_y**2 + c1) * (sxx + syy + c2))
    per_channel = s.mean(dim=(-2, -1)).reshape(-1, 3)
    return per_channel.mean(dim=-1).to(torch.float32).reshape(batch)


def _check_images(a, b, name: str) -> tuple[torch.Tensor, torch.Tensor]:
    a = torch.as_tensor(a).to(torch.float32)
    b = torch.as_tensor(b).to(device=a.device, dtype=torch.float32)
    if a.shape != b.shape or a.dim() < 3 or a.shape[-1] != 3:
        raise ValueError(
            f"{name}: images must both be [..., H, W, 3]; got {tuple(a.shape)} and {tuple(b.shape)}"
        )
    return a, b


# ---------------------------------------------------------------------------------------------
# meshes


def _vertices_faces(mesh: Any) -> tuple[np.ndarray, np.ndarray]:
    """([V, 3] float64, [F, 3] int64) from a mesh-like object or a (vertices, faces) pair."""
    if isinstance(mesh, tuple | list) and len(mesh) == 2:
        v, f = mesh
    else:
        v, f = mesh.vertices, mesh.faces
    if isinstance(v, torch.Tensor):
        v = v.detach().cpu().numpy()
    if isinstance(f, torch.Tensor):
        f = f.detach().cpu().numpy()
    v = np.asarray(v, dtype=np.float64).reshape(-1, 3)
    f = np.asarray(f, dtype=np.int64).reshape(-1, 3)
    return v, f


def sample_surface(vertices, faces, n: int, seed: int = 0) -> np.ndarray:
    """Points sampled uniformly on a triangle mesh's surface (faces chosen with probability
    proportional to area, then a uniform point inside the face).

    Args:
        vertices: [V, 3] float array or tensor.
        faces: [F, 3] int array or tensor.
        n: number of points.
        seed: seed of the NumPy random generator (same seed, same points).

    Returns:
        [n, 3] float64 points. Raises ValueError when the mesh has no face of positive area.
    """
    v, f = _vertices_faces((vertices, faces))
    tri = v[f]  # [F, 3, 3]
    areas = 0.5 * np.linalg.norm(np.cross(tri[:, 1] - tri[:, 0], tri[:, 2] - tri[:, 0]), axis=-1)
    total = areas.sum() if len(areas) else 0.0
    if not total > 0:
        raise ValueError("sample_surface: the mesh has no face of positive area")
    rng = np.random.default_rng(seed)
    face_idx = rng.choice(len(f), size=n, p=areas / total)
    r1, r2 = rng.random(n), rng.random(n)
    s = np.sqrt(r1)  # (1 - s, s (1 - r2), s r2) is uniform on the triangle
    w0, w1, w2 = 1.0 - s, s * (1.0 - r2), s * r2
    t = tri[face_idx]
    return w0[:, None] * t[:, 0] + w1[:, None] * t[:, 1] + w2[:, None] * t[:, 2]


def surface_distances(
    mesh_a: Any, mesh_b: Any, n: int = 100_000, seed: int = 0
) -> tuple[np.ndarray, np.ndarray]:
    """Nearest-neighbour distances between n points sampled on each of two meshes.

    Returns:
        (d_ab [n] float64: from each point of A to the nearest point of B,
         d_ba [n] float64: from each point of B to the nearest point of A).
    """
    from scipy.spatial import cKDTree

    pa = sample_surface(*_vertices_faces(mesh_a), n, seed=seed)
    pb = sample_surface(*_vertices_faces(mesh_b), n, seed=seed + 1)
    d_ab = cKDTree(pb).query(pa, k=1)[0]
    d_ba = cKDTree(pa).query(pb, k=1)[0]
    return d_ab, d_ba


def chamfer_l1(mesh_a: Any, mesh_b: Any, n: int = 100_000, seed: int = 0) -> float:
    """Chamfer-L1 distance: ``0.5 * (mean d(a, B) + mean d(b, A))`` over n points sampled on each mesh,
    with d the Euclidean distance to the nearest sampled point of the other mesh (see module
    docstring). In the meshes' units; symmetric; ~0 for identical surfaces (up to sampling)."""
    d_ab, d_ba = surface_distances(mesh_a, mesh_b, n, seed)
    return float(0.5 * (d_ab.mean() + d_ba.mean()))


@dataclass
class FScore:
    """F-score at distance ``tau``: precision (prediction -> ground truth), recall, and F."""

    precision: float
    recall: float
    fscore: float
    tau: float


def _fscore_from(d_pred_gt: np.ndarray, d_gt_pred: np.ndarray, tau: float) -> FScore:
    p = float((d_pred_gt <= tau).mean())
    r = float((d_gt_pred <= tau).mean())
    f = 0.0 if p + r == 0 else 2 * p * r / (p + r)
    return FScore(p, r, f, float(tau))


def fscore(pred: Any, gt: Any, tau: float, n: int = 100_000, seed: int = 0) -> FScore:
    """F-score at distance ``tau`` between a predicted mesh and a ground-truth mesh (module docstring)."""
    d_pg, d_gp = surface_distances(pred, gt, n, seed)
    return _fscore_from(d_pg, d_gp, tau)


def mesh_metrics(
    pred: Any,
    gt: Any,
    n: int = 100_000,
    seed: int = 0,
    tau_fractions: tuple[float, ...] = (0.01,),
) -> dict[str, float]:
    """All mesh metrics from one sampling, with thresholds relative to the ground truth's size.

    Args:
        pred, gt: meshes (see module docstring).
        n: points sampled on each surface.
        tau_fractions: F-score thresholds as fractions of the ground truth's bounding-box diagonal.

    Returns:
        ``{"chamfer_l1", "chamfer_l1_rel" (divided by the diagonal), "gt_bbox_diagonal",
        "fscore@<frac>", "precision@<frac>", "recall@<frac>" for each fraction}``.
    """
    gv, _ = _vertices_faces(gt)
    diag = float(np.linalg.norm(gv.max(axis=0) - gv.min(axis=0)))
    d_pg, d_gp = surface_distances(pred, gt, n, seed)
    cd = float(0.5 * (d_pg.mean() + d_gp.mean()))
    out = {"chamfer_l1": cd, "chamfer_l1_rel": cd / diag if diag > 0 else math.nan, "gt_bbox_diagonal": diag}
    for frac in tau_fractions:
        fs = _fscore_from(d_pg, d_gp, frac * diag)
        out[f"fscore@{frac:g}"] = fs.fscore
        out[f"precision@{frac:g}"] = fs.precision
        out[f"recall@{frac:g}"] = fs.recall
    return out
