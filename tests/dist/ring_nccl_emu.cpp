/* src/dist/ring_nccl.cu, unchanged, built as host C++ for the SIMT emulator's CUDA target
 * (tests/gpu/emu/emu_runtime.h: device memory is host memory, kernels run at launch) against the
 * NCCL double (fake_nccl/nccl.h over MPI), for test_ring_nccl. */
#define EMU_TARGET_CUDA 1
#include "dist/ring_nccl.cu"
