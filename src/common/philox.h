/* Philox4x32-10 (Salmon, Moraes, Dror, Shaw: "Parallel random numbers: as easy as 1, 2, 3", SC'11)
 * and the dropout stream built on it. Shared verbatim by the CPU, CUDA and HIP backends so that
 * every backend drops exactly the same elements for the same (seed, offset).
 *
 * Stream: element e = ((b * heads_q + h) * seqlen_q + i) * seqlen_k + j of the attention matrix
 * (fa_dropout_element: for a block of a larger problem, its global row and column in the global
 * rows x cols grid) uses word (e & 3) of philox(counter = {lo(e>>2), hi(e>>2), lo(offset), hi(offset)},
 * key = {lo(seed), hi(seed)}); u = (word >> 8) * 2^-24; the element is dropped iff u < p. */
#ifndef FA_PHILOX_H
#define FA_PHILOX_H
#include <stdint.h>
#include "hostdev.h"

typedef struct fa_philox4x32 { uint32_t v[4]; } fa_philox4x32;

FA_HD uint32_t fa_mulhilo32(uint32_t a, uint32_t b, uint32_t *hi)
{
    const uint64_t product = (uint64_t)a * (uint64_t)b;
    *hi = (uint32_t)(product >> 32);
    return (uint32_t)product;
}

FA_HD fa_philox4x32 fa_philox4x32_10(fa_philox4x32 ctr, uint32_t key0, uint32_t key1)
{
    for (int round = 0; round < 10; ++round) {
        uint32_t hi0, hi1;
        const uint32_t lo0 = fa_mulhilo32(0xD2511F53u, ctr.v[0], &hi0);
        const uint32_t lo1 = fa_mulhilo32(0xCD9E8D57u, ctr.v[2], &hi1);
        fa_philox4x32 next;
        next.v[0] = hi1 ^ ctr.v[1] ^ key0;
        next.v[1] = lo1;
        next.v[2] = hi0 ^ ctr.v[3] ^ key1;
        next.v[3] = lo0;
        ctr = next;
        key0 += 0x9E3779B9u; /* golden ratio */
        key1 += 0xBB67AE85u; /* sqrt(3) - 1 */
    }
    return ctr;
}

/* The four consecutive dropout words of group g = e >> 2. */
FA_HD fa_philox4x32 fa_dropout_words(uint64_t seed, uint64_t offset, uint64_t group)
{
    fa_philox4x32 ctr;
    ctr.v[0] = (uint32_t)group;
    ctr.v[1] = (uint32_t)(group >> 32);
    ctr.v[2] = (uint32_t)offset;
    ctr.v[3] = (uint32_t)(offset >> 32);
    return fa_philox4x32_10(ctr, (uint32_t)seed, (uint32_t)(seed >> 32));
}

/* Uniform in [0, 1) with 24 bits, exactly representable in float. */
FA_HD float fa_dropout_uniform(uint32_t word) { return (float)(word >> 8) * (1.0f / 16777216.0f); }

/* The stream's element of row `row`, column `col` of head h of batch entry b in a grid of rows x
 * cols per (b, h): the one formula of every backend. A block of a larger problem (desc->q_offset,
 * k_offset) passes its global row and column and the global extents. */
FA_HD uint64_t fa_dropout_element(uint64_t b, uint64_t heads_q, uint64_t h, uint64_t rows, uint64_t row, uint64_t cols,
                                  uint64_t col)
{
    return ((b * heads_q + h) * rows + row) * cols + col;
}

FA_HD int fa_dropout_keep(uint64_t seed, uint64_t offset, uint64_t element, float p)
{
    const fa_philox4x32 w = fa_dropout_words(seed, offset, element >> 2);
    return !(fa_dropout_uniform(w.v[element & 3u]) < p);
}
#endif
