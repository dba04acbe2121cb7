/* The SIMT emulator's scheduler and instruction models (contract in emu_core.h). */
#undef _FORTIFY_SOURCE /* its longjmp check rejects jumps between fiber stacks */
#include "emu_core.h"

#include <setjmp.h>
#include <sys/mman.h>
#include <ucontext.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <vector>

#include "emu_half.h"

#if defined(__SANITIZE_ADDRESS__)
#  define EMU_ASAN 1
#elif defined(__has_feature)
#  if __has_feature(address_sanitizer)
#    define EMU_ASAN 1
#  endif
#endif
#if defined(EMU_ASAN)
#  include <sanitizer/common_interface_defs.h>
#endif

namespace emu {
namespace {

/* Switching between fibers. Under ASan, libc's longjmp is intercepted: every jump clears the
 * shadow of the stack below it and asks the kernel for the signal stack (sigaltstack), which was
 * most of an emulated run's time. The compiler's own setjmp/longjmp (frame and stack pointers and
 * a resume address, no libc) do neither, and the functions that switch (EMU_SWITCHES) are left
 * uninstrumented, since ASan otherwise does the same clearing before any call it sees cannot
 * return (gcc finds that jump cannot). The switches are still announced to ASan through its fiber
 * calls (start_switch, finish_switch). The frames a jump leaves are live and return normally
 * later, except fiber_main's when a launch ends, which is not instrumented. */
#if defined(EMU_ASAN)
typedef void *switch_point[5];
#  define EMU_SAVE(point) __builtin_setjmp(point)
#  define EMU_SWITCHES __attribute__((noinline, no_sanitize_address))
EMU_SWITCHES void jump(switch_point &point) { __builtin_longjmp(point, 1); }
#else
typedef jmp_buf switch_point;
#  define EMU_SAVE(point) _setjmp(point)
#  define EMU_SWITCHES __attribute__((noinline))
[[noreturn]] inline void jump(switch_point &point) { _longjmp(point, 1); }
#endif

enum class state : uint8_t { runnable, at_barrier, at_collective, done };
enum class op : uint8_t { sync_warp, shuffle_xor, shuffle_index, ldmatrix, ldmatrix_trans, mma_f16, mma_bf16, mfma_f16 };

const char *op_name(op o)
{
    switch (o) {
    case op::sync_warp: return "__syncwarp";
    case op::shuffle_xor: return "shuffle (xor)";
    case op::shuffle_index: return "shuffle (index)";
    case op::ldmatrix: return "ldmatrix";
    case op::ldmatrix_trans: return "ldmatrix.trans";
    case op::mma_f16: return "mma.sync f16";
    case op::mma_bf16: return "mma.sync bf16";
    case op::mfma_f16: return "v_mfma_f32_16x16x16f16";
    }
    return "?";
}

struct pending_copy {
    void *dst;
    const void *src;
    bool valid;
};

/* One GPU thread. The collective's operands travel in reg/acc/ptr and results come back there. */
struct fiber {
    switch_point resume;
    ucontext_t start;
    bool started;
    state st;
    op collective;
    int width, arg;
    float value;
    uint32_t reg[8];
    float acc[4];
    const void *ptr;
    dim tid;
    std::vector<pending_copy> issued;    /* since the last commit: no group yet */
    std::vector<pending_copy> committed; /* the committed groups' copies, oldest first */
    std::vector<size_t> group_sizes;     /* copies per committed group, oldest first */
    char *stack;
    size_t stack_size;
    void *fake_stack; /* ASan's bookkeeping of this fiber's stack while it is switched out */
};

enum class order { forward, reverse, random };

struct grid_run {
    launch cfg;
    dim block;
    char *smem;
    std::vector<fiber> fibers;
    int current;
    bool terminating;
    switch_point scheduler;
    const void *scheduler_stack;
    size_t scheduler_stack_size;
    void *scheduler_fake_stack;
};

thread_local grid_run *tls_run;

#if defined(EMU_ASAN)
constexpr size_t kStackBytes = 1u << 20; /* ASan's redzones make frames several times larger */
#else
constexpr size_t kStackBytes = 256u << 10;
#endif

/* Stacks outlive launches (one pool per host thread), each with a guard page below it. */
thread_local std::vector<char *> tls_stacks;

char *stack_at(size_t index)
{
    const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
    while (tls_stacks.size() <= index) {
        void *m = mmap(nullptr, kStackBytes + page, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (m == MAP_FAILED) fault("cannot map a fiber stack");
        if (mprotect(m, page, PROT_NONE) != 0) fault("cannot protect a fiber stack's guard page");
        tls_stacks.push_back(static_cast<char *>(m) + page);
    }
    return tls_stacks[index];
}

order schedule_order(unsigned *seed)
{
    const char *s = getenv("FLASHATTN_EMU_SCHEDULE");
    *seed = 1;
    if (!s || !*s) return order::random;
    if (strcmp(s, "forward") == 0) return order::forward;
    if (strcmp(s, "reverse") == 0) return order::reverse;
    if (strncmp(s, "random", 6) == 0) {
        if (s[6] == ':') *seed = static_cast<unsigned>(strtoul(s + 7, nullptr, 10));
        return order::random;
    }
    fprintf(stderr, "flashattn SIMT emulator: FLASHATTN_EMU_SCHEDULE=\"%s\" is not forward, reverse or random[:seed]\n", s);
    abort();
}

inline void start_switch(void **save, const void *bottom, size_t size)
{
#if defined(EMU_ASAN)
    __sanitizer_start_switch_fiber(save, bottom, size);
#else
    (void)save; (void)bottom; (void)size;
#endif
}

inline void finish_switch(void *save, const void **old_bottom, size_t *old_size)
{
#if defined(EMU_ASAN)
    __sanitizer_finish_switch_fiber(save, old_bottom, old_size);
#else
    (void)save; (void)old_bottom; (void)old_size;
#endif
}

fiber &self()
{
    grid_run *r = tls_run;
    if (!r || r->current < 0) fault("a device function was called outside a kernel launch");
    return r->fibers[static_cast<size_t>(r->current)];
}

/* Back to the scheduler; returns when the scheduler resumes this fiber. */
EMU_SWITCHES void yield(fiber &f)
{
    grid_run *r = tls_run;
    start_switch(&f.fake_stack, r->scheduler_stack, r->scheduler_stack_size);
    if (!EMU_SAVE(f.resume)) jump(r->scheduler);
    finish_switch(f.fake_stack, &r->scheduler_stack, &r->scheduler_stack_size);
}

/* Lands the first `count` copies in order (the source is read now) and forgets them. */
void perform(std::vector<pending_copy> &copies, size_t count)
{
    for (size_t i = 0; i < count; ++i) {
        const pending_copy &c = copies[i];
        if (c.valid) memcpy(c.dst, c.src, 16);
        else memset(c.dst, 0, 16);
    }
    copies.erase(copies.begin(), copies.begin() + static_cast<std::ptrdiff_t>(count));
}

void perform(std::vector<pending_copy> &copies) { perform(copies, copies.size()); }

EMU_SWITCHES void fiber_main()
{
    grid_run *r = tls_run;
    finish_switch(nullptr, &r->scheduler_stack, &r->scheduler_stack_size);
    for (;;) {
        r = tls_run;
        if (r->terminating) break;
        r->cfg.entry(r->cfg.kernel, r->cfg.params);
        fiber &f = self();
        /* copies never waited for still land before the kernel is over */
        perform(f.committed);
        f.group_sizes.clear();
        perform(f.issued);
        f.st = state::done;
        yield(f);
    }
    r = tls_run;
    start_switch(nullptr, r->scheduler_stack, r->scheduler_stack_size);
    jump(r->scheduler);
}

/* The context a fiber starts from (fiber_main on its own stack). Not inlined: getcontext
 * "returns twice" as far as the compiler knows, which would pin the caller's locals. */
__attribute__((noinline)) void prepare_start(fiber &f)
{
    getcontext(&f.start);
    f.start.uc_stack.ss_sp = f.stack;
    f.start.uc_stack.ss_size = f.stack_size;
    f.start.uc_link = nullptr;
    makecontext(&f.start, fiber_main, 0);
}

/* Not inlined: the EMU_SAVE below must not share a frame with the caller's loop variables. */
EMU_SWITCHES void enter(grid_run &r, int index)
{
    fiber &f = r.fibers[static_cast<size_t>(index)];
    r.current = index;
    start_switch(&r.scheduler_fake_stack, f.stack, f.stack_size);
    if (!EMU_SAVE(r.scheduler)) {
        if (!f.started) {
            f.started = true;
            setcontext(&f.start);
        }
        jump(f.resume);
    }
    finish_switch(r.scheduler_fake_stack, nullptr, nullptr);
    r.current = -1;
}

/* ---- collectives ------------------------------------------------------------------------------ */

const uint16_t *ldmatrix_row(const grid_run &r, const fiber &lane)
{
    const char *p = static_cast<const char *>(lane.ptr);
    if (p < r.smem || p + 16 > r.smem + r.cfg.smem_bytes)
        fault("ldmatrix: a row address is outside the %zu bytes of dynamic shared memory", r.cfg.smem_bytes);
    if (reinterpret_cast<uintptr_t>(p) % 16 != 0) fault("ldmatrix: a row address is not 16-byte aligned");
    return reinterpret_cast<const uint16_t *>(p);
}

/* ldmatrix.sync.aligned.m8n8.x4[.trans].shared.b16 (PTX ISA): lanes 8i..8i+7 give the addresses
 * of rows 0..7 of matrix i (8 b16 each). Without .trans, register i of lane l holds elements
 * (l/4, 2(l%4)) (low half) and (l/4, 2(l%4)+1) (high half) of matrix i; with .trans the matrix
 * is read transposed: elements (2(l%4), l/4) and (2(l%4)+1, l/4). */
void resolve_ldmatrix(grid_run &r, fiber *lanes, bool trans)
{
    uint32_t out[32][4];
    for (int l = 0; l < 32; ++l)
        for (int m = 0; m < 4; ++m) {
            uint16_t lo, hi;
            if (!trans) {
                const uint16_t *row = ldmatrix_row(r, lanes[8 * m + l / 4]);
                lo = row[2 * (l % 4)];
                hi = row[2 * (l % 4) + 1];
            } else {
                lo = ldmatrix_row(r, lanes[8 * m + 2 * (l % 4)])[l / 4];
                hi = ldmatrix_row(r, lanes[8 * m + 2 * (l % 4) + 1])[l / 4];
            }
            out[l][m] = static_cast<uint32_t>(lo) | static_cast<uint32_t>(hi) << 16;
        }
    for (int l = 0; l < 32; ++l)
        for (int m = 0; m < 4; ++m) lanes[l].reg[m] = out[l][m];
}

float half_value(bool bf16, uint32_t reg, int half)
{
    const uint16_t bits = static_cast<uint16_t>(reg >> (16 * half));
    return bf16 ? float_from_bf16_bits(bits) : float_from_f16_bits(bits);
}

/* d = c + sum_k a_k b_k with exact products, summed in double and rounded once to f32: the most
 * accurate result; hardware sums in its own order and precision, within the harness tolerance. */
float dot_accumulate(float c, const float *a, const float *b, int n)
{
    double sum = c;
    for (int k = 0; k < n; ++k) sum += static_cast<double>(a[k]) * b[k];
    return static_cast<float>(sum);
}

/* mma.sync.aligned.m16n8k16.row.col.f32.{f16,bf16}.{f16,bf16}.f32 (PTX ISA), g = lane / 4,
 * t = lane % 4. A (16 x 16): reg 0 = (g, 2t..2t+1), reg 1 = (g+8, 2t..), reg 2 = (g, 2t+8..),
 * reg 3 = (g+8, 2t+8..), lower column in the low half. B (16 x 8): reg 0 = (k 2t..2t+1, n g),
 * reg 1 = (k 2t+8.., n g). C, D (16 x 8 f32): c0, c1 = (g, 2t..2t+1), c2, c3 = (g+8, 2t..). */
void resolve_mma(fiber *lanes, bool bf16)
{
    float a[16][16], b[16][8], c[16][8];
    for (int l = 0; l < 32; ++l) {
        const int g = l / 4, t = l % 4;
        const fiber &f = lanes[l];
        for (int h = 0; h < 2; ++h) {
            a[g][2 * t + h] = half_value(bf16, f.reg[0], h);
            a[g + 8][2 * t + h] = half_value(bf16, f.reg[1], h);
            a[g][2 * t + 8 + h] = half_value(bf16, f.reg[2], h);
            a[g + 8][2 * t + 8 + h] = half_value(bf16, f.reg[3], h);
            b[2 * t + h][g] = half_value(bf16, f.reg[4], h);
            b[2 * t + 8 + h][g] = half_value(bf16, f.reg[5], h);
            c[g][2 * t + h] = f.acc[h];
            c[g + 8][2 * t + h] = f.acc[2 + h];
        }
    }
    for (int l = 0; l < 32; ++l) {
        const int g = l / 4, t = l % 4;
        for (int item = 0; item < 4; ++item) {
            const int row = g + 8 * (item / 2), col = 2 * t + item % 2;
            float bcol[16];
            for (int k = 0; k < 16; ++k) bcol[k] = b[k][col];
            lanes[l].acc[item] = dot_accumulate(c[row][col], a[row], bcol, 16);
        }
    }
}

/* v_mfma_f32_16x16x16f16 (AMD CDNA3 ISA, "matrix fused multiply add" layouts), 64 lanes,
 * j = lane % 16, q = lane / 16: A (16 x 16) item i of lane = A[j][4q + i]; B (16 x 16) item i =
 * B[4q + i][j]; C, D (16 x 16 f32) item i = D[4q + i][j]. */
void resolve_mfma(fiber *lanes)
{
    float a[16][16], b[16][16], c[16][16];
    for (int l = 0; l < 64; ++l) {
        const int j = l % 16, q = l / 16;
        for (int i = 0; i < 4; ++i) {
            a[j][4 * q + i] = float_from_f16_bits(static_cast<uint16_t>(lanes[l].reg[i]));
            b[4 * q + i][j] = float_from_f16_bits(static_cast<uint16_t>(lanes[l].reg[4 + i]));
            c[4 * q + i][j] = lanes[l].acc[i];
        }
    }
    for (int l = 0; l < 64; ++l) {
        const int j = l % 16, q = l / 16;
        for (int i = 0; i < 4; ++i) {
            float bcol[16];
            for (int k = 0; k < 16; ++k) bcol[k] = b[k][j];
            lanes[l].acc[i] = dot_accumulate(c[4 * q + i][j], a[4 * q + i], bcol, 16);
        }
    }
}

/* __shfl_xor_sync / __shfl_sync (CUDA) and __shfl_xor / __shfl (HIP) with a width: lanes form
 * segments of `width`; an index names a lane of the caller's segment; an xor partner in a later
 * segment (or past the warp) gives the caller its own value. */
void resolve_shuffle(fiber *lanes, int n)
{
    float in[64];
    for (int l = 0; l < n; ++l) in[l] = lanes[l].value;
    for (int l = 0; l < n; ++l) {
        fiber &f = lanes[l];
        const int width = f.width, base = l / width * width;
        int src = f.collective == op::shuffle_xor ? (l ^ f.arg) : base + ((f.arg % width) + width) % width;
        if (src >= base + width || src >= n) src = l;
        f.value = in[src];
    }
}

void describe_warp(const fiber *lanes, int n, int warp, char *text, size_t size)
{
    int used = snprintf(text, size, "warp %d:", warp);
    for (int l = 0; l < n && used < static_cast<int>(size); ++l) {
        const fiber &f = lanes[l];
        const char *where = f.st == state::done ? "exited" : f.st == state::at_barrier ? "__syncthreads" : op_name(f.collective);
        used += snprintf(text + used, size - static_cast<size_t>(used), " %d:%s", l, where);
    }
}

/* Resolves every warp whose lanes all wait at the same collective; true if any was. */
bool resolve_collectives(grid_run &r)
{
    const int n = static_cast<int>(r.fibers.size()), ws = r.cfg.warp_size;
    bool any = false;
    for (int w0 = 0; w0 < n; w0 += ws) {
        fiber *lanes = &r.fibers[static_cast<size_t>(w0)];
        const int count = std::min(ws, n - w0);
        int waiting = 0;
        for (int l = 0; l < count; ++l) waiting += lanes[l].st == state::at_collective;
        if (waiting == 0 || waiting < count) continue;
        const op o = lanes[0].collective;
        for (int l = 1; l < count; ++l)
            if (lanes[l].collective != o || lanes[l].width != lanes[0].width) {
                char text[1024];
                describe_warp(lanes, count, w0 / ws, text, sizeof text);
                fault("lanes of one warp are at different warp collectives (%s)", text);
            }
        switch (o) {
        case op::sync_warp: break;
        case op::shuffle_xor:
        case op::shuffle_index: resolve_shuffle(lanes, count); break;
        case op::ldmatrix:
        case op::ldmatrix_trans:
            if (count != 32) fault("ldmatrix in a warp of %d lanes (it needs 32)", count);
            resolve_ldmatrix(r, lanes, o == op::ldmatrix_trans);
            break;
        case op::mma_f16:
        case op::mma_bf16:
            if (count != 32) fault("mma.sync in a warp of %d lanes (it needs 32)", count);
            resolve_mma(lanes, o == op::mma_bf16);
            break;
        case op::mfma_f16:
            if (count != 64) fault("v_mfma in a wavefront of %d lanes (it needs 64)", count);
            resolve_mfma(lanes);
            break;
        }
        for (int l = 0; l < count; ++l) lanes[l].st = state::runnable;
        any = true;
    }
    return any;
}

/* Nothing runnable and no collective resolvable: release the barrier or report why not. */
void release_barrier(grid_run &r)
{
    const int n = static_cast<int>(r.fibers.size()), ws = r.cfg.warp_size;
    int done = 0, barrier = 0;
    for (const fiber &f : r.fibers) {
        done += f.st == state::done;
        barrier += f.st == state::at_barrier;
    }
    if (barrier + done != n) { /* some lanes wait at a collective the rest of their warp never reaches */
        for (int w0 = 0; w0 < n; w0 += ws) {
            const fiber *lanes = &r.fibers[static_cast<size_t>(w0)];
            const int count = std::min(ws, n - w0);
            for (int l = 0; l < count; ++l)
                if (lanes[l].st == state::at_collective) {
                    char text[1024];
                    describe_warp(lanes, count, w0 / ws, text, sizeof text);
                    fault("a warp collective is not reached by every lane of its warp (divergence): %s", text);
                }
        }
    }
    if (done > 0) fault("__syncthreads reached by %d threads while %d threads of the block had exited", barrier, done);
    for (fiber &f : r.fibers) f.st = state::runnable;
}

thread_local std::mt19937 tls_rng;
thread_local bool tls_rng_seeded;

void run_block(grid_run &r, order how)
{
    const int n = static_cast<int>(r.fibers.size());
    std::vector<int> ready;
    ready.reserve(static_cast<size_t>(n));
    for (;;) {
        ready.clear();
        for (int i = 0; i < n; ++i)
            if (r.fibers[static_cast<size_t>(i)].st == state::runnable) ready.push_back(i);
        if (ready.empty()) {
            if (resolve_collectives(r)) continue;
            bool all_done = true;
            for (const fiber &f : r.fibers) all_done = all_done && f.st == state::done;
            if (all_done) return;
            release_barrier(r);
            continue;
        }
        if (how == order::reverse) std::reverse(ready.begin(), ready.end());
        if (how == order::random) std::shuffle(ready.begin(), ready.end(), tls_rng);
        for (int i : ready) enter(r, i);
    }
}

} // namespace

void fault(const char *format, ...)
{
    fflush(stdout);
    grid_run *r = tls_run;
    fprintf(stderr, "flashattn SIMT emulator: ");
    if (r && r->current >= 0) {
        const fiber &f = r->fibers[static_cast<size_t>(r->current)];
        fprintf(stderr, "block (%u,%u,%u) thread (%u,%u,%u): ", r->block.x, r->block.y, r->block.z, f.tid.x, f.tid.y, f.tid.z);
    } else if (r) {
        fprintf(stderr, "block (%u,%u,%u): ", r->block.x, r->block.y, r->block.z);
    }
    va_list args;
    va_start(args, format);
    vfprintf(stderr, format, args);
    va_end(args);
    fprintf(stderr, "\n");
    abort();
}

void run(const launch &l)
{
    if (tls_run) fault("a kernel launched another kernel");
    unsigned seed;
    const order how = schedule_order(&seed);
    if (!tls_rng_seeded) {
        tls_rng.seed(seed);
        tls_rng_seeded = true;
    }
    grid_run r;
    r.cfg = l;
    r.current = -1;
    r.terminating = false;
    r.scheduler_stack = nullptr;
    r.scheduler_stack_size = 0;
    r.scheduler_fake_stack = nullptr;
    const size_t threads = static_cast<size_t>(l.block.x) * l.block.y * l.block.z;
    /* exactly the requested size, so that ASan reports an access past it */
    r.smem = static_cast<char *>(malloc(l.smem_bytes ? l.smem_bytes : 1));
    if (!r.smem) fault("cannot allocate %zu bytes of shared memory", l.smem_bytes);
    r.fibers.resize(threads);
    for (size_t t = 0; t < threads; ++t) {
        fiber &f = r.fibers[t];
        f.started = false;
        f.stack = stack_at(t);
        f.stack_size = kStackBytes;
        f.fake_stack = nullptr;
        f.tid.x = static_cast<unsigned>(t % l.block.x);
        f.tid.y = static_cast<unsigned>(t / l.block.x % l.block.y);
        f.tid.z = static_cast<unsigned>(t / (static_cast<size_t>(l.block.x) * l.block.y));
        prepare_start(f);
    }
    tls_run = &r;
    for (unsigned z = 0; z < l.grid.z; ++z)
        for (unsigned y = 0; y < l.grid.y; ++y)
            for (unsigned x = 0; x < l.grid.x; ++x) {
                r.block = {x, y, z};
                memset(r.smem, 0xff, l.smem_bytes);
                for (fiber &f : r.fibers) {
                    f.st = state::runnable;
                    f.issued.clear();
                    f.committed.clear();
                    f.group_sizes.clear();
                }
                run_block(r, how);
            }
    /* let every fiber leave its loop so that its stack is free (and ASan forgets it) */
    r.terminating = true;
    for (size_t t = 0; t < threads; ++t)
        if (r.fibers[t].started) enter(r, static_cast<int>(t));
    tls_run = nullptr;
    free(r.smem);
}

dim thread_idx() { return self().tid; }
dim block_idx() { return tls_run->block; }
dim block_dim() { return tls_run->cfg.block; }
dim grid_dim() { return tls_run->cfg.grid; }

char *dynamic_smem()
{
    (void)self();
    return tls_run->smem;
}

void sync_threads()
{
    fiber &f = self();
    f.st = state::at_barrier;
    yield(f);
}

namespace {
void collective(fiber &f, op o, int width)
{
    f.collective = o;
    f.width = width;
    f.st = state::at_collective;
    yield(f);
}
} // namespace

void sync_warp()
{
    fiber &f = self();
    collective(f, op::sync_warp, tls_run->cfg.warp_size);
}

float shuffle(shuffle_kind kind, float value, int arg, int width)
{
    fiber &f = self();
    const int ws = tls_run->cfg.warp_size;
    if (width <= 0 || width > ws || (width & (width - 1)) != 0)
        fault("shuffle width %d is not a power of two up to the warp size %d", width, ws);
    f.value = value;
    f.arg = arg;
    collective(f, kind == shuffle_kind::xor_lane ? op::shuffle_xor : op::shuffle_index, width);
    return f.value;
}

void ldmatrix_x4(uint32_t r[4], const uint16_t *row, bool trans)
{
    fiber &f = self();
    f.ptr = row;
    collective(f, trans ? op::ldmatrix_trans : op::ldmatrix, 32);
    for (int i = 0; i < 4; ++i) r[i] = f.reg[i];
}

void mma_m16n8k16(bool bf16, float c[4], const uint32_t a[4], uint32_t b0, uint32_t b1)
{
    fiber &f = self();
    for (int i = 0; i < 4; ++i) {
        f.reg[i] = a[i];
        f.acc[i] = c[i];
    }
    f.reg[4] = b0;
    f.reg[5] = b1;
    collective(f, bf16 ? op::mma_bf16 : op::mma_f16, 32);
    for (int i = 0; i < 4; ++i) c[i] = f.acc[i];
}

void mfma_f32_16x16x16f16(float c[4], const uint16_t a[4], const uint16_t b[4])
{
    fiber &f = self();
    for (int i = 0; i < 4; ++i) {
        f.reg[i] = a[i];
        f.reg[4 + i] = b[i];
        f.acc[i] = c[i];
    }
    collective(f, op::mfma_f16, 64);
    for (int i = 0; i < 4; ++i) c[i] = f.acc[i];
}

void copy_async16(void *smem_dst, const void *global_src, bool valid)
{
    fiber &f = self();
    const char *d = static_cast<const char *>(smem_dst);
    grid_run *r = tls_run;
    if (d < r->smem || d + 16 > r->smem + r->cfg.smem_bytes)
        fault("cp.async: destination outside the %zu bytes of dynamic shared memory", r->cfg.smem_bytes);
    if (reinterpret_cast<uintptr_t>(d) % 16 != 0 || (valid && reinterpret_cast<uintptr_t>(global_src) % 16 != 0))
        fault("cp.async: a 16-byte copy with a misaligned address");
    f.issued.push_back({smem_dst, global_src, valid});
}

void copy_async_commit()
{
    fiber &f = self();
    f.committed.insert(f.committed.end(), f.issued.begin(), f.issued.end());
    f.group_sizes.push_back(f.issued.size());
    f.issued.clear();
}

void copy_async_wait_group(int n)
{
    fiber &f = self();
    if (n < 0) fault("cp.async.wait_group %d: the count is negative", n);
    const size_t keep = static_cast<size_t>(n);
    if (f.group_sizes.size() <= keep) return;
    const size_t complete = f.group_sizes.size() - keep;
    size_t copies = 0;
    for (size_t g = 0; g < complete; ++g) copies += f.group_sizes[g];
    perform(f.committed, copies);
    f.group_sizes.erase(f.group_sizes.begin(), f.group_sizes.begin() + static_cast<std::ptrdiff_t>(complete));
}

} // namespace emu
