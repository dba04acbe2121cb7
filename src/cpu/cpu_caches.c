#include "cpu_caches.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

enum { FALLBACK_L1D = 32 * 1024, FALLBACK_L2 = 512 * 1024 };

/* sysfs: /sys/devices/system/cpu/cpu0/cache/indexN/{level,type,size} ("48K"). */
static int64_t sysfs_cache(int want_level, const char *want_type)
{
    for (int index = 0; index < 8; ++index) {
        char path[96], buf[32];
        int level = 0;
        snprintf(path, sizeof path, "/sys/devices/system/cpu/cpu0/cache/index%d/level", index);
        FILE *f = fopen(path, "r");
        if (!f) break;
        if (fscanf(f, "%d", &level) != 1) level = 0;
        fclose(f);
        snprintf(path, sizeof path, "/sys/devices/system/cpu/cpu0/cache/index%d/type", index);
        f = fopen(path, "r");
        if (!f) continue;
        const int type_ok = fgets(buf, sizeof buf, f) && strncmp(buf, want_type, strlen(want_type)) == 0;
        fclose(f);
        if (level != want_level || !type_ok) continue;
        snprintf(path, sizeof path, "/sys/devices/system/cpu/cpu0/cache/index%d/size", index);
        f = fopen(path, "r");
        if (!f) continue;
        long value = 0;
        char unit = 0;
        const int n = fscanf(f, "%ld%c", &value, &unit);
        fclose(f);
        if (n < 1 || value <= 0) continue;
        if (unit == 'K') value *= 1024;
        else if (unit == 'M') value *= 1024 * 1024;
        return value;
    }
    return 0;
}

static int64_t sysconf_cache(int name)
{
    const long v = sysconf(name);
    return v > 0 ? v : 0;
}

fa_cpu_caches fa_cpu_detect_caches(void)
{
    fa_cpu_caches c = {0, 0, 1};
#ifdef _SC_LEVEL1_DCACHE_SIZE
    c.l1d_bytes = sysconf_cache(_SC_LEVEL1_DCACHE_SIZE);
    c.l2_bytes = sysconf_cache(_SC_LEVEL2_CACHE_SIZE);
#endif
    if (c.l1d_bytes <= 0) c.l1d_bytes = sysfs_cache(1, "Data");
    if (c.l2_bytes <= 0) c.l2_bytes = sysfs_cache(2, "Unified");
    if (c.l1d_bytes <= 0) { c.l1d_bytes = FALLBACK_L1D; c.detected = 0; }
    if (c.l2_bytes <= 0) { c.l2_bytes = FALLBACK_L2; c.detected = 0; }
    return c;
}
