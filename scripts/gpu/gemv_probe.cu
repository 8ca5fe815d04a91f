// GEMV probe (standalone, no torch): weight_gemv_kernel<Sm80Mma, Nvfp4Format, M> on the decode shapes against a
// pure-read kernel of the same bytes, to tell how far the GEMV is from what this card can read at that size.
//   nvcc -arch=sm_90 -O3 -std=c++17 --use_fast_math -lineinfo -Icsrc scripts/gpu/gemv_probe.cu -o gemv_probe
//   ./gemv_probe            timing table (µs, GB/s of packed bytes; grid = stream-K as the host launches it,
//                           and ×0.5 / ×2 of it to see whether more or fewer blocks would pay)
//   ./gemv_probe ncu        one launch each of the qkv GEMV (M = 1, 8) and of the read kernel, for ncu
//   ./gemv_probe grid1      the GEMV with the host's grid only (to compare builds of variants of the kernel)
// Weights are random bytes (timing only: tests/gpu checks results); rotated over > 512 MB so reads come from DRAM.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "gemm/weight_gemm.cuh"

using namespace volta_fp4;

#define CHECK(call)                                                                                   \
  do {                                                                                                \
    const cudaError_t status = (call);                                                                \
    if (status != cudaSuccess) {                                                                      \
      std::printf("CUDA error %s at %s:%d\n", cudaGetErrorString(status), __FILE__, __LINE__);        \
      std::exit(1);                                                                                   \
    }                                                                                                 \
  } while (0)

__global__ void fill_random(uint32_t* p, size_t n, uint32_t seed) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x) {
    uint32_t h = uint32_t(i) * 2654435761u ^ seed;
    h ^= h >> 15, h *= 2246822519u, h ^= h >> 13;
    p[i] = h & 0x7E7E7E7Eu;  // no E4M3 NaN bytes among the scales
  }
}

// Reads vectors [b·per, (b+1)·per) per block with kDepth 16-byte loads in flight per thread, as the GEMV streams.
template <int kDepth>
__global__ void read_kernel(const uint4* data, long long n_vectors, long long per_block, uint32_t* sink) {
  const long long begin = blockIdx.x * per_block;
  const long long end = n_vectors < begin + per_block ? n_vectors : begin + per_block;
  uint32_t acc = 0;
  for (long long i = begin + threadIdx.x; i < end; i += (long long)blockDim.x * kDepth) {
    uint4 v[kDepth];
#pragma unroll
    for (int u = 0; u < kDepth; ++u) {
      const long long index = i + (long long)u * blockDim.x;
      v[u] = index < end ? load_stream(data + index) : make_uint4(0, 0, 0, 0);
    }
#pragma unroll
    for (int u = 0; u < kDepth; ++u) acc ^= v[u].x ^ v[u].y ^ v[u].z ^ v[u].w;
  }
  if (acc == 0x9E3779B9u) *sink = acc;  // keeps the loads
}

// Median µs per call of step(i, stream) captured `calls` times in one CUDA graph.
template <class Step>
float time_graph(Step step, int calls = 20, int replays = 9) {
  cudaStream_t stream;
  CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  for (int i = 0; i < 3; ++i) step(i, stream);
  cudaGraph_t graph;
  cudaGraphExec_t exec;
  CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal));
  for (int i = 0; i < calls; ++i) step(i, stream);
  CHECK(cudaStreamEndCapture(stream, &graph));
  CHECK(cudaGraphInstantiate(&exec, graph, 0));
  CHECK(cudaGraphLaunch(exec, stream));
  CHECK(cudaStreamSynchronize(stream));
  cudaEvent_t start, stop;
  CHECK(cudaEventCreate(&start));
  CHECK(cudaEventCreate(&stop));
  std::vector<float> times;
  for (int r = 0; r < replays; ++r) {
    CHECK(cudaEventRecord(start, stream));
    CHECK(cudaGraphLaunch(exec, stream));
    CHECK(cudaEventRecord(stop, stream));
    CHECK(cudaEventSynchronize(stop));
    float ms;
    CHECK(cudaEventElapsedTime(&ms, start, stop));
    times.push_back(ms * 1000.f / calls);
  }
  CHECK(cudaGetLastError());
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
  cudaStreamDestroy(stream);
  std::sort(times.begin(), times.end());
  return times[times.size() / 2];
}

template <int M>
void launch(GemmParams p, int blocks, cudaStream_t stream) {
  p.M = M;
  weight_gemv_kernel<Sm80Mma, Nvfp4Format, M><<<blocks, kThreads, 0, stream>>>(p);
}
void launch_gemv(const GemmParams& p, int m, int blocks, cudaStream_t stream) {
  switch (m) {
    case 1: return launch<1>(p, blocks, stream);
    case 2: return launch<2>(p, blocks, stream);
    case 4: return launch<4>(p, blocks, stream);
    default: return launch<8>(p, blocks, stream);
  }
}
int blocks_per_sm(int m) {
  int blocks = 0;
  switch (m) {
    case 1: CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&blocks, weight_gemv_kernel<Sm80Mma, Nvfp4Format, 1>, kThreads, 0)); break;
    case 2: CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&blocks, weight_gemv_kernel<Sm80Mma, Nvfp4Format, 2>, kThreads, 0)); break;
    case 4: CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&blocks, weight_gemv_kernel<Sm80Mma, Nvfp4Format, 4>, kThreads, 0)); break;
    default: CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&blocks, weight_gemv_kernel<Sm80Mma, Nvfp4Format, 8>, kThreads, 0));
  }
  return blocks;
}

struct Shape {
  const char* name;
  int n, k;
};

int main(int argc, char** argv) {
  const bool ncu = argc > 1 && !std::strcmp(argv[1], "ncu");
  const bool grid1 = argc > 1 && !std::strcmp(argv[1], "grid1");
  cudaDeviceProp props;
  CHECK(cudaGetDeviceProperties(&props, 0));
  uint32_t* sink;
  CHECK(cudaMalloc(&sink, 4));
  if (!ncu) {
    const size_t bytes = size_t(1) << 30;
    void *a, *b;
    CHECK(cudaMalloc(&a, bytes));
    CHECK(cudaMalloc(&b, bytes));
    const float us = time_graph([&](int, cudaStream_t s) { CHECK(cudaMemcpyAsync(b, a, bytes, cudaMemcpyDeviceToDevice, s)); }, 10, 5);
    std::printf("%s, %d SMs; device-to-device copy %.0f GB/s (read + write)\n", props.name, props.multiProcessorCount,
                2.0 * bytes / us / 1e3);
    cudaFree(a);
    cudaFree(b);
  }
  const Shape shapes[] = {{"qkv_proj", 14336, 5120}, {"o_proj", 5120, 6144}, {"gate_up_proj", 34816, 5120}, {"down_proj", 5120, 17408}};
  for (const Shape& shape : shapes) {
    if (ncu && shape.n != 14336) continue;
    const int n_tiles = (shape.n + kTileN - 1) / kTileN, k_tiles = (shape.k + kTileK - 1) / kTileK;
    const long long tiles = (long long)n_tiles * k_tiles;
    const size_t tile_bytes = size_t(tiles) * Nvfp4Format::kChunkBytes;
    const double packed_bytes = double(shape.n) * shape.k * 0.5625;
    const int copies = ncu ? 1 : std::max<int>(2, int((size_t(512) << 20) / tile_bytes + 1));
    std::vector<uint8_t*> weights(copies);
    for (auto& w : weights) {
      CHECK(cudaMalloc(&w, tile_bytes));
      fill_random<<<1024, 256>>>(reinterpret_cast<uint32_t*>(w), tile_bytes / 4, uint32_t(size_t(w)));
    }
    float *row_scale, *partials;
    uint16_t *x, *y;
    int* counters;
    CHECK(cudaMalloc(&row_scale, sizeof(float) * shape.n));
    CHECK(cudaMalloc(&x, 2 * kGemvMaxM * shape.k));
    CHECK(cudaMalloc(&y, 2 * kGemvMaxM * shape.n));
    // [blocks][2][M][64]; blocks ≤ twice the resident slots ≤ 2 · SMs · 32 (the per-SM block limit).
    CHECK(cudaMalloc(&partials, sizeof(float) * 2 * props.multiProcessorCount * 32 * 2 * kGemvMaxM * kTileN));
    CHECK(cudaMalloc(&counters, sizeof(int) * n_tiles * kMaxSplitMTiles));
    CHECK(cudaMemset(row_scale, 0, sizeof(float) * shape.n));
    CHECK(cudaMemset(x, 0x3C, 2 * kGemvMaxM * shape.k));
    CHECK(cudaMemset(counters, 0, sizeof(int) * n_tiles * kMaxSplitMTiles));
    CHECK(cudaDeviceSynchronize());
    for (int m : {1, 2, 4, 8}) {
      if (ncu && m != 1 && m != 8) continue;
      const int resident = blocks_per_sm(m);
      const long long slots = (long long)props.multiProcessorCount * resident;
      for (double grid_scale : {1.0, 0.5, 2.0}) {
        if ((ncu || grid1) && grid_scale != 1.0) continue;
        const long long wanted = (long long)(slots * grid_scale);
        const long long per = std::max<long long>(kGemvMinTilesPerBlock, (tiles + wanted - 1) / wanted);
        const int blocks = int((tiles + per - 1) / per);
        GemmParams p{};
        p.x = x, p.ldx = shape.k, p.row_scale = row_scale, p.y = y, p.partials = partials, p.counters = counters;
        p.N = shape.n, p.K = shape.k, p.k_tiles = k_tiles, p.tiles_per_block = int(per);
        auto step = [&](int i, cudaStream_t s) {
          GemmParams q = p;
          q.weight_tiles = weights[i % copies];
          launch_gemv(q, m, blocks, s);
        };
        if (ncu) {
          step(0, 0);
          CHECK(cudaDeviceSynchronize());
          continue;
        }
        const float us = time_graph(step);
        std::printf("%-12s M=%d gemv   grid %4d (%.1f x slots, %d blocks/SM, %lld tiles per block): %7.2f us  %5.0f GB/s packed\n",
                    shape.name, m, blocks, grid_scale, resident, per, us, packed_bytes / us / 1e3);
      }
    }
    // The same chunk bytes (codes + scales + tile padding) read and discarded, with the GEMV's grid and block size
    // (2 loads in flight per thread, as its ring) and with a large grid and 8 loads in flight.
    const long long vectors = tile_bytes / 16;
    for (int config = 0; config < (grid1 ? 0 : 2); ++config) {
      const long long blocks = config == 0 ? (long long)props.multiProcessorCount * blocks_per_sm(1)
                                           : (long long)props.multiProcessorCount * 8;
      const long long per = (vectors + blocks - 1) / blocks;
      auto step = [&](int i, cudaStream_t s) {
        const uint4* data = reinterpret_cast<const uint4*>(weights[i % copies]);
        if (config == 0) read_kernel<2><<<unsigned(blocks), kThreads, 0, s>>>(data, vectors, per, sink);
        else read_kernel<8><<<unsigned(blocks), 256, 0, s>>>(data, vectors, per, sink);
      };
      if (ncu) {
        step(0, 0);
        CHECK(cudaDeviceSynchronize());
        continue;
      }
      const float us = time_graph(step);
      std::printf("%-12s read-only grid %5lld x %3d threads, %d loads in flight:   %7.2f us  %5.0f GB/s of %.1f MB\n",
                  shape.name, blocks, config == 0 ? kThreads : 256, config == 0 ? 2 : 8, us, tile_bytes / us / 1e3,
                  tile_bytes / 1e6);
    }
    for (auto w : weights) cudaFree(w);
    cudaFree(row_scale), cudaFree(x), cudaFree(y), cudaFree(partials), cudaFree(counters);
  }
  CHECK(cudaDeviceSynchronize());
  return 0;
}
