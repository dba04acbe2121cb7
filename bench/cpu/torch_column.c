#define _POSIX_C_SOURCE 200809L /* fdopen */
#include "torch_column.h"

#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#ifndef FA_BENCH_TORCH_SCRIPT
#define FA_BENCH_TORCH_SCRIPT "bench/cpu/torch_sdpa.py"
#endif

/* One line from the child, without its newline; 0 at end of file. */
static int read_line(torch_column *t, char *line, size_t size)
{
    if (!fgets(line, (int)size, t->from)) return 0;
    line[strcspn(line, "\n")] = '\0';
    return 1;
}

int torch_column_start(torch_column *t, int threads, int cpu_clock)
{
    *t = (torch_column){0};
    const char *python = getenv("FA_BENCH_PYTHON"), *script = getenv("FA_BENCH_TORCH_SCRIPT");
    if (!python || !python[0]) python = "python3";
    if (!script || !script[0]) script = FA_BENCH_TORCH_SCRIPT;
    int to_child[2], from_child[2];
    if (pipe(to_child) || pipe(from_child)) {
        snprintf(t->about, sizeof t->about, "PyTorch column: no pipe");
        return -1;
    }
    char threads_text[16];
    snprintf(threads_text, sizeof threads_text, "%d", threads);
    fflush(NULL);
    t->pid = fork();
    if (t->pid == 0) {
        dup2(to_child[0], 0);
        dup2(from_child[1], 1);
        close(to_child[0]); close(to_child[1]); close(from_child[0]); close(from_child[1]);
        execlp(python, python, script, threads_text, cpu_clock ? "cpu" : "wall", (char *)NULL);
        printf("error cannot run %s\n", python);
        _exit(127);
    }
    close(to_child[0]);
    close(from_child[1]);
    if (t->pid < 0) {
        close(to_child[1]); close(from_child[0]);
        snprintf(t->about, sizeof t->about, "PyTorch column: fork failed");
        return -1;
    }
    t->to = fdopen(to_child[1], "w");
    t->from = fdopen(from_child[0], "r");
    char line[256];
    if (t->to && t->from && read_line(t, line, sizeof line) && !strncmp(line, "ready ", 6)) {
        char version[64] = "?";
        int torch_threads = 0;
        sscanf(line + 6, "%63s %d", version, &torch_threads);
        snprintf(t->about, sizeof t->about, "PyTorch %s scaled_dot_product_attention, %d threads", version, torch_threads);
        return 0;
    }
    torch_column_stop(t);
    snprintf(t->about, sizeof t->about, "PyTorch column: none (%s: %.80s)", python,
             strncmp(line, "error ", 6) ? "no answer" : line + 6);
    return -1;
}

double torch_column_time(torch_column *t, const char *pass, int64_t n, int64_t d, int heads, const char *layout, int causal,
                         int reps, double min_seconds, int median)
{
    if (!t->to) return -1.0;
    fprintf(t->to, "%s %lld %lld %d %d %d %g %d %s\n", pass, (long long)n, (long long)d, heads, causal, reps, min_seconds,
            median, layout);
    fflush(t->to);
    char line[256];
    if (!read_line(t, line, sizeof line)) {
        snprintf(t->about, sizeof t->about, "PyTorch column: the script stopped");
        torch_column_stop(t);
        return -1.0;
    }
    char *end;
    const double ms = strtod(line, &end);
    if (end == line) {
        fprintf(stderr, "\nfa-bench: PyTorch: %s\n", line);
        return -1.0;
    }
    return ms;
}

void torch_column_stop(torch_column *t)
{
    if (t->to) fclose(t->to); /* end of input: the script returns */
    if (t->from) fclose(t->from);
    if (t->pid > 0) waitpid(t->pid, NULL, 0);
    t->to = t->from = NULL;
    t->pid = 0;
}
