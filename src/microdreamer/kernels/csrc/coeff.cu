// gaussian_3d_coeff (DreamGaussian semantics, evaluated in float64) and a benchmark probe of the
// exponential rate.
#include <cstdint>

#include <cuda_runtime.h>

#include "fields.h"

namespace microdreamer {
namespace {

template <typename T>
__global__ void coeff_kernel(const T* __restrict__ xyz, const T* __restrict__ cov, T* __restrict__ out, int64_t m) {
  for (int64_t n = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; n < m;
       n += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const double x = xyz[n * 3], y = xyz[n * 3 + 1], z = xyz[n * 3 + 2];
    const double a = cov[n * 6], b = cov[n * 6 + 1], c = cov[n * 6 + 2];
    const double d = cov[n * 6 + 3], e = cov[n * 6 + 4], f = cov[n * 6 + 5];
    const double inv_det = 1.0 / (a * d * f + 2 * e * c * b - e * e * a - c * c * d - b * b * f + 1e-24);
    const double inv_a = (d * f - e * e) * inv_det;
    const double inv_b = (e * c - b * f) * inv_det;
    const double inv_c = (e * b - c * d) * inv_det;
    const double inv_d = (a * f - c * c) * inv_det;
    const double inv_e = (b * c - e * a) * inv_det;
    const double inv_f = (a * d - b * b) * inv_det;
    const double power =
        -0.5 * (x * x * inv_a + y * y * inv_d + z * z * inv_f) - x * y * inv_b - x * z * inv_c - y * z * inv_e;
    out[n] = static_cast<T>(power > 0 ? 0.0 : exp(power));
  }
}

__global__ void exp2_probe_kernel(float* out, int64_t threads, int iters) {
  const int64_t t = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (t >= threads) return;
  // eight independent chains keep the special-function unit busy; each step is one ex2.approx
  float v[8];
#pragma unroll
  for (int c = 0; c < 8; ++c) v[c] = -1e-3f * static_cast<float>((t + c) & 255);
  for (int it = 0; it < iters; ++it) {
#pragma unroll
    for (int c = 0; c < 8; ++c) {
      float y;
      asm volatile("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(v[c]));
      v[c] = -y;
    }
  }
  float s = 0.f;
#pragma unroll
  for (int c = 0; c < 8; ++c) s += v[c];
  out[t] = s;
}

int blocks_for(int64_t n) {
  const int64_t b = (n + 255) / 256;
  return static_cast<int>(b < 1 ? 1 : (b > 65535 * 16 ? 65535 * 16 : b));
}

}  // namespace

cudaError_t launch_coeff_f32(const float* xyz, const float* cov, float* out, int64_t m, cudaStream_t stream) {
  coeff_kernel<float><<<blocks_for(m), 256, 0, stream>>>(xyz, cov, out, m);
  return cudaGetLastError();
}

cudaError_t launch_coeff_f64(const double* xyz, const double* cov, double* out, int64_t m, cudaStream_t stream) {
  coeff_kernel<double><<<blocks_for(m), 256, 0, stream>>>(xyz, cov, out, m);
  return cudaGetLastError();
}

cudaError_t launch_exp2_probe(float* out, int64_t threads, int iters, cudaStream_t stream) {
  exp2_probe_kernel<<<static_cast<unsigned>((threads + 255) / 256), 256, 0, stream>>>(out, threads, iters);
  return cudaGetLastError();
}

}  // namespace microdreamer
