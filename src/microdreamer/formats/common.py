"""What every splat format shares: the arrays a reader returns, the checks and the policy for degenerate
Gaussians that every reader ends with, and the frame changes between the formats' coordinate systems.

NumPy only (no torch): the command line reads and checks its input before torch is imported.

Every reader returns :class:`SplatArrays` in the INRIA PLY frame and parameterisation (the frame of the
3DGS training code: COLMAP's x right, y down, z forward), whatever the file stores: SPZ's RUB axes and
glTF's LUF axes are turned into it on reading and back on writing, so a splat converted to any format
and read again lands where it started. Values are checked before they are used: non-finite values
refuse the file (naming the Gaussians), and degenerate Gaussians follow one policy (:func:`finish`).
"""

from __future__ import annotations

import logging
import math
import os
from dataclasses import dataclass, fields
from pathlib import Path

import numpy as np

from microdreamer.errors import InputError

logger = logging.getLogger(__name__)

SH_C0 = 0.28209479177387814  # Y_0^0 = 1 / (2 sqrt(pi))
#: float32 exp() of a log-scale below this is not a normal number (0 below -103.3), above the other inf
LOG_SCALE_MIN = float(np.log(np.finfo(np.float32).tiny))  # -87.34
LOG_SCALE_MAX = float(np.log(np.finfo(np.float32).max))  # 88.72
#: quaternions shorter than this have no orientation (``normalize``'s epsilon)
QUAT_MIN_LENGTH = 1e-12
#: opacities stored as fractions are clamped into [OPACITY_EPS, 1 - OPACITY_EPS] before the logit (a
#: stored 0 or 1 would be an infinite logit; 1e-6 gives +-13.8, invisible and opaque for every renderer)
OPACITY_EPS = 1e-6
#: the most Gaussians a header may declare (2^31: every format's counts fit; a larger one is corrupt)
MAX_COUNT = 1 << 31


@dataclass
class SplatArrays:
    """A splat as read from a file: N Gaussians' raw parameters, C-contiguous float32 NumPy arrays
    (the fields of :class:`~microdreamer.splat.Splat`, same shapes and meaning), in the INRIA PLY frame.

    Attributes:
        means: [N, 3] float32, world space.
        sh_dc: [N, 3] float32, degree-0 SH coefficient per RGB channel (``f_dc_*``).
        sh_rest: [N, K-1, 3] float32, higher-order SH coefficients (K-1 = 0, 3, 8 or 15).
        opacity_logits: [N] float32, opacity logits.
        log_scales: [N, 3] float32, natural logs of the standard deviations along the axes.
        quats: [N, 4] float32, rotation quaternions (w, x, y, z), not necessarily unit length.
    """

    means: np.ndarray
    sh_dc: np.ndarray
    sh_rest: np.ndarray
    opacity_logits: np.ndarray
    log_scales: np.ndarray
    quats: np.ndarray

    def __len__(self) -> int:
        return int(self.means.shape[0])

    @property
    def sh_degree(self) -> int:
        return int(round(math.sqrt(self.sh_rest.shape[1] + 1))) - 1

    def subset(self, index: np.ndarray) -> SplatArrays:
        """The Gaussians selected by a boolean mask [N] or an index array."""
        return SplatArrays(
            **{f.name: np.ascontiguousarray(getattr(self, f.name)[index]) for f in fields(self)}
        )

    def with_degree(self, degree: int) -> SplatArrays:
        """The splat with its SH bands cut to ``degree`` (a lower or equal degree; higher is unchanged)."""
        k1 = (degree + 1) ** 2 - 1
        if k1 >= self.sh_rest.shape[1]:
            return self
        return SplatArrays(self.means, self.sh_dc, np.ascontiguousarray(self.sh_rest[:, :k1]),
                           self.opacity_logits, self.log_scales, self.quats)  # fmt: skip


# ----------------------------------------------------------------------------------------------- checks
def first_rows(indices: np.ndarray, k: int = 5) -> str:
    """'#3, #17, #20' (the first k of ``indices``, 0-based Gaussians of the file), '...' if more."""
    shown = ", ".join(f"#{int(i)}" for i in indices[:k])
    return shown + (", ..." if len(indices) > k else "")


def check_count(name: str, count: int, what: str = "Gaussians") -> int:
    """A header's count: a non-negative integer below :data:`MAX_COUNT`, else one InputError line."""
    if not 0 <= count < MAX_COUNT:
        raise InputError(
            f"{name}: the header declares {count} {what}, which no splat holds; the file is corrupt"
        )
    return int(count)


def truncated(name: str, count: int, got: int | None = None) -> InputError:
    """The one line for data shorter than its header declares."""
    holds = f"holds {got}" if got is not None else "is shorter"
    return InputError(
        f"{name}: truncated: the header declares {count} Gaussians but the data {holds}; "
        "the file is incomplete, export it again"
    )


def read_file(path: str | os.PathLike, what: str = "splat") -> bytes:
    """The bytes of ``path``: one InputError line for a missing, unreadable or folder path."""
    path = Path(path)
    if not path.exists():
        raise InputError(f"{path}: file not found; give the path of a {what}")
    if path.is_dir():
        raise InputError(f"{path}: is a directory; give the path of a {what} file")
    try:
        return path.read_bytes()
    except OSError as e:
        raise InputError(f"{path}: cannot open ({e.strerror}); check the file's permissions") from None


def logit(p: np.ndarray) -> np.ndarray:
    """The opacity logit of fractions ``p`` (clamped into [OPACITY_EPS, 1 - OPACITY_EPS]), float32."""
    p = np.clip(np.asarray(p, np.float64), OPACITY_EPS, 1 - OPACITY_EPS)
    return np.log(p / (1 - p)).astype(np.float32)


def sigmoid(x: np.ndarray) -> np.ndarray:
    """The opacity fraction of logits ``x``, float64 (no overflow warning for large |x|)."""
    x = np.asarray(x, np.float64)
    return 0.5 * (1.0 + np.tanh(0.5 * x))


def finish(
    name: str,
    means: np.ndarray,
    sh_dc: np.ndarray,
    sh_rest: np.ndarray,
    opacity_logits: np.ndarray,
    log_scales: np.ndarray,
    quats: np.ndarray,
) -> SplatArrays:
    """The checked :class:`SplatArrays` of a reader's decoded columns (float32, C-contiguous).

    * SH bands above degree 3 (SPZ allows 4) are dropped with a warning: nothing here renders them.
    * Non-finite values (NaN, inf, doubles beyond float32) refuse the file, naming the Gaussians.
    * Degenerate Gaussians: a log-scale below :data:`LOG_SCALE_MIN` (exp() underflows float32) is raised
      to it (a flat disc, what viewers draw); a log-scale above :data:`LOG_SCALE_MAX` or a quaternion
      shorter than :data:`QUAT_MIN_LENGTH` drops the Gaussian; a warning names them. InputError if none is
      left, or if there were none to begin with.

    Args: the columns, shaped as :class:`SplatArrays`' fields (any float dtype).
    """
    count = int(means.shape[0])
    if count == 0:
        raise InputError(f"{name}: the splat is empty (0 Gaussians); nothing to convert")
    if sh_rest.shape[1] > 15:
        logger.warning(
            "%s: SH degree %d; bands above 3 are dropped", name, round(math.sqrt(sh_rest.shape[1] + 1)) - 1
        )
        sh_rest = sh_rest[:, :15]

    def f32(a: np.ndarray) -> np.ndarray:
        with np.errstate(over="ignore", invalid="ignore"):  # doubles beyond float32 become inf: refused
            return np.ascontiguousarray(a, dtype=np.float32)

    columns = {
        "position": f32(means), "f_dc": f32(sh_dc), "f_rest": f32(sh_rest), "opacity": f32(opacity_logits),
        "scale": f32(log_scales), "rot": f32(quats),
    }  # fmt: skip
    bad_rows = np.zeros(count, dtype=bool)
    bad = {}
    for k, v in columns.items():
        finite = np.isfinite(v)
        bad[k] = int(finite.size - np.count_nonzero(finite))
        if bad[k]:
            bad_rows |= ~finite.reshape(count, -1).all(-1)
    n_bad = sum(bad.values())
    if n_bad:
        where = ", ".join(f"{k} ({v})" for k, v in bad.items() if v)
        raise InputError(
            f"{name}: {n_bad} non-finite values (NaN or inf, or too large for float32) in {where}, "
            f"Gaussians {first_rows(np.flatnonzero(bad_rows))}; fix or drop those Gaussians"
        )
    keep, log_scales = _degenerate(name, columns["scale"], columns["rot"])
    arrays = SplatArrays(
        means=columns["position"], sh_dc=columns["f_dc"], sh_rest=columns["f_rest"],
        opacity_logits=columns["opacity"], log_scales=log_scales, quats=columns["rot"],
    )  # fmt: skip
    return arrays if keep is None else arrays.subset(keep)


def _degenerate(name: str, log_scales: np.ndarray, quats: np.ndarray) -> tuple[np.ndarray | None, np.ndarray]:
    """The policy for finite but degenerate Gaussians: (keep mask or None when all are kept, log-scales
    raised to LOG_SCALE_MIN). Warns naming the Gaussians; InputError when none is left."""
    n = log_scales.shape[0]
    thin = log_scales < LOG_SCALE_MIN
    if thin.any():
        rows = np.flatnonzero(thin.any(-1))
        logger.warning(
            "%s: %d Gaussians (%s) have log-scales below %.2f (down to %.3g), which underflow float32; "
            "raised to %.2f (flat, as viewers draw them)",
            name, rows.size, first_rows(rows), LOG_SCALE_MIN, float(log_scales.min()), LOG_SCALE_MIN,
        )  # fmt: skip
        log_scales = np.maximum(log_scales, np.float32(LOG_SCALE_MIN))
    # whole-array tests first (a reduction along a row of 3 or 4 is slow in NumPy); rows only if needed
    huge_any = bool(log_scales.max() > LOG_SCALE_MAX)
    # a quaternion is at least as long as its largest component: only those below the limit are measured
    small = np.abs(quats) < QUAT_MIN_LENGTH
    if not huge_any and not small.any():
        return None, log_scales
    huge = (log_scales > LOG_SCALE_MAX).any(-1)
    short = small.all(-1)
    length = np.sqrt(np.square(quats[short].astype(np.float64)).sum(-1))
    no_rotation = np.zeros(n, dtype=bool)
    no_rotation[short] = length < QUAT_MIN_LENGTH
    drop = huge | no_rotation
    if not drop.any():
        return None, log_scales
    reasons = []
    if huge.any():
        rows = np.flatnonzero(huge)
        reasons.append(
            f"{rows.size} with a log-scale above {LOG_SCALE_MAX:.2f} (up to {float(log_scales.max()):.3g}; "
            f"wider than float32 can hold: {first_rows(rows)})"
        )
    if no_rotation.any():
        rows = np.flatnonzero(no_rotation)
        shortest = float(length[no_rotation[short]].min())
        kind = "all zero" if shortest == 0.0 else f"length down to {shortest:.3g}"
        reasons.append(
            f"{rows.size} whose rotation quaternion is shorter than {QUAT_MIN_LENGTH:g} ({kind}; no "
            f"orientation: {first_rows(rows)})"
        )
    n_drop = int(drop.sum())
    if n_drop == n:
        raise InputError(
            f"{name}: every Gaussian is degenerate: {'; '.join(reasons)}; nothing is left to convert, "
            "fix the file"
        )
    logger.warning("%s: dropped %d of %d Gaussians: %s", name, n_drop, n, "; ".join(reasons))
    return ~drop, log_scales


# ------------------------------------------------------------------------------------------ frames
def normalized_quats(quats: np.ndarray) -> np.ndarray:
    """[N, 4] unit quaternions (float64) of ``quats`` (zero-length ones become the identity)."""
    q = np.asarray(quats, np.float64)
    n = np.linalg.norm(q, axis=-1, keepdims=True)
    out = np.divide(q, n, out=np.zeros_like(q), where=n > 0)
    out[n[:, 0] == 0, 0] = 1.0
    return out


def rotmat_to_quat(R: np.ndarray) -> np.ndarray:
    """A proper rotation matrix [3, 3] -> its unit quaternion [4] (w, x, y, z), w >= 0."""
    R = np.asarray(R, np.float64)
    w = math.sqrt(max(0.0, 1.0 + R[0, 0] + R[1, 1] + R[2, 2])) / 2
    x = math.copysign(math.sqrt(max(0.0, 1.0 + R[0, 0] - R[1, 1] - R[2, 2])) / 2, R[2, 1] - R[1, 2])
    y = math.copysign(math.sqrt(max(0.0, 1.0 - R[0, 0] + R[1, 1] - R[2, 2])) / 2, R[0, 2] - R[2, 0])
    z = math.copysign(math.sqrt(max(0.0, 1.0 - R[0, 0] - R[1, 1] + R[2, 2])) / 2, R[1, 0] - R[0, 1])
    q = np.array([w, x, y, z])
    return q / np.linalg.norm(q)


def quat_multiply(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Hamilton products [..., 4] (w, x, y, z): the rotation of ``b`` then ``a``."""
    aw, ax, ay, az = np.moveaxis(np.asarray(a), -1, 0)
    bw, bx, by, bz = np.moveaxis(np.asarray(b), -1, 0)
    return np.stack(
        [
            aw * bw - ax * bx - ay * by - az * bz,
            aw * bx + ax * bw + ay * bz - az * by,
            aw * by - ax * bz + ay * bw + az * bx,
            aw * bz + ax * by - ay * bx + az * bw,
        ],
        axis=-1,
    )


def sh_basis(dirs: np.ndarray, degree: int) -> np.ndarray:
    """[D, K] the real SH basis of the 3DGS renderers (Condon-Shortley phase; the KHR_gaussian_splatting
    appendix) at unit directions ``dirs`` [D, 3], K = (degree + 1)^2."""
    x, y, z = (np.asarray(dirs, np.float64)[:, i] for i in range(3))
    out = [np.full_like(x, SH_C0)]
    if degree >= 1:
        c1 = 0.4886025119029199
        out += [-c1 * y, c1 * z, -c1 * x]
    if degree >= 2:
        xx, yy, zz = x * x, y * y, z * z
        out += [
            1.0925484305920792 * x * y, -1.0925484305920792 * y * z, 0.31539156525252005 * (2 * zz - xx - yy),
            -1.0925484305920792 * x * z, 0.5462742152960396 * (xx - yy),
        ]  # fmt: skip
    if degree >= 3:
        out += [
            -0.5900435899266435 * y * (3 * xx - yy), 2.890611442640554 * x * y * z,
            -0.4570457994644658 * y * (4 * zz - xx - yy), 0.3731763325901154 * z * (2 * zz - 3 * xx - 3 * yy),
            -0.4570457994644658 * x * (4 * zz - xx - yy), 1.445305721320277 * z * (xx - yy),
            -0.5900435899266435 * x * (xx - 3 * yy),
        ]  # fmt: skip
    return np.stack(out, axis=-1)


def transform_sh(sh_rest: np.ndarray, M: np.ndarray) -> np.ndarray:
    """The higher SH bands [N, K-1, 3] of a colour field f mapped by the orthogonal matrix M (a rotation
    or an axis flip): the coefficients of ``f'(d) = f(M^T d)``. Each band maps to itself; the matrix is
    solved once by least squares from 64 directions (exact: a band's span is closed under O(3))."""
    k1 = sh_rest.shape[1]
    if k1 == 0:
        return sh_rest
    degree = int(round(math.sqrt(k1 + 1))) - 1
    i = np.arange(64) + 0.5  # Fibonacci sphere
    zc = 1 - 2 * i / 64
    phi = math.pi * (3 - math.sqrt(5)) * i
    d = np.stack([np.sqrt(1 - zc * zc) * np.cos(phi), np.sqrt(1 - zc * zc) * np.sin(phi), zc], -1)
    B, B_mapped = sh_basis(d, degree), sh_basis(d @ np.asarray(M, np.float64), degree)  # Y(d), Y(M^T d)
    T = np.linalg.lstsq(B, B_mapped, rcond=None)[0][1:, 1:]  # c' = T c
    T[np.abs(T) < 1e-9] = 0.0
    if np.count_nonzero(T) == k1 and np.allclose(np.abs(T), np.eye(k1), atol=1e-6):  # an axis flip: signs
        return (sh_rest * np.diag(T).astype(np.float32)[None, :, None]).astype(np.float32)
    return np.einsum("kj,njc->nkc", T, sh_rest.astype(np.float64)).astype(np.float32)


def transform_arrays(
    arrays: SplatArrays, M: np.ndarray, scale: float = 1.0, translation: np.ndarray | None = None
) -> SplatArrays:
    """The splat mapped by ``x -> scale * M x + t`` for an orthogonal M (det +1 or -1: an axis flip
    between frames is a reflection for some pairs), so it renders as the same object in the new frame.

    Args:
        arrays: the splat.
        M: [3, 3] orthogonal matrix.
        scale: positive factor (log-scales shift by log(scale)).
        translation: [3] or None.
    """
    M = np.asarray(M, np.float64)
    if scale == 1.0 and translation is None and np.array_equal(np.abs(M), np.eye(3)):
        return _flip_arrays(arrays, np.diag(M))
    means = scale * arrays.means.astype(np.float64) @ M.T
    if translation is not None:
        means += np.asarray(translation, np.float64)
    R = M * np.sign(np.linalg.det(M))  # Sigma' = M Sigma M^T = R Sigma R^T with R proper
    if np.allclose(R, np.diag(np.diag(R))):  # an axis flip: conjugate (R q R^T; R^T S R = S), as SPZ does
        s = np.diag(R)
        q = arrays.quats.astype(np.float64) * np.array([1.0, s[1] * s[2], s[0] * s[2], s[0] * s[1]])
    else:  # the Gaussian's axes turned by R: R q
        q = quat_multiply(rotmat_to_quat(R)[None], arrays.quats.astype(np.float64))
    return SplatArrays(
        means=means.astype(np.float32),
        sh_dc=arrays.sh_dc,
        sh_rest=np.ascontiguousarray(transform_sh(arrays.sh_rest, M)),
        opacity_logits=arrays.opacity_logits,
        log_scales=(arrays.log_scales + np.float32(math.log(scale))).astype(np.float32),
        quats=q.astype(np.float32),
    )


def _flip_arrays(arrays: SplatArrays, signs: np.ndarray) -> SplatArrays:
    """:func:`transform_arrays` for an axis flip ``M = diag(signs)`` (each +-1), no scale, no translation:
    every value changes by a sign only, so float32 sign flips give the general path's values exactly
    (its float64 products by +-1 and 0 round back to the same float32) at a fraction of the memory."""
    s = np.asarray(signs, np.float64)
    R = s * np.prod(s)  # the proper rotation's diagonal (det +1)
    qsign = np.array([1.0, R[1] * R[2], R[0] * R[2], R[0] * R[1]], np.float32)
    return SplatArrays(
        means=arrays.means * s.astype(np.float32),
        sh_dc=arrays.sh_dc,
        sh_rest=np.ascontiguousarray(transform_sh(arrays.sh_rest, np.diag(s))),
        opacity_logits=arrays.opacity_logits,
        log_scales=arrays.log_scales,
        quats=arrays.quats * qsign,
    )


#: the diagonal of the axis flip between the PLY frame (RDF) and the frames the formats store
FLIP_RUB = np.diag([1.0, -1.0, -1.0])  # SPZ's default frame (x right, y up, z back): 180 deg about x
FLIP_LUF = np.diag([-1.0, -1.0, 1.0])  # glTF (x left, y up, z forward): 180 deg about z
