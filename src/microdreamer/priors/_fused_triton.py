"""The Triton kernels of :mod:`microdreamer.priors.fused` (imported on first use: importing Triton
takes a while). See that module for what each computes."""

import triton
import triton.language as tl


@triton.jit(do_not_specialize=["rows_per_split", "split"])
def _moments(x_ptr, part_ptr, L, C, rows_per_split, split, BLOCK_L: tl.constexpr, BLOCK_C: tl.constexpr):
    """Grid (B, split): per channel, the sums of x - x[position 0] and of its square over rows
    [s * rows_per_split, (s + 1) * rows_per_split) of sample b -> part [B, split, 2, C] float32."""
    b = tl.program_id(0)
    s = tl.program_id(1)
    cols = tl.arange(0, BLOCK_C)
    cmask = cols < C
    base = x_ptr + b.to(tl.int64) * L * C
    shift = tl.load(base + cols, mask=cmask, other=0.0).to(tl.float32)
    acc1 = tl.zeros([BLOCK_L, BLOCK_C], dtype=tl.float32)
    acc2 = tl.zeros([BLOCK_L, BLOCK_C], dtype=tl.float32)
    start = s * rows_per_split
    for r0 in range(start, start + rows_per_split, BLOCK_L):
        rows = r0 + tl.arange(0, BLOCK_L)
        m = (rows[:, None] < L) & cmask[None, :]
        v = tl.load(base + rows[:, None].to(tl.int64) * C + cols[None, :], mask=m, other=0.0)
        d = tl.where(m, v.to(tl.float32) - shift[None, :], 0.0)
        acc1 += d
        acc2 += d * d
    out = part_ptr + (b * split + s).to(tl.int64) * 2 * C
    tl.store(out + cols, tl.sum(acc1, axis=0), mask=cmask)
    tl.store(out + C + cols, tl.sum(acc2, axis=0), mask=cmask)


@triton.jit(do_not_specialize=["G", "cpg", "split", "has_cb"])
def _finalize(x_ptr, cb_ptr, part_ptr, stats_ptr, L, C, G, cpg, split, eps, has_cb, BLOCK_S: tl.constexpr,
              BLOCK_J: tl.constexpr):  # fmt: skip
    """Grid (B, G): group g's mean and 1 / sqrt(var + eps) -> stats [B, 2, G] float32, from the
    channels' partial sums (Chan's combination of per-channel means and squared deviations)."""
    b = tl.program_id(0)
    g = tl.program_id(1)
    j = tl.arange(0, BLOCK_J)
    jmask = j < cpg
    c = g * cpg + j
    s1 = tl.zeros([BLOCK_S, BLOCK_J], dtype=tl.float32)
    s2 = tl.zeros([BLOCK_S, BLOCK_J], dtype=tl.float32)
    for s0 in range(0, split, BLOCK_S):
        srow = s0 + tl.arange(0, BLOCK_S)
        m = (srow[:, None] < split) & jmask[None, :]
        p = part_ptr + (b * split + srow[:, None]).to(tl.int64) * 2 * C + c[None, :]
        s1 += tl.load(p, mask=m, other=0.0)
        s2 += tl.load(p + C, mask=m, other=0.0)
    t1 = tl.sum(s1, axis=0)
    t2 = tl.sum(s2, axis=0)
    n = L * 1.0
    # the moments kernel's shift: x at position 0 (the channel bias cancels out of x + cb - shift)
    mean_c = tl.load(x_ptr + b.to(tl.int64) * L * C + c, mask=jmask, other=0.0).to(tl.float32)
    if has_cb:
        mean_c += tl.load(cb_ptr + b * C + c, mask=jmask, other=0.0).to(tl.float32)
    mean_c += t1 / n
    m2_c = tl.maximum(t2 - t1 * (t1 / n), 0.0)  # per channel: sum of squared deviations
    cnt = cpg * 1.0
    mean_g = tl.sum(tl.where(jmask, mean_c, 0.0), axis=0) / cnt
    dev = tl.where(jmask, mean_c - mean_g, 0.0)
    m2_g = tl.sum(tl.where(jmask, m2_c, 0.0), axis=0) + n * tl.sum(dev * dev, axis=0)
    var = m2_g / (n * cnt)
    tl.store(stats_ptr + (b * 2) * G + g, mean_g)
    tl.store(stats_ptr + (b * 2 + 1) * G + g, 1.0 / tl.sqrt(var + eps))


@triton.jit(do_not_specialize=["G", "cpg", "has_cb", "has_w", "has_b", "silu"])
def _apply(x_ptr, cb_ptr, stats_ptr, w_ptr, bias_ptr, y_ptr, L, C, G, cpg, has_cb, has_w, has_b, silu,
           BLOCK_L: tl.constexpr, BLOCK_C: tl.constexpr):  # fmt: skip
    """Grid (B, cdiv(L, BLOCK_L)): y = act((x + cb - mean_g) * rstd_g * w + bias)."""
    b = tl.program_id(0)
    pid = tl.program_id(1)
    cols = tl.arange(0, BLOCK_C)
    cmask = cols < C
    group = cols // cpg
    mean = tl.load(stats_ptr + (b * 2) * G + group, mask=cmask, other=0.0)
    rstd = tl.load(stats_ptr + (b * 2 + 1) * G + group, mask=cmask, other=0.0)
    # the flags are runtime values (one compiled kernel per block shape, not per combination)
    # (flag 0: cols < 0 masks every load off)
    scale = rstd * tl.load(w_ptr + cols, mask=cols < C * has_w, other=1.0).to(tl.float32)
    cbias = tl.load(cb_ptr + b * C + cols, mask=cols < C * has_cb, other=0.0).to(tl.float32)
    beta = tl.load(bias_ptr + cols, mask=cols < C * has_b, other=0.0).to(tl.float32)
    shift = (cbias - mean) * scale + beta
    rows = pid * BLOCK_L + tl.arange(0, BLOCK_L)
    m = (rows[:, None] < L) & cmask[None, :]
    off = b.to(tl.int64) * L * C + rows[:, None].to(tl.int64) * C + cols[None, :]
    v = tl.load(x_ptr + off, mask=m, other=0.0).to(tl.float32)
    out = v * scale[None, :] + shift[None, :]
    if silu != 0:
        out = out / (1.0 + tl.exp(-out))
    tl.store(y_ptr + off, out.to(y_ptr.dtype.element_ty), mask=m)


@triton.jit
def _geglu(h_ptr, y_ptr, total, D, BLOCK: tl.constexpr):
    """Grid (cdiv(M * D, BLOCK),): y[m, d] = h[m, d] * gelu(h[m, D + d]) for rows h [M, 2D] (exact,
    erf GELU, in float32)."""
    idx = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = idx < total
    row = idx // D
    col = idx - row * D
    a = tl.load(h_ptr + row * 2 * D + col, mask=mask, other=0.0).to(tl.float32)
    g = tl.load(h_ptr + row * 2 * D + D + col, mask=mask, other=0.0).to(tl.float32)
    out = a * (0.5 * g * (1.0 + tl.math.erf(g * 0.7071067811865476)))
    tl.store(y_ptr + idx, out.to(y_ptr.dtype.element_ty), mask=mask)
