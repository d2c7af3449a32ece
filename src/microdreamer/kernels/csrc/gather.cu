// The exact field on a small grid as a deterministic gather (see gather.h and
// microdreamer.field.gather): one block per 8^3 brick stages the brick's Gaussians in shared memory, in
// list order, and each thread adds the terms of its voxel one by one. Every float64 and float32 step is an
// explicit round-to-nearest intrinsic, so nvcc contracts nothing into a fused multiply-add and q is the
// C++ kernel's q bit for bit.
#include "gather.h"

namespace microdreamer {
namespace {

constexpr int kThreads = kBrick * kBrick * kBrick;
// Gaussians staged per round (12 doubles and 7 words each, 128 bytes: 16 KiB of shared memory).
constexpr int kStage = 128;

struct Staged {
  double mu[3];
  double m[9];
  float opacity;
  int lo[3], hi[3];
};

__global__ void __launch_bounds__(kThreads) field_gather_kernel(const GatherArgs a) {
  __shared__ Staged s[kStage];
  const int b = blockIdx.x;
  const int bz = b % a.bricks, by = (b / a.bricks) % a.bricks, bx = b / (a.bricks * a.bricks);
  const int t = threadIdx.x;
  const int i = bx * kBrick + t / (kBrick * kBrick), j = by * kBrick + (t / kBrick) % kBrick, k = bz * kBrick + t % kBrick;
  const bool inside = i < a.resolution && j < a.resolution && k < a.resolution;
  const double xi = inside ? a.axis[i] : 0.0, yj = inside ? a.axis[j] : 0.0, zk = inside ? a.axis[k] : 0.0;
  float* cell = inside ? a.out + (static_cast<int64_t>(i) * a.resolution + j) * a.resolution + k : nullptr;
  float acc = inside ? *cell : 0.0f;
  const int64_t first = a.brick_start[b], last = a.brick_start[b + 1];
  for (int64_t base = first; base < last; base += kStage) {
    const int count = static_cast<int>(min(static_cast<int64_t>(kStage), last - base));
    __syncthreads();  // the previous round's Gaussians are no longer read
    if (t < count) {
      const int64_t g = a.brick_list[base + t];
      Staged& e = s[t];
      for (int c = 0; c < 3; ++c) e.mu[c] = a.means[3 * g + c];
      for (int c = 0; c < 9; ++c) e.m[c] = a.transforms[9 * g + c];
      e.opacity = a.opacities[g];
      for (int c = 0; c < 3; ++c) {
        e.lo[c] = static_cast<int>(max(a.box[6 * g + 2 * c], int64_t(0)));
        e.hi[c] = static_cast<int>(min(a.box[6 * g + 2 * c + 1], static_cast<int64_t>(a.resolution - 1)));
      }
    }
    __syncthreads();
    if (!inside) continue;
    for (int e = 0; e < count; ++e) {
      const Staged& g = s[e];
      if (i < g.lo[0] || i > g.hi[0] || j < g.lo[1] || j > g.hi[1] || k < g.lo[2] || k > g.hi[2]) continue;
      const double* m = g.m;
      const double dx = __dsub_rn(xi, g.mu[0]), dy = __dsub_rn(yj, g.mu[1]), dz = __dsub_rn(zk, g.mu[2]);
      const double b0 = __dadd_rn(__dmul_rn(m[0], dx), __dmul_rn(m[1], dy));
      const double b1 = __dadd_rn(__dmul_rn(m[3], dx), __dmul_rn(m[4], dy));
      const double b2 = __dadd_rn(__dmul_rn(m[6], dx), __dmul_rn(m[7], dy));
      const double u0 = __dadd_rn(b0, __dmul_rn(m[2], dz));
      const double u1 = __dadd_rn(b1, __dmul_rn(m[5], dz));
      const double u2 = __dadd_rn(b2, __dmul_rn(m[8], dz));
      const double q = __dadd_rn(__dadd_rn(__dmul_rn(u0, u0), __dmul_rn(u1, u1)), __dmul_rn(u2, u2));
      if (!(q <= a.limit)) continue;
      // exp in float64 rounded once: the correctly rounded float exponential in all but rare ties
      const float x = __fmul_rn(-0.5f, __double2float_rn(q));
      acc = __fadd_rn(acc, __fmul_rn(g.opacity, __double2float_rn(exp(static_cast<double>(x)))));
    }
  }
  if (inside) *cell = acc;
}

}  // namespace

cudaError_t launch_field_gather(const GatherArgs& a, cudaStream_t stream) {
  const int64_t blocks = static_cast<int64_t>(a.bricks) * a.bricks * a.bricks;
  if (a.n == 0 || blocks == 0) return cudaSuccess;
  field_gather_kernel<<<static_cast<unsigned>(blocks), kThreads, 0, stream>>>(a);
  return cudaGetLastError();
}

}  // namespace microdreamer
