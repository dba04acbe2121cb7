/* Data cache sizes of this CPU, the "SRAM" of the CPU backend's tiling. */
#ifndef FA_CPU_CACHES_H
#define FA_CPU_CACHES_H
#include <stdint.h>

typedef struct fa_cpu_caches {
    int64_t l1d_bytes, l2_bytes; /* per core */
    int detected;                /* 0 when the fallback sizes are in use */
} fa_cpu_caches;

fa_cpu_caches fa_cpu_detect_caches(void);
#endif
