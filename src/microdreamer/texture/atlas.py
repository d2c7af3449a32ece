"""The texels of a UV atlas as surface samples, and filling the texels no bake reached.

:func:`texel_samples` rasterises the UV triangles into the Ht x Wt atlas with the mesh rasteriser
(:func:`microdreamer.render.mesh.rasterize`, through an identity camera looking at the UV plane), so
each covered texel gets its face, barycentrics, 3D surface point and face normal. Both bakes colour
these samples; :func:`fill_texture` then turns per-texel colours into a full image with no empty
texel: covered texels that no view saw take the colour of the nearest seen texel on the surface (3D),
and texels outside every chart (the gutters) the colour of the nearest covered texel in the atlas (2D
nearest-neighbour dilation), so seams never show black under bilinear filtering or mipmapping.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from microdreamer.cameras import Cameras


@dataclass
class TexelSamples:
    """The T covered texels of an Ht x Wt atlas, as points on the mesh surface.

    Attributes:
        height, width: Ht, Wt.
        index: [T] int64 flat texel indices (row-major, row 0 = the top of the image, v = 1).
        face: [T] int64 face containing the texel centre in UV space.
        bary: [T, 3] float32 barycentrics of the texel centre in that face.
        points: [T, 3] float32 world-space surface points.
        normals: [T, 3] float32 unit face normals (outward for a consistently wound mesh).
    """

    height: int
    width: int
    index: torch.Tensor
    face: torch.Tensor
    bary: torch.Tensor
    points: torch.Tensor
    normals: torch.Tensor

    def __len__(self) -> int:
        return int(self.index.shape[0])


def uv_raster_cameras(height: int, width: int, device: str | torch.device = "cpu") -> Cameras:
    """An identity camera that maps the point (u, 1 - v, 1) to texel coordinates (u Wt, (1 - v) Ht)."""
    K = torch.tensor([[float(width), 0.0, 0.0], [0.0, float(height), 0.0], [0.0, 0.0, 1.0]], device=device)
    return Cameras(torch.eye(4, device=device)[None], K[None], width, height, near=0.5, far=2.0)


def rasterize_uv(uv: torch.Tensor, faces: torch.Tensor, height: int, width: int):
    """Rasterise UV triangles into the atlas: :class:`~microdreamer.render.mesh.Fragments` of one view.

    Args:
        uv: [V, 2] float32 (u right, v up). faces: [F, 3] int64.

    Returns:
        Fragments with face_id [1, Ht, Wt] (-1 outside every chart; where charts overlap, the smaller
        face index) and bary [1, Ht, Wt, 3] (affine barycentrics of the texel centre).
    """
    from microdreamer.render.mesh import rasterize

    plane = torch.stack([uv[:, 0], 1.0 - uv[:, 1], torch.ones_like(uv[:, 0])], dim=-1).float()
    return rasterize(plane, faces, uv_raster_cameras(height, width, uv.device))


def texel_samples(
    vertices: torch.Tensor, faces: torch.Tensor, uv: torch.Tensor, height: int, width: int
) -> TexelSamples:
    """The covered texels of the atlas with their surface points and normals.

    Args:
        vertices: [V, 3] float32 world positions; faces: [F, 3] int64; uv: [V, 2] float32; all on one
            device (the computation runs there).
        height, width: Ht x Wt atlas size.
    """
    frags = rasterize_uv(uv, faces, height, width)
    flat = frags.face_id.reshape(-1)
    index = (flat >= 0).nonzero(as_tuple=True)[0]
    face = flat[index]
    bary = frags.bary.reshape(-1, 3)[index]
    tri = vertices[faces[face]]  # [T, 3, 3]
    points = (bary[:, :, None] * tri).sum(dim=1)
    fn = torch.linalg.cross(
        vertices[faces[:, 1]] - vertices[faces[:, 0]], vertices[faces[:, 2]] - vertices[faces[:, 0]]
    )
    normals = torch.nn.functional.normalize(fn, dim=-1)[face]
    return TexelSamples(height, width, index, face, bary, points, normals)


def fill_texture(
    samples: TexelSamples,
    colors: torch.Tensor,
    seen: torch.Tensor,
    default: tuple[float, ...] = (0.5, 0.5, 0.5),
) -> tuple[np.ndarray, dict]:
    """Per-texel colours -> a complete [Ht, Wt, 3] uint8 texture with no empty texel.

    Args:
        samples: the covered texels (T of them).
        colors: [T, 3] float RGB in [0, 1]; only rows where ``seen`` are used.
        seen: [T] bool, the texels that received a colour.
        default: the colour of every texel when no texel was seen at all.

    Returns:
        ``(texture, stats)``: texture [Ht, Wt, 3] uint8; stats has ints ``texels_covered``,
        ``texels_seen``, ``texels_filled_3d`` (covered but unseen, from the nearest seen surface point)
        and ``texels_dilated`` (outside every chart, from the nearest covered texel in the atlas).
    """
    from scipy import ndimage
    from scipy.spatial import cKDTree

    h, w = samples.height, samples.width
    colors = colors.detach().float().cpu().numpy()
    seen_np = seen.detach().cpu().numpy().astype(bool)
    index = samples.index.cpu().numpy()
    out = np.empty((len(samples), 3), np.float32)
    n_seen = int(seen_np.sum())
    stats = {"texels_covered": len(samples), "texels_seen": n_seen}
    if n_seen == 0:
        texture = np.empty((h, w, 3), np.float32)
        texture[:] = default
        stats.update(texels_filled_3d=len(samples), texels_dilated=h * w - len(samples))
        return _to_uint8(texture), stats
    out[seen_np] = colors[seen_np]
    unseen = ~seen_np
    if unseen.any():
        points = samples.points.detach().float().cpu().numpy()
        _, nearest = cKDTree(points[seen_np]).query(points[unseen])
        out[unseen] = colors[seen_np][nearest]
    stats["texels_filled_3d"] = int(unseen.sum())

    texture = np.zeros((h * w, 3), np.float32)
    texture[index] = out
    covered = np.zeros(h * w, bool)
    covered[index] = True
    covered = covered.reshape(h, w)
    texture = texture.reshape(h, w, 3)
    if not covered.all():
        # nearest covered texel for every texel (exact Euclidean distance transform)
        _, (iy, ix) = ndimage.distance_transform_edt(~covered, return_indices=True)
        texture = texture[iy, ix]
    stats["texels_dilated"] = int(h * w - len(samples))
    return _to_uint8(texture), stats


def redilate(texture: np.ndarray, samples: TexelSamples) -> np.ndarray:
    """[Ht, Wt, 3] texture with every texel outside the charts replaced by its nearest covered texel."""
    from scipy import ndimage

    h, w = samples.height, samples.width
    covered = np.zeros(h * w, bool)
    covered[samples.index.cpu().numpy()] = True
    covered = covered.reshape(h, w)
    if covered.all() or not covered.any():
        return texture
    _, (iy, ix) = ndimage.distance_transform_edt(~covered, return_indices=True)
    return np.ascontiguousarray(texture[iy, ix])


def _to_uint8(texture: np.ndarray) -> np.ndarray:
    return np.round(np.clip(texture, 0.0, 1.0) * 255.0).astype(np.uint8)
