/* The vendor header: the few runtime calls and types the plugin uses, spelled once for CUDA and
 * once for HIP. Everything else in src/gpu (compiled by nvcc from nvidia/plugin.cu and by hipcc
 * from amd/plugin.hip) uses the fa_gpu* names below, so the host code and the kernels are written
 * once.
 * A third spelling comes from outside src: FA_GPU_EMULATOR names a header (tests/gpu/emu) that
 * provides the same names on the CPU, so the unchanged plugin and kernels run under the SIMT
 * emulator. The vendor-specific instructions live in nvidia/ptx.cuh (NVIDIA inline asm) and
 * amd/amdgcn.cuh (AMD builtins), behind include guards the emulator pre-empts. */
#ifndef FA_GPU_RUNTIME_H
#define FA_GPU_RUNTIME_H

#if defined(FA_GPU_EMULATOR)
#  include FA_GPU_EMULATOR
#elif defined(__HIPCC__)
#  include <hip/hip_runtime.h>
#  include <hip/hip_fp16.h>
#  define FA_GPU_VENDOR "hip"
#  define FA_GPU(name) hip##name
typedef hipError_t fa_gpu_error;
typedef hipStream_t fa_gpu_stream;
typedef hipDeviceProp_t fa_gpu_props;
typedef hipEvent_t fa_gpu_event;
/* LDS is 64 KiB on gfx908, gfx90a and gfx1030; HIP reports it directly (no opt-in step). */
#  define FA_GPU_ATTR_SMEM_PER_BLOCK hipDeviceAttributeMaxSharedMemoryPerBlock
#  define FA_GPU_ATTR_SMEM_OPTIN hipDeviceAttributeMaxSharedMemoryPerBlock
#  define FA_GPU_FUNC_ATTR_MAX_DYNAMIC_SMEM hipFuncAttributeMaxDynamicSharedMemorySize
#  define FA_GPU_ERROR_NO_DEVICE hipErrorNoDevice
#  define FA_GPU_ERROR_NO_DRIVER hipErrorInsufficientDriver
/* Orders a wavefront's LDS accesses (its lanes execute in lockstep). */
#  define fa_gpu_wave_barrier() (__builtin_amdgcn_wave_barrier(), __builtin_amdgcn_fence(__ATOMIC_SEQ_CST, "wavefront"))
#  define fa_gpu_trap() __builtin_trap()
#else
#  include <cuda_runtime.h>
#  include <cuda_fp16.h>
#  define FA_GPU_VENDOR "cuda"
#  define FA_GPU(name) cuda##name
typedef cudaError_t fa_gpu_error;
typedef cudaStream_t fa_gpu_stream;
typedef cudaDeviceProp fa_gpu_props;
typedef cudaEvent_t fa_gpu_event;
#  define FA_GPU_ATTR_SMEM_PER_BLOCK cudaDevAttrMaxSharedMemoryPerBlock
#  define FA_GPU_ATTR_SMEM_OPTIN cudaDevAttrMaxSharedMemoryPerBlockOptin
#  define FA_GPU_FUNC_ATTR_MAX_DYNAMIC_SMEM cudaFuncAttributeMaxDynamicSharedMemorySize
#  define FA_GPU_ERROR_NO_DEVICE cudaErrorNoDevice
#  define FA_GPU_ERROR_NO_DRIVER cudaErrorInsufficientDriver
#  define fa_gpu_trap() __trap()
#endif

#if !defined(FA_GPU_EMULATOR)
/* The kernel's dynamic shared memory, sized by the launch. */
#  define FA_DYNAMIC_SMEM(type, name) extern __shared__ __align__(16) type name[]

/* Every kernel launch of the plugin goes through here; the emulator has its own. */
template <class Params>
static inline fa_gpu_error fa_gpu_launch(void (*kernel)(Params), dim3 grid, dim3 block, size_t smem_bytes,
                                         fa_gpu_stream stream, const Params &params)
{
    kernel<<<grid, block, smem_bytes, stream>>>(params);
    return FA_GPU(GetLastError)();
}
#endif

/* A kernel written for `threads` threads per block traps when launched with another block. */
#define FA_GPU_REQUIRE_BLOCK(threads)                                                        \
    do {                                                                                     \
        if (blockDim.x != (unsigned)(threads) || blockDim.y != 1 || blockDim.z != 1) fa_gpu_trap(); \
    } while (0)

#define fa_gpu_success FA_GPU(Success)
#define fa_gpu_get_device_count FA_GPU(GetDeviceCount)
#define fa_gpu_set_device FA_GPU(SetDevice)
#define fa_gpu_get_device_properties FA_GPU(GetDeviceProperties)
#define fa_gpu_device_get_attribute FA_GPU(DeviceGetAttribute)
#define fa_gpu_func_set_attribute FA_GPU(FuncSetAttribute)
#define fa_gpu_malloc FA_GPU(Malloc)
#define fa_gpu_free FA_GPU(Free)
#define fa_gpu_memcpy_async FA_GPU(MemcpyAsync)
#define fa_gpu_memset_async FA_GPU(MemsetAsync)
#define fa_gpu_memcpy_h2d FA_GPU(MemcpyHostToDevice)
#define fa_gpu_memcpy_d2h FA_GPU(MemcpyDeviceToHost)
#define fa_gpu_stream_synchronize FA_GPU(StreamSynchronize)
#define fa_gpu_get_last_error FA_GPU(GetLastError)
#define fa_gpu_get_error_string FA_GPU(GetErrorString)
#define fa_gpu_get_error_name FA_GPU(GetErrorName)
#define fa_gpu_driver_get_version FA_GPU(DriverGetVersion)
#define fa_gpu_runtime_get_version FA_GPU(RuntimeGetVersion)
/* Streams, events, 2D copies and pinned host memory: used outside the plugin (src/dist/ring_nccl.cu). */
#define fa_gpu_stream_create_with_flags FA_GPU(StreamCreateWithFlags)
#define fa_gpu_stream_non_blocking FA_GPU(StreamNonBlocking)
#define fa_gpu_stream_destroy FA_GPU(StreamDestroy)
#define fa_gpu_stream_wait_event FA_GPU(StreamWaitEvent)
#define fa_gpu_event_create_with_flags FA_GPU(EventCreateWithFlags)
#define fa_gpu_event_disable_timing FA_GPU(EventDisableTiming)
#define fa_gpu_event_destroy FA_GPU(EventDestroy)
#define fa_gpu_event_record FA_GPU(EventRecord)
#define fa_gpu_event_query FA_GPU(EventQuery)
#define fa_gpu_error_not_ready FA_GPU(ErrorNotReady)
#define fa_gpu_memcpy_2d_async FA_GPU(Memcpy2DAsync)
#define fa_gpu_memcpy_d2d FA_GPU(MemcpyDeviceToDevice)
#define fa_gpu_malloc_host FA_GPU(MallocHost)
#define fa_gpu_free_host FA_GPU(FreeHost)
#endif
