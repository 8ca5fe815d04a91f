// Fixed-width integers for kernel headers that also compile alone under NVRTC (tools/sm70_check.py), which has no
// standard headers.
#pragma once

#if defined(__CUDACC_RTC__)
typedef unsigned char uint8_t;
typedef unsigned short uint16_t;
typedef unsigned int uint32_t;
typedef long long int64_t;
typedef unsigned long long uint64_t;
#else
#include <stdint.h>
#endif
