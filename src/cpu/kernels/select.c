/* Runtime kernel selection: newest ISA the CPU supports, or the one FLASHATTN_CPU_ISA forces. */
#include <stdlib.h>
#include <string.h>

#include "../../common/error.h"
#include "kernels.h"

typedef struct isa_entry {
    const char *name;
    const fa_cpu_kernels *kernels; /* NULL when not built for this target */
    int (*supported)(void);
} isa_entry;

static int always(void) { return 1; }

/* Newest first, the reference last. ISA kernels register here as they are added. */
static const isa_entry isas[] = {
    {"ref", &fa_cpu_kernels_ref, always},
};

const fa_cpu_kernels *fa_cpu_select_kernels(void)
{
    const size_t count = sizeof isas / sizeof isas[0];
    const char *forced = getenv("FLASHATTN_CPU_ISA");
    if (forced && forced[0]) {
        for (size_t i = 0; i < count; ++i) {
            if (strcmp(forced, isas[i].name) != 0) continue;
            if (isas[i].kernels && isas[i].supported()) return isas[i].kernels;
            fa_set_error(FA_ERROR_NOT_SUPPORTED, "FLASHATTN_CPU_ISA: '%s' is not supported by this CPU or build", forced);
            return NULL;
        }
        fa_set_error(FA_ERROR_INVALID_VALUE, "FLASHATTN_CPU_ISA: unknown ISA '%s'", forced);
        return NULL;
    }
    for (size_t i = 0; i < count; ++i)
        if (isas[i].kernels && isas[i].supported()) return isas[i].kernels;
    return &fa_cpu_kernels_ref;
}
