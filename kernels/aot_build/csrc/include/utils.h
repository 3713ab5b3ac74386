// Stand-in for sglang-kernel's utils.h on ROCm, where transfer.cu takes WARP_SIZE from it (on CUDA it
// defines 32 itself). sglang builds its ROCm kernels for CDNA GPUs (gfx9: MI200/MI300), whose wavefront is
// 64 lanes; build for an RDNA (wave32) GPU with -DWARP_SIZE=32. Written for hicache-fuzz.
#pragma once
#ifndef WARP_SIZE
#define WARP_SIZE 64
#endif
