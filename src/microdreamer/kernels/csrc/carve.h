// Launcher of the silhouette-carving kernel (plain C++ interface: raw device pointers and a stream).
// Nothing here depends on PyTorch; bindings.cpp checks tensors and calls it on the current stream.
#pragma once

#include <cstdint>

#include <cuda_runtime.h>

namespace microdreamer {

// Fixed-point scale of the log-transmittance sums: each term log(1 - a) in [-6.91, 0] is rounded to a
// multiple of 2^-32, so the 64-bit sums are exact in any order (deterministic under atomics) up to
// 2^31 / 6.91 ~ 3e8 terms per pixel.
constexpr double kCarveFixedScale = 4294967296.0;

struct CarveArgs {
  const float* precision;  // [D, N, 3] (a, b, c) of the inverse 2D covariance, squared pixels
  const float* offset;     // [D, N, 2] pixel (0, 0) of the Gaussian's box minus its centre, in pixels
  const int* box;          // [D, N, 4] first pixel (u, v) and extent (u, v) of the Gaussian's box
  const float* opacity;    // [N]
  int64_t n = 0;           // N Gaussians
  int64_t directions = 0;  // D images
  int64_t image_stride = 0;  // entries per image in `sums` (U * V)
  int v_size = 0;            // V: pixels per row of every image
  unsigned long long* sums;  // [D, U * V] fixed-point sums of log(1 - a), two's complement
};

// Adds every (Gaussian, pixel) term of every direction to `sums`: one warp per (direction, Gaussian).
cudaError_t launch_carve_alpha(const CarveArgs& a, cudaStream_t stream);

}  // namespace microdreamer
