// The HIP plugin: the shared plugin source (src/gpu/plugin.cuh) compiled by hipcc: gpu_runtime.h
// picks the HIP runtime and warp.cuh the wavefront size of each --offload-arch target; AMD's tc
// family (MFMA on CDNA) comes from this folder.
#include "../plugin.cuh"
#include "tc_matrix_kernels.cuh"
