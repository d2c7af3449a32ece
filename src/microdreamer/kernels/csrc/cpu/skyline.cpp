// Skyline packing of chart outlines (see skyline.h). Step for step the NumPy reference
// microdreamer.texture.charts.skyline_pack, so both give the same layout: the same order (area, then
// index), the same coarse-then-fine search of the resting column, the same scores and tie rules.
#include "skyline.h"

#include <algorithm>
#include <cstdint>
#include <limits>
#include <numeric>
#include <vector>

namespace microdreamer {

namespace {

struct Best {
  bool found = false;
  int64_t top = 0, waste = 0;  // the key: the chart's top row when placed, then the empty texels under it
  int64_t q = 0, x = 0, y = 0;
  std::vector<int64_t> t;  // the placed orientation's top profile
};

// The resting row of a profile `b` (k columns) at column x of the skyline, max_j sky[x + j] - b[j], or
// any value >= `bound` as soon as the partial maximum reaches it (the caller wants only rows below it).
inline int64_t rest_below(const int64_t* sky, const int64_t* b, int64_t k, int64_t x, int64_t bound) {
  int64_t m = std::numeric_limits<int64_t>::min();
  for (int64_t j = 0; j < k && m < bound; ++j) m = std::max(m, sky[x + j] - b[j]);
  return m;
}

// floor(a / b) for b > 0
inline int64_t floor_div(int64_t a, int64_t b) { return a / b - ((a % b != 0) && (a < 0)); }

}  // namespace

int64_t skyline_pack(const SkylineArgs& a) {
  const int64_t n = a.charts, p = a.padding, inner = a.width - 2 * a.padding;
  std::vector<int64_t> sky_ext(static_cast<size_t>(std::max<int64_t>(inner + 2 * p, 0)), p);
  int64_t* sky = sky_ext.data() + p;
  std::vector<int64_t> area(n, 0);
  for (int64_t c = 0; c < n; ++c)
    for (int64_t j = a.col_offset[c]; j < a.col_offset[c + 1]; ++j) area[c] += std::max<int64_t>(a.top[j] - a.bottom[j], 0);
  std::vector<int64_t> order(n);
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](int64_t i, int64_t j) { return area[i] > area[j]; });
  int64_t height = p;
  std::vector<int64_t> ob, ot;
  for (const int64_t c : order) {
    const int64_t* b0 = a.bottom + a.col_offset[c];
    const int64_t* t0 = a.top + a.col_offset[c];
    const int64_t* l0 = a.left + a.row_offset[c];
    const int64_t* r0 = a.right + a.row_offset[c];
    const int64_t w = a.col_offset[c + 1] - a.col_offset[c], h = a.row_offset[c + 1] - a.row_offset[c];
    const int64_t options = (a.turnable[c] && std::max(w, h) >= 4) ? (a.orientations == 4 ? 4 : 2) : 1;
    Best best;
    for (int64_t q = 0; q < options; ++q) {
      const int64_t k = (q % 2 == 0) ? w : h;
      ob.resize(k);
      ot.resize(k);
      for (int64_t j = 0; j < k; ++j) {
        if (q == 0) {
          ob[j] = b0[j], ot[j] = t0[j];
        } else if (q == 1) {  // a quarter turn: column j is row h - 1 - j
          ob[j] = l0[h - 1 - j], ot[j] = r0[h - 1 - j];
        } else if (q == 2) {
          ob[j] = h - t0[w - 1 - j], ot[j] = h - b0[w - 1 - j];
        } else {
          ob[j] = w - r0[j], ot[j] = w - l0[j];
        }
      }
      if (k > inner) continue;
      const int64_t positions = inner - k + 1;
      const int64_t stride = std::max<int64_t>(1, k / 16);
      int64_t lo = 0, hi = positions;
      if (stride > 1) {  // coarse positions first, then every position around the best of them
        int64_t best_rest = std::numeric_limits<int64_t>::max(), x = 0;
        for (int64_t s = 0; s < positions; s += stride) {
          const int64_t r = rest_below(sky, ob.data(), k, s, best_rest);
          if (r < best_rest) best_rest = r, x = s;
        }
        lo = std::max<int64_t>(0, x - stride + 1);
        hi = std::min(positions, x + stride);
      }
      const int64_t weight = k * (h + w + 2) + 1;
      int64_t best_score = std::numeric_limits<int64_t>::max(), bx = lo, brest = 0, bwaste = 0;
      for (int64_t x = lo; x < hi; ++x) {
        // score >= rest * weight (the waste is never negative): a position whose partial maximum already
        // puts it at or above the best score cannot win, and is left early
        const int64_t bound = best_score == std::numeric_limits<int64_t>::max()
                                  ? std::numeric_limits<int64_t>::max()
                                  : floor_div(best_score, weight) + 1;
        const int64_t rest = rest_below(sky, ob.data(), k, x, bound);
        if (rest >= bound) continue;
        int64_t gap_sum = 0;
        for (int64_t j = 0; j < k; ++j) gap_sum += sky[x + j] - ob[j];
        const int64_t waste = rest * k - gap_sum;
        const int64_t score = rest * weight + waste;
        if (score < best_score) best_score = score, bx = x, brest = rest, bwaste = waste;
      }
      const int64_t top = brest + *std::max_element(ot.begin(), ot.end());
      if (!best.found || top < best.top || (top == best.top && bwaste < best.waste)) {
        best.found = true;
        best.top = top, best.waste = bwaste, best.q = q, best.x = bx, best.y = brest;
        best.t = ot;
      }
    }
    if (!best.found) return -1 - c;
    const int64_t k = static_cast<int64_t>(best.t.size());
    a.corner[2 * c] = best.x + p;
    a.corner[2 * c + 1] = best.y;
    a.turns[c] = best.q;
    // the skyline rises to the top profile plus the padding, widened by the padding each side
    int64_t* seg = sky_ext.data() + best.x;
    for (int64_t shift = 0; shift <= 2 * p; ++shift)
      for (int64_t j = 0; j < k; ++j) seg[shift + j] = std::max(seg[shift + j], best.y + best.t[j] + p);
    height = std::max(height, best.top + p);
  }
  return height;
}

}  // namespace microdreamer
