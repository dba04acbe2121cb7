/* block_sparse: block-sparse attention with a local + global pattern: 256 tokens in blocks of 32,
 * each block attends to its neighbours and to the first block, and the first block attends to
 * everything (fa_block_mask_local_global). Blocks the mask zeroes are skipped without loading
 * their keys. Checks every output row against softmax over the visible keys computed directly.
 * Exits 0 when the check holds.
 *   cc block_sparse.c $(pkg-config --cflags --libs flashattn) -lm      (example.h beside it) */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include <flashattn.h>

#include "example.h"

enum { SEQ = 256, HEADS = 2, DIM = 32, BLOCK = 32, BLOCKS = SEQ / BLOCK };
#define COUNT ((size_t)SEQ * HEADS * DIM)

int main(void)
{
    /* Packed [batch = 1, seqlen, heads, head_dim], host copies. */
    static float host[3][COUNT], out[COUNT];
    unsigned seed = 11;
    for (int n = 0; n < 3; ++n)
        for (size_t e = 0; e < COUNT; ++e) host[n][e] = uniform(&seed);
    const float *q = host[0], *k = host[1], *v = host[2];

    static uint8_t blocks[BLOCKS * BLOCKS];
    void *dev[4] = {0};
    fa_context *ctx = NULL;
    int ok = 0;
    TRY(fa_block_mask_local_global(BLOCKS, BLOCKS, 1, 1, blocks));
    int visible = 0;
    for (int b = 0; b < BLOCKS * BLOCKS; ++b) visible += blocks[b] != 0;
    const fa_block_mask mask = {.block_q = BLOCK, .block_k = BLOCK, .rows = BLOCKS, .cols = BLOCKS, .mask = blocks};

    TRY(fa_context_create(FA_BACKEND_AUTO, 0, &ctx));
    printf("backend %s: %s\n", fa_backend_name(fa_context_backend(ctx)), fa_context_info(ctx));
    fa_tensor t[4];
    for (int n = 0; n < 4; ++n) {
        TRY(fa_malloc(ctx, sizeof out, &dev[n]));
        if (n < 3) TRY(fa_memcpy_h2d(ctx, dev[n], host[n], sizeof out));
        t[n] = (fa_tensor){.data = dev[n], .dtype = FA_DTYPE_F32, .batch = 1, .seqlen = SEQ, .heads = HEADS,
                           .head_dim = DIM};
    }
    fa_attention_desc desc;
    fa_attention_desc_init(&desc);
    desc.block_mask = &mask;
    TRY(fa_forward(ctx, &desc, &t[0], &t[1], &t[2], &t[3], NULL));
    TRY(fa_memcpy_d2h(ctx, out, dev[3], sizeof out));

    double worst = 0.0;
    for (int h = 0; h < HEADS; ++h)
        for (int i = 0; i < SEQ; ++i) {
            double p[SEQ], max = -INFINITY, sum = 0.0;
            for (int j = 0; j < SEQ; ++j) {
                p[j] = -INFINITY;
                if (!blocks[(i / BLOCK) * BLOCKS + j / BLOCK]) continue;
                double s = 0.0;
                for (int c = 0; c < DIM; ++c) s += (double)q[(i * HEADS + h) * DIM + c] * k[(j * HEADS + h) * DIM + c];
                p[j] = s / sqrt((double)DIM);
                max = fmax(max, p[j]);
            }
            for (int j = 0; j < SEQ; ++j) sum += p[j] = exp(p[j] - max); /* exp(-inf) = 0 */
            for (int c = 0; c < DIM; ++c) {
                double o = 0.0;
                for (int j = 0; j < SEQ; ++j) o += p[j] / sum * v[(j * HEADS + h) * DIM + c];
                worst = fmax(worst, fabs(out[(i * HEADS + h) * DIM + c] - o));
            }
        }
    printf("block-sparse, %d of %d blocks of %dx%d visible (density %.2f): max |diff| vs direct masked softmax %.2e\n",
           visible, BLOCKS * BLOCKS, BLOCK, BLOCK, (double)visible / (BLOCKS * BLOCKS), worst);
    ok = worst <= 1e-5;

done:
    for (int n = 0; n < 4; ++n)
        if (dev[n]) fa_free(ctx, dev[n]);
    fa_context_destroy(ctx);
    printf("block_sparse: %s\n", ok ? "all checks passed" : "FAILED");
    return ok ? 0 : 1;
}
