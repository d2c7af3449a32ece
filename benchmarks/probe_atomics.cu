// Throughput of global float atomics (red.global.add) on the GPU, by how a warp's addresses fall on the L2's
// lines: the cost model behind the scatter kernel's limits (benchmarks/NOTES_fields.md, round 11). Standalone:
//
//     nvcc -arch=sm_90 -O3 -o /tmp/probe_atomics benchmarks/probe_atomics.cu && /tmp/probe_atomics > probe.json
//
// Every mode adds 1e-6 to a 128^3 float grid (8 MB, the 128^3 field) from 132 x 8 blocks of 256 threads, 200
// atomics per thread; the time is the third of three runs (CUDA events). Prints one JSON object.
#include <cstdint>
#include <cstdio>

#include <cuda_runtime.h>

namespace {

__device__ __forceinline__ uint32_t hash32(uint32_t x) {
  x ^= x >> 16;
  x *= 0x7feb352dU;
  x ^= x >> 15;
  x *= 0x846ca68bU;
  x ^= x >> 16;
  return x;
}

__device__ __forceinline__ void red4(float* p, float a) {
  asm volatile("red.global.add.v4.f32 [%0], {%1, %1, %1, %1};" ::"l"(p), "f"(a) : "memory");
}

constexpr int kModes = 9;
const char* kNames[kModes] = {
    "v4, each lane a random 16-byte slot",
    "scalar, each lane a random slot",
    "v4, a warp on 32 consecutive slots (4 lines of 128 bytes)",
    "v4, a warp's 32 lanes on one slot",
    "v4, lane pairs on one 32-byte sector, sectors random",
    "scalar, 8 lanes on one 32-byte sector (consecutive words), sectors random",
    "v4, 4 lanes on one 64-byte half line, half lines random",
    "v4, one lane both halves of a random sector, two instructions",
    "scalar, a warp on one 128-byte line (consecutive words), lines random",
};

// slots: 16-byte slots of the buffer
__global__ void probe(float* buf, uint32_t slots, int iters, int mode) {
  const uint32_t t = blockIdx.x * blockDim.x + threadIdx.x;
  const uint32_t warp = t >> 5, lane = t & 31;
  for (int i = 0; i < iters; ++i) {
    const uint32_t wr = hash32(warp * 131u + i * 7919u);
    const uint32_t tr = hash32(t * 977u + i * 7919u);
    switch (mode) {
      case 0: red4(buf + 4 * (tr % slots), 1e-6f); break;
      case 1: atomicAdd(buf + 4 * (tr % slots), 1e-6f); break;
      case 2: red4(buf + 4 * ((wr % (slots / 32)) * 32 + lane), 1e-6f); break;
      case 3: red4(buf + 4 * (wr % slots), 1e-6f); break;
      case 4: red4(buf + 4 * ((hash32((t >> 1) * 977u + i * 7919u) % (slots / 2)) * 2 + (lane & 1)), 1e-6f); break;
      case 5: atomicAdd(buf + 8 * (hash32((t >> 3) * 977u + i * 7919u) % (slots / 2)) + (lane & 7), 1e-6f); break;
      case 6: red4(buf + 4 * ((hash32((t >> 2) * 977u + i * 7919u) % (slots / 4)) * 4 + (lane & 3)), 1e-6f); break;
      case 7: {
        float* p = buf + 8 * (tr % (slots / 2));
        red4(p, 1e-6f);
        red4(p + 4, 1e-6f);
        break;
      }
      default: atomicAdd(buf + 32 * (wr % (slots / 8)) + lane, 1e-6f); break;
    }
  }
}

}  // namespace

int main() {
  const uint32_t words = 128u * 128u * 128u;
  float* buf = nullptr;
  if (cudaMalloc(&buf, words * sizeof(float)) != cudaSuccess) return 1;
  cudaMemset(buf, 0, words * sizeof(float));
  cudaDeviceProp prop{};
  cudaGetDeviceProperties(&prop, 0);
  int clock_khz = 0;
  cudaDeviceGetAttribute(&clock_khz, cudaDevAttrClockRate, 0);
  cudaEvent_t a, b;
  cudaEventCreate(&a);
  cudaEventCreate(&b);
  const int blocks = prop.multiProcessorCount * 8, threads = 256, iters = 200;
  printf("{\"command\": \"nvcc -arch=sm_90 -O3 -o /tmp/probe_atomics benchmarks/probe_atomics.cu && /tmp/probe_atomics\",\n");
  printf(" \"hardware\": {\"gpu\": \"%s\", \"sm_count\": %d, \"max_clock_MHz\": %d},\n", prop.name, prop.multiProcessorCount,
         clock_khz / 1000);
  printf(" \"atomics_per_run\": %.0f,\n \"modes\": [\n", double(blocks) * threads * iters);
  for (int mode = 0; mode < kModes; ++mode) {
    float ms = 0.f;
    for (int rep = 0; rep < 3; ++rep) {
      cudaEventRecord(a);
      probe<<<blocks, threads>>>(buf, words / 4, iters, mode);
      cudaEventRecord(b);
      cudaEventSynchronize(b);
      cudaEventElapsedTime(&ms, a, b);
    }
    const double n = double(blocks) * threads * iters * (mode == 7 ? 2 : 1);
    printf("  {\"mode\": %d, \"what\": \"%s\", \"ms\": %.4f, \"atomics_per_s\": %.4g}%s\n", mode, kNames[mode], ms,
           n / (ms * 1e-3), mode + 1 < kModes ? "," : "");
  }
  printf(" ],\n \"error\": \"%s\"}\n", cudaGetErrorString(cudaGetLastError()));
  cudaFree(buf);
  return 0;
}
