/* The instrumented run: the paper's algorithms executed literally on real f32 data. The caller's
 * arrays (and the intermediates the algorithm keeps: S, P, dP, dS, l, m, the RNG state) play the
 * slow memory; every object the algorithm keeps "on chip" is a separate buffer acquired and
 * released as the loops go, so the high-water mark is measured, not assumed. Every element copied
 * between the two is counted per operand. The counts are independent of io_model.c's closed forms
 * (they share only the problem validation and the definition of a visited tile). */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "../common/alloc.h"
#include "../common/error.h"
#include "../common/philox.h"
#include "io_model.h"

/* An on-chip buffer: a header linking it into the live list, then the floats. The list lets a
 * run that stops on an allocation failure release whatever its loops still held. */
typedef struct chip_block {
    struct chip_block *prev, *next;
    int64_t elements;
    int64_t pad_; /* keeps the floats 32-byte aligned after the 32-byte header */
} chip_block;

typedef struct sim {
    const fa_io_plan *plan;
    fa_io_counts *counts;
    int64_t on_chip;
    int out_of_memory;
    chip_block *live;
} sim;

/* ---- on-chip buffers and counted transfers -------------------------------------------------- */
/* n floats (plus extra bytes in front) from the library allocator; NULL when they do not fit. */
static void *float_alloc_with(int64_t n, size_t extra)
{
    if (n < 0 || (uint64_t)n > (SIZE_MAX - extra) / sizeof(float)) return NULL;
    return fa_host_alloc(extra + (size_t)(n > 0 ? n : 1) * sizeof(float));
}

static float *float_alloc(int64_t n) { return float_alloc_with(n, 0); }

static float *chip_acquire(sim *s, int64_t elements)
{
    chip_block *b = float_alloc_with(elements, sizeof(chip_block));
    if (!b) {
        s->out_of_memory = 1;
        return NULL;
    }
    b->elements = elements;
    b->prev = NULL;
    b->next = s->live;
    if (s->live) s->live->prev = b;
    s->live = b;
    s->on_chip += elements;
    if (s->on_chip > s->counts->sram_peak) s->counts->sram_peak = s->on_chip;
    return (float *)(b + 1);
}

static void chip_release(sim *s, float *p, int64_t elements)
{
    if (!p) return;
    chip_block *b = (chip_block *)p - 1;
    if (b->prev) b->prev->next = b->next;
    else s->live = b->next;
    if (b->next) b->next->prev = b->prev;
    fa_host_free(b);
    s->on_chip -= elements;
}

/* After a run: frees what an interrupted loop nest still held (nothing after a complete run). */
static void chip_release_all(sim *s)
{
    while (s->live) chip_release(s, (float *)(s->live + 1), s->live->elements);
}

static void load(sim *s, fa_io_operand op, float *chip, const float *slow, int64_t n)
{
    memcpy(chip, slow, (size_t)n * sizeof(float));
    s->counts->reads[op] += n;
}

static void store(sim *s, fa_io_operand op, float *slow, const float *chip, int64_t n)
{
    memcpy(slow, chip, (size_t)n * sizeof(float));
    s->counts->writes[op] += n;
}

static void slow_fill(sim *s, fa_io_operand op, float *slow, float value, int64_t n)
{
    for (int64_t x = 0; x < n; ++x) slow[x] = value;
    s->counts->writes[op] += n;
}

/* M_ij lives in slow memory: testing it is one counted read. Returns 1 when the tile is computed. */
static int tile_test(sim *s, int64_t i, int64_t j)
{
    if (s->plan->tests_mask) {
        s->counts->reads[FA_IO_MASK] += 1;
        if (!fa_io_tile_set(s->plan, i, j)) return 0;
    }
    s->counts->tiles_visited += 1;
    return 1;
}

/* ---- on-chip arithmetic --------------------------------------------------------------------- */
/* c[r][x] = alpha * sum_t a[r][t] b[x][t]  (c = alpha a b^T), a: rows x depth, b: cols x depth. */
static void product_nt(sim *s, int64_t rows, int64_t cols, int64_t depth, float alpha, const float *a,
                       const float *b, float *c)
{
    for (int64_t r = 0; r < rows; ++r)
        for (int64_t x = 0; x < cols; ++x) {
            float sum = 0.0f;
            for (int64_t t = 0; t < depth; ++t) sum += a[r * depth + t] * b[x * depth + t];
            c[r * cols + x] = alpha * sum;
        }
    s->counts->flops += 2 * rows * cols * depth;
}

/* c[r][x] += alpha * sum_t a[r][t] b[t][x]  (c += alpha a b), a: rows x depth, b: depth x cols. */
static void product_nn_acc(sim *s, int64_t rows, int64_t cols, int64_t depth, float alpha, const float *a,
                           const float *b, float *c)
{
    for (int64_t r = 0; r < rows; ++r)
        for (int64_t t = 0; t < depth; ++t) {
            const float w = alpha * a[r * depth + t];
            for (int64_t x = 0; x < cols; ++x) c[r * cols + x] += w * b[t * cols + x];
        }
    s->counts->flops += 2 * rows * cols * depth;
}

/* c[x][y] += alpha * sum_r a[r][x] b[r][y]  (c += alpha a^T b), a: depth x rows, b: depth x cols. */
static void product_tn_acc(sim *s, int64_t rows, int64_t cols, int64_t depth, float alpha, const float *a,
                           const float *b, float *c)
{
    for (int64_t r = 0; r < depth; ++r)
        for (int64_t x = 0; x < rows; ++x) {
            const float w = alpha * a[r * rows + x];
            for (int64_t y = 0; y < cols; ++y) c[x * cols + y] += w * b[r * cols + y];
        }
    s->counts->flops += 2 * rows * cols * depth;
}

/* Sets the masked entries of an on-chip score tile to -inf. */
/* The bias tile of (h, rows i0.., keys j0..) read from slow memory into an on-chip buffer (counted
 * in bias_reads) and added to the scaled scores tile [rows x cols]. */
static void add_bias_tile(sim *s, int64_t h, int64_t i0, int64_t j0, int64_t rows, int64_t cols, float *tile)
{
    const fa_bias *b = s->plan->bias;
    if (!b) return;
    float *chip = chip_acquire(s, rows * cols);
    if (!chip) return;
    for (int64_t r = 0; r < rows; ++r) {
        const float *slow = (const float *)b->data + h * b->stride_head + (i0 + r) * b->stride_q + j0;
        memcpy(chip + r * cols, slow, (size_t)cols * sizeof(float));
    }
    s->counts->bias_reads += rows * cols;
    for (int64_t e = 0; e < rows * cols; ++e) tile[e] += chip[e];
    chip_release(s, chip, rows * cols);
}

static void mask_tile(const fa_io_plan *p, int64_t i0, int64_t j0, int64_t rows, int64_t cols, float *tile)
{
    if (!p->mask) return;
    for (int64_t r = 0; r < rows; ++r)
        for (int64_t c = 0; c < cols; ++c)
            if (!fa_io_element_set(p, i0 + r, j0 + c)) tile[r * cols + c] = -INFINITY;
}

/* Multiplies a probability tile of head h by the dropout keep mask scaled by 1/(1-p); the
 * stream is the library's (src/common/philox.h), seeded from the RNG state loaded on chip. */
static void dropout_tile(const fa_io_plan *p, const uint64_t rng[2], float dropout_p, int64_t h, int64_t i0,
                         int64_t j0, int64_t rows, int64_t cols, float *tile)
{
    const float keep_scale = 1.0f / (1.0f - dropout_p);
    for (int64_t r = 0; r < rows; ++r)
        for (int64_t c = 0; c < cols; ++c) {
            const uint64_t e = (uint64_t)((h * p->nq + i0 + r) * p->nk + j0 + c);
            tile[r * cols + c] = fa_dropout_keep(rng[0], rng[1], e, dropout_p) ? tile[r * cols + c] * keep_scale : 0.0f;
        }
}

/* The arrays of one simulate call; intermediates are allocated by the passes that write them. */
typedef struct sim_data {
    const float *q, *k, *v, *dout;
    float *out, *dq, *dk, *dv;
    float *l, *m;          /* [heads * nq], flash */
    float *s_mat, *p_mat;  /* [heads * nq * nk], standard */
    uint64_t rng[2];       /* the saved RNG state (seed, offset) */
    float dropout_p;
} sim_data;

#define CHIP(ptr, n)                                                                                              \
    do {                                                                                                          \
        (ptr) = chip_acquire(s, (n));                                                                             \
        if (!(ptr)) return;                                                                                       \
    } while (0)

/* ---- Algorithm 0 and Algorithm 3 (standard attention) ------------------------------------- */
static void standard_forward_head(sim *s, sim_data *x, int64_t h)
{
    const fa_io_plan *p = s->plan;
    const int64_t nq = p->nq, nk = p->nk, d = p->d;
    const float *q = x->q + h * nq * d, *k = x->k + h * nk * d, *v = x->v + h * nk * d;
    float *S = x->s_mat + h * nq * nk, *P = x->p_mat + h * nq * nk, *o = x->out + h * nq * d;
    float *kc, *vc, *row, *vec;
    /* Line 1: S = tau Q K^T (K kept on chip, Q streamed by rows). */
    CHIP(kc, nk * d);
    load(s, FA_IO_K, kc, k, nk * d);
    for (int64_t i = 0; i < nq; ++i) {
        CHIP(vec, d);
        CHIP(row, nk);
        load(s, FA_IO_Q, vec, q + i * d, d);
        product_nt(s, 1, nk, d, p->scale, vec, kc, row);
        add_bias_tile(s, h, i, 0, 1, nk, row);
        store(s, FA_IO_S, S + i * nk, row, nk);
        chip_release(s, row, nk);
        chip_release(s, vec, d);
    }
    chip_release(s, kc, nk * d);
    /* Line 2: P = softmax(S), one row at a time. */
    for (int64_t i = 0; i < nq; ++i) {
        CHIP(row, nk);
        load(s, FA_IO_S, row, S + i * nk, nk);
        float mx = -INFINITY, sum = 0.0f;
        for (int64_t j = 0; j < nk; ++j) mx = row[j] > mx ? row[j] : mx;
        for (int64_t j = 0; j < nk; ++j) sum += row[j] = expf(row[j] - mx);
        for (int64_t j = 0; j < nk; ++j) row[j] /= sum;
        store(s, FA_IO_P, P + i * nk, row, nk);
        chip_release(s, row, nk);
    }
    /* Line 3: O = P V (V kept on chip, P streamed by rows). */
    CHIP(vc, nk * d);
    load(s, FA_IO_V, vc, v, nk * d);
    for (int64_t i = 0; i < nq; ++i) {
        CHIP(row, nk);
        CHIP(vec, d);
        load(s, FA_IO_P, row, P + i * nk, nk);
        memset(vec, 0, (size_t)d * sizeof(float));
        product_nn_acc(s, 1, d, nk, 1.0f, row, vc, vec);
        store(s, FA_IO_O, o + i * d, vec, d);
        chip_release(s, vec, d);
        chip_release(s, row, nk);
    }
    chip_release(s, vc, nk * d);
}

static void standard_backward_head(sim *s, sim_data *x, float *dP, float *dS, int64_t h)
{
    const fa_io_plan *p = s->plan;
    const int64_t nq = p->nq, nk = p->nk, d = p->d;
    const float *q = x->q + h * nq * d, *k = x->k + h * nk * d, *v = x->v + h * nk * d;
    const float *dout = x->dout + h * nq * d, *P = x->p_mat + h * nq * nk;
    float *dq = x->dq + h * nq * d, *dk = x->dk + h * nk * d, *dv = x->dv + h * nk * d;
    dP += h * nq * nk;
    dS += h * nq * nk;
    float *whole, *row, *row2, *vec;
    /* Line 1: dV = P^T dO (dV accumulated on chip, P and dO streamed by rows). */
    CHIP(whole, nk * d);
    memset(whole, 0, (size_t)(nk * d) * sizeof(float));
    for (int64_t i = 0; i < nq; ++i) {
        CHIP(row, nk);
        CHIP(vec, d);
        load(s, FA_IO_P, row, P + i * nk, nk);
        load(s, FA_IO_DO, vec, dout + i * d, d);
        product_tn_acc(s, nk, d, 1, 1.0f, row, vec, whole);
        chip_release(s, vec, d);
        chip_release(s, row, nk);
    }
    store(s, FA_IO_DV, dv, whole, nk * d);
    chip_release(s, whole, nk * d);
    /* Line 2: dP = dO V^T. */
    CHIP(whole, nk * d);
    load(s, FA_IO_V, whole, v, nk * d);
    for (int64_t i = 0; i < nq; ++i) {
        CHIP(vec, d);
        CHIP(row, nk);
        load(s, FA_IO_DO, vec, dout + i * d, d);
        product_nt(s, 1, nk, d, 1.0f, vec, whole, row);
        store(s, FA_IO_DP, dP + i * nk, row, nk);
        chip_release(s, row, nk);
        chip_release(s, vec, d);
    }
    chip_release(s, whole, nk * d);
    /* Line 3: dS_ij = P_ij (dP_ij - sum_l P_il dP_il). */
    for (int64_t i = 0; i < nq; ++i) {
        CHIP(row, nk);
        CHIP(row2, nk);
        load(s, FA_IO_P, row, P + i * nk, nk);
        load(s, FA_IO_DP, row2, dP + i * nk, nk);
        float dot = 0.0f;
        for (int64_t j = 0; j < nk; ++j) dot += row[j] * row2[j];
        for (int64_t j = 0; j < nk; ++j) row2[j] = row[j] * (row2[j] - dot);
        store(s, FA_IO_DS, dS + i * nk, row2, nk);
        chip_release(s, row2, nk);
        chip_release(s, row, nk);
    }
    /* Line 4: dQ = tau dS K (K on chip). */
    CHIP(whole, nk * d);
    load(s, FA_IO_K, whole, k, nk * d);
    for (int64_t i = 0; i < nq; ++i) {
        CHIP(row, nk);
        CHIP(vec, d);
        load(s, FA_IO_DS, row, dS + i * nk, nk);
        memset(vec, 0, (size_t)d * sizeof(float));
        product_nn_acc(s, 1, d, nk, p->scale, row, whole, vec);
        store(s, FA_IO_DQ, dq + i * d, vec, d);
        chip_release(s, vec, d);
        chip_release(s, row, nk);
    }
    chip_release(s, whole, nk * d);
    /* Line 5: dK = tau dS^T Q (dK accumulated on chip). */
    CHIP(whole, nk * d);
    memset(whole, 0, (size_t)(nk * d) * sizeof(float));
    for (int64_t i = 0; i < nq; ++i) {
        CHIP(row, nk);
        CHIP(vec, d);
        load(s, FA_IO_DS, row, dS + i * nk, nk);
        load(s, FA_IO_Q, vec, q + i * d, d);
        product_tn_acc(s, nk, d, 1, p->scale, row, vec, whole);
        chip_release(s, vec, d);
        chip_release(s, row, nk);
    }
    store(s, FA_IO_DK, dk, whole, nk * d);
    chip_release(s, whole, nk * d);
}

/* ---- Algorithm 2 / 5 forward (K/V tiles outer) ------------------------------------------------ */
typedef struct forward_tile {
    float *q, *o, *l, *m, *s, *mt, *lt, *mn, *ln;
} forward_tile;

/* Lines 9-16 of Algorithm 5 for tile (i, j), K_j and V_j already on chip. */
static void flash_forward_tile(sim *s, sim_data *x, int64_t h, int64_t i, int64_t j, const float *kj,
                               const float *vj, const uint64_t *rng)
{
    const fa_io_plan *p = s->plan;
    const int64_t d = p->d, i0 = i * p->br, j0 = j * p->bc;
    const int64_t rows = fa_io_tile_rows(p, i), cols = fa_io_tile_cols(p, j);
    float *o_slow = x->out + (h * p->nq + i0) * d, *l_slow = x->l + h * p->nq + i0, *m_slow = x->m + h * p->nq + i0;
    forward_tile t;
    CHIP(t.q, rows * d);
    CHIP(t.o, rows * d);
    CHIP(t.l, rows);
    CHIP(t.m, rows);
    load(s, FA_IO_Q, t.q, x->q + (h * p->nq + i0) * d, rows * d);
    load(s, FA_IO_O, t.o, o_slow, rows * d);
    load(s, FA_IO_L, t.l, l_slow, rows);
    load(s, FA_IO_M, t.m, m_slow, rows);
    CHIP(t.s, rows * cols);
    CHIP(t.mt, rows);
    CHIP(t.lt, rows);
    CHIP(t.mn, rows);
    CHIP(t.ln, rows);
    product_nt(s, rows, cols, d, p->scale, t.q, kj, t.s);
    add_bias_tile(s, h, i0, j0, rows, cols, t.s);
    mask_tile(p, i0, j0, rows, cols, t.s);
    for (int64_t r = 0; r < rows; ++r) {
        float *srow = t.s + r * cols;
        t.mt[r] = -INFINITY;
        for (int64_t c = 0; c < cols; ++c) t.mt[r] = srow[c] > t.mt[r] ? srow[c] : t.mt[r];
        t.lt[r] = 0.0f;
        if (t.mt[r] == -INFINITY) { /* nothing visible in this row of the tile: no contribution */
            memset(srow, 0, (size_t)cols * sizeof(float));
            t.mn[r] = t.m[r];
            t.ln[r] = t.l[r];
            continue;
        }
        for (int64_t c = 0; c < cols; ++c) t.lt[r] += srow[c] = expf(srow[c] - t.mt[r]);
        t.mn[r] = t.m[r] > t.mt[r] ? t.m[r] : t.mt[r];
        t.ln[r] = expf(t.m[r] - t.mn[r]) * t.l[r] + expf(t.mt[r] - t.mn[r]) * t.lt[r];
    }
    if (rng) dropout_tile(p, rng, x->dropout_p, h, i0, j0, rows, cols, t.s);
    /* Line 15: O_i = diag(l_new)^-1 (diag(l_i) e^(m_i - m_new) O_i + e^(m~ - m_new) P~ V_j). */
    for (int64_t r = 0; r < rows; ++r) {
        const int seen = t.mt[r] != -INFINITY; /* an unseen row keeps O_i (its P~ row is 0) */
        const float old = seen ? t.l[r] * expf(t.m[r] - t.mn[r]) : 1.0f, fresh = seen ? expf(t.mt[r] - t.mn[r]) : 0.0f;
        for (int64_t c = 0; c < d; ++c) t.o[r * d + c] *= old;
        product_nn_acc(s, 1, d, cols, fresh, t.s + r * cols, vj, t.o + r * d);
        if (seen)
            for (int64_t c = 0; c < d; ++c) t.o[r * d + c] /= t.ln[r];
    }
    store(s, FA_IO_O, o_slow, t.o, rows * d);
    store(s, FA_IO_L, l_slow, t.ln, rows);
    store(s, FA_IO_M, m_slow, t.mn, rows);
    chip_release(s, t.ln, rows);
    chip_release(s, t.mn, rows);
    chip_release(s, t.lt, rows);
    chip_release(s, t.mt, rows);
    chip_release(s, t.s, rows * cols);
    chip_release(s, t.m, rows);
    chip_release(s, t.l, rows);
    chip_release(s, t.o, rows * d);
    chip_release(s, t.q, rows * d);
}

static void flash_forward_head(sim *s, sim_data *x, int64_t h, const uint64_t *rng)
{
    const fa_io_plan *p = s->plan;
    const int64_t d = p->d;
    slow_fill(s, FA_IO_O, x->out + h * p->nq * d, 0.0f, p->nq * d); /* line 3 */
    slow_fill(s, FA_IO_L, x->l + h * p->nq, 0.0f, p->nq);
    slow_fill(s, FA_IO_M, x->m + h * p->nq, -INFINITY, p->nq);
    for (int64_t j = 0; j < p->tc && !s->out_of_memory; ++j) {
        const int64_t cols = fa_io_tile_cols(p, j), off = (h * p->nk + j * p->bc) * d;
        float *kj, *vj;
        CHIP(kj, cols * d);
        CHIP(vj, cols * d);
        load(s, FA_IO_K, kj, x->k + off, cols * d);
        load(s, FA_IO_V, vj, x->v + off, cols * d);
        for (int64_t i = 0; i < p->tr && !s->out_of_memory; ++i)
            if (tile_test(s, i, j)) flash_forward_tile(s, x, h, i, j, kj, vj, rng);
        chip_release(s, vj, cols * d);
        chip_release(s, kj, cols * d);
    }
}

/* ---- The CPU backend's order: Q tiles outer, O normalised once ------------------------------ */
static void query_outer_head(sim *s, sim_data *x, float *lse, int64_t h, const uint64_t *rng)
{
    const fa_io_plan *p = s->plan;
    const int64_t d = p->d;
    for (int64_t i = 0; i < p->tr && !s->out_of_memory; ++i) {
        const int64_t rows = fa_io_tile_rows(p, i), i0 = i * p->br;
        float *qi, *oi, *mi, *li;
        CHIP(qi, rows * d);
        CHIP(oi, rows * d);
        CHIP(mi, rows);
        CHIP(li, rows);
        load(s, FA_IO_Q, qi, x->q + (h * p->nq + i0) * d, rows * d);
        memset(oi, 0, (size_t)(rows * d) * sizeof(float));
        for (int64_t r = 0; r < rows; ++r) {
            mi[r] = -INFINITY;
            li[r] = 0.0f;
        }
        for (int64_t j = 0; j < p->tc && !s->out_of_memory; ++j) {
            if (!tile_test(s, i, j)) continue;
            const int64_t cols = fa_io_tile_cols(p, j), j0 = j * p->bc, off = (h * p->nk + j0) * d;
            float *kj, *vj, *st;
            CHIP(kj, cols * d);
            CHIP(vj, cols * d);
            CHIP(st, rows * cols);
            load(s, FA_IO_K, kj, x->k + off, cols * d);
            load(s, FA_IO_V, vj, x->v + off, cols * d);
            product_nt(s, rows, cols, d, p->scale, qi, kj, st);
            add_bias_tile(s, h, i0, j0, rows, cols, st);
            mask_tile(p, i0, j0, rows, cols, st);
            for (int64_t r = 0; r < rows; ++r) { /* online softmax, normalisation deferred */
                float *srow = st + r * cols, mx = -INFINITY, sum = 0.0f;
                for (int64_t c = 0; c < cols; ++c) mx = srow[c] > mx ? srow[c] : mx;
                if (mx == -INFINITY) {
                    memset(srow, 0, (size_t)cols * sizeof(float));
                    continue;
                }
                const float m_new = mi[r] > mx ? mi[r] : mx, alpha = expf(mi[r] - m_new);
                for (int64_t c = 0; c < cols; ++c) sum += srow[c] = expf(srow[c] - m_new);
                li[r] = li[r] * alpha + sum;
                mi[r] = m_new;
                for (int64_t c = 0; c < d; ++c) oi[r * d + c] *= alpha;
            }
            if (rng) dropout_tile(p, rng, x->dropout_p, h, i0, j0, rows, cols, st);
            product_nn_acc(s, rows, d, cols, 1.0f, st, vj, oi);
            chip_release(s, st, rows * cols);
            chip_release(s, vj, cols * d);
            chip_release(s, kj, cols * d);
        }
        for (int64_t r = 0; r < rows; ++r) {
            const float inv = li[r] > 0.0f ? 1.0f / li[r] : 0.0f;
            for (int64_t c = 0; c < d; ++c) oi[r * d + c] *= inv;
            mi[r] = li[r] > 0.0f ? mi[r] + logf(li[r]) : -INFINITY; /* lse, in place */
        }
        store(s, FA_IO_O, x->out + (h * p->nq + i0) * d, oi, rows * d);
        store(s, FA_IO_L, lse + h * p->nq + i0, mi, rows);
        chip_release(s, li, rows);
        chip_release(s, mi, rows);
        chip_release(s, oi, rows * d);
        chip_release(s, qi, rows * d);
    }
}

/* ---- Algorithm 4 (backward, K/V tiles outer), skipping zero tiles when the mask says so ----- */
typedef struct backward_tile {
    float *q, *o, *dout, *dq, *l, *m, *s, *dp, *delta;
} backward_tile;

/* Lines 10-22 for tile (i, j); kj, vj, dkj, dvj on chip. */
static void flash_backward_tile(sim *s, sim_data *x, int64_t h, int64_t i, int64_t j, const float *kj,
                                const float *vj, float *dkj, float *dvj, const uint64_t *rng)
{
    const fa_io_plan *p = s->plan;
    const int64_t d = p->d, i0 = i * p->br, j0 = j * p->bc;
    const int64_t rows = fa_io_tile_rows(p, i), cols = fa_io_tile_cols(p, j), off = (h * p->nq + i0) * d;
    float *dq_slow = x->dq + off;
    backward_tile t;
    CHIP(t.q, rows * d);
    CHIP(t.o, rows * d);
    CHIP(t.dout, rows * d);
    CHIP(t.dq, rows * d);
    CHIP(t.l, rows);
    CHIP(t.m, rows);
    load(s, FA_IO_Q, t.q, x->q + off, rows * d);
    load(s, FA_IO_O, t.o, x->out + off, rows * d);
    load(s, FA_IO_DO, t.dout, x->dout + off, rows * d);
    load(s, FA_IO_DQ, t.dq, dq_slow, rows * d);
    load(s, FA_IO_L, t.l, x->l + h * p->nq + i0, rows);
    load(s, FA_IO_M, t.m, x->m + h * p->nq + i0, rows);
    CHIP(t.s, rows * cols);
    CHIP(t.dp, rows * cols);
    CHIP(t.delta, rows);
    /* Lines 11-13: P_ij = diag(l_i)^-1 exp(MASK(tau Q_i K_j^T) - m_i); rows that saw no key give 0. */
    product_nt(s, rows, cols, d, p->scale, t.q, kj, t.s);
    add_bias_tile(s, h, i0, j0, rows, cols, t.s);
    mask_tile(p, i0, j0, rows, cols, t.s);
    for (int64_t r = 0; r < rows; ++r)
        for (int64_t c = 0; c < cols; ++c)
            t.s[r * cols + c] = t.l[r] > 0.0f ? expf(t.s[r * cols + c] - t.m[r]) / t.l[r] : 0.0f;
    /* Lines 17-19: dP_ij = dO_i V_j^T, dropped with the same Z_ij; D_i = rowsum(dO_i o O_i). */
    product_nt(s, rows, cols, d, 1.0f, t.dout, vj, t.dp);
    if (rng) dropout_tile(p, rng, x->dropout_p, h, i0, j0, rows, cols, t.dp);
    for (int64_t r = 0; r < rows; ++r) {
        t.delta[r] = 0.0f;
        for (int64_t c = 0; c < d; ++c) t.delta[r] += t.dout[r * d + c] * t.o[r * d + c];
    }
    /* Line 20: dS_ij = P_ij o (dP_ij - D_i), in place of dP. */
    for (int64_t r = 0; r < rows; ++r)
        for (int64_t c = 0; c < cols; ++c) t.dp[r * cols + c] = t.s[r * cols + c] * (t.dp[r * cols + c] - t.delta[r]);
    /* Lines 14-16: dV~_j += (P_ij o Z_ij)^T dO_i. */
    if (rng) dropout_tile(p, rng, x->dropout_p, h, i0, j0, rows, cols, t.s);
    product_tn_acc(s, cols, d, rows, 1.0f, t.s, t.dout, dvj);
    /* Lines 21-22: dQ_i += tau dS_ij K_j (written back), dK~_j += tau dS_ij^T Q_i. */
    product_nn_acc(s, rows, d, cols, p->scale, t.dp, kj, t.dq);
    store(s, FA_IO_DQ, dq_slow, t.dq, rows * d);
    product_tn_acc(s, cols, d, rows, p->scale, t.dp, t.q, dkj);
    chip_release(s, t.delta, rows);
    chip_release(s, t.dp, rows * cols);
    chip_release(s, t.s, rows * cols);
    chip_release(s, t.m, rows);
    chip_release(s, t.l, rows);
    chip_release(s, t.dq, rows * d);
    chip_release(s, t.dout, rows * d);
    chip_release(s, t.o, rows * d);
    chip_release(s, t.q, rows * d);
}

static void flash_backward_head(sim *s, sim_data *x, int64_t h, const uint64_t *rng)
{
    const fa_io_plan *p = s->plan;
    const int64_t d = p->d;
    slow_fill(s, FA_IO_DQ, x->dq + h * p->nq * d, 0.0f, p->nq * d); /* line 5 */
    slow_fill(s, FA_IO_DK, x->dk + h * p->nk * d, 0.0f, p->nk * d);
    slow_fill(s, FA_IO_DV, x->dv + h * p->nk * d, 0.0f, p->nk * d);
    for (int64_t j = 0; j < p->tc && !s->out_of_memory; ++j) {
        const int64_t cols = fa_io_tile_cols(p, j), off = (h * p->nk + j * p->bc) * d;
        float *kj, *vj, *dkj, *dvj;
        CHIP(kj, cols * d);
        CHIP(vj, cols * d);
        load(s, FA_IO_K, kj, x->k + off, cols * d);
        load(s, FA_IO_V, vj, x->v + off, cols * d);
        CHIP(dkj, cols * d); /* line 8: dK~_j = dV~_j = 0 on chip */
        CHIP(dvj, cols * d);
        memset(dkj, 0, (size_t)(cols * d) * sizeof(float));
        memset(dvj, 0, (size_t)(cols * d) * sizeof(float));
        for (int64_t i = 0; i < p->tr && !s->out_of_memory; ++i)
            if (tile_test(s, i, j)) flash_backward_tile(s, x, h, i, j, kj, vj, dkj, dvj, rng);
        store(s, FA_IO_DK, x->dk + off, dkj, cols * d); /* line 24 */
        store(s, FA_IO_DV, x->dv + off, dvj, cols * d);
        chip_release(s, dvj, cols * d);
        chip_release(s, dkj, cols * d);
        chip_release(s, vj, cols * d);
        chip_release(s, kj, cols * d);
    }
}

/* ---- the public entry ---------------------------------------------------------------------- */
static fa_status check_arrays(const float *const *arrays, const char *const *names, int n)
{
    for (int a = 0; a < n; ++a)
        if (!arrays[a]) return fa_set_error(FA_ERROR_INVALID_VALUE, "%s: is NULL", names[a]);
    return FA_SUCCESS;
}

/* Runs one pass over all heads; the RNG state lives in x->rng (slow memory), loaded on chip once. */
static void run_pass(sim *s, sim_data *x, float *lse, float *dP, float *dS)
{
    const fa_io_plan *p = s->plan;
    uint64_t rng_chip[2];
    const uint64_t *rng = NULL;
    if (p->dropout) {
        if (p->pass == FA_IO_FORWARD) s->counts->writes[FA_IO_RNG] += 2; /* Algorithm 2, line 1: save R */
        else s->counts->reads[FA_IO_RNG] += 2;                           /* Algorithm 4, line 1: load R */
        memcpy(rng_chip, x->rng, sizeof rng_chip);
        rng = rng_chip;
    }
    for (int64_t h = 0; h < p->heads && !s->out_of_memory; ++h) {
        if (p->algorithm == FA_IO_STANDARD) {
            if (p->pass == FA_IO_FORWARD) standard_forward_head(s, x, h);
            else standard_backward_head(s, x, dP, dS, h);
        } else if (p->algorithm == FA_IO_FLASH_QUERY_OUTER) {
            query_outer_head(s, x, lse, h, rng);
        } else if (p->pass == FA_IO_FORWARD) {
            flash_forward_head(s, x, h, rng);
        } else {
            flash_backward_head(s, x, h, rng);
        }
    }
}

static fa_status pass_result(sim *s, fa_io_counts *counts)
{
    if (s->out_of_memory) return fa_set_error(FA_ERROR_OUT_OF_MEMORY, "simulate: cannot allocate an on-chip buffer");
    counts->block_rows = s->plan->br;
    counts->block_cols = s->plan->bc;
    if (!fa_io_counts_total(counts, s->plan->element_bytes, s->plan->bias_bytes))
        return fa_set_error(FA_ERROR_INVALID_VALUE, "problem: counts overflow 64 bits");
    return FA_SUCCESS;
}

/* Allocates a slow-memory intermediate of n floats and records it in hbm_extra. */
static float *slow_alloc(fa_io_counts *counts, int64_t n, int *failed)
{
    float *p = float_alloc(n);
    if (!p) *failed = 1;
    counts->hbm_extra += n;
    return p;
}

fa_status fa_io_simulate(const fa_io_problem *caller_problem, const float *q, const float *k, const float *v,
                         float *out, float *lse, fa_io_counts *forward_counts, const float *dout, float *dq, float *dk,
                         float *dv, fa_io_counts *backward_counts)
{
    fa_io_problem full;
    fa_status st = fa_io_problem_read(caller_problem, &full);
    if (st) return st;
    const fa_io_problem *problem = &full;
    fa_io_plan fwd, bwd;
    fa_io_counts model;
    st = fa_io_plan_make(problem, FA_IO_FORWARD, &fwd);
    if (st) return st;
    if ((st = fa_io_estimate(problem, FA_IO_FORWARD, &model))) return st; /* every count, and so every size, fits */
    const float *inputs[] = {q, k, v, out};
    const char *const input_names[] = {"q", "k", "v", "out"};
    if ((st = check_arrays(inputs, input_names, 4))) return st;
    if (!forward_counts) return fa_set_error(FA_ERROR_INVALID_VALUE, "forward_counts: is NULL");
    if (fwd.tests_mask && fwd.density < 1.0 && !fwd.mask)
        return fa_set_error(FA_ERROR_INVALID_VALUE,
                            "problem->block_mask: the instrumented run needs a mask (a density has no placement)");
    if (fwd.bias && fwd.bias->dtype != FA_DTYPE_F32)
        return fa_set_error(FA_ERROR_NOT_SUPPORTED, "problem->bias->dtype: the instrumented run adds f32 biases only "
                                                    "(the model counts any dtype)");
    if (fwd.bias && !fwd.bias->data) return fa_set_error(FA_ERROR_INVALID_VALUE, "problem->bias->data: is NULL");
    if (fwd.algorithm == FA_IO_STANDARD && lse)
        return fa_set_error(FA_ERROR_INVALID_VALUE, "lse: standard attention (Algorithm 0) keeps no statistics; pass NULL");
    if (dout) {
        if ((st = fa_io_plan_make(problem, FA_IO_BACKWARD, &bwd))) return st;
        if ((st = fa_io_estimate(problem, FA_IO_BACKWARD, &model))) return st;
        const float *grads[] = {dq, dk, dv};
        const char *const grad_names[] = {"dq", "dk", "dv"};
        if ((st = check_arrays(grads, grad_names, 3))) return st;
        if (!backward_counts) return fa_set_error(FA_ERROR_INVALID_VALUE, "backward_counts: is NULL");
    }

    const int64_t rows = fwd.heads * fwd.nq, nn = fwd.heads * fwd.nq * fwd.nk;
    sim_data x = {q, k, v, dout, out, dq, dk, dv, NULL, NULL, NULL, NULL, {problem->dropout_seed, problem->dropout_offset},
                  problem->dropout_p};
    float *lse_slow = NULL, *dP = NULL, *dS = NULL;
    int failed = 0;
    fa_io_counts fc;
    memset(&fc, 0, sizeof fc);
    if (fwd.algorithm == FA_IO_STANDARD) {
        x.s_mat = slow_alloc(&fc, nn, &failed);
        x.p_mat = slow_alloc(&fc, nn, &failed);
    } else if (fwd.algorithm == FA_IO_FLASH_QUERY_OUTER) {
        lse_slow = lse ? lse : slow_alloc(&fc, rows, &failed);
        if (lse) fc.hbm_extra += rows;
    } else {
        x.l = slow_alloc(&fc, rows, &failed);
        x.m = slow_alloc(&fc, rows, &failed);
    }
    if (fwd.dropout) fc.hbm_extra += 2;
    sim s = {&fwd, &fc, 0, failed, NULL};
    if (!failed) run_pass(&s, &x, lse_slow, NULL, NULL);
    chip_release_all(&s);
    st = pass_result(&s, &fc);
    if (!st && lse && x.l) /* the paper returns l and m; lse = m + log l is read outside the count */
        for (int64_t r = 0; r < rows; ++r) lse[r] = x.l[r] > 0.0f ? x.m[r] + logf(x.l[r]) : -INFINITY;
    if (!st) fa_io_counts_store(caller_problem, forward_counts, &fc);

    if (!st && dout) {
        fa_io_counts bc;
        memset(&bc, 0, sizeof bc);
        if (bwd.algorithm == FA_IO_STANDARD) {
            bc.hbm_extra += nn; /* P, kept from the forward */
            dP = slow_alloc(&bc, nn, &failed);
            dS = slow_alloc(&bc, nn, &failed);
        } else {
            bc.hbm_extra += 2 * rows; /* l and m, kept from the forward */
        }
        if (bwd.dropout) bc.hbm_extra += 2;
        sim sb = {&bwd, &bc, 0, failed, NULL};
        if (!failed) run_pass(&sb, &x, NULL, dP, dS);
        chip_release_all(&sb);
        st = pass_result(&sb, &bc);
        if (!st) fa_io_counts_store(caller_problem, backward_counts, &bc);
    }
    fa_host_free(dS);
    fa_host_free(dP);
    if (!lse) fa_host_free(lse_slow);
    fa_host_free(x.m);
    fa_host_free(x.l);
    fa_host_free(x.p_mat);
    fa_host_free(x.s_mat);
    return st;
}
