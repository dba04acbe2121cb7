/* The CPU microkernel contract (BLIS style). Every ISA provides the same table; the portable
 * reference in ref/ is always built and is the ground truth the ISA kernels are checked against
 * (tests/checkasm).
 *
 * Layout. The drivers keep every score tile transposed, S^T[key][query], so that the softmax
 * statistics of a query (max, sum, rescale factor) are one lane of a vector and every product is
 * one general "broadcast A, stream B" multiply:
 *   S^T  = K_j Q_i^T          A = K rows (read in place for f32), B = packed Q_i^T
 *   O_i  = alpha o O_i + P V_j A = (S^T)^T (rsa = 1, csa = ld), B = V rows in place,
 *                             alpha the online-softmax rescale folded into the update
 *   dV_j += P^T dO_i, dK_j += dS^T Q_i, dQ_i += dS K_j   (backward, same kernel)
 * All matrices are f32 and do not alias; sizes may be any positive value (no padding), kernels
 * never touch elements outside the extents given.
 *
 *   gemm:     A(i,p) = a[i*rsa + p*csa], B(p,j) = b[p*ldb + j], C(i,j) = c[i*ldc + j].
 *             accumulate == 0: C = A B;  otherwise C = diag(row_scale) C + A B
 *             (row_scale NULL = identity). Each C element's sum runs over p in increasing order.
 *   col_max:  out[j] = max over i < rows of x[i*ld + j]  (-inf when all are -inf).
 *   gemm_max: gemm with accumulate == 0 (C = A B) and col_max of the result, out[j] = max over
 *             i < m of C(i,j), taken from the registers: the forward's S^T = K Q^T of a fully
 *             visible tile without a second pass over S^T. C is the same bits as gemm's.
 *   exp_cols: x[i*ld + j] = exp(scale * x[i*ld + j] - shift[j]); sum[j] = sum over i of the results.
 *             exp(-inf) = 0, and shift[j] = +inf gives zeros. Accuracy: within 2 ulp of expf for
 *             arguments in [FA_EXP_LO, 88]; below FA_EXP_LO (-64 ln 2: results under 2^-64) every
 *             kernel, the reference included, returns 0 (exp_poly.h says why).
 *   softcap_cols: x[i*ld + j] = cap * tanh(x[i*ld + j] * (scale / cap)) + (-slope * |(first - i) + j|)
 *             (cap > 0; scale / cap one float; the ALiBi term as alibi_cols', slope 0 adds -0:
 *             softcap and ALiBi in one pass), -inf left as it is (masked stays masked); grad (NULL = not wanted, same
 *             layout) = 1 - t^2, t = (cap * tanh) / cap as the score has it (within an ulp or two of
 *             its tanh), what the backward's chain rule needs;
 *             col_max (NULL = not wanted) [cols] = max over i of the results, as col_max would
 *             give them. The forward and the backward both take their softcap from this kernel,
 *             so the backward recomputes the forward's P. tanh accuracy (tests/checkasm, dense
 *             sweep against tanh in double): ref = libm tanhf; the ISA kernels within 4e-7
 *             relative (about 5 ulp) for |x| >= 1e-35 and within 1e-38 absolute below, odd,
 *             tanh(+-0) = +-0, |tanh| <= 1 for every x (the score never beyond +-cap), +-1
 *             within 1 ulp from |x| >= 9 and for +-inf, NaN in gives NaN out.
 *   alibi_cols: x[i*ld + j] = x[i*ld + j] * scale - slope * |(first - i) + j| (the ALiBi bias of key
 *             row i and query column j; -inf stays -inf, whatever the scale's sign), with col_max as softcap_cols'. The same
 *             bits on every ISA (each step one IEEE operation, no fusing).
 *   gemm_scores: gemm_max with the score modifiers of `mods` applied to C in the registers, before
 *             the max and the store (the forward's fully visible tiles: no pass over S^T before the
 *             exponential): C = A B, then softcap_cols (mods->cap > 0, with the ALiBi term when
 *             mods->alibi), else alibi_cols (mods->alibi), with mods->scale, slope and first;
 *             col_max of the results. The same bits as the same ISA's gemm followed by that pass
 *             (what the backward runs): each element takes the same operations in the same order.
 *   gemm_ds:  C = A B, then C(i,j) = p[i*ldp + j] * (C(i,j) - delta[j]) in the registers (one
 *             subtraction, one multiplication, each rounded): the backward's
 *             dS^T = P^T o (V dO^T - D) without storing dP^T and sweeping it again.
 *   gemm_max_bf16: gemm_max for bfloat16 operands (the forward's and backward's S^T = K Q^T when q
 *             and k are bf16), NULL in a table whose CPU cannot run it (only the AVX-512 table
 *             handed out on a CPU with AVX512_BF16 has it: vdpbf16ps, and only where select.c's
 *             probe finds the instruction rounding as described below; elsewhere bf16 keeps the f32 product). A(i,p) = bf16 a[i*lda + p]
 *             (rows contiguous, read in place); B in pairs: the 32-bit word b[(p/2)*ldb + j] holds
 *             B(p,j) in its low and B(p+1,j) in its high half (p even; the high half 0 when
 *             p + 1 = k), fa_cpu_pack_bf16_pairs' layout. C(i,j) starts at +0 and takes, pair by
 *             pair in increasing p, acc = fma(A(i,p+1), B(p+1,j), acc) then acc = fma(A(i,p),
 *             B(p,j), acc): the odd element first, each step one f32 FMA rounded to nearest even
 *             (the products of bf16 values are exact in f32), with DAZ on every input (subnormal
 *             A, B and acc read as signed zeros) and FTZ on every result, tininess detected after
 *             rounding (a result that rounds, with an unbounded exponent, below 2^-126 becomes a
 *             signed zero): vdpbf16ps as Zen 4 computes it (a one-off probe: all of 2e7 random
 *             and edge steps agree with this rule; flushing by the exact sum missed 95, by
 *             fmaf's subnormal result 9, rounded products or no DAZ on acc thousands), checked bit for bit against the portable
 *             twin fa_cpu_ref_gemm_max_bf16 by tests/checkasm (NaN as NaN, payloads not). col_max NULL = not wanted, else gemm_max's
 *             col_max of the result. Not the f32 gemm's bits (another rounding order, and no
 *             subnormals): a problem keeps one or the other throughout (forward and backward).
 *   bias_cols: x[i*ld + j] = x[i*ld + j] * scale + bias_j[i] (two roundings; -inf stays -inf
 *             whatever the bias holds), bias_j = row j of a row-major bias of dtype f32, f16 or
 *             bf16 (widened exactly), at element j * ld_bias of bias (ld_bias 0: one row for all):
 *             the bias of a key-major score tile (row i = key i, column j = query j) read as it lies,
 *             query-major. col_max (NULL = not wanted) [cols]: the running max of column j continued
 *             over the results in increasing i (-inf in: col_max's bits), so that a tile's keys
 *             may come in several calls. The same bits on every ISA.
 *   transpose: dst[c*ld_dst + r] = src[r*ld_src + c] for r < rows, c < cols (ld_src may be 0: every
 *             row the same); pure data movement, the same bits on every ISA (Q_i^T and dO_i^T
 *             of a tile, fa_cpu_load_transposed).
 *   f16_to_f32: dst[i] = binary16 src[i] widened (exact).
 *   bf16_to_f32: dst[i] = bfloat16 src[i] widened (exact: the 16 bits become the top half).
 *   f32_to_f16: dst[i] = src[i] rounded to binary16, to nearest even, bit for bit as fa_f32_to_f16
 *             (common/half.h: overflow to inf, subnormal results, NaN quietened keeping the top payload).
 *   gemm_nt:  C(i,j) = sum over p of a[i*lda + p] * b[j*ldb + p]  (A B^T, both operands' rows
 *             contiguous; C written, not accumulated). For the decode's S^T = K Q^T with few
 *             query rows, where gemm would fill a few lanes of its 2W columns: the ISA kernels
 *             sum each element in the lanes of a vector, then across them, in a fixed order.
 *   decode_scores: the decode's S^T for the packed query rows of a GQA group, read straight from
 *             the cache: st[x*ldst + h*rows + r] = sum over p < d of K(x,h)[p] * q[h*ldq_head + r*d + p]
 *             for keys x < n, kv heads h < heads, rows r < rows, where K(x,h) is the row at element
 *             offset fa_decode_key_offset(x, ld_key, ld_quad) + h*ld_head of k, of `dtype`
 *             (f16/bf16 widened in registers, no copy; quantised codes without their scales: int8
 *             codes as integers, E5M2 codes as their values, E4M3 codes as their values / 2^8,
 *             which saves a multiply per vector: the caller folds 2^8 into its factors). Keys come in quads: key x is key x % 4 of
 *             quad x / 4. ld_quad = 4 * ld_key is a plain run of keys; ld_key = a far distance and
 *             ld_quad = one key's stride reads four separate runs side by side, four streams
 *             running front to back, which a core's prefetchers follow far better than one run
 *             read four keys (rows 2 KiB apart) at a time. The ISA kernels keep one accumulator per
 *             (row, key) of a block of W dot products and reduce the block with one
 *             transpose-and-add tree (not one horizontal sum each); key blocks run outermost,
 *             heads inside.
 *   decode_values: O = diag(alpha) O + P V for every kv head, V read straight from the cache:
 *             o[h*ldo_head + r*d + c] = alpha[h*rows + r] * o[..] + sum over x < n (increasing) of
 *             p[x*ldp + h*rows + r] * V(x,h)[c], V(x,h) as K(x,h) above; alpha NULL = 1.
 *   fma_chains: the FMA-peak probe's loop: `iterations` rounds of one FMA on each of the ISA's
 *             independent register-only chains (as many as gemm's register tile has
 *             accumulators: enough to cover FMA latency x pipes); returns the FLOPs done (2 per
 *             lane per FMA) and stores a value depending on every chain in *sink. The probe's
 *             driver is a benchmark tool outside the library (bench/cpu/probe/fma_peak.h); this
 *             loop stays here because it must be compiled with the ISA's flags, in the same
 *             per-ISA archive as the kernels whose limit it measures.
 * Results are deterministic: the same inputs give the same bits on every call and thread. */
#ifndef FA_CPU_KERNELS_H
#define FA_CPU_KERNELS_H
#include <stdint.h>

#include "flashattn.h"

/* What gemm_scores applies to each score (fa_cpu_score_mods_init, cpu_modifiers.h, fills it). */
typedef struct fa_cpu_score_mods {
    float scale; /* of q.k, applied by the first modifier */
    float cap;   /* > 0: softcap */
    int alibi;   /* 1: the ALiBi term -slope * |(first - i) + j| */
    float slope;
    int64_t first;
} fa_cpu_score_mods;

/* Element offset of key x of a decode kernel's keys (decode_scores above): key x % 4 of quad x / 4. */
static inline int64_t fa_decode_key_offset(int64_t x, int64_t ld_key, int64_t ld_quad)
{
    return x % 4 * ld_key + x / 4 * ld_quad;
}

/* The ISA tables name their fields (designated initialisers): a kernel added here cannot shift the others. */
typedef struct fa_cpu_kernels {
    const char *isa; /* "ref", "avx2", "avx512", "neon" */
    void (*gemm)(int64_t m, int64_t n, int64_t k, const float *a, int64_t rsa, int64_t csa, const float *b,
                 int64_t ldb, float *c, int64_t ldc, const float *row_scale, int accumulate);
    void (*col_max)(const float *x, int64_t ld, int64_t rows, int64_t cols, float *out);
    void (*exp_cols)(float *x, int64_t ld, int64_t rows, int64_t cols, float scale, const float *shift, float *sum);
    void (*softcap_cols)(float *x, int64_t ld, int64_t rows, int64_t cols, float scale, float cap, float slope,
                         int64_t first, float *grad, float *col_max);
    void (*alibi_cols)(float *x, int64_t ld, int64_t rows, int64_t cols, float scale, float slope, int64_t first,
                       float *col_max);
    void (*bias_cols)(float *x, int64_t ld, int64_t rows, int64_t cols, float scale, const void *bias, fa_dtype dtype,
                      int64_t ld_bias, float *col_max);
    void (*transpose)(const float *src, int64_t ld_src, int64_t rows, int64_t cols, float *dst, int64_t ld_dst);
    void (*f16_to_f32)(const uint16_t *src, float *dst, int64_t n);
    void (*bf16_to_f32)(const uint16_t *src, float *dst, int64_t n);
    void (*f32_to_f16)(const float *src, uint16_t *dst, int64_t n);
    void (*gemm_nt)(int64_t m, int64_t n, int64_t k, const float *a, int64_t lda, const float *b, int64_t ldb,
                    float *c, int64_t ldc);
    void (*gemm_max)(int64_t m, int64_t n, int64_t k, const float *a, int64_t rsa, int64_t csa, const float *b,
                     int64_t ldb, float *c, int64_t ldc, float *col_max);
    void (*gemm_scores)(int64_t m, int64_t n, int64_t k, const float *a, int64_t rsa, int64_t csa, const float *b,
                        int64_t ldb, float *c, int64_t ldc, const fa_cpu_score_mods *mods, float *col_max);
    void (*gemm_ds)(int64_t m, int64_t n, int64_t k, const float *a, int64_t rsa, int64_t csa, const float *b,
                    int64_t ldb, float *c, int64_t ldc, const float *p, int64_t ldp, const float *delta);
    void (*gemm_max_bf16)(int64_t m, int64_t n, int64_t k, const uint16_t *a, int64_t lda, const uint32_t *b,
                          int64_t ldb, float *c, int64_t ldc, float *col_max); /* NULL: not on this CPU */
    double (*fma_chains)(int64_t iterations, float *sink);
    void (*decode_scores)(int64_t n, int64_t heads, int64_t rows, int64_t d, const void *k, fa_dtype dtype,
                          int64_t ld_key, int64_t ld_quad, int64_t ld_head, const float *q, int64_t ldq_head, float *st,
                          int64_t ldst);
    void (*decode_values)(int64_t n, int64_t heads, int64_t rows, int64_t d, const float *p, int64_t ldp,
                          const void *v, fa_dtype dtype, int64_t ld_key, int64_t ld_quad, int64_t ld_head, float *o,
                          int64_t ldo_head, const float *alpha);
    /* Register tile (mr x nr) of gemm; tiles are snapped to multiples of tile_step. */
    int64_t mr, nr, tile_step;
} fa_cpu_kernels;

extern const fa_cpu_kernels fa_cpu_kernels_ref;
#ifdef FA_HAVE_AVX2
extern const fa_cpu_kernels fa_cpu_kernels_avx2;
#endif
#ifdef FA_HAVE_AVX512
extern const fa_cpu_kernels fa_cpu_kernels_avx512;
#endif
#if defined(FA_HAVE_AVX512BF16) || defined(FA_AVX512BF16) /* the library, the AVX-512 kernels */
/* fa_cpu_kernels_avx512 with gemm_max_bf16 (x86/avx512bf16_kernels.c): for CPUs with AVX512_BF16. */
extern const fa_cpu_kernels fa_cpu_kernels_avx512_bf16;
void fa_avx512bf16_gemm_max_bf16(int64_t m, int64_t n, int64_t k, const uint16_t *a, int64_t lda, const uint32_t *b,
                                 int64_t ldb, float *c, int64_t ldc, float *col_max);
#endif
/* gemm_max_bf16's portable twin (the instruction's arithmetic in C, slow): the ground truth of
 * tests/checkasm. Not in the reference table: the ref ISA keeps the f32 product for bf16 inputs. */
void fa_cpu_ref_gemm_max_bf16(int64_t m, int64_t n, int64_t k, const uint16_t *a, int64_t lda, const uint32_t *b,
                              int64_t ldb, float *c, int64_t ldc, float *col_max);
#ifdef FA_HAVE_NEON
extern const fa_cpu_kernels fa_cpu_kernels_neon;
#endif

/* The ISA names, newest first and "ref" last, on every target (an ISA not built here is "not
 * supported", not "unknown"): the one list that select.c, the error messages and checkasm use. */
enum { FA_CPU_ISA_COUNT = 4 };
const char *fa_cpu_isa_name(int index); /* 0 <= index < FA_CPU_ISA_COUNT */

/* The kernels for this CPU: FLASHATTN_CPU_ISA (ref|avx2|avx512|neon) if set, otherwise the
 * newest ISA the CPU supports (ref last). A forced ISA that is unknown (FA_ERROR_INVALID_VALUE)
 * or not built / not supported by this CPU (FA_ERROR_NOT_SUPPORTED) fails with the reason. */
fa_status fa_cpu_select_kernels(const fa_cpu_kernels **kernels);
/* The kernels of one named ISA if built and supported by this CPU, else NULL (no error set). */
const fa_cpu_kernels *fa_cpu_kernels_by_name(const char *isa);
#endif
