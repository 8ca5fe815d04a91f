// The Gated-DeltaNet ops' host-side decisions, apart from the host code that makes the launches
// (csrc/driver/gdn_driver.cpp, the kernel image through the CUDA driver API) so that tests compile them alone: the
// grids' work units
// from host values only, and the name of every kernel the ops launch (the kernel table the wheel build compiles:
// tools/sm70_check.py lists the same). Torch- and CUDA-free.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "gdn/gdn_shape.h"

namespace volta_fp4 {
namespace gdn {

inline bool supported_head_dim(int64_t d) { return d == 64 || d == 128; }
inline bool supported_conv_width(int64_t width) { return width >= 2 && width <= 4; }

// Work units of a varlen batch: unit_base(num_seqs) with starts[num_seqs] ≤ tokens (gdn.cuh, find_sequence), so
// the grid is bounded without reading the batch on the host.
inline int64_t work_units(int64_t tokens, int64_t num_seqs, int64_t unit) { return tokens / unit + num_seqs; }
inline int64_t chunk_slots(int64_t tokens, int64_t num_seqs) { return work_units(tokens, num_seqs, kChunk); }
inline int64_t conv_segments(int64_t tokens, int64_t num_seqs) { return work_units(tokens, num_seqs, kConvSegment); }
inline int64_t row_norm_blocks(int64_t rows) { return (rows + kWarps - 1) / kWarps; }
inline int64_t channel_blocks(int64_t dim) { return (dim + kBlockThreads - 1) / kBlockThreads; }

// ─── Kernel names (the NVRTC name expressions of the instantiations the ops launch) ──────────────────────────
inline std::string state_type_name(bool fp32_state) { return fp32_state ? "float" : "uint16_t"; }
inline std::string atom_name(bool sm70_atom) { return sm70_atom ? "volta_fp4::Sm70Mma" : "volta_fp4::Sm80Mma"; }

inline std::string row_norm_kernel_name(int d, bool gated) {
  return "volta_fp4::gdn::row_norm_kernel<" + std::to_string(d) + ", " + (gated ? "true" : "false") + ">";
}
inline std::string causal_conv1d_kernel_name(int width) {
  return "volta_fp4::gdn::causal_conv1d_kernel<" + std::to_string(width) + ">";
}
inline std::string chunk_prepare_kernel_name(bool sm70_atom, int d) {
  return "volta_fp4::gdn::chunk_prepare_kernel<" + atom_name(sm70_atom) + ", " + std::to_string(d) + ">";
}
inline std::string chunk_state_kernel_name(bool sm70_atom, int d, bool fp32_state) {
  return "volta_fp4::gdn::chunk_state_kernel<" + atom_name(sm70_atom) + ", " + std::to_string(d) + ", " +
         state_type_name(fp32_state) + ">";
}
inline std::string recurrent_decode_kernel_name(int d, bool fp32_state) {
  return "volta_fp4::gdn::recurrent_decode_kernel<" + std::to_string(d) + ", " + state_type_name(fp32_state) + ">";
}

inline std::vector<std::string> launched_kernel_names() {
  std::vector<std::string> names;
  for (const int d : {64, 128})
    for (const bool gated : {false, true}) names.push_back(row_norm_kernel_name(d, gated));
  for (const int width : {2, 3, 4}) names.push_back(causal_conv1d_kernel_name(width));
  for (const bool sm70 : {true, false})
    for (const int d : {64, 128}) {
      names.push_back(chunk_prepare_kernel_name(sm70, d));
      for (const bool fp32 : {true, false}) names.push_back(chunk_state_kernel_name(sm70, d, fp32));
    }
  for (const int d : {64, 128})
    for (const bool fp32 : {true, false}) names.push_back(recurrent_decode_kernel_name(d, fp32));
  return names;
}

}  // namespace gdn
}  // namespace volta_fp4
