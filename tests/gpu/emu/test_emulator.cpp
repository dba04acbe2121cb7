/* The SIMT emulator's own contract (emu_core.h, emu_runtime.h): its instruction models agree with
 * the fragment layouts the device code is written against (src/gpu/kernels/mma_layout.h), its
 * 16-bit conversions with src/common/half.h (two independent implementations), shuffles follow
 * the CUDA width rules, cp.async lands only at wait_group (the groups older than its count),
 * shared memory starts as NaN, and the faults that make the emulated suite meaningful (divergent
 * barrier or collective, wrong block size, missing shared-memory opt-in) are raised rather than
 * passed over. */
#define EMU_TARGET_CUDA 1
#define FA_GPU_EMULATOR "emu_runtime.h"
#include "gpu/gpu_runtime.h"

#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmath>
#include <functional>
#include <random>

extern "C" {
#include <cmocka.h>
}
#include "common/half.h"
#include "gpu/kernels/mma_layout.h"

namespace {

/* A kernel as a host lambda: the launch runs it for every thread of every block. */
struct lambda_params { const std::function<void()> *body; };
void lambda_kernel(lambda_params p) { (*p.body)(); }

void launch(const std::function<void()> &body, unsigned blocks, unsigned threads, size_t smem = 0, int warp = 32)
{
    const lambda_params p = {&body};
    emu::launch l;
    l.grid = {blocks, 1, 1};
    l.block = {threads, 1, 1};
    l.smem_bytes = smem;
    l.warp_size = warp;
    l.entry = [](const void *k, const void *params) { ((void (*)(lambda_params))k)(*static_cast<const lambda_params *>(params)); };
    l.kernel = (const void *)lambda_kernel;
    l.params = &p;
    emu::run(l);
}

/* Runs body in a child process; the child must abort with `message` on stderr. */
void expect_fault(const std::function<void()> &body, const char *message)
{
    int pipe_fd[2];
    assert_int_equal(pipe(pipe_fd), 0);
    fflush(stdout);
    fflush(stderr);
    const pid_t child = fork();
    assert_true(child >= 0);
    if (child == 0) {
        dup2(pipe_fd[1], 2);
        close(pipe_fd[0]);
        body();
        _exit(0); /* no fault: the parent reports it */
    }
    close(pipe_fd[1]);
    char text[4096] = "";
    size_t used = 0;
    ssize_t got;
    while (used + 1 < sizeof text && (got = read(pipe_fd[0], text + used, sizeof text - 1 - used)) > 0) used += (size_t)got;
    text[used] = '\0';
    close(pipe_fd[0]);
    int status = 0;
    assert_int_equal(waitpid(child, &status, 0), child);
    if (!WIFSIGNALED(status) || WTERMSIG(status) != SIGABRT) fail_msg("expected an abort with \"%s\"; stderr: %s", message, text);
    if (!strstr(text, message)) fail_msg("expected \"%s\" in: %s", message, text);
}

void test_half_conversions_agree_with_library(void **)
{
    for (uint32_t h = 0; h < 0x10000; ++h) {
        const uint16_t bits = static_cast<uint16_t>(h);
        const float a = emu::float_from_f16_bits(bits), b = fa_f16_to_f32(bits);
        if (!(a == b || (std::isnan(a) && std::isnan(b))) || std::signbit(a) != std::signbit(b)) fail_msg("f16 0x%04x: %g vs %g", h, a, b);
        const float c = emu::float_from_bf16_bits(bits), d = fa_bf16_to_f32(bits);
        if (!(c == d || (std::isnan(c) && std::isnan(d))) || std::signbit(c) != std::signbit(d)) fail_msg("bf16 0x%04x: %g vs %g", h, c, d);
    }
    /* every representable value, the midpoints between neighbours (ties) and one float either side */
    std::mt19937 rng(7);
    for (uint32_t h = 0; h < 0x7c00; ++h) {
        const float lo = fa_f16_to_f32(static_cast<uint16_t>(h)), hi = fa_f16_to_f32(static_cast<uint16_t>(h + 1));
        const float mid = static_cast<float>((static_cast<double>(lo) + hi) / 2);
        const float probes[] = {lo, mid, std::nextafter(mid, 0.0f), std::nextafter(mid, INFINITY), -mid, -lo};
        for (float x : probes)
            if (emu::f16_bits_from_float(x) != fa_f32_to_f16(x)) fail_msg("f32 %a -> f16: 0x%04x vs 0x%04x", x, emu::f16_bits_from_float(x), fa_f32_to_f16(x));
    }
    for (int i = 0; i < 2000000; ++i) {
        uint32_t u = rng();
        float x;
        memcpy(&x, &u, sizeof x);
        if (std::isnan(x)) continue;
        if (emu::bf16_bits_from_float(x) != fa_f32_to_bf16(x)) fail_msg("f32 %a -> bf16: 0x%04x vs 0x%04x", x, emu::bf16_bits_from_float(x), fa_f32_to_bf16(x));
        if (emu::f16_bits_from_float(x) != fa_f32_to_f16(x)) fail_msg("f32 %a -> f16: 0x%04x vs 0x%04x", x, emu::f16_bits_from_float(x), fa_f32_to_f16(x));
    }
    const float specials[] = {65504.0f, 65519.99f, 65520.0f, 1e30f, INFINITY, -INFINITY, 0.0f, -0.0f, 1e-40f, 3.0e38f, 3.4e38f};
    for (float x : specials) {
        assert_int_equal(emu::f16_bits_from_float(x), fa_f32_to_f16(x));
        assert_int_equal(emu::bf16_bits_from_float(x), fa_f32_to_bf16(x));
    }
    assert_true(std::isnan(emu::float_from_f16_bits(emu::f16_bits_from_float(NAN))));
    assert_true(std::isnan(emu::float_from_bf16_bits(emu::bf16_bits_from_float(NAN))));
}

void test_shuffles_follow_width_rules(void **)
{
    float got[64][4];
    launch([&] {
        const int lane = static_cast<int>(threadIdx.x);
        const float v = static_cast<float>(lane);
        got[lane][0] = __shfl_xor_sync(0xffffffffu, v, 1, 32);
        got[lane][1] = __shfl_xor_sync(0xffffffffu, v, 8, 8); /* a partner in a later segment gives the own value, in an earlier one its value */
        got[lane][2] = __shfl_sync(0xffffffffu, v, 3, 16);
        got[lane][3] = __shfl_sync(0xffffffffu, v, 35, 32);
    }, 1, 64);
    for (int lane = 0; lane < 64; ++lane) {
        const int warp0 = lane / 32 * 32, l = lane % 32;
        assert_int_equal((int)got[lane][0], warp0 + (l ^ 1));
        assert_int_equal((int)got[lane][1], (l ^ 8) < l ? warp0 + (l ^ 8) : lane);
        assert_int_equal((int)got[lane][2], warp0 + l / 16 * 16 + 3);
        assert_int_equal((int)got[lane][3], warp0 + 3);
    }
}

/* Matrices through the layouts the kernels are written against, products from the models. */
void test_mma_sync_model_matches_fragment_layout(void **)
{
    for (int bf16 = 0; bf16 < 2; ++bf16) {
        float a[16][16], b[16][8], c[16][8], out[16][8];
        std::mt19937 rng(11 + bf16);
        std::uniform_int_distribution<int> small(-8, 8);
        for (int i = 0; i < 16; ++i)
            for (int k = 0; k < 16; ++k) a[i][k] = small(rng) / 4.0f;
        for (int k = 0; k < 16; ++k)
            for (int j = 0; j < 8; ++j) b[k][j] = small(rng) / 8.0f;
        for (int i = 0; i < 16; ++i)
            for (int j = 0; j < 8; ++j) c[i][j] = small(rng);
        const auto bits = [&](float x) { return bf16 ? fa_f32_to_bf16(x) : fa_f32_to_f16(x); };
        launch([&] {
            const int lane = static_cast<int>(threadIdx.x);
            uint32_t ar[4] = {0, 0, 0, 0}, br[2] = {0, 0};
            float cr[4];
            for (int item = 0; item < 8; ++item) {
                const fa_frag_coord x = fa_mma_a_coord(FA_MMA_SYNC_16X8X16, lane, item);
                ar[item / 2] |= static_cast<uint32_t>(bits(a[x.row][x.col])) << (16 * (item % 2));
            }
            for (int item = 0; item < 4; ++item) {
                const fa_frag_coord x = fa_mma_b_coord(FA_MMA_SYNC_16X8X16, lane, item);
                br[item / 2] |= static_cast<uint32_t>(bits(b[x.row][x.col])) << (16 * (item % 2));
                const fa_frag_coord y = fa_mma_c_coord(FA_MMA_SYNC_16X8X16, lane, item);
                cr[item] = c[y.row][y.col];
            }
            (bf16 ? fa_ptx_mma_m16n8k16_bf16 : fa_ptx_mma_m16n8k16_f16)(cr, ar, br[0], br[1]);
            for (int item = 0; item < 4; ++item) {
                const fa_frag_coord y = fa_mma_c_coord(FA_MMA_SYNC_16X8X16, lane, item);
                out[y.row][y.col] = cr[item];
            }
        }, 1, 32);
        for (int i = 0; i < 16; ++i)
            for (int j = 0; j < 8; ++j) {
                float expect = c[i][j];
                for (int k = 0; k < 16; ++k) expect += a[i][k] * b[k][j]; /* exact: small dyadic values */
                if (out[i][j] != expect) fail_msg("%s D[%d][%d] = %g, expected %g", bf16 ? "bf16" : "f16", i, j, out[i][j], expect);
            }
    }
}

void test_mfma_model_matches_fragment_layout(void **)
{
    float a[16][16], b[16][16], out[16][16];
    std::mt19937 rng(5);
    std::uniform_int_distribution<int> small(-8, 8);
    for (int i = 0; i < 16; ++i)
        for (int k = 0; k < 16; ++k) {
            a[i][k] = small(rng) / 4.0f;
            b[i][k] = small(rng) / 8.0f;
        }
    launch([&] {
        const int lane = static_cast<int>(threadIdx.x);
        uint16_t av[4], bv[4];
        float cr[4] = {1.0f, 1.0f, 1.0f, 1.0f};
        for (int item = 0; item < 4; ++item) {
            const fa_frag_coord x = fa_mma_a_coord(FA_MFMA_16X16X16, lane, item), y = fa_mma_b_coord(FA_MFMA_16X16X16, lane, item);
            av[item] = fa_f32_to_f16(a[x.row][x.col]);
            bv[item] = fa_f32_to_f16(b[y.row][y.col]);
        }
        emu::mfma_f32_16x16x16f16(cr, av, bv);
        for (int item = 0; item < 4; ++item) {
            const fa_frag_coord z = fa_mma_c_coord(FA_MFMA_16X16X16, lane, item);
            out[z.row][z.col] = cr[item];
        }
    }, 1, 64, 0, 64);
    for (int i = 0; i < 16; ++i)
        for (int j = 0; j < 16; ++j) {
            float expect = 1.0f;
            for (int k = 0; k < 16; ++k) expect += a[i][k] * b[k][j];
            if (out[i][j] != expect) fail_msg("D[%d][%d] = %g, expected %g", i, j, out[i][j], expect);
        }
}

/* ldmatrix: register m of lane l holds (row l/4, cols 2(l%4), +1) of matrix m; .trans transposes. */
void test_ldmatrix_model(void **)
{
    launch([&] {
        uint16_t *tile = reinterpret_cast<uint16_t *>(emu::dynamic_smem());
        const int lane = static_cast<int>(threadIdx.x);
        for (int e = lane; e < 4 * 64; e += 32) tile[e] = static_cast<uint16_t>(e);
        __syncwarp();
        uint32_t r[4], t[4];
        fa_ptx_ldmatrix_x4(r, tile + 8 * lane); /* matrix m = rows 8m..8m+7 of 8 elements */
        fa_ptx_ldmatrix_x4_trans(t, tile + 8 * lane);
        for (int m = 0; m < 4; ++m) {
            const uint32_t row = 8 * m + lane / 4, col = 2 * (lane % 4);
            if (r[m] != ((8 * row + col) | (8 * row + col + 1) << 16)) emu::fault("ldmatrix lane %d reg %d", lane, m);
            const uint32_t trow = 8 * m + 2 * (lane % 4), tcol = lane / 4;
            if (t[m] != ((8 * trow + tcol) | (8 * (trow + 1) + tcol) << 16)) emu::fault("ldmatrix.trans lane %d reg %d", lane, m);
        }
    }, 1, 32, 4 * 64 * 2);
}

/* cp.async: nothing lands before wait_group; shared memory starts as NaN (0xff bytes). */
void test_async_copies_land_at_wait(void **)
{
    alignas(16) static uint16_t source[8] = {1, 2, 3, 4, 5, 6, 7, 8};
    uint16_t before[8], after_commit[8], after_wait[8];
    launch([&] {
        uint16_t *s = reinterpret_cast<uint16_t *>(emu::dynamic_smem());
        fa_ptx_cp_async16(s, source, true);
        fa_ptx_cp_async16(s + 8, source, false);
        memcpy(before, s, sizeof before);
        fa_ptx_cp_async_commit();
        memcpy(after_commit, s, sizeof after_commit);
        fa_ptx_cp_async_wait_group<0>();
        memcpy(after_wait, s, sizeof after_wait);
        for (int i = 0; i < 8; ++i)
            if (s[8 + i] != 0) emu::fault("zero-fill copy wrote %u", s[8 + i]);
    }, 1, 1, 32);
    for (int i = 0; i < 8; ++i) {
        assert_int_equal(before[i], 0xffff);
        assert_int_equal(after_commit[i], 0xffff);
        assert_int_equal(after_wait[i], source[i]);
    }
    assert_true(std::isnan(emu::float_from_f16_bits(0xffff)) && std::isnan(emu::float_from_bf16_bits(0xffff)));
}

/* cp.async.wait_group N (PTX ISA): every committed group but the N most recent has landed, in
 * order; the newer ones are still in flight. Copies issued after the last commit are no group,
 * so not even wait_group 0 lands them; a commit (of nothing too) makes a group. A copy reads its
 * source when it lands (the model's choice; on hardware writing the source meanwhile is a race). */
void test_wait_group_lands_older_groups(void **)
{
    alignas(16) static uint16_t source[4][8];
    for (int g = 0; g < 4; ++g)
        for (int i = 0; i < 8; ++i) source[g][i] = static_cast<uint16_t>(100 * (g + 1) + i);
    uint16_t seen[6][4]; /* first element of slots 0..3 after each step */
    launch([&] {
        uint16_t *s = reinterpret_cast<uint16_t *>(emu::dynamic_smem());
        const auto look = [&](int step) {
            for (int slot = 0; slot < 4; ++slot) seen[step][slot] = s[8 * slot];
        };
        for (int g = 0; g < 3; ++g) {
            fa_ptx_cp_async16(s + 8 * g, source[g], true);
            fa_ptx_cp_async_commit();
        }
        fa_ptx_cp_async16(s + 24, source[3], true); /* issued, never committed before the waits */
        fa_ptx_cp_async_wait_group<3>();
        look(0);
        fa_ptx_cp_async_wait_group<2>();
        look(1);
        source[1][0] = 7; /* group 1 is in flight: it reads the source when it lands */
        fa_ptx_cp_async_wait_group<1>();
        look(2);
        fa_ptx_cp_async_wait_group<0>();
        look(3);
        fa_ptx_cp_async_commit(); /* the copy of slot 3 becomes a group */
        fa_ptx_cp_async_commit(); /* and an empty group after it */
        fa_ptx_cp_async_wait_group<1>();
        look(4);
        fa_ptx_cp_async16(s + 24, source[0], false); /* zero fill, never waited for */
        fa_ptx_cp_async_wait_group<0>();
        look(5);
    }, 1, 1, 4 * 16);
    const uint16_t nan = 0xffff;
    const uint16_t expect[6][4] = {
        {nan, nan, nan, nan}, /* wait_group 3: three groups may stay pending */
        {100, nan, nan, nan}, /* wait_group 2: the oldest landed */
        {100, 7, nan, nan},   /* wait_group 1: the second, with its source as it is now */
        {100, 7, 300, nan},   /* wait_group 0: every group, not the uncommitted copy */
        {100, 7, 300, 400},   /* its group landed; the empty group after it may stay pending */
        {100, 7, 300, 400},   /* the zero-fill copy is in no group */
    };
    for (int step = 0; step < 6; ++step)
        for (int slot = 0; slot < 4; ++slot)
            if (seen[step][slot] != expect[step][slot])
                fail_msg("step %d slot %d: %u, expected %u", step, slot, seen[step][slot], expect[step][slot]);
}

void test_divergent_barrier_is_a_fault(void **)
{
    expect_fault([] { launch([] { if (threadIdx.x < 40) __syncthreads(); }, 1, 64); }, "__syncthreads reached by 40 threads");
}

void test_divergent_shuffle_is_a_fault(void **)
{
    expect_fault([] {
        launch([] { if (threadIdx.x % 32 != 5) (void)__shfl_xor_sync(0xffffffffu, 1.0f, 1, 32); }, 1, 32);
    }, "not reached by every lane of its warp");
    expect_fault([] {
        launch([] {
            if (threadIdx.x == 3) __syncwarp();
            else (void)__shfl_xor_sync(0xffffffffu, 1.0f, 1, 32);
        }, 1, 32);
    }, "different warp collectives");
}

void block_size_kernel(int) { FA_GPU_REQUIRE_BLOCK(64); }

void test_wrong_block_size_traps(void **)
{
    assert_int_equal(fa_gpu_launch(block_size_kernel, dim3(2), dim3(64), 0, nullptr, 0), emuSuccess);
    expect_fault([] { (void)fa_gpu_launch(block_size_kernel, dim3(1), dim3(32), 0, nullptr, 0); }, "kernel trapped");
}

void test_shared_memory_opt_in(void **)
{
    assert_int_equal(fa_gpu_launch(block_size_kernel, dim3(1), dim3(64), 64 * 1024, nullptr, 0), emuErrorInvalidConfiguration);
    assert_int_equal(emuGetLastError(), emuErrorInvalidConfiguration);
    assert_int_equal(emuGetLastError(), emuSuccess); /* read once, then cleared */
    assert_int_equal(emuFuncSetAttribute((const void *)block_size_kernel, emuFuncAttributeMaxDynamicSharedMemorySize, 64 * 1024), emuSuccess);
    assert_int_equal(fa_gpu_launch(block_size_kernel, dim3(1), dim3(64), 64 * 1024, nullptr, 0), emuSuccess);
    assert_int_equal(fa_gpu_launch(block_size_kernel, dim3(1), dim3(2048), 0, nullptr, 0), emuErrorInvalidConfiguration);
}

/* Every schedule runs every thread; a barrier orders a block's writes before its reads. */
void test_schedules_and_barrier(void **)
{
    static const char *const orders[] = {"forward", "reverse", "random:9"};
    for (const char *order : orders) {
        setenv("FLASHATTN_EMU_SCHEDULE", order, 1);
        int sums[3] = {0, 0, 0};
        launch([&] {
            int *s = reinterpret_cast<int *>(emu::dynamic_smem());
            const unsigned t = threadIdx.x;
            s[t] = static_cast<int>(t);
            __syncthreads();
            if (t == 0) {
                int sum = 0;
                for (int i = 0; i < 96; ++i) sum += s[i];
                sums[blockIdx.x] = sum;
            }
        }, 3, 96, 96 * sizeof(int));
        for (int b = 0; b < 3; ++b) assert_int_equal(sums[b], 95 * 96 / 2);
    }
    unsetenv("FLASHATTN_EMU_SCHEDULE");
}

} // namespace

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_half_conversions_agree_with_library),
        cmocka_unit_test(test_shuffles_follow_width_rules),
        cmocka_unit_test(test_mma_sync_model_matches_fragment_layout),
        cmocka_unit_test(test_mfma_model_matches_fragment_layout),
        cmocka_unit_test(test_ldmatrix_model),
        cmocka_unit_test(test_async_copies_land_at_wait),
        cmocka_unit_test(test_wait_group_lands_older_groups),
        cmocka_unit_test(test_divergent_barrier_is_a_fault),
        cmocka_unit_test(test_divergent_shuffle_is_a_fault),
        cmocka_unit_test(test_wrong_block_size_traps),
        cmocka_unit_test(test_shared_memory_opt_in),
        cmocka_unit_test(test_schedules_and_barrier),
    };
    return cmocka_run_group_tests_name("simt_emulator", tests, NULL, NULL);
}
