/* Rotary position embeddings of the KV-cache calls (fa_rotary in include/flashattn.h): where a new
 * key and a query sit, and the rotation of one row in f32. The one home of both rules: the CPU's
 * append and query loads (and any backend that grows them) call these. */
#ifndef FA_ROTARY_H
#define FA_ROTARY_H
#include <stdint.h>

#include "hostdev.h"
#include "problem_tables.h"

/* Position of new token t of sequence b: its key index, past the left padding. */
FA_HD int64_t fa_rotary_new_position(const fa_cache_section *c, int64_t b, int64_t t)
{
    return c->cache_seqlens[b] - fa_cache_leftpad(c, b) + t;
}

/* Position of query i of sequence b (FlashAttention-2's rule: in order from the first new position
 * when causal or windowed, else all at it). */
FA_HD int64_t fa_rotary_query_position(const fa_cache_section *c, int64_t b, int64_t i)
{
    return c->cache_seqlens[b] - fa_cache_leftpad(c, b) + (c->rotary_queries_in_order ? i : 0);
}

/* The pair of angle f: (x[f], x[f + half]) or, interleaved, (x[2f], x[2f + 1]); and the angle of
 * element x < rotary_dim, and whether x is its pair's first element. */
FA_HD void fa_rotary_pair(const fa_cache_section *c, int64_t f, int64_t *first, int64_t *second)
{
    *first = c->rotary_interleaved ? 2 * f : f;
    *second = c->rotary_interleaved ? 2 * f + 1 : f + c->rotary_dim / 2;
}
FA_HD int64_t fa_rotary_angle_of(const fa_cache_section *c, int64_t x, int *is_first)
{
    const int64_t half = c->rotary_dim / 2;
    *is_first = c->rotary_interleaved ? x % 2 == 0 : x < half;
    return c->rotary_interleaved ? x / 2 : x % half;
}

/* A pair's element `own` (with the pair's other element) rotated by (cs, sn): the first becomes
 * own cs - other sn, the second own cs + other sn. */
FA_HD float fa_rotary_rotate(float own, float other, int is_first, float cs, float sn)
{
    return is_first ? own * cs - other * sn : own * cs + other * sn;
}

/* Rotates the first rotary_dim elements of x (f32) to position pos, each pair by the angle of
 * table entry [pos][f]. */
FA_HD void fa_rotary_apply(const fa_cache_section *c, int64_t pos, float *x)
{
    const int64_t half = c->rotary_dim / 2;
    const float *cos_row = c->rotary_cos + pos * half, *sin_row = c->rotary_sin + pos * half;
    for (int64_t f = 0; f < half; ++f) {
        int64_t ia, ib;
        fa_rotary_pair(c, f, &ia, &ib);
        const float a = x[ia], b = x[ib];
        x[ia] = fa_rotary_rotate(a, b, 1, cos_row[f], sin_row[f]);
        x[ib] = fa_rotary_rotate(b, a, 0, cos_row[f], sin_row[f]);
    }
}
#endif
