// tests/cudasim/exec.cc — kernel execution: the threads of a block as fibers, barriers between
// them, the block's shared memory, and the checks a GPU would have made (or left undefined).
//
// One OS thread runs every kernel (runtime.cc calls run_grid from the thread that
// synchronises). A block's threads are fibers on stacks of their own; a fiber runs until it
// reaches a barrier or returns, the scheduler then runs the next one in CUDASIM_ORDER, and once
// no fiber can run it releases the barriers whose participants have all arrived. Anything else
// (a __syncthreads some threads never reach, lanes of one mask at different intrinsics) is an
// error, reported with the kernel, block and thread; so is touching shared memory past the
// block's arena, and a race on it (CUDASIM_RACECHECK=1, see race.cc).
#include "exec.h"

#include <stdarg.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <random>
#include <vector>

namespace cudasim {

Thread *cur;
uint3 cur_block;
dim3 cur_bdim, cur_gdim;
uint64_t *lane_slots;
const char *cur_kernel;
const char *cur_call;

// ---------------------------------------------------------------------------------------------
// Reports

void vreport(const char *fmt, va_list ap) {
    char msg[1024];
    vsnprintf(msg, sizeof msg, fmt, ap);
    if (cur_kernel && cur)
        fprintf(stderr, "cudasim: kernel '%s' block (%u,%u,%u) thread (%u,%u,%u): %s\n", cur_kernel, cur_block.x,
                cur_block.y, cur_block.z, cur->tid.x, cur->tid.y, cur->tid.z, msg);
    else if (cur_kernel)
        fprintf(stderr, "cudasim: kernel '%s' block (%u,%u,%u): %s\n", cur_kernel, cur_block.x, cur_block.y,
                cur_block.z, msg);
    else if (cur_call)
        fprintf(stderr, "cudasim: %s: %s\n", cur_call, msg);
    else
        fprintf(stderr, "cudasim: %s\n", msg);
}

void fail(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vreport(fmt, ap);
    va_end(ap);
    fflush(stderr);
    abort();
}

// ---------------------------------------------------------------------------------------------
// Thread order

int order_kind() {
    static int kind = -1;
    if (kind < 0) {
        const char *o = getenv("CUDASIM_ORDER");
        kind = !o || !*o || !strcmp(o, "forward") ? ORDER_FORWARD
             : !strcmp(o, "reverse")               ? ORDER_REVERSE
             : !strncmp(o, "random", 6)            ? ORDER_RANDOM
                                                   : -2;
        if (kind == -2) {
            fprintf(stderr, "cudasim: CUDASIM_ORDER=%s: expected forward, reverse or random[:seed]\n", o);
            exit(2);
        }
    }
    return kind;
}

static uint64_t order_seed() {
    const char *o = getenv("CUDASIM_ORDER");
    return o && o[6] == ':' ? strtoull(o + 7, NULL, 10) : 1;
}

// ---------------------------------------------------------------------------------------------
// Fibers

// The fiber switch (x86-64 System V): saves the callee-saved registers, MXCSR and the x87
// control word on the old stack, stores its stack pointer in *save, continues on `next`. No
// system call, unlike swapcontext (which saves the signal mask every time).
extern "C" void cudasim_switch(void **save, void *next);
asm(R"(
    .text
    .globl cudasim_switch
    .type cudasim_switch,@function
cudasim_switch:
    pushq %rbp
    pushq %rbx
    pushq %r12
    pushq %r13
    pushq %r14
    pushq %r15
    subq $8, %rsp
    stmxcsr (%rsp)
    fnstcw 4(%rsp)
    movq %rsp, (%rdi)
    movq %rsi, %rsp
    ldmxcsr (%rsp)
    fldcw 4(%rsp)
    addq $8, %rsp
    popq %r15
    popq %r14
    popq %r13
    popq %r12
    popq %rbx
    popq %rbp
    ret
    .size cudasim_switch, .-cudasim_switch
    .section .note.GNU-stack,"",@progbits
    .text
)");

enum { STACK_BYTES = 128 << 10, MAX_THREADS = 1024 };
static char *stacks;  // MAX_THREADS stacks, each above a guard page
static void *sched_sp;
static const std::function<void()> *cur_body;
static size_t page_bytes;
static std::vector<Thread> threads;
static std::vector<int> order;
static int round_pos;  // position in `order` of the thread running in this round

// Leaves the running fiber (its state already says why) for the next runnable one of this round,
// or for the scheduler when the round is over: one switch per thread per round.
static void switch_on(void **save) {
    const int n = (int)order.size();
    for (int k = round_pos + 1; k < n; k++) {
        Thread &t = threads[order[k]];
        if (t.state == RUN) {
            round_pos = k;
            cur = &t;
            cudasim_switch(save, t.sp);
            return;
        }
    }
    round_pos = n;
    cudasim_switch(save, sched_sp);
}

static void stacks_init() {
    if (stacks) return;
    page_bytes = (size_t)sysconf(_SC_PAGESIZE);
    const size_t page = page_bytes, one = STACK_BYTES + page;
    void *m = mmap(NULL, one * MAX_THREADS, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (m == MAP_FAILED) fail("cannot map the fiber stacks");
    stacks = (char *)m;
    for (int i = 0; i < MAX_THREADS; i++) mprotect(stacks + i * one, page, PROT_NONE);  // overflow faults
}

[[noreturn]] static void fiber_entry() {
    (*cur_body)();
    cur->state = DONE;
    race_thread_exit();
    switch_on(&cur->sp);
    __builtin_trap();
}

static void fiber_init(Thread &t, int i) {
    const size_t one = STACK_BYTES + page_bytes;
    // Stack tops staggered by a cache line per thread: at one page offset they would all fall
    // in the same L1 set, and a block's switches would miss on every one of them.
    uintptr_t top = ((uintptr_t)(stacks + (size_t)(i + 1) * one - (size_t)(i % 64) * 64)) & ~(uintptr_t)15;
    uint64_t *sp = (uint64_t *)(top - 72);  // fiber_entry starts as if called (sp = 8 mod 16)
    sp[0] = 0x037F00001F80ull;              // MXCSR and x87 control word at their defaults
    for (int r = 1; r <= 6; r++) sp[r] = 0;  // r15 r14 r13 r12 rbx rbp
    sp[7] = (uint64_t)(uintptr_t)&fiber_entry;
    sp[8] = 0;
    t.sp = sp;
}

static void yield_to_scheduler() { switch_on(&cur->sp); }

// ---------------------------------------------------------------------------------------------
// Shared memory: one arena, page-aligned with a guard page after it. The dynamic part is at its
// start, the `__shared__` declarations after it in the order the block first reaches them; all
// of it is filled with 0xff (a NaN in every float type) before each block, as shared memory
// holds garbage when a block starts.

enum { STATIC_SMEM_MAX = 48 << 10 };
static char *arena;
static size_t arena_bytes;
static size_t dyn_bytes, static_next, arena_used;
struct Site {
    const void *site;
    size_t off, bytes;
};
static std::vector<Site> sites;

static void arena_init() {
    if (arena) return;
    const size_t page = (size_t)sysconf(_SC_PAGESIZE);
    arena_bytes = (SMEM_OPTIN_MAX + page - 1) / page * page;
    void *m = mmap(NULL, arena_bytes + page, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (m == MAP_FAILED) fail("cannot map the shared-memory arena");
    arena = (char *)m;
    mprotect(arena + arena_bytes, page, PROT_NONE);
}

bool in_smem(const void *p) { return arena && (const char *)p >= arena && (const char *)p < arena + arena_bytes + 4096; }
char *smem_base() { return arena; }
size_t smem_used() { return arena_used; }

void *dyn_smem() { return arena; }

void *shared_alloc(const void *site, size_t bytes, size_t align) {
    for (const Site &s : sites)
        if (s.site == site) return arena + s.off;
    size_t off = (static_next + align - 1) / align * align;
    if (off + bytes - dyn_bytes > STATIC_SMEM_MAX)
        fail("__shared__ declarations of this kernel take %zu bytes, over the 48 KiB of static shared memory a block may have",
             off + bytes - dyn_bytes);
    if (off + bytes > SMEM_OPTIN_MAX)
        fail("static (%zu bytes) and dynamic (%zu bytes) shared memory exceed the 227 KiB of a block",
             off + bytes - dyn_bytes, dyn_bytes);
    sites.push_back({site, off, bytes});
    static_next = off + bytes;
    arena_used = std::max(arena_used, static_next);
    return arena + off;
}

// ---------------------------------------------------------------------------------------------
// One block

static std::vector<uint64_t> slots;
static uint64_t launches;

static Thread *first_live() {
    for (Thread &t : threads)
        if (t.state != DONE) return &t;
    return nullptr;
}

int slot_of(int lin) { return threads[lin].read_half; }

// Barriers are released as soon as their last participant arrives (the fast path below), and
// the round continues from the first released thread in CUDASIM_ORDER: a warp runs from one
// shuffle to the next while its stacks are in cache. What the fast path cannot judge (lanes of
// one warp at different masks, exited threads) waits for the end of the round, where
// release_warps and run_block decide, or report.
struct WarpWait {
    unsigned mask;
    int op, count;
    bool mixed;
};
static std::vector<WarpWait> warp_wait;
static std::vector<int> pos_of;  // position of each thread in `order`
static int block_waiting;

// Continues the round from position `from` (cur among the released, or not).
static void resume_from(int from) {
    if (pos_of[cur->lin] == from) {  // the first to go on is the caller itself
        round_pos = from;
        return;
    }
    round_pos = from - 1;
    switch_on(&cur->sp);
}

void block_barrier() {
    cur->state = AT_BLOCK;
    const int n = (int)threads.size();
    if (++block_waiting == n) {
        block_waiting = 0;
        for (Thread &t : threads) t.state = RUN;
        race_block_sync();
        resume_from(0);
        return;
    }
    yield_to_scheduler();
}

void warp_barrier(unsigned mask, int op) {
    const int lane = cur->lin & 31, base = cur->lin - lane, n = (int)threads.size();
    if (!(mask >> lane & 1)) fail("warp intrinsic called with mask 0x%08x, which leaves out the calling lane %d", mask, lane);
    if (base + 32 > n && (mask >> (n - base)))
        fail("warp mask 0x%08x names lanes beyond the last thread of the block (%d threads)", mask, n);
    cur->state = AT_WARP;
    cur->wmask = mask;
    cur->wop = op;
    WarpWait &w = warp_wait[base >> 5];
    if (w.count == 0) {
        w.mask = mask;
        w.op = op;
        w.mixed = false;
    } else if (w.mask != mask || w.op != op) {
        w.mixed = true;
    }
    if (++w.count == __builtin_popcount(mask) && !w.mixed) {
        w.count = 0;
        int first = n;
        for (int j = 0; j < 32; j++)
            if (mask >> j & 1) {
                Thread &t = threads[base + j];
                t.state = RUN;
                t.read_half = t.slot_half;
                first = std::min(first, pos_of[base + j]);
            }
        race_warp_sync(base, mask);
        resume_from(first);
        return;
    }
    yield_to_scheduler();
}

static const char *op_name(int op) {
    static const char *names[] = {"?", "__syncwarp", "__shfl_sync", "__shfl_xor_sync", "__shfl_down_sync",
                                  "__shfl_up_sync", "__ballot_sync", "__any_sync", "__all_sync", "__match_any_sync",
                                  "a wmma load/store/mma_sync"};
    op %= 100;
    return op > 0 && op < 11 ? names[op] : "?";
}

// Releases the warp barriers whose lanes have all arrived; true when one was.
static bool release_warps() {
    const int n = (int)threads.size();
    bool released = false;
    for (int base = 0; base < n; base += 32) {
        const int end = std::min(base + 32, n);
        for (int i = base; i < end; i++) {
            Thread &t = threads[i];
            if (t.state != AT_WARP) continue;
            bool all = true;
            for (int j = base; j < end && all; j++) {
                if (!(t.wmask >> (j - base) & 1)) continue;
                Thread &o = threads[j];
                if (o.state == DONE) {
                    cur = &t;
                    fail("%s with mask 0x%08x names lane %d, which has exited", op_name(t.wop), t.wmask, j - base);
                }
                if (o.state != AT_WARP) {
                    all = false;
                } else if (o.wmask != t.wmask || o.wop != t.wop) {
                    cur = &o;
                    fail("lanes of one warp disagree: this lane is at %s with mask 0x%08x, lane %d at %s with mask "
                         "0x%08x (a divergent warp intrinsic)", op_name(o.wop), o.wmask, t.lin & 31, op_name(t.wop),
                         t.wmask);
                }
            }
            if (!all) continue;
            for (int j = base; j < end; j++)
                if (t.wmask >> (j - base) & 1) {
                    threads[j].state = RUN;
                    threads[j].read_half = threads[j].slot_half;
                }
            race_warp_sync(base, t.wmask);
            released = true;
        }
    }
    return released;
}

static void run_block(const std::function<void()> &body) {
    const int n = (int)threads.size();
    for (int i = 0; i < n; i++) {
        Thread &t = threads[i];
        t.state = RUN;
        fiber_init(t, i);
        pos_of[order[i]] = i;
    }
    warp_wait.assign((n + 31) / 32, WarpWait{0, 0, 0, false});
    block_waiting = 0;
    sites.clear();
    static_next = dyn_bytes;
    race_block_begin(n);
    memset(arena, 0xff, std::max(arena_used, dyn_bytes));
    race_block_arm();
    cur_body = &body;
    for (;;) {
        round_pos = -1;
        switch_on(&sched_sp);  // runs every runnable thread once, in order, then comes back
        cur = nullptr;
        for (WarpWait &w : warp_wait) w.count = 0;  // the slow path decides what is still waiting
        block_waiting = 0;
        if (release_warps()) continue;
        int at_block = 0, done = 0;
        for (Thread &t : threads) {
            at_block += t.state == AT_BLOCK;
            done += t.state == DONE;
        }
        if (done == n) break;
        if (at_block + done == n) {
            if (done) {
                Thread *waiting = nullptr, *gone = nullptr;
                for (Thread &t : threads) {
                    if (t.state == AT_BLOCK && !waiting) waiting = &t;
                    if (t.state == DONE && !gone) gone = &t;
                }
                cur = waiting;
                fail("__syncthreads reached while thread (%u,%u,%u) of the block has exited (a divergent barrier: "
                     "every thread must reach it)", gone->tid.x, gone->tid.y, gone->tid.z);
            }
            for (Thread &t : threads) t.state = RUN;
            race_block_sync();
            continue;
        }
        // Nothing runs and no barrier can be released.
        Thread *w = nullptr, *b = nullptr;
        for (Thread &t : threads) {
            if (t.state == AT_WARP && !w) w = &t;
            if (t.state == AT_BLOCK && !b) b = &t;
        }
        if (w && b) {
            cur = b;
            fail("deadlock: this thread waits at __syncthreads while thread (%u,%u,%u) waits at %s with mask 0x%08x "
                 "for lanes that never arrive", w->tid.x, w->tid.y, w->tid.z, op_name(w->wop), w->wmask);
        }
        cur = w ? w : first_live();
        fail("deadlock: %s with mask 0x%08x waits for lanes that never arrive (they exited or took another path)",
             w ? op_name(w->wop) : "a barrier", w ? w->wmask : 0);
    }
}

void run_grid(const char *name, const Cfg &c, const std::function<void()> &body) {
    stacks_init();
    arena_init();
    const int n = (int)(c.b.x * c.b.y * c.b.z);
    threads.assign(n, Thread{});
    slots.assign(2 * n, 0);
    lane_slots = slots.data();
    for (int i = 0; i < n; i++) {
        threads[i].lin = i;
        threads[i].tid = make_uint3(i % c.b.x, i / c.b.x % c.b.y, i / (c.b.x * c.b.y));
    }
    order.resize(n);
    pos_of.resize(n);
    const int kind = order_kind();
    for (int i = 0; i < n; i++) order[i] = kind == ORDER_REVERSE ? n - 1 - i : i;
    std::mt19937_64 rng(order_seed() * 0x9E3779B97F4A7C15ull + ++launches);
    cur_kernel = name;
    cur_gdim = c.g;
    cur_bdim = c.b;
    dyn_bytes = c.smem;
    arena_used = std::max(arena_used, dyn_bytes);
    race_kernel_begin();
    for (unsigned z = 0; z < c.g.z; z++)
        for (unsigned y = 0; y < c.g.y; y++)
            for (unsigned x = 0; x < c.g.x; x++) {
                cur_block = make_uint3(x, y, z);
                if (kind == ORDER_RANDOM) std::shuffle(order.begin(), order.end(), rng);
                run_block(body);
            }
    race_kernel_end();
    cur_kernel = nullptr;
    cur = nullptr;
}

}  // namespace cudasim
