/* The shared test oracle: standard attention (the paper's Algorithm 0) and its backward
 * (Algorithm 3) in double precision, with exactly the semantics of the public API: scale,
 * causal (bottom-right), sliding window, key padding, block mask, GQA/MQA, dropout (the Philox
 * stream, computed here independently of src/common/philox.h), fully masked rows, and the score
 * modifiers (softcap, ALiBi, sinks, bias: read from desc, their arrays in host memory), and a
 * block's global positions (desc->q_offset, k_offset, seqlen_*_global).
 * It is deliberately naive (one element at a time) and shares no code with any backend.
 * Arrays are packed [batch, seqlen, heads, head_dim] doubles; lse is [batch, heads_q, seqlen_q]. */
#ifndef FA_TEST_ORACLE_H
#define FA_TEST_ORACLE_H
#include <stdint.h>

#include "flashattn.h"

typedef struct oracle_shape {
    int64_t batch, heads_q, heads_kv, seqlen_q, seqlen_k, head_dim;
} oracle_shape;

/* 1 if key j is visible to query i of batch b (causal, window, padding, block mask). */
int oracle_visible(const oracle_shape *s, const fa_attention_desc *desc, int64_t b, int64_t i, int64_t j);

/* 1 if element (b, h, i, j) of the attention matrix is kept by dropout (always 1 when p == 0). */
int oracle_dropout_keep(const oracle_shape *s, const fa_attention_desc *desc, int64_t b, int64_t h, int64_t i,
                        int64_t j);

void oracle_forward(const oracle_shape *s, const fa_attention_desc *desc, const double *q, const double *k,
                    const double *v, double *out, double *lse);

void oracle_backward(const oracle_shape *s, const fa_attention_desc *desc, const double *q, const double *k,
                     const double *v, const double *dout, double *dq, double *dk, double *dv);

/* oracle_backward plus dsinks [heads_q] (needs desc->sinks) and dbias (needs desc->bias): packed
 * doubles of the shape oracle_dbias_shape gives, the bias's broadcast axes summed. Either may be
 * NULL. */
void oracle_backward_ex(const oracle_shape *s, const fa_attention_desc *desc, const double *q, const double *k,
                        const double *v, const double *dout, double *dq, double *dk, double *dv, double *dsinks,
                        double *dbias);
/* dbias's packed layout: [batch or 1, heads_q or 1, seqlen_q or 1, seqlen_k] (1 where desc->bias
 * broadcasts), as strides of an fa_bias (data NULL), and its element count. */
void oracle_dbias_shape(const oracle_shape *s, const fa_attention_desc *desc, fa_bias *packed, size_t *count);
#endif
