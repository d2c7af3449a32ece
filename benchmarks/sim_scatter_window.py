"""CPU simulation for the windowed scatter kernel (scatter_batch): how many of the synthetic object's
scattered Gaussians fit, with their batch, in a 16^3 window placed at the batch's lowest corner.

    python benchmarks/sim_scatter_window.py [R]
"""

import sys

import numpy as np

from microdreamer.field import FieldConfig, prepare_gaussians
from microdreamer.synthetic import make_synthetic_object

r = int(sys.argv[1]) if len(sys.argv) > 1 else 128
cfg = FieldConfig(resolution=r, mode="exact")
p, g = prepare_gaussians(make_synthetic_object(50_000, seed=0), cfg)
mu = p.means.double().numpy()
rad = p.radii.double().numpy()
h = 2 / (r - 1)
lo = np.clip(np.ceil((mu - rad + 1) / h - 1e-3), 0, r - 1).astype(int)
hi = np.clip(np.floor((mu + rad + 1) / h + 1e-3), 0, r - 1).astype(int)
vol = np.prod(hi - lo + 1, axis=1)
sc = vol <= 4096
print("scatter frac", sc.mean(), "box ext mean", (hi - lo + 1)[sc].mean(0))
lo, hi = lo[sc], hi[sc]
for shift in (2, 3, 4):
    c = ((lo + hi) // 2) >> shift
    bits = 7
    m = np.zeros(len(c), dtype=np.int64)
    for b in range(bits):
        for k in range(3):
            m |= ((c[:, k] >> b) & 1) << (3 * b + k)
    order = np.argsort(m, kind="stable")
    for B in (16, 32):
        fit = 0
        groups = 0
        L, H = lo[order], hi[order]
        for s in range(0, len(L), B):
            l, hh = L[s : s + B], H[s : s + B]
            o = l.min(0)
            o[2] &= ~3
            f = np.all(hh - o < 16, axis=1)
            fit += f.sum()
            if f.any():
                e = (hh[f] - o).max(0) + 1
                groups += e[0] * e[1] * ((e[2] + 3) // 4)
        print(
            f"shift {shift} batch {B}: fit {fit / len(L):.3f}  groups/batch {groups / (len(L) / B):.0f} atomics-ish {groups}"
        )
