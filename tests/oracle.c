/* The test oracle: standard attention (Algorithm 0) and its gradients (Algorithm 3) in double
 * precision, one element at a time. Philox comes from Random123's reference header, not from
 * src/common/philox.h, so that a bug in the library's generator cannot hide itself. */
#include "oracle.h"

#include <Random123/philox.h>
#include "test_arrays.h"
#include <math.h>
#include <stdlib.h>
#include <string.h>

static double resolved_scale(const oracle_shape *s, const fa_attention_desc *desc)
{
    return desc->softmax_scale != 0.0f ? (double)desc->softmax_scale : 1.0 / sqrt((double)s->head_dim);
}

/* The block's global lengths (desc->seqlen_*_global, 0 = the local ones). */
static int64_t global_q(const oracle_shape *s, const fa_attention_desc *desc)
{
    return desc->seqlen_q_global ? desc->seqlen_q_global : s->seqlen_q;
}
static int64_t global_k(const oracle_shape *s, const fa_attention_desc *desc)
{
    return desc->seqlen_k_global ? desc->seqlen_k_global : s->seqlen_k;
}

/* Global key position minus global diagonal position of (i, j): > 0 right of the diagonal. */
static int64_t key_past_diagonal(const oracle_shape *s, const fa_attention_desc *desc, int64_t i, int64_t j)
{
    const int64_t gi = desc->q_offset + i, gj = desc->k_offset + j;
    return gj - (gi + global_k(s, desc) - global_q(s, desc)); /* bottom-right alignment */
}

int oracle_visible(const oracle_shape *s, const fa_attention_desc *desc, int64_t b, int64_t i, int64_t j)
{
    const int64_t past = key_past_diagonal(s, desc, i, j);
    if (desc->seqlens_k && j >= desc->seqlens_k[b]) return 0;
    if (desc->causal && past > 0) return 0;
    if (desc->window_left >= 0 && past < -desc->window_left) return 0;
    if (desc->window_right >= 0 && past > desc->window_right) return 0;
    const fa_block_mask *bm = desc->block_mask;
    if (bm && bm->mask[(i / bm->block_q) * bm->cols + j / bm->block_k] == 0) return 0;
    return 1;
}

int oracle_dropout_keep(const oracle_shape *s, const fa_attention_desc *desc, int64_t b, int64_t h, int64_t i,
                        int64_t j)
{
    if (desc->dropout_p == 0.0f) return 1;
    const uint64_t element = (((uint64_t)b * (uint64_t)s->heads_q + (uint64_t)h) * (uint64_t)global_q(s, desc) +
                              (uint64_t)(desc->q_offset + i)) * (uint64_t)global_k(s, desc) +
                             (uint64_t)(desc->k_offset + j);
    const uint64_t group = element >> 2;
    philox4x32_ctr_t counter = {{(uint32_t)group, (uint32_t)(group >> 32), (uint32_t)desc->dropout_offset,
                                 (uint32_t)(desc->dropout_offset >> 32)}};
    philox4x32_key_t key = {{(uint32_t)desc->dropout_seed, (uint32_t)(desc->dropout_seed >> 32)}};
    const philox4x32_ctr_t words = philox4x32_R(10, counter, key);
    /* 24 bits: exact in both float and double, so comparing in double equals comparing in float. */
    const double u = ldexp((double)(words.v[element & 3u] >> 8), -24);
    return !(u < (double)desc->dropout_p);
}

/* Index of bias element (b, h, i, j) of a bias or dbias description. */
static size_t bias_index(const fa_bias *bias, int64_t b, int64_t h, int64_t i, int64_t j)
{
    return (size_t)(b * bias->stride_batch + h * bias->stride_head + i * bias->stride_q + j);
}

/* The score of a visible (i, j) from x = tau * q.k: softcap, ALiBi, bias, in that order.
 * *dx (may be NULL) receives d score / d x (the softcap's derivative). */
static double modified_score(const oracle_shape *s, const fa_attention_desc *desc, int64_t b, int64_t h, int64_t i,
                             int64_t j, double x, double *dx)
{
    double score = x, slope = 0.0;
    if (dx) *dx = 1.0;
    if (desc->softcap > 0.0f) {
        const double cap = desc->softcap, t = tanh(x / cap);
        score = cap * t;
        if (dx) *dx = 1.0 - t * t;
    }
    if (desc->alibi_slopes) slope = desc->alibi_slopes[(desc->alibi_per_batch ? b * s->heads_q : 0) + h];
    score -= slope * fabs((double)key_past_diagonal(s, desc, i, j));
    if (desc->bias) score += test_load_element(desc->bias->data, bias_index(desc->bias, b, h, i, j), desc->bias->dtype);
    return score;
}

/* One query row of one (batch, head): the softmax probabilities P (0 where invisible), the
 * dropout factors (0 or 1/(1-p)) and d score / d (tau q.k) per key. Returns the natural-log
 * normaliser (the sink included), -INFINITY when it is empty (then P is all zero). */
static double softmax_row(const oracle_shape *s, const fa_attention_desc *desc, const double *q, const double *k,
                          int64_t b, int64_t h, int64_t i, double *p_row, double *drop_row, double *dx_row)
{
    const int64_t hk = h / (s->heads_q / s->heads_kv);
    const int64_t d = s->head_dim;
    const double tau = resolved_scale(s, desc);
    const double *qi = q + ((b * s->seqlen_q + i) * s->heads_q + h) * d;
    const double sink = desc->sinks ? (double)desc->sinks[h] : -INFINITY;
    double row_max = sink;
    for (int64_t j = 0; j < s->seqlen_k; ++j) {
        dx_row[j] = 0.0;
        if (!oracle_visible(s, desc, b, i, j)) {
            p_row[j] = -INFINITY;
            continue;
        }
        const double *kj = k + ((b * s->seqlen_k + j) * s->heads_kv + hk) * d;
        double dot = 0.0;
        for (int64_t x = 0; x < d; ++x) dot += qi[x] * kj[x];
        p_row[j] = modified_score(s, desc, b, h, i, j, tau * dot, &dx_row[j]);
        if (p_row[j] > row_max) row_max = p_row[j];
    }
    const double keep_scale = 1.0 / (1.0 - (double)desc->dropout_p);
    double sum = row_max == -INFINITY ? 0.0 : exp(sink - row_max);
    for (int64_t j = 0; j < s->seqlen_k; ++j) {
        p_row[j] = row_max == -INFINITY ? 0.0 : exp(p_row[j] - row_max);
        sum += p_row[j];
        drop_row[j] = oracle_dropout_keep(s, desc, b, h, i, j) ? keep_scale : 0.0;
    }
    if (sum == 0.0) return -INFINITY;
    for (int64_t j = 0; j < s->seqlen_k; ++j) p_row[j] /= sum;
    return row_max + log(sum);
}

void oracle_forward(const oracle_shape *s, const fa_attention_desc *desc, const double *q, const double *k,
                    const double *v, double *out, double *lse)
{
    const int64_t d = s->head_dim;
    double *p_row = malloc((size_t)s->seqlen_k * sizeof *p_row);
    double *drop_row = malloc((size_t)s->seqlen_k * sizeof *drop_row);
    double *dx_row = malloc((size_t)s->seqlen_k * sizeof *dx_row);
    if (!p_row || !drop_row || !dx_row) abort();
    for (int64_t b = 0; b < s->batch; ++b)
        for (int64_t h = 0; h < s->heads_q; ++h) {
            const int64_t hk = h / (s->heads_q / s->heads_kv);
            for (int64_t i = 0; i < s->seqlen_q; ++i) {
                const double row_lse = softmax_row(s, desc, q, k, b, h, i, p_row, drop_row, dx_row);
                if (lse) lse[(b * s->heads_q + h) * s->seqlen_q + i] = row_lse;
                double *oi = out + ((b * s->seqlen_q + i) * s->heads_q + h) * d;
                for (int64_t x = 0; x < d; ++x) oi[x] = 0.0;
                for (int64_t j = 0; j < s->seqlen_k; ++j) {
                    const double z = p_row[j] * drop_row[j];
                    if (z == 0.0) continue;
                    const double *vj = v + ((b * s->seqlen_k + j) * s->heads_kv + hk) * d;
                    for (int64_t x = 0; x < d; ++x) oi[x] += z * vj[x];
                }
            }
        }
    free(p_row);
    free(drop_row);
    free(dx_row);
}

void oracle_backward(const oracle_shape *s, const fa_attention_desc *desc, const double *q, const double *k,
                     const double *v, const double *dout, double *dq, double *dk, double *dv)
{
    oracle_backward_ex(s, desc, q, k, v, dout, dq, dk, dv, NULL, NULL);
}

void oracle_dbias_shape(const oracle_shape *s, const fa_attention_desc *desc, fa_bias *packed, size_t *count)
{
    const fa_bias *bias = desc->bias;
    const int64_t rows = bias->stride_q ? s->seqlen_q : 1, heads = bias->stride_head ? s->heads_q : 1;
    const int64_t batches = bias->stride_batch ? s->batch : 1;
    *packed = (fa_bias){NULL, FA_DTYPE_F32, bias->stride_batch ? heads * rows * s->seqlen_k : 0,
                        bias->stride_head ? rows * s->seqlen_k : 0, bias->stride_q ? s->seqlen_k : 0};
    *count = (size_t)(batches * heads * rows * s->seqlen_k);
}

void oracle_backward_ex(const oracle_shape *s, const fa_attention_desc *desc, const double *q, const double *k,
                        const double *v, const double *dout, double *dq, double *dk, double *dv, double *dsinks,
                        double *dbias)
{
    const int64_t d = s->head_dim;
    const double tau = resolved_scale(s, desc);
    fa_bias dbias_at;
    size_t dbias_count = 0;
    if (dbias) oracle_dbias_shape(s, desc, &dbias_at, &dbias_count);
    for (size_t x = 0; x < dbias_count; ++x) dbias[x] = 0.0;
    for (int64_t h = 0; dsinks && h < s->heads_q; ++h) dsinks[h] = 0.0;
    const size_t kv_count = (size_t)(s->batch * s->seqlen_k * s->heads_kv * d);
    memset(dq, 0, (size_t)(s->batch * s->seqlen_q * s->heads_q * d) * sizeof *dq);
    memset(dk, 0, kv_count * sizeof *dk);
    memset(dv, 0, kv_count * sizeof *dv);
    double *p_row = malloc((size_t)s->seqlen_k * sizeof *p_row);
    double *drop_row = malloc((size_t)s->seqlen_k * sizeof *drop_row);
    double *dp_row = malloc((size_t)s->seqlen_k * sizeof *dp_row);
    double *o_row = malloc((size_t)d * sizeof *o_row);
    double *dx_row = malloc((size_t)s->seqlen_k * sizeof *dx_row);
    if (!p_row || !drop_row || !dp_row || !o_row || !dx_row) abort();
    for (int64_t b = 0; b < s->batch; ++b)
        for (int64_t h = 0; h < s->heads_q; ++h) {
            const int64_t hk = h / (s->heads_q / s->heads_kv);
            for (int64_t i = 0; i < s->seqlen_q; ++i) {
                const double row_lse = softmax_row(s, desc, q, k, b, h, i, p_row, drop_row, dx_row);
                const size_t qi_at = (size_t)(((b * s->seqlen_q + i) * s->heads_q + h) * d);
                const double *qi = q + qi_at, *doi = dout + qi_at;
                double *dqi = dq + qi_at;
                /* O_i = Z_i V with Z = dropout(P); dP = dropout(dO V^T); D_i = dO_i . O_i */
                for (int64_t x = 0; x < d; ++x) o_row[x] = 0.0;
                for (int64_t j = 0; j < s->seqlen_k; ++j) {
                    dp_row[j] = 0.0;
                    if (p_row[j] == 0.0) continue;
                    const double *vj = v + ((b * s->seqlen_k + j) * s->heads_kv + hk) * d;
                    double dot = 0.0;
                    for (int64_t x = 0; x < d; ++x) {
                        o_row[x] += p_row[j] * drop_row[j] * vj[x];
                        dot += doi[x] * vj[x];
                    }
                    dp_row[j] = drop_row[j] * dot;
                }
                double row_d = 0.0;
                for (int64_t x = 0; x < d; ++x) row_d += doi[x] * o_row[x];
                /* the sink: a logit with no value, so its dP is 0 */
                if (dsinks && desc->sinks[h] != -INFINITY && row_lse != -INFINITY)
                    dsinks[h] -= exp((double)desc->sinks[h] - row_lse) * row_d;
                for (int64_t j = 0; j < s->seqlen_k; ++j) {
                    if (p_row[j] == 0.0) continue;
                    const size_t kj_at = (size_t)(((b * s->seqlen_k + j) * s->heads_kv + hk) * d);
                    const double z = p_row[j] * drop_row[j];
                    const double ds_score = p_row[j] * (dp_row[j] - row_d); /* d loss / d score */
                    if (dbias) dbias[bias_index(&dbias_at, b, h, i, j)] += ds_score;
                    const double ds = ds_score * dx_row[j];
                    for (int64_t x = 0; x < d; ++x) {
                        dv[kj_at + x] += z * doi[x];
                        dqi[x] += tau * ds * k[kj_at + x];
                        dk[kj_at + x] += tau * ds * qi[x];
                    }
                }
            }
        }
    free(p_row);
    free(drop_row);
    free(dp_row);
    free(o_row);
    free(dx_row);
}
