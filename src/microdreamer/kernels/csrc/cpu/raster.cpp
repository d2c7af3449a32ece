// Gaussian rasteriser on the CPU, forward only (C ABI, loaded with ctypes by microdreamer.kernels._cpu_backend;
// the wrapper microdreamer.kernels.cpu.rasterize checks every input). The rules are those of the PyTorch
// reference microdreamer.render._torch_raster (gsplat's "classic" kernel), whose module docstring states them.
//
// One call renders the tile rows [row_begin, row_end) of one camera from its projected Gaussians (projection,
// colours and the depth order come from PyTorch): threads that own disjoint (camera, row band) parts write
// disjoint pixels.
//
// 1. Binning. The Gaussians are visited in the camera's depth order (a stable sort by depth, so ties by index);
//    each visible one is listed in the tiles of its box whose rectangle of pixel centres meets its ellipse
//    0.5 d^T Q d <= ln(255 o) + margin (the reference's tile test, in float64): elsewhere its alpha is below
//    1/255 at every pixel. A counting sort by tile keeps the depth order inside every tile.
// 2. Compositing, per pixel, front to back: the exponent ln(o) - 0.5 d^T Q d is a quadratic in the pixel's
//    offset u from the tile centre, with the reference's float32 coefficients; alpha = min(0.999, exp(e))
//    (e floored at -30; exp to about 1 ulp, as PyTorch's vectorised one); alpha < 1/255 is skipped; the
//    pixel stops before the Gaussian that takes T to <= 1e-4; out += alpha T f for the K features and
//    alpha T for the accumulated alpha. Four pixels at a time (SSE2 lanes); a tile ends when all its
//    pixels have stopped. The results differ from the reference's by float32 rounding (the order of the
//    exponent's terms and of the sums, the exp), so only where a value sits within rounding of a threshold
//    (1/255, T = 1e-4) can a decision differ.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#ifdef __SSE2__
#include <emmintrin.h>
#endif

namespace {

// Four float lanes: SSE2 on x86-64 (part of its baseline), plain arrays elsewhere. Masks are all-ones or
// all-zero lanes, as SSE's comparisons give them.
#ifdef __SSE2__
struct F4 {
  __m128 v;
};
inline F4 splat4(float x) { return {_mm_set1_ps(x)}; }
inline F4 load4(const float* p) { return {_mm_load_ps(p)}; }
inline void store4(float* p, F4 a) { _mm_store_ps(p, a.v); }
inline F4 operator+(F4 a, F4 b) { return {_mm_add_ps(a.v, b.v)}; }
inline F4 operator-(F4 a, F4 b) { return {_mm_sub_ps(a.v, b.v)}; }
inline F4 operator*(F4 a, F4 b) { return {_mm_mul_ps(a.v, b.v)}; }
inline F4 min4(F4 a, F4 b) { return {_mm_min_ps(a.v, b.v)}; }
inline F4 max4(F4 a, F4 b) { return {_mm_max_ps(a.v, b.v)}; }
inline F4 ge4(F4 a, F4 b) { return {_mm_cmpge_ps(a.v, b.v)}; }
inline F4 le4(F4 a, F4 b) { return {_mm_cmple_ps(a.v, b.v)}; }
inline F4 and4(F4 a, F4 b) { return {_mm_and_ps(a.v, b.v)}; }
inline F4 andnot4(F4 a, F4 b) { return {_mm_andnot_ps(a.v, b.v)}; }  // ~a & b
inline F4 select4(F4 m, F4 a, F4 b) { return {_mm_or_ps(_mm_and_ps(m.v, a.v), _mm_andnot_ps(m.v, b.v))}; }
inline int bits4(F4 m) { return _mm_movemask_ps(m.v); }
// 2^n (n integral, -126 <= n <= 127) times p
inline F4 ldexp4(F4 p, F4 n) {
  const __m128i e = _mm_slli_epi32(_mm_add_epi32(_mm_cvtps_epi32(n.v), _mm_set1_epi32(127)), 23);
  return {_mm_mul_ps(p.v, _mm_castsi128_ps(e))};
}
inline F4 round4(F4 x) { return {_mm_cvtepi32_ps(_mm_cvtps_epi32(x.v))}; }  // to nearest (|x| < 2^31)
#else
struct F4 {
  float v[4];
};
#define MD_LANES(expr) \
  F4 r;                \
  for (int i = 0; i < 4; ++i) r.v[i] = (expr); \
  return r
inline uint32_t mask_bits(bool b) { return b ? 0xffffffffu : 0u; }
inline float from_bits(uint32_t u) { float f; std::memcpy(&f, &u, 4); return f; }
inline uint32_t to_bits(float f) { uint32_t u; std::memcpy(&u, &f, 4); return u; }
inline F4 splat4(float x) { MD_LANES(x); }
inline F4 load4(const float* p) { MD_LANES(p[i]); }
inline void store4(float* p, F4 a) { for (int i = 0; i < 4; ++i) p[i] = a.v[i]; }
inline F4 operator+(F4 a, F4 b) { MD_LANES(a.v[i] + b.v[i]); }
inline F4 operator-(F4 a, F4 b) { MD_LANES(a.v[i] - b.v[i]); }
inline F4 operator*(F4 a, F4 b) { MD_LANES(a.v[i] * b.v[i]); }
inline F4 min4(F4 a, F4 b) { MD_LANES(a.v[i] < b.v[i] ? a.v[i] : b.v[i]); }
inline F4 max4(F4 a, F4 b) { MD_LANES(a.v[i] > b.v[i] ? a.v[i] : b.v[i]); }
inline F4 ge4(F4 a, F4 b) { MD_LANES(from_bits(mask_bits(a.v[i] >= b.v[i]))); }
inline F4 le4(F4 a, F4 b) { MD_LANES(from_bits(mask_bits(a.v[i] <= b.v[i]))); }
inline F4 and4(F4 a, F4 b) { MD_LANES(from_bits(to_bits(a.v[i]) & to_bits(b.v[i]))); }
inline F4 andnot4(F4 a, F4 b) { MD_LANES(from_bits(~to_bits(a.v[i]) & to_bits(b.v[i]))); }
inline F4 select4(F4 m, F4 a, F4 b) { MD_LANES(to_bits(m.v[i]) ? a.v[i] : b.v[i]); }
inline int bits4(F4 m) {
  int r = 0;
  for (int i = 0; i < 4; ++i) r |= (to_bits(m.v[i]) >> 31) << i;
  return r;
}
inline F4 ldexp4(F4 p, F4 n) { MD_LANES(std::ldexp(p.v[i], static_cast<int>(n.v[i]))); }
inline F4 round4(F4 x) { MD_LANES(std::nearbyint(x.v[i])); }
#undef MD_LANES
#endif

// e^x for -88 < x < 88 to about 1 ulp (as PyTorch's vectorised exp): x = n ln2 + r with |r| <= ln2 / 2
// (ln2 in two parts, so r is exact), e^r by its degree-6 minimax polynomial, then scaled by 2^n.
inline F4 exp4(F4 x) {
  const F4 n = round4(x * splat4(1.44269504088896341f));
  const F4 r = x - n * splat4(0.693359375f) - n * splat4(-2.12194440e-4f);
  F4 p = splat4(1.9875691500e-4f);
  p = p * r + splat4(1.3981999507e-3f);
  p = p * r + splat4(8.3334519073e-3f);
  p = p * r + splat4(4.1665795894e-2f);
  p = p * r + splat4(1.6666665459e-1f);
  p = p * r + splat4(5.0000001201e-1f);
  p = p * (r * r) + r + splat4(1.0f);
  return ldexp4(p, n);
}

}  // namespace

namespace {

constexpr float kAlphaThreshold = 1.0f / 255.0f;
constexpr float kMaxAlpha = 0.999f;
constexpr float kTThreshold = 1e-4f;
constexpr float kSigmaMax = 30.0f;
// exponents below this give alpha < 1/255 (ln(1/255) = -5.5413) with a wide margin: skipped before exp
constexpr float kSkipExponent = -5.6f;
constexpr double kReachMargin = 1e-2;  // the reference's REACH_MARGIN: slack of the tile test on the exponent
constexpr int kMaxTile = 32;
constexpr int kMaxPixels = kMaxTile * kMaxTile;  // a multiple of 64

// floor(v) and ceil(v) clamped to [lo, hi] (in double first, so huge or far-off coordinates do not overflow)
int64_t floor_in(double v, int64_t lo, int64_t hi) {
  return static_cast<int64_t>(std::min<double>(hi, std::max<double>(lo, std::floor(v))));
}
int64_t ceil_in(double v, int64_t lo, int64_t hi) {
  return static_cast<int64_t>(std::min<double>(hi, std::max<double>(lo, std::ceil(v))));
}

struct Pair {
  int32_t tile;  // tile index inside the band
  int32_t gauss;
};

}  // namespace

extern "C" int64_t md_raster_forward(int64_t n, int64_t k, int64_t width, int64_t height, int64_t tile,
                                     const float* means2d,    // [n, 2] pixel centres of this camera
                                     const float* conics,     // [n, 3] inverse 2D covariances (xx, xy, yy)
                                     const int32_t* radii,    // [n, 2] box half-widths; 0 = culled
                                     const float* log_opac,   // [n] ln(opacity)
                                     const int64_t* order,    // [n] Gaussians by depth (stable sort)
                                     const float* feats,      // [n, k] features to composite
                                     int64_t row_begin, int64_t row_end,  // tile rows of this call
                                     float* out_feats,        // [height, width, k] of this camera
                                     float* out_alpha) {      // [height, width] of this camera
  if (tile < 1 || tile > kMaxTile || k < 0) return -1;
  const int64_t tw = (width + tile - 1) / tile;
  const int64_t th = (height + tile - 1) / tile;
  row_end = std::min(row_end, th);
  if (row_begin >= row_end || tw == 0) return 0;
  const int64_t band_rows = row_end - row_begin;
  const int64_t band_tiles = band_rows * tw;

  // ---------------------------------------------------------------- binning: (tile, Gaussian) in depth order
  std::vector<Pair> pairs;
  for (int64_t r = 0; r < n; ++r) {
    const int64_t g = order[r];
    const int32_t rx = radii[2 * g], ry = radii[2 * g + 1];
    if (rx <= 0 || ry <= 0) continue;
    const double mx = means2d[2 * g], my = means2d[2 * g + 1];
    const int64_t ty0 = floor_in((my - ry) / tile, row_begin, row_end);
    const int64_t ty1 = ceil_in((my + ry) / tile, row_begin, row_end);
    if (ty0 >= ty1) continue;
    const int64_t tx0 = floor_in((mx - rx) / tile, 0, tw);
    const int64_t tx1 = ceil_in((mx + rx) / tile, 0, tw);
    if (tx0 >= tx1) continue;
    const double a = conics[3 * g], b = conics[3 * g + 1], c = conics[3 * g + 2];
    const double det = a * c - b * b;
    // the ellipse a dx^2 + 2 b dx dy + c dy^2 <= t2: |dy| <= y_max, its leftmost point at dy = y_left
    const double t2 = 2.0 * (static_cast<double>(log_opac[g]) - std::log(1.0 / 255.0) + kReachMargin);
    if (!(a > 0) || !(det > 0) || !(t2 > 0)) continue;
    const double y_max = std::sqrt(t2 * a / det);
    const double y_left = b * std::sqrt(t2 / (c * det));
    for (int64_t ty = ty0; ty < ty1; ++ty) {
      // the band of pixel-centre offsets of this tile row
      const double y_lo = static_cast<double>(ty * tile) + 0.5 - my;
      const double y0 = std::max(y_lo, -y_max), y1 = std::min(y_lo + (tile - 1), y_max);
      if (y0 > y1) continue;
      const auto x_edge = [&](double dy, double sign) {
        return (sign * std::sqrt(std::max(0.0, a * t2 - det * dy * dy)) - b * dy) / a;
      };
      const double x_min = mx + x_edge(std::min(std::max(y_left, y0), y1), -1.0);
      const double x_max = mx + x_edge(std::min(std::max(-y_left, y0), y1), 1.0);
      const int64_t i_lo = ceil_in((x_min - (tile - 0.5)) / tile, tx0, tx1);
      const int64_t i_hi = floor_in((x_max - 0.5) / tile, tx0 - 1, tx1 - 1);
      for (int64_t tx = i_lo; tx <= i_hi; ++tx) {
        pairs.push_back({static_cast<int32_t>((ty - row_begin) * tw + tx), static_cast<int32_t>(g)});
      }
    }
  }
  // counting sort by tile (stable: each tile's list stays in depth order)
  std::vector<int64_t> start(band_tiles + 1, 0);
  for (const Pair& p : pairs) ++start[p.tile + 1];
  for (int64_t t = 0; t < band_tiles; ++t) start[t + 1] += start[t];
  std::vector<int32_t> lists(pairs.size());
  {
    std::vector<int64_t> fill(start.begin(), start.end() - 1);
    for (const Pair& p : pairs) lists[fill[p.tile]++] = p.gauss;
  }
  const int64_t n_pairs = static_cast<int64_t>(pairs.size());
  std::vector<Pair>().swap(pairs);

  // ---------------------------------------------------------------- compositing, one tile at a time
  // Per (tile, Gaussian), four pixels at a time: the exponents, and the pixels within reach
  // (exponent >= kSkipExponent) that are still live; groups with none are skipped.
  const int P = static_cast<int>(tile * tile);
  const int P4 = (P + 3) & ~3;
  alignas(16) float hu[kMaxPixels], hv[kMaxPixels], hu2[kMaxPixels], huv[kMaxPixels], hv2[kMaxPixels];
  for (int p = 0; p < P4; ++p) {
    const float u = static_cast<float>(p % tile) + 0.5f - 0.5f * static_cast<float>(tile);
    const float v = static_cast<float>(p / tile) + 0.5f - 0.5f * static_cast<float>(tile);
    hu[p] = u;
    hv[p] = v;
    hu2[p] = 0.5f * u * u;
    huv[p] = u * v;
    hv2[p] = 0.5f * v * v;
  }
  // per pixel, channel-major: transmittance, live mask (all-ones bits), k features and the alpha sum
  alignas(16) float trans[kMaxPixels], live[kMaxPixels];
  std::vector<float> acc_store(static_cast<size_t>(P4) * (k + 1) + 4);
  float* acc = acc_store.data() + ((4 - (reinterpret_cast<uintptr_t>(acc_store.data()) / 4) % 4) % 4);  // 16-byte aligned
  float ones;
  {
    const uint32_t all = 0xffffffffu;
    std::memcpy(&ones, &all, 4);
  }
  const F4 skip = splat4(kSkipExponent), floor_e = splat4(-kSigmaMax), max_alpha = splat4(kMaxAlpha);
  const F4 min_alpha = splat4(kAlphaThreshold), t_min = splat4(kTThreshold), one = splat4(1.0f);
  for (int64_t t = 0; t < band_tiles; ++t) {
    const int64_t ty = row_begin + t / tw, tx = t % tw;
    const int64_t px0 = tx * tile, py0 = ty * tile;
    int n_live = 0;
    for (int p = 0; p < P4; ++p) {
      const bool inside = p < P && px0 + p % tile < width && py0 + p / tile < height;
      live[p] = inside ? ones : 0.0f;
      n_live += inside;
      trans[p] = 1.0f;
    }
    std::fill(acc, acc + static_cast<size_t>(P4) * (k + 1), 0.0f);
    const float cx = static_cast<float>(px0) + 0.5f * static_cast<float>(tile);  // tile centre
    const float cy = static_cast<float>(py0) + 0.5f * static_cast<float>(tile);
    for (int64_t s = start[t]; s < start[t + 1] && n_live > 0; ++s) {
      const int64_t g = lists[s];
      // the reference's exponent coefficients, in its float32 operations
      const float dx = cx - means2d[2 * g], dy = cy - means2d[2 * g + 1];
      const float a = conics[3 * g], b = conics[3 * g + 1], c = conics[3 * g + 2];
      const float s0 = 0.5f * (a * dx * dx + c * dy * dy) + b * dx * dy;
      const F4 c0 = splat4(-(s0 - log_opac[g]));
      const F4 c1 = splat4(-(a * dx + b * dy)), c2 = splat4(-(b * dx + c * dy));
      const F4 A = splat4(a), B = splat4(b), C = splat4(c);
      const float* f = feats + g * k;
      for (int p = 0; p < P4; p += 4) {
        const F4 e = c0 + c1 * load4(hu + p) + c2 * load4(hv + p) - A * load4(hu2 + p) - B * load4(huv + p) -
                     C * load4(hv2 + p);
        const F4 lv = load4(live + p);
        const F4 cand = and4(ge4(e, skip), lv);
        if (bits4(cand) == 0) continue;
        const F4 alpha = min4(max_alpha, exp4(max4(e, floor_e)));
        const F4 drawn = and4(cand, ge4(alpha, min_alpha));  // alpha < 1/255 is skipped
        const F4 t_now = load4(trans + p);
        const F4 t_next = t_now * (one - alpha);
        const F4 stop = and4(drawn, le4(t_next, t_min));  // stop before this Gaussian
        const F4 add = andnot4(stop, drawn);
        if (const int stopped = bits4(stop)) {
          store4(live + p, andnot4(stop, lv));
          n_live -= __builtin_popcount(static_cast<unsigned>(stopped));
        }
        const F4 w = and4(add, alpha * t_now);
        for (int64_t j = 0; j < k; ++j) {
          float* out = acc + j * P4 + p;
          store4(out, load4(out) + w * splat4(f[j]));
        }
        float* out = acc + k * P4 + p;
        store4(out, load4(out) + w);
        store4(trans + p, select4(add, t_next, t_now));
      }
    }
    for (int p = 0; p < P; ++p) {
      const int64_t x = px0 + p % tile, y = py0 + p / tile;
      if (x >= width || y >= height) continue;
      const int64_t pix = y * width + x;
      for (int64_t j = 0; j < k; ++j) out_feats[pix * k + j] = acc[j * P4 + p];
      out_alpha[pix] = acc[k * P4 + p];
    }
  }
  return n_pairs;
}
