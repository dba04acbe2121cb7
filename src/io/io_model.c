/* The exact IO model: elements moved between slow memory and SRAM by the paper's algorithms,
 * from closed forms over their loop structure (docs/IO.md derives each line). Per (batch, head)
 * pair, with R = sum of rows_i, C = sum of cols_j, A = sum of rows_i * cols_j and T = number of
 * (i, j) tiles computed; dense problems have R = Tc * Nq, C = Tr * Nk, A = Nq * Nk, T = Tr * Tc. */
#include "io_model.h"

#include <math.h>
#include <stddef.h>
#include <string.h>

#include "../common/dtype.h"
#include "../common/error.h"
#include "../common/sized_struct.h"
#include "../common/tiling.h"
#include "../common/validate.h"

#define INVALID(...) fa_set_error(FA_ERROR_INVALID_VALUE, __VA_ARGS__)

/* 64-bit arithmetic that remembers an overflow instead of wrapping. */
typedef struct checked { int ok; } checked;

static int64_t mul(checked *c, int64_t a, int64_t b)
{
    int64_t r = 0;
    if (!fa_checked_mul(a, b, &r)) c->ok = 0;
    return r;
}

static int64_t add(checked *c, int64_t a, int64_t b)
{
    int64_t r = 0;
    if (!fa_checked_add(a, b, &r)) c->ok = 0;
    return r;
}

static int64_t ceil_div(int64_t a, int64_t b) { return a / b + (a % b != 0); }
static int64_t min64(int64_t a, int64_t b) { return a < b ? a : b; }
static int64_t max64(int64_t a, int64_t b) { return a > b ? a : b; }

void fa_io_problem_init(fa_io_problem *problem)
{
    if (!problem) return;
    memset(problem, 0, sizeof *problem);
    problem->struct_size = sizeof *problem;
    problem->algorithm = FA_IO_FLASH;
    problem->batch_heads = 1;
    problem->element_bytes = 4;
    problem->block_density = 1.0;
}

const char *fa_io_operand_name(fa_io_operand operand)
{
    static const char *const names[FA_IO_OPERAND_COUNT] = {"Q", "K", "V", "O", "dO", "dQ", "dK", "dV",
                                                           "l", "m", "S", "P", "dP", "dS", "mask", "rng"};
    return (unsigned)operand < FA_IO_OPERAND_COUNT ? names[operand] : "?";
}

static fa_status check_mask(const fa_block_mask *mask, int64_t nq, int64_t nk)
{
    if (!mask->mask) return INVALID("problem->block_mask: mask array is NULL");
    if (mask->block_q <= 0 || mask->block_k <= 0)
        return INVALID("problem->block_mask: block sizes %d x %d must be positive", (int)mask->block_q,
                       (int)mask->block_k);
    const int64_t rows = ceil_div(nq, mask->block_q), cols = ceil_div(nk, mask->block_k);
    if (mask->rows != rows || mask->cols != cols)
        return INVALID("problem->block_mask: grid %lld x %lld, expected ceil(seqlen/block) = %lld x %lld",
                       (long long)mask->rows, (long long)mask->cols, (long long)rows, (long long)cols);
    return FA_SUCCESS;
}

fa_status fa_io_plan_make(const fa_io_problem *problem, fa_io_pass pass, fa_io_plan *plan)
{
    if (!problem) return INVALID("problem: is NULL");
    const fa_io_problem *p = problem;
    if ((unsigned)p->algorithm > FA_IO_FLASH_QUERY_OUTER)
        return INVALID("problem->algorithm: unknown value %d", (int)p->algorithm);
    if (pass != FA_IO_FORWARD && pass != FA_IO_BACKWARD) return INVALID("pass: unknown value %d", (int)pass);
    const struct { const char *name; int64_t value; } sizes[] = {
        {"seqlen_q", p->seqlen_q}, {"seqlen_k", p->seqlen_k}, {"head_dim", p->head_dim},
        {"batch_heads", p->batch_heads}, {"sram_elements", p->sram_elements}, {"element_bytes", p->element_bytes}};
    for (size_t x = 0; x < sizeof sizes / sizeof sizes[0]; ++x)
        if (sizes[x].value <= 0)
            return INVALID("problem->%s: %lld is not positive", sizes[x].name, (long long)sizes[x].value);
    if (p->block_rows < 0 || p->block_cols < 0 || (p->block_rows == 0) != (p->block_cols == 0))
        return INVALID("problem->block_rows, block_cols: %lld, %lld must be both 0 or both positive",
                       (long long)p->block_rows, (long long)p->block_cols);
    if (!(p->block_density > 0.0 && p->block_density <= 1.0))
        return INVALID("problem->block_density: %g is not in (0, 1]", p->block_density);
    if (!(p->dropout_p >= 0.0f && p->dropout_p < 1.0f))
        return INVALID("problem->dropout_p: %g is not in [0, 1)", (double)p->dropout_p);
    if (!(p->softmax_scale >= 0.0f && isfinite(p->softmax_scale)))
        return INVALID("problem->softmax_scale: %g must be finite and >= 0 (0 = 1/sqrt(head_dim))",
                       (double)p->softmax_scale);
    const int skips = p->algorithm == FA_IO_BLOCK_SPARSE || p->algorithm == FA_IO_FLASH_QUERY_OUTER;
    if (!skips && (p->block_mask || p->block_density < 1.0))
        return INVALID("problem->block_mask, block_density: only FA_IO_BLOCK_SPARSE and FA_IO_FLASH_QUERY_OUTER "
                       "skip tiles");
    if (p->block_mask) {
        fa_status st = check_mask(p->block_mask, p->seqlen_q, p->seqlen_k);
        if (st) return st;
    }
    if (p->bias) {
        if ((unsigned)p->bias->dtype > FA_DTYPE_BF16)
            return INVALID("problem->bias->dtype: unknown value %d", (int)p->bias->dtype);
        if (p->bias->stride_batch != 0)
            return INVALID("problem->bias->stride_batch: %lld, must be 0 (stride_head steps the batch_heads pairs)",
                           (long long)p->bias->stride_batch);
        if (p->bias->stride_head < 0 || p->bias->stride_q < 0)
            return INVALID("problem->bias: strides %lld, %lld must be >= 0", (long long)p->bias->stride_head,
                           (long long)p->bias->stride_q);
    }
    if (p->algorithm == FA_IO_STANDARD && p->dropout_p > 0.0f)
        return INVALID("problem->dropout_p: standard attention (Algorithm 0) has no dropout step");
    if (p->algorithm == FA_IO_FLASH_QUERY_OUTER && pass == FA_IO_BACKWARD)
        return INVALID("pass: FA_IO_FLASH_QUERY_OUTER models the forward pass only");

    memset(plan, 0, sizeof *plan);
    plan->algorithm = p->algorithm;
    plan->pass = pass;
    plan->nq = p->seqlen_q;
    plan->nk = p->seqlen_k;
    plan->d = p->head_dim;
    plan->heads = p->batch_heads;
    plan->element_bytes = p->element_bytes;
    plan->scale = p->softmax_scale > 0.0f ? p->softmax_scale : 1.0f / sqrtf((float)p->head_dim);
    plan->mask = p->block_mask;
    plan->density = p->block_density;
    plan->tests_mask = p->algorithm == FA_IO_BLOCK_SPARSE || p->block_mask || p->block_density < 1.0;
    plan->dropout = p->dropout_p > 0.0f;
    plan->bias = p->bias;
    plan->bias_bytes = p->bias ? (int64_t)fa_dtype_size(p->bias->dtype) : 0;
    if (p->algorithm != FA_IO_STANDARD) {
        if (p->block_rows > 0) {
            plan->br = p->block_rows;
            plan->bc = p->block_cols;
        } else {
            fa_paper_tiles(p->sram_elements, p->head_dim, &plan->br, &plan->bc);
        }
        plan->tr = ceil_div(plan->nq, plan->br);
        plan->tc = ceil_div(plan->nk, plan->bc);
    }
    return FA_SUCCESS;
}

int64_t fa_io_tile_rows(const fa_io_plan *plan, int64_t i) { return min64(plan->br, plan->nq - i * plan->br); }
int64_t fa_io_tile_cols(const fa_io_plan *plan, int64_t j) { return min64(plan->bc, plan->nk - j * plan->bc); }

int fa_io_tile_set(const fa_io_plan *plan, int64_t i, int64_t j)
{
    const fa_block_mask *m = plan->mask;
    if (!m) return 1;
    const int64_t r0 = i * plan->br / m->block_q, r1 = (i * plan->br + fa_io_tile_rows(plan, i) - 1) / m->block_q;
    const int64_t c0 = j * plan->bc / m->block_k, c1 = (j * plan->bc + fa_io_tile_cols(plan, j) - 1) / m->block_k;
    for (int64_t r = r0; r <= r1; ++r)
        for (int64_t c = c0; c <= c1; ++c)
            if (m->mask[r * m->cols + c]) return 1;
    return 0;
}

int fa_io_element_set(const fa_io_plan *plan, int64_t row, int64_t col)
{
    const fa_block_mask *m = plan->mask;
    return !m || m->mask[(row / m->block_q) * m->cols + col / m->block_k] != 0;
}

int fa_io_counts_total(fa_io_counts *counts, int64_t element_bytes, int64_t bias_bytes)
{
    checked c = {1};
    counts->total_reads = counts->total_writes = 0;
    for (int x = 0; x < FA_IO_OPERAND_COUNT; ++x) {
        counts->total_reads = add(&c, counts->total_reads, counts->reads[x]);
        counts->total_writes = add(&c, counts->total_writes, counts->writes[x]);
    }
    counts->bytes = add(&c, mul(&c, add(&c, counts->total_reads, counts->total_writes), element_bytes),
                        mul(&c, counts->bias_reads, bias_bytes));
    counts->total_reads = add(&c, counts->total_reads, counts->bias_reads);
    return c.ok;
}

/* Elements on chip while tile (rows, cols) is computed; rows == 0 (flash) is the K/V tile alone,
 * cols == 0 (query-outer) the Q-side tile alone. Each object is listed in docs/IO.md. */
static int64_t footprint(const fa_io_plan *p, int64_t rows, int64_t cols)
{
    const int64_t d = p->d, bias = p->bias ? rows * cols : 0; /* the bias tile B_ij, while it is added */
    if (p->algorithm == FA_IO_FLASH_QUERY_OUTER) /* Q_i, O_i, m_i, l_i + K_j, V_j, S_ij (, B_ij) */
        return 2 * rows * d + 2 * rows + (cols ? 2 * cols * d + rows * cols + bias : 0);
    if (p->pass == FA_IO_FORWARD) /* K_j, V_j, Q_i, O_i, S_ij, l_i, m_i, m~, l~, m_new, l_new (, B_ij) */
        return 2 * cols * d + 2 * rows * d + rows * cols + 6 * rows + bias;
    /* K_j, V_j, dK~_j, dV~_j, Q_i, O_i, dO_i, dQ_i, S_ij/P_ij, dP_ij/dS_ij, l_i, m_i, D_i (, B_ij) */
    return 4 * cols * d + 4 * rows * d + 2 * rows * cols + 3 * rows + bias;
}

typedef struct tile_sums { int64_t rows, cols, area, tiles, peak; } tile_sums;

/* R, C, A, T and the on-chip peak of one (batch, head) pair; 0 on overflow. */
static int tile_sums_for(const fa_io_plan *p, tile_sums *s)
{
    checked c = {1};
    s->rows = mul(&c, p->tc, p->nq);
    s->cols = mul(&c, p->tr, p->nk);
    s->area = mul(&c, p->nq, p->nk);
    s->tiles = mul(&c, p->tr, p->tc);
    const int64_t br = min64(p->br, p->nq), bc = min64(p->bc, p->nk);
    const int64_t outer = p->algorithm == FA_IO_FLASH_QUERY_OUTER ? footprint(p, br, 0) : footprint(p, 0, bc);
    /* Bounds on every footprint term, so that footprint() itself cannot overflow. */
    (void)mul(&c, mul(&c, br, bc), 8);
    (void)mul(&c, add(&c, br, bc), mul(&c, p->d, 8));
    if (!c.ok) return 0;
    s->peak = footprint(p, br, bc);
    if (p->mask) {
        s->rows = s->cols = s->area = s->tiles = 0;
        s->peak = outer;
        for (int64_t i = 0; i < p->tr; ++i)
            for (int64_t j = 0; j < p->tc; ++j) {
                if (!fa_io_tile_set(p, i, j)) continue;
                const int64_t rows = fa_io_tile_rows(p, i), cols = fa_io_tile_cols(p, j);
                s->rows += rows;
                s->cols += cols;
                s->area += rows * cols;
                s->tiles += 1;
                s->peak = max64(s->peak, footprint(p, rows, cols));
            }
    } else if (p->density < 1.0) {
        /* Expected value over masks with a fraction s of tiles set (each tile equally likely). */
        s->rows = llround((double)s->rows * p->density);
        s->cols = llround((double)s->cols * p->density);
        s->area = llround((double)s->area * p->density);
        s->tiles = llround((double)s->tiles * p->density);
        if (s->tiles == 0) s->peak = outer;
    }
    return 1;
}

/* Per-head counts of the standard algorithms (Algorithm 0 forward, Algorithm 3 backward). */
static void standard_counts(const fa_io_plan *p, checked *c, fa_io_counts *k)
{
    const int64_t qd = mul(c, p->nq, p->d), kd = mul(c, p->nk, p->d), nn = mul(c, p->nq, p->nk);
    k->sram_peak = add(c, mul(c, p->nk, p->d), add(c, p->nk, p->d)); /* one operand whole + one row of each other */
    if (p->bias && p->pass == FA_IO_FORWARD) k->sram_peak = add(c, k->sram_peak, p->nk); /* + a bias row */
    if (p->pass == FA_IO_FORWARD) {
        k->reads[FA_IO_Q] = qd;           /* line 1: S = Q K^T (+ bias, read once) */
        k->reads[FA_IO_K] = kd;
        if (p->bias) k->bias_reads = nn;
        k->writes[FA_IO_S] = nn;
        k->reads[FA_IO_S] = nn;           /* line 2: P = softmax(S) */
        k->writes[FA_IO_P] = nn;
        k->reads[FA_IO_P] = nn;           /* line 3: O = P V */
        k->reads[FA_IO_V] = kd;
        k->writes[FA_IO_O] = qd;
        k->flops = mul(c, 4, mul(c, nn, p->d));
        k->hbm_extra = mul(c, 2, nn);     /* S and P */
    } else {
        k->reads[FA_IO_P] = mul(c, 2, nn); /* line 1: dV = P^T dO; line 3 */
        k->reads[FA_IO_DO] = mul(c, 2, qd); /* lines 1 and 2 */
        k->writes[FA_IO_DV] = kd;
        k->reads[FA_IO_V] = kd;           /* line 2: dP = dO V^T */
        k->writes[FA_IO_DP] = nn;
        k->reads[FA_IO_DP] = nn;          /* line 3: dS = P o (dP - rowsum(P o dP)) */
        k->writes[FA_IO_DS] = nn;
        k->reads[FA_IO_DS] = mul(c, 2, nn); /* lines 4 and 5 */
        k->reads[FA_IO_K] = kd;           /* line 4: dQ = dS K */
        k->writes[FA_IO_DQ] = qd;
        k->reads[FA_IO_Q] = qd;           /* line 5: dK = dS^T Q */
        k->writes[FA_IO_DK] = kd;
        k->flops = mul(c, 8, mul(c, nn, p->d));
        k->hbm_extra = mul(c, 3, nn);     /* P (from the forward), dP, dS */
    }
}

/* Per-head counts of the tiled algorithms. */
static void tiled_counts(const fa_io_plan *p, const tile_sums *s, checked *c, fa_io_counts *k)
{
    const int64_t qd = mul(c, p->nq, p->d), kd = mul(c, p->nk, p->d), rd = mul(c, s->rows, p->d);
    k->sram_peak = s->peak;
    k->tiles_visited = s->tiles;
    if (p->tests_mask) k->reads[FA_IO_MASK] = mul(c, p->tr, p->tc); /* M_ij tested for every (i, j) */
    if (p->bias) k->bias_reads = s->area; /* the bias tile of every computed (i, j), both passes */
    if (p->algorithm == FA_IO_FLASH_QUERY_OUTER) {
        k->reads[FA_IO_Q] = qd;                        /* Q_i once per i */
        k->reads[FA_IO_K] = mul(c, s->cols, p->d);     /* K_j, V_j per computed (i, j) */
        k->reads[FA_IO_V] = k->reads[FA_IO_K];
        k->writes[FA_IO_O] = qd;                       /* O_i once, normalised */
        k->writes[FA_IO_L] = p->nq;                    /* lse_i = m_i + log l_i */
        k->flops = mul(c, 4, mul(c, s->area, p->d));
        k->hbm_extra = p->nq;
        return;
    }
    k->reads[FA_IO_K] = kd; /* K_j, V_j once per j (Algorithm 5 loads them whatever the mask) */
    k->reads[FA_IO_V] = kd;
    k->reads[FA_IO_Q] = rd; /* per computed (i, j): Q_i, O_i, l_i, m_i */
    k->reads[FA_IO_O] = rd;
    k->reads[FA_IO_L] = s->rows;
    k->reads[FA_IO_M] = s->rows;
    k->hbm_extra = mul(c, 2, p->nq); /* l and m */
    if (p->pass == FA_IO_FORWARD) {
        k->writes[FA_IO_O] = add(c, qd, rd);           /* initialised, then O_i per (i, j) */
        k->writes[FA_IO_L] = add(c, p->nq, s->rows);
        k->writes[FA_IO_M] = add(c, p->nq, s->rows);
        k->flops = mul(c, 4, mul(c, s->area, p->d));   /* S_ij = Q_i K_j^T, P_ij V_j */
    } else {
        k->reads[FA_IO_DO] = rd;                       /* per computed (i, j): dO_i, dQ_i too */
        k->reads[FA_IO_DQ] = rd;
        k->writes[FA_IO_DQ] = add(c, qd, rd);          /* initialised, then dQ_i per (i, j) */
        k->writes[FA_IO_DK] = mul(c, 2, kd);           /* initialised, then dK_j per j */
        k->writes[FA_IO_DV] = mul(c, 2, kd);
        k->flops = mul(c, 10, mul(c, s->area, p->d));  /* S_ij, dV_j, dP_ij, dQ_i, dK_j */
    }
}

fa_status fa_io_problem_read(const fa_io_problem *problem, fa_io_problem *full)
{
    fa_io_problem_init(full);
    /* Every field of 0.2 is required: the smallest layout is the first sized one, which ends
     * before bias (issue 15). */
    return fa_sized_struct_read("problem", problem, offsetof(fa_io_problem, bias), sizeof *full, full);
}

void fa_io_counts_store(const fa_io_problem *caller_problem, fa_io_counts *dst, const fa_io_counts *src)
{
    size_t caller_size;
    memcpy(&caller_size, caller_problem, sizeof caller_size);
    const int knows_bias = caller_size >= offsetof(fa_io_problem, bias) + sizeof caller_problem->bias;
    memcpy(dst, src, knows_bias ? sizeof *dst : offsetof(fa_io_counts, bias_reads));
}

fa_status fa_io_estimate(const fa_io_problem *caller_problem, fa_io_pass pass, fa_io_counts *counts)
{
    fa_io_problem full;
    fa_status st = fa_io_problem_read(caller_problem, &full);
    if (st) return st;
    const fa_io_problem *problem = &full;
    fa_io_plan plan;
    st = fa_io_plan_make(problem, pass, &plan);
    if (st) return st;
    if (!counts) return INVALID("counts: is NULL");
    const char *overflow = "problem: counts overflow 64 bits (seqlen_q x seqlen_k x head_dim x batch_heads too large)";

    fa_io_counts per_head;
    memset(&per_head, 0, sizeof per_head);
    checked c = {1};
    if (plan.algorithm == FA_IO_STANDARD) {
        standard_counts(&plan, &c, &per_head);
    } else {
        tile_sums sums;
        if (!tile_sums_for(&plan, &sums)) return INVALID("%s", overflow);
        tiled_counts(&plan, &sums, &c, &per_head);
    }
    if (!c.ok) return INVALID("%s", overflow);

    fa_io_counts k;
    memset(&k, 0, sizeof k);
    for (int x = 0; x < FA_IO_OPERAND_COUNT; ++x) {
        k.reads[x] = mul(&c, per_head.reads[x], plan.heads);
        k.writes[x] = mul(&c, per_head.writes[x], plan.heads);
    }
    k.flops = mul(&c, per_head.flops, plan.heads);
    k.hbm_extra = mul(&c, per_head.hbm_extra, plan.heads);
    k.tiles_visited = mul(&c, per_head.tiles_visited, plan.heads);
    k.bias_reads = mul(&c, per_head.bias_reads, plan.heads);
    k.sram_peak = per_head.sram_peak; /* heads run one after another */
    k.block_rows = plan.br;
    k.block_cols = plan.bc;
    if (plan.dropout) { /* the RNG state (seed, offset), shared by all heads */
        if (pass == FA_IO_FORWARD) k.writes[FA_IO_RNG] = 2;
        else k.reads[FA_IO_RNG] = 2;
        k.hbm_extra = add(&c, k.hbm_extra, 2);
    }
    if (!c.ok || !fa_io_counts_total(&k, plan.element_bytes, plan.bias_bytes)) return INVALID("%s", overflow);
    fa_io_counts_store(caller_problem, counts, &k);
    return FA_SUCCESS;
}
