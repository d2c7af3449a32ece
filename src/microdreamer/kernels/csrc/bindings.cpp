// Python bindings of the density-field and carving kernels (input checks, workspace, binning and chunking on
// the host side, launches on the current stream, every launch checked).
#include <algorithm>
#include <cstdint>
#include <tuple>
#include <vector>

#include <c10/cuda/CUDAStream.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <torch/extension.h>

#include "carve.h"
#include "fields.h"
#include "gather.h"

namespace {

using microdreamer::kParamWords;
using microdreamer::kPreciseWords;

std::string sizes_of(const at::Tensor& t) {
  std::string s = "[";
  for (int64_t d = 0; d < t.dim(); ++d) s += (d ? ", " : "") + std::to_string(t.size(d));
  return s + "]";
}

void check_tensor(const at::Tensor& t, const char* name, at::ScalarType dtype, const at::Device& device) {
  TORCH_CHECK(t.device() == device, name, " must be on ", device, ", got ", t.device());
  TORCH_CHECK(t.scalar_type() == dtype, name, " must be ", dtype, ", got ", t.scalar_type());
  TORCH_CHECK(t.is_contiguous(), name, " must be contiguous (sizes ", sizes_of(t), ")");
}

void check_shape(const at::Tensor& t, const char* name, std::vector<int64_t> shape) {
  bool ok = t.dim() == static_cast<int64_t>(shape.size());
  for (size_t d = 0; ok && d < shape.size(); ++d) ok = t.size(d) == shape[d];
  std::string want = "[";
  for (size_t d = 0; d < shape.size(); ++d) want += (d ? ", " : "") + std::to_string(shape[d]);
  TORCH_CHECK(ok, name, " must have shape ", want, "], got ", sizes_of(t));
}

// A CUDA event for ordering two streams (no timing), destroyed with its scope.
struct Event {
  cudaEvent_t e = nullptr;
  void create() { C10_CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming)); }
  ~Event() {
    if (e != nullptr) cudaEventDestroy(e);
  }
};

// Makes `stream` wait for `event` when the scope ends (a return or an exception): the call's stream never runs
// ahead of work on a second stream that still uses the call's workspace and grid.
struct StreamJoin {
  cudaStream_t stream = nullptr;
  cudaEvent_t event = nullptr;
  StreamJoin() = default;
  StreamJoin(const StreamJoin&) = delete;  // a copy would wait twice, a temporary at once
  StreamJoin& operator=(const StreamJoin&) = delete;
  ~StreamJoin() {
    if (event != nullptr) cudaStreamWaitEvent(stream, event, 0);
  }
};

// One allocation for a call's scratch arrays: sections appended in order, each 16-byte aligned.
struct Workspace {
  int64_t bytes = 0;
  int64_t add(int64_t count, int64_t size) {
    const int64_t at = bytes;
    bytes += (count * size + 15) / 16 * 16;
    return at;
  }
};

// extract_fields: fills `out` ([R, R, R] float32; allocated when not given) with the density field and
// returns it.
at::Tensor extract_fields(const at::Tensor& means, const at::Tensor& opacities, const at::Tensor& transforms,
                          const at::Tensor& radii, const at::Tensor& axis, const at::Tensor& lower,
                          const at::Tensor& upper, std::optional<at::Tensor> out_opt, int64_t resolution, bool exact,
                          double cutoff_sq, double cutoff_tol, int64_t block_voxels, const std::string& impl,
                          int64_t chunks, int64_t max_list_entries, int64_t variant, int64_t list_capacity,
                          int64_t scatter_voxels, int64_t splits, int64_t split_min, bool sized_list,
                          bool scatter_precise, int64_t precise_capacity,
                          int64_t wide_capacity, bool overlap_scatter) {
  TORCH_CHECK(means.is_cuda(), "extract_fields: means must be a CUDA tensor, got ", means.device());
  const at::Device device = means.device();
  const c10::cuda::CUDAGuard guard(device);
  check_tensor(means, "means", at::kFloat, device);
  const int64_t n = means.size(0);
  check_shape(means, "means", {n, 3});
  check_tensor(opacities, "opacities", at::kFloat, device);
  check_shape(opacities, "opacities", {n});
  check_tensor(transforms, "transforms", at::kFloat, device);
  check_shape(transforms, "transforms", {n, 3, 3});
  check_tensor(radii, "radii", at::kFloat, device);
  check_shape(radii, "radii", {n, 3});
  TORCH_CHECK(resolution >= 2 && resolution <= 4096, "resolution must be in [2, 4096], got ", resolution);
  const int64_t r = resolution;
  at::Tensor out = out_opt.has_value() ? *out_opt : at::empty({r, r, r}, means.options());
  check_tensor(out, "out", at::kFloat, device);
  check_shape(out, "out", {r, r, r});
  TORCH_CHECK(n < (int64_t(1) << 31), "at most 2^31 - 1 Gaussians, got ", n);
  TORCH_CHECK(impl == "fast" || impl == "naive", "impl must be 'fast' or 'naive', got '", impl, "'");
  TORCH_CHECK(variant == 1 || variant == 2, "variant must be 1 or 2, got ", variant);
  TORCH_CHECK(scatter_voxels >= 0, "scatter_voxels must be >= 0, got ", scatter_voxels);
  TORCH_CHECK(splits >= 1 && splits <= 64, "splits must be in [1, 64], got ", splits);
  TORCH_CHECK(split_min >= 1, "split_min must be >= 1, got ", split_min);
  TORCH_CHECK(precise_capacity >= 0, "precise_capacity must be >= 0, got ", precise_capacity);
  TORCH_CHECK(wide_capacity >= 0, "wide_capacity must be >= 0, got ", wide_capacity);
  TORCH_CHECK(chunks == 1 || chunks == 2 || (chunks == 4 && exact), "chunks must be 1, 2 (or 4 in exact mode), got ",
              chunks);
  check_tensor(axis, "axis", at::kFloat, device);
  const int64_t tz = 8 * chunks;
  const int64_t ntx = (r + 15) / 16, ntz = (r + tz - 1) / tz;
  const int64_t axis_needed = std::max(ntx * 16, ntz * tz);
  TORCH_CHECK(axis.dim() == 1 && axis.size(0) >= axis_needed, "axis must have shape [>= ", axis_needed, "], got ",
              sizes_of(axis));
  if (!exact) {
    check_tensor(lower, "lower", at::kDouble, device);
    check_tensor(upper, "upper", at::kDouble, device);
    TORCH_CHECK(lower.dim() == 1 && lower.sizes() == upper.sizes() && lower.size(0) >= 1,
                "lower and upper must have one shape [B], got ", sizes_of(lower), " and ", sizes_of(upper));
    TORCH_CHECK(block_voxels >= 1 && (lower.size(0) - 1) * block_voxels < r && lower.size(0) * block_voxels >= r,
                "upstream blocks do not tile the grid: B = ", lower.size(0), ", block = ", block_voxels, ", R = ", r);
  }
  if (n == 0) return out.zero_();

  cudaStream_t stream = c10::cuda::getCurrentCUDAStream();
  const bool fast = impl == "fast";
  const int64_t nty = ntx, n_tiles = ntx * nty * ntz;
  TORCH_CHECK(n_tiles < (int64_t(1) << 31), "too many tiles: ", n_tiles);
  const bool scatter = fast && exact && scatter_voxels > 0;
  const bool precise_scatter = fast && exact && scatter_precise;
  // variant 2 with splits: the scan kernel lists the (tile, slice) work items
  const bool split = fast && variant == 2 && splits > 1 && n_tiles * microdreamer::kMaxSplits < (int64_t(1) << 31);
  int64_t capacity = std::max<int64_t>(std::min(list_capacity, max_list_entries), 1);
  // with split tiles every kernel adds into the zeroed grid, and the scatter kernels need only the setup
  // kernel's classes: they run on a second stream while the tiles are binned and evaluated
  const bool overlap = overlap_scatter && split && (scatter || precise_scatter);
  // one workspace: parameters, float64 table, tile ends, then int32 arrays: the tile counts (zeroed), the
  // split kernel's counters and work items, the tiles' list (variant 2)
  Workspace ws;
  const int64_t o_params = ws.add(n * kParamWords, sizeof(float));
  const int64_t o_precise = ws.add(n * kPreciseWords, sizeof(double));
  const int64_t o_tile_end = ws.add(fast ? n_tiles : 0, sizeof(int64_t));
  const int64_t o_counts = ws.add(fast ? n_tiles : 0, sizeof(int));
  const int64_t o_precise_count = ws.add(precise_scatter ? 1 : 0, sizeof(unsigned long long));
  const int64_t o_wide_count = ws.add(fast ? 1 : 0, sizeof(unsigned long long));
  const int64_t zeroed_bytes = ws.bytes - o_counts;
  const int64_t o_precise_items = ws.add(precise_scatter ? precise_capacity : 0, sizeof(int64_t));
  const int64_t o_wide_items = ws.add(fast ? wide_capacity : 0, sizeof(int64_t));
  const int64_t o_counters = ws.add(2, sizeof(int));
  const int64_t o_work = ws.add(split ? n_tiles * splits : 0, sizeof(int));
  const int64_t o_list = ws.add(fast && variant == 2 ? capacity : 0, sizeof(int));
  at::Tensor workspace = at::empty({ws.bytes}, means.options().dtype(at::kByte));
  char* ws_base = reinterpret_cast<char*>(workspace.data_ptr<uint8_t>());
  float* params = reinterpret_cast<float*>(ws_base + o_params);
  double* precise = reinterpret_cast<double*>(ws_base + o_precise);
  int64_t* tile_end = reinterpret_cast<int64_t*>(ws_base + o_tile_end);
  int* counts = reinterpret_cast<int*>(ws_base + o_counts);
  auto* precise_count = reinterpret_cast<unsigned long long*>(ws_base + o_precise_count);
  auto* precise_items = reinterpret_cast<int64_t*>(ws_base + o_precise_items);
  auto* wide_count = reinterpret_cast<unsigned long long*>(ws_base + o_wide_count);
  auto* wide_items = reinterpret_cast<int64_t*>(ws_base + o_wide_items);
  if (fast) C10_CUDA_CHECK(cudaMemsetAsync(counts, 0, zeroed_bytes, stream));
  // several blocks per tile (and, with overlap, the scatter kernels at the same time) add into the grid: zero it
  if (split) C10_CUDA_CHECK(cudaMemsetAsync(out.data_ptr<float>(), 0, static_cast<size_t>(r * r * r) * sizeof(float), stream));

  // the tile grid, as SetupArgs (counting) and FillArgs (listing) both carry it
  auto set_tiles = [&](auto& x) {
    x.tile_x = 16;
    x.tile_y = 16;
    x.tile_z = static_cast<int>(tz);
    x.ntx = static_cast<int>(ntx);
    x.nty = static_cast<int>(nty);
    x.ntz = static_cast<int>(ntz);
  };
  microdreamer::SetupArgs s{};
  s.means = means.data_ptr<float>();
  s.opacities = opacities.data_ptr<float>();
  s.transforms = transforms.data_ptr<float>();
  s.radii = radii.data_ptr<float>();
  s.n = n;
  s.resolution = static_cast<int>(r);
  s.exact = exact;
  s.h = 2.0 / static_cast<double>(r - 1);
  s.cutoff_sq = cutoff_sq;
  s.cutoff_tol = cutoff_tol;
  s.block_voxels = static_cast<int>(block_voxels);
  s.num_blocks_axis = exact ? 0 : static_cast<int>(lower.size(0));
  s.lower = exact ? nullptr : lower.data_ptr<double>();
  s.upper = exact ? nullptr : upper.data_ptr<double>();
  set_tiles(s);
  s.tile_counts = fast ? counts : nullptr;
  s.scatter_max_voxels = scatter ? scatter_voxels : 0;
  s.scatter_precise = precise_scatter;
  s.precise_count = precise_scatter ? precise_count : nullptr;
  s.precise_items = precise_scatter ? precise_items : nullptr;
  s.precise_capacity = precise_scatter ? precise_capacity : 0;
  s.wide_count = fast ? wide_count : nullptr;
  s.wide_items = fast ? wide_items : nullptr;
  s.wide_capacity = fast ? wide_capacity : 0;
  s.params = params;
  s.precise = precise;
  C10_CUDA_CHECK(microdreamer::launch_setup(s, stream));
  C10_CUDA_KERNEL_LAUNCH_CHECK();

  // the small Gaussians (kScatter) and the thin ones (kPreciseScatter), added after the tiled kernel has
  // written every voxel, or (overlap) on a second stream while the tiles are binned and evaluated
  auto add_scattered = [&](cudaStream_t on) {
    if (!scatter && !precise_scatter) return;
    microdreamer::ScatterArgs sa{};
    sa.params = params;
    sa.n = n;
    sa.resolution = static_cast<int>(r);
    sa.axis = axis.data_ptr<float>();
    sa.cutoff_sq = static_cast<float>(cutoff_sq);
    sa.out = out.data_ptr<float>();
    sa.vec4 = r % 4 == 0 && reinterpret_cast<uintptr_t>(sa.out) % 16 == 0 &&
              reinterpret_cast<uintptr_t>(sa.axis) % 16 == 0;
    sa.precise = precise;
    sa.cutoff_sq_d = cutoff_sq;
    sa.precise_count = precise_count;
    sa.precise_items = precise_items;
    sa.precise_capacity = precise_capacity;
    if (scatter) {
      C10_CUDA_CHECK(microdreamer::launch_scatter(sa, on));
      C10_CUDA_KERNEL_LAUNCH_CHECK();
    }
    if (precise_scatter) {
      C10_CUDA_CHECK(microdreamer::launch_precise_scatter(sa, on));
      C10_CUDA_KERNEL_LAUNCH_CHECK();
    }
  };

  Event scattered;
  StreamJoin join;  // after `scattered` and the workspace: destroyed (and waiting) before them
  if (overlap) {
    const cudaStream_t side = c10::cuda::getStreamFromPool(false, device.index()).stream();
    Event setup_done;
    setup_done.create();
    scattered.create();
    C10_CUDA_CHECK(cudaEventRecord(setup_done.e, stream));
    C10_CUDA_CHECK(cudaStreamWaitEvent(side, setup_done.e, 0));
    add_scattered(side);
    C10_CUDA_CHECK(cudaEventRecord(scattered.e, side));
    join.stream = stream;
    join.event = scattered.e;
  }

  // the binning's arguments (fill) for the tiles of z-slabs [z0, z1), whose list entries start at position
  // `base` of `list` (all tiles at once: z0 = 0, z1 = ntz, base = 0)
  auto fill_args = [&](int* list, int64_t z0, int64_t z1, int64_t base) {
    microdreamer::FillArgs f{};
    f.params = params;
    f.n = n;
    set_tiles(f);
    f.tz_begin = static_cast<int>(z0);
    f.tz_end = static_cast<int>(z1);
    f.tile_cursor = counts;
    f.tile_end = tile_end;
    f.base = base;
    f.list = list;
    f.wide_count = wide_count;
    f.wide_items = wide_items;
    f.wide_capacity = wide_capacity;
    return f;
  };
  if (fast) {
    // the tiles of the wide boxes listed by setup
    C10_CUDA_CHECK(microdreamer::launch_count_wide(fill_args(nullptr, 0, ntz, 0), stream));
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  }

  if (!fast) {
    microdreamer::NaiveArgs a{};
    a.params = params;
    a.precise = precise;
    a.n = n;
    a.resolution = static_cast<int>(r);
    a.exact = exact;
    a.axis = axis.data_ptr<float>();
    a.cutoff_sq = static_cast<float>(cutoff_sq);
    a.cutoff_sq_d = cutoff_sq;
    a.out = out.data_ptr<float>();
    C10_CUDA_CHECK(microdreamer::launch_naive(a, stream));
    C10_CUDA_KERNEL_LAUNCH_CHECK();
    return out;
  }

  // per-tile list offsets, and the split kernel's work items
  microdreamer::SplitPlan plan{};
  if (split) {
    plan.work = reinterpret_cast<int*>(ws_base + o_work);
    plan.counters = reinterpret_cast<int*>(ws_base + o_counters);
    plan.tiles = n_tiles;
    plan.capacity = capacity;
    plan.n = n;
    plan.split_min = split_min;
    plan.splits = static_cast<int>(splits);
  }
  C10_CUDA_CHECK(microdreamer::launch_scan(counts, tile_end, n_tiles, plan, stream));
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  // variant 2 with sized_list: read the number of (tile, Gaussian) entries back (one synchronisation)
  // and, where they overflow the fixed capacity, bin into a list of that size, so that no tile has to
  // scan every Gaussian (the split plan is then redone for the new capacity)
  int* v2_list = variant == 2 ? reinterpret_cast<int*>(ws_base + o_list) : nullptr;  // naive returned above
  at::Tensor grown;
  if (variant == 2 && sized_list) {
    int64_t total = 0;
    C10_CUDA_CHECK(cudaMemcpyAsync(&total, tile_end + n_tiles - 1, sizeof(int64_t), cudaMemcpyDeviceToHost, stream));
    C10_CUDA_CHECK(cudaStreamSynchronize(stream));
    if (total > capacity && total <= max_list_entries) {
      grown = at::empty({total}, means.options().dtype(at::kInt));
      v2_list = grown.data_ptr<int>();
      capacity = total;
      if (split) {
        plan.capacity = capacity;
        C10_CUDA_CHECK(microdreamer::launch_scan(counts, tile_end, n_tiles, plan, stream));
        C10_CUDA_KERNEL_LAUNCH_CHECK();
      }
    }
  }

  // the tiled kernel's arguments for the tiles of z-slabs from z0, list entries from `base` of `list`
  auto fast_args = [&](const int* list, int64_t z0, int64_t base) {
    microdreamer::FastArgs a{};
    a.params = params;
    a.precise = precise;
    a.list = list;
    a.tile_end = tile_end;
    a.base = base;
    a.tile0 = static_cast<int>(z0 * nty * ntx);
    a.ntx = static_cast<int>(ntx);
    a.nty = static_cast<int>(nty);
    a.ntz = static_cast<int>(ntz);
    a.resolution = static_cast<int>(r);
    a.axis = axis.data_ptr<float>();
    a.cutoff_sq = static_cast<float>(cutoff_sq);
    a.cutoff_sq_d = cutoff_sq;
    a.out = out.data_ptr<float>();
    a.out_aligned = reinterpret_cast<uintptr_t>(a.out) % 16 == 0;
    a.splits = 1;
    a.split_min = split_min;
    return a;
  };
  if (variant == 2) {
    // one list of fixed capacity for all tiles (unless sized_list grew it above): no host read of the
    // sizes, so the call is a fixed sequence of asynchronous launches; tiles whose entries do not fit
    // scan every Gaussian
    const microdreamer::FillArgs f = fill_args(v2_list, 0, ntz, 0);
    C10_CUDA_CHECK(microdreamer::launch_fill_bounded(f, capacity, stream));
    C10_CUDA_KERNEL_LAUNCH_CHECK();
    microdreamer::FastArgs a = fast_args(v2_list, 0, 0);
    if (split) {  // the grid was zeroed before the setup kernel
      a.splits = static_cast<int>(splits);
      a.work = plan.work;
      a.counters = plan.counters;
      a.always_add = overlap;
    }
    C10_CUDA_CHECK(microdreamer::launch_fast_v2(a, exact, static_cast<int>(chunks), static_cast<int>(n_tiles), capacity,
                                                n, stream));
    C10_CUDA_KERNEL_LAUNCH_CHECK();
    if (!overlap) add_scattered(stream);  // else `join` makes the call's stream wait for the second one
    return out;
  }
  // variant 1: the host reads the entries per z-slab of tiles to size and chunk the lists (a sync)
  at::Tensor slab_end = workspace.narrow(0, o_tile_end, n_tiles * static_cast<int64_t>(sizeof(int64_t)))
                           .view(at::kLong)
                           .view({ntz, nty * ntx})
                           .select(1, nty * ntx - 1)
                           .cpu();  // synchronises
  const int64_t* se = slab_end.data_ptr<int64_t>();
  std::vector<std::pair<int64_t, int64_t>> slabs;  // [z0, z1) chunks of z-slabs
  int64_t largest = 0;
  for (int64_t z0 = 0; z0 < ntz;) {
    const int64_t base = z0 == 0 ? 0 : se[z0 - 1];
    int64_t z1 = z0 + 1;
    while (z1 < ntz && se[z1] - base <= max_list_entries) ++z1;
    largest = std::max(largest, se[z1 - 1] - base);
    slabs.emplace_back(z0, z1);
    z0 = z1;
  }
  at::Tensor list_t = at::empty({std::max<int64_t>(largest, 1)}, means.options().dtype(at::kInt));
  int* list = list_t.data_ptr<int>();
  for (const auto& [z0, z1] : slabs) {
    const int64_t base = z0 == 0 ? 0 : se[z0 - 1];
    const microdreamer::FillArgs f = fill_args(list, z0, z1, base);
    if (se[z1 - 1] - base > 0) {
      C10_CUDA_CHECK(microdreamer::launch_fill(f, stream));
      C10_CUDA_KERNEL_LAUNCH_CHECK();
    }
    const microdreamer::FastArgs a = fast_args(list, z0, base);
    C10_CUDA_CHECK(microdreamer::launch_fast(a, exact, static_cast<int>(chunks),
                                             static_cast<int>((z1 - z0) * nty * ntx), stream));
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  }
  add_scattered(stream);
  return out;
}

// carve_alpha: adds the fixed-point log-transmittance terms of N Gaussians in D directions to `sums`
// ([D, U * V] int64, two's complement), in place.
void carve_alpha(const at::Tensor& precision, const at::Tensor& offset, const at::Tensor& box,
                 const at::Tensor& opacity, at::Tensor& sums, int64_t v_size) {
  const at::Device device = sums.device();
  TORCH_CHECK(device.is_cuda(), "sums must be a CUDA tensor, got ", device);
  const int64_t d = precision.size(0), n = opacity.size(0);
  check_tensor(opacity, "opacity", at::kFloat, device);
  check_shape(opacity, "opacity", {n});
  check_tensor(precision, "precision", at::kFloat, device);
  check_shape(precision, "precision", {d, n, 3});
  check_tensor(offset, "offset", at::kFloat, device);
  check_shape(offset, "offset", {d, n, 2});
  check_tensor(box, "box", at::kInt, device);
  check_shape(box, "box", {d, n, 4});
  check_tensor(sums, "sums", at::kLong, device);
  TORCH_CHECK(sums.dim() == 2 && sums.size(0) == d, "sums must have shape [", d, ", U * V], got ", sizes_of(sums));
  TORCH_CHECK(v_size > 0 && sums.size(1) % v_size == 0, "v_size ", v_size, " must divide sums' rows of ",
              sums.size(1));
  if (n == 0 || d == 0) return;
  const c10::cuda::CUDAGuard guard(device);
  microdreamer::CarveArgs a;
  a.precision = precision.data_ptr<float>();
  a.offset = offset.data_ptr<float>();
  a.box = box.data_ptr<int32_t>();
  a.opacity = opacity.data_ptr<float>();
  a.n = n;
  a.directions = d;
  a.image_stride = sums.size(1);
  a.v_size = static_cast<int>(v_size);
  a.sums = reinterpret_cast<unsigned long long*>(sums.data_ptr<int64_t>());
  C10_CUDA_CHECK(microdreamer::launch_carve_alpha(a, c10::cuda::getCurrentCUDAStream(device.index()).stream()));
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

// field_gather: adds the exact field of N Gaussians to `out` ([R, R, R] float32), each voxel's terms gathered
// in the order of its brick's list (microdreamer.kernels.field_gather).
void field_gather(const at::Tensor& means, const at::Tensor& transforms, const at::Tensor& opacities,
                  const at::Tensor& box, const at::Tensor& axis, double limit, at::Tensor& out,
                  const at::Tensor& brick_start, const at::Tensor& brick_list) {
  const at::Device device = out.device();
  TORCH_CHECK(device.is_cuda(), "field_gather: out must be a CUDA tensor, got ", device);
  const int64_t n = means.size(0), r = axis.size(0);
  check_tensor(means, "means", at::kDouble, device);
  check_shape(means, "means", {n, 3});
  check_tensor(transforms, "transforms", at::kDouble, device);
  check_shape(transforms, "transforms", {n, 3, 3});
  check_tensor(opacities, "opacities", at::kFloat, device);
  check_shape(opacities, "opacities", {n});
  check_tensor(box, "box", at::kLong, device);
  check_shape(box, "box", {n, 3, 2});
  check_tensor(axis, "axis", at::kDouble, device);
  check_shape(axis, "axis", {r});
  check_tensor(out, "out", at::kFloat, device);
  check_shape(out, "out", {r, r, r});
  TORCH_CHECK(r <= 4096, "field_gather: at most 4096 points a side, got ", r);
  TORCH_CHECK(n < (int64_t(1) << 31), "field_gather: at most 2^31 - 1 Gaussians, got ", n);
  const int64_t bricks = (r + microdreamer::kBrick - 1) / microdreamer::kBrick;
  check_tensor(brick_start, "brick_start", at::kLong, device);
  check_shape(brick_start, "brick_start", {bricks * bricks * bricks + 1});
  check_tensor(brick_list, "brick_list", at::kInt, device);
  TORCH_CHECK(brick_list.dim() == 1, "brick_list must have shape [M], got ", sizes_of(brick_list));
  if (n == 0 || r == 0) return;
  const c10::cuda::CUDAGuard guard(device);
  microdreamer::GatherArgs a;
  a.means = means.data_ptr<double>();
  a.transforms = transforms.data_ptr<double>();
  a.opacities = opacities.data_ptr<float>();
  a.box = box.data_ptr<int64_t>();
  a.axis = axis.data_ptr<double>();
  a.brick_start = brick_start.data_ptr<int64_t>();
  a.brick_list = brick_list.data_ptr<int32_t>();
  a.n = n;
  a.resolution = static_cast<int>(r);
  a.bricks = static_cast<int>(bricks);
  a.limit = limit;
  a.out = out.data_ptr<float>();
  C10_CUDA_CHECK(microdreamer::launch_field_gather(a, c10::cuda::getCurrentCUDAStream(device.index()).stream()));
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("extract_fields", &extract_fields, "density field on a grid (see microdreamer.kernels.extract_fields)");
  m.def("field_gather", &field_gather, "the exact field as a deterministic gather (see microdreamer.kernels.field_gather)");
  m.def("carve_alpha", &carve_alpha, "silhouette carving's projected alpha (see microdreamer.kernels.carve_alpha)");
}
