// Density-field kernels: per-Gaussian setup, tile binning, the tiled "fast" kernel and the
// one-thread-per-voxel "naive" baseline. Semantics: microdreamer/field/common.py (the float64
// reference in field/reference.py defines them); launchers are declared in fields.h.
//
// Every implementation here evaluates q = |M (x - mu)|^2 in the column form
//     q = A (z - zc)^2 + Q2(dx, dy),   Q2 = (l11 dx + l12 dy)^2 + (l22 dy)^2,   zc = mu_z + g1 dx + g2 dy
// (dx = x - mu_x, dy = y - mu_y; A, l.., g.. from M in float64 by the setup kernel): a sum of squares
// whose float32 rounding stays relative as long as the Gaussian is not too thin against its own box
// (the class test below); thinner Gaussians take a float64 path ("precise").
#include <algorithm>
#include <cstdint>

#include <cuda_runtime.h>

#include "fields.h"

namespace microdreamer {
namespace {

constexpr float kK = 0.72134752044448170f;  // 0.5 * log2(e): o exp(-q / 2) = 2^(log2 o - K q)
constexpr double kKd = 0.72134752044448170;
constexpr unsigned kFull = 0xffffffffu;
constexpr int kTileXY = 16;  // fast kernel: 16 x 16 columns per block, 8 warps of 8 x 4 columns
// v2 register caps: resident 256-thread blocks per SM (65536 / (256 * MINB) registers per thread)
#ifndef MD_MINB1
#define MD_MINB1 4
#endif
#ifndef MD_MINB2
#define MD_MINB2 4
#endif
#ifndef MD_MINB4
#define MD_MINB4 3
#endif
constexpr int kMinBlocks1 = MD_MINB1, kMinBlocks2 = MD_MINB2, kMinBlocks4 = MD_MINB4;

__device__ __forceinline__ float ex2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

// ---------------------------------------------------------------------------------------------
// setup: one thread per Gaussian; binning (tile counts and lists) shared by the warp for wide boxes
// ---------------------------------------------------------------------------------------------

__device__ void upstream_range(double mu, const double* lower, const double* upper, int nb, int t, int r,
                               int* lo, int* hi) {
  // first b with upper[b] > mu, last b with lower[b] < mu (both arrays ascending)
  int a = 0, b = nb;
  while (a < b) {
    const int m = (a + b) >> 1;
    if (upper[m] > mu) b = m; else a = m + 1;
  }
  const int first = a;
  a = 0; b = nb;
  while (a < b) {
    const int m = (a + b) >> 1;
    if (lower[m] < mu) a = m + 1; else b = m;
  }
  const int last = a - 1;
  if (first > last) {
    *lo = 1; *hi = 0;
    return;
  }
  *lo = first * t;
  *hi = min(last * t + t - 1, r - 1);
}

__device__ void exact_range(double mu, double rad, double h, int r, int* lo, int* hi) {
  // voxels whose coordinate -1 + k h can lie within [mu - rad, mu + rad]; 1e-3 voxel of slack covers
  // the float32 rounding of the grid table
  double flo = (mu - rad + 1.0) / h - 1e-3;
  double fhi = (mu + rad + 1.0) / h + 1e-3;
  if (!(flo <= fhi) || fhi < 0.0 || flo > r - 1.0) {  // also catches NaN
    *lo = 1; *hi = 0;
    return;
  }
  flo = fmax(flo, 0.0);
  fhi = fmin(fhi, r - 1.0);
  *lo = static_cast<int>(ceil(flo));
  *hi = static_cast<int>(floor(fhi));
}

// Tile box of a voxel box: the tiles [tx0, tx0 + nx) x [ty0, ty0 + ny) x [tz0, tz0 + nz) (nx = 0: none).
struct TileBox {
  int tx0, ty0, tz0, nx, ny, nz;
};

__device__ __forceinline__ TileBox tile_box(const int (&lo)[3], const int (&hi)[3], int tile_x, int tile_y,
                                            int tile_z, int tz_begin, int tz_end) {
  TileBox b;
  b.tx0 = lo[0] / tile_x;
  b.ty0 = lo[1] / tile_y;
  b.tz0 = max(lo[2] / tile_z, tz_begin);
  b.nx = hi[0] / tile_x - b.tx0 + 1;
  b.ny = hi[1] / tile_y - b.ty0 + 1;
  b.nz = min(hi[2] / tile_z, tz_end - 1) - b.tz0 + 1;
  if (b.nz <= 0) b.nx = b.ny = b.nz = 0;
  return b;
}

// Tile box of Gaussian g from its packed parameters, z-slabs [tz_begin, tz_end) only (nx = 0 when it is not in
// the tile lists).
__device__ __forceinline__ TileBox params_tile_box(const FillArgs& a, int64_t g, int tz_begin, int tz_end) {
  const int4* pv = reinterpret_cast<const int4*>(a.params + g * kParamWords);
  const int4 p3 = pv[3], p4 = pv[4];
  if (p3.x >= kEmpty) return TileBox{0, 0, 0, 0, 0, 0};  // empty, or added by a scatter kernel
  const int lo[3] = {p3.y, p3.w, p4.y}, hi[3] = {p3.z, p4.x, p4.z};
  return tile_box(lo, hi, a.tile_x, a.tile_y, a.tile_z, tz_begin, tz_end);
}

// Boxes of more tiles than this are binned by the whole warp (see warp_tiles)
constexpr int kCoopTiles = 16;
// Boxes of more tiles than this go to the wide-box list: one work item per kWideTiles tiles (item = g *
// kMaxWideChunks + chunk; a box holds < 2^26 tiles at R <= 4096), flagged in the parameters' word 19
constexpr int kWideTiles = 128;
constexpr int64_t kMaxWideChunks = int64_t(1) << 20;
constexpr int kWideFlag = static_cast<int>(0x80000000u);

// Calls op.claim(t) for every tile t of each lane's box, then op.write(claimed, g) for it: boxes of at most
// kCoopTiles tiles by their own lane, larger ones by all 32 lanes together (four tiles per lane at a time,
// their claims issued before their writes). One wide Gaussian used to hold its thread for thousands of
// dependent atomics (supersplat_fruit at 512^3: one box of 14400 tiles, a 4.4 ms fill kernel) while the
// rest of the grid had finished; boxes of more than kWideTiles tiles normally come through the wide-box list
// instead (wide_items). Every lane of the warp must call this (boxes may be empty: nx = 0).
template <typename Op>
__device__ __forceinline__ void warp_tiles(const TileBox& b, int64_t g, int nty, int ntx, Op& op) {
  const int lane = threadIdx.x & 31;
  const int nt = b.nx * b.ny * b.nz;
  if (nt <= kCoopTiles) {
    for (int tz = b.tz0; tz < b.tz0 + b.nz; ++tz)
      for (int ty = b.ty0; ty < b.ty0 + b.ny; ++ty)
        for (int tx = b.tx0; tx < b.tx0 + b.nx; ++tx) {
          const int64_t t = (static_cast<int64_t>(tz) * nty + ty) * ntx + tx;
          op.write(op.claim(t), t, g);
        }
  }
  unsigned big = __ballot_sync(kFull, nt > kCoopTiles);
  while (big) {
    const int src = __ffs(big) - 1;
    big &= big - 1;
    const int tx0 = __shfl_sync(kFull, b.tx0, src), ty0 = __shfl_sync(kFull, b.ty0, src);
    const int tz0 = __shfl_sync(kFull, b.tz0, src), nx = __shfl_sync(kFull, b.nx, src);
    const int ny = __shfl_sync(kFull, b.ny, src), n = __shfl_sync(kFull, nt, src);
    const int64_t gs = __shfl_sync(kFull, g, src);
    for (int f0 = lane; f0 < n; f0 += 128) {
      int64_t t[4];
      int claimed[4];
#pragma unroll
      for (int u = 0; u < 4; ++u) {
        const int f = f0 + 32 * u;
        t[u] = -1;
        if (f < n) {
          const int rest = f / nx;
          t[u] = (static_cast<int64_t>(tz0 + rest / ny) * nty + ty0 + rest % ny) * ntx + tx0 + f % nx;
          claimed[u] = op.claim(t[u]);
        }
      }
#pragma unroll
      for (int u = 0; u < 4; ++u)
        if (t[u] >= 0) op.write(claimed[u], t[u], gs);
    }
  }
}

// setup's count: one more entry for each tile
struct CountOp {
  int* counts;
  __device__ int claim(int64_t t) const {
    atomicAdd(counts + t, 1);
    return 0;
  }
  __device__ void write(int, int64_t, int64_t) const {}
};

// fill: an entry of the tile's list (the tile's cursor counts down to its first entry)
struct FillOp {
  int* cursor;
  const int64_t* tile_end;
  int* list;
  int64_t base;      // list position of this launch's first entry (variant 1's z-slab chunks)
  int64_t capacity;  // variant 2: tiles whose entries end past it are not listed (they scan every Gaussian)
  __device__ int claim(int64_t t) const {
    if (tile_end[t] > capacity) return 0;
    return atomicSub(cursor + t, 1);
  }
  __device__ void write(int old, int64_t t, int64_t g) const {
    const int64_t e = tile_end[t];
    if (e > capacity) return;
    list[e - old - base] = static_cast<int>(g);
  }
};

// Warp-collective (every lane calls it): appends this lane's k items g * stride + q (q < k) to a list of
// `capacity` items, one atomic per warp. Returns whether they all fit; the slots of a lane whose items do not
// all fit are marked -1 (its Gaussian then takes the path it would take without the list).
__device__ bool append_items(int k, int64_t g, int64_t stride, unsigned long long* count, int64_t* items,
                             int64_t capacity) {
  const int lane = threadIdx.x & 31;
  int incl = k;
#pragma unroll
  for (int off = 1; off < 32; off <<= 1) {
    const int v = __shfl_up_sync(kFull, incl, off);
    if (lane >= off) incl += v;
  }
  const int total = __shfl_sync(kFull, incl, 31);
  if (total == 0) return false;
  unsigned long long wbase = 0;
  if (lane == 31) wbase = atomicAdd(count, static_cast<unsigned long long>(total));
  const int64_t first = static_cast<int64_t>(__shfl_sync(kFull, wbase, 31)) + (incl - k);
  if (k == 0) return false;
  if (first + k <= capacity) {
    for (int q = 0; q < k; ++q) items[first + q] = g * stride + q;
    return true;
  }
  for (int64_t e = first; e < min(first + k, capacity); ++e) items[e] = -1;
  return false;
}

// Tile f (0 <= f < nx ny nz, x fastest) of a tile box: its tile index, and its tz in *tz.
__device__ __forceinline__ int64_t box_tile(const TileBox& b, int f, int nty, int ntx, int* tz) {
  const int rest = f / b.nx;
  *tz = b.tz0 + rest / b.ny;
  return (static_cast<int64_t>(*tz) * nty + b.ty0 + rest % b.ny) * ntx + b.tx0 + f % b.nx;
}

// Setup of one Gaussian: the class, voxel box and packed parameters; params/precise are written by the caller
// once the class is final.
struct Setup {
  int cls;
  int lo[3], hi[3];
  float4 p[5];
  double d[7];
};

__device__ Setup setup_one(const SetupArgs& a, int64_t g) {
  Setup s;
  double mu[3], rad[3], m[9];
  for (int k = 0; k < 3; ++k) {
    mu[k] = a.means[g * 3 + k];
    rad[k] = a.radii[g * 3 + k];
  }
  for (int k = 0; k < 9; ++k) m[k] = a.transforms[g * 9 + k];
  const double o = a.opacities[g];
  bool empty = false;
  for (int k = 0; k < 3; ++k) {
    if (a.exact) exact_range(mu[k], rad[k], a.h, a.resolution, &s.lo[k], &s.hi[k]);
    else upstream_range(mu[k], a.lower, a.upper, a.num_blocks_axis, a.block_voxels, a.resolution, &s.lo[k], &s.hi[k]);
    empty = empty || s.lo[k] > s.hi[k];
  }
  // columns of M: u = m1 dx + m2 dy + m3 dz
  const double m1[3] = {m[0], m[3], m[6]}, m2[3] = {m[1], m[4], m[7]}, m3[3] = {m[2], m[5], m[8]};
  const double A = m3[0] * m3[0] + m3[1] * m3[1] + m3[2] * m3[2];
  const double g1 = -(m3[0] * m1[0] + m3[1] * m1[1] + m3[2] * m1[2]) / A;
  const double g2 = -(m3[0] * m2[0] + m3[1] * m2[1] + m3[2] * m2[2]) / A;
  double va[3], vb[3];
  for (int k = 0; k < 3; ++k) {
    va[k] = m1[k] + g1 * m3[k];  // parts of m1, m2 orthogonal to m3
    vb[k] = m2[k] + g2 * m3[k];
  }
  const double l11 = sqrt(va[0] * va[0] + va[1] * va[1] + va[2] * va[2]);
  const double ab = va[0] * vb[0] + va[1] * vb[1] + va[2] * vb[2];
  const double l12 = l11 > 0.0 ? ab / l11 : 0.0;
  const double f = l11 > 0.0 ? ab / (l11 * l11) : 0.0;
  double l22 = 0.0;
  for (int k = 0; k < 3; ++k) {
    const double w = vb[k] - f * va[k];
    l22 += w * w;
  }
  l22 = sqrt(l22);
  const double log2o = log2(o);
  const bool finite = isfinite(A) && A > 0.0 && isfinite(g1) && isfinite(g2) && isfinite(l11) &&
                      isfinite(l12) && isfinite(l22);
  empty = empty || !finite;
  // float32 conditioning: the absolute rounding of u1, of zc and of z - mu_z over the cutoff box,
  // in units of the Gaussian's own spread (an isotropic Gaussian scores c)
  const double c = sqrt(a.cutoff_sq);
  const double sa = sqrt(A);
  const double b1 = fabs(l11) * rad[0] + fabs(l12) * rad[1];
  const double bm = (fabs(g1) * rad[0] + fabs(g2) * rad[1]) * sa;
  const double bz = rad[2] * sa;
  const bool well = b1 <= 8.0 * c && bm <= 8.0 * c && bz <= 8.0 * c && A < 1e30 && l11 < 1e15 && l22 < 1e15;
  // the z recurrence needs sigma_{z|xy} >= 2 voxels (A h^2 <= 1/4): see benchmarks/README.md
  int cls = empty ? kEmpty : (!well ? kPrecise : ((a.exact && A * a.h * a.h <= 0.25) ? kRecur : kDirect));
  if (a.exact && a.scatter_max_voxels > 0 && (cls == kRecur || cls == kDirect)) {
    const int64_t vol = static_cast<int64_t>(s.hi[0] - s.lo[0] + 1) * (s.hi[1] - s.lo[1] + 1) * (s.hi[2] - s.lo[2] + 1);
    if (vol <= a.scatter_max_voxels) cls = kScatter;
  }
  // thin Gaussians go to the float64 scatter kernel (if their work items fit its list: setup_kernel)
  if (a.exact && a.scatter_precise && cls == kPrecise) cls = kPreciseScatter;
  if (cls == kEmpty) {
    for (int k = 0; k < 3; ++k) { s.lo[k] = 1; s.hi[k] = 0; }
  }
  s.cls = cls;
  s.p[0] = make_float4(static_cast<float>(mu[0]), static_cast<float>(mu[1]), static_cast<float>(mu[2]),
                       static_cast<float>(l11));
  s.p[1] = make_float4(static_cast<float>(l12), static_cast<float>(l22), static_cast<float>(g1), static_cast<float>(g2));
  s.p[2] = make_float4(static_cast<float>(A), static_cast<float>(log2o),
                       static_cast<float>(exp2(-2.0 * kKd * A * a.h * a.h)), static_cast<float>(o * a.cutoff_tol));
  s.p[4] = make_float4(__int_as_float(s.hi[1]), __int_as_float(s.lo[2]), __int_as_float(s.hi[2]), 0.f);
  const double dd[7] = {l11, l12, l22, g1, g2, A, log2o};
  for (int k = 0; k < 7; ++k) s.d[k] = dd[k];
  return s;
}

// One thread per Gaussian, the warps' 32 Gaussians side by side (every lane runs every iteration, so that the
// warp can share work): class, box and parameters, the float64 scatter's work items (Gaussian, slice of
// kPreciseSliceColumns columns) appended to its list, and the tile counts.
__global__ void setup_kernel(const SetupArgs a) {
  const int lane = threadIdx.x & 31;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t g0 = blockIdx.x * static_cast<int64_t>(blockDim.x) + (threadIdx.x & ~31); g0 < a.n; g0 += stride) {
    const int64_t g = g0 + lane;
    const bool valid = g < a.n;
    Setup s;
    if (valid) s = setup_one(a, g);
    else s.cls = kEmpty;
    // kPreciseScatter: ceil(columns / slice) work items for the float64 scatter; a Gaussian whose items do not
    // fit its list stays in the tile lists (kPrecise)
    int k = 0;
    if (s.cls == kPreciseScatter) {
      const int64_t cols = static_cast<int64_t>(s.hi[0] - s.lo[0] + 1) * (s.hi[1] - s.lo[1] + 1);
      k = static_cast<int>((cols + kPreciseSliceColumns - 1) / kPreciseSliceColumns);
    }
    if (a.precise_items != nullptr &&
        !append_items(k, g, kMaxPreciseSlices, a.precise_count, a.precise_items, a.precise_capacity) && k > 0)
      s.cls = kPrecise;
    // binning: boxes of more than kWideTiles tiles go to the wide-box list (one item per kWideTiles tiles,
    // counted by count_wide_kernel and listed by the fill kernels), so that they are spread over the whole GPU
    TileBox b{0, 0, 0, 0, 0, 0};
    if (a.tile_counts != nullptr && valid && s.cls < kEmpty)
      b = tile_box(s.lo, s.hi, a.tile_x, a.tile_y, a.tile_z, 0, a.ntz);
    const int nt = b.nx * b.ny * b.nz;
    const int kw = nt > kWideTiles ? (nt + kWideTiles - 1) / kWideTiles : 0;
    bool wide = false;
    if (a.wide_items != nullptr)
      wide = append_items(kw, g, kMaxWideChunks, a.wide_count, a.wide_items, a.wide_capacity) && kw > 0;
    if (valid) {
      // five 16-byte stores (the layout of fields.h); the float64 table only where a kernel reads it
      s.p[3] = make_float4(__int_as_float(s.cls), __int_as_float(s.lo[0]), __int_as_float(s.hi[0]),
                           __int_as_float(s.lo[1]));
      s.p[4].w = __int_as_float(static_cast<int>(g) | (wide ? kWideFlag : 0));
      float4* p = reinterpret_cast<float4*>(a.params + g * kParamWords);
#pragma unroll
      for (int q = 0; q < 5; ++q) p[q] = s.p[q];
      if (s.cls == kPrecise || s.cls == kPreciseScatter) {
        double2* d = reinterpret_cast<double2*>(a.precise + g * kPreciseWords);
        d[0] = make_double2(s.d[0], s.d[1]);
        d[1] = make_double2(s.d[2], s.d[3]);
        d[2] = make_double2(s.d[4], s.d[5]);
        d[3] = make_double2(s.d[6], 0.0);
      }
    }
    if (a.tile_counts != nullptr) {
      if (wide) b.nx = b.ny = b.nz = 0;  // counted by count_wide_kernel
      CountOp op{a.tile_counts};
      warp_tiles(b, g, a.nty, a.ntx, op);
    }
  }
}

// Inclusive prefix sum of v over a block of 1024 threads (thread order); *total: the block's sum. Warp
// shuffles, then the 32 warp sums in s_warp (starts with a barrier, so s_warp can be reused call after call).
__device__ __forceinline__ int64_t block_inclusive_sum(int64_t v, int64_t* s_warp, int64_t* total) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
#pragma unroll
  for (int off = 1; off < 32; off <<= 1) {
    const int64_t u = __shfl_up_sync(kFull, v, off);
    if (lane >= off) v += u;
  }
  __syncthreads();  // the previous call's readers are done with s_warp
  if (lane == 31) s_warp[warp] = v;
  __syncthreads();
  if (warp == 0) {
    int64_t w = s_warp[lane];
#pragma unroll
    for (int off = 1; off < 32; off <<= 1) {
      const int64_t u = __shfl_up_sync(kFull, w, off);
      if (lane >= off) w += u;
    }
    s_warp[lane] = w;
  }
  __syncthreads();
  *total = s_warp[31];
  return warp == 0 ? v : v + s_warp[warp - 1];
}

// Entries per slice when variant 2 with splits cuts a list of len entries: at most `splits` slices of at least
// split_min entries (the scan kernel's plan and fast_kernel_v2 cut the same way).
template <typename T>
__device__ __forceinline__ T slice_length(T len, T splits, T split_min) {
  return max(split_min, (len + splits - 1) / splits);
}

// Slices of a tile's list in variant 2 with splits: 0 when empty. The divisions in 32 bits when the list fits (a
// 64-bit division is a long software sequence, and the scan kernel runs on one SM).
__device__ __forceinline__ int64_t tile_slices(int64_t start, int64_t end, const SplitPlan& p) {
  const int64_t len = end > p.capacity ? p.n : end - start;
  if (len <= 0) return 0;
  if (len < (int64_t(1) << 31) && p.split_min < (int64_t(1) << 31)) {
    const unsigned l = static_cast<unsigned>(len);
    const unsigned per = slice_length<unsigned>(l, static_cast<unsigned>(p.splits), static_cast<unsigned>(p.split_min));
    return (l + per - 1) / per;
  }
  const int64_t per = slice_length<int64_t>(len, p.splits, p.split_min);
  return (len + per - 1) / per;
}

// Inclusive prefix sums of m int counts into out, one block of 1024 threads walking the counts 1024 at a time
// (coalesced loads and stores, the next chunk's load issued before this chunk's scan). With a plan
// (plan.work != nullptr), the same walk lists the (tile, slice) work items of variant 2's split kernel over the
// first plan.tiles counts, in tile order, and zeroes the kernel's work counter. (Before, each thread took a
// contiguous segment of m / 1024 counts and then re-read the sums it had written, with 64-bit divisions:
// 56-180 us at 512^3, where m = 16384.)
__global__ void __launch_bounds__(1024) scan_kernel(const int* counts, int64_t* out, int64_t m, const SplitPlan plan) {
  __shared__ int64_t s_warp[32];
  int64_t carry = 0, items = 0;
  int64_t i = threadIdx.x;
  int next = i < m ? counts[i] : 0;
  for (int64_t base = 0; base < m; base += 1024, i += 1024) {
    const int v = next;
    next = i + 1024 < m ? counts[i + 1024] : 0;
    int64_t total;
    const int64_t end = carry + block_inclusive_sum(v, s_warp, &total);
    carry += total;
    if (i < m) out[i] = end;
    if (plan.work == nullptr) continue;
    const int64_t k = i < plan.tiles ? tile_slices(end - v, end, plan) : 0;
    int64_t k_total;
    const int64_t w = items + block_inclusive_sum(k, s_warp, &k_total) - k;
    items += k_total;
    for (int64_t q = 0; q < k; ++q) plan.work[w + q] = static_cast<int>(i * kMaxSplits + q);
  }
  if (plan.work != nullptr && threadIdx.x == 0) {
    plan.counters[0] = static_cast<int>(items);  // work items
    plan.counters[1] = 0;                        // next item to take
  }
}

// The wide-box list's items, one warp per item of kWideTiles tiles (the item's tiles are numbered over the
// whole box; those outside the launch's z-slabs [tz_begin, tz_end) are skipped), four op.claim() per lane
// issued before their op.write(): counted (CountOp) or listed (FillOp).
template <typename Op>
__device__ __forceinline__ void wide_items(const FillArgs& a, const Op& op) {
  const int lane = threadIdx.x & 31;
  const int64_t warps = (static_cast<int64_t>(gridDim.x) * blockDim.x) >> 5;
  const int64_t items = min(static_cast<int64_t>(*a.wide_count), a.wide_capacity);
  for (int64_t w = (blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x) >> 5; w < items; w += warps) {
    const int64_t item = a.wide_items[w];
    if (item < 0) continue;
    const int64_t g = item / kMaxWideChunks;
    const int f0 = static_cast<int>(item % kMaxWideChunks) * kWideTiles;
    const TileBox b = params_tile_box(a, g, 0, a.ntz);
    const int end = min(b.nx * b.ny * b.nz, f0 + kWideTiles);
    int64_t t[kWideTiles / 32];
    int claimed[kWideTiles / 32];
#pragma unroll
    for (int u = 0; u < kWideTiles / 32; ++u) {
      const int f = f0 + lane + 32 * u;
      t[u] = -1;
      if (f < end) {
        int tz;
        const int64_t tile = box_tile(b, f, a.nty, a.ntx, &tz);
        if (tz >= a.tz_begin && tz < a.tz_end) {
          t[u] = tile;
          claimed[u] = op.claim(tile);
        }
      }
    }
#pragma unroll
    for (int u = 0; u < kWideTiles / 32; ++u)
      if (t[u] >= 0) op.write(claimed[u], t[u], g);
  }
}

// Counts the wide-box list's tiles (after setup_kernel, before the scan); a.tile_cursor is the tile counts here.
__global__ void __launch_bounds__(256) count_wide_kernel(const FillArgs a) {
  const CountOp op{a.tile_cursor};
  wide_items(a, op);
}

// The fill kernels' pass over the Gaussians: each lane's tile box (clipped to z-slabs [tz_begin, tz_end)), none
// for Gaussians outside the lists or in the wide-box list.
__device__ __forceinline__ void fill_gaussians(const FillArgs& a, const FillOp& op) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t g0 = blockIdx.x * static_cast<int64_t>(blockDim.x) + (threadIdx.x & ~31); g0 < a.n; g0 += stride) {
    const int64_t g = g0 + (threadIdx.x & 31);
    TileBox b{0, 0, 0, 0, 0, 0};
    if (g < a.n && !(__float_as_int(a.params[g * kParamWords + 19]) & kWideFlag))
      b = params_tile_box(a, g, a.tz_begin, a.tz_end);
    warp_tiles(b, g, a.nty, a.ntx, op);
  }
}

// v1: the tiles of z-slabs [tz_begin, tz_end), whose entries start at list position base.
__global__ void fill_kernel(const FillArgs a) {
  const FillOp op{a.tile_cursor, a.tile_end, a.list, a.base, INT64_MAX};
  fill_gaussians(a, op);
  wide_items(a, op);
}

// v2: one list for every tile, of fixed capacity (no host read of the sizes); entries past the
// capacity are dropped and their tiles scan every Gaussian instead (fast_kernel_v2)
__global__ void fill_bounded_kernel(const FillArgs a, int64_t capacity) {
  const FillOp op{a.tile_cursor, a.tile_end, a.list, 0, capacity};
  fill_gaussians(a, op);
  wide_items(a, op);
}

// ---------------------------------------------------------------------------------------------
// fast kernel: one block per 16 x 16 x (8 * NCH) tile, one thread per column of the tile holding
// 8 * NCH accumulators in registers; warps own 8 x 4 column footprints
// ---------------------------------------------------------------------------------------------

// Q2 = (l11 x + l12 y)^2 + (l22 y)^2 in float32
__device__ __forceinline__ float q2_at(float l11, float l12, float l22, float x, float y) {
  const float u1 = fmaf(l11, x, l12 * y), u2 = l22 * y;
  return fmaf(u1, u1, u2 * u2);
}

// Can Gaussian s touch the warp footprint [fi0, fi0 + 8) x [fj0, fj0 + 4) x [k0, k0 + TZ)?
// Conservative: its voxel box, then (exact mode) the minimum of Q2 over the footprint's xy rectangle.
template <bool EXACT, int TZ>
__device__ __forceinline__ bool cull(const float4* s, int fi0, int fj0, int k0, float fx0, float fx1, float fy0,
                                     float fy1, float cutoff_sq) {
  const float4 p3 = s[3], p4 = s[4];
  const int cls = __float_as_int(p3.x);
  const int lox = __float_as_int(p3.y), hix = __float_as_int(p3.z), loy = __float_as_int(p3.w);
  const int hiy = __float_as_int(p4.x), loz = __float_as_int(p4.y), hiz = __float_as_int(p4.z);
  if (cls >= kEmpty) return false;  // empty, or added by scatter_kernel
  if (hix < fi0 || lox > fi0 + 7 || hiy < fj0 || loy > fj0 + 3 || hiz < k0 || loz > k0 + TZ - 1) return false;
  if (!EXACT || cls == kPrecise) return true;
  const float4 p0 = s[0], p1 = s[1];
  const float l11 = p0.w, l12 = p1.x, l22 = p1.y;
  const float x0 = fx0 - p0.x, x1 = fx1 - p0.x, y0 = fy0 - p0.y, y1 = fy1 - p0.y;
  if (x0 <= 0.f && x1 >= 0.f && y0 <= 0.f && y1 >= 0.f) return true;
  const float s11 = l11 * l11, s12 = l11 * l12, s22 = fmaf(l12, l12, l22 * l22);
  float best = INFINITY;
#pragma unroll
  for (int e = 0; e < 2; ++e) {
    const float x = e ? x1 : x0;
    const float y = fminf(fmaxf(-s12 * x / s22, y0), y1);
    best = fminf(best, q2_at(l11, l12, l22, x, y));
  }
#pragma unroll
  for (int e = 0; e < 2; ++e) {
    const float y = e ? y1 : y0;
    const float x = fminf(fmaxf(-s12 * y / s11, x0), x1);
    best = fminf(best, q2_at(l11, l12, l22, x, y));
  }
  return best <= cutoff_sq * 1.001f + 1e-3f;
}

template <int NCH, bool EXACT>
__device__ __forceinline__ void process_precise(const float4* s, const FastArgs& a, int i, int j, int k0, float xi,
                                                float yj, const float* zk, float (&acc)[8 * NCH]) {
  const float4 p0 = s[0], p3 = s[3], p4 = s[4];
  const int lox = __float_as_int(p3.y), hix = __float_as_int(p3.z), loy = __float_as_int(p3.w);
  const int hiy = __float_as_int(p4.x), loz = __float_as_int(p4.y), hiz = __float_as_int(p4.z);
  const double* d = a.precise + static_cast<int64_t>(__float_as_int(p4.w) & ~kWideFlag) * kPreciseWords;
  const double l11 = d[0], l12 = d[1], l22 = d[2], g1 = d[3], g2 = d[4], A = d[5], log2o = d[6];
  const double dx = static_cast<double>(xi) - p0.x, dy = static_cast<double>(yj) - p0.y;
  const double muz = p0.z;
  const double u1 = fma(l11, dx, l12 * dy), u2 = l22 * dy;
  const double q2 = fma(u1, u1, u2 * u2), m = fma(g1, dx, g2 * dy);
  const bool colok = EXACT || ((unsigned)(i - lox) <= (unsigned)(hix - lox) && (unsigned)(j - loy) <= (unsigned)(hiy - loy));
#pragma unroll
  for (int c = 0; c < NCH; ++c) {
    const int kc = k0 + 8 * c;
    if (kc > hiz || kc + 7 < loz) continue;
    if (EXACT) {
      const double t0 = (static_cast<double>(zk[8 * c]) - muz) - m;
      const double t7 = (static_cast<double>(zk[8 * c + 7]) - muz) - m;
      const double tc = fmax(t0, fmin(t7, 0.0));
      if (!__any_sync(kFull, fma(A * tc, tc, q2) <= a.cutoff_sq_d)) continue;
    }
#pragma unroll
    for (int jj = 0; jj < 8; ++jj) {
      const int k = kc + jj;
      const double t = (static_cast<double>(zk[8 * c + jj]) - muz) - m;
      const double q = fma(A * t, t, q2);
      const float e = static_cast<float>(fma(-kKd, q, log2o));
      if (EXACT) {
        if (q <= a.cutoff_sq_d) acc[8 * c + jj] += ex2(e);
      } else {
        if (colok && k >= loz && k <= hiz) acc[8 * c + jj] += ex2(e);
      }
    }
  }
}

// Exact mode, float32 classes: does a chunk whose z - zc spans [t0, t7] in the lane's column reach the
// cutoff in some lane of the warp? q at the z nearest to the column's centre, 1e-4 relative slack.
__device__ __forceinline__ bool chunk_reached(float t0, float t7, float A, float q2, float cutoff_sq) {
  const float tc = fmaxf(t0, fminf(t7, 0.f));
  return __any_sync(kFull, fmaf(A * tc, tc, q2) <= cutoff_sq * 1.0001f);
}

template <int NCH, bool EXACT>
__device__ __forceinline__ void process(const float4* s, const FastArgs& a, int i, int j, int k0, float xi, float yj,
                                        const float* zk, const float (&h1)[NCH], float (&acc)[8 * NCH]) {
  const float4 p3 = s[3];
  const int cls = __float_as_int(p3.x);
  if (cls == kPrecise) {
    process_precise<NCH, EXACT>(s, a, i, j, k0, xi, yj, zk, acc);
    return;
  }
  const float4 p0 = s[0], p1 = s[1], p2 = s[2], p4 = s[4];
  const float mux = p0.x, muy = p0.y, muz = p0.z, l11 = p0.w, l12 = p1.x, l22 = p1.y, g1 = p1.z, g2 = p1.w;
  const float A = p2.x, log2o = p2.y, gfac = p2.z, thr = p2.w;
  const int loz = __float_as_int(p4.y), hiz = __float_as_int(p4.z);
  const float dx = xi - mux, dy = yj - muy;
  const float u1 = fmaf(l11, dx, l12 * dy), u2 = l22 * dy;
  const float q2 = fmaf(u1, u1, u2 * u2);
  const float m = fmaf(g1, dx, g2 * dy);
  const float nka = -kK * A;
  const float lc = fmaf(-kK, q2, log2o);  // log2 of the column's peak value
  if (EXACT && cls == kRecur) {
    // along z the value is a Gaussian in k: v_{k+1} = v_k r_k, r_{k+1} = r_k gfac; anchored with two
    // exponentials at each 8-voxel chunk
#pragma unroll
    for (int c = 0; c < NCH; ++c) {
      const int kc = k0 + 8 * c;
      if (kc > hiz || kc + 7 < loz) continue;
      const float t0 = (zk[8 * c] - muz) - m, t7 = (zk[8 * c + 7] - muz) - m;
      if (!chunk_reached(t0, t7, A, q2, a.cutoff_sq)) continue;
      float v = ex2(fmaf(nka * t0, t0, lc));
      float r = ex2(fminf(nka * h1[c] * fmaf(2.f, t0, h1[c]), 64.f));
#pragma unroll
      for (int jj = 0; jj < 8; ++jj) {
        if (v >= thr) acc[8 * c + jj] += v;
        v *= r;
        r *= gfac;
      }
    }
    return;
  }
  if (EXACT) {
    const float lcut = fmaf(-kK, a.cutoff_sq, log2o);
#pragma unroll
    for (int c = 0; c < NCH; ++c) {
      const int kc = k0 + 8 * c;
      if (kc > hiz || kc + 7 < loz) continue;
      const float t0 = (zk[8 * c] - muz) - m, t7 = (zk[8 * c + 7] - muz) - m;
      if (!chunk_reached(t0, t7, A, q2, a.cutoff_sq)) continue;
#pragma unroll
      for (int jj = 0; jj < 8; ++jj) {
        const float t = (zk[8 * c + jj] - muz) - m;
        const float e = fmaf(nka * t, t, lc);
        if (e >= lcut) acc[8 * c + jj] += ex2(e);
      }
    }
    return;
  }
  // upstream: the voxel counts iff it lies in one of the Gaussian's blocks on all three axes
  const int lox = __float_as_int(p3.y), hix = __float_as_int(p3.z), loy = __float_as_int(p3.w);
  const int hiy = __float_as_int(p4.x);
  const bool colok = (unsigned)(i - lox) <= (unsigned)(hix - lox) && (unsigned)(j - loy) <= (unsigned)(hiy - loy);
#pragma unroll
  for (int c = 0; c < NCH; ++c) {
    const int kc = k0 + 8 * c;
    if (kc > hiz || kc + 7 < loz) continue;
#pragma unroll
    for (int jj = 0; jj < 8; ++jj) {
      const int k = kc + jj;
      const float t = (zk[8 * c + jj] - muz) - m;
      const float e = fmaf(nka * t, t, lc);
      if (colok && k >= loz && k <= hiz) acc[8 * c + jj] += ex2(e);
    }
  }
}

// One warp's part of a tile: the 8 x 4 columns [fi0, fi0 + 8) x [fj0, fj0 + 4), z from k0; the lane's column (i, j).
struct WarpFootprint {
  int lane, fi0, fj0, i, j, k0;
};

template <int TZ>
__device__ __forceinline__ WarpFootprint warp_footprint(const FastArgs& a, int tile) {
  const int tx = tile % a.ntx, rest = tile / a.ntx;
  const int ty = rest % a.nty, tz = rest / a.nty;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int fi0 = tx * kTileXY + (warp & 1) * 8;
  const int fj0 = ty * kTileXY + (warp >> 1) * 4;
  return {lane, fi0, fj0, fi0 + (lane & 7), fj0 + (lane >> 3), tz * TZ};
}

// Grid coordinates of the lane's column (xi, yj) and of the footprint's xy corners (for cull()).
struct FootprintCoords {
  float xi, yj, fx0, fx1, fy0, fy1;
};

__device__ __forceinline__ FootprintCoords footprint_coords(const FastArgs& a, const WarpFootprint& f) {
  return {a.axis[f.i], a.axis[f.j], a.axis[f.fi0], a.axis[f.fi0 + 7], a.axis[f.fj0], a.axis[f.fj0 + 3]};
}

// The tiled kernels' loop over a tile's Gaussians: list entries [start, end) (entry e is Gaussian e itself
// when scan_all) are staged 256 at a time in s_par (5 float4 per Gaussian); each warp culls them 32 at a
// time against its footprint and adds the survivors, in list order, to the lane's column acc.
// zk: the tile's 8 * NCH z coordinates (registers or shared memory), h1: the first spacing of each chunk.
template <int NCH, bool EXACT>
__device__ __forceinline__ void accumulate_tile(const FastArgs& a, float4* s_par, int64_t start, int64_t end,
                                                bool scan_all, const WarpFootprint& f, const FootprintCoords& c,
                                                const float* zk, const float (&h1)[NCH], float (&acc)[8 * NCH]) {
  const float4* params = reinterpret_cast<const float4*>(a.params);
  for (int64_t b = start; b < end; b += 256) {
    const int nb = static_cast<int>(min(static_cast<int64_t>(256), end - b));
    __syncthreads();
    if (static_cast<int>(threadIdx.x) < nb) {
      const int64_t e = b + threadIdx.x;
      const int64_t g = scan_all ? e : a.list[e];
#pragma unroll
      for (int q = 0; q < 5; ++q) s_par[threadIdx.x * 5 + q] = __ldg(params + g * 5 + q);
    }
    __syncthreads();
    for (int sb = 0; sb < nb; sb += 32) {
      const int gl = sb + f.lane;
      const bool pass = gl < nb && cull<EXACT, 8 * NCH>(s_par + gl * 5, f.fi0, f.fj0, f.k0, c.fx0, c.fx1, c.fy0,
                                                        c.fy1, a.cutoff_sq);
      unsigned mask = __ballot_sync(kFull, pass);
      while (mask) {
        const int bit = __ffs(mask) - 1;
        mask &= mask - 1;
        process<NCH, EXACT>(s_par + (sb + bit) * 5, a, f.i, f.j, f.k0, c.xi, c.yj, zk, h1, acc);
      }
    }
  }
}

// Four float atomic adds to p[0..3] (16-byte aligned) in one vector atomic where the GPU has it.
__device__ __forceinline__ void red_add_v4(float* p, float a, float b, float c, float d) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("red.global.add.v4.f32 [%0], {%1, %2, %3, %4};" ::"l"(p), "f"(a), "f"(b), "f"(c), "f"(d)
               : "memory");
#else
  atomicAdd(p, a);
  atomicAdd(p + 1, b);
  atomicAdd(p + 2, c);
  atomicAdd(p + 3, d);
#endif
}

// Writes one column of a tile, its TZ values from dst on: vector stores when vec (16-byte aligned, the whole
// column inside the grid), else one store per voxel with k0 + kk < r.
template <int TZ>
__device__ __forceinline__ void store_column(float* dst, bool vec, int k0, int r, const float (&acc)[TZ]) {
  if (vec) {
#pragma unroll
    for (int kk = 0; kk < TZ; kk += 4)
      *reinterpret_cast<float4*>(dst + kk) = make_float4(acc[kk], acc[kk + 1], acc[kk + 2], acc[kk + 3]);
  } else {
#pragma unroll
    for (int kk = 0; kk < TZ; ++kk)
      if (k0 + kk < r) dst[kk] = acc[kk];
  }
}

// Adds one column of a tile to the grid (when several blocks share the tile): like store_column, with
// atomic adds (all-zero groups of four skipped).
template <int TZ>
__device__ __forceinline__ void add_column(float* dst, bool vec, int k0, int r, const float (&acc)[TZ]) {
  if (vec) {
#pragma unroll
    for (int kk = 0; kk < TZ; kk += 4)
      if (acc[kk] != 0.f || acc[kk + 1] != 0.f || acc[kk + 2] != 0.f || acc[kk + 3] != 0.f)
        red_add_v4(dst + kk, acc[kk], acc[kk + 1], acc[kk + 2], acc[kk + 3]);
  } else {
#pragma unroll
    for (int kk = 0; kk < TZ; ++kk)
      if (k0 + kk < r && acc[kk] != 0.f) atomicAdd(dst + kk, acc[kk]);
  }
}

// v1: the tile's list is the slice [tile_end[tile - 1], tile_end[tile]) - base of this launch's list (sized
// on the host); the tile's z coordinates in registers.
template <int NCH, bool EXACT>
__global__ void __launch_bounds__(256) fast_kernel(const FastArgs a) {
  constexpr int TZ = 8 * NCH;
  __shared__ float4 s_par[256 * 5];
  const int tile = a.tile0 + blockIdx.x;
  const WarpFootprint f = warp_footprint<TZ>(a, tile);
  const FootprintCoords c = footprint_coords(a, f);
  float zk[TZ], acc[TZ], h1[NCH];
#pragma unroll
  for (int kk = 0; kk < TZ; ++kk) {
    zk[kk] = a.axis[f.k0 + kk];
    acc[kk] = 0.f;
  }
#pragma unroll
  for (int ch = 0; ch < NCH; ++ch) h1[ch] = zk[8 * ch + 1] - zk[8 * ch];
  const int64_t start = (tile == 0 ? 0 : a.tile_end[tile - 1]) - a.base;
  const int64_t end = a.tile_end[tile] - a.base;
  accumulate_tile<NCH, EXACT>(a, s_par, start, end, false, f, c, zk, h1, acc);
  const int r = a.resolution;
  if (f.i < r && f.j < r) {
    float* dst = a.out + (static_cast<int64_t>(f.i) * r + f.j) * r + f.k0;
    store_column<TZ>(dst, a.out_aligned && f.k0 + TZ <= r && (r & 3) == 0, f.k0, r, acc);
  }
}

// One block's work in fast_kernel_v2 (below): tile `tile`, and with SPLIT its slice `split` of the tile's list.
template <int NCH, bool EXACT, bool SPLIT>
__device__ __forceinline__ void v2_tile(const FastArgs& a, int tile, int split, int64_t capacity, int64_t n,
                                        float4* s_par, float* s_z) {
  constexpr int TZ = 8 * NCH;
  const WarpFootprint f = warp_footprint<TZ>(a, tile);
  int64_t start = tile == 0 ? 0 : a.tile_end[tile - 1];
  int64_t end = a.tile_end[tile];
  const bool scan_all = end > capacity;
  if (scan_all) {
    start = 0;
    end = n;
  }
  bool add = false;  // this block adds its slice's part of the tile to the zeroed grid
  if (SPLIT) {
    const int64_t len = end - start;
    const int64_t per = slice_length<int64_t>(len, a.splits, a.split_min);
    const int64_t s0 = start + split * per;
    if (s0 >= end) return;  // no slice for this block (the grid was zeroed); block-uniform
    add = a.always_add || len > per;
    start = s0;
    end = min(end, s0 + per);
  }
  const int r = a.resolution;
  // computed here, not at the store as in fast_kernel: this is the form ptxas fits under the register cap
  // (moving it gives spills in some instantiations)
  float* dst = a.out + (static_cast<int64_t>(f.i) * r + f.j) * r + f.k0;
  const bool vec = a.out_aligned && f.k0 + TZ <= r && (r & 3) == 0;
  float acc[TZ];
#pragma unroll
  for (int kk = 0; kk < TZ; ++kk) acc[kk] = 0.f;
  if (start < end) {
    if (threadIdx.x < TZ) s_z[threadIdx.x] = a.axis[f.k0 + threadIdx.x];
    const FootprintCoords c = footprint_coords(a, f);
    __syncthreads();
    float h1[NCH];
#pragma unroll
    for (int ch = 0; ch < NCH; ++ch) h1[ch] = s_z[8 * ch + 1] - s_z[8 * ch];
    accumulate_tile<NCH, EXACT>(a, s_par, start, end, scan_all, f, c, s_z, h1, acc);
  }
  if (f.i < r && f.j < r) {
    if (SPLIT && add) add_column<TZ>(dst, vec, f.k0, r, acc);
    else store_column<TZ>(dst, vec, f.k0, r, acc);
  }
}

// v2: same evaluation as fast_kernel, with (1) the tile's z coordinates in shared memory instead of
// 8 * NCH registers, (2) a register cap for MINB resident blocks per SM (more warps in flight to
// hide the dependent chains), (3) empty tiles write zeros and leave, (4) the list of fixed capacity
// (tiles past it scan all N Gaussians, culled by their boxes: slow but exact), (5) with SPLIT (a.splits > 1):
// a list longer than a.split_min entries is cut into up to a.splits slices of at least a.split_min entries,
// whose partial columns are added to the grid (zeroed before the launch) with atomics; a tile with a shorter
// list is written by one block alone, an empty one not at all. Long lists on few tiles (wide Gaussians on a
// coarse grid) then no longer run on a few blocks while the other SMs idle. The (tile, slice) items are listed
// by the scan kernel (SplitPlan) and taken by a grid of about one wave of blocks, in order, from a counter:
// empty tiles cost nothing (one block per possible slice cost ~20 us of block waves at 128^3).
template <int NCH, bool EXACT, int MINB, bool SPLIT>
__global__ void __launch_bounds__(256, MINB) fast_kernel_v2(const FastArgs a, int64_t capacity, int64_t n) {
  constexpr int TZ = 8 * NCH;
  __shared__ float4 s_par[256 * 5];
  __shared__ float s_z[TZ];
  if (!SPLIT) {
    v2_tile<NCH, EXACT, false>(a, blockIdx.x, 0, capacity, n, s_par, s_z);
    return;
  }
  __shared__ int s_item;
  const int items = a.counters[0];
  for (;;) {
    __syncthreads();  // the previous item is done with s_z, s_par and s_item
    if (threadIdx.x == 0) s_item = atomicAdd(a.counters + 1, 1);
    __syncthreads();
    const int w = s_item;
    if (w >= items) return;
    const int item = a.work[w];
    v2_tile<NCH, EXACT, true>(a, item / kMaxSplits, item % kMaxSplits, capacity, n, s_par, s_z);
  }
}

// ---------------------------------------------------------------------------------------------
// naive kernel: one thread per voxel, every Gaussian, axis-aligned range cull
// ---------------------------------------------------------------------------------------------

__global__ void __launch_bounds__(256) naive_kernel(const NaiveArgs a) {
  const int64_t r = a.resolution;
  const int64_t v = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (v >= r * r * r) return;
  const int k = static_cast<int>(v % r), j = static_cast<int>((v / r) % r), i = static_cast<int>(v / (r * r));
  const float x = a.axis[i], y = a.axis[j], z = a.axis[k];
  const float4* params = reinterpret_cast<const float4*>(a.params);
  float acc = 0.f;
  for (int64_t g = 0; g < a.n; ++g) {
    const float4 p3 = __ldg(params + g * 5 + 3), p4 = __ldg(params + g * 5 + 4);
    if (i < __float_as_int(p3.y) || i > __float_as_int(p3.z) || j < __float_as_int(p3.w) ||
        j > __float_as_int(p4.x) || k < __float_as_int(p4.y) || k > __float_as_int(p4.z))
      continue;
    const float4 p0 = __ldg(params + g * 5);
    if (__float_as_int(p3.x) == kPrecise) {
      const double* d = a.precise + g * kPreciseWords;
      const double dx = static_cast<double>(x) - p0.x, dy = static_cast<double>(y) - p0.y;
      const double u1 = fma(d[0], dx, d[1] * dy), u2 = d[2] * dy;
      const double t = (static_cast<double>(z) - p0.z) - fma(d[3], dx, d[4] * dy);
      const double q = fma(d[5] * t, t, fma(u1, u1, u2 * u2));
      if (!a.exact || q <= a.cutoff_sq_d) acc += ex2(static_cast<float>(fma(-kKd, q, d[6])));
      continue;
    }
    const float4 p1 = __ldg(params + g * 5 + 1), p2 = __ldg(params + g * 5 + 2);
    const float dx = x - p0.x, dy = y - p0.y;
    const float u1 = fmaf(p0.w, dx, p1.x * dy), u2 = p1.y * dy;
    const float t = (z - p0.z) - fmaf(p1.z, dx, p1.w * dy);
    const float q = fmaf(p2.x * t, t, fmaf(u1, u1, u2 * u2));
    if (!a.exact || q <= a.cutoff_sq) acc += ex2(fmaf(-kK, q, p2.y));
  }
  a.out[v] = acc;
}

// ---------------------------------------------------------------------------------------------
// scatter kernel (exact mode): one warp per kScatter Gaussian, one lane per column of its cutoff box;
// each lane walks the column's cutoff interval along z (found analytically, widened by a voxel, every
// voxel then tested exactly as in process()) and adds the terms to the grid with global atomics,
// four z-neighbours per vector atomic where the grid allows. Small Gaussians (a few voxels wide)
// cost ~2 warp instructions per term here against ~80 in the tiled kernel, whose 8 x 4 x 8-voxel
// warp footprints they barely fill.
// ---------------------------------------------------------------------------------------------


// Adds term(axis[k]) for k in [k0, k1] to the column col with global atomics, zero terms skipped: over the
// aligned runs of four voxels with one vector atomic each when vec4 (R % 4 == 0, col and axis 16-byte
// aligned; a run may reach past [k0, k1], whose voxels the caller's term gives 0: outside the cutoff), else
// voxel by voxel.
template <typename Term>
__device__ __forceinline__ void add_column_terms(float* col, const float* axis, bool vec4, int k0, int k1,
                                                 const Term& term) {
  if (vec4) {
    for (int kq = k0 & ~3; kq <= k1; kq += 4) {
      const float4 zq = *reinterpret_cast<const float4*>(axis + kq);
      const float v[4] = {term(zq.x), term(zq.y), term(zq.z), term(zq.w)};
      if (v[0] != 0.f || v[1] != 0.f || v[2] != 0.f || v[3] != 0.f) red_add_v4(col + kq, v[0], v[1], v[2], v[3]);
    }
  } else {
    for (int k = k0; k <= k1; ++k) {
      const float v = term(axis[k]);
      if (v != 0.f) atomicAdd(col + k, v);
    }
  }
}

// Column c of a box whose columns are numbered x-major, ny per x: (lox + c / ny, loy + c % ny), the quotient
// from a float reciprocal rny = 1 / ny and one correction step (exact: c < R^2 <= 2^24).
__device__ __forceinline__ void box_column(int c, int ny, float rny, int lox, int loy, int* i, int* j) {
  int di = static_cast<int>((static_cast<float>(c) + 0.5f) * rny);
  int dj = c - di * ny;
  if (dj < 0) {
    --di;
    dj += ny;
  } else if (dj >= ny) {
    ++di;
    dj -= ny;
  }
  *i = lox + di;
  *j = loy + dj;
}

__global__ void __launch_bounds__(256) scatter_kernel(const ScatterArgs a) {
  const int lane = threadIdx.x & 31;
  const int64_t warps = (static_cast<int64_t>(gridDim.x) * blockDim.x) >> 5;
  const float4* params = reinterpret_cast<const float4*>(a.params);
  const int64_t r = a.resolution;
  const float inv_h = 0.5f * static_cast<float>(a.resolution - 1);
  const float cut = a.cutoff_sq;
  for (int64_t g = (blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x) >> 5; g < a.n; g += warps) {
    const float4 p3 = __ldg(params + g * 5 + 3);
    if (__float_as_int(p3.x) != kScatter) continue;
    const float4 p0 = __ldg(params + g * 5), p1 = __ldg(params + g * 5 + 1), p2 = __ldg(params + g * 5 + 2);
    const float4 p4 = __ldg(params + g * 5 + 4);
    const int lox = __float_as_int(p3.y), hix = __float_as_int(p3.z), loy = __float_as_int(p3.w);
    const int hiy = __float_as_int(p4.x), loz = __float_as_int(p4.y), hiz = __float_as_int(p4.z);
    const int ny = hiy - loy + 1;
    const int cols = (hix - lox + 1) * ny;
    const float A = p2.x, log2o = p2.y;
    const float nka = -kK * A, inv_a = 1.f / A;
    const float lcut = fmaf(-kK, cut, log2o);
    const float rny = 1.f / static_cast<float>(ny);
    for (int c = lane; c < cols; c += 32) {
      int i, j;
      box_column(c, ny, rny, lox, loy, &i, &j);
      const float dx = a.axis[i] - p0.x, dy = a.axis[j] - p0.y;
      const float u1 = fmaf(p0.w, dx, p1.x * dy), u2 = p1.y * dy;
      const float q2 = fmaf(u1, u1, u2 * u2);
      if (q2 > cut * 1.0001f) continue;
      const float m = fmaf(p1.z, dx, p1.w * dy);
      const float lc = fmaf(-kK, q2, log2o);
      const float half = sqrtf(fmaxf(cut - q2, 0.f) * inv_a);
      const float zc = p0.z + m;
      const int k0 = max(loz, static_cast<int>(floorf((zc - half + 1.f) * inv_h)) - 1);
      const int k1 = min(hiz, static_cast<int>(ceilf((zc + half + 1.f) * inv_h)) + 1);
      const float muz = p0.z;
      add_column_terms(a.out + (static_cast<int64_t>(i) * r + j) * r, a.axis, a.vec4, k0, k1, [&](float z) {
        const float t = (z - muz) - m;
        const float x = fmaf(nka * t, t, lc);
        return x >= lcut ? ex2(x) : 0.f;
      });
    }
  }
}

// precise scatter kernel (exact mode): scatter_kernel's layout for the kPreciseScatter class, with the
// float64 coefficients and arithmetic of process_precise(): per column Q2 and the cutoff interval along z
// in float64, each voxel's q in float64 and tested against c^2 there, the term rounded to float32 once.
// One warp per work item of the setup kernel's list (a slice of at most kPreciseSliceColumns columns of one
// Gaussian's box), so a thin disc as wide as the grid is spread over many warps instead of holding one.
__global__ void __launch_bounds__(256) precise_scatter_kernel(const ScatterArgs a) {
  const int lane = threadIdx.x & 31;
  const int64_t warps = (static_cast<int64_t>(gridDim.x) * blockDim.x) >> 5;
  const float4* params = reinterpret_cast<const float4*>(a.params);
  const int64_t r = a.resolution;
  const double inv_h = 0.5 * static_cast<double>(a.resolution - 1);
  const double cut = a.cutoff_sq_d;
  const int64_t items = min(static_cast<int64_t>(*a.precise_count), a.precise_capacity);
  for (int64_t w = (blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x) >> 5; w < items; w += warps) {
    const int64_t item = a.precise_items[w];
    if (item < 0) continue;  // reserved by a Gaussian whose items did not fit (it stayed in the tile lists)
    const int64_t g = item / kMaxPreciseSlices;
    const int slice = static_cast<int>(item % kMaxPreciseSlices);
    const float4 p3 = __ldg(params + g * 5 + 3);
    const float4 p0 = __ldg(params + g * 5), p4 = __ldg(params + g * 5 + 4);
    const int lox = __float_as_int(p3.y), hix = __float_as_int(p3.z), loy = __float_as_int(p3.w);
    const int hiy = __float_as_int(p4.x), loz = __float_as_int(p4.y), hiz = __float_as_int(p4.z);
    const double* d = a.precise + g * kPreciseWords;
    const double l11 = d[0], l12 = d[1], l22 = d[2], g1 = d[3], g2 = d[4], A = d[5], log2o = d[6];
    const double mux = p0.x, muy = p0.y, muz = p0.z;
    const int ny = hiy - loy + 1;
    const int cols = min((hix - lox + 1) * ny, (slice + 1) * kPreciseSliceColumns);
    const float rny = 1.f / static_cast<float>(ny);
    for (int c = slice * kPreciseSliceColumns + lane; c < cols; c += 32) {
      int i, j;
      box_column(c, ny, rny, lox, loy, &i, &j);
      const double dx = static_cast<double>(a.axis[i]) - mux, dy = static_cast<double>(a.axis[j]) - muy;
      const double u1 = fma(l11, dx, l12 * dy), u2 = l22 * dy;
      const double q2 = fma(u1, u1, u2 * u2);
      if (!(q2 <= cut)) continue;  // every voxel of the column has q >= q2
      const double m = fma(g1, dx, g2 * dy);
      // the voxels whose q can pass the test below: |z - zc| <= half, with the cutoff 1e-12 wider for the
      // rounding of q and 1e-3 voxel of slack for the float32 grid table (as exact_range). Thin discs cross
      // most of their columns between two voxels: those columns end here (a voxel of slack on each side used to
      // cost them one or two runs of four float64 evaluations each)
      const double half = sqrt(fmax(fma(cut, 1e-12, cut) - q2, 0.0) / A);
      const double zc = muz + m;
      const double f0 = ceil((zc - half + 1.0) * inv_h - 1e-3), f1 = floor((zc + half + 1.0) * inv_h + 1e-3);
      const int k0 = static_cast<int>(fmax(f0, static_cast<double>(loz)));
      const int k1 = static_cast<int>(fmin(f1, static_cast<double>(hiz)));
      if (k0 > k1) continue;
      add_column_terms(a.out + (static_cast<int64_t>(i) * r + j) * r, a.axis, a.vec4, k0, k1, [&](float z) {
        const double t = (static_cast<double>(z) - muz) - m;
        const double q = fma(A * t, t, q2);
        return q <= cut ? ex2(static_cast<float>(fma(-kKd, q, log2o))) : 0.f;
      });
    }
  }
}

// Streaming multiprocessors of the current device (cached per device).
int multiprocessors() {
  static int cached[64] = {0};
  int dev = 0;
  if (cudaGetDevice(&dev) != cudaSuccess || dev < 0 || dev >= 64) return 132;
  if (cached[dev] == 0) {
    int v = 0;
    cached[dev] = cudaDeviceGetAttribute(&v, cudaDevAttrMultiProcessorCount, dev) == cudaSuccess && v > 0 ? v : 132;
  }
  return cached[dev];
}

int blocks_for(int64_t n, int threads) {
  const int64_t b = (n + threads - 1) / threads;
  return static_cast<int>(b < 1 ? 1 : (b > 65535 * 16 ? 65535 * 16 : b));
}

}  // namespace

cudaError_t launch_setup(const SetupArgs& a, cudaStream_t stream) {
  setup_kernel<<<blocks_for(a.n, 256), 256, 0, stream>>>(a);
  return cudaGetLastError();
}

cudaError_t launch_scan(const int* counts, int64_t* out, int64_t m, const SplitPlan& plan, cudaStream_t stream) {
  if (m <= 0) return cudaSuccess;
  if (plan.work != nullptr && (plan.tiles > m || plan.splits < 1 || plan.splits > kMaxSplits)) return cudaErrorInvalidValue;
  scan_kernel<<<1, 1024, 0, stream>>>(counts, out, m, plan);
  return cudaGetLastError();
}

// fill kernels: at least four blocks per SM, for the wide-box items
static int fill_blocks(int64_t n) { return std::max(blocks_for(n, 256), multiprocessors() * 4); }

cudaError_t launch_count_wide(const FillArgs& a, cudaStream_t stream) {
  if (a.wide_items == nullptr || a.wide_count == nullptr) return cudaErrorInvalidValue;
  count_wide_kernel<<<multiprocessors() * 4, 256, 0, stream>>>(a);
  return cudaGetLastError();
}

cudaError_t launch_fill(const FillArgs& a, cudaStream_t stream) {
  if (a.wide_items == nullptr || a.wide_count == nullptr) return cudaErrorInvalidValue;
  fill_kernel<<<fill_blocks(a.n), 256, 0, stream>>>(a);
  return cudaGetLastError();
}

cudaError_t launch_fast(const FastArgs& a, bool exact, int chunks, int num_tiles, cudaStream_t stream) {
  if (num_tiles <= 0) return cudaSuccess;
  const dim3 grid(num_tiles), block(256);
  if (exact) {
    switch (chunks) {
      case 1: fast_kernel<1, true><<<grid, block, 0, stream>>>(a); break;
      case 2: fast_kernel<2, true><<<grid, block, 0, stream>>>(a); break;
      case 4: fast_kernel<4, true><<<grid, block, 0, stream>>>(a); break;
      default: return cudaErrorInvalidValue;
    }
  } else {
    switch (chunks) {
      case 1: fast_kernel<1, false><<<grid, block, 0, stream>>>(a); break;
      case 2: fast_kernel<2, false><<<grid, block, 0, stream>>>(a); break;
      default: return cudaErrorInvalidValue;
    }
  }
  return cudaGetLastError();
}

cudaError_t launch_fill_bounded(const FillArgs& a, int64_t capacity, cudaStream_t stream) {
  if (a.wide_items == nullptr || a.wide_count == nullptr) return cudaErrorInvalidValue;
  fill_bounded_kernel<<<fill_blocks(a.n), 256, 0, stream>>>(a, capacity);
  return cudaGetLastError();
}

template <bool SPLIT>
static cudaError_t launch_fast_v2_t(const FastArgs& a, bool exact, int chunks, int num_tiles, int64_t capacity, int64_t n,
                             cudaStream_t stream) {
  const int splits = SPLIT ? a.splits : 1;
  // SPLIT work items are tile * kMaxSplits + slice in an int
  if (splits < 1 || splits > kMaxSplits || (SPLIT && static_cast<int64_t>(num_tiles) * kMaxSplits >= (int64_t(1) << 31)))
    return cudaErrorInvalidValue;
  // SPLIT: about one wave of resident blocks takes the work items (at most one block per possible item)
  int blocks = num_tiles;
  if (SPLIT) {
    const int minb = chunks == 4 ? kMinBlocks4 : (chunks == 2 ? kMinBlocks2 : kMinBlocks1);
    blocks = static_cast<int>(std::min<int64_t>(static_cast<int64_t>(num_tiles) * splits,
                                                static_cast<int64_t>(multiprocessors()) * minb));
  }
  const dim3 grid(blocks), block(256);
  if (exact) {
    switch (chunks) {
      case 1: fast_kernel_v2<1, true, kMinBlocks1, SPLIT><<<grid, block, 0, stream>>>(a, capacity, n); break;
      case 2: fast_kernel_v2<2, true, kMinBlocks2, SPLIT><<<grid, block, 0, stream>>>(a, capacity, n); break;
      case 4: fast_kernel_v2<4, true, kMinBlocks4, SPLIT><<<grid, block, 0, stream>>>(a, capacity, n); break;
      default: return cudaErrorInvalidValue;
    }
  } else {
    switch (chunks) {
      case 1: fast_kernel_v2<1, false, kMinBlocks1, SPLIT><<<grid, block, 0, stream>>>(a, capacity, n); break;
      case 2: fast_kernel_v2<2, false, kMinBlocks2, SPLIT><<<grid, block, 0, stream>>>(a, capacity, n); break;
      default: return cudaErrorInvalidValue;
    }
  }
  return cudaGetLastError();
}

cudaError_t launch_fast_v2(const FastArgs& a, bool exact, int chunks, int num_tiles, int64_t capacity, int64_t n,
                           cudaStream_t stream) {
  if (num_tiles <= 0) return cudaSuccess;
  return a.splits > 1 ? launch_fast_v2_t<true>(a, exact, chunks, num_tiles, capacity, n, stream)
                      : launch_fast_v2_t<false>(a, exact, chunks, num_tiles, capacity, n, stream);
}

cudaError_t launch_scatter(const ScatterArgs& a, cudaStream_t stream) {
  if (a.n <= 0) return cudaSuccess;
  scatter_kernel<<<blocks_for(a.n * 32, 256), 256, 0, stream>>>(a);
  return cudaGetLastError();
}

cudaError_t launch_precise_scatter(const ScatterArgs& a, cudaStream_t stream) {
  if (a.n <= 0) return cudaSuccess;
  if (a.precise == nullptr || a.precise_items == nullptr || a.precise_count == nullptr) return cudaErrorInvalidValue;
  // the item count is on the device: a fixed grid of warps takes the items (each at most
  // kPreciseSliceColumns / 32 rounds of its lanes)
  precise_scatter_kernel<<<multiprocessors() * 4, 256, 0, stream>>>(a);
  return cudaGetLastError();
}

cudaError_t launch_naive(const NaiveArgs& a, cudaStream_t stream) {
  const int64_t r = a.resolution;
  const int64_t blocks = (r * r * r + 255) / 256;
  naive_kernel<<<static_cast<unsigned>(blocks), 256, 0, stream>>>(a);
  return cudaGetLastError();
}

}  // namespace microdreamer
