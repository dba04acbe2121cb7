/* NEON (AArch64 Advanced SIMD) microkernels: 4 lanes, a 12 x 8 register tile (24 of the 32
 * q registers accumulate). NEON is mandatory on AArch64, so no extra flags and no run-time check.
 * NEON has no masked loads or stores: tails (the first n < 4 lanes) go through a small buffer
 * with scalar copies, never touching memory past the n-th element. */
#include <arm_neon.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "../kernels.h"

#define VEC float32x4_t
#define W 4
#define MR 12
#define KNAME(x) neon_##x
#define MASK_T int /* a lane count: the first n lanes */
#define VMASK(n) ((int)(n))
#define VLOAD(p) vld1q_f32(p)
#define VSTORE(p, v) vst1q_f32(p, v)
#define VMLOAD(p, m) neon_load_first(p, m)
#define VMSTORE(p, m, v) neon_store_first(p, m, v)
#define VSET1(x) vdupq_n_f32(x)
#define VZERO() vdupq_n_f32(0.0f)
#define VFMA(a, b, c) vfmaq_f32(c, a, b)
#define VFNMA(a, b, c) vfmsq_f32(c, a, b)
#define VADD(a, b) vaddq_f32(a, b)
#define VSUB(a, b) vsubq_f32(a, b)
#define VDIV(a, b) vdivq_f32(a, b)
#define VABS(x) vabsq_f32(x)
#define VCOPYSIGN(m, s) vbslq_f32(vdupq_n_u32(0x80000000u), s, m)
#define VSELECT_GE(a, b, y, n) vbslq_f32(vcgeq_f32(a, b), y, n)
#define VSELECT_EQ(a, b, y, n) vbslq_f32(vceqq_f32(a, b), y, n)
#define VMUL(a, b) vmulq_f32(a, b)
#define VMAX(a, b) vmaxq_f32(a, b)
#define VMIN(a, b) vminq_f32(a, b)
#define VROUND(x) vrndnq_f32(x)
/* y * 2^n for integral n in [-126, 127]: n + 127 in the exponent field */
#define VSCALE2(y, n) \
    vmulq_f32(y, vreinterpretq_f32_s32(vshlq_n_s32(vaddq_s32(vcvtnq_s32_f32(n), vdupq_n_s32(127)), 23)))
#define VZERO_BELOW(y, x, lo) vreinterpretq_f32_u32(vbicq_u32(vreinterpretq_u32_f32(y), vcltq_f32(x, lo)))
#define VLOAD_F16(p) vcvt_f32_f16(vreinterpret_f16_u16(vld1_u16(p)))
#define VSTORE_F16(p, v) vst1_u16(p, vreinterpret_u16_f16(vcvt_f16_f32(v))) /* FPCR rounding: nearest even */
/* Quantised cache codes (vector_kernels.h, cache_load): 4 bytes. */
#define VLOAD_I8(p) vcvtq_f32_s32(vmovl_s16(vget_low_s16(vmovl_s8(vreinterpret_s8_u32(vdup_n_u32(neon_load_u32(p)))))))
#define VLOAD_BYTES_U16(p) vget_low_u16(vmovl_u8(vreinterpret_u8_u32(vdup_n_u32(neon_load_u32(p)))))
#define VLOAD_E5M2(p) vcvt_f32_f16(vreinterpret_f16_u16(vshl_n_u16(VLOAD_BYTES_U16(p), 8)))
#define VLOAD_E4M3_OVER_256(p) vcvt_f32_f16(vreinterpret_f16_u16(neon_e4m3_as_f16(VLOAD_BYTES_U16(p))))
#define VLOAD_BF16(p) vreinterpretq_f32_u32(vshll_n_u16(vld1_u16(p), 16))
#define VHSUM(v) vaddvq_f32(v)
#define NT_NR 4
/* Lane i = the sum of the lanes of acc[i]: pairwise adds of neighbours, twice. */
#define VSUM_TRANSPOSED(acc) vpaddq_f32(vpaddq_f32((acc)[0], (acc)[1]), vpaddq_f32((acc)[2], (acc)[3]))
#define PV_CB 4 /* 16 accumulators, 4 V vectors and a broadcast: 21 of the 32 q registers */

/* E4M3 codes (one per 16-bit lane) as binary16 bits of value / 2^8 (avx512_kernels.c says how). */
static inline uint16x4_t neon_e4m3_as_f16(uint16x4_t u)
{
    const uint16x4_t bits = vand_u16(vreinterpret_u16_s16(vshr_n_s16(vreinterpret_s16_u16(vshl_n_u16(u, 8)), 1)),
                                     vdup_n_u16(0xbfff));
    return vorr_u16(bits, vceq_u16(vand_u16(u, vdup_n_u16(0x7f)), vdup_n_u16(0x7f)));
}

/* Four bytes of a quantised cache row (any alignment). */
static inline uint32_t neon_load_u32(const void *p)
{
    uint32_t u;
    memcpy(&u, p, sizeof u);
    return u;
}

static inline float32x4_t neon_load_first(const float *p, int n)
{
    float lanes[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    for (int i = 0; i < n; ++i) lanes[i] = p[i];
    return vld1q_f32(lanes);
}

static inline void neon_store_first(float *p, int n, float32x4_t v)
{
    float lanes[4];
    vst1q_f32(lanes, v);
    for (int i = 0; i < n; ++i) p[i] = lanes[i];
}

#include "../vector_kernels.h"

const fa_cpu_kernels fa_cpu_kernels_neon = FA_VECTOR_KERNEL_TABLE("neon");
