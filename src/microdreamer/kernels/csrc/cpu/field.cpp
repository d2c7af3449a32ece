// Density field on the CPU: each Gaussian scattered into the voxels of its box (C ABI, loaded with ctypes by
// microdreamer.kernels._cpu_backend; the wrapper microdreamer.kernels.cpu.field_scatter checks every input).
//
// out[i, j, k] += opacity * exp(-q / 2) for every Gaussian whose voxel box holds (i, j, k) and whose
// q = |M (x - mean)|^2 <= limit there, x = (axis[i], axis[j], axis[k]). q is computed in float64 from the
// whitening transform (no expanded form, so no cancellation), the exponential and the sum in float32, the
// Gaussians in index order at every voxel. One call covers the slab x_begin <= i < x_end: threads that own
// disjoint slabs write disjoint voxels. Along k, q is a quadratic in the offset, so each (i, j) row is
// limited to the interval where it can be <= limit (widened by a voxel for rounding; every voxel in it is
// still tested exactly), and rows whose minimum is above the limit are skipped.
#include <algorithm>
#include <cmath>
#include <cstdint>

namespace {

// Scatters Gaussian g into the slab x_begin <= i < x_end: for every voxel of its box where q <= limit,
// add(row, k, e) with e = exp(-q / 2) in float32 and row the (i, j) row of r voxels (offset (i r + j) r).
template <typename Add>
inline void scatter_one(const double* mu, const double* m, const int64_t* b, const double* axis, double limit,
                        int64_t r, int64_t x_begin, int64_t x_end, Add add) {
  const int64_t i0 = std::max(b[0], x_begin), i1 = std::min(b[1], x_end - 1);
  const int64_t j0 = std::max<int64_t>(b[2], 0), j1 = std::min(b[3], r - 1);
  const int64_t k0 = std::max<int64_t>(b[4], 0), k1 = std::min(b[5], r - 1);
  if (i0 > i1 || j0 > j1 || k0 > k1) return;
  const double c0 = m[2], c1 = m[5], c2 = m[8];  // M's third column: du/dz
  const double cc = c0 * c0 + c1 * c1 + c2 * c2;
  const double h = r > 1 ? axis[1] - axis[0] : 1.0;
  for (int64_t i = i0; i <= i1; ++i) {
    const double dx = axis[i] - mu[0];
    for (int64_t j = j0; j <= j1; ++j) {
      const double dy = axis[j] - mu[1];
      const double b0 = m[0] * dx + m[1] * dy, b1 = m[3] * dx + m[4] * dy, b2 = m[6] * dx + m[7] * dy;
      // q(dz) = cc dz^2 + 2 bc dz + bb; its interval where q <= limit
      int64_t ka = k0, kb = k1;
      if (cc > 0) {
        const double bc = b0 * c0 + b1 * c1 + b2 * c2, bb = b0 * b0 + b1 * b1 + b2 * b2;
        const double disc = bc * bc - cc * (bb - limit);
        if (disc < 0) continue;
        const double s = std::sqrt(disc);
        const double lo = mu[2] + (-bc - s) / cc, hi = mu[2] + (-bc + s) / cc;
        // compared as doubles before any cast: a Gaussian far wider than the grid puts the ends beyond
        // int64's range (and a NaN keeps the whole box)
        const double first = std::floor((lo - axis[0]) / h) - 1.0, last = std::ceil((hi - axis[0]) / h) + 1.0;
        if (first > static_cast<double>(ka)) ka = first > static_cast<double>(kb) ? kb + 1 : static_cast<int64_t>(first);
        if (last < static_cast<double>(kb)) kb = last < static_cast<double>(ka) ? ka - 1 : static_cast<int64_t>(last);
      }
      const int64_t row = (i * r + j) * r;
      for (int64_t k = ka; k <= kb; ++k) {
        const double dz = axis[k] - mu[2];
        const double u0 = b0 + c0 * dz, u1 = b1 + c1 * dz, u2 = b2 + c2 * dz;
        const double q = u0 * u0 + u1 * u1 + u2 * u2;
        if (q <= limit) add(row + k, std::exp(-0.5f * static_cast<float>(q)));
      }
    }
  }
}

}  // namespace

extern "C" int64_t md_field_scatter(int64_t n,
                                    const double* means,       // [n, 3]
                                    const double* transforms,  // [n, 3, 3] row-major M
                                    const float* opacities,    // [n]
                                    const int64_t* box,        // [n, 3, 2] first, last voxel per axis
                                    const double* axis,        // [r] grid coordinates
                                    double limit,              // q above this is dropped
                                    int64_t r, int64_t x_begin, int64_t x_end,
                                    float* out) {              // [r, r, r]
  for (int64_t g = 0; g < n; ++g) {
    const float op = opacities[g];
    scatter_one(means + 3 * g, transforms + 9 * g, box + 6 * g, axis, limit, r, x_begin, x_end,
                [&](int64_t v, float e) { out[v] += op * e; });
  }
  return 0;
}

// The same terms with c weights a Gaussian ([n, c]) into c grids ([c, r, r, r]): grid ch gets exactly what
// md_field_scatter with the weights' column ch gives (one exponential per term, each product and sum as
// there), so the colour field's channels and its weight cost one pass.
extern "C" int64_t md_field_scatter_channels(int64_t n, const double* means, const double* transforms,
                                             const float* weights,  // [n, c]
                                             int64_t c, const int64_t* box, const double* axis,
                                             double limit, int64_t r, int64_t x_begin, int64_t x_end,
                                             float* out) {           // [c, r, r, r]
  const int64_t grid = r * r * r;
  for (int64_t g = 0; g < n; ++g) {
    const float* w = weights + c * g;
    scatter_one(means + 3 * g, transforms + 9 * g, box + 6 * g, axis, limit, r, x_begin, x_end,
                [&](int64_t v, float e) {
                  for (int64_t ch = 0; ch < c; ++ch) out[ch * grid + v] += w[ch] * e;
                });
  }
  return 0;
}
