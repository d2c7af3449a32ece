// Silhouette carving's projected alpha on the GPU (see carve.h and microdreamer.field.carve): each term is
// the same float32 arithmetic, in the same order, as the PyTorch path's float32 terms, every step an
// explicit round-to-nearest intrinsic so that nvcc contracts nothing into a fused multiply-add.
#include <cmath>

#include "carve.h"

namespace microdreamer {
namespace {

constexpr int kThreads = 256;
constexpr int kWarp = 32;

__global__ void carve_alpha_kernel(CarveArgs a) {
  const int64_t warp = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) / kWarp;
  const int lane = threadIdx.x % kWarp;
  if (warp >= a.n * a.directions) return;
  const int64_t k = warp / a.n;  // the direction
  const int64_t g = warp;        // (direction, Gaussian) row of the per-direction arrays
  const int64_t i = warp % a.n;  // the Gaussian
  const int fu = a.box[4 * g + 0], fv = a.box[4 * g + 1], eu = a.box[4 * g + 2], ev = a.box[4 * g + 3];
  const int64_t count = static_cast<int64_t>(eu) * ev;
  if (count <= 0) return;
  const float pa = a.precision[3 * g + 0], pb2 = __fmul_rn(2.0f, a.precision[3 * g + 1]);
  const float pc = a.precision[3 * g + 2];
  const float ou = a.offset[2 * g + 0], ov = a.offset[2 * g + 1];
  const float o = a.opacity[i];
  const float min_alpha = 1.0f / 255.0f;
  unsigned long long* image = a.sums + k * a.image_stride;
  for (int64_t t = lane; t < count; t += kWarp) {
    const int iu = static_cast<int>(t / ev);
    const int iv = static_cast<int>(t - static_cast<int64_t>(iu) * ev);
    const float du = __fadd_rn(static_cast<float>(iu), ou);
    const float dv = __fadd_rn(static_cast<float>(iv), ov);
    // q = a du du + 2 b du dv + c dv dv, left to right
    const float q = __fadd_rn(__fadd_rn(__fmul_rn(__fmul_rn(pa, du), du), __fmul_rn(__fmul_rn(pb2, du), dv)),
                              __fmul_rn(__fmul_rn(pc, dv), dv));
    const float alpha = fminf(__fmul_rn(o, expf(__fmul_rn(-0.5f, q))), 0.999f);
    if (!(alpha >= min_alpha)) continue;  // also skips NaN
    const long long term = llrint(static_cast<double>(log1pf(-alpha)) * kCarveFixedScale);
    atomicAdd(image + static_cast<int64_t>(fu + iu) * a.v_size + (fv + iv), static_cast<unsigned long long>(term));
  }
}

}  // namespace

cudaError_t launch_carve_alpha(const CarveArgs& a, cudaStream_t stream) {
  const int64_t warps = a.n * a.directions;
  if (warps <= 0) return cudaSuccess;
  const int64_t blocks = (warps * kWarp + kThreads - 1) / kThreads;
  carve_alpha_kernel<<<static_cast<unsigned>(blocks), kThreads, 0, stream>>>(a);
  return cudaGetLastError();
}

}  // namespace microdreamer
