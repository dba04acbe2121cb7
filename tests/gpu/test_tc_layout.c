/* The index math of the tile-MMA forward (src/gpu/kernels/tc_layout.h, src/gpu/tc_plan.h) on
 * the CPU. A warp's ldmatrix and mma.sync are emulated as the PTX ISA states them (written here
 * independently of the layer): the Q K^T and P V loops of tile_mma_sync.cuh, replayed with the
 * layer's address and item functions on swizzled tiles, must give the plain matrix products. The
 * swizzle must be a bijection and conflict-free for the kernel's ldmatrix and 16-byte copy
 * phases; the plain-FMA layer's ownership and shuffle sources must be consistent; the padded
 * head dims, tiles, shared memory (forward and backward) and chunk alignment of the plan are
 * checked. The CDNA layer (src/gpu/amd/tile_mfma.cuh) is replayed the same way on an emulated
 * v_mfma_f32_16x16x16f16 (tests/gpu/mma_emulation.h). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "gpu/kernels/tc_layout.h"
#include "gpu/tc_plan.h"
#include "mma_emulation.h"

static const int widths[] = {64, 128, 256};
#define WIDTHS (sizeof widths / sizeof widths[0])

/* Small integers: products and sums of up to 256 terms are exact in float (and in f16). */
static float entry(int seed, int i, int j) { return (float)(((seed * 31 + i * 5 + j * 3 + (i * j) % 5) % 7) - 3); }

/* ---- swizzle ---------------------------------------------------------------------------------- */

static void test_swizzle_is_a_bijection_of_whole_chunks(void **state)
{
    (void)state;
    for (size_t wi = 0; wi < WIDTHS; ++wi) {
        const int w = widths[wi], rows = FA_TC_BLOCK_ROWS;
        char *seen = calloc((size_t)rows * w, 1);
        assert_non_null(seen);
        for (int r = 0; r < rows; ++r)
            for (int c = 0; c < w; ++c) {
                const int at = fa_tc_swizzle(r, c, w);
                assert_true(at >= r * w && at < (r + 1) * w); /* stays in its row */
                assert_int_equal(at % FA_TC_CHUNK, c % FA_TC_CHUNK); /* chunks stay contiguous */
                assert_int_equal(seen[at], 0);
                seen[at] = 1;
            }
        free(seen);
    }
}

/* 16-byte bank group (of 8) of a 16-bit element offset; tiles start on 128-byte boundaries. */
static int bank_group(int offset) { return (offset / FA_TC_CHUNK) % 8; }

/* Eight 16-byte accesses of one phase hit distinct bank groups. */
static int phase_conflict_free(const int offsets[8])
{
    int used = 0;
    for (int i = 0; i < 8; ++i) {
        const int bit = 1 << bank_group(offsets[i]);
        if (used & bit) return 0;
        used |= bit;
    }
    return 1;
}

typedef fa_frag_coord (*ldsm_address_fn)(int lane, int a, int b);

/* Every ldmatrix the kernel issues on a tile of `rows` rows: 4 phases of 8 lane addresses. */
static int ldsm_conflicts(ldsm_address_fn fn, int rows, int w, int swizzled)
{
    int conflicts = 0;
    for (int a = 0; a < rows; a += 16)
        for (int b = 0; b < w; b += 16)
            for (int phase = 0; phase < 4; ++phase) {
                int offsets[8];
                for (int i = 0; i < 8; ++i) {
                    const fa_frag_coord c = fn(8 * phase + i, a, b);
                    offsets[i] = swizzled ? fa_tc_swizzle(c.row, c.col, w) : c.row * w + c.col;
                    assert_int_equal(offsets[i] % FA_TC_CHUNK, 0); /* 16-byte aligned rows */
                }
                conflicts += !phase_conflict_free(offsets);
            }
    return conflicts;
}

static void test_ldmatrix_phases_conflict_free(void **state)
{
    (void)state;
    for (size_t wi = 0; wi < WIDTHS; ++wi) {
        const int w = widths[wi], bc = fa_tc_block_cols(w);
        assert_int_equal(ldsm_conflicts(fa_tc_ldsm_a, FA_TC_BLOCK_ROWS, w, 1), 0);     /* Q */
        assert_int_equal(ldsm_conflicts(fa_tc_ldsm_b_nk, bc, w, 1), 0);                 /* K */
        assert_int_equal(ldsm_conflicts(fa_tc_ldsm_b_kn_trans, bc, w, 1), 0);           /* V */
        /* the check can fail: unswizzled rows of 128 bytes or more all start in bank group 0 */
        assert_true(ldsm_conflicts(fa_tc_ldsm_a, FA_TC_BLOCK_ROWS, w, 0) > 0);
    }
}

/* load_tile: thread e copies chunk e % (w / 8) of row e / (w / 8); phases of 8 threads. */
static void test_chunk_copies_conflict_free(void **state)
{
    (void)state;
    for (size_t wi = 0; wi < WIDTHS; ++wi) {
        const int w = widths[wi], chunks = w / FA_TC_CHUNK;
        for (int e0 = 0; e0 < FA_TC_BLOCK_ROWS * chunks; e0 += 8) {
            int offsets[8];
            for (int i = 0; i < 8; ++i)
                offsets[i] = fa_tc_swizzle((e0 + i) / chunks, ((e0 + i) % chunks) * FA_TC_CHUNK, w);
            assert_true(phase_conflict_free(offsets));
        }
        /* the K and V tiles start on 128-byte boundaries, so bank groups carry over */
        assert_int_equal((FA_TC_BLOCK_ROWS * w) % 64, 0);
        assert_int_equal((fa_tc_block_cols(w) * w) % 64, 0);
    }
}

/* ---- ldmatrix and mma.sync emulation (PTX ISA) --------------------------------------------------- */

typedef float warp_x4[32][4][2]; /* per lane: 4 registers of two 16-bit halves (low, high) */

/* ldmatrix.sync.aligned.m8n8.x4[.trans].b16: lane 8i + r addresses row r of matrix i. Without
 * .trans, register i of lane l holds matrix i's row l / 4, columns 2 (l % 4) and + 1; with .trans,
 * rows 2 (l % 4) and + 1 of column l / 4. */
static void ldmatrix_x4(const float *smem, const int address[32], int trans, warp_x4 out)
{
    for (int lane = 0; lane < 32; ++lane)
        for (int i = 0; i < 4; ++i)
            for (int h = 0; h < 2; ++h) {
                const int r = trans ? 2 * (lane % 4) + h : lane / 4;
                const int c = trans ? lane / 4 : 2 * (lane % 4) + h;
                out[lane][i][h] = smem[address[8 * i + r] + c];
            }
}

/* mma.sync.aligned.m16n8k16.row.col.f32 (f16/bf16): groupID g = lane >> 2, t = lane % 4.
 * A regs: {a0,a1} (g, 2t..), {a2,a3} (g + 8, 2t..), {a4,a5} (g, 2t + 8..), {a6,a7} (g + 8, 2t + 8..).
 * B regs: {b0,b1} (2t.., g), {b2,b3} (2t + 8.., g). C: c0, c1 (g, 2t..), c2, c3 (g + 8, 2t..). */
static void mma_m16n8k16(float *c_of_lane[32], const float a[32][4][2], const float b_lo[32][2], const float b_hi[32][2])
{
    float am[16][16], bm[16][8];
    for (int lane = 0; lane < 32; ++lane) {
        const int g = lane >> 2, t = lane % 4;
        for (int h = 0; h < 2; ++h) {
            am[g][2 * t + h] = a[lane][0][h];
            am[g + 8][2 * t + h] = a[lane][1][h];
            am[g][2 * t + 8 + h] = a[lane][2][h];
            am[g + 8][2 * t + 8 + h] = a[lane][3][h];
            bm[2 * t + h][g] = b_lo[lane][h];
            bm[2 * t + 8 + h][g] = b_hi[lane][h];
        }
    }
    for (int lane = 0; lane < 32; ++lane) {
        const int g = lane >> 2, t = lane % 4;
        for (int item = 0; item < 4; ++item) {
            const int row = g + 8 * (item / 2), col = 2 * t + item % 2;
            float acc = c_of_lane[lane][item];
            for (int k = 0; k < 16; ++k) acc += am[row][k] * bm[k][col];
            c_of_lane[lane][item] = acc;
        }
    }
}

/* One mma on n-tile `tile` of per-lane accumulators acc[lane][...] (items 4 tile .. 4 tile + 3). */
static void mma_into(float (*acc)[128], int tile, const warp_x4 a, const warp_x4 b, int b_reg)
{
    float *c_of_lane[32];
    float b_lo[32][2], b_hi[32][2];
    for (int lane = 0; lane < 32; ++lane) {
        c_of_lane[lane] = &acc[lane][4 * tile];
        for (int h = 0; h < 2; ++h) {
            b_lo[lane][h] = b[lane][b_reg][h];
            b_hi[lane][h] = b[lane][b_reg + 1][h];
        }
    }
    mma_m16n8k16(c_of_lane, a, b_lo, b_hi);
}

/* (Q K^T)[row][key] and (P V)[row][col] of the test tiles: Q = entry(1), K = entry(2),
 * V = entry(3), P = entry(4). */
static float expected_s(int row, int key, int w)
{
    float sum = 0.0f;
    for (int x = 0; x < w; ++x) sum += entry(1, row, x) * entry(2, key, x);
    return sum;
}
static float expected_o(int row, int col, int bc)
{
    float sum = 0.0f;
    for (int key = 0; key < bc; ++key) sum += entry(4, row, key) * entry(3, key, col);
    return sum;
}

/* A swizzled tile [rows x w] of entry(seed, r, c). */
static float *make_tile(int rows, int w, int seed)
{
    float *t = malloc(sizeof(float) * (size_t)rows * w);
    assert_non_null(t);
    for (int r = 0; r < rows; ++r)
        for (int c = 0; c < w; ++c) t[fa_tc_swizzle(r, c, w)] = entry(seed, r, c);
    return t;
}

/* The Q K^T and P V loops of mma_sync_layer (tile_mma_sync.cuh) for every warp of a block. */
static void check_mma_sync_products(int w)
{
    const int bc = fa_tc_block_cols(w), br = FA_TC_BLOCK_ROWS;
    float *sq = make_tile(br, w, 1), *sk = make_tile(bc, w, 2), *sv = make_tile(bc, w, 3);
    static float s[32][128], o[32][128];
    static warp_x4 a, b;
    int address[32];
    for (int row0 = 0; row0 < br; row0 += FA_TC_WARP_ROWS) {
        memset(s, 0, sizeof s);
        for (int k0 = 0; k0 < w; k0 += 16) {
            for (int lane = 0; lane < 32; ++lane) {
                const fa_frag_coord c = fa_tc_ldsm_a(lane, row0, k0);
                address[lane] = fa_tc_swizzle(c.row, c.col, w);
            }
            ldmatrix_x4(sq, address, 0, a);
            for (int n0 = 0; n0 < bc; n0 += 16) {
                for (int lane = 0; lane < 32; ++lane) {
                    const fa_frag_coord c = fa_tc_ldsm_b_nk(lane, n0, k0);
                    address[lane] = fa_tc_swizzle(c.row, c.col, w);
                }
                ldmatrix_x4(sk, address, 0, b);
                mma_into(s, n0 / 8, a, b, 0);
                mma_into(s, n0 / 8 + 1, a, b, 2);
            }
        }
        int seen[16][64] = {{0}};
        for (int lane = 0; lane < 32; ++lane)
            for (int item = 0; item < bc / 2; ++item) {
                const fa_frag_coord c = fa_tc_mma_acc_coord(lane, item);
                assert_true(c.row >= 0 && c.row < 16 && c.col >= 0 && c.col < bc);
                assert_int_equal(c.row, fa_tc_mma_slot_row(lane, fa_tc_mma_item_slot(item)));
                seen[c.row][c.col]++;
                assert_true(s[lane][item] == expected_s(row0 + c.row, c.col, w));
            }
        for (int r = 0; r < 16; ++r)
            for (int c = 0; c < bc; ++c) assert_int_equal(seen[r][c], 1);

        /* P: a fresh 16 x bc matrix in the accumulator layout, reused as the A operand */
        for (int lane = 0; lane < 32; ++lane)
            for (int item = 0; item < bc / 2; ++item) {
                const fa_frag_coord c = fa_tc_mma_acc_coord(lane, item);
                s[lane][item] = entry(4, row0 + c.row, c.col);
            }
        memset(o, 0, sizeof o);
        for (int kstep = 0; kstep < bc / 16; ++kstep) {
            for (int lane = 0; lane < 32; ++lane)
                for (int reg = 0; reg < 4; ++reg)
                    for (int h = 0; h < 2; ++h) a[lane][reg][h] = s[lane][fa_tc_p_item(kstep, reg, h)];
            for (int n0 = 0; n0 < w; n0 += 16) {
                for (int lane = 0; lane < 32; ++lane) {
                    const fa_frag_coord c = fa_tc_ldsm_b_kn_trans(lane, 16 * kstep, n0);
                    address[lane] = fa_tc_swizzle(c.row, c.col, w);
                }
                ldmatrix_x4(sv, address, 1, b);
                mma_into(o, n0 / 8, a, b, 0);
                mma_into(o, n0 / 8 + 1, a, b, 2);
            }
        }
        for (int lane = 0; lane < 32; ++lane)
            for (int item = 0; item < w / 2; ++item) {
                const fa_frag_coord c = fa_tc_mma_acc_coord(lane, item);
                assert_true(o[lane][item] == expected_o(row0 + c.row, c.col, bc));
            }
    }
    free(sq);
    free(sk);
    free(sv);
}

static void test_mma_sync_qk_pv_w64(void **state) { (void)state; check_mma_sync_products(64); }
static void test_mma_sync_qk_pv_w128(void **state) { (void)state; check_mma_sync_products(128); }
static void test_mma_sync_qk_pv_w256(void **state) { (void)state; check_mma_sync_products(256); }

/* The emulation is not agreeable by construction: P packed with its halves swapped fails. */
static void test_mma_emulation_detects_wrong_packing(void **state)
{
    (void)state;
    static float acc[32][128];
    static warp_x4 a, b;
    memset(acc, 0, sizeof acc);
    for (int lane = 0; lane < 32; ++lane)
        for (int reg = 0; reg < 4; ++reg)
            for (int h = 0; h < 2; ++h) {
                const fa_frag_coord pa = fa_tc_mma_acc_coord(lane, fa_tc_p_item(0, reg, 1 - h)); /* swapped */
                a[lane][reg][h] = entry(4, pa.row, pa.col);
                b[lane][reg][h] = entry(3, 2 * (lane % 4) + h + 8 * (reg % 2), lane / 4); /* B = V rows 0..15 */
            }
    mma_into(acc, 0, a, b, 0);
    int mismatches = 0;
    for (int lane = 0; lane < 32; ++lane)
        for (int item = 0; item < 4; ++item) {
            const fa_frag_coord c = fa_tc_mma_acc_coord(lane, item);
            mismatches += acc[lane][item] != expected_o(c.row, c.col, 16);
        }
    assert_true(mismatches > 0);
}

/* ---- CDNA MFMA layer (transposed products) ----------------------------------------------------- */

/* The qk and pv loops of mfma_layer (src/gpu/amd/tile_mfma.cuh) for every warp (wavefront) of a block,
 * with operands gathered by the layer's coordinate functions from swizzled tiles. */
static void check_mfma_products(int w)
{
    const int bc = fa_tc_block_cols(w), br = FA_TC_BLOCK_ROWS;
    float *sq = make_tile(br, w, 1), *sk = make_tile(bc, w, 2), *sv = make_tile(bc, w, 3);
    static float s[64][64], o[64][64];
    static lane_regs r;
    for (int row0 = 0; row0 < br; row0 += FA_TC_WARP_ROWS) {
        memset(s, 0, sizeof s);
        for (int k0 = 0; k0 < w; k0 += 16)
            for (int t = 0; t < bc / 16; ++t) {
                memset(&r, 0, sizeof r);
                for (int lane = 0; lane < 64; ++lane)
                    for (int item = 0; item < 4; ++item) {
                        const fa_frag_coord ca = fa_tc_mfma_qk_a(lane, item, t, k0);
                        const fa_frag_coord cb = fa_tc_mfma_qk_b(lane, item, row0, k0);
                        r.a[lane][item] = sk[fa_tc_swizzle(ca.row, ca.col, w)];
                        r.b[lane][item] = sq[fa_tc_swizzle(cb.row, cb.col, w)];
                        r.c[lane][item] = s[lane][4 * t + item];
                    }
                emulate_mfma(16, 16, 16, &r);
                for (int lane = 0; lane < 64; ++lane)
                    for (int item = 0; item < 4; ++item) s[lane][4 * t + item] = r.c[lane][item];
            }
        int seen[16][64] = {{0}};
        for (int lane = 0; lane < 64; ++lane)
            for (int item = 0; item < bc / 4; ++item) {
                const fa_frag_coord c = fa_tc_mfma_acc_coord(lane, item);
                assert_true(c.row >= 0 && c.row < 16 && c.col >= 0 && c.col < bc);
                seen[c.row][c.col]++;
                assert_true(s[lane][item] == expected_s(row0 + c.row, c.col, w));
                s[lane][item] = entry(4, row0 + c.row, c.col); /* then P, in the same layout */
            }
        for (int i = 0; i < 16; ++i)
            for (int c = 0; c < bc; ++c) assert_int_equal(seen[i][c], 1);

        memset(o, 0, sizeof o);
        for (int kstep = 0; kstep < bc / 16; ++kstep)
            for (int dt = 0; dt < w / 16; ++dt) {
                memset(&r, 0, sizeof r);
                for (int lane = 0; lane < 64; ++lane)
                    for (int item = 0; item < 4; ++item) {
                        const fa_frag_coord ca = fa_tc_mfma_pv_a(lane, item, kstep, dt);
                        r.a[lane][item] = sv[fa_tc_swizzle(ca.row, ca.col, w)];
                        r.b[lane][item] = s[lane][4 * kstep + item]; /* P^T from registers */
                        r.c[lane][item] = o[lane][4 * dt + item];
                    }
                emulate_mfma(16, 16, 16, &r);
                for (int lane = 0; lane < 64; ++lane)
                    for (int item = 0; item < 4; ++item) o[lane][4 * dt + item] = r.c[lane][item];
            }
        for (int lane = 0; lane < 64; ++lane)
            for (int item = 0; item < w / 4; ++item) {
                const fa_frag_coord c = fa_tc_mfma_acc_coord(lane, item);
                assert_true(o[lane][item] == expected_o(row0 + c.row, c.col, bc));
            }
    }
    free(sq);
    free(sk);
    free(sv);
}

static void test_mfma_qk_pv_w64(void **state) { (void)state; check_mfma_products(64); }
static void test_mfma_qk_pv_w128(void **state) { (void)state; check_mfma_products(128); }
static void test_mfma_qk_pv_w256(void **state) { (void)state; check_mfma_products(256); }

/* The MFMA layer's rows are the plain-FMA layer's (lane % 16), so its xor 16, 32 reductions are
 * the ones checked there for wave64. */
static void test_mfma_rows_match_fma_rows(void **state)
{
    (void)state;
    for (int lane = 0; lane < 64; ++lane)
        for (int item = 0; item < 64; ++item)
            assert_int_equal(fa_tc_mfma_acc_coord(lane, item).row, fa_tc_fma_acc_coord(lane, item, 64).row);
}

/* ---- plain-FMA layer ---------------------------------------------------------------------------- */

static void check_fma_layer(int warp)
{
    for (size_t wi = 0; wi < WIDTHS; ++wi) {
        const int n = widths[wi], items = n / (warp / 16);
        static int seen[16][256];
        memset(seen, 0, sizeof seen);
        for (int lane = 0; lane < warp; ++lane)
            for (int item = 0; item < items; ++item) {
                const fa_frag_coord c = fa_tc_fma_acc_coord(lane, item, warp);
                assert_true(c.row >= 0 && c.row < 16 && c.col >= 0 && c.col < n);
                seen[c.row][c.col]++;
                /* the row reduction (xor 16, 32, ...) visits exactly the lanes with this row */
                for (int other = 0; other < warp; ++other) {
                    const int same_row = fa_tc_fma_acc_coord(other, 0, warp).row == c.row;
                    const int reached = ((other ^ lane) & 15) == 0;
                    assert_int_equal(same_row, reached);
                }
            }
        for (int r = 0; r < 16; ++r)
            for (int c = 0; c < n; ++c) assert_int_equal(seen[r][c], 1);
        /* P V: the shuffle source of column c holds P[row][c] */
        for (int lane = 0; lane < warp; ++lane)
            for (int c = 0; c < n; ++c) {
                const fa_lane_item src = fa_tc_fma_p_source(lane, c, warp);
                assert_true(src.lane >= 0 && src.lane < warp && src.item >= 0 && src.item < items);
                const fa_frag_coord at = fa_tc_fma_acc_coord(src.lane, src.item, warp);
                assert_int_equal(at.row, lane % 16);
                assert_int_equal(at.col, c);
            }
    }
}

static void test_fma_layer_warp32(void **state) { (void)state; check_fma_layer(32); }
static void test_fma_layer_wave64(void **state) { (void)state; check_fma_layer(64); }

/* mma.sync layer: the quad reduction (xor 1, 2) visits exactly the lanes sharing a row slot. */
static void test_mma_rows_live_in_quads(void **state)
{
    (void)state;
    for (int lane = 0; lane < 32; ++lane)
        for (int slot = 0; slot < 2; ++slot)
            for (int other = 0; other < 32; ++other) {
                const int same_row = fa_tc_mma_slot_row(other, slot) == fa_tc_mma_slot_row(lane, slot);
                assert_int_equal(same_row, (other ^ lane) < 4);
            }
}

/* The wide-tile forward's ldmatrix addresses (base + 64 (m / 4) + fa_tc_ldsm_step_col) are the
 * swizzled addresses of the three fragment functions, for every lane and step. */
static void test_ldsm_step_columns(void **state)
{
    (void)state;
    for (size_t wi = 0; wi < WIDTHS; ++wi) {
        const int w = widths[wi];
        for (int lane = 0; lane < 32; ++lane) {
            const int row_a = lane % 8 + 8 * ((lane / 8) % 2), row_b = lane % 8 + 8 * (lane / 16);
            for (int m = 0; m < w / 16; ++m) {
                const fa_frag_coord a = fa_tc_ldsm_a(lane, 16, 16 * m);
                assert_int_equal(fa_tc_swizzle(a.row, a.col, w),
                                 (16 + row_a) * w + 64 * (m / 4) + fa_tc_ldsm_step_col(m % 4, lane / 16, lane % 8));
                const fa_frag_coord b = fa_tc_ldsm_b_nk(lane, 32, 16 * m);
                assert_int_equal(fa_tc_swizzle(b.row, b.col, w),
                                 (32 + row_b) * w + 64 * (m / 4) + fa_tc_ldsm_step_col(m % 4, (lane / 8) % 2, lane % 8));
                const fa_frag_coord v = fa_tc_ldsm_b_kn_trans(lane, 48, 16 * m);
                assert_int_equal(fa_tc_swizzle(v.row, v.col, w),
                                 (48 + row_a) * w + 64 * (m / 4) + fa_tc_ldsm_step_col(m % 4, lane / 16, lane % 8));
            }
        }
    }
}

/* The wide-tile backward's dS read: ldmatrix .trans at fa_tc_ldsm_a_trans of a tile stored [k][m]
 * (dS^T, swizzled at width 64) gives each lane the A registers of rows m0.., columns k0.. of the
 * transposed tile (mma.sync's A layout), and k steps of 16 rows are base + immediate. */
static void test_ldsm_a_trans_reads_transposed_a(void **state)
{
    (void)state;
    enum { KR = 128, MC = 64 };
    static float smem[KR * MC];
    for (int k = 0; k < KR; ++k)
        for (int m = 0; m < MC; ++m) smem[fa_tc_swizzle(k, m, MC)] = (float)(1000 * k + m);
    for (int m0 = 0; m0 < MC; m0 += 16)
        for (int k0 = 0; k0 < KR; k0 += 16) {
            int address[32];
            for (int lane = 0; lane < 32; ++lane) {
                const fa_frag_coord c = fa_tc_ldsm_a_trans(lane, m0, k0);
                assert_int_equal(c.col % 8, 0); /* a whole chunk */
                address[lane] = fa_tc_swizzle(c.row, c.col, MC);
                const fa_frag_coord c0 = fa_tc_ldsm_a_trans(lane, m0, 0);
                assert_int_equal(address[lane], fa_tc_swizzle(c0.row, c0.col, MC) + k0 * MC);
            }
            warp_x4 a;
            ldmatrix_x4(smem, address, 1, a);
            for (int lane = 0; lane < 32; ++lane) {
                const int g = lane >> 2, t = lane % 4;
                for (int h = 0; h < 2; ++h) {
                    /* A[row][col] = stored[k0 + col][m0 + row] */
                    assert_float_equal(a[lane][0][h], (float)(1000 * (k0 + 2 * t + h) + m0 + g), 0.0f);
                    assert_float_equal(a[lane][1][h], (float)(1000 * (k0 + 2 * t + h) + m0 + g + 8), 0.0f);
                    assert_float_equal(a[lane][2][h], (float)(1000 * (k0 + 2 * t + 8 + h) + m0 + g), 0.0f);
                    assert_float_equal(a[lane][3][h], (float)(1000 * (k0 + 2 * t + 8 + h) + m0 + g + 8), 0.0f);
                }
            }
        }
}

/* ---- plan --------------------------------------------------------------------------------------- */

static void test_family_from_environment_value(void **state)
{
    (void)state;
    assert_int_equal(fa_gpu_parse_family(NULL, FA_GPU_DEFAULT_FAMILY_CUDA), FA_GPU_FAMILY_TC);
    assert_int_equal(fa_gpu_parse_family("", FA_GPU_DEFAULT_FAMILY_CUDA), FA_GPU_FAMILY_TC);
    assert_int_equal(fa_gpu_parse_family(NULL, FA_GPU_DEFAULT_FAMILY_HIP), FA_GPU_FAMILY_GENERIC);
    assert_int_equal(fa_gpu_parse_family("", FA_GPU_DEFAULT_FAMILY_HIP), FA_GPU_FAMILY_GENERIC);
    assert_int_equal(fa_gpu_parse_family("generic", FA_GPU_FAMILY_TC), FA_GPU_FAMILY_GENERIC);
    assert_int_equal(fa_gpu_parse_family("tc", FA_GPU_FAMILY_GENERIC), FA_GPU_FAMILY_TC);
    assert_int_equal(fa_gpu_parse_family("fma", FA_GPU_FAMILY_TC), FA_GPU_FAMILY_FMA);
    assert_int_equal(fa_gpu_parse_family("TC", FA_GPU_FAMILY_TC), FA_GPU_FAMILY_INVALID);
    assert_int_equal(fa_gpu_parse_family("tensor", FA_GPU_FAMILY_TC), FA_GPU_FAMILY_INVALID);
    assert_string_equal(fa_gpu_family_name(FA_GPU_FAMILY_TC), "tc");
    assert_string_equal(fa_gpu_family_name(FA_GPU_FAMILY_FMA), "fma");
    assert_int_equal(fa_gpu_parse_family("tc-wide", FA_GPU_FAMILY_TC), FA_GPU_FAMILY_TC_WIDE);
    assert_string_equal(fa_gpu_family_name(FA_GPU_FAMILY_TC_WIDE), "tc-wide");
}

/* Which problems the wide-tile forward takes: plain ones in f16/bf16 up to width 128. */
static void test_wide_forward_takes_plain_problems(void **state)
{
    (void)state;
    static const float sinks[2] = {0.0f, 0.0f};
    static const uint8_t blocks[1] = {1};
    fa_problem plain;
    memset(&plain, 0, sizeof plain);
    plain.shape.dtype = FA_DTYPE_F16;
    plain.shape.head_dim = 128;
    plain.shape.seqlen_q = plain.shape.seqlen_k = 4096;
    plain.shape.scale = 0.125f;
    plain.mask.causal = 1;
    assert_true(fa_tc_wide_takes(&plain, 1));
    assert_false(fa_tc_wide_takes(&plain, 0)); /* rows not in aligned 16-byte chunks */
    fa_problem p = plain;
    p.shape.dtype = FA_DTYPE_BF16;
    assert_true(fa_tc_wide_takes(&p, 1));
    p.shape.dtype = FA_DTYPE_F32;
    assert_false(fa_tc_wide_takes(&p, 1));
    p = plain;
    p.shape.head_dim = 72; /* padded to 128 */
    assert_true(fa_tc_wide_takes(&p, 1));
    p.shape.head_dim = 136;
    assert_false(fa_tc_wide_takes(&p, 1));
    p = plain;
    p.shape.scale = -0.125f;
    assert_false(fa_tc_wide_takes(&p, 1));
    p = plain;
    p.modifiers.sinks = sinks;
    assert_false(fa_tc_wide_takes(&p, 1));
    p = plain;
    p.modifiers.softcap = 30.0f;
    assert_false(fa_tc_wide_takes(&p, 1));
    p = plain;
    p.dropout.p = 0.1f;
    assert_false(fa_tc_wide_takes(&p, 1));
    p = plain;
    p.mask.block_mask.mask = blocks;
    assert_false(fa_tc_wide_takes(&p, 1));
    p = plain;
    p.shape.seqlen_k = (int64_t)FA_TC_WIDE_MAX_SEQLEN + 1;
    assert_false(fa_tc_wide_takes(&p, 1));
    /* shared memory: Q of 128 rows and K, V tiles fit A100, H100 and sm_86 */
    assert_int_equal(fa_tc_wide_smem_bytes(64), 2 * 64 * (128 + 2 * 128));
    assert_int_equal(fa_tc_wide_smem_bytes(128), 2 * 128 * (128 + 2 * 64));
    assert_true(fa_tc_wide_smem_bytes(128) <= 101376);
}

static void test_padded_head_dims(void **state)
{
    (void)state;
    assert_int_equal(fa_tc_padded_dim(0), 0);
    assert_int_equal(fa_tc_padded_dim(-8), 0);
    assert_int_equal(fa_tc_padded_dim(257), 0);
    for (int64_t d = 1; d <= 256; ++d) {
        const int w = fa_tc_padded_dim(d);
        assert_true(w >= d && w % 64 == 0);         /* zero padding covers d; the swizzle needs 8 chunks */
        assert_true(w == 64 || w / 2 < d);          /* the smallest instantiated width */
        assert_true(w == 64 || w == 128 || w == 256);
        assert_int_equal(fa_tc_block_cols(w) % 16, 0); /* whole k16 steps of P V */
    }
}

/* Every width fits the opt-in shared memory of A100, H100, sm_86 and the 64 KiB LDS of AMD. */
static void test_shared_memory_fits(void **state)
{
    (void)state;
    static const int64_t devices[] = {166912, 232448, 101376, 65536};
    for (size_t wi = 0; wi < WIDTHS; ++wi) {
        const int w = widths[wi];
        assert_int_equal(fa_tc_smem_bytes(w), 2 * w * (FA_TC_BLOCK_ROWS + 2 * fa_tc_block_cols(w)));
        for (size_t i = 0; i < sizeof devices / sizeof devices[0]; ++i) assert_true(fa_tc_smem_bytes(w) <= devices[i]);
    }
    assert_true(fa_tc_smem_bytes(256) > 49152); /* needs the opt-in above 48 KiB; the plugin raises it */
    /* the backward: widths up to FA_TC_BACKWARD_MAX_WIDTH, whole k16 steps over the query tile */
    assert_int_equal(FA_TC_BACKWARD_QUERY_TILE % 16, 0);
    for (int w = 64; w <= FA_TC_BACKWARD_MAX_WIDTH; w *= 2) {
        assert_int_equal(fa_tc_backward_smem_bytes(w),
                         2 * w * (2 * FA_TC_BLOCK_ROWS + 2 * FA_TC_BACKWARD_QUERY_TILE) + 8 * FA_TC_BACKWARD_QUERY_TILE);
        for (size_t i = 0; i < sizeof devices / sizeof devices[0]; ++i)
            assert_true(fa_tc_backward_smem_bytes(w) <= devices[i]);
    }
    /* the wide-tile backward: fits sm_80 and sm_90 at widths 64 and 128 (sm_86/89: width 64; wider
     * problems there take the tc backward), every buffer on a 16-byte boundary */
    assert_true(fa_tc_wide_backward_smem_bytes(128) <= devices[0]);
    assert_true(fa_tc_wide_backward_smem_bytes(64) <= devices[2]);
    assert_true(fa_tc_wide_backward_smem_bytes(128) > devices[2]);
    assert_int_equal(fa_tc_wide_backward_smem_bytes(128), 2 * (128 * (2 * 128 + 4 * 64) + 128 * 64) + 16 * 64);
}

/* The dQ slices of the wide-tile backward: about two blocks per multiprocessor, no more than key
 * blocks, within 256 MiB unless one slice is larger, never zero. */
static void test_wide_backward_splits(void **state)
{
    (void)state;
    assert_int_equal(fa_tc_wide_backward_splits(132, 1, 1000, 1 << 16), 264);
    assert_int_equal(fa_tc_wide_backward_splits(132, 1, 1000, 1 << 20), 256);
    assert_int_equal(fa_tc_wide_backward_splits(132, 16, 1000, 1 << 20), 17);
    assert_int_equal(fa_tc_wide_backward_splits(132, 512, 1000, 1 << 20), 1);
    assert_int_equal(fa_tc_wide_backward_splits(132, 1, 3, 1 << 20), 3);
    assert_int_equal(fa_tc_wide_backward_splits(132, 1, 1000, (int64_t)64 << 20), 4);
    assert_int_equal(fa_tc_wide_backward_splits(132, 1, 1000, (int64_t)1 << 30), 1);
    assert_int_equal(fa_tc_wide_backward_splits(1, 1, 0, 0), 1);
}

static void test_chunk_alignment(void **state)
{
    (void)state;
    _Alignas(16) static uint16_t buffer[64];
    assert_true(fa_tc_chunk_aligned(buffer, 64, 64 * 128, 64, 64 * 16));
    assert_false(fa_tc_chunk_aligned(buffer + 1, 64, 64 * 128, 64, 64 * 16)); /* base not 16-byte aligned */
    assert_false(fa_tc_chunk_aligned(buffer, 72 - 3, 69 * 16, 69, 69 * 4));    /* d = 69 */
    assert_false(fa_tc_chunk_aligned(buffer, 48, 51 * 21 * 3, 51 * 3, 51));    /* padded layout, +3 */
    assert_true(fa_tc_chunk_aligned(buffer, 40, 40 * 33 * 4, 40, 40 * 33));   /* bhsd, d = 40 */
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_swizzle_is_a_bijection_of_whole_chunks),
        cmocka_unit_test(test_ldmatrix_phases_conflict_free),
        cmocka_unit_test(test_chunk_copies_conflict_free),
        cmocka_unit_test(test_mma_sync_qk_pv_w64),
        cmocka_unit_test(test_mma_sync_qk_pv_w128),
        cmocka_unit_test(test_mma_sync_qk_pv_w256),
        cmocka_unit_test(test_mma_emulation_detects_wrong_packing),
        cmocka_unit_test(test_mfma_qk_pv_w64),
        cmocka_unit_test(test_mfma_qk_pv_w128),
        cmocka_unit_test(test_mfma_qk_pv_w256),
        cmocka_unit_test(test_mfma_rows_match_fma_rows),
        cmocka_unit_test(test_fma_layer_warp32),
        cmocka_unit_test(test_fma_layer_wave64),
        cmocka_unit_test(test_mma_rows_live_in_quads),
        cmocka_unit_test(test_ldsm_step_columns),
        cmocka_unit_test(test_ldsm_a_trans_reads_transposed_a),
        cmocka_unit_test(test_family_from_environment_value),
        cmocka_unit_test(test_wide_forward_takes_plain_problems),
        cmocka_unit_test(test_padded_head_dims),
        cmocka_unit_test(test_shared_memory_fits),
        cmocka_unit_test(test_wide_backward_splits),
        cmocka_unit_test(test_chunk_alignment),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
