// The HIP plugin is the CUDA plugin's source compiled by hipcc: gpu_runtime.h picks the HIP
// runtime and warp.cuh the wavefront size of each --offload-arch target. The CDNA tile layer is
// compiled in as well (see mfma_tile.cuh for its status).
#include "../cuda/plugin.cu"
#include "mfma_tile.cuh"
