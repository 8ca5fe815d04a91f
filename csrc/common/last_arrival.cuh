// The semaphore of split work (the GEMM's split-K and stream-K sums, attention's split-KV merge): the blocks that
// share a counter write their partials, and the last to arrive reads them all. Counters live in scratch that every
// launch leaves all-zero (the last block resets its counter), so a CUDA graph can replay the launch as captured.
#pragma once

namespace volta_fp4 {

// Every thread of the block calls it once its partials are written; true in the block that arrives last of
// `blocks`, which resets the counter to zero for the next launch and may then read all partials (the fences order
// the other blocks' writes before its reads).
__device__ __forceinline__ bool arrived_last(int* counter, int blocks) {
  __shared__ int last;
  __threadfence();
  __syncthreads();
  if (threadIdx.x == 0) {
    last = atomicAdd(counter, 1) == blocks - 1;
    if (last) *counter = 0;
  }
  __syncthreads();
  const bool is_last = last;
  if (is_last) __threadfence();
  return is_last;
}

}  // namespace volta_fp4
