"""UV unwrapping by normal clustering: charts for noisy captured surfaces, vectorised in PyTorch.

xatlas grows charts by flatness, so the voxel-scale noise of a marching-cubes surface shatters them
and its chart growing and bitmap packing take tens of seconds for 50k faces. :func:`unwrap_charts`:

1. smooths the face normals (``smooth_iterations`` rounds of bilateral averaging over the three edge
   neighbours: neighbours facing away do not count, so the two sides of a thin part stay apart);
2. labels each face with the nearest of K fixed directions (:data:`DIRECTION_SETS`: the 6 axes, plus
   the 8 cube corners, plus the 12 cube edges) by its smoothed normal, unless its own normal is more
   than ``arccos(min_cos)`` from that direction: then the nearest by its own normal (every unit
   vector is within 54.7 degrees of one of 6, 36.2 of 14, 27.6 of 26, so one always qualifies);
3. merges charts smaller than ``min_chart_faces`` into their largest neighbouring chart, whole or
   face by face, where the faces' normals are within ``arccos(merge_min_cos)`` of its direction
   (noise leaves faces far from every neighbouring direction, and a face in a neighbour's chart
   beats a chart of its own);
4. takes the connected components (shared edges) of same-label faces as charts and projects each
   orthographically onto the plane of its area-weighted mean normal (or of its label's direction,
   whichever leaves the worst face nearer), rotated to its principal axes;
5. finds charts that fold over themselves along their direction (two of their faces over one texel
   centre) on a lattice ``fold_check`` times finer than the packing's, and cuts them: between the
   heights of the overlapping faces, in halves after ``split_rounds / 2`` rounds, or, where only a
   few faces overlap (or overlap their own one-ring), by moving the later face of each pair out;
6. scales every chart by one texel density and packs them into the square atlas (``"skyline"``: the
   outlines of the largest charts dropped Tetris-like onto a skyline in two orientations, the small
   ones shelf-packed into tiles; or ``"shelf"``: bounding boxes on shelves), ``padding`` empty texels
   between charts and around the border, the density found in a few packs; a box-packed chart of
   under 8 texels moves by less than a texel in its box so that a texel centre lies at the incentre
   of its largest face (a chart that covered no texel centre would take its colour from the gutter
   fill, i.e. from a neighbouring chart);
7. rasterises the UV triangles at ``texture_size`` (a scanline raster, :func:`row_spans`) and repeats
   5-7 while a chart covers a texel centre twice; after ``split_rounds`` rounds the later face of every
   overlapping pair becomes a chart of its own, which always ends it.

Guarantees (tested by brute force): faces in the input's order and winding; UVs in [0, 1]; every UV
triangle wound as its face (counter-clockwise); the per-face area scale ``uv_area / (density^2
area_3d) = n . d`` in ``[merge_min_cos, 1]`` (faces labelled in step 2 keep ``n . d >= min_cos``;
lengths never stretch and shrink by at most ``1 / merge_min_cos`` = 4, by default, across the
slope); no texel centre inside two UV triangles; every box-packed chart of under 8 texels covers a texel
centre; the texels the charts touch at least ``padding``
apart and from the border (to the UVs' float32 rounding). Deterministic on the CPU: the same input
gives the same layout (integer steps name charts by their first face; the normal smoothing is
gathers only). On CUDA the per-chart sums (``index_add_``) use atomics, so UVs may differ from the
CPU's, and from run to run, in the last bits.

Integer sorts and graph searches run in NumPy / SciPy on the CPU (their sorts are about 5x faster
than torch's there) and in torch elsewhere, with the same results; the skyline's loop runs on the host,
in NumPy (:func:`skyline_pack`, the reference) or in C++ from the CPU kernels where a compiler builds them
(:func:`compiled_skyline_pack`, the same layout). ``benchmarks/bench_unwrap.py`` measures it against
xatlas.
"""

from __future__ import annotations

import logging
import math
import time

import numpy as np
import torch

from microdreamer.mesh import Mesh, decimate
from microdreamer.mesh.cleanup_torch import min_labels
from microdreamer.texture.unwrap import UVLayout

logger = logging.getLogger(__name__)


def _direction_sets() -> dict[int, tuple[np.ndarray, float]]:
    """K -> ([K, 3] unit directions, covering cosine: every unit vector is at least this close to one).

    The covering cosines are those of the worst directions (exact for 6: 1 / sqrt 3; for 14 and 26 the
    minimum of the best cosine over 2M random unit vectors, 0.80697 and 0.88649, rounded down)."""
    axes = np.concatenate([np.eye(3), -np.eye(3)])
    corners = np.array(
        [[x, y, z] for x in (1, -1) for y in (1, -1) for z in (1, -1)], np.float64
    ) / math.sqrt(3)
    edges = []
    for i, j in ((0, 1), (0, 2), (1, 2)):
        for a in (1, -1):
            for b in (1, -1):
                e = np.zeros(3)
                e[i], e[j] = a, b
                edges.append(e / math.sqrt(2))
    return {
        6: (axes, 1.0 / math.sqrt(3) - 1e-6),
        14: (np.concatenate([axes, corners]), 0.8065),
        26: (np.concatenate([axes, corners, np.array(edges)]), 0.886),
    }


DIRECTION_SETS = _direction_sets()
COMPONENT_BACKENDS = ("auto", "scipy", "torch", "cpp")


# ---------------------------------------------------------------------------------------------------
# integer primitives: NumPy on the CPU (its sorts are about 5x faster than torch's there), torch elsewhere;
# both give the same integers


def _on_host(x: torch.Tensor) -> bool:
    """Whether the integer primitives of ``x`` run in NumPy / SciPy (CPU tensors) rather than torch."""
    return x.device.type == "cpu"


def _stable_sort(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(sorted values, stable argsort) of a 1-D integer tensor."""
    if _on_host(x):
        order = np.argsort(x.numpy(), kind="stable")
        return torch.from_numpy(x.numpy()[order]), torch.from_numpy(order)
    return torch.sort(x, stable=True)


def _dot(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """``(a * b).sum(-1)`` over a last dimension of 3, added in the same order without the reduction's
    overhead (the same values)."""
    p = a * b
    return p[..., 0] + p[..., 1] + p[..., 2]


def _min3(x: torch.Tensor) -> torch.Tensor:
    """``x.amin(1)`` of an [F, 3] tensor."""
    return torch.minimum(torch.minimum(x[:, 0], x[:, 1]), x[:, 2])


def _max3(x: torch.Tensor) -> torch.Tensor:
    """``x.amax(1)`` of an [F, 3] tensor."""
    return torch.maximum(torch.maximum(x[:, 0], x[:, 1]), x[:, 2])


def _unique_inverse(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(sorted unique values, inverse indices) of a 1-D integer tensor."""
    if _on_host(x):
        values, inverse = np.unique(x.numpy(), return_inverse=True)
        return torch.from_numpy(values), torch.from_numpy(inverse.reshape(-1))
    return torch.unique(x, return_inverse=True)


# ---------------------------------------------------------------------------------------------------
# surface structure


def face_neighbours(faces: torch.Tensor) -> torch.Tensor:
    """[F, 3] int64: the face across edge k (vertices k, k + 1) of each face, -1 where none.

    Edges shared by more than two faces are paired in order of (face, edge) index, so every face has
    at most one neighbour per edge and the relation is symmetric."""
    f = faces.shape[0]
    device = faces.device
    a = faces
    b = faces.roll(-1, dims=1)
    lo, hi = torch.minimum(a, b).reshape(-1), torch.maximum(a, b).reshape(-1)
    nv = int(faces.max()) + 1 if f else 1
    key = lo * nv + hi
    key_sorted, order = _stable_sort(key)
    n = key_sorted.numel()
    pos = torch.arange(n, device=device)
    new_group = torch.ones(n, dtype=torch.bool, device=device)
    if n > 1:
        new_group[1:] = key_sorted[1:] != key_sorted[:-1]
    group_start = torch.cummax(torch.where(new_group, pos, torch.zeros_like(pos)), 0).values
    rank = pos - group_start
    partner = torch.where(rank % 2 == 0, pos + 1, pos - 1)
    valid = partner < n
    partner = partner.clamp(max=n - 1)
    valid &= key_sorted[partner] == key_sorted
    out = torch.full((n,), -1, dtype=torch.int64, device=device)
    out[order[valid]] = order[partner[valid]] // 3
    return out.view(f, 3)


def connected_components(neighbours: torch.Tensor, same: torch.Tensor, backend: str = "auto") -> torch.Tensor:
    """[F] int64 component of each face: the smallest face index of its component.

    Faces f and ``neighbours[f, k]`` ([F, 3] int64, -1 = none) are connected where ``same[f, k]``
    ([F, 3] bool). ``backend``: ``"scipy"`` (its graph search, on the CPU), ``"torch"`` (hooking of roots
    onto smaller roots and pointer jumping, O(log F) rounds, on the inputs' device), ``"cpp"`` (union-find
    in the C++ CPU kernels, :func:`microdreamer.kernels.cpu.face_components`: CPU tensors only) or
    ``"auto"`` (scipy for CPU tensors, else torch). All name a component by its smallest face: the same
    result."""
    if backend not in COMPONENT_BACKENDS:
        raise ValueError(f"backend = {backend!r} is unknown; use one of {', '.join(COMPONENT_BACKENDS)}")
    if backend == "cpp":
        from microdreamer.kernels import cpu

        if neighbours.device.type != "cpu":
            raise ValueError(
                f"the cpp components backend runs on CPU tensors; these are on {neighbours.device}"
            )
        return cpu.face_components(neighbours.contiguous(), same.contiguous())
    if backend == "auto":
        backend = "scipy" if _on_host(neighbours) else "torch"
    f = neighbours.shape[0]
    device = neighbours.device
    ok = same & (neighbours >= 0)
    a = torch.arange(f, device=device)[:, None].expand(f, 3)[ok]
    b = neighbours[ok]
    if backend == "scipy":
        from scipy.sparse import coo_matrix
        from scipy.sparse.csgraph import connected_components as scipy_components

        graph = coo_matrix((np.ones(a.numel(), np.int8), (a.cpu().numpy(), b.cpu().numpy())), shape=(f, f))
        _, label = scipy_components(graph, directed=False)
        root = np.full(f, f, np.int64)
        np.minimum.at(root, label, np.arange(f))
        return torch.from_numpy(root[label]).to(device)
    return min_labels(f, a, b)


def _smoothed_normals(
    tri: torch.Tensor, nbr: torch.Tensor, iterations: int, bilateral: bool = True
) -> torch.Tensor:
    """[F, 3] unit normals after ``iterations`` rounds of n_f <- normalise(n_f + sum_g w_fg n_g) over the
    edge neighbours g, from the unit face normals; w_fg = max(0, n_f . n_g) with ``bilateral`` (so that
    the two sides of a thin part or a sharp crease do not average away), else 1. Gathers only: the same
    on every device."""
    n = torch.nn.functional.normalize(
        torch.linalg.cross(tri[:, 1] - tri[:, 0], tri[:, 2] - tri[:, 0]), dim=-1
    )
    has = (nbr >= 0)[..., None].to(n.dtype)
    idx = nbr.clamp_min(0)
    for _ in range(iterations):
        g = n[idx]  # [F, 3, 3]
        w = has
        if bilateral:
            w = w * _dot(g, n[:, None, :])[..., None].clamp_min(0.0)
        n = torch.nn.functional.normalize(n + (g * w).sum(1), dim=-1)
    return n


# ---------------------------------------------------------------------------------------------------
# labels and charts


def _labels(
    normals: torch.Tensor, smooth: torch.Tensor, degenerate: torch.Tensor, dirs: torch.Tensor, min_cos: float
) -> torch.Tensor:
    """[F] int64 direction of each face: the nearest to its smoothed normal when its own normal is
    within ``min_cos`` of it (or the face is degenerate), else the nearest to its own normal."""
    by_smooth = (smooth @ dirs.T).argmax(1)
    cos = normals @ dirs.T  # [F, K]
    by_own = cos.argmax(1)
    ok = (cos.gather(1, by_smooth[:, None])[:, 0] >= min_cos) | degenerate
    return torch.where(ok, by_smooth, by_own)


def _merge_small(
    labels: torch.Tensor,
    nbr: torch.Tensor,
    cos: torch.Tensor,
    degenerate: torch.Tensor,
    min_cos: float,
    min_faces: int,
    rounds: int,
    components: str = "auto",
) -> torch.Tensor:
    """Charts smaller than ``min_faces`` join their largest larger neighbouring chart: as a whole where
    every face's normal is within ``min_cos`` of that chart's direction (degenerate faces always are),
    else face by face where the face's is (one ring of faces per round). ``components``: the backend of
    :func:`connected_components`."""
    f = labels.shape[0]
    device = labels.device
    has = nbr >= 0
    idx = nbr.clamp_min(0)
    ok = (cos >= min_cos) | degenerate[:, None]  # [F, K] face f may take direction k
    for _ in range(rounds):
        comp = connected_components(nbr, labels[idx] == labels[:, None], components)
        size = torch.bincount(comp, minlength=f)
        own = size[comp]
        small = own < min_faces
        if not bool(small.any()):
            break
        nl = labels[idx]  # [F, 3] neighbour labels
        nsize = size[comp[idx]]
        across = has & (nl != labels[:, None]) & (nsize > own[:, None]) & small[:, None]
        # whole charts: the directions every face of the chart may take ([F, K] per chart root)
        all_ok = (
            torch.ones(ok.shape, dtype=torch.int8, device=device)
            .scatter_reduce_(0, comp[:, None].expand_as(ok), ok.to(torch.int8), reduce="amin")
            .bool()
        )
        whole = across & all_ok[comp].gather(1, nl)
        w_score = _max3(torch.where(whole, nsize, torch.zeros_like(nsize)))  # [F]
        w_best = torch.zeros(f, dtype=torch.int64, device=device).scatter_reduce_(
            0, comp, w_score, reduce="amax"
        )
        # the label of that best neighbour, per chart (the smallest label among equal sizes)
        pick = whole & (nsize == w_best[comp][:, None]) & (w_best[comp][:, None] > 0)
        big = torch.iinfo(torch.int64).max
        lab_pick = _min3(torch.where(pick, nl, torch.full_like(nl, big)))
        chart_lab = torch.full((f,), big, dtype=torch.int64, device=device).scatter_reduce_(
            0, comp, lab_pick, reduce="amin"
        )
        moved = chart_lab[comp] < big
        # the rest face by face
        cand = across & ok.gather(1, nl) & ~moved[:, None]
        score = torch.where(cand, nsize, torch.zeros_like(nsize))
        best = score.argmax(1)
        step = score.gather(1, best[:, None])[:, 0] > 0
        if not bool(moved.any() or step.any()):
            break
        labels = torch.where(
            moved, chart_lab[comp], torch.where(step, nl.gather(1, best[:, None])[:, 0], labels)
        )
    return labels


def _chart_frames(
    chart: torch.Tensor,
    n_charts: int,
    normals: torch.Tensor,
    area: torch.Tensor,
    degenerate: torch.Tensor,
    dirs: torch.Tensor,
    labels: torch.Tensor,
    min_cos: float,
) -> torch.Tensor:
    """[C, 3] projection direction of each chart: its area-weighted mean normal where that leaves every
    face of the chart within ``min_cos`` or at least as close as its label's direction does, else the
    label's direction (so no face gets farther from its projection direction than from its label's)."""
    device = normals.device
    f = normals.shape[0]
    mean = torch.zeros(n_charts, 3, device=device, dtype=normals.dtype)
    mean.index_add_(0, chart, normals * area[:, None])
    mean = torch.nn.functional.normalize(mean, dim=-1)
    first = torch.full((n_charts,), f, dtype=torch.int64, device=device)
    first.scatter_reduce_(0, chart, torch.arange(f, device=device), reduce="amin")
    label_dir = dirs[labels[first]]
    worst = []
    for d in (mean, label_dir):
        cos = torch.where(
            degenerate, torch.ones(f, device=device, dtype=normals.dtype), _dot(normals, d[chart])
        )
        w = torch.full((n_charts,), 2.0, device=device, dtype=normals.dtype)
        worst.append(w.scatter_reduce_(0, chart, cos, reduce="amin"))
    use_mean = (worst[0] >= torch.clamp(worst[1], max=min_cos)) & (mean.norm(dim=-1) > 0.5)
    return torch.where(use_mean[:, None], mean, label_dir)


def _tangent_basis(d: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Unit t1, t2 [C, 3] with t1 x t2 = d (so counter-clockwise faces seen along d stay so in UV)."""
    pick = d.abs().argmin(1)
    e = torch.nn.functional.one_hot(pick, 3).to(d.dtype)
    t1 = torch.nn.functional.normalize(torch.linalg.cross(d, e), dim=-1)
    t2 = torch.linalg.cross(d, t1)
    return t1, t2


def _project(
    verts: torch.Tensor, faces: torch.Tensor, chart: torch.Tensor, axis: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Split vertices per chart and project them: (source [V'], new faces [F, 3], local uv [V', 2],
    chart of each new vertex [V']); local uv rotated to each chart's principal axes, longer side along u,
    the minimum corner at 0."""
    device = verts.device
    nv = verts.shape[0]
    n_charts = axis.shape[0]
    key = (chart[:, None] * nv + faces).reshape(-1)
    uniq, inverse = _unique_inverse(key)
    source = uniq % nv
    vchart = uniq // nv
    new_faces = inverse.view(-1, 3)
    t1, t2 = _tangent_basis(axis)
    p = verts[source]
    uv = torch.stack([_dot(p, t1[vchart]), _dot(p, t2[vchart])], -1)
    # principal axes of each chart's vertices (a rotation: orientation kept)
    ones = torch.ones(uv.shape[0], device=device, dtype=uv.dtype)
    cnt = torch.zeros(n_charts, device=device, dtype=uv.dtype).index_add_(0, vchart, ones)
    mean = torch.zeros(n_charts, 2, device=device, dtype=uv.dtype).index_add_(0, vchart, uv) / cnt[:, None]
    q = uv - mean[vchart]
    cov = torch.zeros(n_charts, 3, device=device, dtype=uv.dtype).index_add_(
        0, vchart, torch.stack([q[:, 0] * q[:, 0], q[:, 1] * q[:, 1], q[:, 0] * q[:, 1]], -1)
    )
    theta = 0.5 * torch.atan2(2 * cov[:, 2], cov[:, 0] - cov[:, 1])
    c, s = torch.cos(theta)[vchart], torch.sin(theta)[vchart]
    uv = torch.stack([c * q[:, 0] + s * q[:, 1], -s * q[:, 0] + c * q[:, 1]], -1)
    lo, hi = _chart_bounds(uv, vchart, n_charts)
    ext = hi - lo
    turn = (ext[:, 1] > ext[:, 0])[vchart]  # longer side along u: rotate by 90 degrees
    uv = torch.where(turn[:, None], torch.stack([-uv[:, 1], uv[:, 0]], -1), uv)
    lo, _ = _chart_bounds(uv, vchart, n_charts)
    return source, new_faces, uv - lo[vchart], vchart


def _chart_bounds(uv: torch.Tensor, vchart: torch.Tensor, n_charts: int) -> tuple[torch.Tensor, torch.Tensor]:
    big = torch.finfo(uv.dtype).max
    lo = torch.full((n_charts, 2), big, device=uv.device, dtype=uv.dtype)
    hi = torch.full((n_charts, 2), -big, device=uv.device, dtype=uv.dtype)
    idx = vchart[:, None].expand(-1, 2)
    return lo.scatter_reduce(0, idx, uv, reduce="amin"), hi.scatter_reduce(0, idx, uv, reduce="amax")


# ---------------------------------------------------------------------------------------------------
# packing


def shelf_pack(widths: np.ndarray, heights: np.ndarray, width: int) -> tuple[np.ndarray, int]:
    """Next-fit shelf packing of integer rectangles, tallest first, into a strip ``width`` wide.

    Args:
        widths, heights: [C] int rectangle sizes (their gaps included), each at most ``width`` wide.

    Returns:
        ([C, 2] int64 lower-left corners, the strip height used).
    """
    order = np.lexsort((np.arange(len(widths)), -widths, -heights))
    pos = np.zeros((len(widths), 2), np.int64)
    x = y = shelf = 0
    for i in order.tolist():
        w, h = int(widths[i]), int(heights[i])
        if x + w > width:
            y += shelf
            x = shelf = 0
        pos[i] = (x, y)
        x += w
        shelf = max(shelf, h)
    return pos, y + shelf


def slab_extents(
    uv: torch.Tensor, faces: torch.Tensor, fchart: torch.Tensor, size: torch.Tensor, backend: str = "torch"
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """The exact extent of each chart in each unit-wide column and row (its slabs).

    Args:
        uv: [V, 2] float chart-local coordinates in slab units, each chart's minimum corner at (0, 0).
        faces: [F, 3] int64 into ``uv``; fchart: [F] int64 chart of each face.
        size: [C, 2] int64 slabs per chart (columns W_c, rows H_c), covering every uv.
        backend: ``"torch"`` (this function, over [faces x slabs] tensors, any device) or ``"cpp"``
            (:func:`microdreamer.kernels.cpu.slab_extents`: the same float64 operations one face at a
            time, CPU tensors; the same results to the bit, tested).

    Returns:
        (ymin, ymax, xmin, xmax): ymin/ymax [sum W_c] float64, the lowest and highest point of the
        chart over each column [j, j + 1], chart by chart (chart c's columns start at the sum of the W
        before it); xmin/xmax [sum H_c] the same per row. Slabs a chart does not reach hold (inf, -inf).
    """
    if backend == "cpp":
        from microdreamer.kernels import cpu

        return cpu.slab_extents(
            uv.double().contiguous(), faces.contiguous(), fchart.contiguous(), size.contiguous()
        )
    if backend != "torch":
        raise ValueError(f"slab_extents backend {backend!r} is unknown; use torch or cpp")
    out = []
    dev = uv.device
    uv = uv.double()
    for axis in (0, 1):
        tx, ty = uv[:, axis][faces], uv[:, 1 - axis][faces]  # [F, 3]
        n = size[:, axis]
        offset = torch.cumsum(n, 0) - n
        c0 = torch.floor(tx.amin(1)).long().clamp_min(0)
        c1 = torch.minimum(torch.maximum(c0, torch.ceil(tx.amax(1)).long() - 1), n[fchart] - 1)
        cnt = c1 - c0 + 1
        face = torch.repeat_interleave(torch.arange(faces.shape[0], device=dev), cnt)
        first = torch.cumsum(cnt, 0) - cnt
        col = c0[face] + torch.arange(face.numel(), device=dev) - first[face]
        # edges ordered by x, as lines y = y0 + slope (x - x0) over [x0, x1], per face: [F, 3] each
        ax, bx = tx, tx.roll(-1, 1)
        ay, by = ty, ty.roll(-1, 1)
        swap = bx < ax
        x0, x1 = torch.where(swap, bx, ax), torch.where(swap, ax, bx)
        y0, y1 = torch.where(swap, by, ay), torch.where(swap, ay, by)
        dx = x1 - x0
        vertical = dx <= 0
        slope = torch.where(
            vertical, torch.zeros_like(dx), (y1 - y0) / torch.where(vertical, torch.ones_like(dx), dx)
        )
        j = col.double()[:, None]
        fx0, fx1, fy0, fy1, fs = x0[face], x1[face], y0[face], y1[face], slope[face]  # [P, 3]
        lo = torch.maximum(j, fx0)
        hi = torch.minimum(j + 1, fx1)
        valid = lo <= hi
        fv = vertical[face]
        ya = torch.where(fv, fy0, fy0 + fs * (lo - fx0))
        yb = torch.where(fv, fy1, fy0 + fs * (hi - fx0))
        ymin = torch.where(valid, torch.minimum(ya, yb), torch.full_like(ya, math.inf)).amin(1)
        ymax = torch.where(valid, torch.maximum(ya, yb), torch.full_like(ya, -math.inf)).amax(1)
        slot = offset[fchart[face]] + col
        total = int(n.sum())
        lo_ext = torch.full((total,), math.inf, dtype=torch.float64, device=dev)
        hi_ext = torch.full((total,), -math.inf, dtype=torch.float64, device=dev)
        out += [
            lo_ext.scatter_reduce_(0, slot, ymin, reduce="amin"),
            hi_ext.scatter_reduce_(0, slot, ymax, reduce="amax"),
        ]
    return out[0], out[1], out[2], out[3]


def coarse_profiles(
    lo: np.ndarray,
    hi: np.ndarray,
    fine: np.ndarray,
    coarse: np.ndarray,
    ratio: float,
    rows: np.ndarray,
    select: np.ndarray,
) -> tuple[np.ndarray, np.ndarray]:
    """Integer profiles (first touched texel, one past the last) at a density ``1 / ratio`` times that
    of the fine slab extents lo/hi (:func:`slab_extents`), conservative: coarse slab j of a chart is
    covered by fine slabs floor(j r) .. ceil((j + 1) r) - 1 (r = ``ratio`` >= 1) and takes their extremes.

    Args:
        lo, hi: [sum fine] float64 fine extents, chart by chart; fine: [C] fine slabs per chart.
        coarse: [C] coarse slabs per chart, with ceil(coarse * ratio) >= fine.
        ratio: fine units per coarse unit, >= 1.
        rows: [C] the coarse size of each chart across the slabs (the clamp of the profiles).
        select: [S] the charts wanted, ascending.

    Returns:
        (first [sum coarse[select]], end [...]) int64, the selected charts' profiles one after another.
    """
    want = coarse[select]
    chart = np.repeat(select, want)
    j = np.arange(int(want.sum())) - np.repeat(np.cumsum(want) - want, want)
    f_off = np.cumsum(fine) - fine
    last = f_off[chart] + fine[chart] - 1
    start = np.minimum(f_off[chart] + np.floor(j * ratio).astype(np.int64), last)
    # the last fine slab meeting coarse slab j's interior (one that starts on its far edge does not)
    stop = np.minimum(f_off[chart] + np.ceil((j + 1) * ratio).astype(np.int64) - 1, last)
    stop = np.maximum(stop, start)
    lo_c = np.minimum(np.minimum.reduceat(lo, start), lo[stop]) if len(start) else lo[:0]
    hi_c = np.maximum(np.maximum.reduceat(hi, start), hi[stop]) if len(start) else hi[:0]
    # reduceat runs to the next start (the next slab's first fine slab, or the next selected chart's):
    # a superset of the slabs, so conservative
    m = rows[chart]
    first = np.clip(np.floor(lo_c / ratio), 0, None)
    end = np.ceil(hi_c / ratio)
    first = np.where(np.isfinite(first), first, m).astype(np.int64)
    end = np.where(np.isfinite(end), np.minimum(end, m), 0).astype(np.int64)
    end = np.where(end > first, end, np.minimum(first + 1, m) * (first < m))
    return first, end


def skyline_pack(
    profiles: list[tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]],
    width: int,
    padding: int,
    turnable: np.ndarray | None = None,
    orientations: int = 2,
) -> tuple[np.ndarray, np.ndarray, int]:
    """Drop chart profiles onto a skyline, largest first, Tetris-like, in one of two (or four) orientations.

    Each chart c comes as (bottom [W_c], top [W_c], left [H_c], right [H_c]) int arrays
    (:func:`coarse_profiles`). It is placed at the column and orientation where it comes to rest lowest
    (its top lowest; ties: the least empty area under it, then the leftmost); the skyline then rises to
    its top profile plus ``padding``, widened by ``padding`` columns each side, so that every two charts
    keep at least ``padding`` empty texels between their touched texels (Chebyshev). The strip is
    ``width`` columns wide, with ``padding`` empty columns at each side and rows at the bottom; its
    height grows as needed. ``turnable`` [C] bool: the items that may turn (default: all); ``orientations``:
    2 (as given, a quarter turn) or 4 (also the half and three-quarter turns).

    Returns:
        (corner [C, 2] int64 lower-left corner of each chart's box after rotation, orientation [C] int64
        quarter turns counter-clockwise, height: one past the highest touched row plus ``padding``).
    """
    from numpy.lib.stride_tricks import as_strided

    n = len(profiles)
    inner = width - 2 * padding
    p = padding
    sky_ext = np.full(inner + 2 * p, p, np.int64)  # p virtual columns each side take the dilation
    sky = sky_ext[p : p + inner]
    step = sky.strides[0]
    corner = np.zeros((n, 2), np.int64)
    turns = np.zeros(n, np.int64)
    area = np.array([int((t - b).clip(min=0).sum()) for b, t, _, _ in profiles])
    order = np.lexsort((np.arange(n), -area))
    height = p
    for c in order.tolist():
        b0, t0, l0, r0 = profiles[c]
        w, h = len(b0), len(l0)
        options = [(0, b0, t0)]
        if (turnable is None or turnable[c]) and max(w, h) >= 4:
            options.append((1, l0[::-1], r0[::-1]))  # quarter turn: column j' is row h - 1 - j'
            if orientations == 4:
                options.append((2, h - t0[::-1], h - b0[::-1]))  # half turn
                options.append((3, w - r0, w - l0))
        best = None
        for q, b, t in options:
            k = len(b)
            if k > inner:
                continue
            win = as_strided(sky, (inner - k + 1, k), (step, step), writeable=False)  # [positions, k]
            stride = max(1, k // 16)
            if stride > 1:  # coarse positions first, then every position around the best of them
                x = int((win[::stride] - b).max(1).argmin()) * stride
                lo, hi = max(0, x - stride + 1), min(len(win), x + stride)
                part = win[lo:hi]
            else:
                lo, part = 0, win
            gap = part - b
            rest = gap.max(1)  # the lowest corner row where the chart clears the skyline
            waste = rest * k - gap.sum(1)  # empty texels left under it
            score = rest * (k * (h + w + 2) + 1) + waste  # lowest first, then waste; argmin: leftmost
            i = int(score.argmin())
            key = (int(rest[i]) + int(t.max()), int(waste[i]))
            if best is None or key < best[0]:
                best = (key, q, lo + i, int(rest[i]), t)
        if best is None:
            raise ValueError(
                f"a chart {w} x {h} texels is wider than the atlas ({inner} texels inside the padding)"
            )
        (top, _), q, x, y, t = best
        k = len(t)
        corner[c] = (x + p, y)
        turns[c] = q
        rise = y + t + p
        seg = sky_ext[x : x + k + 2 * p]  # the chart's columns and p more each side
        for shift in range(2 * p + 1):
            np.maximum(seg[shift : shift + k], rise, out=seg[shift : shift + k])
        height = max(height, top + p)
    return corner, turns, height


PACKERS = ("auto", "numpy", "compiled")


def compiled_skyline_pack(
    profiles: list[tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]],
    width: int,
    padding: int,
    turnable: np.ndarray | None = None,
    orientations: int = 2,
) -> tuple[np.ndarray, np.ndarray, int]:
    """:func:`skyline_pack` in C++ (:func:`microdreamer.kernels.cpu.skyline_pack`, the C++ CPU
    kernels: needs a C++ compiler on first use): the same arguments, the same layout, 6-15x faster on
    the samples' charts (``benchmarks/README.md``)."""
    from microdreamer.kernels import cpu

    n = len(profiles)
    widths = np.fromiter((len(p[0]) for p in profiles), np.int64, n)
    heights = np.fromiter((len(p[2]) for p in profiles), np.int64, n)

    def flat(i: int) -> torch.Tensor:
        parts = [p[i] for p in profiles]
        return torch.from_numpy(np.concatenate(parts).astype(np.int64) if n else np.zeros(0, np.int64))

    def offsets(sizes: np.ndarray) -> torch.Tensor:
        return torch.from_numpy(np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64))

    turn = torch.as_tensor(np.ones(n, bool) if turnable is None else np.asarray(turnable, bool))
    corner, turns, height = cpu.skyline_pack(
        flat(0), flat(1), offsets(widths), flat(2), flat(3), offsets(heights), turn.contiguous(),
        width, padding, orientations,
    )  # fmt: skip
    if height < 0:
        c = -1 - height
        raise ValueError(
            f"a chart {widths[c]} x {heights[c]} texels is wider than the atlas "
            f"({width - 2 * padding} texels inside the padding)"
        )
    return corner.numpy(), turns.numpy(), int(height)


def _turn(uv: torch.Tensor, turns: torch.Tensor, box: torch.Tensor) -> torch.Tensor:
    """Chart-local texel coordinates [V, 2] turned by ``turns`` [V] quarter turns counter-clockwise
    inside their [V, 2] boxes (W, H), the turned box's corner staying at (0, 0)."""
    u, v = uv[:, 0], uv[:, 1]
    w, h = box[:, 0].to(uv.dtype), box[:, 1].to(uv.dtype)
    out = torch.stack([u, v], -1)
    out = torch.where((turns == 1)[:, None], torch.stack([h - v, u], -1), out)
    out = torch.where((turns == 2)[:, None], torch.stack([w - u, h - v], -1), out)
    out = torch.where((turns == 3)[:, None], torch.stack([v, w - u], -1), out)
    return out


def _small_tiles(boxes: np.ndarray, tile: int, padding: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Next-fit shelf packing of small chart boxes [S, 2] (W, H) into tiles ``tile`` texels wide, tallest
    first, ``padding`` texels between boxes: (tile of each box [S], corner in its tile [S, 2], tile
    sizes [T, 2] without trailing padding)."""
    order = np.lexsort((np.arange(len(boxes)), -boxes[:, 0], -boxes[:, 1]))
    which = np.zeros(len(boxes), np.int64)
    corner = np.zeros((len(boxes), 2), np.int64)
    sizes = []
    x = y = shelf = used_w = 0
    for i in order.tolist():
        w, h = int(boxes[i, 0]), int(boxes[i, 1])
        if x and x + w > tile:
            y += shelf + padding
            x = shelf = 0
        if y and y + h > tile:
            sizes.append((used_w, y - padding))
            x = y = shelf = used_w = 0
        which[i] = len(sizes)
        corner[i] = (x, y)
        used_w = max(used_w, x + w)
        x += w + padding
        shelf = max(shelf, h)
    sizes.append((used_w, y + shelf))
    return which, corner, np.array(sizes, np.int64)


def _pack_at(
    uv: torch.Tensor,
    vchart: torch.Tensor,
    extent: torch.Tensor,
    fine: tuple,
    density: float,
    size: int,
    padding: int,
    packing: str,
    anchors: tuple[torch.Tensor, torch.Tensor] | None = None,
    small_side: int = 12,
    tile: int = 48,
    max_outlines: int = 256,
    min_texels: float = 8.0,
    packer=skyline_pack,
) -> tuple[torch.Tensor, int]:
    """Charts scaled by ``density`` and packed into a strip ``size`` texels wide: ([V, 2] atlas texel
    coordinates, the height used, padding included; the layout fits the atlas when it is <= size).

    ``"shelf"``: each chart's bounding box on shelves (:func:`shelf_pack`); ``"skyline"``: the
    ``max_outlines`` largest charts with a side over ``small_side`` texels dropped as outlines
    (:func:`skyline_pack`, their profiles from the ``fine`` slab extents, see :func:`_fine_extents`),
    the others shelf-packed into tiles ``tile`` texels wide (or as wide as the widest of them) that are
    dropped as rectangles (the skyline's cost is per item). Each chart's box corner lands on an
    integer texel, so the texel lattice seen by every chart is its local one.

    ``anchors`` ([C, 2] a point of each chart in its local uv, [C] its uv area): the box-packed charts
    (all with ``"shelf"``, the tiled ones with ``"skyline"``) of under ``min_texels`` texels of area
    move by less than a texel in their boxes (one texel larger) so that their anchor lies on a texel
    centre: then they cover a texel of their own, which a chart too small to cover one would not.
    ``packer``: :func:`skyline_pack` or :func:`compiled_skyline_pack`."""
    dev = uv.device
    n_charts = extent.shape[0]
    box = torch.ceil(extent * density - 1e-9).long().clamp_min(1)  # [C, 2] texels
    box_np = box.cpu().numpy()
    small = np.ones(n_charts, bool)
    if packing == "skyline":
        # outlines for the largest charts (at most max_outlines, each with a side over small_side);
        # the rest in shelf-packed tiles
        rank = np.lexsort((np.arange(n_charts), -box_np.prod(1)))
        small[rank[:max_outlines]] = False
        small |= box_np.max(1) <= small_side
    shift = torch.zeros_like(extent)
    if anchors is not None:
        anchor, area = anchors
        tiny = (area * density**2 < min_texels) & torch.as_tensor(small, device=dev)
        shift = torch.where(tiny[:, None], torch.remainder(0.5 - anchor * density, 1.0), shift)
        box = torch.ceil(extent * density + shift - 1e-9).long().clamp_min(1)
        box_np = box.cpu().numpy()
    uv_px = uv * density + shift[vchart]
    if packing == "shelf":
        corner, height = shelf_pack(box_np[:, 0] + padding, box_np[:, 1] + padding, size - padding)
        local = uv_px + padding
        return local + torch.as_tensor(corner, device=dev, dtype=uv.dtype)[vchart], height + padding
    f_density, f_size, ymin, ymax, xmin, xmax = fine
    ratio = f_density / density
    big = np.nonzero(~small)[0]
    bottom, top = coarse_profiles(ymin, ymax, f_size[:, 0], box_np[:, 0], ratio, box_np[:, 1], big)
    left, right = coarse_profiles(xmin, xmax, f_size[:, 1], box_np[:, 1], ratio, box_np[:, 0], big)
    c_end, r_end = np.cumsum(box_np[big, 0]).tolist(), np.cumsum(box_np[big, 1]).tolist()
    items = [
        (bottom[c0:c1], top[c0:c1], left[r0:r1], right[r0:r1])
        for c0, c1, r0, r1 in zip([0, *c_end][:-1], c_end, [0, *r_end][:-1], r_end, strict=True)
    ]
    if small.any():
        tile = max(min(tile, size - 2 * padding), int(box_np[small].max()))  # a tile fits across the atlas
        which, in_tile, tiles = _small_tiles(box_np[small], tile, padding)
        for w, h in tiles.tolist():
            items.append((np.zeros(w, np.int64), np.full(w, h), np.zeros(h, np.int64), np.full(h, w)))
    turnable = np.arange(len(items)) < len(big)
    corner_items, turns_items, height = packer(items, size, padding, turnable)
    corner = np.zeros((n_charts, 2), np.int64)
    turns = np.zeros(n_charts, np.int64)
    corner[big] = corner_items[: len(big)]
    turns[big] = turns_items[: len(big)]
    if small.any():
        corner[small] = corner_items[len(big) + which] + in_tile
    turns_v = torch.as_tensor(turns, device=dev)[vchart]
    local = _turn(uv_px, turns_v, box[vchart])
    return local + torch.as_tensor(corner, device=dev, dtype=uv.dtype)[vchart], height


def _chart_anchors(
    uv: torch.Tensor, faces: torch.Tensor, chart: torch.Tensor, n_charts: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """([C, 2] the incentre of each chart's largest face in local uv (the first of equal ones), [C] the
    chart's uv area): the point deepest inside that face, for :func:`_pack_at`."""
    t = uv[faces]  # [F, 3, 2]
    e0, e1 = t[:, 1] - t[:, 0], t[:, 2] - t[:, 0]
    area = 0.5 * (e0[:, 0] * e1[:, 1] - e0[:, 1] * e1[:, 0]).abs()
    total = torch.zeros(n_charts, device=uv.device, dtype=uv.dtype).index_add_(0, chart, area)
    most = torch.zeros(n_charts, device=uv.device, dtype=uv.dtype).scatter_reduce_(
        0, chart, area, reduce="amax"
    )
    f = faces.shape[0]
    index = torch.where(area == most[chart], torch.arange(f, device=uv.device), f)
    first = torch.full((n_charts,), f, device=uv.device).scatter_reduce_(0, chart, index, reduce="amin")
    tri = t[first]  # [C, 3, 2]
    side = (tri.roll(-1, 1) - tri.roll(-2, 1)).norm(dim=-1)  # side k: opposite vertex k
    anchor = (side[..., None] * tri).sum(1) / side.sum(1, keepdim=True).clamp_min(1e-300)
    return anchor, total


def _fine_extents(
    uv: torch.Tensor,
    faces: torch.Tensor,
    chart: torch.Tensor,
    extent: torch.Tensor,
    density: float,
    backend: str = "torch",
):
    """(density, [C, 2] slabs, ymin, ymax, xmin, xmax as NumPy): :func:`slab_extents` of the charts at
    ``density``, from which :func:`coarse_profiles` gives the profiles at any density up to it."""
    size = torch.ceil(extent * density - 1e-9).long().clamp_min(1)
    ext = slab_extents(uv * density, faces, chart, size, backend=backend)
    return (density, size.cpu().numpy(), *(e.cpu().numpy() for e in ext))


class AtlasTooSmall(ValueError):
    """The charts do not fit the atlas at any density tried (each needs a texel and its padding)."""


def _search_density(
    uv: torch.Tensor,
    faces: torch.Tensor,
    chart: torch.Tensor,
    vchart: torch.Tensor,
    extent: torch.Tensor,
    density: float,
    cap: float,
    size: int,
    padding: int,
    packing: str,
    anchors: tuple[torch.Tensor, torch.Tensor] | None = None,
    packer=skyline_pack,
    backend: str = "torch",
) -> tuple[float, torch.Tensor, int]:
    """(density, [V, 2] atlas texel coordinates, packs tried): the largest density found at which
    :func:`_pack_at` fits the charts, from ``density``, at most ``cap``. Each try aims the packed height
    at 99 % of the atlas by a power law fitted to the last two tries (height ~ density^e, e between 1,
    tall charts, and 2, many small ones; 1.5 before the second try); it stops at a layout within 4 %
    of the atlas height, after three tries, or at a fit next to a try that did not fit. The
    skyline's profiles come from slab extents taken once at 1.2 times the first density, which then
    bounds the density."""
    fine = None
    best = None
    tries = 0
    history: list[tuple[float, float]] = []
    for attempt in range(12):
        if packing == "skyline" and fine is None:
            fine = _fine_extents(uv, faces, chart, extent, min(cap, 1.2 * density), backend)
        if fine is not None:
            density = min(density, fine[0])
        try:
            uv_px, height = _pack_at(
                uv, vchart, extent, fine, density, size, padding, packing, anchors, packer=packer
            )
        except ValueError:  # an item wider than the atlas at this density: smaller, as for a tall layout
            uv_px, height = None, 2 * size
        tries += 1
        ratio = size / height
        history.append((math.log(density), math.log(height)))
        if ratio >= 1.0:
            if best is None or density > best[0]:
                best = (density, uv_px)
            top = fine is not None and density >= fine[0]
            if ratio < 1.04 or density >= cap or top or attempt >= 2:
                break
        elif best is not None:
            break
        exponent = 1.5
        if len(history) >= 2 and abs(history[-1][0] - history[-2][0]) > 1e-6:
            exponent = (history[-1][1] - history[-2][1]) / (history[-1][0] - history[-2][0])
            exponent = min(2.0, max(1.0, exponent))
        density = min(cap, density * (0.99 * ratio) ** (1.0 / exponent))
    if best is None:
        raise AtlasTooSmall(
            f"{extent.shape[0]} charts do not fit a {size}^2 atlas with padding {padding}; "
            "use a larger texture size or a smaller padding"
        )
    return best[0], best[1], tries


# ---------------------------------------------------------------------------------------------------
# overlap check


def row_spans(
    uv_px: torch.Tensor,
    faces: torch.Tensor,
    width: int,
    height: int,
    margin: float = 1e-6,
    backend: str = "torch",
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """The texel centres strictly inside each UV triangle, as runs along rows (a scanline rasteriser).

    Texel (x, y) has its centre at (x + 0.5, y + 0.5). A row counts for a triangle when its centre line
    is more than ``margin`` inside the triangle's y range, and a centre when it is more than ``margin``
    inside the triangle's section of that line; each edge is evaluated from its endpoints in one
    canonical order, so a centre on an edge shared by two triangles counts for neither.

    Args:
        uv_px: [V, 2] float texel coordinates; faces: [F, 3] int64.
        width, height: the grid; runs are clipped to it.
        backend: ``"torch"`` (this function, any device) or ``"cpp"`` (:func:`microdreamer.kernels.cpu.
            row_spans`: the same float64 operations one face and row at a time, CPU tensors; the same
            runs in the same order, tested).

    Returns:
        (row [P], x0 [P], x1 [P], face [P]) int64: face covers the centres of texels x0..x1 (inclusive)
        of row ``row``, face by face and row by row; only non-empty runs.
    """
    if backend == "cpp":
        from microdreamer.kernels import cpu

        return cpu.row_spans(uv_px.double().contiguous(), faces.contiguous(), width, height, margin)
    if backend != "torch":
        raise ValueError(f"row_spans backend {backend!r} is unknown; use torch or cpp")
    device = uv_px.device
    tri = uv_px[faces].double()  # [F, 3, 2]
    ymin, ymax = tri[..., 1].amin(1), tri[..., 1].amax(1)
    r0 = torch.floor(ymin + margin - 0.5).long() + 1  # first row with yc > ymin + margin
    r1 = torch.ceil(ymax - margin - 0.5).long() - 1  # last row with yc < ymax - margin
    r0 = r0.clamp_min(0)
    r1 = r1.clamp_max(height - 1)
    cnt = (r1 - r0 + 1).clamp_min(0)
    total = int(cnt.sum())
    face = torch.repeat_interleave(torch.arange(faces.shape[0], device=device), cnt, output_size=total)
    first = torch.cumsum(cnt, 0) - cnt
    row = r0[face] + torch.arange(total, device=device) - first[face]
    yc = row.double() + 0.5
    xl = torch.full((total,), math.inf, dtype=torch.float64, device=device)
    xr = torch.full_like(xl, -math.inf)
    for k in range(3):
        a, b = tri[:, k], tri[:, (k + 1) % 3]
        swap = (b[:, 1] < a[:, 1]) | ((b[:, 1] == a[:, 1]) & (b[:, 0] < a[:, 0]))
        lo = torch.where(swap[:, None], b, a)  # canonical: lower end first
        hi = torch.where(swap[:, None], a, b)
        dy = hi[:, 1] - lo[:, 1]
        inv = torch.where(dy > 0, (hi[:, 0] - lo[:, 0]) / dy.clamp_min(1e-300), torch.zeros_like(dy))
        ly, lx, hy = lo[face, 1], lo[face, 0], hi[face, 1]
        active = (ly <= yc) & (yc <= hy) & (dy[face] > 0)
        x = lx + (yc - ly) * inv[face]
        xl = torch.where(active, torch.minimum(xl, x), xl)
        xr = torch.where(active, torch.maximum(xr, x), xr)
    x0 = (torch.floor(xl + margin - 0.5).long() + 1).clamp_min(0)
    x1 = (torch.ceil(xr - margin - 0.5).long() - 1).clamp_max(width - 1)
    keep = x0 <= x1
    return row[keep], x0[keep], x1[keep], face[keep]


def _conflicts(
    row: torch.Tensor,
    x0: torch.Tensor,
    x1: torch.Tensor,
    face: torch.Tensor,
    width: int,
    backend: str = "torch",
) -> tuple[torch.Tensor, torch.Tensor]:
    """(fa [P], fb [P]): pairs of faces whose runs (:func:`row_spans`) share a texel centre: each run
    against the run reaching farthest right among those starting before it on its row (``backend="cpp"``:
    :func:`microdreamer.kernels.cpu.run_conflicts`, the same pairs in the same order)."""
    if backend == "cpp":
        from microdreamer.kernels import cpu

        return cpu.run_conflicts(row, x0, x1, face)
    if backend != "torch":
        raise ValueError(f"conflicts backend {backend!r} is unknown; use torch or cpp")
    if row.numel() < 2:
        return face[:0], face[:0]
    _, order = _stable_sort(row * (width + 1) + x0)
    r, a, b, f = row[order], x0[order], x1[order], face[order]
    reach, arg = torch.cummax(b + r * (2 * width + 2), 0)  # rows offset apart: a running max per row
    prev_reach = reach[:-1] - r[1:] * (2 * width + 2)
    hit = prev_reach >= a[1:]
    return f[arg[:-1][hit]], f[1:][hit]


# ---------------------------------------------------------------------------------------------------
# the unwrap


def unwrap_charts(
    mesh: Mesh,
    max_faces: int | None = None,
    texture_size: int = 1024,
    padding: int = 2,
    directions: int = 14,
    min_cos: float = 0.5,
    smooth_iterations: int = 4,
    merge_min_cos: float = 0.25,
    min_chart_faces: int = 64,
    merge_rounds: int = 4,
    split_rounds: int = 8,
    few_pairs: int = 16,
    fold_check: float = 2.0,
    packing: str = "skyline",
    device: str | torch.device = "cpu",
    packer: str = "auto",
    backend: str = "auto",
) -> UVLayout:
    """Unwrap ``mesh`` into charts of clustered normals (see the module docstring).

    Args:
        mesh: a non-empty triangle mesh (not modified); any UVs or texture it carries are ignored.
        max_faces: face cap applied first (quadric decimation; on CUDA a mesh of many times the cap is
            clustered there first, :func:`~microdreamer.mesh.decimate`); None = no cap.
        texture_size: the atlas is texture_size^2 texels; the packing, padding and overlap check are
            exact at this size.
        padding: empty texels (Chebyshev) between the texels any two charts touch, and between a
            chart and the atlas border.
        directions: the chart directions, 6, 14 or 26 (:data:`DIRECTION_SETS`); more gives less
            distortion and more charts.
        min_cos: a face takes the direction of its smoothed normal only if its own normal is within
            arccos(min_cos) of it; at most the set's covering cosine (0.577 for 6 directions, 0.806
            for 14, 0.886 for 26).
        smooth_iterations: rounds of bilateral normal smoothing over the edge neighbours before
            labelling (each widens the smoothing by about one ring of faces; 0: the faces' own normals).
            A few rings: marching-cubes noise is a few faces wide, and more would average across thin
            parts.
        merge_min_cos: the floor of ``n . d`` for faces that small charts hand to their neighbours
            (at most ``min_cos``): noise leaves faces far from every neighbouring direction, and a face
            in a neighbour's chart beats a chart of its own. It bounds the area scale of every face.
        min_chart_faces: charts with fewer faces are merged into neighbours where the normals allow.
        merge_rounds: rounds of that merging (whole charts, or one ring of faces each).
        split_rounds: rounds of cutting charts that fold over themselves before the last resort
            (the later face of each overlapping pair becomes a chart of its own).
        few_pairs: charts with at most this many overlapping face pairs lose the later face of each
            pair instead of being cut in two.
        fold_check: folds are looked for first on a lattice this many times finer than the packing's
            first density, before packing (then in the atlas: each round that finds folds there packs
            again).
        packing: ``"skyline"`` (chart outlines dropped onto a skyline in two orientations: denser)
            or ``"shelf"`` (bounding rectangles on shelves: fewer steps, less of the atlas used).
        device: where the computation runs (the packing loop runs on the CPU either way).
        packer: the skyline's loop: ``"numpy"`` (:func:`skyline_pack`), ``"compiled"`` (the same in C++,
            :func:`compiled_skyline_pack`: needs a C++ compiler), or ``"auto"``: compiled where the C++
            CPU kernels build, else NumPy. Both give the same layout.
        backend: the slab extents, row spans and their overlaps (the UV rasterisation of the packing and
            the fold checks) and the charts' connected components: ``"torch"`` (:func:`slab_extents`,
            :func:`row_spans`, any device; the components by SciPy on the CPU), ``"cpp"`` (the C++ CPU
            kernels: the same results to the bit, on the CPU only) or ``"auto"``: ``"cpp"`` on the CPU
            where the kernels build, else ``"torch"``. Both give the same layout.

    Returns:
        :class:`UVLayout`; stats ``faces_in``, ``faces``, ``vertices``, ``charts``, ``utilization``
        (UV triangle area / atlas area), ``texels_covered`` (fraction of texel centres inside a
        triangle), ``texel_density`` (texels per world unit at ``texture_size``), ``atlas_width`` =
        ``atlas_height`` = ``texture_size``, ``directions``, ``min_cos``, ``merge_min_cos``,
        ``smooth_iterations``, ``split_rounds`` (rounds that found folds), ``packs`` (packings tried),
        ``faces_alone`` (faces left as charts of their own), and ``seconds`` {``decimate``,
        ``unwrap``, ``steps``: seconds per step summed over the rounds}.

    Raises:
        ValueError: an empty mesh, or settings out of range.
    """
    if mesh.is_empty:
        raise ValueError("cannot unwrap an empty mesh (0 faces)")
    if directions not in DIRECTION_SETS:
        raise ValueError(
            f"directions = {directions} is not a direction set; use one of {sorted(DIRECTION_SETS)}"
        )
    dirs_np, covering = DIRECTION_SETS[directions]
    if not 0.0 < min_cos <= covering:
        raise ValueError(
            f"min_cos = {min_cos} is out of range for {directions} directions; use a value in (0, {covering:.4f}]"
        )
    if not 0.0 < merge_min_cos <= min_cos:
        raise ValueError(
            f"merge_min_cos = {merge_min_cos} is out of range; use a value in (0, min_cos = {min_cos}]"
        )
    if padding < 0:
        raise ValueError(f"padding = {padding} is negative; use 0 or more")
    if packing not in ("skyline", "shelf"):
        raise ValueError(f"packing = {packing!r} is unknown; use skyline or shelf")
    if packer not in PACKERS:
        raise ValueError(f"packer = {packer!r} is unknown; use one of {', '.join(PACKERS)}")
    device = torch.device(device)
    if packer == "auto":
        from microdreamer.kernels import cpu

        packer = "compiled" if cpu.usable() else "numpy"
    pack_fn = compiled_skyline_pack if packer == "compiled" else skyline_pack
    if backend not in ("auto", "torch", "cpp"):
        raise ValueError(f"backend = {backend!r} is unknown; use auto, torch or cpp")
    if backend == "cpp" and device.type != "cpu":
        raise ValueError(f"backend = 'cpp' runs on the CPU only, not on {device}; use auto or torch")
    if backend == "auto":
        from microdreamer.kernels import cpu

        backend = "cpp" if device.type == "cpu" and cpu.usable() else "torch"
    components = "cpp" if backend == "cpp" else "auto"  # the connected components follow
    faces_in = mesh.num_faces
    start = time.perf_counter()
    if max_faces is not None and mesh.num_faces > max_faces:
        mesh = decimate(Mesh(mesh.vertices, mesh.faces, mesh.vertex_colors), max_faces, device=device)
    t_decimate = time.perf_counter() - start

    start = time.perf_counter()
    phase: dict[str, float] = {}
    clock = [start]

    def tick(name: str) -> None:  # seconds per step, summed over the rounds
        now = time.perf_counter()
        phase[name] = phase.get(name, 0.0) + now - clock[0]
        clock[0] = now

    verts = torch.as_tensor(mesh.vertices, device=device).double()
    faces = torch.as_tensor(mesh.faces, device=device)
    f = faces.shape[0]
    dirs = torch.as_tensor(dirs_np, device=device)
    tri = verts[faces]
    cross = torch.linalg.cross(tri[:, 1] - tri[:, 0], tri[:, 2] - tri[:, 0])
    area = 0.5 * cross.norm(dim=-1)
    degenerate = area <= 1e-12 * max(float(area.max()), 1e-300)
    normals = torch.nn.functional.normalize(cross, dim=-1)
    nbr = face_neighbours(faces)
    centroids = tri.mean(1)

    iterations = int(smooth_iterations)
    smooth = _smoothed_normals(tri, nbr, iterations)
    cos = normals @ dirs.T  # [F, K]
    labels = _labels(normals, smooth, degenerate, dirs, min_cos)
    tick("labels")
    if min_chart_faces > 1 and merge_rounds > 0:
        labels = _merge_small(
            labels, nbr, cos, degenerate, merge_min_cos, min_chart_faces, merge_rounds, components
        )
    tick("merge")
    idx = nbr.clamp_min(0)
    key = labels
    alone = torch.zeros(f, dtype=torch.bool, device=device)
    inner = texture_size - 2 * padding
    rounds = packs = 0
    density = None
    dirty = torch.ones(f, dtype=torch.bool, device=device)
    while True:
        comp = connected_components(
            nbr, (key[idx] == key[:, None]) & ~alone[:, None] & ~alone[idx], components
        )
        roots, chart = _unique_inverse(comp)  # charts numbered by their first face
        n_charts = roots.numel()
        axis = _chart_frames(chart, n_charts, normals, area, degenerate, dirs, labels, min_cos)
        source, new_faces, uv, vchart = _project(verts, faces, chart, axis)
        lo, hi = _chart_bounds(uv, vchart, n_charts)
        extent = hi - lo
        tick("charts")
        cap = (inner - 1) / max(float(extent.max()), 1e-30)  # the longest chart fits across
        if density is None:
            t_uv = uv[new_faces]
            e0, e1 = t_uv[:, 1] - t_uv[:, 0], t_uv[:, 2] - t_uv[:, 0]
            uv_area = float((0.5 * (e0[:, 0] * e1[:, 1] - e0[:, 1] * e1[:, 0]).abs()).sum())
            density = inner * math.sqrt(0.6 / max(uv_area, 1e-30))
        # the largest density at which the packer fits the charts (a few packs: the packed height
        # grows about as the density squared)
        density = min(density, cap)
        # folds first, before any packing, on a lattice `fold_check` times finer than this density's,
        # each chart in its own box along a strip: it finds the overlaps wider than about a texel / 2,
        # and the atlas check below the rest at the packed density
        fine_d = density * fold_check
        box = torch.ceil(extent * fine_d - 1e-9).long().clamp_min(1) + 1
        x0 = torch.cumsum(box[:, 0], 0) - box[:, 0]
        strip = torch.stack([x0, torch.zeros_like(x0)], -1).to(uv.dtype)
        strip_w = int(box[:, 0].sum())
        todo = dirty.nonzero(as_tuple=True)[0]  # the faces of charts made since the last check
        spans = row_spans(
            uv * fine_d + strip[vchart], new_faces[todo], strip_w, int(box[:, 1].max()), backend=backend
        )
        fa, fb = _conflicts(*spans, strip_w, backend=backend)
        fa, fb = todo[fa], todo[fb]
        tick("folds")
        if fa.numel() == 0:
            anchors = _chart_anchors(uv, new_faces, chart, n_charts)
            density, uv_px, tries = _search_density(
                uv, new_faces, chart, vchart, extent, density, cap, texture_size, padding, packing, anchors,
                packer=pack_fn, backend=backend,
            )  # fmt: skip
            packs += tries
            tick("pack")
            # folds at the packed density, in the atlas (charts never share texels)
            spans = row_spans(uv_px, new_faces, texture_size, texture_size, backend=backend)
            fa, fb = _conflicts(*spans, texture_size, backend=backend)
            tick("folds")
            if fa.numel() == 0:
                break
        rounds += 1
        folded = torch.zeros(n_charts, dtype=torch.bool, device=device)
        folded[chart[fa]] = True
        folded[chart[fb]] = True
        dirty = folded[chart]
        if rounds > split_rounds:
            alone[fb] = True  # the last resort: every later face of an overlapping pair alone
            continue
        # a face overlapping a face of its own one-ring (a pinched or folded vertex), or one of the few
        # overlapping faces of a chart, leaves the chart: removing every later face of the pairs leaves
        # the rest of the chart without overlaps
        pairs = torch.bincount(chart[fa], minlength=n_charts)
        shares = (faces[fa][:, :, None] == faces[fb][:, None, :]).any(-1).any(-1)
        shares |= pairs[chart[fa]] <= few_pairs
        detach = torch.zeros(f, dtype=torch.bool, device=device)
        detach[fb[shares]] = True
        far = torch.zeros(n_charts, dtype=torch.bool, device=device)
        far[chart[fa[~shares]]] = True
        if rounds <= split_rounds // 2:
            # a sheet folded over itself along the chart's direction: cut between the heights of the
            # faces that overlap (the mean of each pair's midpoint, per chart)
            h = _dot(centroids, axis[chart])
            sel = ~shares
            mid = 0.5 * (h[fa[sel]] + h[fb[sel]])
            cnt = torch.zeros(n_charts, device=device, dtype=h.dtype).index_add_(
                0, chart[fa[sel]], torch.ones_like(mid)
            )
            thr = torch.zeros(n_charts, device=device, dtype=h.dtype).index_add_(0, chart[fa[sel]], mid)
            side = h > (thr / cnt.clamp_min(1))[chart]
        else:
            # else in two across the chart's longer side (u), by face centroid
            side = uv[new_faces][:, :, 0].mean(1) > 0.5 * extent[:, 0][chart]
        key = chart * 4 + 2 * detach.long() + (side & far[chart]).long()
        tick("split")
    t_unwrap = time.perf_counter() - start

    uv_out = (uv_px / texture_size).float().clamp(0.0, 1.0)
    src = source.cpu().numpy()
    out_faces = new_faces.cpu().numpy()
    colors = None if mesh.vertex_colors is None else mesh.vertex_colors[src]
    out = Mesh(mesh.vertices[src], out_faces, colors)
    t_uv = uv_out.double()[new_faces]
    e0, e1 = t_uv[:, 1] - t_uv[:, 0], t_uv[:, 2] - t_uv[:, 0]
    uv_area = float((0.5 * (e0[:, 0] * e1[:, 1] - e0[:, 1] * e1[:, 0]).abs()).sum())
    stats = {
        "faces_in": faces_in,
        "faces": out.num_faces,
        "vertices": out.num_vertices,
        "charts": int(n_charts),
        "utilization": uv_area,
        "texels_covered": float((spans[2] - spans[1] + 1).sum()) / texture_size**2,
        "texel_density": float(density),
        "atlas_width": int(texture_size),
        "atlas_height": int(texture_size),
        "directions": int(directions),
        "min_cos": float(min_cos),
        "merge_min_cos": float(merge_min_cos),
        "smooth_iterations": iterations,
        "split_rounds": rounds,
        "packs": packs,
        "faces_alone": int(alone.sum()),
        "seconds": {"decimate": t_decimate, "unwrap": t_unwrap, "steps": phase},
    }
    logger.info(
        "unwrap (charts): %d -> %d faces, %d charts, %.0f%% of the atlas used, %.2f s",
        faces_in, out.num_faces, n_charts, 100 * uv_area, t_unwrap,
    )  # fmt: skip
    return UVLayout(out, uv_out.cpu().numpy(), src, stats)
