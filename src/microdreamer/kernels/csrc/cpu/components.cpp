// Connected components of faces over flagged edge neighbours, on the CPU (C ABI, loaded with ctypes by
// microdreamer.kernels._cpu_backend; the wrapper microdreamer.kernels.cpu.face_components checks every input).
//
// microdreamer.texture.charts.connected_components gives every face the smallest face index of its
// component (SciPy's graph search, or hooking and pointer jumping in PyTorch); this is the same result by
// union-find: a union hangs the larger root under the smaller, so every tree's root is its smallest face,
// whatever order the edges come in.
#include <cstddef>
#include <cstdint>
#include <vector>

namespace {
int64_t find(std::vector<int64_t>& parent, int64_t x) {
  while (parent[x] != x) {
    parent[x] = parent[parent[x]];  // path halving
    x = parent[x];
  }
  return x;
}
}  // namespace

// root[f] = the smallest face of f's component, where f and nbr[3 f + k] are joined when nbr[3 f + k] >= 0
// and same[3 f + k] != 0 (either direction of an edge is enough).
extern "C" int64_t md_face_components(const int64_t* nbr,   // [F, 3], -1 = no neighbour
                                      const uint8_t* same,  // [F, 3] bool
                                      int64_t f_count, int64_t* root) {
  std::vector<int64_t> parent(static_cast<size_t>(f_count));
  for (int64_t f = 0; f < f_count; ++f) parent[f] = f;
  for (int64_t f = 0; f < f_count; ++f) {
    for (int k = 0; k < 3; ++k) {
      const int64_t g = nbr[3 * f + k];
      if (g < 0 || !same[3 * f + k]) continue;
      const int64_t a = find(parent, f), b = find(parent, g);
      if (a < b)
        parent[b] = a;
      else if (b < a)
        parent[a] = b;
    }
  }
  for (int64_t f = 0; f < f_count; ++f) root[f] = find(parent, f);
  return 0;
}

// label[v] = the component of vertex v, where the vertices of each face are joined (edges v0-v1, v1-v2);
// components are numbered in the order of their smallest vertex (scipy.sparse.csgraph.connected_components'
// numbering), a vertex no face uses being a component of its own. Returns the number of components.
extern "C" int64_t md_vertex_components(const int64_t* faces,  // [F, 3], each in 0..v_count - 1
                                        int64_t f_count, int64_t v_count, int32_t* label) {
  std::vector<int64_t> parent(static_cast<size_t>(v_count));
  for (int64_t v = 0; v < v_count; ++v) parent[v] = v;
  for (int64_t f = 0; f < f_count; ++f) {
    for (int k = 0; k < 2; ++k) {
      const int64_t a = find(parent, faces[3 * f + k]), b = find(parent, faces[3 * f + k + 1]);
      if (a < b)
        parent[b] = a;
      else if (b < a)
        parent[a] = b;
    }
  }
  int64_t n = 0;
  for (int64_t v = 0; v < v_count; ++v) {
    const int64_t r = find(parent, v);  // r <= v: labelled already when r < v
    label[v] = r == v ? static_cast<int32_t>(n++) : label[r];
  }
  return n;
}
