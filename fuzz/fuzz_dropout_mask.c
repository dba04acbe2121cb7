/* libFuzzer target for fa_dropout_mask: decodes its input into one call (seed, offset, dropout_p,
 * heads_q, seqlen_q, seqlen_k, batch_index, head_index; ordinary or edge values of p, element indices
 * up to the 64-bit limit), or into one invalid argument, and checks
 *  - a valid call returns FA_SUCCESS and writes keep[i * seqlen_k + j] = oracle_dropout_keep(b, h, i, j)
 *    (tests/oracle.c: the documented Philox stream) for every element, each 0 or 1;
 *  - an invalid one (keep NULL, p outside [0, 1) or NaN, a size not positive, batch_index negative,
 *    head_index outside [0, heads_q), element indices past INT64_MAX) returns FA_ERROR_INVALID_VALUE
 *    with a message and writes nothing (keep keeps its canary bytes).
 * keep is allocated to its exact size, so AddressSanitizer sees any out-of-bounds write.
 * Input layout: fuzz/README.md. Build and run: scripts/ci-fuzz.sh. */
#include <float.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "flashattn.h"
#include "oracle.h"

#define FUZZ_TARGET "fuzz_dropout_mask"
#include "fuzz_common.h"

enum flags { F_HUGE = 1, F_SPECIAL_P = 2, F_CORRUPT = 128 };

enum corruption { C_KEEP_NULL, C_P, C_HEADS, C_SEQLEN_Q, C_SEQLEN_K, C_BATCH, C_HEAD, C_OVERFLOW, C_MODES };
static const char *const corruption_names[C_MODES] = {
    "keep NULL", "p outside [0, 1)", "heads_q not positive", "seqlen_q not positive", "seqlen_k not positive",
    "batch_index negative", "head_index outside [0, heads_q)", "element indices past INT64_MAX"};

/* Valid edge values of p: 0 and -0 (keep all), below the 2^-24 resolution of u, near 1. */
static const float special_p[] = {0.0f, -0.0f, 0x1p-149f, 1e-30f, 0x1p-25f, 0x1p-24f, 0x3p-24f, 0.25f, 0.5f,
                                  0.75f, 1.0f - 0x1p-23f, 1.0f - 0x1p-24f};
static const float invalid_p[] = {1.0f, 1.0f + 0x1p-23f, 2.0f, -0x1p-149f, -0.5f, NAN, -NAN, INFINITY, -INFINITY};

typedef struct call {
    uint64_t seed, offset;
    float p;
    int64_t heads, seqlen_q, seqlen_k, batch, head;
    int keep_null;
} call;

/* (b * heads + h + 1) * seqlen_q * seqlen_k, the end of the call's element range, saturated. */
static unsigned __int128 end_index(const call *c)
{
    const unsigned __int128 lim = (unsigned __int128)1 << 100;
    unsigned __int128 e = (unsigned __int128)c->batch * (unsigned __int128)c->heads + (unsigned __int128)c->head + 1;
    e = e > lim ? lim : e * (unsigned __int128)c->seqlen_q;
    e = e > lim ? lim : e * (unsigned __int128)c->seqlen_k;
    return e;
}

/* The largest batch_index whose elements end at or below INT64_MAX (-1: none). */
static int64_t max_batch(const call *c)
{
    const int64_t n = c->seqlen_q * c->seqlen_k, rows = INT64_MAX / n - c->head - 1;
    return rows < 0 ? -1 : rows / c->heads;
}

/* What the header and the stream's 64-bit index allow. */
static int valid(const call *c)
{
    return !c->keep_null && c->p >= 0.0f && c->p < 1.0f && c->heads > 0 && c->seqlen_q > 0 && c->seqlen_k > 0 &&
           c->batch >= 0 && c->head >= 0 && c->head < c->heads && end_index(c) <= (unsigned __int128)INT64_MAX;
}

static void corrupt(call *c, uint8_t byte)
{
    const unsigned variant = byte / C_MODES;
    const int64_t bad_size[] = {0, -1, -64, INT64_MIN};
    switch (byte % C_MODES) {
    case C_KEEP_NULL: c->keep_null = 1; break;
    case C_P: c->p = invalid_p[variant % (sizeof invalid_p / sizeof *invalid_p)]; break;
    case C_HEADS: c->heads = bad_size[variant % 4]; break;
    case C_SEQLEN_Q: c->seqlen_q = bad_size[variant % 4]; break;
    case C_SEQLEN_K: c->seqlen_k = bad_size[variant % 4]; break;
    case C_BATCH: c->batch = variant & 1 ? INT64_MIN : -1 - (int64_t)(variant / 2); break;
    case C_HEAD: {
        const int64_t bad[] = {-1, c->heads, c->heads + (int64_t)(variant / 4), INT64_MAX};
        c->head = bad[variant % 4];
        break;
    }
    default: /* C_OVERFLOW: just past the last valid batch_index, or a product of the sizes too large */
        switch (variant % 3) {
        case 0: {
            const __int128 b = (__int128)max_batch(c) + 1 + variant / 3;
            c->batch = b > INT64_MAX ? INT64_MAX : (int64_t)b;
            break;
        }
        case 1:
            if (c->seqlen_k == 1) c->seqlen_k = 2;
            c->seqlen_q = INT64_MAX / c->seqlen_k + 1 + (int64_t)(variant / 3);
            break;
        default: c->heads = INT64_MAX - (int64_t)(variant / 3), c->head = 0, c->batch = 2; break;
        }
        break;
    }
}

FUZZ_CHECKER static void check_mask(const call *c, const uint8_t *keep)
{
    const oracle_shape s = {c->batch + 1, c->heads, c->heads, c->seqlen_q, c->seqlen_k, 1};
    fa_attention_desc desc;
    fa_attention_desc_init(&desc);
    desc.dropout_p = c->p;
    desc.dropout_seed = c->seed;
    desc.dropout_offset = c->offset;
    for (int64_t i = 0; i < c->seqlen_q; ++i)
        for (int64_t j = 0; j < c->seqlen_k; ++j) {
            const uint8_t got = keep[i * c->seqlen_k + j];
            const int want = oracle_dropout_keep(&s, &desc, c->batch, c->head, i, j);
            if (got != want) {
                fprintf(stderr, FUZZ_TARGET ": keep[%lld * %lld + %lld] = %u, the stream says %d\n", (long long)i,
                        (long long)c->seqlen_k, (long long)j, (unsigned)got, want);
                abort();
            }
        }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    reader r = {data, size, 0};
    const uint8_t flags = next(&r), corruption = next(&r);
    call c = {0};
    c.seed = next_u64(&r);
    c.offset = next_u64(&r);
    const uint8_t pb = next(&r);
    c.p = flags & F_SPECIAL_P ? special_p[pb % (sizeof special_p / sizeof *special_p)] : (float)pb / 256.0f;
    c.heads = 1 + next(&r) % 16;
    c.seqlen_q = 1 + next(&r) % 64;
    c.seqlen_k = 1 + next(&r) % 64;
    c.batch = next(&r);
    c.head = next(&r) % c.heads;
    if (flags & F_HUGE) {
        /* Element indices up to the 64-bit limit: up to 2^47 heads, the last head or a low one, and
         * the largest batch_index that fits, less a slack. */
        const uint8_t hb = next(&r), head_byte = next(&r), slack = next(&r);
        c.heads = ((int64_t)1 << (hb % 48)) + (hb & 64 ? 0 : (int64_t)(hb / 48));
        c.head = head_byte & 128 ? c.heads - 1 - (int64_t)(head_byte & 127) % c.heads : (int64_t)head_byte % c.heads;
        const int64_t top = max_batch(&c);
        c.batch = top < 0 ? 0 : top - (int64_t)slack % (top + 1);
    }
    const size_t n = (size_t)(c.seqlen_q * c.seqlen_k); /* the valid sizes: keep's canary buffer */
    const int corrupted = flags & F_CORRUPT ? (corrupt(&c, corruption), corruption % C_MODES) : -1;
    const int ok = valid(&c);
    if (getenv("FUZZ_VERBOSE"))
        fprintf(stderr,
                "call: seed 0x%016llx offset 0x%016llx p %.9g heads_q %lld seqlen_q %lld seqlen_k %lld batch_index %lld "
                "head_index %lld keep %s; corrupt %s; %s\n",
                (unsigned long long)c.seed, (unsigned long long)c.offset, (double)c.p, (long long)c.heads,
                (long long)c.seqlen_q, (long long)c.seqlen_k, (long long)c.batch, (long long)c.head,
                c.keep_null ? "NULL" : "given", corrupted >= 0 ? corruption_names[corrupted] : "no",
                ok ? "valid" : "invalid");
    if (corrupted >= 0 && ok) {
        fprintf(stderr, FUZZ_TARGET ": corruption %s left a valid call (a bug in this target)\n", corruption_names[corrupted]);
        abort();
    }
    uint8_t *keep = malloc(n);
    memset(keep, 0xff, n);
    const fa_status st = fa_dropout_mask(c.seed, c.offset, c.p, c.heads, c.seqlen_q, c.seqlen_k, c.batch, c.head,
                                         c.keep_null ? NULL : keep);
    if (!ok) {
        if (st != FA_ERROR_INVALID_VALUE) {
            fprintf(stderr, FUZZ_TARGET ": invalid call (%s) returned %d (%s), expected FA_ERROR_INVALID_VALUE\n",
                    corrupted >= 0 ? corruption_names[corrupted] : "indices", (int)st, st ? fa_last_error() : "no error");
            abort();
        }
        if (!fa_last_error()[0]) {
            fprintf(stderr, FUZZ_TARGET ": invalid call failed without a message\n");
            abort();
        }
        if (!all_ff(keep, n)) {
            fprintf(stderr, FUZZ_TARGET ": invalid call failed (%s) but wrote keep\n", fa_last_error());
            abort();
        }
    } else {
        if (st != FA_SUCCESS) {
            fprintf(stderr, FUZZ_TARGET ": valid call failed: %s\n", fa_last_error());
            abort();
        }
        check_mask(&c, keep);
    }
    free(keep);
    return 0;
}
