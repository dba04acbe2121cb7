// The CUDA plugin: the shared plugin source (src/gpu/plugin.cuh) compiled by nvcc, with NVIDIA's
// tc family (mma.sync).
#include "../plugin.cuh"
#include "tc_matrix_kernels.cuh"
