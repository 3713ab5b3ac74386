// Stand-in for the helper header sglang's transfer.cu includes on CUDA. Upstream it comes from FlashInfer
// and brings dispatch macros that transfer.cu does not use; everything it needs (TORCH_CHECK, the CUDA
// stream and launch checks) is in the ATen headers it includes itself. Written for hicache-fuzz.
#pragma once
#include <ATen/ATen.h>
