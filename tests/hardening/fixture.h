/* A CPU attention problem with all its host buffers: inputs filled from a seed, outputs
 * pre-filled with a sentinel so tests can tell whether the library wrote them. Shared by the
 * hardening tests (allocation failures, threads, determinism, extremes, bad inputs). */
#ifndef FA_HARDENING_FIXTURE_H
#define FA_HARDENING_FIXTURE_H
#include <stddef.h>
#include <stdint.h>

#include "flashattn.h"
#include "oracle.h"

/* A 4-byte pattern that is a NaN in f32 and holds a NaN in f16; the library never produces it
 * from finite inputs, so finding it in an output means "not written". */
#define FIXTURE_SENTINEL 0x7fa5a5a5u

typedef struct fixture {
    oracle_shape shape;
    fa_dtype dtype;
    fa_attention_desc desc;
    fa_tensor q, k, v, out, dout, dq, dk, dv; /* packed, host memory */
    float *lse;                               /* [batch, heads_q, seqlen_q] */
} fixture;

/* Allocates and fills q, k, v, dout with uniform values in [-1, 1] from seed; outputs get the
 * sentinel. Returns 0 when host memory runs out. desc starts as fa_attention_desc_init's. */
int fixture_init(fixture *f, const oracle_shape *shape, fa_dtype dtype, uint64_t seed);
void fixture_free(fixture *f);

/* Bytes of each tensor's data. */
size_t fixture_q_bytes(const fixture *f);
size_t fixture_k_bytes(const fixture *f);
size_t fixture_lse_bytes(const fixture *f);

/* Writes the sentinel byte pattern over the forward's outputs (out, lse) / the gradients. */
void fixture_poison_forward(fixture *f);
void fixture_poison_gradients(fixture *f);
/* 1 if no 4-byte word of those outputs still holds the sentinel (the library wrote them all). */
int fixture_forward_written(const fixture *f);
int fixture_gradients_written(const fixture *f);
/* 1 if every 4-byte word of those outputs still holds the sentinel (the library wrote none). */
int fixture_forward_untouched(const fixture *f);
int fixture_gradients_untouched(const fixture *f);
/* 1 if those outputs of a and b are bit-identical. */
int fixture_forward_identical(const fixture *a, const fixture *b);
int fixture_gradients_identical(const fixture *a, const fixture *b);

/* A CPU context for a whole cmocka group: pass these as the group's setup and teardown. */
extern fa_context *fixture_ctx;
int fixture_context_setup(void **state);
int fixture_context_teardown(void **state);

fa_status fixture_forward(fa_context *ctx, fixture *f);
fa_status fixture_backward(fa_context *ctx, fixture *f);

/* Element i of a tensor as float / set from float (any dtype, packed). */
float fixture_get(const fa_tensor *t, size_t i);
void fixture_set(fa_tensor *t, size_t i, float value);
size_t fixture_elements(const fa_tensor *t);
#endif
