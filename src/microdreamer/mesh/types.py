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
    """

    vertices: np.ndarray
    faces: np.ndarray
    vertex_colors: np.ndarray | None = None

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

    def subset_faces(self, keep: np.ndarray) -> Mesh:
        """The mesh made of the faces selected by ``keep`` ([F] bool or integer indices), without the
        vertices no remaining face uses. Face order is kept; vertex order is kept among survivors."""
        faces = self.faces[keep]
        used = np.zeros(self.num_vertices, dtype=bool)
        used[faces.ravel()] = True
        new_index = np.cumsum(used) - 1
        colors = None if self.vertex_colors is None else self.vertex_colors[used]
        return Mesh(self.vertices[used], new_index[faces], colors)

    def to_trimesh(self):
        """This mesh as a ``trimesh.Trimesh`` (``process=False``: vertices and faces unchanged).

        Vertex colours, if any, become RGBA uint8 vertex colours (rounded, alpha 255).
        """
        import trimesh

        colors = None
        if self.vertex_colors is not None:
            rgb = np.round(np.clip(self.vertex_colors, 0.0, 1.0) * 255.0).astype(np.uint8)
            colors = np.concatenate([rgb, np.full((rgb.shape[0], 1), 255, np.uint8)], axis=1)
        return trimesh.Trimesh(self.vertices, self.faces, vertex_colors=colors, process=False)
