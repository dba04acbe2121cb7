/* CPU emulation of AMD CDNA MFMA instructions as the ISA manual states them, shared by the layout
 * tests (test_mfma_layout.c, test_tc_layout.c). Written from the manual, independently of the
 * layouts under test (src/gpu/kernels/mma_layout.h, src/gpu/kernels/tc_layout.h). */
#ifndef FA_TEST_MMA_EMULATION_H
#define FA_TEST_MMA_EMULATION_H
#include <string.h>

#define MAX_LANES 64
#define MAX_ITEMS 16

typedef struct lane_regs { float a[MAX_LANES][MAX_ITEMS], b[MAX_LANES][MAX_ITEMS], c[MAX_LANES][MAX_ITEMS]; } lane_regs;

/* AMD CDNA ISA, "Matrix fused multiply-add": for v_mfma_f32_{M}x{N}x{K} (one block, wave64) lane
 * l supplies A row (l mod M) and B column (l mod N); its register elements are K/(64/M)
 * consecutive k values starting at (l div M) * K/(64/M). D element (i, j) is in lane
 * j + N * ((i div 4) mod (64/N)), register 4 * (i div (4 * 64/N)) + (i mod 4). */
static void emulate_mfma(int m, int n, int k, lane_regs *r)
{
    const int ka = k / (64 / m);
    float d[32][32];
    memset(d, 0, sizeof d);
    for (int i = 0; i < m; ++i)
        for (int j = 0; j < n; ++j) {
            const int lane = j + n * ((i / 4) % (64 / n)), reg = 4 * (i / (4 * (64 / n))) + i % 4;
            d[i][j] = r->c[lane][reg];
        }
    for (int i = 0; i < m; ++i)
        for (int j = 0; j < n; ++j)
            for (int kk = 0; kk < k; ++kk) {
                /* the lane holding A[i][kk] and the lane holding B[kk][j] */
                const int la = i + m * (kk / ka), lb = j + n * (kk / ka);
                d[i][j] += r->a[la][kk % ka] * r->b[lb][kk % ka];
            }
    for (int i = 0; i < m; ++i)
        for (int j = 0; j < n; ++j) {
            const int lane = j + n * ((i / 4) % (64 / n)), reg = 4 * (i / (4 * (64 / n))) + i % 4;
            r->c[lane][reg] = d[i][j];
        }
}
#endif
