/* causal_gqa: grouped-query attention (8 query heads share 2 key/value heads) with a causal mask
 * over a key/value cache longer than the new queries, the shape of a decoding step that appends
 * 4 tokens to 16 cached ones. The causal mask is bottom-right aligned: query i sees keys
 * j <= i + (seqlen_k - seqlen_q). Checks every output row and lse against a direct computation,
 * and dV, which sums over the query heads of each group, against the same. Exits 0 when all hold.
 *   cc causal_gqa.c $(pkg-config --cflags --libs flashattn) -lm      (example.h beside it) */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include <flashattn.h>

#include "example.h"

enum { HEADS_Q = 8, HEADS_KV = 2, SEQ_Q = 4, SEQ_K = 20, DIM = 16 };
enum { GROUP = HEADS_Q / HEADS_KV };
#define Q_COUNT ((size_t)SEQ_Q * HEADS_Q * DIM)
#define KV_COUNT ((size_t)SEQ_K * HEADS_KV * DIM)

int main(void)
{
    /* Packed [batch = 1, seqlen, heads, head_dim], host copies. */
    static float q[Q_COUNT], k[KV_COUNT], v[KV_COUNT], out[Q_COUNT], dout[Q_COUNT], dv[KV_COUNT];
    static float lse[HEADS_Q * SEQ_Q];
    unsigned seed = 7;
    for (size_t e = 0; e < Q_COUNT; ++e) q[e] = uniform(&seed), dout[e] = uniform(&seed);
    for (size_t e = 0; e < KV_COUNT; ++e) k[e] = uniform(&seed), v[e] = uniform(&seed);

    enum { Q, K, V, OUT, DOUT, DQ, DK, DV, LSE, NBUF };
    const size_t bytes[NBUF] = {Q_COUNT * 4, KV_COUNT * 4, KV_COUNT * 4, Q_COUNT * 4, Q_COUNT * 4,
                                Q_COUNT * 4, KV_COUNT * 4, KV_COUNT * 4, sizeof lse};
    const float *inputs[NBUF] = {[Q] = q, [K] = k, [V] = v, [DOUT] = dout};
    void *dev[NBUF] = {0};
    fa_context *ctx = NULL;
    int ok = 0;

    TRY(fa_context_create(FA_BACKEND_AUTO, 0, &ctx));
    printf("backend %s: %s\n", fa_backend_name(fa_context_backend(ctx)), fa_context_info(ctx));
    for (int n = 0; n < NBUF; ++n) {
        TRY(fa_malloc(ctx, bytes[n], &dev[n]));
        if (inputs[n]) TRY(fa_memcpy_h2d(ctx, dev[n], inputs[n], bytes[n]));
    }
    fa_tensor t[DV + 1];
    for (int n = Q; n <= DV; ++n) {
        const int is_q_shaped = n == Q || n == OUT || n == DOUT || n == DQ;
        t[n] = (fa_tensor){.data = dev[n], .dtype = FA_DTYPE_F32, .batch = 1,
                           .seqlen = is_q_shaped ? SEQ_Q : SEQ_K, .heads = is_q_shaped ? HEADS_Q : HEADS_KV,
                           .head_dim = DIM};
    }
    fa_attention_desc desc;
    fa_attention_desc_init(&desc);
    desc.causal = 1;
    TRY(fa_forward(ctx, &desc, &t[Q], &t[K], &t[V], &t[OUT], dev[LSE]));
    TRY(fa_backward(ctx, &desc, &t[Q], &t[K], &t[V], &t[OUT], &t[DOUT], dev[LSE], &t[DQ], &t[DK], &t[DV]));
    TRY(fa_synchronize(ctx));
    TRY(fa_memcpy_d2h(ctx, out, dev[OUT], bytes[OUT]));
    TRY(fa_memcpy_d2h(ctx, dv, dev[DV], bytes[DV]));
    TRY(fa_memcpy_d2h(ctx, lse, dev[LSE], bytes[LSE]));

    /* Direct computation: query head h reads kv head h / GROUP; dV_j = sum over the group's heads
     * and the queries of P_ij dO_i. */
    static double dv_want[KV_COUNT];
    double worst_out = 0.0, worst_lse = 0.0, worst_dv = 0.0;
    for (int h = 0; h < HEADS_Q; ++h) {
        const int g = h / GROUP;
        for (int i = 0; i < SEQ_Q; ++i) {
            const int last = i + (SEQ_K - SEQ_Q); /* bottom-right causal: keys 0..last */
            double p[SEQ_K], max = -INFINITY, sum = 0.0;
            for (int j = 0; j <= last; ++j) {
                double s = 0.0;
                for (int c = 0; c < DIM; ++c) s += (double)q[(i * HEADS_Q + h) * DIM + c] * k[(j * HEADS_KV + g) * DIM + c];
                p[j] = s / sqrt((double)DIM);
                max = fmax(max, p[j]);
            }
            for (int j = 0; j <= last; ++j) sum += p[j] = exp(p[j] - max);
            worst_lse = fmax(worst_lse, fabs(lse[h * SEQ_Q + i] - (max + log(sum))));
            for (int c = 0; c < DIM; ++c) {
                double o = 0.0;
                for (int j = 0; j <= last; ++j) {
                    o += p[j] / sum * v[(j * HEADS_KV + g) * DIM + c];
                    dv_want[(j * HEADS_KV + g) * DIM + c] += p[j] / sum * dout[(i * HEADS_Q + h) * DIM + c];
                }
                worst_out = fmax(worst_out, fabs(out[(i * HEADS_Q + h) * DIM + c] - o));
            }
        }
    }
    for (size_t e = 0; e < KV_COUNT; ++e) worst_dv = fmax(worst_dv, fabs(dv[e] - dv_want[e]));
    printf("causal GQA, %d query heads on %d kv heads, %d new queries over %d keys: max |diff| out %.2e, lse %.2e, dV %.2e\n",
           HEADS_Q, HEADS_KV, SEQ_Q, SEQ_K, worst_out, worst_lse, worst_dv);
    ok = worst_out <= 1e-5 && worst_lse <= 1e-5 && worst_dv <= 1e-5;

done:
    for (int n = 0; n < NBUF; ++n)
        if (dev[n]) fa_free(ctx, dev[n]);
    fa_context_destroy(ctx);
    printf("causal_gqa: %s\n", ok ? "all checks passed" : "FAILED");
    return ok ? 0 : 1;
}
