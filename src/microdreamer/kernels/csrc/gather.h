// Launcher of the brick-gather field kernel (plain C++ interface: raw device pointers and a stream).
// Nothing here depends on PyTorch; bindings.cpp checks tensors and calls it on the current stream.
#pragma once

#include <cstdint>

#include <cuda_runtime.h>

namespace microdreamer {

// Voxels per brick side: one block of kBrick^3 threads per brick, one thread per voxel.
constexpr int kBrick = 8;

struct GatherArgs {
  const double* means;         // [N, 3]
  const double* transforms;    // [N, 3, 3] row-major whitening transforms M, q = |M (x - mean)|^2
  const float* opacities;      // [N]
  const int64_t* box;          // [N, 3, 2] first and last voxel per axis (inclusive)
  const double* axis;          // [R] grid coordinates along every axis
  const int64_t* brick_start;  // [B^3 + 1] list position of each brick's first entry, B = ceil(R / kBrick)
  const int* brick_list;       // [M] Gaussian indices, ascending within each brick
  int64_t n = 0;
  int resolution = 0;  // R
  int bricks = 0;      // B
  double limit = 0.0;  // terms with q above it are dropped
  float* out;          // [R, R, R] float32, added to
};

// out[i, j, k] += opacity * exp(-q / 2) of every listed Gaussian whose box holds (i, j, k) and whose q <= limit,
// in the order of the brick's list: each voxel's sum is a gather by one thread (no atomics), so the result is
// the same on every run and, for the same list order, the same as microdreamer's C++ field_scatter up to the
// exponential's rounding (q in float64 without fused multiply-adds, the term and the sum in float32).
cudaError_t launch_field_gather(const GatherArgs& a, cudaStream_t stream);

}  // namespace microdreamer
