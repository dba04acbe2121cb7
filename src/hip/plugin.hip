// The HIP plugin is the CUDA plugin's source compiled by hipcc: gpu_runtime.h picks the HIP
// runtime and warp.cuh the wavefront size of each --offload-arch target. The one AMD-only piece
// is the tc family's layer choice (MFMA on CDNA), defined here before the shared host code.
#include "../cuda/plugin.cu"
#include "tc_matrix_kernels.cuh"
