"""CPU estimate of the L2 time of the scatter kernel's atomics (round 11), from the cost of a request measured by
benchmarks/probe_atomics.cu on the H200 (results/fields_h200_round11_atomics_probe.json): a warp instruction's
16-byte atomics that fall on one 128-byte line cost ~0.6 + 0.37 k units of 1e-11 s for k atomics.

    python benchmarks/sim_atomic_requests.py [R] [N] [SAMPLE]

For a random sample of the synthetic object's scatter-class Gaussians (box <= 4096 voxels), the runs of four
z-voxels that hold an in-cutoff voxel (the atomics, as the scatter kernel skips all-zero runs; cutoff in float64)
and the 128-byte lines they fall on, under:

- ``column lanes``: the kernel today, a lane per column: every atomic its own request;
- ``column merged``: a column's runs in one instruction (the spread scatter): one request per line of a column
  (32 z-voxels of one column in the [R, R, R] layout);
- ``brick BX x BY x BZ``: the grid accumulated in 128-byte bricks of BX x BY columns by BZ z-voxels (z fastest, BZ
  a multiple of 4, so that a run is still 16 contiguous bytes) and transposed at the end, every brick's runs of the Gaussian in one
  request: one request per brick touched.

The lower bound of any grouping is 0.37 units per atomic. Counts are scaled to all scatter Gaussians.
"""

import sys

import numpy as np

from _common import synthetic_arrays, voxel_boxes  # benchmarks/ is on sys.path when run as a script

REQUEST, ATOMIC = 0.6e-11, 0.37e-11  # seconds per request and per 16-byte atomic in it (H200, round 11)
BRICKS = [(2, 2, 8), (1, 4, 8), (2, 4, 4)]


def main() -> None:
    r = int(sys.argv[1]) if len(sys.argv) > 1 else 128
    n = int(sys.argv[2]) if len(sys.argv) > 2 else 50_000
    sample = int(sys.argv[3]) if len(sys.argv) > 3 else 5000
    cfg, mu, rad, m = synthetic_arrays(r, n)
    h = 2.0 / (r - 1)
    lo, hi = voxel_boxes(mu, rad, r)
    scatter = np.flatnonzero(np.prod(hi - lo + 1, axis=1) <= 4096)
    rng = np.random.default_rng(0)
    picked = rng.choice(scatter, size=min(sample, len(scatter)), replace=False)
    scale = len(scatter) / len(picked)
    atomics = col_lines = 0
    bricks = {b: 0 for b in BRICKS}
    for g in picked:
        axes = [np.arange(lo[g, k], hi[g, k] + 1) for k in range(3)]
        d = np.stack(np.meshgrid(*[-1 + h * a - mu[g, k] for k, a in enumerate(axes)], indexing="ij"), -1)
        inside = (np.einsum("...ij,...j->...i", m[g], d) ** 2).sum(-1) <= cfg.cutoff_sq
        ii, jj, kk = np.nonzero(inside)
        i, j, k = axes[0][ii], axes[1][jj], axes[2][kk]
        runs = np.unique(np.stack([i, j, k // 4], 1), axis=0)
        atomics += len(runs)
        col_lines += len(np.unique(np.stack([runs[:, 0], runs[:, 1], runs[:, 2] // 8], 1), axis=0))
        for bx, by, bz in BRICKS:
            if bz < 4:  # a 16-byte run along z does not fit: runs go along y instead (4 y-voxels of one z)
                cells = np.unique(np.stack([i // bx, j // by, k // bz], 1), axis=0)
            else:
                cells = np.unique(
                    np.stack([runs[:, 0] // bx, runs[:, 1] // by, runs[:, 2] // (bz // 4)], 1), axis=0
                )
            bricks[(bx, by, bz)] += len(cells)
    a = atomics * scale
    print(
        f"R = {r}, N = {n}: {len(scatter)} scatter Gaussians, sample {len(picked)}; 16-byte atomics {a:.3g}"
    )
    rows = [("column lanes (today)", a), ("column merged (spread scatter)", col_lines * scale)]
    rows += [(f"brick {bx} x {by} x {bz}", c * scale) for (bx, by, bz), c in bricks.items()]
    for name, req in rows:
        print(f"  {name:32s} requests {req:10.3g}  L2 time {(REQUEST * req + ATOMIC * a) * 1e6:6.1f} us")
    print(f"  {'every atomic merged (bound)':32s} {'':19s}  L2 time {ATOMIC * a * 1e6:6.1f} us")


if __name__ == "__main__":
    main()
