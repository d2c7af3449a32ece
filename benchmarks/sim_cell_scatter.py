"""CPU estimate for the cell scatter (scatter_cells): how many scattered Gaussians fit their cell's window, and
how many global atomics the window flush leaves against one per Gaussian and group of 4 voxels.

    python benchmarks/sim_cell_scatter.py R N CELL HALO     (e.g. 128 50000 8 6)
"""

import sys

import numpy as np

from microdreamer.field import FieldConfig, prepare_gaussians
from microdreamer.synthetic import make_synthetic_object

r = int(sys.argv[1])
n = int(sys.argv[2])
C = int(sys.argv[3])
H = int(sys.argv[4])
cfg = FieldConfig(resolution=r, mode="exact")
p, g = prepare_gaussians(make_synthetic_object(n, seed=0), cfg)
mu = p.means.double().numpy()
rad = p.radii.double().numpy()
h = 2 / (r - 1)
lo = np.clip(np.ceil((mu - rad + 1) / h - 1e-3), 0, r - 1).astype(int)
hi = np.clip(np.floor((mu + rad + 1) / h + 1e-3), 0, r - 1).astype(int)
sc = np.prod(hi - lo + 1, axis=1) <= 4096
lo, hi = lo[sc], hi[sc]
cell = ((lo + hi) // 2) // C
o = cell * C - H
o[:, 2] = cell[:, 2] * C - ((H + 3) // 4) * 4
W = C + 2 * H
WZ = C + 2 * ((H + 3) // 4) * 4
fit = np.all(lo >= o, 1) & np.all(hi[:, :2] < o[:, :2] + W, 1) & (hi[:, 2] < o[:, 2] + WZ)
print(f"window {W}x{W}x{WZ} = {W * W * WZ * 4 / 1024:.1f} KB; scatter {sc.sum()}, fit {fit.mean():.3f}")
key = cell[:, 0] * 10**6 + cell[:, 1] * 10**3 + cell[:, 2]
cells, inv, cnt = np.unique(key, return_inverse=True, return_counts=True)
print(f"occupied cells {len(cells)}, Gaussians per cell mean {cnt.mean():.1f} max {cnt.max()}")
# groups per cell touched by fitting Gaussians (union of boxes, z in groups of 4)
flush = 0
own = 0
for ci in range(len(cells)):
    idx = np.where((inv == ci) & fit)[0]
    if len(idx) == 0:
        continue
    oo = o[idx[0]]
    m = np.zeros((W, W, WZ // 4), bool)
    for k in idx:
        a = lo[k] - oo
        b = hi[k] - oo
        m[a[0] : b[0] + 1, a[1] : b[1] + 1, a[2] // 4 : b[2] // 4 + 1] = True
        own += (b[0] - a[0] + 1) * (b[1] - a[1] + 1) * (b[2] // 4 - a[2] // 4 + 1)
    flush += m.sum()
print(
    f"box groups of fitting Gaussians {own} -> flush groups (union per cell, upper bound) {flush}: {own / flush:.1f}x fewer"
)
slab = 5
ov = ((hi[:, 0] - o[:, 0]) // slab - (lo[:, 0] - o[:, 0]) // slab + 1)[fit]
print(f"x-slabs of {slab} per fitting Gaussian: mean {ov.mean():.2f}")
