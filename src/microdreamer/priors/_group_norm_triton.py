"""The Triton kernels of :func:`microdreamer.priors.group_norm.group_norm` (imported on first use:
importing Triton takes a while). See that module for what each computes."""

import triton
import triton.language as tl


@triton.jit
def _moments(x_ptr, part_ptr, L, C, rows_per_split, split, BLOCK_L: tl.constexpr, BLOCK_C: tl.constexpr):
    b = tl.program_id(0)
    s = tl.program_id(1)
    cols = tl.arange(0, BLOCK_C)
    cmask = cols < C
    base = x_ptr + b.to(tl.int64) * L * C
    shift = tl.load(base + cols, mask=cmask, other=0.0).to(tl.float32)  # position 0 of the sample
    acc1 = tl.zeros([BLOCK_C], dtype=tl.float32)
    acc2 = tl.zeros([BLOCK_C], dtype=tl.float32)
    start = s * rows_per_split
    for r0 in range(start, start + rows_per_split, BLOCK_L):
        rows = r0 + tl.arange(0, BLOCK_L)
        m = (rows[:, None] < L) & cmask[None, :]
        v = tl.load(base + rows[:, None].to(tl.int64) * C + cols[None, :], mask=m, other=0.0)
        d = tl.where(m, v.to(tl.float32) - shift[None, :], 0.0)
        acc1 += tl.sum(d, axis=0)
        acc2 += tl.sum(d * d, axis=0)
    out = part_ptr + (b * split + s).to(tl.int64) * 2 * C
    tl.store(out + cols, acc1, mask=cmask)
    tl.store(out + C + cols, acc2, mask=cmask)


@triton.jit
def _finalize(x_ptr, cb_ptr, part_ptr, stats_ptr, L, C, G, cpg, split, eps, HAS_CB: tl.constexpr,
              BLOCK_C: tl.constexpr):  # fmt: skip
    b = tl.program_id(0)
    cols = tl.arange(0, BLOCK_C)
    cmask = cols < C
    s1 = tl.zeros([BLOCK_C], dtype=tl.float32)
    s2 = tl.zeros([BLOCK_C], dtype=tl.float32)
    for s in range(0, split):
        p = part_ptr + (b * split + s).to(tl.int64) * 2 * C
        s1 += tl.load(p + cols, mask=cmask, other=0.0)
        s2 += tl.load(p + C + cols, mask=cmask, other=0.0)
    n = L.to(tl.float32)
    # the moments kernel's shift: x at position 0 (the channel bias cancels out of x + cb - shift)
    mean_c = tl.load(x_ptr + b.to(tl.int64) * L * C + cols, mask=cmask, other=0.0).to(tl.float32)
    if HAS_CB:
        mean_c += tl.load(cb_ptr + b * C + cols, mask=cmask, other=0.0).to(tl.float32)
    mean_c += s1 / n
    m2_c = tl.maximum(s2 - s1 * (s1 / n), 0.0)  # per channel: sum of squared deviations
    group = cols // cpg
    cnt = cpg.to(tl.float32)
    for g in range(0, G):
        in_g = cmask & (group == g)
        mean_g = tl.sum(tl.where(in_g, mean_c, 0.0), axis=0) / cnt
        dev = tl.where(in_g, mean_c - mean_g, 0.0)
        m2_g = tl.sum(tl.where(in_g, m2_c, 0.0), axis=0) + n * tl.sum(dev * dev, axis=0)  # Chan
        var = m2_g / (n * cnt)
        tl.store(stats_ptr + (b * 2) * G + g, mean_g)
        tl.store(stats_ptr + (b * 2 + 1) * G + g, 1.0 / tl.sqrt(var + eps))


@triton.jit
def _apply(x_ptr, cb_ptr, stats_ptr, w_ptr, bias_ptr, y_ptr, L, C, G, cpg, HAS_CB: tl.constexpr,
           HAS_W: tl.constexpr, HAS_B: tl.constexpr, SILU: tl.constexpr, BLOCK_L: tl.constexpr,
           BLOCK_C: tl.constexpr):  # fmt: skip
    b = tl.program_id(0)
    pid = tl.program_id(1)
    cols = tl.arange(0, BLOCK_C)
    cmask = cols < C
    group = cols // cpg
    mean = tl.load(stats_ptr + (b * 2) * G + group, mask=cmask, other=0.0)
    rstd = tl.load(stats_ptr + (b * 2 + 1) * G + group, mask=cmask, other=0.0)
    rows = pid * BLOCK_L + tl.arange(0, BLOCK_L)
    m = (rows[:, None] < L) & cmask[None, :]
    off = b.to(tl.int64) * L * C + rows[:, None].to(tl.int64) * C + cols[None, :]
    v = tl.load(x_ptr + off, mask=m, other=0.0).to(tl.float32)
    if HAS_CB:
        v += tl.load(cb_ptr + b * C + cols, mask=cmask, other=0.0).to(tl.float32)[None, :]
    scale = rstd
    if HAS_W:
        scale = scale * tl.load(w_ptr + cols, mask=cmask, other=1.0).to(tl.float32)
    shift = -mean * scale
    if HAS_B:
        shift += tl.load(bias_ptr + cols, mask=cmask, other=0.0).to(tl.float32)
    out = v * scale[None, :] + shift[None, :]
    if SILU:
        out = out / (1.0 + tl.exp(-out))
    tl.store(y_ptr + off, out.to(y_ptr.dtype.element_ty), mask=m)
