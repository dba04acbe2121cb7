/* The benchmarks' one FLOP convention for attention (its Python twin: bench/flops.py; the two must
 * say the same). Per (batch, head) pair, for each visible (query, key) score: 4 d FLOPs forward
 * (Q K^T and P V, 2 d each); the backward 2.5x the forward (dV, dP, dQ, dK products plus the
 * recomputed S: 5 products of 2 d), forward + backward 3.5x. Causal counts only the visible scores,
 * bottom-right aligned as the library's mask (include/flashattn.h): with seqlen_q = seqlen_k = N
 * that is N(N+1)/2, not N^2/2. Softmax, scaling and masking are not counted. */
#ifndef FA_BENCH_FLOPS_H
#define FA_BENCH_FLOPS_H
#include <stdint.h>

typedef enum fa_bench_pass { FA_BENCH_FWD, FA_BENCH_BWD, FA_BENCH_FWDBWD } fa_bench_pass;

/* Visible (query, key) scores of one head: seqlen_q x seqlen_k, or under the causal mask
 * (query i sees keys j <= i + seqlen_k - seqlen_q) the lower-right triangle. */
static inline double fa_bench_visible_scores(int64_t seqlen_q, int64_t seqlen_k, int causal)
{
    const double sq = (double)seqlen_q, sk = (double)seqlen_k;
    if (!causal) return sq * sk;
    if (seqlen_k >= seqlen_q) return sq * (sk - sq) + sq * (sq + 1.0) / 2.0;
    return sk * (sk + 1.0) / 2.0;
}

/* FLOPs of one pass over batch_heads (batch x heads_q) pairs. */
static inline double fa_bench_attention_flops(int64_t batch_heads, int64_t seqlen_q, int64_t seqlen_k,
                                              int64_t head_dim, int causal, fa_bench_pass which)
{
    const double fwd = 4.0 * fa_bench_visible_scores(seqlen_q, seqlen_k, causal) * (double)head_dim * (double)batch_heads;
    return which == FA_BENCH_FWD ? fwd : which == FA_BENCH_BWD ? 2.5 * fwd : 3.5 * fwd;
}
#endif
