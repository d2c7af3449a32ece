"""The triangle mesh that the mesh stage produces and the texture/export stages consume."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass
class Mesh:
    """An indexed triangle mesh, in world space, with faces wound counter-clockwise seen from outside.

    Arrays are NumPy and live on the CPU; the constructor converts what it is given (lists, other
    dtypes) to the dtypes below and checks the shapes and face indices.

    Attributes:
        vertices: [V, 3] float32, world space (y up).
        faces: [F, 3] int64, indices into ``vertices``; the normal ``cross(v1 - v0, v2 - v0)`` points
            outward (away from the object).
        vertex_colors: optional [V, 3] float32 RGB in [0, 1].
        uv: optional [V, 2] float32 texture coordinates in the OBJ / trimesh convention: u to the
            right, v up (v = 0 is the bottom row of ``texture``, v = 1 the top); texel (i, j) has its
            centre at ``u = (j + 0.5) / Wt, v = 1 - (i + 0.5) / Ht``. Vertices are split at UV seams
            (one UV per vertex), so copies of a position may appear.
        texture: optional [Ht, Wt, 3] uint8 RGB image, row 0 at the top. Given together with ``uv``.
    """

    vertices: np.ndarray
    faces: np.ndarray
    vertex_colors: np.ndarray | None = None
    uv: np.ndarray | None = None
    texture: np.ndarray | None = None

    def __post_init__(self) -> None:
        self.vertices = np.ascontiguousarray(np.asarray(self.vertices, dtype=np.float32).reshape(-1, 3))
        self.faces = np.ascontiguousarray(np.asarray(self.faces, dtype=np.int64).reshape(-1, 3))
        v = self.vertices.shape[0]
        if self.faces.size and (self.faces.min() < 0 or self.faces.max() >= v):
            raise ValueError(
                f"Mesh.faces index range [{self.faces.min()}, {self.faces.max()}] is outside [0, {v - 1}]"
            )
        if self.vertex_colors is not None:
            colors = np.ascontiguousarray(np.asarray(self.vertex_colors, dtype=np.float32))
            if colors.shape != (v, 3):
                raise ValueError(f"Mesh.vertex_colors has shape {colors.shape}, expected ({v}, 3)")
            self.vertex_colors = colors
        if (self.uv is None) != (self.texture is None):
            raise ValueError("Mesh.uv and Mesh.texture must be given together (or neither)")
        if self.uv is not None:
            uv = np.ascontiguousarray(np.asarray(self.uv, dtype=np.float32))
            if uv.shape != (v, 2):
                raise ValueError(f"Mesh.uv has shape {uv.shape}, expected ({v}, 2)")
            self.uv = uv
            texture = np.asarray(self.texture)
            if texture.dtype != np.uint8 or texture.ndim != 3 or texture.shape[2] != 3 or 0 in texture.shape:
                raise ValueError(
                    f"Mesh.texture must be a non-empty [Ht, Wt, 3] uint8 image, got {texture.shape} {texture.dtype}"
                )
            self.texture = np.ascontiguousarray(texture)

    @classmethod
    def empty(cls) -> Mesh:
        """A mesh with no vertices and no faces."""
        return cls(np.zeros((0, 3), np.float32), np.zeros((0, 3), np.int64))

    @property
    def num_vertices(self) -> int:
        """V."""
        return int(self.vertices.shape[0])

    @property
    def num_faces(self) -> int:
        """F."""
        return int(self.faces.shape[0])

    @property
    def has_texture(self) -> bool:
        """True when the mesh carries ``uv`` and ``texture``."""
        return self.texture is not None

    @property
    def is_empty(self) -> bool:
        """True when the mesh has no faces."""
        return self.num_faces == 0

    def bounds(self) -> np.ndarray:
        """[2, 3] float32: the axis-aligned bounding box of the vertices, ``[min_xyz, max_xyz]``.

        Raises ValueError for a mesh without vertices.
        """
        if self.num_vertices == 0:
            raise ValueError("an empty mesh has no bounds")
        return np.stack([self.vertices.min(axis=0), self.vertices.max(axis=0)])

    def subset_faces(self, keep: np.ndarray | slice) -> Mesh:
        """The mesh made of the faces selected by ``keep`` ([F] bool, integer indices or a slice),
        without the vertices no remaining face uses. Face order is kept; vertex order is kept among
        survivors."""
        if isinstance(keep, np.ndarray) and keep.dtype == bool:
            faces = np.compress(keep, self.faces, axis=0)  # faster than boolean indexing
        else:
            faces = self.faces[keep]
        used = np.zeros(self.num_vertices, dtype=bool)
        used[faces.ravel()] = True
        if used.all():  # every vertex stays: same arrays
            return Mesh(self.vertices, faces, self.vertex_colors, self.uv, self.texture)
        new_index = np.cumsum(used) - 1
        colors = None if self.vertex_colors is None else np.compress(used, self.vertex_colors, axis=0)
        uv = None if self.uv is None else np.compress(used, self.uv, axis=0)
        vertices = np.compress(used, self.vertices, axis=0)
        return Mesh(vertices, new_index[faces], colors, uv, self.texture)

    def transformed(self, center: np.ndarray, scale: float, rotation: np.ndarray | None = None) -> Mesh:
        """A copy with vertices mapped to ``scale * R (vertices - center)`` (R = ``rotation``, [3, 3],
        default the identity; colours, UVs, texture kept)."""
        v = (self.vertices.astype(np.float64) - np.asarray(center, dtype=np.float64)) * float(scale)
        if rotation is not None:
            v = v @ np.asarray(rotation, dtype=np.float64).T
        return Mesh(v, self.faces, self.vertex_colors, self.uv, self.texture)

    def texture_float(self) -> np.ndarray | None:
        """[Ht, Wt, 3] float32 texture in [0, 1] (what the mesh renderer samples), or None."""
        return None if self.texture is None else self.texture.astype(np.float32) / 255.0

    def colors_at_vertices(self) -> np.ndarray | None:
        """[V, 3] float32 RGB in [0, 1] per vertex: the texture sampled bilinearly at each vertex's UV
        (repeat wrapping, as the renderer samples it) when the mesh is textured, else the vertex
        colours, else None."""
        if self.texture is None:
            return self.vertex_colors
        return sample_texture_numpy(self.texture_float(), self.uv)

    def to_trimesh(self):
        """This mesh as a ``trimesh.Trimesh`` (``process=False``: vertices and faces unchanged).

        A textured mesh gets ``TextureVisuals``: its UVs and a matte PBR material (base-colour texture,
        metallic 0, roughness 1). Otherwise vertex colours, if any, become RGBA uint8 vertex colours
        (rounded, alpha 255).
        """
        import trimesh

        if self.texture is not None:
            from PIL import Image

            material = trimesh.visual.material.PBRMaterial(
                name="material0",
                baseColorTexture=Image.fromarray(self.texture, mode="RGB"),
                metallicFactor=0.0,
                roughnessFactor=1.0,
            )
            visual = trimesh.visual.TextureVisuals(uv=self.uv, material=material)
            return trimesh.Trimesh(self.vertices, self.faces, visual=visual, process=False)
        colors = None
        if self.vertex_colors is not None:
            rgb = np.round(np.clip(self.vertex_colors, 0.0, 1.0) * 255.0).astype(np.uint8)
            colors = np.concatenate([rgb, np.full((rgb.shape[0], 1), 255, np.uint8)], axis=1)
        return trimesh.Trimesh(self.vertices, self.faces, vertex_colors=colors, process=False)


def sample_texture_numpy(texture: np.ndarray, uv: np.ndarray) -> np.ndarray:
    """Bilinear lookup with repeat wrapping, the convention of :attr:`Mesh.uv`.

    Args:
        texture: [Ht, Wt, D] float image, row 0 at the top.
        uv: [..., 2] texture coordinates (u right, v up).

    Returns:
        [..., D] float32.
    """
    ht, wt = texture.shape[:2]
    x = uv[..., 0].astype(np.float64) * wt - 0.5
    y = (1.0 - uv[..., 1].astype(np.float64)) * ht - 0.5
    x0, y0 = np.floor(x), np.floor(y)
    fx, fy = (x - x0)[..., None], (y - y0)[..., None]
    x0, y0 = x0.astype(np.int64) % wt, y0.astype(np.int64) % ht
    x1, y1 = (x0 + 1) % wt, (y0 + 1) % ht
    tex = texture.astype(np.float64)
    top = tex[y0, x0] * (1 - fx) + tex[y0, x1] * fx
    bottom = tex[y1, x0] * (1 - fx) + tex[y1, x1] * fx
    return (top * (1 - fy) + bottom * fy).astype(np.float32)
