/* fa-bench's optional PyTorch column: bench/cpu/torch_sdpa.py run as a child process that times
 * torch's CPU scaled_dot_product_attention on request, so both libraries are measured in the
 * same run, cell by cell, with the same shapes and thread count. */
#ifndef FA_BENCH_TORCH_COLUMN_H
#define FA_BENCH_TORCH_COLUMN_H
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <sys/types.h>

typedef struct torch_column {
    FILE *to, *from; /* the child's stdin and stdout; NULL when there is no column */
    pid_t pid;
    char about[128]; /* "PyTorch 2.x (n threads)", or why there is no column */
} torch_column;

/* Starts the script with $FA_BENCH_PYTHON (default python3); 0 when torch loaded. */
int torch_column_start(torch_column *t, int threads, int cpu_clock);
/* Milliseconds of one cell (pass: fwd, bwd, fwd+bwd), or -1 (t->about then says why). */
/* layout: "bhnd", the tensors [B, H, N, d] (PyTorch's own layout), or "bnhd", [B, N, H, d] viewed as it. */
double torch_column_time(torch_column *t, const char *pass, int64_t n, int64_t d, int heads, const char *layout, int causal,
                         int reps, double min_seconds, int median);
void torch_column_stop(torch_column *t);
#endif
