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

/* Rotates the first rotary_dim elements of x (f32) to position pos: pairs (x[f], x[f + half]) or,
 * interleaved, (x[2f], x[2f + 1]) by the angle of table entry [pos][f]. */
FA_HD void fa_rotary_apply(const fa_cache_section *c, int64_t pos, float *x)
{
    const int64_t half = c->rotary_dim / 2;
    const float *cos_row = c->rotary_cos + pos * half, *sin_row = c->rotary_sin + pos * half;
    for (int64_t f = 0; f < half; ++f) {
        const int64_t ia = c->rotary_interleaved ? 2 * f : f, ib = c->rotary_interleaved ? 2 * f + 1 : f + half;
        const float a = x[ia], b = x[ib], cs = cos_row[f], sn = sin_row[f];
        x[ia] = a * cs - b * sn;
        x[ib] = b * cs + a * sn;
    }
}
#endif
