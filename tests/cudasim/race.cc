// tests/cudasim/race.cc — the shared-memory race detector (CUDASIM_RACECHECK=1), and the
// single-step helper it shares with the runtime's watch on pending downloads.
//
// While a block runs, its shared-memory arena is PROT_NONE. Every access faults; the handler
// records it in a shadow word (4-byte granularity: the last writer, and the readers, with the
// barrier epoch they came in), reports a conflict, then opens the arena and single-steps the one
// instruction (the x86 trap flag) before closing it again. Two accesses to one word conflict
// when they come from different threads in the same epoch (no __syncthreads between them), at
// least one is a write, and the threads are not lanes of one warp that met at a warp barrier in
// between. Accesses wider than 4 bytes are recorded by their first word. It is slow (two
// signals per access): CI runs it on the op suites and the self-tests.
#include <signal.h>
#include <sys/mman.h>
#include <ucontext.h>

#include <vector>

#include "exec.h"

namespace cudasim {

// ---------------------------------------------------------------------------------------------
// Single step: let one faulting instruction run with memory opened, then call `after`.

static thread_local void (*step_done)(void *);
static thread_local void *step_arg;

void step_over(void *uctx, void (*after)(void *), void *arg) {
    step_done = after;
    step_arg = arg;
    ((ucontext_t *)uctx)->uc_mcontext.gregs[REG_EFL] |= 0x100;  // TF: trap after one instruction
}

bool race_trap(void *uctx) {
    if (!step_done) return false;
    ((ucontext_t *)uctx)->uc_mcontext.gregs[REG_EFL] &= ~0x100;
    void (*f)(void *) = step_done;
    step_done = nullptr;
    f(step_arg);
    return true;
}

// ---------------------------------------------------------------------------------------------
// Shadow of the block's shared memory

struct Word {
    uint32_t w_epoch, r_epoch;  // epoch of the last write / of the readers (0: none)
    int32_t writer, reader;     // thread (linear index); reader -2: more than one
    int32_t r_warp;             // the readers' warp, -1 when they are of several
    uint32_t w_wsync, r_wsync;  // the warp-sync count of that warp at the write / the last read
};
static std::vector<Word> shadow;
static std::vector<uint32_t> warp_syncs;  // per warp: warp barriers released so far
static uint32_t epoch;
static int enabled = -1;

bool race_enabled() {
    if (enabled < 0) {
        const char *e = getenv("CUDASIM_RACECHECK");
        enabled = e && strcmp(e, "0") != 0;
    }
    return enabled;
}

static size_t arena_span() { return (size_t)(SMEM_OPTIN_MAX + 4095) / 4096 * 4096; }
static void arena_protect(bool on) { mprotect(smem_base(), arena_span(), on ? PROT_NONE : PROT_READ | PROT_WRITE); }

void race_kernel_begin() {}
void race_kernel_end() {
    if (race_enabled() && smem_base()) arena_protect(false);
}
void race_block_begin(int nthreads) {
    if (!race_enabled()) return;
    arena_protect(false);
    shadow.assign(arena_span() / 4, Word{0, 0, -1, -1, -1, 0, 0});
    warp_syncs.assign((nthreads + 31) / 32, 0);
    epoch = 1;
}
void race_block_arm() {
    if (race_enabled()) arena_protect(true);
}
void race_block_sync() { epoch++; }
void race_warp_sync(int base, unsigned) {
    if (race_enabled()) warp_syncs[base / 32]++;
}
void race_thread_exit() {}

static void reclose(void *) { arena_protect(true); }

// Did `other`'s access (recorded with its warp's sync count `then`) happen before this thread's
// by a warp barrier both took part in?
static bool warp_ordered(int other, uint32_t then) {
    return other / 32 == cur->lin / 32 && warp_syncs[other / 32] != then;
}

static uint3 tid_of(int lin) {
    return make_uint3(lin % cur_bdim.x, lin / cur_bdim.x % cur_bdim.y, lin / (cur_bdim.x * cur_bdim.y));
}

bool race_fault(void *addr, bool write, void *uctx) {
    if (!cur || !cur_kernel) return false;  // not a kernel thread: not ours to judge
    const size_t off = (size_t)((char *)addr - smem_base());
    if (off >= arena_span()) return false;
    Word &w = shadow[off / 4];
    const int me = cur->lin;
    const uint32_t ws = warp_syncs[me / 32];
    auto race = [&](int other, const char *what) {
        const uint3 o = tid_of(other);
        fail("shared-memory race at byte %zu of the block's shared memory: this thread %s it after thread (%u,%u,%u) "
             "%s it, with no __syncthreads between", off, write ? "writes" : "reads", o.x, o.y, o.z, what);
    };
    if (w.w_epoch == epoch && w.writer != me && !warp_ordered(w.writer, w.w_wsync)) race(w.writer, "wrote");
    // Every earlier read of this epoch came before this access: no reader, or all of them lanes
    // of this thread's warp with a warp barrier since the last of them.
    const bool reads_before = w.r_epoch != epoch || w.reader == -1 ||
                              (w.r_warp == me / 32 && warp_syncs[me / 32] != w.r_wsync);
    if (write) {
        if (!reads_before && w.reader != me) {
            if (w.reader >= 0) race(w.reader, "read");
            fail("shared-memory race at byte %zu of the block's shared memory: this thread writes it after several "
                 "threads read it, with no __syncthreads between", off);
        }
        w.w_epoch = epoch;
        w.writer = me;
        w.w_wsync = ws;
    } else if (reads_before) {
        w.r_epoch = epoch;
        w.reader = me;
        w.r_warp = me / 32;
        w.r_wsync = ws;
    } else if (w.reader != me) {
        w.reader = -2;
        if (w.r_warp != me / 32) w.r_warp = -1;
        w.r_wsync = ws;
    }
    arena_protect(false);
    step_over(uctx, reclose, nullptr);
    return true;
}

}  // namespace cudasim
