// C entry point of the skyline packer (skyline.h) for the CPU library; the wrapper
// microdreamer.kernels.cpu.skyline_pack checks the arrays.
#include <cstdint>

#include "skyline.h"

extern "C" int64_t md_skyline_pack(const int64_t* bottom, const int64_t* top, const int64_t* col_offset,
                                   const int64_t* left, const int64_t* right, const int64_t* row_offset,
                                   const bool* turnable, int64_t charts, int64_t width, int64_t padding,
                                   int64_t orientations, int64_t* corner, int64_t* turns) {
  microdreamer::SkylineArgs a;
  a.bottom = bottom;
  a.top = top;
  a.col_offset = col_offset;
  a.left = left;
  a.right = right;
  a.row_offset = row_offset;
  a.turnable = turnable;
  a.charts = charts;
  a.width = width;
  a.padding = padding;
  a.orientations = orientations;
  a.corner = corner;
  a.turns = turns;
  return microdreamer::skyline_pack(a);
}
