#include <stdio.h>
#include <stdlib.h>
#include <stdint.h>
#include <time.h>
#include "flashattn.h"
int main(int argc, char **argv) {
    int64_t N = atoll(argv[1]), D = atoll(argv[2]), H = getenv("HEADS") ? atoll(getenv("HEADS")) : 8; int reps = atoi(argv[3]), thr = atoi(argv[4]); int fwdonly = argc > 5 && atoi(argv[5]); int f16 = argc > 6 && atoi(argv[6]);
    size_t n = N * H * D;
    float *q = malloc(n * 4), *k = malloc(n * 4), *v = malloc(n * 4), *o = malloc(n * 4), *dout = malloc(n * 4), *dq = malloc(n * 4), *dk = malloc(n * 4), *dv = malloc(n * 4), *lse = malloc(H * N * 4);
    uint64_t s = 42; for (size_t i = 0; i < n; ++i) { s = s * 6364136223846793005ull + 1; q[i] = (s >> 40) / 16777216.0f - 0.5f; k[i] = q[(i * 7919) % (i + 1)]; v[i] = q[i] * 0.5f; dout[i] = 0.25f - q[i]; }
    fa_dtype dt = FA_DTYPE_F32;
    if (f16) { dt = FA_DTYPE_F16; float *arrs[] = {q, k, v, dout}; for (int a = 0; a < 4; ++a) { _Float16 *h = (_Float16 *)arrs[a]; for (size_t i = 0; i < n; ++i) h[i] = (_Float16)arrs[a][i]; } }
    fa_context *ctx; fa_context_create(FA_BACKEND_CPU, 0, &ctx); fa_context_set_num_threads(ctx, thr);
    fa_attention_desc d; fa_attention_desc_init(&d);
    fa_tensor tq = {q, dt, 1, N, H, D}, tk = {k, dt, 1, N, H, D}, tv = {v, dt, 1, N, H, D}, to = {o, dt, 1, N, H, D}, tdo = {dout, dt, 1, N, H, D}, tdq = {dq, dt, 1, N, H, D}, tdk = {dk, dt, 1, N, H, D}, tdv = {dv, dt, 1, N, H, D};
    fa_forward(ctx, &d, &tq, &tk, &tv, &to, lse);
    for (int r = 0; r < reps; ++r) {
        struct timespec a, b; clock_gettime(CLOCK_MONOTONIC, &a);
        if (fwdonly) fa_forward(ctx, &d, &tq, &tk, &tv, &to, lse);
        else fa_backward(ctx, &d, &tq, &tk, &tv, &to, &tdo, lse, &tdq, &tdk, &tdv);
        clock_gettime(CLOCK_MONOTONIC, &b);
        double ms = (b.tv_sec - a.tv_sec) * 1e3 + (b.tv_nsec - a.tv_nsec) / 1e6, fl = 4.0 * N * N * D * H * (fwdonly ? 1 : 2.5);
        printf("%.2f ms %.1f GFLOP/s\n", ms, fl / ms / 1e6);
    }
    return 0;
}
