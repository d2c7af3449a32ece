// Back-projection bake on the CPU: each texel's colour from c views, added to its running sums (C ABI,
// loaded with ctypes by microdreamer.kernels._cpu_backend; the wrapper microdreamer.kernels.cpu.bake_accumulate
// checks every input).
//
// The same tests and float32 arithmetic as the PyTorch path (microdreamer.texture.bake._accumulate_texels and
// _pair_colours, whose docstrings state the rules), one (view, texel) pair at a time instead of [c, T]
// tensors: the pair counts if the texel faces the camera (cos > cos_threshold and cos > 0), lies in front
// of it (z > near), projects inside the image, and at each of the four pixels of its bilinear lookup the
// mesh depth is within z * (depth_eps + 1.5 * tan / |fy|) of z (+inf, uncovered, never is); then the
// looked-up premultiplied rgba must have a >= min_alpha and a > 0, and the pair adds weight * rgb / a to
// num and weight = a * exp(cos_power * log(cos)) to den. The scalars are rounded to float32 as PyTorch
// does when it compares or combines a float32 tensor with a Python number. Every texel sums its views in
// view order into a local sum added to num and den once, as the PyTorch path adds its sum over the views:
// one call covers texels [t_begin, t_end), so threads that own disjoint ranges write disjoint texels.
#include <algorithm>
#include <cmath>
#include <cstdint>

namespace {

// One row of R p, products added left to right: how the PyTorch path computes the [c, T] camera-space
// points (microdreamer.fixed_order.transform_points, elementwise, never the BLAS), so the pixel
// coordinates, and the pixels a lookup takes, are the reference's to the bit (a different order moves
// them by an ulp, which shifts a bilinear lookup between two unrelated pixels by ~1e-5 of their
// difference at 64 pixels). Built with -ffp-contract=off: nothing is fused into a multiply-add.
inline float row_dot(const float* r, float px, float py, float pz) {
  return (r[0] * px + r[1] * py) + r[2] * pz;
}

struct View {
  float r[9], t[3];         // world -> camera: R p + t
  float centre[3];          // camera centre in world space: -R^T t
  float fx, fy, cx, cy;     // intrinsics (pixels)
  const float* rgba;        // [H W, 4] premultiplied colour and alpha
  const float* depth;       // [H W] mesh depth, +inf where uncovered
};

}  // namespace

extern "C" int64_t md_bake_accumulate(int64_t t_begin, int64_t t_end,
                                      const float* points,    // [T, 3] texel surface points
                                      const float* normals,   // [T, 3] unit face normals
                                      int64_t c,
                                      const float* viewmats,  // [c, 4, 4] world -> camera
                                      const float* ks,        // [c, 3, 3] intrinsics
                                      int64_t height, int64_t width,
                                      double near_d,
                                      const float* rgba,      // [c H W, 4]
                                      const float* depth,     // [c H W]
                                      double cos_threshold_d, double cos_power_d, double min_alpha_d,
                                      double depth_eps_d,
                                      float* num,             // [T, 3] added to
                                      float* den) {           // [T] added to
  if (c <= 0 || t_end <= t_begin) return 0;
  const float near_ = static_cast<float>(near_d), cos_threshold = static_cast<float>(cos_threshold_d);
  const float cos_power = static_cast<float>(cos_power_d), min_alpha = static_cast<float>(min_alpha_d);
  const float depth_eps = static_cast<float>(depth_eps_d);
  const float x_max = static_cast<float>(width - 1), y_max = static_cast<float>(height - 1);
  const int64_t x0_max = std::max<int64_t>(width - 2, 0), y0_max = std::max<int64_t>(height - 2, 0);
  const int64_t pixels = height * width;

  constexpr int64_t kMaxViews = 64;  // views per call on the stack; more are done in chunks
  View views[kMaxViews];
  for (int64_t v0 = 0; v0 < c; v0 += kMaxViews) {
    const int64_t nv = std::min(kMaxViews, c - v0);
    for (int64_t v = 0; v < nv; ++v) {
      const float* m = viewmats + 16 * (v0 + v);
      const float* k = ks + 9 * (v0 + v);
      View& w = views[v];
      for (int i = 0; i < 3; ++i) {
        for (int j = 0; j < 3; ++j) w.r[3 * i + j] = m[4 * i + j];
        w.t[i] = m[4 * i + 3];
      }
      for (int j = 0; j < 3; ++j)  // -R^T t, products added left to right as fixed_order.matmul
        w.centre[j] = -((w.r[j] * w.t[0] + w.r[3 + j] * w.t[1]) + w.r[6 + j] * w.t[2]);
      w.fx = k[0];
      w.fy = k[4];
      w.cx = k[2];
      w.cy = k[5];
      w.rgba = rgba + 4 * (v0 + v) * pixels;
      w.depth = depth + (v0 + v) * pixels;
    }
    for (int64_t ti = t_begin; ti < t_end; ++ti) {
      const float px = points[3 * ti], py = points[3 * ti + 1], pz = points[3 * ti + 2];
      const float nx = normals[3 * ti], ny = normals[3 * ti + 1], nz = normals[3 * ti + 2];
      float s_r = 0.0f, s_g = 0.0f, s_b = 0.0f, s_w = 0.0f;
      for (int64_t v = 0; v < nv; ++v) {
        const View& w = views[v];
        // facing: cos = n . (centre - p) / |centre - p|
        const float dx = w.centre[0] - px, dy = w.centre[1] - py, dz = w.centre[2] - pz;
        const float len = std::sqrt((dx * dx + dy * dy) + dz * dz);  // as fixed_order.norm
        const float cos = ((nx * dx + ny * dy) + nz * dz) / std::max(len, 1e-12f);
        if (!(cos > cos_threshold && cos > 0.0f)) continue;
        const float z = row_dot(w.r + 6, px, py, pz) + w.t[2];
        if (!(z > near_)) continue;
        const float zs = std::max(z, 1e-9f);
        const float cx_ = row_dot(w.r, px, py, pz) + w.t[0];
        const float cy_ = row_dot(w.r + 3, px, py, pz) + w.t[1];
        const float x = w.fx * cx_ / zs + w.cx - 0.5f;  // continuous pixel index (centres at integers)
        const float y = w.fy * cy_ / zs + w.cy - 0.5f;
        if (!(x >= 0.0f && y >= 0.0f && x <= x_max && y <= y_max)) continue;
        const int64_t x0 = std::min(static_cast<int64_t>(std::floor(x)), x0_max);
        const int64_t y0 = std::min(static_cast<int64_t>(std::floor(y)), y0_max);
        const float fx = std::min(std::max(x - static_cast<float>(x0), 0.0f), 1.0f);
        const float fy = std::min(std::max(y - static_cast<float>(y0), 0.0f), 1.0f);
        // depth tolerance: the surface's depth change over 1.5 pixels at this slope, plus depth_eps
        const float cpos = std::max(cos, 1e-6f);
        const float tan = std::sqrt(std::max(1.0f - cpos * cpos, 0.0f)) / cpos;
        const float tol = z * (depth_eps + 1.5f * tan / std::fabs(w.fy));
        const int64_t base = y0 * width + x0;
        const int64_t x1 = std::min(x0 + 1, width - 1) - x0;
        const int64_t y1 = (std::min(y0 + 1, height - 1) - y0) * width;
        const int64_t pix[4] = {base, base + x1, base + y1, base + y1 + x1};
        bool visible = true;
        for (int q = 0; q < 4; ++q) visible = visible && std::fabs(w.depth[pix[q]] - z) <= tol;
        if (!visible) continue;
        const float wts[4] = {(1 - fx) * (1 - fy), fx * (1 - fy), (1 - fx) * fy, fx * fy};
        float sample[4] = {0.0f, 0.0f, 0.0f, 0.0f};
        for (int q = 0; q < 4; ++q) {
          const float* s = w.rgba + 4 * pix[q];
          for (int ch = 0; ch < 4; ++ch) sample[ch] += wts[q] * s[ch];
        }
        const float a = sample[3];
        if (!(a >= min_alpha && a > 0.0f)) continue;
        const float weight = a * std::exp(cos_power * std::log(cpos));
        const float a_safe = std::max(a, 1e-12f);
        s_r += weight * (sample[0] / a_safe);
        s_g += weight * (sample[1] / a_safe);
        s_b += weight * (sample[2] / a_safe);
        s_w += weight;
      }
      num[3 * ti] += s_r;
      num[3 * ti + 1] += s_g;
      num[3 * ti + 2] += s_b;
      den[ti] += s_w;
    }
  }
  return 0;
}
