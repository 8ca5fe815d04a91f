// Shared-memory row geometry of the MMA atoms' tiles; torch- and CUDA-free so that host code compiled by a plain
// C++ compiler (csrc/driver/) computes the same launch sizes as the kernels.
#pragma once

namespace volta_fp4 {

constexpr int kSmemRowHalves = 128 + 8;  // +16 bytes: rows start in different banks
constexpr int kVoltaMaxSmemPerBlock = 96 * 1024;  // the sm_70 opt-in limit every kernel here stays under

}  // namespace volta_fp4
