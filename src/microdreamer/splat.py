"""The Gaussian splat: parameters, activations, covariances, and reading and writing its files.

Reading, its checks and the policy for degenerate Gaussians live in :mod:`microdreamer.formats` (one
module a format, NumPy only); :func:`read_splat` is that package's reader (any format, chosen by
content) followed by :meth:`Splat.from_arrays`; :func:`write_ply` writes the INRIA 3DGS layout
(``x y z nx ny nz f_dc_* f_rest_* opacity scale_* rot_*``, float32) and
:func:`microdreamer.formats.write_splat` every format by the output's name.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable
from dataclasses import dataclass, fields
from pathlib import Path

import numpy as np
import torch

from microdreamer.formats import read_splat_arrays
from microdreamer.formats.common import SplatArrays
from microdreamer.formats.ply import (  # noqa: F401 (re-exported: the limits are part of read_ply's contract)
    BASE_PROPS,
    LOG_SCALE_MAX,
    LOG_SCALE_MIN,
    MAX_HEADER_BYTES,
    QUAT_MIN_LENGTH,
    TAIL_PROPS,
)
from microdreamer.formats.ply import write as _write_ply_arrays

SH_C0 = 0.28209479177387814  # Y_0^0 = 1 / (2 sqrt(pi))


def num_sh_coeffs(degree: int) -> int:
    """K, the number of SH coefficients per colour channel for an SH degree (0..3)."""
    return (degree + 1) ** 2


@dataclass
class Splat:
    """A set of N 3D Gaussians, stored as raw (pre-activation) parameters, as the optimiser sees them.

    Attributes:
        means: [N, 3] float32, world space.
        sh_dc: [N, 3] float32, degree-0 SH coefficient per RGB channel (``f_dc_*``).
        sh_rest: [N, K-1, 3] float32, higher-order SH coefficients (K-1 = 0, 3, 8 or 15).
        opacity_logits: [N] float32; the opacity is ``sigmoid(opacity_logits)``.
        log_scales: [N, 3] float32; the standard deviations along the Gaussian's axes are ``exp``.
        quats: [N, 4] float32, rotation quaternions (w, x, y, z), not necessarily unit length:
            they are normalised on use.
    """

    means: torch.Tensor
    sh_dc: torch.Tensor
    sh_rest: torch.Tensor
    opacity_logits: torch.Tensor
    log_scales: torch.Tensor
    quats: torch.Tensor

    def __post_init__(self) -> None:
        n = self.means.shape[0]
        expect = {
            "means": (n, 3), "sh_dc": (n, 3), "opacity_logits": (n,), "log_scales": (n, 3), "quats": (n, 4),
        }  # fmt: skip
        for name, shape in expect.items():
            got = tuple(getattr(self, name).shape)
            if got != shape:
                raise ValueError(f"Splat.{name} has shape {got}, expected {shape}")
        rest = tuple(self.sh_rest.shape)
        if len(rest) != 3 or rest[0] != n or rest[2] != 3 or rest[1] not in (0, 3, 8, 15):
            raise ValueError(f"Splat.sh_rest has shape {rest}, expected ({n}, 0|3|8|15, 3)")

    # ----------------------------------------------------------------- basics
    def __len__(self) -> int:
        return self.means.shape[0]

    @property
    def sh_degree(self) -> int:
        return int(round(math.sqrt(self.sh_rest.shape[1] + 1))) - 1

    @property
    def device(self) -> torch.device:
        return self.means.device

    def tensors(self) -> dict[str, torch.Tensor]:
        return {f.name: getattr(self, f.name) for f in fields(self)}

    def to(self, device: str | torch.device) -> Splat:
        return Splat(**{k: v.to(device) for k, v in self.tensors().items()})

    def subset(self, index: torch.Tensor) -> Splat:
        """The Gaussians selected by a boolean mask [N] or an index tensor."""
        return Splat(**{k: v[index] for k, v in self.tensors().items()})

    def detach(self) -> Splat:
        return Splat(**{k: v.detach() for k, v in self.tensors().items()})

    def transformed(
        self,
        rotation: torch.Tensor | None = None,
        scale: float = 1.0,
        translation: torch.Tensor | None = None,
    ) -> Splat:
        """The splat mapped by the similarity ``x -> scale * R x + t``: centres moved, every Gaussian's
        axes rotated by R (its quaternion left-multiplied) and its scales times ``scale``, the view-
        dependent SH bands rotated with it (:func:`rotate_sh`), so it renders as the same object seen
        in the mapped frame. Opacities and base colours are unchanged.

        Args:
            rotation: [3, 3] proper rotation (any float dtype, NumPy or torch); None = the identity.
            scale: positive factor.
            translation: [3]; None = 0.
        """
        dev, dt = self.means.device, self.means.dtype
        if not scale > 0:
            raise ValueError(f"scale must be positive, got {scale}")
        R = (
            torch.eye(3, dtype=torch.float64)
            if rotation is None
            else torch.as_tensor(rotation).double().cpu()
        )
        if R.shape != (3, 3) or not torch.allclose(R @ R.T, torch.eye(3, dtype=torch.float64), atol=1e-6):
            raise ValueError(f"rotation must be a 3 x 3 rotation matrix, got {tuple(R.shape)}")
        if float(torch.linalg.det(R)) < 0:
            raise ValueError(
                "rotation must be proper (det +1): a reflection would turn the Gaussians inside out"
            )
        t = (
            torch.zeros(3, dtype=torch.float64)
            if translation is None
            else torch.as_tensor(translation).double()
        )
        means = (scale * self.means.double() @ R.to(dev).T + t.to(dev)).to(dt)
        q = rotmat_to_quat(R).to(dev, dt)
        return Splat(
            means=means,
            sh_dc=self.sh_dc.clone(),
            sh_rest=rotate_sh(self.sh_rest, R),
            opacity_logits=self.opacity_logits.clone(),
            log_scales=self.log_scales + math.log(scale),
            quats=quat_multiply(q.expand_as(self.quats), self.quats),
        )

    # ------------------------------------------------------------ activations
    def opacities(self) -> torch.Tensor:
        """[N] opacity in (0, 1)."""
        return torch.sigmoid(self.opacity_logits)

    def scales(self) -> torch.Tensor:
        """[N, 3] standard deviations along the Gaussian's own axes."""
        return torch.exp(self.log_scales)

    def rotations(self) -> torch.Tensor:
        """[N, 4] unit quaternions (w, x, y, z)."""
        return torch.nn.functional.normalize(self.quats, dim=-1)

    def rotation_matrices(self) -> torch.Tensor:
        """[N, 3, 3] rotation matrices R (columns are the Gaussian's axes in world space)."""
        return quat_to_rotmat(self.rotations())

    def covariances(self) -> torch.Tensor:
        """[N, 3, 3] world-space covariances Sigma = R S S^T R^T."""
        rs = self.rotation_matrices() * self.scales()[:, None, :]
        return rs @ rs.transpose(1, 2)

    def colors(self) -> torch.Tensor:
        """[N, 3] base RGB from the degree-0 SH term, ``0.5 + C0 * f_dc`` (clamped to [0, 1])."""
        return (0.5 + SH_C0 * self.sh_dc).clamp(0.0, 1.0)

    @staticmethod
    def from_activated(
        means: torch.Tensor,
        scales: torch.Tensor,
        quats: torch.Tensor,
        opacities: torch.Tensor,
        colors: torch.Tensor,
        sh_degree: int = 0,
    ) -> Splat:
        """Build a splat from activated values: scales > 0 [N,3], opacities in (0,1) [N], RGB [N,3]."""
        n = means.shape[0]
        eps = 1e-6
        op = opacities.clamp(eps, 1 - eps)
        return Splat(
            means=means.float(),
            sh_dc=((colors.float() - 0.5) / SH_C0),
            sh_rest=torch.zeros(n, num_sh_coeffs(sh_degree) - 1, 3, dtype=torch.float32, device=means.device),
            opacity_logits=torch.log(op / (1 - op)).float(),
            log_scales=torch.log(scales.float()),
            quats=quats.float(),
        )

    def to_arrays(self) -> SplatArrays:
        """The splat's parameters as CPU float32 NumPy :class:`~microdreamer.formats.common.SplatArrays`
        (what every format's writer takes)."""
        s = self.detach().to("cpu")
        return SplatArrays(**{k: np.ascontiguousarray(v.float().numpy()) for k, v in s.tensors().items()})

    @staticmethod
    def from_arrays(arrays: SplatArrays) -> Splat:
        """The CPU splat of :class:`~microdreamer.formats.common.SplatArrays` (what
        :func:`~microdreamer.formats.read_splat_arrays` reads); the tensors share the arrays' memory."""
        return Splat(
            **{
                f.name: torch.from_numpy(np.ascontiguousarray(getattr(arrays, f.name)))
                for f in fields(arrays)
            }
        )


def quat_to_rotmat(q: torch.Tensor) -> torch.Tensor:
    """Unit quaternions [..., 4] (w, x, y, z) -> rotation matrices [..., 3, 3]."""
    w, x, y, z = q.unbind(-1)
    rows = [
        1 - 2 * (y * y + z * z), 2 * (x * y - w * z), 2 * (x * z + w * y),
        2 * (x * y + w * z), 1 - 2 * (x * x + z * z), 2 * (y * z - w * x),
        2 * (x * z - w * y), 2 * (y * z + w * x), 1 - 2 * (x * x + y * y),
    ]  # fmt: skip
    return torch.stack(rows, dim=-1).reshape(*q.shape[:-1], 3, 3)


def rotmat_to_quat(R: torch.Tensor) -> torch.Tensor:
    """A rotation matrix [3, 3] -> its unit quaternion [4] (w, x, y, z), w >= 0 (Shepperd's method)."""
    R = torch.as_tensor(R).double()
    m = R.tolist()
    trace = m[0][0] + m[1][1] + m[2][2]
    if trace > 0:
        r = math.sqrt(1.0 + trace) * 2
        q = [0.25 * r, (m[2][1] - m[1][2]) / r, (m[0][2] - m[2][0]) / r, (m[1][0] - m[0][1]) / r]
    elif m[0][0] > m[1][1] and m[0][0] > m[2][2]:
        r = math.sqrt(1.0 + m[0][0] - m[1][1] - m[2][2]) * 2
        q = [(m[2][1] - m[1][2]) / r, 0.25 * r, (m[0][1] + m[1][0]) / r, (m[0][2] + m[2][0]) / r]
    elif m[1][1] > m[2][2]:
        r = math.sqrt(1.0 + m[1][1] - m[0][0] - m[2][2]) * 2
        q = [(m[0][2] - m[2][0]) / r, (m[0][1] + m[1][0]) / r, 0.25 * r, (m[1][2] + m[2][1]) / r]
    else:
        r = math.sqrt(1.0 + m[2][2] - m[0][0] - m[1][1]) * 2
        q = [(m[1][0] - m[0][1]) / r, (m[0][2] + m[2][0]) / r, (m[1][2] + m[2][1]) / r, 0.25 * r]
    q = torch.tensor(q, dtype=torch.float64)
    q = q / q.norm()
    return -q if q[0] < 0 else q


def quat_multiply(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Hamilton products [..., 4] of quaternions (w, x, y, z): the rotation of ``b`` then ``a``."""
    aw, ax, ay, az = a.unbind(-1)
    bw, bx, by, bz = b.unbind(-1)
    return torch.stack(
        [
            aw * bw - ax * bx - ay * by - az * bz,
            aw * bx + ax * bw + ay * bz - az * by,
            aw * by - ax * bz + ay * bw + az * bx,
            aw * bz + ax * by - ay * bx + az * bw,
        ],
        dim=-1,
    )


def rotate_sh(sh_rest: torch.Tensor, rotation: torch.Tensor) -> torch.Tensor:
    """The higher SH bands [N, K-1, 3] of a colour field f rotated by R: the coefficients of
    ``f'(d) = f(R^T d)`` (the 3DGS basis of ``render.gaussians.eval_sh``). Each band maps to itself;
    the [K, K] matrix is solved once by least squares from 64 sample directions (exact: a band's span
    is closed under rotation)."""
    K = sh_rest.shape[1] + 1
    if K == 1:
        return sh_rest.clone()
    from microdreamer.render.gaussians import eval_sh

    degree = int(round(math.sqrt(K))) - 1
    R = torch.as_tensor(rotation).double().cpu()
    i = torch.arange(64, dtype=torch.float64) + 0.5  # Fibonacci sphere
    z = 1 - 2 * i / 64
    phi = math.pi * (3 - math.sqrt(5)) * i
    d = torch.stack([torch.sqrt(1 - z * z) * torch.cos(phi), torch.sqrt(1 - z * z) * torch.sin(phi), z], -1)
    one_hot = torch.eye(K, dtype=torch.float64)[:, :, None].expand(K, K, 3)  # basis b's coefficients

    def basis(dirs: torch.Tensor) -> torch.Tensor:  # [D, K]: Y_b(dirs)
        return eval_sh(degree, dirs[:, None, :].expand(-1, K, 3), one_hot[None].expand(len(dirs), K, K, 3))[
            ..., 0
        ]

    B, B_rot = basis(d), basis(d @ R)  # rows: Y(d) and Y(R^T d) (d @ R = (R^T d) as rows)
    M = torch.linalg.lstsq(B, B_rot).solution  # B M = B_rot, so c' = M c
    M_rest = M[1:, 1:].to(sh_rest.device, sh_rest.dtype)
    return torch.einsum("kj,njc->nkc", M_rest, sh_rest)


# ---------------------------------------------------------------------- files
def read_splat(path: str | os.PathLike, progress: Callable[[float], None] | None = None) -> Splat:
    """Read a splat file in any format :mod:`microdreamer.formats` knows (chosen by content: 3DGS PLY,
    compressed PLY, SPZ, SOG, .splat, .ksplat, glTF ``KHR_gaussian_splatting``).

    Returns a CPU, float32 :class:`Splat` in the INRIA PLY frame:
    :func:`microdreamer.formats.read_splat_arrays` (which documents the checks, the one-line
    :class:`InputError` of each bad file and the policy for degenerate Gaussians), then
    :meth:`Splat.from_arrays`.

    Args:
        path: the splat file (or a SOG folder).
        progress: ``progress(fraction)`` while a PLY's data is read (default: :mod:`microdreamer.progress`
            lines for files above 256 MB).
    """
    return Splat.from_arrays(read_splat_arrays(path, progress))


read_ply = read_splat  # a PLY is one of the formats read_splat reads


def write_ply(splat: Splat, path: str | os.PathLike) -> Path:
    """Write ``splat`` as an INRIA-layout binary little-endian PLY (atomically: temp file + rename)."""
    return _write_ply_arrays(splat.to_arrays(), path)
