/* The SIMT emulator's core: runs a kernel's grid on the calling CPU thread, one block at a time,
 * every GPU thread of the block a fiber (ucontext to start it, setjmp/longjmp to switch: no
 * system call per switch). __syncthreads and every warp collective is a rendezvous: a fiber runs
 * until it reaches one and then waits; when no fiber can run, the scheduler releases a barrier
 * that every thread of the block has reached, or resolves a collective that every lane of a warp
 * has reached with the same operation, and aborts with a message naming the block, warp and
 * lanes otherwise (divergent barrier or collective, deadlock). Runnable fibers are resumed in
 * the order FLASHATTN_EMU_SCHEDULE names (forward, reverse, or random[:seed], the default
 * random:1), so that a missing barrier shows up as a wrong result rather than depending on luck.
 * Dynamic shared memory is one allocation of exactly the launch's size, filled with 0xff bytes
 * (NaN in f32, f16 and bf16) before each block. */
#ifndef FA_EMU_CORE_H
#define FA_EMU_CORE_H
#include <cstddef>
#include <cstdint>

namespace emu {

struct dim { unsigned x, y, z; };

struct launch {
    dim grid, block;
    size_t smem_bytes;
    int warp_size;
    void (*entry)(const void *kernel, const void *params); /* calls kernel(params) */
    const void *kernel, *params;
};

/* Runs the whole grid; returns when every block has finished. */
void run(const launch &l);

/* What the running GPU thread sees. */
dim thread_idx();
dim block_idx();
dim block_dim();
dim grid_dim();
char *dynamic_smem();

[[noreturn]] void fault(const char *format, ...) __attribute__((format(printf, 1, 2)));

/* Rendezvous. */
void sync_threads();
void sync_warp();
enum class shuffle_kind { xor_lane, index };
float shuffle(shuffle_kind kind, float value, int arg, int width);

/* Instruction models (warp collectives, layouts from the vendors' ISA manuals). */
void ldmatrix_x4(uint32_t r[4], const uint16_t *row, bool trans);   /* PTX ldmatrix .m8n8.x4.b16 */
void mma_m16n8k16(bool bf16, float c[4], const uint32_t a[4], uint32_t b0, uint32_t b1); /* PTX mma.sync */
void mfma_f32_16x16x16f16(float c[4], const uint16_t a[4], const uint16_t b[4]);        /* CDNA MFMA */

/* cp.async (per thread): a copy is issued into the open group; commit closes it (an empty group
 * too, as in PTX). wait_group(n) lands, in issue order, every committed group but the n most
 * recent; those stay in flight, their destinations keeping their old contents. A copy reads its
 * source when it lands, not when it is issued. Copies issued after the last commit belong to no
 * group: no wait_group lands them. Barriers land nothing; what is still in flight when the thread
 * exits lands then (committed groups first). */
void copy_async16(void *smem_dst, const void *global_src, bool valid);
void copy_async_commit();
void copy_async_wait_group(int n);

} // namespace emu
#endif
