/* throwaway: forward + backward_ex with softcap/alibi/causal, hash of every output */
#include <stdio.h>
#include <stdlib.h>
#include <stdint.h>
#include <string.h>
#include <math.h>
#include "flashattn.h"
static uint64_t h64(const void *p, size_t n, uint64_t h) { const unsigned char *c = p; for (size_t i = 0; i < n; ++i) { h ^= c[i]; h *= 1099511628211ull; } return h; }
int main(int argc, char **argv) {
    int64_t B = argc > 6 ? atoll(argv[6]) : 1, N = argc > 1 ? atoll(argv[1]) : 333, H = argc > 5 ? atoll(argv[5]) : 4, D = argc > 2 ? atoll(argv[2]) : 64;
    int causal = argc > 3 ? atoi(argv[3]) : 1; int alibi = argc > 4 ? atoi(argv[4]) : 1;
    size_t n = B * N * H * D;
    float *q = malloc(n * 4), *k = malloc(n * 4), *v = malloc(n * 4), *o = malloc(n * 4), *dout = malloc(n * 4), *dq = malloc(n * 4), *dk = malloc(n * 4), *dv = malloc(n * 4), *lse = malloc(B * H * N * 4);
    uint64_t s = 42; for (size_t i = 0; i < n; ++i) { s = s * 6364136223846793005ull + 1; q[i] = ((s >> 40) / 16777216.0f - 0.5f) * 8; s = s * 6364136223846793005ull + 1; k[i] = ((s >> 40) / 16777216.0f - 0.5f) * 8; s = s * 6364136223846793005ull + 1; v[i] = (s >> 40) / 16777216.0f - 0.5f; s = s * 6364136223846793005ull + 1; dout[i] = (s >> 40) / 16777216.0f - 0.5f; }
    float slopes[64]; for (int i = 0; i < 64; ++i) slopes[i] = 0.5f / (i + 1);
    fa_context *ctx; if (fa_context_create(FA_BACKEND_CPU, 0, &ctx)) return 1; if (getenv("THR")) fa_context_set_num_threads(ctx, atoi(getenv("THR")));
    fa_attention_desc d; fa_attention_desc_init(&d); d.causal = causal; d.softcap = getenv("NOCAP") ? 0.0f : 5.0f; if (alibi) d.alibi_slopes = slopes;
    fa_tensor tq = {q, FA_DTYPE_F32, B, N, H, D}, tk = {k, FA_DTYPE_F32, B, N, H, D}, tv = {v, FA_DTYPE_F32, B, N, H, D}, to = {o, FA_DTYPE_F32, B, N, H, D}, tdo = {dout, FA_DTYPE_F32, B, N, H, D}, tdq = {dq, FA_DTYPE_F32, B, N, H, D}, tdk = {dk, FA_DTYPE_F32, B, N, H, D}, tdv = {dv, FA_DTYPE_F32, B, N, H, D};
    if (fa_forward(ctx, &d, &tq, &tk, &tv, &to, lse)) { fprintf(stderr, "%s\n", fa_last_error()); return 1; }
    if (fa_backward_ex(ctx, &d, &tq, &tk, &tv, &to, &tdo, lse, &tdq, &tdk, &tdv, NULL, NULL)) { fprintf(stderr, "%s\n", fa_last_error()); return 1; }
    uint64_t h = 1469598103934665603ull; h = h64(o, n * 4, h); h = h64(lse, B * H * N * 4, h); printf("fwd %016llx ", (unsigned long long)h); h = h64(dq, n * 4, h); h = h64(dk, n * 4, h); h = h64(dv, n * 4, h);
    printf("all %016llx\n", (unsigned long long)h); fa_context_destroy(ctx); return 0;
}
