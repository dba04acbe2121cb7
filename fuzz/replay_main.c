/* A main() for the fuzz targets without libFuzzer: runs LLVMFuzzerTestOneInput once on every file
 * named on the command line and on every file under each named directory (sorted by name, so runs
 * are repeatable). It lets any compiler build a target (gcc with --coverage for the coverage report,
 * scripts/ci-coverage.sh) to replay the corpora and the regression inputs:
 *   cc -Iinclude -Isrc -Itests fuzz/fuzz_kvcache.c fuzz/replay_main.c <support objects, archives>
 *   ./a.out fuzz/corpus/fuzz_kvcache fuzz/regressions/fuzz_kvcache
 * Each input is copied into a buffer of exactly its size, as libFuzzer does, so ASan catches a
 * read past its end. A failing input aborts, as under libFuzzer; the exit status is 1 when a path
 * cannot be read. */
#define _POSIX_C_SOURCE 200809L
#include <dirent.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static size_t inputs;

static int run_file(const char *path)
{
    FILE *f = fopen(path, "rb");
    if (!f) {
        fprintf(stderr, "replay: cannot open %s\n", path);
        return 1;
    }
    size_t size = 0, cap = 0;
    uint8_t *data = NULL;
    for (;;) {
        if (size == cap) {
            cap = cap ? 2 * cap : 4096;
            uint8_t *grown = realloc(data, cap);
            if (!grown) {
                fprintf(stderr, "replay: out of memory reading %s\n", path);
                free(data), fclose(f);
                return 1;
            }
            data = grown;
        }
        const size_t got = fread(data + size, 1, cap - size, f);
        size += got;
        if (got == 0) break;
    }
    const int failed = ferror(f);
    fclose(f);
    if (failed) {
        fprintf(stderr, "replay: cannot read %s\n", path);
        free(data);
        return 1;
    }
    /* An exact-size copy: a read past the input's end lands outside the allocation. */
    uint8_t *exact = malloc(size ? size : 1);
    if (!exact) {
        free(data);
        return 1;
    }
    if (size) memcpy(exact, data, size);
    free(data);
    LLVMFuzzerTestOneInput(exact, size);
    free(exact);
    ++inputs;
    return 0;
}

static int by_name(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

static int run_path(const char *path)
{
    struct stat st;
    if (stat(path, &st) != 0) {
        fprintf(stderr, "replay: no such file or directory: %s\n", path);
        return 1;
    }
    if (!S_ISDIR(st.st_mode)) return run_file(path);
    DIR *dir = opendir(path);
    if (!dir) {
        fprintf(stderr, "replay: cannot open directory %s\n", path);
        return 1;
    }
    char **names = NULL;
    size_t count = 0, cap = 0;
    int status = 0;
    for (struct dirent *e; (e = readdir(dir));) {
        if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..")) continue;
        if (count == cap) {
            cap = cap ? 2 * cap : 64;
            char **grown = realloc(names, cap * sizeof *names);
            if (!grown) {
                status = 1;
                break;
            }
            names = grown;
        }
        const size_t length = strlen(path) + strlen(e->d_name) + 2;
        if (!(names[count] = malloc(length))) {
            status = 1;
            break;
        }
        snprintf(names[count++], length, "%s/%s", path, e->d_name);
    }
    closedir(dir);
    if (count) qsort(names, count, sizeof *names, by_name);
    for (size_t i = 0; i < count; ++i) {
        status |= run_path(names[i]);
        free(names[i]);
    }
    free(names);
    return status;
}

int main(int argc, char **argv)
{
    int status = 0;
    for (int i = 1; i < argc; ++i) status |= run_path(argv[i]);
    fprintf(stderr, "replay: %zu inputs run\n", inputs);
    return status;
}
