// Skyline packing of chart outlines on the host (plain C++ interface: no PyTorch, no CUDA). The NumPy
// reference with the same semantics is microdreamer.texture.charts.skyline_pack; skyline_c.cpp exports it to
// microdreamer.kernels.cpu.skyline_pack, which checks the arrays.
#pragma once

#include <cstdint>

namespace microdreamer {

struct SkylineArgs {
  const int64_t* bottom;      // [sum W_c] each chart's lowest touched row per column, chart after chart
  const int64_t* top;         // [sum W_c] one past its highest touched row per column
  const int64_t* col_offset;  // [C + 1] where chart c's columns start in bottom/top
  const int64_t* left;        // [sum H_c] first touched column per row
  const int64_t* right;       // [sum H_c] one past the last touched column per row
  const int64_t* row_offset;  // [C + 1] where chart c's rows start in left/right
  const bool* turnable;       // [C] may the chart turn
  int64_t charts = 0;         // C
  int64_t width = 0;          // the strip's width, padding included
  int64_t padding = 0;
  int64_t orientations = 2;  // 2 or 4
  int64_t* corner;            // out: [C, 2] lower-left corner of each chart's box after its turn
  int64_t* turns;             // out: [C] quarter turns counter-clockwise
};

// Packs the charts (largest area first) and returns the strip height used (one past the highest touched
// row plus the padding), or -1 - c when chart c fits across the strip in no orientation.
int64_t skyline_pack(const SkylineArgs& a);

}  // namespace microdreamer
