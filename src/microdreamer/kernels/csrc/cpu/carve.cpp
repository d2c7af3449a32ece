// Silhouette carving's projected alpha on the CPU (C ABI; the wrapper microdreamer.kernels.cpu.carve_alpha
// checks every input). The same float32 terms as the CUDA kernel (csrc/carve.cu) and the PyTorch path
// (microdreamer.field.carve): du = iu + offset_u, q = ((a du) du + ((2 b) du) dv) + (c dv) dv, alpha =
// min(0.999, o exp(-q / 2)), kept when alpha >= 1/255; each term log1p(-alpha) rounded to a multiple of
// 2^-32 and summed in int64 (the CUDA kernel's fixed point), so the sums are exact in any order. The library
// is built with -ffp-contract=off: no multiply-add is fused, every step rounds as written. One call covers
// the directions d_begin <= k < d_end: threads that own disjoint directions write disjoint images.
#include <cmath>
#include <cstdint>

namespace {
constexpr double kCarveFixedScale = 4294967296.0;  // 2^32, as carve.h
}

extern "C" int64_t md_carve_alpha(const float* precision,  // [D, N, 3] (a, b, c), squared pixels
                                  const float* offset,     // [D, N, 2] box pixel (0, 0) minus the centre
                                  const int32_t* box,      // [D, N, 4] first (u, v), extent (u, v)
                                  const float* opacity,    // [N]
                                  int64_t n, int64_t image_stride, int64_t v_size, int64_t d_begin,
                                  int64_t d_end,
                                  int64_t* sums) {  // [D, U * V]
  const float min_alpha = 1.0f / 255.0f;
  for (int64_t k = d_begin; k < d_end; ++k) {
    int64_t* image = sums + k * image_stride;
    for (int64_t i = 0; i < n; ++i) {
      const int64_t g = k * n + i;
      const int32_t fu = box[4 * g + 0], fv = box[4 * g + 1], eu = box[4 * g + 2], ev = box[4 * g + 3];
      if (eu <= 0 || ev <= 0) continue;
      const float pa = precision[3 * g + 0], pb2 = 2.0f * precision[3 * g + 1], pc = precision[3 * g + 2];
      const float ou = offset[2 * g + 0], ov = offset[2 * g + 1];
      const float o = opacity[i];
      for (int32_t iu = 0; iu < eu; ++iu) {
        const float du = static_cast<float>(iu) + ou;
        const float qa = (pa * du) * du, bu = pb2 * du;
        int64_t* row = image + static_cast<int64_t>(fu + iu) * v_size + fv;
        for (int32_t iv = 0; iv < ev; ++iv) {
          const float dv = static_cast<float>(iv) + ov;
          const float q = (qa + bu * dv) + (pc * dv) * dv;
          const float alpha = std::fmin(o * std::exp(-0.5f * q), 0.999f);
          if (!(alpha >= min_alpha)) continue;  // also skips NaN
          row[iv] += std::llrint(static_cast<double>(std::log1p(-alpha)) * kCarveFixedScale);
        }
      }
    }
  }
  return 0;
}
