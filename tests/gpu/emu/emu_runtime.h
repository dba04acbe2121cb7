/* The SIMT emulator's vendor header: what src/gpu/gpu_runtime.h spells for CUDA and HIP, spelled
 * for the CPU, so that src/gpu/plugin.cuh and its kernels compile unchanged as host C++ (g++ or
 * clang++) and run through emu_core. Included by gpu_runtime.h when FA_GPU_EMULATOR names it; the
 * translation unit first defines the target it models (emu_plugin.cpp):
 *   EMU_TARGET_CUDA            NVIDIA sm_80 model: warp 32, mma.sync/ldmatrix/cp.async models
 *   EMU_TARGET_HIP_CDNA        AMD gfx90a model: wavefront 64, MFMA model (with __HIPCC__ defined)
 *   EMU_TARGET_HIP_RDNA        AMD gfx1030 model: wavefront 32, no matrix cores
 * It also pre-defines the guards of the two instruction headers (kernels/ptx.cuh, hip/amdgcn.cuh)
 * and gives their functions host models from emu_core. */
#ifndef FA_EMU_RUNTIME_H
#define FA_EMU_RUNTIME_H
#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <memory>
#include <vector>

#include "emu_core.h"
#include "emu_half.h"

#if defined(EMU_TARGET_CUDA)
#  define FA_GPU_VENDOR "cuda"
#  define EMU_WARP_SIZE 32
#  define EMU_SMEM_DEFAULT_LIMIT (48 * 1024)
#  define EMU_SMEM_OPTIN (163 * 1024) /* A100 (sm_80) */
#elif defined(EMU_TARGET_HIP_CDNA) || defined(EMU_TARGET_HIP_RDNA)
#  if !defined(__HIPCC__)
#    error "the HIP targets are modelled with __HIPCC__ defined, as hipcc does"
#  endif
#  define FA_GPU_VENDOR "hip"
#  define EMU_WARP_SIZE __AMDGCN_WAVEFRONT_SIZE
#  define EMU_SMEM_DEFAULT_LIMIT (64 * 1024)
#  define EMU_SMEM_OPTIN (64 * 1024)
#else
#  error "define EMU_TARGET_CUDA, EMU_TARGET_HIP_CDNA or EMU_TARGET_HIP_RDNA"
#endif

/* ---- language ------------------------------------------------------------------------------- */
#define __host__
#define __device__
#define __global__
#define __forceinline__ inline
#define __noinline__ __attribute__((noinline))
#define __launch_bounds__(...)
#define __grid_constant__ /* a kernel parameter read in place; host code passes it by reference anyway */
#define __align__(n) __attribute__((aligned(n)))
#define __shared__

struct dim3 {
    unsigned x, y, z;
    dim3(unsigned x_ = 1, unsigned y_ = 1, unsigned z_ = 1) : x(x_), y(y_), z(z_) {}
};
struct uint4 { unsigned x, y, z, w; };
inline uint4 make_uint4(unsigned x, unsigned y, unsigned z, unsigned w) { return uint4{x, y, z, w}; }
struct alignas(8) float2 { float x, y; };
struct alignas(16) float4 { float x, y, z, w; };

#define threadIdx (::emu::thread_idx())
#define blockIdx (::emu::block_idx())
#define blockDim (::emu::block_dim())
#define gridDim (::emu::grid_dim())

#define FA_DYNAMIC_SMEM(type, name) type *const name = reinterpret_cast<type *>(::emu::dynamic_smem())
#define fa_gpu_trap() ::emu::fault("the kernel trapped (fa_gpu_trap: e.g. a launch with a block size it is not written for)")

inline void __syncthreads() { ::emu::sync_threads(); }

/* ---- warp collectives --------------------------------------------------------------------------- */
inline void emu_require_full_mask(unsigned mask)
{
    if (mask != 0xffffffffu) ::emu::fault("a warp collective with a partial member mask (0x%08x): not modelled", mask);
}
inline void __syncwarp(unsigned mask = 0xffffffffu)
{
    emu_require_full_mask(mask);
    ::emu::sync_warp();
}
inline float __shfl_xor_sync(unsigned mask, float v, int lane_mask, int width = 32)
{
    emu_require_full_mask(mask);
    return ::emu::shuffle(::emu::shuffle_kind::xor_lane, v, lane_mask, width);
}
inline float __shfl_sync(unsigned mask, float v, int src_lane, int width = 32)
{
    emu_require_full_mask(mask);
    return ::emu::shuffle(::emu::shuffle_kind::index, v, src_lane, width);
}
#if defined(__HIPCC__)
inline float __shfl_xor(float v, int lane_mask, int width = EMU_WARP_SIZE)
{
    return ::emu::shuffle(::emu::shuffle_kind::xor_lane, v, lane_mask, width);
}
inline float __shfl(float v, int src_lane, int width = EMU_WARP_SIZE)
{
    return ::emu::shuffle(::emu::shuffle_kind::index, v, src_lane, width);
}
#  define fa_gpu_wave_barrier() ::emu::sync_warp()
#endif

/* ---- scalar types and conversions (emu_half.h: independent of src/common/half.h) ---------------- */
struct __half { uint16_t bits; };
inline float __half2float(__half h) { return ::emu::float_from_f16_bits(h.bits); }
inline __half __float2half_rn(float f) { return __half{::emu::f16_bits_from_float(f)}; }
inline __half __ushort_as_half(unsigned short u) { return __half{u}; }
inline float __uint_as_float(uint32_t u)
{
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}
inline uint32_t __float_as_uint(float f)
{
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return u;
}

/* ---- runtime API ---------------------------------------------------------------------------------- */
#define FA_GPU(name) emu##name
typedef enum emuError_t {
    emuSuccess = 0,
    emuErrorInvalidValue = 1,
    emuErrorMemoryAllocation = 2,
    emuErrorNoDevice = 100,
    emuErrorInsufficientDriver = 35,
    emuErrorInvalidConfiguration = 9,
    emuErrorLaunchFailure = 719,
    emuErrorNotReady = 600, /* an event query: never, as everything completes at once */
    emuErrorStreamCaptureUnsupported = 900, /* an operation a stream capture cannot contain */
} emuError_t;
typedef enum emuMemcpyKind { emuMemcpyHostToDevice = 1, emuMemcpyDeviceToHost = 2, emuMemcpyDeviceToDevice = 3 } emuMemcpyKind;
typedef enum emuDeviceAttr { emuDevAttrMaxSharedMemoryPerBlock = 8, emuDevAttrMaxSharedMemoryPerBlockOptin = 97 } emuDeviceAttr;
typedef enum emuFuncAttribute { emuFuncAttributeMaxDynamicSharedMemorySize = 8 } emuFuncAttribute;
struct emuDeviceProp {
    char name[256];
    char gcnArchName[256];
    int major, minor, multiProcessorCount, warpSize;
    size_t totalGlobalMem;
};
typedef emuError_t fa_gpu_error;
typedef void *fa_gpu_stream;
typedef emuDeviceProp fa_gpu_props;
#define FA_GPU_ATTR_SMEM_PER_BLOCK emuDevAttrMaxSharedMemoryPerBlock
#define FA_GPU_ATTR_SMEM_OPTIN emuDevAttrMaxSharedMemoryPerBlockOptin
#define FA_GPU_FUNC_ATTR_MAX_DYNAMIC_SMEM emuFuncAttributeMaxDynamicSharedMemorySize
#define FA_GPU_ERROR_NO_DEVICE emuErrorNoDevice
#define FA_GPU_ERROR_NO_DRIVER emuErrorInsufficientDriver

/* The runtime's per-process state: the sticky last error and the dynamic shared-memory limits
 * raised by emuFuncSetAttribute (a launch above 48 KiB without it fails, as on NVIDIA). */
struct emu_runtime_state {
    emuError_t last_error;
    const void *raised_kernels[256];
    int raised_bytes[256];
    int raised_count;
};
inline emu_runtime_state &emu_runtime()
{
    static emu_runtime_state state;
    return state;
}
inline emuError_t emu_record(emuError_t e)
{
    if (e != emuSuccess) emu_runtime().last_error = e;
    return e;
}

/* ---- stream capture (CUDA and HIP graphs) ------------------------------------------------------------
 * Between fa_emu_begin_capture(stream) and fa_emu_end_capture (emu_plugin.cpp: the tests reach them
 * through the plugin's symbols), launches on the capturing stream are recorded, not run, and
 * fa_emu_replay runs the recorded graph (again and again), as a graph launch would. What a capture
 * cannot contain (an allocation or free, a copy, a memset, a stream synchronisation) fails with
 * emuErrorStreamCaptureUnsupported and is named on stderr and by fa_emu_end_capture, as the global
 * capture mode of the CUDA runtime refuses it. */
struct emu_recorded_launch {
    ::emu::launch l;
    std::shared_ptr<void> params; /* the parameters by value, as a graph node keeps them */
};
struct emu_capture_state {
    fa_gpu_stream stream; /* NULL: not capturing */
    char violation[256];  /* the first refused operation ("" none) */
    std::vector<emu_recorded_launch> graph;
};
inline emu_capture_state &emu_capture()
{
    static emu_capture_state state;
    return state;
}
/* emuSuccess outside a capture; inside one, the refusal of `what`. */
inline emuError_t emu_capture_refuses(const char *what)
{
    emu_capture_state &c = emu_capture();
    if (!c.stream) return emuSuccess;
    if (!c.violation[0]) snprintf(c.violation, sizeof c.violation, "%s during stream capture", what);
    fprintf(stderr, "emulator: %s during stream capture (not capturable)\n", what);
    return emu_record(emuErrorStreamCaptureUnsupported);
}

inline emuError_t emuGetDeviceCount(int *count)
{
    *count = 1;
    return emuSuccess;
}
inline emuError_t emuSetDevice(int device) { return device == 0 ? emuSuccess : emu_record(emuErrorInvalidValue); }
inline emuError_t emuGetDeviceProperties(emuDeviceProp *p, int device)
{
    if (device != 0) return emu_record(emuErrorInvalidValue);
    memset(p, 0, sizeof *p);
#if defined(EMU_TARGET_CUDA)
    strcpy(p->name, "flashattn SIMT emulator (sm_80 model)");
    p->major = 8;
    p->minor = 0;
#elif defined(EMU_TARGET_HIP_CDNA)
    strcpy(p->name, "flashattn SIMT emulator (gfx90a model)");
    strcpy(p->gcnArchName, "gfx90a:sramecc+:xnack-");
    p->major = 9;
#else
    strcpy(p->name, "flashattn SIMT emulator (gfx1030 model)");
    strcpy(p->gcnArchName, "gfx1030");
    p->major = 10;
    p->minor = 3;
#endif
    p->multiProcessorCount = 1;
    p->warpSize = EMU_WARP_SIZE;
    p->totalGlobalMem = (size_t)1 << 30;
    return emuSuccess;
}
inline emuError_t emuDeviceGetAttribute(int *value, emuDeviceAttr attr, int device)
{
    if (device != 0) return emu_record(emuErrorInvalidValue);
    *value = attr == emuDevAttrMaxSharedMemoryPerBlockOptin ? EMU_SMEM_OPTIN : EMU_SMEM_DEFAULT_LIMIT;
    return emuSuccess;
}
inline emuError_t emuFuncSetAttribute(const void *kernel, emuFuncAttribute attr, int value)
{
    emu_runtime_state &rt = emu_runtime();
    if (attr != emuFuncAttributeMaxDynamicSharedMemorySize || value < 0 || value > EMU_SMEM_OPTIN)
        return emu_record(emuErrorInvalidValue);
    for (int i = 0; i < rt.raised_count; ++i)
        if (rt.raised_kernels[i] == kernel) {
            rt.raised_bytes[i] = value;
            return emuSuccess;
        }
    if (rt.raised_count == 256) return emu_record(emuErrorInvalidValue);
    rt.raised_kernels[rt.raised_count] = kernel;
    rt.raised_bytes[rt.raised_count++] = value;
    return emuSuccess;
}
inline int emu_smem_limit(const void *kernel)
{
    const emu_runtime_state &rt = emu_runtime();
    for (int i = 0; i < rt.raised_count; ++i)
        if (rt.raised_kernels[i] == kernel) return rt.raised_bytes[i] > EMU_SMEM_DEFAULT_LIMIT ? rt.raised_bytes[i] : EMU_SMEM_DEFAULT_LIMIT;
    return EMU_SMEM_DEFAULT_LIMIT;
}
/* Device memory is host memory of exactly the requested size (ASan sees overruns), 256-aligned. */
inline emuError_t emuMalloc(void **ptr, size_t bytes)
{
    *ptr = NULL;
    if (emu_capture_refuses("an allocation (cudaMalloc)")) return emuErrorStreamCaptureUnsupported;
    if (bytes == 0) return emuSuccess;
    if (posix_memalign(ptr, 256, bytes) != 0) {
        *ptr = NULL;
        return emu_record(emuErrorMemoryAllocation);
    }
    return emuSuccess;
}
inline emuError_t emuFree(void *ptr)
{
    if (emu_capture_refuses("a free (cudaFree)")) return emuErrorStreamCaptureUnsupported;
    free(ptr);
    return emuSuccess;
}
/* Launches run to completion, so every operation is complete when it returns. */
inline emuError_t emuMemcpyAsync(void *dst, const void *src, size_t bytes, emuMemcpyKind kind, fa_gpu_stream stream)
{
    (void)stream;
    if (emu_capture_refuses(kind == emuMemcpyHostToDevice   ? "a host-to-device copy (cudaMemcpyAsync)"
                            : kind == emuMemcpyDeviceToHost ? "a device-to-host copy (cudaMemcpyAsync)"
                                                            : "a device copy (cudaMemcpyAsync)"))
        return emuErrorStreamCaptureUnsupported;
    if (bytes && (!dst || !src)) return emu_record(emuErrorInvalidValue);
    if (bytes) memmove(dst, src, bytes);
    return emuSuccess;
}
inline emuError_t emuMemsetAsync(void *dst, int value, size_t bytes, fa_gpu_stream stream)
{
    (void)stream;
    if (emu_capture_refuses("a memset (cudaMemsetAsync)")) return emuErrorStreamCaptureUnsupported;
    if (bytes) memset(dst, value, bytes);
    return emuSuccess;
}
/* Kernels run to completion at launch, so nothing faults asynchronously. To test how the host code
 * reports such a fault, FLASHATTN_EMU_FAULT_AT_LAUNCH=N marks the N-th kernel launch of the process
 * (counting from 1) as faulted: the launch itself succeeds, and the next stream synchronisation
 * reports a launch failure, as after a kernel that faulted on a GPU. */
inline bool &emu_fault_pending()
{
    static bool pending;
    return pending;
}
inline void emu_count_launch()
{
    static long launches;
    const char *fault_at = getenv("FLASHATTN_EMU_FAULT_AT_LAUNCH");
    if (fault_at && ++launches == strtol(fault_at, nullptr, 10)) emu_fault_pending() = true;
}
inline emuError_t emuStreamSynchronize(fa_gpu_stream stream)
{
    (void)stream;
    if (emu_capture_refuses("a stream synchronisation (cudaStreamSynchronize)")) return emuErrorStreamCaptureUnsupported;
    if (!emu_fault_pending()) return emuSuccess;
    emu_fault_pending() = false;
    return emu_record(emuErrorLaunchFailure);
}
/* Streams and events for host code that orders work across streams (src/dist/ring_nccl.cu): every
 * operation completes when it is enqueued, so an event is complete as soon as it is recorded and a
 * stream waiting for it never waits. A stream is a distinct non-null handle, nothing more. */
typedef struct emu_event_state { int recorded; } *emuEvent_t;
typedef emuEvent_t fa_gpu_event;
enum { emuEventDisableTiming = 2, emuStreamNonBlocking = 1 };
inline emuError_t emuStreamCreateWithFlags(fa_gpu_stream *stream, unsigned flags)
{
    (void)flags;
    *stream = malloc(1);
    return *stream ? emuSuccess : emu_record(emuErrorMemoryAllocation);
}
inline emuError_t emuStreamDestroy(fa_gpu_stream stream)
{
    free(stream);
    return emuSuccess;
}
inline emuError_t emuEventCreateWithFlags(emuEvent_t *event, unsigned flags)
{
    (void)flags;
    *event = (emuEvent_t)calloc(1, sizeof **event);
    return *event ? emuSuccess : emu_record(emuErrorMemoryAllocation);
}
inline emuError_t emuEventDestroy(emuEvent_t event)
{
    free(event);
    return emuSuccess;
}
inline emuError_t emuEventRecord(emuEvent_t event, fa_gpu_stream stream)
{
    (void)stream;
    if (!event) return emu_record(emuErrorInvalidValue);
    event->recorded = 1;
    return emuSuccess;
}
/* FLASHATTN_EMU_EVENTS_PENDING=1 makes every event stay not ready, as behind a kernel that never
 * finishes (a peer that never posts its half of an exchange): for the callers' bounded waits. */
inline emuError_t emuEventQuery(emuEvent_t event)
{
    if (!event) return emu_record(emuErrorInvalidValue);
    const char *pending = getenv("FLASHATTN_EMU_EVENTS_PENDING");
    return pending && !strcmp(pending, "1") ? emuErrorNotReady : emuSuccess;
}
inline emuError_t emuStreamWaitEvent(fa_gpu_stream stream, emuEvent_t event, unsigned flags)
{
    (void)stream; (void)flags;
    return event ? emuSuccess : emu_record(emuErrorInvalidValue);
}
inline emuError_t emuMemcpy2DAsync(void *dst, size_t dpitch, const void *src, size_t spitch, size_t width, size_t height,
                                   emuMemcpyKind kind, fa_gpu_stream stream)
{
    (void)kind; (void)stream;
    if (emu_capture_refuses("a 2D copy (cudaMemcpy2DAsync)")) return emuErrorStreamCaptureUnsupported;
    if (width > dpitch || width > spitch) return emu_record(emuErrorInvalidValue);
    for (size_t r = 0; r < height; ++r) memmove((char *)dst + r * dpitch, (const char *)src + r * spitch, width);
    return emuSuccess;
}
inline emuError_t emuMallocHost(void **ptr, size_t bytes) { return emuMalloc(ptr, bytes); }
inline emuError_t emuFreeHost(void *ptr) { return emuFree(ptr); }

inline emuError_t emuGetLastError(void)
{
    const emuError_t e = emu_runtime().last_error;
    emu_runtime().last_error = emuSuccess;
    return e;
}
inline const char *emuGetErrorName(emuError_t e)
{
    switch (e) {
    case emuSuccess: return "emuSuccess";
    case emuErrorInvalidValue: return "emuErrorInvalidValue";
    case emuErrorMemoryAllocation: return "emuErrorMemoryAllocation";
    case emuErrorNoDevice: return "emuErrorNoDevice";
    case emuErrorInsufficientDriver: return "emuErrorInsufficientDriver";
    case emuErrorInvalidConfiguration: return "emuErrorInvalidConfiguration";
    case emuErrorLaunchFailure: return "emuErrorLaunchFailure";
    case emuErrorNotReady: return "emuErrorNotReady";
    case emuErrorStreamCaptureUnsupported: return "emuErrorStreamCaptureUnsupported";
    }
    return "emuErrorUnknown";
}
inline const char *emuGetErrorString(emuError_t e)
{
    switch (e) {
    case emuSuccess: return "no error";
    case emuErrorInvalidValue: return "invalid argument";
    case emuErrorMemoryAllocation: return "out of memory";
    case emuErrorInvalidConfiguration: return "invalid launch configuration (block size or shared memory)";
    case emuErrorLaunchFailure: return "unspecified launch failure";
    case emuErrorStreamCaptureUnsupported: return "operation not permitted when stream is capturing";
    default: return "emulated runtime error";
    }
}
inline emuError_t emuDriverGetVersion(int *v)
{
    *v = 0;
    return emuSuccess;
}
inline emuError_t emuRuntimeGetVersion(int *v)
{
    *v = 0;
    return emuSuccess;
}

/* The plugin's one launch point: checks the configuration as the runtime would, then runs the
 * grid to completion on the calling thread (or, on a capturing stream, records it with a copy of
 * its parameters). */
template <class Params>
static inline fa_gpu_error fa_gpu_launch(void (*kernel)(Params), dim3 grid, dim3 block, size_t smem_bytes,
                                         fa_gpu_stream stream, const Params &params)
{
    const unsigned long threads = (unsigned long)block.x * block.y * block.z;
    if (threads == 0 || threads > 1024 || grid.x == 0 || grid.y == 0 || grid.y > 65535 || grid.z == 0 || grid.z > 65535 ||
        smem_bytes > (size_t)emu_smem_limit((const void *)kernel))
        return emu_record(emuErrorInvalidConfiguration);
    ::emu::launch l;
    l.grid = {grid.x, grid.y, grid.z};
    l.block = {block.x, block.y, block.z};
    l.smem_bytes = smem_bytes;
    l.warp_size = EMU_WARP_SIZE;
    l.entry = [](const void *k, const void *p) { ((void (*)(Params))k)(*static_cast<const Params *>(p)); };
    l.kernel = (const void *)kernel;
    l.params = &params;
    emu_capture_state &capture = emu_capture();
    if (capture.stream && capture.stream == stream) {
        std::shared_ptr<Params> kept = std::make_shared<Params>(params);
        l.params = kept.get();
        capture.graph.push_back(emu_recorded_launch{l, kept});
        return emuSuccess;
    }
    ::emu::run(l);
    emu_count_launch();
    return emuSuccess;
}

/* ---- NVIDIA instructions (replaces src/gpu/nvidia/ptx.cuh) ---------------------------------- */
#define FA_GPU_PTX_CUH 1
inline void fa_ptx_cp_async16(void *smem_dst, const void *global_src, bool valid) { ::emu::copy_async16(smem_dst, global_src, valid); }
inline void fa_ptx_cp_async_commit(void) { ::emu::copy_async_commit(); }
template <int N> inline void fa_ptx_cp_async_wait_group(void)
{
    static_assert(N >= 0, "cp.async.wait_group takes a non-negative constant");
    ::emu::copy_async_wait_group(N);
}
inline void fa_ptx_ldmatrix_x4(uint32_t r[4], const uint16_t *row) { ::emu::ldmatrix_x4(r, row, false); }
inline void fa_ptx_ldmatrix_x4_trans(uint32_t r[4], const uint16_t *row) { ::emu::ldmatrix_x4(r, row, true); }
inline void fa_ptx_mma_m16n8k16_f16(float c[4], const uint32_t a[4], uint32_t b0, uint32_t b1) { ::emu::mma_m16n8k16(false, c, a, b0, b1); }
inline void fa_ptx_mma_m16n8k16_bf16(float c[4], const uint32_t a[4], uint32_t b0, uint32_t b1) { ::emu::mma_m16n8k16(true, c, a, b0, b1); }
/* cvt.rn.{f16x2,bf16x2}.f32 d, a, b: a in the upper half of d, b in the lower half. */
inline uint32_t fa_ptx_cvt_rn_f16x2(float a, float b)
{
    return (uint32_t)::emu::f16_bits_from_float(a) << 16 | ::emu::f16_bits_from_float(b);
}
inline uint32_t fa_ptx_cvt_rn_bf16x2(float a, float b)
{
    return (uint32_t)::emu::bf16_bits_from_float(a) << 16 | ::emu::bf16_bits_from_float(b);
}
/* ex2.approx.ftz.f32: subnormal inputs and results flush to (sign-preserving) zero; the hardware's
 * approximation (2 ulp at most) is modelled by the exact value, like the matrix products. */
inline float fa_ptx_ex2_approx_ftz(float x)
{
    if (fpclassify(x) == FP_SUBNORMAL) x = 0.0f;
    const float y = exp2f(x);
    return fpclassify(y) == FP_SUBNORMAL ? 0.0f : y;
}

/* ---- AMD instructions (replaces src/gpu/amd/amdgcn.cuh) ------------------------------------------- */
#define FA_HIP_AMDGCN_CUH 1
struct fa_amdgcn_half { uint16_t bits; };
struct fa_amdgcn_half4 {
    fa_amdgcn_half v[4];
    fa_amdgcn_half &operator[](int i) { return v[i]; }
};
inline fa_amdgcn_half fa_amdgcn_half_from_bits(uint16_t bits) { return fa_amdgcn_half{bits}; }
inline fa_amdgcn_half fa_amdgcn_half_from_float(float x) { return fa_amdgcn_half{::emu::f16_bits_from_float(x)}; }
#if defined(EMU_TARGET_HIP_CDNA)
#  define FA_AMDGCN_HAVE_MFMA 1
inline void fa_amdgcn_mfma_f32_16x16x16f16(float c[4], fa_amdgcn_half4 a, fa_amdgcn_half4 b)
{
    const uint16_t av[4] = {a.v[0].bits, a.v[1].bits, a.v[2].bits, a.v[3].bits};
    const uint16_t bv[4] = {b.v[0].bits, b.v[1].bits, b.v[2].bits, b.v[3].bits};
    ::emu::mfma_f32_16x16x16f16(c, av, bv);
}
#endif
#endif
