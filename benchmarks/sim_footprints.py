"""CPU simulation for the tiled kernel's warp footprints at 512^3 / 1M (round 9): how many (warp footprint,
Gaussian) visits, 8-voxel chunk executions and in-cutoff pairs each footprint shape gives on the synthetic
object, from a random sample of its Gaussians (counts scaled to all of them).

    python benchmarks/sim_footprints.py [SAMPLE] [R] [N]

A footprint is FX x FY columns by TZ voxels of z (the kernel today: 8 x 4 x 32, one column per lane). A visit is
a footprint whose z range meets the Gaussian's box and in which some column reaches the cutoff (the kernel's
cull is a little more permissive: the minimum of Q2 over the footprint's rectangle); a chunk execution is an
8-voxel z chunk of a visit that some column's cutoff interval reaches (the kernel's per-chunk vote). The
Gaussian's voxel box is exact_range's; the column's interval |z - zc| <= sqrt((c^2 - Q2) / A) in float64.
"""

import sys

import numpy as np

from _common import synthetic_arrays, voxel_boxes  # benchmarks/ is on sys.path when run as a script

SHAPES = [(8, 4, 32), (8, 4, 64), (8, 8, 32), (16, 4, 32), (16, 8, 32), (16, 16, 32), (8, 4, 16)]


def main() -> None:
    sample = int(sys.argv[1]) if len(sys.argv) > 1 else 3000
    r = int(sys.argv[2]) if len(sys.argv) > 2 else 512
    n = int(sys.argv[3]) if len(sys.argv) > 3 else 1_000_000
    cfg, mu, rad, m = synthetic_arrays(r, n)
    rng = np.random.default_rng(0)
    idx = rng.choice(len(mu), size=min(sample, len(mu)), replace=False)
    mu, rad, m = mu[idx], rad[idx], m[idx]
    prec = np.einsum("nki,nkj->nij", m, m)  # q = d^T P d
    cut = float(cfg.cutoff_sq)
    h = 2.0 / (r - 1)
    lo, hi = voxel_boxes(mu, rad, r)
    visits = {s: 0 for s in SHAPES}
    chunks = {s: 0 for s in SHAPES}
    pairs = 0
    for g in range(len(idx)):
        xs = np.arange(lo[g, 0], hi[g, 0] + 1)
        ys = np.arange(lo[g, 1], hi[g, 1] + 1)
        if len(xs) == 0 or len(ys) == 0 or hi[g, 2] < lo[g, 2]:
            continue
        dx = (-1 + xs * h - mu[g, 0])[:, None]
        dy = (-1 + ys * h - mu[g, 1])[None, :]
        pp = prec[g]
        a = pp[2, 2]
        zc = mu[g, 2] - (pp[2, 0] * dx + pp[2, 1] * dy) / a
        q2 = (pp[0, 0] - pp[0, 2] ** 2 / a) * dx**2 + 2 * (pp[0, 1] - pp[0, 2] * pp[1, 2] / a) * dx * dy
        q2 = q2 + (pp[1, 1] - pp[1, 2] ** 2 / a) * dy**2
        inside = q2 <= cut
        half = np.sqrt(np.maximum(cut - q2, 0.0) / a)
        klo = np.maximum(np.ceil((zc - half + 1) / h - 1e-9), lo[g, 2]).astype(int)
        khi = np.minimum(np.floor((zc + half + 1) / h + 1e-9), hi[g, 2]).astype(int)
        ok = inside & (khi >= klo)
        pairs += int(np.where(ok, khi - klo + 1, 0).sum())
        gx, gy = np.meshgrid(xs, ys, indexing="ij")
        for fx, fy, tz in SHAPES:
            # footprints (fx-aligned in x, fy in y, tz in z) that meet the box; the same xy footprints are
            # visited in every z slab of the box
            key = (gx // fx) * 100_003 + gy // fy
            slabs = range(lo[g, 2] // tz, hi[g, 2] // tz + 1)
            visits[(fx, fy, tz)] += len(np.unique(key[inside])) * len(slabs)
            for kz in slabs:
                z0 = kz * tz
                # per column: its interval's chunk range within [z0, z0 + tz)
                c_lo = np.clip((klo - z0) // 8, 0, tz // 8)
                c_hi = np.clip((khi - z0) // 8, -1, tz // 8 - 1)
                hit = ok & (khi >= z0) & (klo < z0 + tz) & (c_hi >= c_lo)
                if hit.any():
                    keys = key[hit]
                    lo_c, hi_c = c_lo[hit], c_hi[hit]
                    # chunks reached by some column of each footprint: union of the columns' chunk ranges
                    reached = set()
                    for k_, a_, b_ in zip(keys.tolist(), lo_c.tolist(), hi_c.tolist(), strict=True):
                        for c in range(a_, b_ + 1):
                            reached.add((k_, c))
                    chunks[(fx, fy, tz)] += len(reached)
    scale = n / len(idx)
    print(f"R {r}, N {n}, sample {len(idx)}: in-cutoff pairs {pairs * scale:.3g}")
    print(
        "shape (FX x FY x TZ) | visits | chunk executions | pairs per visit | slots per pair (FX*FY*8 per chunk)"
    )
    for s in SHAPES:
        v, c = visits[s] * scale, chunks[s] * scale
        print(
            f"{s[0]:>2} x {s[1]:>2} x {s[2]:>2} | {v:.3g} | {c:.3g} | {pairs * scale / v:.0f} | {c * s[0] * s[1] * 8 / (pairs * scale):.2f}"
        )


if __name__ == "__main__":
    main()
