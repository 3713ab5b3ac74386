// Stand-in for sglang-kernel's ROCm helper header, included by transfer.cu when USE_ROCM is defined (torch's
// extension builder defines it for ROCm builds). transfer.cu needs nothing from it beyond the ATen headers.
// Written for hicache-fuzz.
#pragma once
#include <ATen/ATen.h>
