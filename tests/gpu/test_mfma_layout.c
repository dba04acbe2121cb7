/* CPU emulation of the matrix instructions of the tile layer, checking the fragment index math
 * of src/gpu/kernels/mma_layout.h: matrices are scattered into per-lane registers with the layer's
 * functions, the instruction is emulated as its ISA manual states it (lane and register
 * operands, written here independently), and the result gathered with the layer's C layout must
 * equal a plain matrix product. Chaining instructions along K checks the accumulation too. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>

#include "gpu/kernels/mma_layout.h"
#include "mma_emulation.h"

/* PTX ISA, "Matrix fragments for mma.m16n8k16" (f16/bf16): groupID = lane >> 2,
 * threadID_in_group = lane % 4. A a0..a7: row groupID (a0,a1,a4,a5) or groupID + 8 (a2,a3,a6,a7),
 * col threadID_in_group * 2 + (i & 1) (+ 8 for a4..a7). B b0..b3: row threadID_in_group * 2 +
 * (i & 1) (+ 8 for b2, b3), col groupID. C c0..c3: row groupID (+ 8 for c2, c3), col
 * threadID_in_group * 2 + (i & 1). */
static void emulate_mma_sync(lane_regs *r)
{
    float a[16][16], b[16][8], d[16][8];
    for (int lane = 0; lane < 32; ++lane) {
        const int g = lane >> 2, t = lane % 4;
        for (int i = 0; i < 8; ++i) a[g + ((i == 2 || i == 3 || i == 6 || i == 7) ? 8 : 0)][t * 2 + (i & 1) + (i >= 4 ? 8 : 0)] = r->a[lane][i];
        for (int i = 0; i < 4; ++i) b[t * 2 + (i & 1) + (i >= 2 ? 8 : 0)][g] = r->b[lane][i];
        for (int i = 0; i < 4; ++i) d[g + (i >= 2 ? 8 : 0)][t * 2 + (i & 1)] = r->c[lane][i];
    }
    for (int i = 0; i < 16; ++i)
        for (int j = 0; j < 8; ++j)
            for (int kk = 0; kk < 16; ++kk) d[i][j] += a[i][kk] * b[kk][j];
    for (int lane = 0; lane < 32; ++lane) {
        const int g = lane >> 2, t = lane % 4;
        for (int i = 0; i < 4; ++i) r->c[lane][i] = d[g + (i >= 2 ? 8 : 0)][t * 2 + (i & 1)];
    }
}

static void emulate(fa_mma_shape shape, lane_regs *r)
{
    const fa_mma_dims d = fa_mma_shape_dims(shape);
    if (shape == FA_MMA_SYNC_16X8X16) emulate_mma_sync(r);
    else emulate_mfma(d.m, d.n, d.k, r);
}

/* Small integers: every product and sum is exact in float, so equality is the right check. */
static float entry(int seed, int i, int j) { return (float)(((seed * 31 + i * 7 + j * 13) % 9) - 4); }

/* C = sum over `steps` K-blocks of A_s B_s through the layer's layouts, against a plain product. */
static void check_shape(fa_mma_shape shape, int steps)
{
    const fa_mma_dims d = fa_mma_shape_dims(shape);
    assert_int_equal(d.a_items * d.lanes, d.m * d.k);
    assert_int_equal(d.b_items * d.lanes, d.k * d.n);
    assert_int_equal(d.c_items * d.lanes, d.m * d.n);
    float a[32][64], b[64][32], expect[32][32], got[32][32];
    for (int i = 0; i < d.m; ++i)
        for (int kk = 0; kk < d.k * steps; ++kk) a[i][kk] = entry(1, i, kk);
    for (int kk = 0; kk < d.k * steps; ++kk)
        for (int j = 0; j < d.n; ++j) b[kk][j] = entry(2, kk, j);
    for (int i = 0; i < d.m; ++i)
        for (int j = 0; j < d.n; ++j) {
            expect[i][j] = entry(3, i, j); /* initial accumulator */
            for (int kk = 0; kk < d.k * steps; ++kk) expect[i][j] += a[i][kk] * b[kk][j];
        }

    static lane_regs r;
    memset(&r, 0, sizeof r);
    int seen_c[32][32] = {{0}};
    for (int lane = 0; lane < d.lanes; ++lane)
        for (int item = 0; item < d.c_items; ++item) {
            const fa_frag_coord c = fa_mma_c_coord(shape, lane, item);
            assert_true(c.row >= 0 && c.row < d.m && c.col >= 0 && c.col < d.n);
            seen_c[c.row][c.col]++;
            r.c[lane][item] = entry(3, c.row, c.col);
        }
    for (int i = 0; i < d.m; ++i)
        for (int j = 0; j < d.n; ++j) assert_int_equal(seen_c[i][j], 1); /* a bijection */

    for (int s = 0; s < steps; ++s) {
        int seen_a[32][64] = {{0}}, seen_b[64][32] = {{0}};
        for (int lane = 0; lane < d.lanes; ++lane) {
            for (int item = 0; item < d.a_items; ++item) {
                const fa_frag_coord c = fa_mma_a_coord(shape, lane, item);
                assert_true(c.row >= 0 && c.row < d.m && c.col >= 0 && c.col < d.k);
                seen_a[c.row][c.col]++;
                r.a[lane][item] = a[c.row][s * d.k + c.col];
            }
            for (int item = 0; item < d.b_items; ++item) {
                const fa_frag_coord c = fa_mma_b_coord(shape, lane, item);
                assert_true(c.row >= 0 && c.row < d.k && c.col >= 0 && c.col < d.n);
                seen_b[c.row][c.col]++;
                r.b[lane][item] = b[s * d.k + c.row][c.col];
            }
        }
        for (int i = 0; i < d.m; ++i)
            for (int kk = 0; kk < d.k; ++kk) assert_int_equal(seen_a[i][kk], 1);
        for (int kk = 0; kk < d.k; ++kk)
            for (int j = 0; j < d.n; ++j) assert_int_equal(seen_b[kk][j], 1);
        emulate(shape, &r);
    }

    for (int lane = 0; lane < d.lanes; ++lane)
        for (int item = 0; item < d.c_items; ++item) {
            const fa_frag_coord c = fa_mma_c_coord(shape, lane, item);
            got[c.row][c.col] = r.c[lane][item];
        }
    for (int i = 0; i < d.m; ++i)
        for (int j = 0; j < d.n; ++j) assert_true(got[i][j] == expect[i][j]);
}

static void test_mfma_16x16x16_f16(void **state) { (void)state; check_shape(FA_MFMA_16X16X16, 4); }
static void test_mfma_32x32x8_f16(void **state) { (void)state; check_shape(FA_MFMA_32X32X8, 8); }
static void test_mfma_16x16x8_bf16(void **state) { (void)state; check_shape(FA_MFMA_16X16X8_BF16, 8); }
static void test_mma_sync_16x8x16(void **state) { (void)state; check_shape(FA_MMA_SYNC_16X8X16, 4); }

/* The emulators themselves must not be trivially agreeable: a layout with two lanes swapped
 * has to fail the product check, which the bijection alone would not catch. */
static void test_emulation_detects_wrong_layout(void **state)
{
    (void)state;
    static lane_regs r;
    memset(&r, 0, sizeof r);
    /* A = identity-like pattern placed with lanes 0 and 16 exchanged (rows 0 vs k-group 1) */
    for (int lane = 0; lane < 64; ++lane)
        for (int item = 0; item < 4; ++item) {
            const int src = lane == 0 ? 16 : lane == 16 ? 0 : lane;
            const fa_frag_coord ca = fa_mma_a_coord(FA_MFMA_16X16X16, src, item);
            const fa_frag_coord cb = fa_mma_b_coord(FA_MFMA_16X16X16, lane, item);
            r.a[lane][item] = entry(1, ca.row, ca.col);
            r.b[lane][item] = entry(2, cb.row, cb.col);
        }
    emulate(FA_MFMA_16X16X16, &r);
    int mismatches = 0;
    for (int lane = 0; lane < 64; ++lane)
        for (int item = 0; item < 4; ++item) {
            const fa_frag_coord c = fa_mma_c_coord(FA_MFMA_16X16X16, lane, item);
            float expect = 0.0f;
            for (int kk = 0; kk < 16; ++kk) expect += entry(1, c.row, kk) * entry(2, kk, c.col);
            mismatches += r.c[lane][item] != expect;
        }
    assert_true(mismatches > 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_mfma_16x16x16_f16),
        cmocka_unit_test(test_mfma_32x32x8_f16),
        cmocka_unit_test(test_mfma_16x16x8_bf16),
        cmocka_unit_test(test_mma_sync_16x8x16),
        cmocka_unit_test(test_emulation_detects_wrong_layout),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
