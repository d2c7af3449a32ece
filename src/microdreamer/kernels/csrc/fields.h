// Launchers of the density-field kernels (plain C++ interface: raw device pointers and a stream).
// Nothing here depends on PyTorch; bindings.cpp checks tensors and calls these on the current stream.
#pragma once

#include <cstdint>

#include <cuda_runtime.h>

namespace microdreamer {

// Per-Gaussian parameters packed for the kernels: 20 words (80 bytes, five 16-byte vectors).
//   [0..2]  mean (x, y, z)
//   [3..5]  l11, l12, l22: q restricted to a column is A (z - zc)^2 + (l11 dx + l12 dy)^2 + (l22 dy)^2
//   [6..7]  g1, g2: the conditional centre zc = mu_z + g1 dx + g2 dy
//   [8]     A = P_zz (the precision's zz entry), [9] log2(opacity)
//   [10]    gfac = 2^(-2 K A h^2) (recurrence step factor), [11] thr = opacity * cutoff_tol
//   [12]    class (int): kRecur, kDirect, kPrecise, kEmpty, kScatter, kPreciseScatter
//   [13..18] voxel index ranges lo_x, hi_x, lo_y, hi_y, lo_z, hi_z (int; exact: the cutoff box,
//            upstream: the union of the blocks whose grown box holds the centre)
//   [19]    the Gaussian's index (for the float64 table), bit 31 set when its tiles are binned through the
//           wide-box list
constexpr int kParamWords = 20;
// Double-precision coefficients for the kPrecise class: l11, l12, l22, g1, g2, A, log2(opacity), spare.
constexpr int kPreciseWords = 8;

// kScatter: a small Gaussian left out of the tile lists and added by scatter_kernel (exact mode, when
// SetupArgs.scatter_max_voxels > 0); kPreciseScatter: a kPrecise Gaussian left out of the lists and added
// by precise_scatter_kernel in float64 (exact mode, SetupArgs.scatter_precise). The tiled kernels treat
// both like kEmpty.
enum GaussClass : int { kRecur = 0, kDirect = 1, kPrecise = 2, kEmpty = 3, kScatter = 4, kPreciseScatter = 5 };
// The float64 scatter's work items: (Gaussian g, slice s) = g * kMaxPreciseSlices + s, slice s being the
// columns [s * kPreciseSliceColumns, (s + 1) * kPreciseSliceColumns) of the Gaussian's box (column-major in
// x, y), so that one warp takes at most 8 rounds of its lanes per item however wide the box (a box holds
// at most R^2 <= 2^24 columns: < 65536 slices).
constexpr int kPreciseSliceColumns = 256;
constexpr int64_t kMaxPreciseSlices = 65536;

struct SetupArgs {
  const float* means;       // [N, 3]
  const float* opacities;   // [N]
  const float* transforms;  // [N, 3, 3] row-major whitening transforms M
  const float* radii;       // [N, 3] half-extents of the cutoff box
  int64_t n;
  int resolution;           // R
  bool exact;               // exact mode (else upstream)
  double h;                 // grid spacing 2 / (R - 1)
  double cutoff_sq;         // c^2
  double cutoff_tol;        // terms below cutoff_tol * opacity are dropped (exact mode)
  int block_voxels;         // upstream: T
  int num_blocks_axis;      // upstream: B = ceil(R / T)
  const double* lower;      // upstream: [B] block bounds (strict)
  const double* upper;      // upstream: [B]
  int64_t scatter_max_voxels;  // exact mode: Gaussians whose cutoff box has at most this many voxels
                               // become kScatter (0: none)
  bool scatter_precise;        // exact mode: kPrecise Gaussians become kPreciseScatter
  unsigned long long* precise_count;  // scatter_precise: items appended so far (zeroed before the launch)
  int64_t* precise_items;             // [precise_capacity] out: the float64 scatter's work items; -1: unused
  int64_t precise_capacity;           // a Gaussian whose items do not all fit stays kPrecise (tiled)
  // binning: tile boxes of more than 128 tiles are listed as work items of 128 tiles (counted by
  // launch_count_wide, listed by the fill kernels); a Gaussian whose items do not fit is binned by its warp
  unsigned long long* wide_count;     // items appended so far (zeroed before the launch)
  int64_t* wide_items;                // [wide_capacity] out; -1: unused
  int64_t wide_capacity;
  // binning (tile_counts == nullptr: no binning, e.g. for the naive kernel)
  int tile_x, tile_y, tile_z;     // tile size in voxels
  int ntx, nty, ntz;              // tiles per axis
  int* tile_counts;               // [ntx * nty * ntz], incremented
  float* params;                  // [N, kParamWords] out
  double* precise;                // [N, kPreciseWords] out
};

struct FillArgs {
  const float* params;
  int64_t n;
  int tile_x, tile_y, tile_z, ntx, nty, ntz;
  int tz_begin, tz_end;           // only tiles with tz in [tz_begin, tz_end)
  int* tile_cursor;               // [tiles] remaining count per tile (decremented)
  const int64_t* tile_end;        // [tiles] inclusive prefix sums of the counts
  int64_t base;                   // list position of the first entry of tile (0, 0, tz_begin)
  int* list;                      // [entries of this chunk] Gaussian indices
  const unsigned long long* wide_count;  // the wide-box list written by the setup kernel
  const int64_t* wide_items;
  int64_t wide_capacity;
};

// Variant 2 with splits: the scan kernel lists the split kernel's (tile, slice) work items.
constexpr int kMaxSplits = 64;
struct SplitPlan {
  int* work = nullptr;            // [tiles * splits] out: tile * kMaxSplits + slice (nullptr: no plan)
  int* counters = nullptr;        // [2] out: the number of work items; the kernel's next-item counter (zeroed)
  int64_t tiles = 0;              // the first `tiles` scanned counts are the tiles'
  int64_t capacity = 0;           // list capacity (tiles past it scan all n Gaussians)
  int64_t n = 0;
  int64_t split_min = 1;
  int splits = 1;
};

struct FastArgs {
  const float* params;
  const double* precise;
  const int* list;
  const int64_t* tile_end;        // inclusive prefix sums over all tiles
  int64_t base;
  int tile0;                      // first tile of this launch (tile index, z-major)
  int ntx, nty, ntz;
  int resolution;
  const float* axis;              // [>= max tile extent] grid coordinates, extended past R - 1
  float cutoff_sq;
  double cutoff_sq_d;
  float* out;                     // [R, R, R]
  bool out_aligned;               // out is 16-byte aligned (vector stores allowed when R % 4 == 0)
  int splits = 1;                 // v2: blocks per tile (> 1: out must be zeroed before the launch)
  bool always_add = false;        // v2 with splits: every block adds into the grid, also a tile's only slice
                                  // (the scatter kernels add into it at the same time, on another stream)
  int64_t split_min = 1;          // v2: fewest list entries per block when a tile's list is split
  const int* work = nullptr;      // v2 with splits: the work items and counters of SplitPlan
  int* counters = nullptr;
};

struct NaiveArgs {
  const float* params;
  const double* precise;
  int64_t n;
  int resolution;
  bool exact;
  const float* axis;
  float cutoff_sq;
  double cutoff_sq_d;
  float* out;
};

cudaError_t launch_setup(const SetupArgs& a, cudaStream_t stream);
// Inclusive prefix sums of m int counts into int64 (one block; replaces a cumsum and its dtype copy), and
// the split kernel's work items when plan.work is set.
cudaError_t launch_scan(const int* counts, int64_t* out, int64_t m, const SplitPlan& plan, cudaStream_t stream);
// Adds the wide-box list's tiles to the tile counts (a.tile_cursor: the counts), after launch_setup.
cudaError_t launch_count_wide(const FillArgs& a, cudaStream_t stream);
cudaError_t launch_fill(const FillArgs& a, cudaStream_t stream);
// chunks: 8-voxel chunks per thread along z (tile_z = 8 * chunks); supported: 1, 2, 4.
cudaError_t launch_fast(const FastArgs& a, bool exact, int chunks, int num_tiles, cudaStream_t stream);
cudaError_t launch_naive(const NaiveArgs& a, cudaStream_t stream);

struct ScatterArgs {
  const float* params;
  int64_t n;
  int resolution;
  const float* axis;              // [>= R] grid coordinates
  float cutoff_sq;
  float* out;                     // [R, R, R]: added into, after the tiled kernel has written it or, with
                                  // overlap, zeroed while the tiled kernel adds into it on another stream
  bool vec4;                      // R % 4 == 0, out and axis 16-byte aligned: 4-wide vector atomics
  const double* precise;          // [N, kPreciseWords] (launch_precise_scatter)
  double cutoff_sq_d;             // c^2 (launch_precise_scatter)
  const unsigned long long* precise_count;  // launch_precise_scatter: the work items listed by setup
  const int64_t* precise_items;
  int64_t precise_capacity;
};
// Adds every kScatter Gaussian's terms to `out` (exact mode): one warp per Gaussian, one lane per
// column of its cutoff box, global atomic adds (vectors of 4 along z where allowed).
cudaError_t launch_scatter(const ScatterArgs& a, cudaStream_t stream);
// Adds every kPreciseScatter Gaussian's terms to `out` (exact mode), like launch_scatter but with the
// column intervals and the terms in float64, as the tiled kernels' float64 path computes them: thin
// Gaussians cost their columns and in-cutoff voxels instead of tile footprints over their boxes. One warp
// per work item (a slice of kPreciseSliceColumns columns of one Gaussian's box) listed by the setup kernel.
cudaError_t launch_precise_scatter(const ScatterArgs& a, cudaStream_t stream);
// v2 ("fast" variant 2): one list of `capacity` entries for every tile (FillArgs.base and tz range
// unused); tiles whose entries end past the capacity scan all n Gaussians. No host synchronisation.
cudaError_t launch_fill_bounded(const FillArgs& a, int64_t capacity, cudaStream_t stream);
cudaError_t launch_fast_v2(const FastArgs& a, bool exact, int chunks, int num_tiles, int64_t capacity, int64_t n,
                           cudaStream_t stream);

}  // namespace microdreamer
