// UV rasterisation steps of the chart unwrap on the CPU (C ABI, loaded with ctypes by
// microdreamer.kernels._cpu_backend; the wrappers microdreamer.kernels.cpu.slab_extents, row_spans and
// run_conflicts check every input).
//
// They follow the PyTorch paths of microdreamer.texture.charts (slab_extents, row_spans, _conflicts)
// operation by operation in float64, one face at a time instead of over [faces x slabs] tensors: the same
// formulas in the same order, so the results are the same to the bit (the build turns off contraction into
// fused multiply-adds). The per-slab minima and maxima do not depend on the order they are taken in. A face
// with a non-finite coordinate covers nothing here (it has no defined integer conversion).
#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <vector>

namespace {
constexpr double kInf = std::numeric_limits<double>::infinity();
}

// One axis of slab_extents: for every face, over the unit columns [j, j + 1] of its chart that its
// x range reaches (x = uv[:, axis], y = uv[:, 1 - axis]), the lowest and highest y of the face over the
// column, min- / max-reduced into lo / hi at offset[chart] + j. lo / hi arrive filled with +inf / -inf.
extern "C" int64_t md_slab_extents(int64_t axis,
                                   const double* uv,        // [V, 2]
                                   const int64_t* faces,    // [F, 3]
                                   const int64_t* fchart,   // [F]
                                   const int64_t* size,     // [C, 2] slabs per chart (columns, rows)
                                   const int64_t* offset,   // [C] first slot of each chart on this axis
                                   int64_t f_count,
                                   double* lo, double* hi) {
  for (int64_t f = 0; f < f_count; ++f) {
    double tx[3], ty[3];
    for (int k = 0; k < 3; ++k) {
      const int64_t v = faces[3 * f + k];
      tx[k] = uv[2 * v + axis];
      ty[k] = uv[2 * v + 1 - axis];
    }
    if (!(std::isfinite(tx[0]) && std::isfinite(tx[1]) && std::isfinite(tx[2]) && std::isfinite(ty[0]) &&
          std::isfinite(ty[1]) && std::isfinite(ty[2])))
      continue;
    const int64_t c = fchart[f];
    const int64_t n = size[2 * c + axis];
    const int64_t c0 = std::max<int64_t>(static_cast<int64_t>(std::floor(std::min({tx[0], tx[1], tx[2]}))), 0);
    const int64_t c1 = std::min(
        std::max(c0, static_cast<int64_t>(std::ceil(std::max({tx[0], tx[1], tx[2]}))) - 1), n - 1);
    // the edges as lines y = y0 + slope (x - x0) over [x0, x1], ordered by x (edge k: vertex k to k + 1)
    double x0[3], x1[3], y0[3], y1[3], slope[3];
    bool vertical[3];
    for (int k = 0; k < 3; ++k) {
      const double ax = tx[k], bx = tx[(k + 1) % 3], ay = ty[k], by = ty[(k + 1) % 3];
      const bool swap = bx < ax;
      x0[k] = swap ? bx : ax;
      x1[k] = swap ? ax : bx;
      y0[k] = swap ? by : ay;
      y1[k] = swap ? ay : by;
      const double dx = x1[k] - x0[k];
      vertical[k] = dx <= 0;
      slope[k] = vertical[k] ? 0.0 : (y1[k] - y0[k]) / dx;
    }
    for (int64_t col = c0; col <= c1; ++col) {
      const double j = static_cast<double>(col);
      double ymin = kInf, ymax = -kInf;
      for (int k = 0; k < 3; ++k) {
        const double l = std::max(j, x0[k]);
        const double h = std::min(j + 1, x1[k]);
        if (!(l <= h)) continue;
        const double ya = vertical[k] ? y0[k] : y0[k] + slope[k] * (l - x0[k]);
        const double yb = vertical[k] ? y1[k] : y0[k] + slope[k] * (h - x0[k]);
        ymin = std::min(ymin, std::min(ya, yb));
        ymax = std::max(ymax, std::max(ya, yb));
      }
      const int64_t slot = offset[c] + col;
      lo[slot] = std::min(lo[slot], ymin);
      hi[slot] = std::max(hi[slot], ymax);
    }
  }
  return 0;
}

// row_spans: the texel centres strictly inside each UV triangle as runs (row, x0, x1, face), face by
// face and row by row (the PyTorch path's order). With out_row null it returns a bound on the runs (the
// rows each triangle spans, without the rows' x ranges) for sizing the outputs. Returns the number of runs,
// or -1 when more than `capacity` would be written.
extern "C" int64_t md_row_spans(const double* uv,       // [V, 2] texel coordinates
                                const int64_t* faces,   // [F, 3]
                                int64_t f_count, int64_t width, int64_t height, double margin,
                                int64_t* out_row, int64_t* out_x0, int64_t* out_x1, int64_t* out_face,
                                int64_t capacity) {
  int64_t count = 0;
  for (int64_t f = 0; f < f_count; ++f) {
    double px[3], py[3];
    for (int k = 0; k < 3; ++k) {
      const int64_t v = faces[3 * f + k];
      px[k] = uv[2 * v];
      py[k] = uv[2 * v + 1];
    }
    if (!(std::isfinite(px[0]) && std::isfinite(px[1]) && std::isfinite(px[2]) && std::isfinite(py[0]) &&
          std::isfinite(py[1]) && std::isfinite(py[2])))
      continue;
    const double ymin = std::min({py[0], py[1], py[2]}), ymax = std::max({py[0], py[1], py[2]});
    const int64_t r0 = std::max<int64_t>(static_cast<int64_t>(std::floor(ymin + margin - 0.5)) + 1, 0);
    const int64_t r1 = std::min<int64_t>(static_cast<int64_t>(std::ceil(ymax - margin - 0.5)) - 1, height - 1);
    if (r1 < r0) continue;
    if (out_row == nullptr) {
      count += r1 - r0 + 1;
      continue;
    }
    // each edge in canonical order (lower end first; on a tie in y, smaller x first)
    double lx[3], ly[3], hy[3], inv[3];
    bool usable[3];
    for (int k = 0; k < 3; ++k) {
      const double ax = px[k], ay = py[k], bx = px[(k + 1) % 3], by = py[(k + 1) % 3];
      const bool swap = (by < ay) || (by == ay && bx < ax);
      const double lox = swap ? bx : ax, loy = swap ? by : ay, hix = swap ? ax : bx, hiy = swap ? ay : by;
      const double dy = hiy - loy;
      lx[k] = lox;
      ly[k] = loy;
      hy[k] = hiy;
      usable[k] = dy > 0;
      inv[k] = usable[k] ? (hix - lox) / std::max(dy, 1e-300) : 0.0;
    }
    for (int64_t row = r0; row <= r1; ++row) {
      const double yc = static_cast<double>(row) + 0.5;
      double xl = kInf, xr = -kInf;
      for (int k = 0; k < 3; ++k) {
        if (!(usable[k] && ly[k] <= yc && yc <= hy[k])) continue;
        const double x = lx[k] + (yc - ly[k]) * inv[k];
        xl = std::min(xl, x);
        xr = std::max(xr, x);
      }
      // a row strictly inside the y range always crosses two edges; anything else (non-finite input)
      // gives no run
      if (!(std::isfinite(xl) && std::isfinite(xr))) continue;
      const int64_t x0 = std::max<int64_t>(static_cast<int64_t>(std::floor(xl + margin - 0.5)) + 1, 0);
      const int64_t x1 = std::min<int64_t>(static_cast<int64_t>(std::ceil(xr - margin - 0.5)) - 1, width - 1);
      if (x0 > x1) continue;
      if (count >= capacity) return -1;
      out_row[count] = row;
      out_x0[count] = x0;
      out_x1[count] = x1;
      out_face[count] = f;
      ++count;
    }
  }
  return count;
}

// _conflicts: pairs of faces whose runs share a texel centre. The runs are ordered by (row, x0), ties
// in their given order (the PyTorch path's stable sort), and each run is paired with the run that reaches
// farthest right among those before it on its row (the last of equals, as torch.cummax takes it) when
// that reach is at or past the run's start. Writes (fa, fb) in that order; returns the number of pairs.
// `order` is scratch space of P entries.
extern "C" int64_t md_run_conflicts(const int64_t* row, const int64_t* x0, const int64_t* x1,
                                   const int64_t* face, int64_t p_count, int64_t height,
                                   int64_t* order, int64_t* start,  // [P], [height + 1] scratch
                                   int64_t* out_a, int64_t* out_b) {
  // the runs in (row, x0) order, ties in input order: a stable counting sort by x0 and then one by row
  // where the starts span a range of the order of the runs' count (a grid's width), else the counting
  // sort by row and a stable sort by x0 within each row
  std::fill(start, start + height + 1, 0);
  for (int64_t i = 0; i < p_count; ++i) ++start[row[i] + 1];
  for (int64_t r = 0; r < height; ++r) start[r + 1] += start[r];
  std::vector<int64_t> next(start, start + height);
  const auto [lo, hi] = std::minmax_element(x0, x0 + p_count);
  const int64_t x_min = *lo;
  const uint64_t span = static_cast<uint64_t>(*hi) - static_cast<uint64_t>(x_min);
  if (span <= 4 * static_cast<uint64_t>(p_count) + 4096) {
    std::vector<int64_t> at_x(static_cast<size_t>(span) + 2, 0);
    for (int64_t i = 0; i < p_count; ++i) ++at_x[x0[i] - x_min + 1];
    for (size_t k = 1; k < at_x.size(); ++k) at_x[k] += at_x[k - 1];
    std::vector<int64_t> by_x(static_cast<size_t>(p_count));
    for (int64_t i = 0; i < p_count; ++i) by_x[at_x[x0[i] - x_min]++] = i;
    for (const int64_t i : by_x) order[next[row[i]]++] = i;
  } else {
    for (int64_t i = 0; i < p_count; ++i) order[next[row[i]]++] = i;
    for (int64_t r = 0; r < height; ++r)
      std::stable_sort(order + start[r], order + start[r + 1],
                       [x0](int64_t u, int64_t v) { return x0[u] < x0[v]; });
  }
  int64_t count = 0;
  for (int64_t r = 0; r < height; ++r) {
    const int64_t* a = order + start[r];
    const int64_t* b = order + start[r + 1];
    int64_t reach = -1, arg = -1;
    for (const int64_t* it = a; it != b; ++it) {
      const int64_t i = *it;
      if (it != a && reach >= x0[i]) {
        out_a[count] = face[arg];
        out_b[count] = face[i];
        ++count;
      }
      if (x1[i] >= reach) {
        reach = x1[i];
        arg = i;
      }
    }
  }
  return count;
}
