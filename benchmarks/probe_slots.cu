// Throughput of the tiled kernel's inner loop, the z recurrence over a lane's register accumulators, with nothing
// else around it: the measured rate behind the 512^3 floor in benchmarks/NOTES_fields.md (round 12). Standalone:
//
//     nvcc -arch=sm_90 -O3 -o /tmp/probe_slots benchmarks/probe_slots.cu && /tmp/probe_slots > probe.json
//
// A slot is one (voxel, Gaussian) evaluation of a lane: acc[k] += v; v *= r; r *= g (two multiplies and an add,
// the least a recurrence can do). Every thread owns 32 accumulators (four 8-voxel chunks, as the tiled kernel with
// chunks = 4) and runs `iters` rounds of 32 slots; 132 x 16 blocks of 256 threads keep every SM full. Modes:
//   0 plain: the three instructions, no cutoff test;
//   1 value test: acc[k] += v only where v >= thr (the tiled kernel's per-voxel test, a compare and a
//     predicated add);
//   2 value test and anchors: mode 1 with each chunk's v and r from two exponentials (ex2.approx), as the tiled
//     kernel anchors every 8-voxel chunk.
// The time is the third of three runs (CUDA events). Prints one JSON object: slots per second per mode.
#include <cstdint>
#include <cstdio>

#include <cuda_runtime.h>

namespace {

__device__ __forceinline__ float ex2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

template <int kMode>
__global__ void __launch_bounds__(256) slots(const float* in, float* out, int iters) {
  const uint32_t t = blockIdx.x * blockDim.x + threadIdx.x;
  const float g = 0.999f - 1e-4f * in[t & 1023];
  float v0 = 0.5f + 0.01f * in[(t + 1) & 1023], r0 = 1.01f + 1e-3f * in[(t + 2) & 1023];
  const float thr = 0.45f + 0.1f * in[(t + 3) & 1023];
  float a0 = -1.f - 0.01f * in[(t + 4) & 1023], b0 = 0.02f * in[(t + 5) & 1023];
  float acc[32];
#pragma unroll
  for (int k = 0; k < 32; ++k) acc[k] = 0.f;
  for (int it = 0; it < iters; ++it) {
#pragma unroll
    for (int c = 0; c < 4; ++c) {
      float v, r;
      if (kMode == 2) {
        v = ex2(a0 + 0.125f * c);
        r = ex2(b0 - 0.0625f * c);
      } else {  // a different start per chunk (one multiply each), so that no chunk repeats another's products
        v = v0 * (1.f + 0.01f * c);
        r = r0 * (1.f - 0.001f * c);
      }
#pragma unroll
      for (int k = 0; k < 8; ++k) {
        if (kMode == 0 || v >= thr) acc[c * 8 + k] += v;
        v *= r;
        r *= g;
      }
    }
    v0 = fmaf(v0, 0.9999f, 1e-5f);
    r0 = fmaf(r0, 0.99999f, 1e-5f);
    a0 = fmaf(a0, 0.9999f, -1e-5f);
    b0 = fmaf(b0, 0.9999f, 1e-6f);
  }
  float s = 0.f;
#pragma unroll
  for (int k = 0; k < 32; ++k) s += acc[k];
  out[t] = s;
}

template <int kMode>
float run(const float* in, float* out, int blocks, int iters) {
  cudaEvent_t a, b;
  cudaEventCreate(&a);
  cudaEventCreate(&b);
  float ms = 0.f;
  for (int rep = 0; rep < 3; ++rep) {
    cudaEventRecord(a);
    slots<kMode><<<blocks, 256>>>(in, out, iters);
    cudaEventRecord(b);
    cudaEventSynchronize(b);
    cudaEventElapsedTime(&ms, a, b);
  }
  cudaEventDestroy(a);
  cudaEventDestroy(b);
  return ms;
}

}  // namespace

int main() {
  int sms = 0;
  cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0);
  const int blocks = sms * 16, threads = blocks * 256, iters = 4000;
  float *in = nullptr, *out = nullptr;
  cudaMalloc(&in, 1024 * sizeof(float));
  cudaMalloc(&out, static_cast<size_t>(threads) * sizeof(float));
  float host[1024];
  for (int k = 0; k < 1024; ++k) host[k] = static_cast<float>((k * 37) % 101) / 101.f;
  cudaMemcpy(in, host, sizeof(host), cudaMemcpyHostToDevice);
  const char* names[3] = {"plain (2 FMUL + FADD)", "value test (+ compare, predicated add)",
                          "value test and two ex2 anchors per 8-slot chunk"};
  const float ms[3] = {run<0>(in, out, blocks, iters), run<1>(in, out, blocks, iters), run<2>(in, out, blocks, iters)};
  const cudaError_t err = cudaGetLastError();
  if (err != cudaSuccess) {
    fprintf(stderr, "probe_slots: %s\n", cudaGetErrorString(err));
    return 1;
  }
  const double slots_total = static_cast<double>(threads) * iters * 32.0;
  printf("{\"what\": \"slots per second of the z recurrence in registers (benchmarks/probe_slots.cu)\",\n");
  printf(" \"threads\": %d, \"iters\": %d, \"slots_per_thread_round\": 32,\n \"modes\": [\n", threads, iters);
  for (int m = 0; m < 3; ++m) {
    printf("  {\"mode\": %d, \"name\": \"%s\", \"ms\": %.4f, \"slots_per_s\": %.4e}%s\n", m, names[m], ms[m],
           slots_total / (ms[m] * 1e-3), m < 2 ? "," : "");
  }
  printf(" ]}\n");
  cudaFree(in);
  cudaFree(out);
  return 0;
}
