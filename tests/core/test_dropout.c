/* The dropout stream: src/common/philox.h against Random123's published known-answer vectors and
 * its reference header; fa_dropout_mask against an independent computation (the oracle's, built on
 * Random123); keep rate; argument errors. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>

#include <Random123/philox.h>

#include "common/philox.h"
#include "oracle.h"
#include "test_util.h"

/* Philox4x32-10 lines of Random123's kat_vectors file: counter, key, expected output. */
static const struct { uint32_t ctr[4], key[2], out[4]; } kat[] = {
    {{0, 0, 0, 0}, {0, 0}, {0x6627e8d5u, 0xe169c58du, 0xbc57ac4cu, 0x9b00dbd8u}},
    {{0xffffffffu, 0xffffffffu, 0xffffffffu, 0xffffffffu}, {0xffffffffu, 0xffffffffu},
     {0x408f276du, 0x41c83b0eu, 0xa20bc7c6u, 0x6d5451fdu}},
    {{0x243f6a88u, 0x85a308d3u, 0x13198a2eu, 0x03707344u}, {0xa4093822u, 0x299f31d0u},
     {0xd16cfe09u, 0x94fdccebu, 0x5001e420u, 0x24126ea1u}},
};

static void test_known_answers(void **state)
{
    (void)state;
    for (size_t i = 0; i < sizeof kat / sizeof kat[0]; ++i) {
        fa_philox4x32 ctr;
        memcpy(ctr.v, kat[i].ctr, sizeof ctr.v);
        const fa_philox4x32 got = fa_philox4x32_10(ctr, kat[i].key[0], kat[i].key[1]);
        philox4x32_ctr_t rctr;
        philox4x32_key_t rkey;
        memcpy(rctr.v, kat[i].ctr, sizeof rctr.v);
        memcpy(rkey.v, kat[i].key, sizeof rkey.v);
        const philox4x32_ctr_t ref = philox4x32_R(10, rctr, rkey);
        for (int w = 0; w < 4; ++w) {
            assert_int_equal(ref.v[w], kat[i].out[w]); /* the reference header agrees with the list */
            assert_int_equal(got.v[w], kat[i].out[w]);
        }
    }
}

static uint64_t splitmix(uint64_t *s)
{
    uint64_t z = (*s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

static void test_random_counters_match_random123(void **state)
{
    (void)state;
    uint64_t s = 2024;
    for (int n = 0; n < 20000; ++n) {
        const uint64_t a = splitmix(&s), b = splitmix(&s), key = splitmix(&s);
        philox4x32_ctr_t rctr = {{(uint32_t)a, (uint32_t)(a >> 32), (uint32_t)b, (uint32_t)(b >> 32)}};
        philox4x32_key_t rkey = {{(uint32_t)key, (uint32_t)(key >> 32)}};
        const philox4x32_ctr_t ref = philox4x32_R(10, rctr, rkey);
        const fa_philox4x32 got = fa_dropout_words(key, b, a);
        for (int w = 0; w < 4; ++w)
            if (got.v[w] != ref.v[w]) fail_msg("counter %016llx %016llx key %016llx word %d", (unsigned long long)a,
                                              (unsigned long long)b, (unsigned long long)key, w);
    }
}

typedef struct mask_case {
    uint64_t seed, offset;
    float p;
    int64_t heads_q, seqlen_q, seqlen_k, batch_index, head_index;
} mask_case;

static const mask_case mask_cases[] = {
    {0, 0, 0.5f, 1, 1, 1, 0, 0},
    {42, 0, 0.1f, 2, 7, 9, 1, 1},
    {0x1234567890ABCDEFull, 0x0000000500000007ull, 0.5f, 3, 33, 17, 2, 2},
    {0xFFFFFFFFFFFFFFFFull, 0xFFFFFFFF00000001ull, 0.3f, 4, 129, 65, 5, 3},
    {7, 1ull << 40, 0.5f, 8, 1, 1000, 0, 5},
    {99, 3, 0.9f, 1, 50, 3, 1000000, 0}, /* element index above 2^32 */
    {5, 6, 0.0f, 2, 10, 10, 0, 1},       /* p = 0 keeps everything */
};

static void test_mask_matches_independent_stream(void **state)
{
    (void)state;
    for (size_t n = 0; n < sizeof mask_cases / sizeof mask_cases[0]; ++n) {
        const mask_case *m = &mask_cases[n];
        const size_t count = (size_t)(m->seqlen_q * m->seqlen_k);
        uint8_t *keep = malloc(count);
        assert_non_null(keep);
        assert_int_equal(fa_dropout_mask(m->seed, m->offset, m->p, m->heads_q, m->seqlen_q, m->seqlen_k,
                                         m->batch_index, m->head_index, keep),
                         FA_SUCCESS);
        const oracle_shape shape = {m->batch_index + 1, m->heads_q, 1, m->seqlen_q, m->seqlen_k, 1};
        fa_attention_desc desc;
        fa_attention_desc_init(&desc);
        desc.dropout_p = m->p;
        desc.dropout_seed = m->seed;
        desc.dropout_offset = m->offset;
        for (int64_t i = 0; i < m->seqlen_q; ++i)
            for (int64_t j = 0; j < m->seqlen_k; ++j) {
                const int expected = oracle_dropout_keep(&shape, &desc, m->batch_index, m->head_index, i, j);
                if (keep[i * m->seqlen_k + j] != expected)
                    fail_msg("mask case %zu: element (%lld, %lld) is %d, expected %d", n, (long long)i, (long long)j,
                             keep[i * m->seqlen_k + j], expected);
            }
        free(keep);
    }
}

static void test_keep_rate(void **state)
{
    (void)state;
    const float ps[] = {0.1f, 0.5f, 0.9f};
    const int64_t nq = 256, nk = 256;
    uint8_t *keep = malloc((size_t)(nq * nk));
    assert_non_null(keep);
    for (size_t n = 0; n < 3; ++n) {
        assert_int_equal(fa_dropout_mask(0xABCDEF0123ull, 1ull << 33, ps[n], 2, nq, nk, 3, 1, keep), FA_SUCCESS);
        size_t kept = 0;
        for (int64_t i = 0; i < nq * nk; ++i) kept += keep[i];
        const double rate = (double)kept / (double)(nq * nk);
        const double sigma = sqrt(ps[n] * (1.0 - ps[n]) / (double)(nq * nk));
        print_message("p %.1f: keep rate %.4f (expected %.4f, 6 sigma %.4f)\n", ps[n], rate, 1.0 - ps[n], 6 * sigma);
        assert_true(fabs(rate - (1.0 - ps[n])) < 6.0 * sigma);
    }
    free(keep);
}

static void test_offsets_give_different_streams(void **state)
{
    (void)state;
    uint8_t a[64 * 64], b[64 * 64];
    assert_int_equal(fa_dropout_mask(1, 0, 0.5f, 1, 64, 64, 0, 0, a), FA_SUCCESS);
    assert_int_equal(fa_dropout_mask(1, 1ull << 32, 0.5f, 1, 64, 64, 0, 0, b), FA_SUCCESS);
    assert_memory_not_equal(a, b, sizeof a);
    assert_int_equal(fa_dropout_mask(1ull << 32, 0, 0.5f, 1, 64, 64, 0, 0, b), FA_SUCCESS);
    assert_memory_not_equal(a, b, sizeof a);
}

static void expect_mask_error(uint64_t seed, uint64_t offset, float p, int64_t heads_q, int64_t sq, int64_t sk,
                              int64_t b, int64_t h, uint8_t *keep, const char *name)
{
    uint8_t canary[4] = {0xA5, 0xA5, 0xA5, 0xA5};
    if (keep) memcpy(keep, canary, sizeof canary);
    test_expect_error(fa_dropout_mask(seed, offset, p, heads_q, sq, sk, b, h, keep), FA_ERROR_INVALID_VALUE, name);
    if (keep) assert_memory_equal(keep, canary, sizeof canary);
}

static void test_mask_argument_errors(void **state)
{
    (void)state;
    uint8_t keep[4];
    expect_mask_error(1, 0, 0.5f, 1, 2, 2, 0, 0, NULL, "keep");
    expect_mask_error(1, 0, -0.1f, 1, 2, 2, 0, 0, keep, "dropout_p");
    expect_mask_error(1, 0, 1.0f, 1, 2, 2, 0, 0, keep, "dropout_p");
    expect_mask_error(1, 0, NAN, 1, 2, 2, 0, 0, keep, "dropout_p");
    expect_mask_error(1, 0, 0.5f, 0, 2, 2, 0, 0, keep, "heads_q");
    expect_mask_error(1, 0, 0.5f, 1, 0, 2, 0, 0, keep, "seqlen_q");
    expect_mask_error(1, 0, 0.5f, 1, 2, -2, 0, 0, keep, "seqlen_k");
    expect_mask_error(1, 0, 0.5f, 1, 2, 2, -1, 0, keep, "batch_index");
    expect_mask_error(1, 0, 0.5f, 2, 2, 2, 0, 2, keep, "head_index");
    expect_mask_error(1, 0, 0.5f, 2, 2, 2, 0, -1, keep, "head_index");
    expect_mask_error(1, 0, 0.5f, 2, 2, 2, INT64_MAX / 2, 0, keep, "overflow");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_known_answers),
        cmocka_unit_test(test_random_counters_match_random123),
        cmocka_unit_test(test_mask_matches_independent_stream),
        cmocka_unit_test(test_keep_rate),
        cmocka_unit_test(test_offsets_give_different_streams),
        cmocka_unit_test(test_mask_argument_errors),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
