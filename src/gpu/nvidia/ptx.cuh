/* Every NVIDIA inline-asm instruction of the kernels, one small function each (PTX ISA names).
 * The SIMT emulator (tests/gpu/emu) defines the guard first and provides host models of the same
 * functions, so the kernels that call them run unchanged on the CPU. Statements that read or
 * write memory carry a "memory" clobber so the compiler keeps the surrounding loads and stores
 * in order. */
#ifndef FA_GPU_PTX_CUH
#define FA_GPU_PTX_CUH
#include <stdint.h>

#include "../gpu_runtime.h"

__device__ __forceinline__ unsigned fa_ptx_shared_address(const void *p)
{
    return static_cast<unsigned>(__cvta_generic_to_shared(p));
}

/* cp.async.cg.shared.global: 16 bytes, zero-filled when !valid (nothing is read). */
__device__ __forceinline__ void fa_ptx_cp_async16(void *smem_dst, const void *global_src, bool valid)
{
    const int src_bytes = valid ? 16 : 0;
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(fa_ptx_shared_address(smem_dst)), "l"(global_src),
                 "r"(src_bytes)
                 : "memory");
}

__device__ __forceinline__ void fa_ptx_cp_async_commit(void) { asm volatile("cp.async.commit_group;\n" ::: "memory"); }

/* cp.async.wait_group N: waits until at most the N most recent of this thread's committed groups
 * are pending (every older group has landed); copies issued since the last commit form no group
 * and are not waited for. */
template <int N> __device__ __forceinline__ void fa_ptx_cp_async_wait_group(void)
{
    static_assert(N >= 0, "cp.async.wait_group takes a non-negative constant");
    asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}

/* ldmatrix.sync.aligned.m8n8.x4[.trans].shared.b16: this lane's row address of one 8x8 matrix. */
__device__ __forceinline__ void fa_ptx_ldmatrix_x4(uint32_t r[4], const uint16_t *row)
{
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(fa_ptx_shared_address(row))
                 : "memory");
}

__device__ __forceinline__ void fa_ptx_ldmatrix_x4_trans(uint32_t r[4], const uint16_t *row)
{
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(fa_ptx_shared_address(row))
                 : "memory");
}

/* mma.sync.aligned.m16n8k16.row.col.f32.{f16,bf16}.{f16,bf16}.f32: c += A B. */
__device__ __forceinline__ void fa_ptx_mma_m16n8k16_f16(float c[4], const uint32_t a[4], uint32_t b0, uint32_t b1)
{
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
                 "{%0, %1, %2, %3};\n"
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

__device__ __forceinline__ void fa_ptx_mma_m16n8k16_bf16(float c[4], const uint32_t a[4], uint32_t b0, uint32_t b1)
{
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
                 "{%0, %1, %2, %3};\n"
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

/* cvt.rn.{f16x2,bf16x2}.f32 d, a, b: d = {a rounded in the upper half, b rounded in the lower}. */
__device__ __forceinline__ uint32_t fa_ptx_cvt_rn_f16x2(float a, float b)
{
    uint32_t d;
    asm("cvt.rn.f16x2.f32 %0, %1, %2;\n" : "=r"(d) : "f"(a), "f"(b));
    return d;
}

__device__ __forceinline__ uint32_t fa_ptx_cvt_rn_bf16x2(float a, float b)
{
    uint32_t d;
    asm("cvt.rn.bf16x2.f32 %0, %1, %2;\n" : "=r"(d) : "f"(a), "f"(b));
    return d;
}
/* ex2.approx.ftz.f32: 2^x in one MUFU.EX2. exp2f is the same instruction plus a rescaling of
 * inputs below -126 so that subnormal results survive (four more instructions per element);
 * probabilities below 2^-126 add nothing a row sum of at least 1 can hold, so they flush to 0. */
__device__ __forceinline__ float fa_ptx_ex2_approx_ftz(float x)
{
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
    return y;
}
#endif
