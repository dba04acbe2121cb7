/* Runtime kernel selection: newest ISA the CPU supports, or the one FLASHATTN_CPU_ISA forces. */
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "../../common/error.h"
#include "kernels.h"

typedef struct isa_entry {
    const char *name;
    const fa_cpu_kernels *kernels; /* NULL when not built for this target */
    int (*supported)(void);
    const fa_cpu_kernels *extended; /* the same with an extension's kernels (NULL: none built) */
    int (*extension)(void);         /* whether the CPU has that extension (checkasm tests it there) */
    int (*extension_pays)(void);    /* whether contexts use it by default: faster on this CPU */
} isa_entry;

static int always(void) { return 1; }

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <cpuid.h>
#include <stdint.h>

/* XCR0: which register states the OS saves on a context switch (needs OSXSAVE). */
static uint64_t os_saved_states(void)
{
    uint32_t eax, edx;
    __asm__ volatile("xgetbv" : "=a"(eax), "=d"(edx) : "c"(0));
    return ((uint64_t)edx << 32) | eax;
}

enum { XCR0_AVX = 0x6 /* SSE + AVX */, XCR0_AVX512 = 0xe6 /* + opmask, ZMM0-15 upper, ZMM16-31 */ };

/* cpuid directly rather than __builtin_cpu_supports: clang 14 lacks the "f16c" feature name. */
static int cpu_has_avx2(void)
{
    unsigned a, b, c, d;
    if (!__get_cpuid(1, &a, &b, &c, &d)) return 0;
    const unsigned need = bit_AVX | bit_FMA | bit_F16C | bit_OSXSAVE;
    if ((c & need) != need || (os_saved_states() & XCR0_AVX) != XCR0_AVX) return 0;
    if (!__get_cpuid_count(7, 0, &a, &b, &c, &d)) return 0;
    return (b & bit_AVX2) != 0;
}
static int cpu_has_avx512(void)
{
    unsigned a, b, c, d;
    if (!cpu_has_avx2() || !__get_cpuid_count(7, 0, &a, &b, &c, &d)) return 0;
    return (b & bit_AVX512F) != 0 && (os_saved_states() & XCR0_AVX512) == XCR0_AVX512;
}
#ifdef FA_HAVE_AVX512BF16
/* vdpbf16ps: cpuid leaf 7 subleaf 1, EAX bit 5 (AVX512_BF16). */
static int cpu_has_avx512_bf16(void)
{
    unsigned a, b, c, d;
    if (!cpu_has_avx512() || !__get_cpuid_count(7, 0, &a, &b, &c, &d) || a < 1) return 0;
    if (!__get_cpuid_count(7, 1, &a, &b, &c, &d)) return 0;
    return (a & (1u << 5)) != 0;
}
#endif
#else
static int cpu_has_avx2(void) { return 0; }
static int cpu_has_avx512(void) { return 0; }
#endif

#if defined(FA_HAVE_AVX512) && defined(FA_HAVE_AVX512BF16)
/* kernels.h pins gemm_max_bf16 to the rounding Zen 4's vdpbf16ps was measured to do (odd element
 * first, FTZ after rounding). A CPU whose instruction rounds otherwise would break that promise,
 * so the kernel is handed out only where one register tile of varied inputs (every step rounds)
 * and the FTZ threshold come out bit for bit as the twin's; elsewhere bf16 keeps the f32 product. */
static int bf16_kernel_matches_twin(void)
{
    enum { M = 12, N = 32, K = 34, PAIRS = K / 2 };
    uint16_t a[M * K];
    uint32_t b[PAIRS * N];
    float want[M * N], got[M * N];
    uint32_t rng = 2463534242u;
    for (int x = 0; x < M * K + 2 * PAIRS * N; ++x) {
        rng ^= rng << 13, rng ^= rng >> 17, rng ^= rng << 5;
        /* sign and 7 mantissa bits at random, exponents 2^-24 .. 2^7: sums of mixed magnitudes */
        const uint16_t v = (uint16_t)((rng & 0x807f) | ((103 + (rng >> 8) % 32) << 7));
        if (x < M * K) a[x] = v;
        else if ((x - M * K) % 2 == 0) b[(x - M * K) / 2] = v;
        else b[(x - M * K) / 2] |= (uint32_t)v << 16;
    }
    fa_cpu_ref_gemm_max_bf16(M, N, K, a, K, b, N, want, N, NULL);
    fa_avx512bf16_gemm_max_bf16(M, N, K, a, K, b, N, got, N, NULL);
    if (memcmp(want, got, sizeof want) != 0) return 0;
    /* 2^-126 - 2^-150 flushes to 0, 2^-126 - 2^-151 rounds to 2^-126 (tininess after rounding) */
    const uint16_t row[4] = {0, 0x3f80, 0, 0x8d80};
    const uint32_t pairs[4] = {0x0080u << 16, 0x0080u << 16, (uint32_t)(127 - 50) << 23, (uint32_t)(127 - 51) << 23};
    float edge[2];
    fa_avx512bf16_gemm_max_bf16(1, 2, 4, row, 4, pairs, 2, edge, 2, NULL);
    return edge[0] == 0.0f && edge[1] == 0x1p-126f;
}

/* vdpbf16ps does 32 products per instruction against vfmadd231ps' 16, but its rate differs by
 * vendor. On AMD's Zen 4 it issues like an FMA: bf16 forwards took 0.72-0.83 of the f32 time
 * (bench/results/cpu-f16-bf16-2026-11-24-s9.md). Intel's cores issue one every two cycles against
 * two f32 FMAs per cycle (an Emerald Rapids: 86 against 175 GFLOP/s per core, register-only
 * chains), so there S^T on bf16 pairs costs twice the f32 product (bf16 forwards at 1.25-1.50x
 * the f32 time) and bf16 takes the f32 product on widened tiles. The choice reads the vendor,
 * never a timing: a process always gets the same kernels, hence the same bits. */
static int cpu_is_amd(void)
{
    unsigned a, b, c, d;
    if (!__get_cpuid(0, &a, &b, &c, &d)) return 0;
    return b == 0x68747541u && d == 0x69746e65u && c == 0x444d4163u; /* "AuthenticAMD" */
}

/* Probed once per process: every context creation and checkasm's lookups by name select kernels.
 * The probe's answer never changes, so threads racing to the first selection at worst run it twice. */
static int bf16_kernel_usable(void)
{
    static atomic_int answer; /* 0 not probed yet, 1 usable, 2 not */
    int known = atomic_load_explicit(&answer, memory_order_relaxed);
    if (!known) {
        known = cpu_has_avx512_bf16() && bf16_kernel_matches_twin() ? 1 : 2;
        atomic_store_explicit(&answer, known, memory_order_relaxed);
    }
    return known == 1;
}
#endif

/* Newest first, the reference last. Every ISA name is listed on every target so that forcing one
 * that is not built here gives "not supported" rather than "unknown". */
static const isa_entry isas[] = {
#if defined(FA_HAVE_AVX512) && defined(FA_HAVE_AVX512BF16)
    {"avx512", &fa_cpu_kernels_avx512, cpu_has_avx512, &fa_cpu_kernels_avx512_bf16, bf16_kernel_usable, cpu_is_amd},
#elif defined(FA_HAVE_AVX512)
    {"avx512", &fa_cpu_kernels_avx512, cpu_has_avx512, NULL, NULL, NULL},
#else
    {"avx512", NULL, cpu_has_avx512, NULL, NULL, NULL},
#endif
#ifdef FA_HAVE_AVX2
    {"avx2", &fa_cpu_kernels_avx2, cpu_has_avx2, NULL, NULL, NULL},
#else
    {"avx2", NULL, cpu_has_avx2, NULL, NULL, NULL},
#endif
#ifdef FA_HAVE_NEON
    {"neon", &fa_cpu_kernels_neon, always, NULL, NULL, NULL}, /* NEON is mandatory on aarch64 */
#else
    {"neon", NULL, always, NULL, NULL, NULL},
#endif
    {"ref", &fa_cpu_kernels_ref, always, NULL, NULL, NULL},
};
enum { isa_count = sizeof isas / sizeof isas[0] };
_Static_assert((int)isa_count == (int)FA_CPU_ISA_COUNT, "FA_CPU_ISA_COUNT is the length of isas[]");

/* The entry's kernels for this CPU: with its extension's kernels where the CPU has them (checkasm
 * tests every kernel the CPU can run). */
static const fa_cpu_kernels *kernels_for_cpu(const isa_entry *e)
{
    return e->extended && e->extension() ? e->extended : e->kernels;
}

/* The kernels a context uses: the extension's only where it pays on this CPU, unless
 * FLASHATTN_CPU_BF16_DOT says otherwise (1: wherever the CPU has it, 0: never; the only extension
 * is AVX512_BF16's gemm_max_bf16). */
static fa_status kernels_for_contexts(const isa_entry *e, const fa_cpu_kernels **kernels)
{
    const char *dot = getenv("FLASHATTN_CPU_BF16_DOT");
    int use = e->extension_pays && e->extension_pays();
    if (dot && dot[0]) {
        if (strcmp(dot, "0") != 0 && strcmp(dot, "1") != 0)
            return fa_set_error(FA_ERROR_INVALID_VALUE, "FLASHATTN_CPU_BF16_DOT: '%s' is not 0 or 1", dot);
        use = dot[0] == '1';
    }
    *kernels = use && e->extended && e->extension() ? e->extended : e->kernels;
    return FA_SUCCESS;
}

const char *fa_cpu_isa_name(int index) { return index >= 0 && index < isa_count ? isas[index].name : NULL; }

const fa_cpu_kernels *fa_cpu_kernels_by_name(const char *isa)
{
    for (size_t i = 0; i < isa_count; ++i)
        if (strcmp(isa, isas[i].name) == 0) return isas[i].kernels && isas[i].supported() ? kernels_for_cpu(&isas[i]) : NULL;
    return NULL;
}

fa_status fa_cpu_select_kernels(const fa_cpu_kernels **kernels)
{
    const char *forced = getenv("FLASHATTN_CPU_ISA");
    *kernels = NULL;
    if (forced && forced[0]) {
        for (size_t i = 0; i < isa_count; ++i) {
            if (strcmp(forced, isas[i].name) != 0) continue;
            if (!isas[i].kernels)
                return fa_set_error(FA_ERROR_NOT_SUPPORTED, "FLASHATTN_CPU_ISA: '%s' is not built into this library",
                                    forced);
            if (!isas[i].supported())
                return fa_set_error(FA_ERROR_NOT_SUPPORTED, "FLASHATTN_CPU_ISA: '%s' is not supported by this CPU",
                                    forced);
            return kernels_for_contexts(&isas[i], kernels);
        }
        char known[64] = "";
        for (size_t i = 0; i < isa_count; ++i) {
            strcat(known, isas[i].name);
            if (i + 1 < isa_count) strcat(known, i + 2 < isa_count ? ", " : " or ");
        }
        return fa_set_error(FA_ERROR_INVALID_VALUE, "FLASHATTN_CPU_ISA: unknown ISA '%s' (use %s)", forced, known);
    }
    for (size_t i = 0; i < isa_count; ++i)
        if (isas[i].kernels && isas[i].supported()) return kernels_for_contexts(&isas[i], kernels);
    return FA_SUCCESS;
}
