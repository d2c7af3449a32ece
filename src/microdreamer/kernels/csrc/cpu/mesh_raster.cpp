// Mesh depth raster on the CPU: the depth test of microdreamer.render.mesh.rasterize_depth (C ABI, loaded
// with ctypes by microdreamer.kernels._cpu_backend; the wrapper microdreamer.kernels.cpu.raster_depth checks
// every input).
//
// The coverage rules and float32 arithmetic of the PyTorch path (render/mesh.py: _valid_faces,
// _canonical_edges, _rasterize_pairs, _perspective), one (camera, face) pair at a time over the pixels of
// its bounding box: a face is skipped if any vertex has z <= near, all have z >= far, its doubled projected
// area is at most 1e-10 in magnitude, or (cull) it faces away from the camera; it covers a pixel when every
// edge function, evaluated with the edge's end points in canonical order (smaller vertex index first), is
// >= 0 at the pixel centre; its depth there is the perspective-correct 1 / sum(lin_k / z_k), kept in
// [near, far]; the pixel keeps the smallest. The projected vertices come from the PyTorch path's own
// projection (passed in), so every value here is the same sequence of IEEE float32 operations on the same
// inputs. One call covers cameras [c_begin, c_end): threads that own disjoint cameras write disjoint pixels.
#include <algorithm>
#include <cmath>
#include <cstdint>

extern "C" int64_t md_raster_depth(int64_t c_begin, int64_t c_end,
                                   const float* pix,      // [C, V, 2] pixel coordinates
                                   const float* cam,      // [C, V, 3] camera-space points
                                   int64_t v_count,
                                   const int64_t* faces,  // [F, 3]
                                   int64_t f_count, int64_t height, int64_t width,
                                   double near_d, double far_d, int64_t cull,
                                   float* zbuf) {         // [C, H, W] +inf where empty, min-updated
  const float near_ = static_cast<float>(near_d), far_ = static_cast<float>(far_d);
  const float min_area = static_cast<float>(1e-10);
  const float clamp_hi = static_cast<float>(std::max(width, height) + 2);
  for (int64_t c = c_begin; c < c_end; ++c) {
    const float* pc = pix + 2 * v_count * c;
    const float* cc = cam + 3 * v_count * c;
    float* zb = zbuf + height * width * c;
    for (int64_t f = 0; f < f_count; ++f) {
      const int64_t vid[3] = {faces[3 * f], faces[3 * f + 1], faces[3 * f + 2]};
      float px[3], py[3], z[3];
      for (int k = 0; k < 3; ++k) {
        px[k] = pc[2 * vid[k]];
        py[k] = pc[2 * vid[k] + 1];
        z[k] = cc[3 * vid[k] + 2];
      }
      // _valid_faces
      if (!(z[0] > near_ && z[1] > near_ && z[2] > near_)) continue;
      if (!(z[0] < far_ || z[1] < far_ || z[2] < far_)) continue;
      const float d1x = px[1] - px[0], d1y = py[1] - py[0], d2x = px[2] - px[0], d2y = py[2] - py[0];
      const float area2 = d1x * d2y - d1y * d2x;
      if (!(std::fabs(area2) > min_area)) continue;
      if (cull) {
        const float* c0 = cc + 3 * vid[0];
        const float* c1 = cc + 3 * vid[1];
        const float* c2 = cc + 3 * vid[2];
        const float ax = c1[0] - c0[0], ay = c1[1] - c0[1], az = c1[2] - c0[2];
        const float bx = c2[0] - c0[0], by = c2[1] - c0[1], bz = c2[2] - c0[2];
        const float nx = ay * bz - az * by, ny = az * bx - ax * bz, nz = ax * by - ay * bx;
        if (!(((nx * c0[0] + ny * c0[1]) + nz * c0[2]) < 0.0f)) continue;  // faces the camera at the origin
      }
      // bounding box of pixel indices: pixel x is covered only if x + 0.5 lies in [min_x, max_x]
      const float lox = std::min(std::max(std::min({px[0], px[1], px[2]}), -2.0f), clamp_hi);
      const float loy = std::min(std::max(std::min({py[0], py[1], py[2]}), -2.0f), clamp_hi);
      const float hix = std::min(std::max(std::max({px[0], px[1], px[2]}), -2.0f), clamp_hi);
      const float hiy = std::min(std::max(std::max({py[0], py[1], py[2]}), -2.0f), clamp_hi);
      const int64_t x0 = std::max<int64_t>(static_cast<int64_t>(std::ceil(lox - 0.5f)), 0);
      const int64_t y0 = std::max<int64_t>(static_cast<int64_t>(std::ceil(loy - 0.5f)), 0);
      const int64_t x1 = std::min<int64_t>(static_cast<int64_t>(std::floor(hix - 0.5f)), width - 1);
      const int64_t y1 = std::min<int64_t>(static_cast<int64_t>(std::floor(hiy - 0.5f)), height - 1);
      if (x1 < x0 || y1 < y0) continue;
      // _canonical_edges: edge k runs from vertex (k+1)%3 to (k+2)%3, start at the smaller vertex index;
      // w_k = cy_k (q_y - s_yk) - cx_k (q_x - s_xk), >= 0 inside
      const float orient = area2 > 0 ? 1.0f : -1.0f;
      float sx[3], sy[3], cx[3], cy[3];
      for (int k = 0; k < 3; ++k) {
        const int a = (k + 1) % 3, b = (k + 2) % 3;
        const bool swap = vid[a] > vid[b];
        const float sign = swap ? -1.0f : 1.0f;
        sx[k] = swap ? px[b] : px[a];
        sy[k] = swap ? py[b] : py[a];
        const float dirx = (px[b] - px[a]) * sign, diry = (py[b] - py[a]) * sign;
        const float sgn = sign * orient;
        cy[k] = sgn * dirx;
        cx[k] = sgn * diry;
      }
      for (int64_t y = y0; y <= y1; ++y) {
        const float qy = static_cast<float>(y) + 0.5f;
        const float ta[3] = {cy[0] * (qy - sy[0]), cy[1] * (qy - sy[1]), cy[2] * (qy - sy[2])};
        for (int64_t x = x0; x <= x1; ++x) {
          const float qx = static_cast<float>(x) + 0.5f;
          float w[3];
          bool inside = true;
          for (int k = 0; k < 3; ++k) {
            const float tb = cx[k] * (qx - sx[k]);
            inside = inside && ta[k] >= tb;
            w[k] = ta[k] - tb;
          }
          if (!inside) continue;
          // _perspective: screen-space barycentrics, then 1 / sum(lin_k / z_k)
          const float ws = (w[0] + w[1]) + w[2];
          const float inv_z = ((w[0] / ws) / z[0] + (w[1] / ws) / z[1]) + (w[2] / ws) / z[2];
          const float depth = 1.0f / inv_z;
          if (!(depth >= near_ && depth <= far_)) continue;
          float& out = zb[y * width + x];
          if (depth < out) out = depth;
        }
      }
    }
  }
  return 0;
}
