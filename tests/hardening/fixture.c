#include "fixture.h"

#include <stdlib.h>
#include <string.h>

#include "common/half.h"
#include "test_util.h"

static const uint32_t sentinel = FIXTURE_SENTINEL;

static uint64_t splitmix(uint64_t *state)
{
    uint64_t z = (*state += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

size_t fixture_elements(const fa_tensor *t)
{
    return (size_t)(t->batch * t->seqlen * t->heads * t->head_dim);
}

static size_t tensor_bytes(const fa_tensor *t)
{
    return fixture_elements(t) * test_dtype_size(t->dtype);
}

size_t fixture_q_bytes(const fixture *f) { return tensor_bytes(&f->q); }
size_t fixture_k_bytes(const fixture *f) { return tensor_bytes(&f->k); }
size_t fixture_lse_bytes(const fixture *f)
{
    return (size_t)(f->shape.batch * f->shape.heads_q * f->shape.seqlen_q) * sizeof(float);
}

float fixture_get(const fa_tensor *t, size_t i)
{
    switch (t->dtype) {
    case FA_DTYPE_F16: return fa_f16_to_f32(((const uint16_t *)t->data)[i]);
    case FA_DTYPE_BF16: return fa_bf16_to_f32(((const uint16_t *)t->data)[i]);
    default: return ((const float *)t->data)[i];
    }
}

void fixture_set(fa_tensor *t, size_t i, float value)
{
    switch (t->dtype) {
    case FA_DTYPE_F16: ((uint16_t *)t->data)[i] = fa_f32_to_f16(value); break;
    case FA_DTYPE_BF16: ((uint16_t *)t->data)[i] = fa_f32_to_bf16(value); break;
    default: ((float *)t->data)[i] = value; break;
    }
}

static int make_tensor(fa_tensor *t, fa_dtype dtype, int64_t batch, int64_t seqlen, int64_t heads, int64_t d)
{
    *t = (fa_tensor){NULL, dtype, batch, seqlen, heads, d, 0, 0, 0};
    t->data = malloc(tensor_bytes(t) + 4); /* + 4: never a zero-byte malloc */
    return t->data != NULL;
}

static void fill(fa_tensor *t, uint64_t *rng)
{
    const size_t n = fixture_elements(t);
    for (size_t i = 0; i < n; ++i) fixture_set(t, i, (float)((double)(splitmix(rng) >> 11) * 0x1p-52 - 1.0));
}

static void poison(void *data, size_t bytes)
{
    for (size_t i = 0; i + 4 <= bytes; i += 4) memcpy((char *)data + i, &sentinel, 4);
}

/* 1 if no aligned 4-byte word of data equals the sentinel. */
static int no_sentinel(const void *data, size_t bytes)
{
    for (size_t i = 0; i + 4 <= bytes; i += 4)
        if (memcmp((const char *)data + i, &sentinel, 4) == 0) return 0;
    return 1;
}

int fixture_init(fixture *f, const oracle_shape *s, fa_dtype dtype, uint64_t seed)
{
    memset(f, 0, sizeof *f);
    f->shape = *s;
    f->dtype = dtype;
    fa_attention_desc_init(&f->desc);
    int ok = make_tensor(&f->q, dtype, s->batch, s->seqlen_q, s->heads_q, s->head_dim) &&
             make_tensor(&f->k, dtype, s->batch, s->seqlen_k, s->heads_kv, s->head_dim) &&
             make_tensor(&f->v, dtype, s->batch, s->seqlen_k, s->heads_kv, s->head_dim) &&
             make_tensor(&f->out, dtype, s->batch, s->seqlen_q, s->heads_q, s->head_dim) &&
             make_tensor(&f->dout, dtype, s->batch, s->seqlen_q, s->heads_q, s->head_dim) &&
             make_tensor(&f->dq, dtype, s->batch, s->seqlen_q, s->heads_q, s->head_dim) &&
             make_tensor(&f->dk, dtype, s->batch, s->seqlen_k, s->heads_kv, s->head_dim) &&
             make_tensor(&f->dv, dtype, s->batch, s->seqlen_k, s->heads_kv, s->head_dim);
    f->lse = ok ? malloc(fixture_lse_bytes(f)) : NULL;
    if (!f->lse) {
        fixture_free(f);
        return 0;
    }
    uint64_t rng = seed;
    fill(&f->q, &rng);
    fill(&f->k, &rng);
    fill(&f->v, &rng);
    fill(&f->dout, &rng);
    fixture_poison_forward(f);
    fixture_poison_gradients(f);
    return 1;
}

void fixture_free(fixture *f)
{
    void *buffers[] = {f->q.data, f->k.data, f->v.data, f->out.data, f->dout.data,
                       f->dq.data, f->dk.data, f->dv.data, f->lse};
    for (size_t i = 0; i < sizeof buffers / sizeof buffers[0]; ++i) free(buffers[i]);
    memset(f, 0, sizeof *f);
}

void fixture_poison_forward(fixture *f)
{
    poison(f->out.data, tensor_bytes(&f->out));
    poison(f->lse, fixture_lse_bytes(f));
}

void fixture_poison_gradients(fixture *f)
{
    poison(f->dq.data, tensor_bytes(&f->dq));
    poison(f->dk.data, tensor_bytes(&f->dk));
    poison(f->dv.data, tensor_bytes(&f->dv));
}

int fixture_forward_written(const fixture *f)
{
    return no_sentinel(f->out.data, tensor_bytes(&f->out)) && no_sentinel(f->lse, fixture_lse_bytes(f));
}

int fixture_gradients_written(const fixture *f)
{
    return no_sentinel(f->dq.data, tensor_bytes(&f->dq)) && no_sentinel(f->dk.data, tensor_bytes(&f->dk)) &&
           no_sentinel(f->dv.data, tensor_bytes(&f->dv));
}

/* 1 if every aligned 4-byte word of data equals the sentinel. */
static int all_sentinel(const void *data, size_t bytes)
{
    for (size_t i = 0; i + 4 <= bytes; i += 4)
        if (memcmp((const char *)data + i, &sentinel, 4) != 0) return 0;
    return 1;
}

int fixture_forward_untouched(const fixture *f)
{
    return all_sentinel(f->out.data, tensor_bytes(&f->out)) && all_sentinel(f->lse, fixture_lse_bytes(f));
}

int fixture_gradients_untouched(const fixture *f)
{
    return all_sentinel(f->dq.data, tensor_bytes(&f->dq)) && all_sentinel(f->dk.data, tensor_bytes(&f->dk)) &&
           all_sentinel(f->dv.data, tensor_bytes(&f->dv));
}

int fixture_forward_identical(const fixture *a, const fixture *b)
{
    return memcmp(a->out.data, b->out.data, tensor_bytes(&a->out)) == 0 &&
           memcmp(a->lse, b->lse, fixture_lse_bytes(a)) == 0;
}

int fixture_gradients_identical(const fixture *a, const fixture *b)
{
    return memcmp(a->dq.data, b->dq.data, tensor_bytes(&a->dq)) == 0 &&
           memcmp(a->dk.data, b->dk.data, tensor_bytes(&a->dk)) == 0 &&
           memcmp(a->dv.data, b->dv.data, tensor_bytes(&a->dv)) == 0;
}

fa_status fixture_forward(fa_context *ctx, fixture *f)
{
    return fa_forward(ctx, &f->desc, &f->q, &f->k, &f->v, &f->out, f->lse);
}

fa_status fixture_backward(fa_context *ctx, fixture *f)
{
    return fa_backward(ctx, &f->desc, &f->q, &f->k, &f->v, &f->out, &f->dout, f->lse, &f->dq, &f->dk, &f->dv);
}

fa_context *fixture_ctx;

int fixture_context_setup(void **state)
{
    (void)state;
    return fa_context_create(FA_BACKEND_CPU, 0, &fixture_ctx) == FA_SUCCESS ? 0 : -1;
}

int fixture_context_teardown(void **state)
{
    (void)state;
    fa_context_destroy(fixture_ctx);
    fixture_ctx = NULL;
    return 0;
}
