/* An emulated build of a GPU plugin: src/gpu/nvidia/plugin.cu (or src/gpu/amd/plugin.hip), host code and
 * kernels, compiled unchanged as host C++ for the target that -DEMU_TARGET_* names, with
 * FA_GPU_EMULATOR="emu_runtime.h" (see emu_runtime.h). The result is a plugin with the real
 * file name (libflashattn-cuda.so, libflashattn-hip.so) in a folder of its own, which the
 * registry loads through FLASHATTN_PLUGIN_DIR, so tests/gpu/test_gpu_backends.c runs on it as it
 * would on a GPU. The HIP targets are compiled as hipcc compiles them: __HIPCC__ and the
 * target's wavefront size. */
#if defined(EMU_TARGET_HIP_CDNA)
#  define __HIPCC__ 1
#  define __AMDGCN_WAVEFRONT_SIZE 64
#elif defined(EMU_TARGET_HIP_RDNA)
#  define __HIPCC__ 1
#  define __AMDGCN_WAVEFRONT_SIZE 32
#endif

#if defined(__HIPCC__)
#  define FA_HIP_TARGETS "gfx90a", "gfx908", "gfx1030"
#  include "gpu/amd/plugin.hip"
#else
#  include "gpu/nvidia/plugin.cu"
#endif
