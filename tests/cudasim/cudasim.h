// tests/cudasim/cudasim.h — the device side of cudasim, moetrain's functional CUDA emulator on
// the CPU (test-only code: `make SIM=1`; the trainer never depends on it).
//
// Every .cu file is compiled as C++ with this header force-included, after tests/cudasim/cu2cpp.py
// rewrote the two spots that are not C++: `k<<<g, b, smem, stream>>>(args)` becomes
// cudasim::launch("k", &k or nullptr, {g, b, smem, stream}, <a lambda calling k>, args) and each
// `__shared__` declaration becomes storage in the block's shared-memory arena (runtime.cc).
//
// Execution model: a launch is queued on its stream (runtime.cc decides when it runs: at once,
// or at the next synchronisation point in deferred mode). A grid runs block after block; every
// CUDA thread of a block is a fiber on the calling OS thread, switched only at barriers
// (__syncthreads, __syncwarp, the warp shuffles and votes). Each barrier is checked: all threads
// of the block at one __syncthreads, all lanes named by a warp mask at the same intrinsic with the
// same mask; an exited lane named by a mask, a divergent barrier or a deadlock is reported with
// the kernel, block and thread, and the process aborts. The order in which fibers run between
// barriers is CUDASIM_ORDER (forward, reverse, random[:seed]), so code that is only right in one
// order (a missing barrier) gives different results under another.
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <tuple>
#include <type_traits>

#undef __forceinline__
#define __forceinline__ inline
#undef __noinline__
#define __noinline__
#define __launch_bounds__(...)
// Lets a .cu bind a library stand-in (tests/cudasim/cudnn.cc) where CUDA builds dlopen the library.
#define MT_CUDASIM 1

namespace cudasim {

// One CUDA thread of the running block.
struct Thread {
    void *sp;        // saved stack pointer while switched out
    uint3 tid;       // threadIdx
    int lin;         // linear index in the block (warp = lin / 32, lane = lin % 32)
    int state;       // RUN, AT_BLOCK, AT_WARP, DONE
    unsigned wmask;  // the mask of the warp intrinsic it waits at
    int wop;         // which intrinsic (all lanes of a mask must call the same one)
    int slot_half;   // which half of lane_slots it last published into
    int read_half;   // that half as of the last release of a warp barrier it took part in
};

// The running block, for the intrinsics (defined in runtime.cc; one OS thread runs kernels).
extern Thread *cur;
extern uint3 cur_block;
extern dim3 cur_bdim, cur_gdim;
// Two exchange slots per thread of the block: a lane publishes into the half it did not use last
// time, so one barrier per shuffle is enough. A lane's next write to a half comes two warp
// barriers later, and barriers are released only between scheduling rounds, in which every
// released lane runs (and reads) before anyone can be released again.
extern uint64_t *lane_slots;

[[noreturn]] void fail(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
void block_barrier();
void warp_barrier(unsigned mask, int op);
void *dyn_smem();
void *shared_alloc(const void *site, size_t bytes, size_t align);
int slot_of(int lin);  // the half holding what thread lin published for the barrier just released

// A launch as the runtime sees it: which kernel, its shape, and the body of one thread.
struct Cfg {
    dim3 g, b;
    size_t smem = 0;
    cudaStream_t st = 0;
};
void submit_kernel(const char *name, const void *addr, const Cfg &c, std::function<void()> body);

// k<<<...>>>(args): the arguments are evaluated and copied now, as a launch does; the kernel
// runs later on its stream.
template <class F, class... A> void launch(const char *name, const void *addr, Cfg c, F f, A &&...a) {
    auto args = std::make_shared<std::tuple<std::decay_t<A>...>>(std::forward<A>(a)...);
    submit_kernel(name, addr, c, [f, args] { std::apply(f, *args); });
}

// `__shared__ T x[N];` in a kernel: the same storage for every thread of the block, fresh (filled
// with the NaN pattern 0xff) in every block. The site is a static object of the declaration.
template <class T> T &shared_var(const void *site) {
    return *static_cast<T *>(shared_alloc(site, sizeof(T), alignof(T)));
}

// Shuffles: every lane of the mask publishes its value, all meet, each reads its source lane.
enum { OP_SYNCWARP = 1, OP_SHFL, OP_SHFL_XOR, OP_SHFL_DOWN, OP_SHFL_UP, OP_BALLOT, OP_ANY, OP_ALL, OP_MATCH, OP_WMMA };
template <class T> T exchange(T v, unsigned mask, int op, int src, int width) {
    static_assert(sizeof(T) <= 8, "shuffles move at most 8 bytes");
    if (width <= 0 || width > 32 || (width & (width - 1))) fail("shuffle width %d is not a power of 2 in [1, 32]", width);
    uint64_t bits = 0;
    memcpy(&bits, &v, sizeof v);
    const int lane = cur->lin & 31, base = cur->lin - lane, n = (int)(cur_bdim.x * cur_bdim.y * cur_bdim.z);
    cur->slot_half ^= 1;
    lane_slots[cur->slot_half * n + cur->lin] = bits;
    warp_barrier(mask, op);
    const int seg = lane / width * width;
    const int s = src < seg || src >= seg + width ? lane : src;  // out of the segment: own value
    if (!(mask >> s & 1)) fail("shuffle reads lane %d, which is not in the mask 0x%08x", s, mask);
    const uint64_t r = lane_slots[slot_of(base + s) * n + base + s];
    T out;
    memcpy(&out, &r, sizeof out);
    return out;
}
// Votes: kind 0 collects predicates, kind 1 the lanes holding the same value.
inline unsigned vote(unsigned mask, int op, uint64_t v, int kind) {
    const int lane = cur->lin & 31, base = cur->lin - lane, n = (int)(cur_bdim.x * cur_bdim.y * cur_bdim.z);
    cur->slot_half ^= 1;
    lane_slots[cur->slot_half * n + cur->lin] = v;
    warp_barrier(mask, op);
    unsigned r = 0;
    for (int j = 0; j < 32; j++)
        if (mask >> j & 1) {
            const uint64_t o = lane_slots[slot_of(base + j) * n + base + j];
            if (kind == 0 ? o != 0 : o == v) r |= 1u << j;
        }
    return r;
}
}  // namespace cudasim

// The built-in variables of the running thread.
#define threadIdx (cudasim::cur->tid)
#define blockIdx (cudasim::cur_block)
#define blockDim (cudasim::cur_bdim)
#define gridDim (cudasim::cur_gdim)
inline constexpr int warpSize = 32;

// ---------------------------------------------------------------------------------------------
// Barriers, shuffles, votes

inline void __syncthreads() { cudasim::block_barrier(); }
inline void __syncwarp(unsigned mask = 0xffffffffu) { cudasim::warp_barrier(mask, cudasim::OP_SYNCWARP); }
template <class T> inline T __shfl_sync(unsigned m, T v, int src, int w = 32) {
    const int lane = cudasim::cur->lin & 31;
    return cudasim::exchange(v, m, cudasim::OP_SHFL, lane / w * w + (src & (w - 1)), w);
}
template <class T> inline T __shfl_xor_sync(unsigned m, T v, int x, int w = 32) {
    return cudasim::exchange(v, m, cudasim::OP_SHFL_XOR, (cudasim::cur->lin & 31) ^ x, w);
}
template <class T> inline T __shfl_down_sync(unsigned m, T v, unsigned d, int w = 32) {
    return cudasim::exchange(v, m, cudasim::OP_SHFL_DOWN, (cudasim::cur->lin & 31) + (int)d, w);
}
template <class T> inline T __shfl_up_sync(unsigned m, T v, unsigned d, int w = 32) {
    return cudasim::exchange(v, m, cudasim::OP_SHFL_UP, (cudasim::cur->lin & 31) - (int)d, w);
}
inline unsigned __ballot_sync(unsigned m, int p) { return cudasim::vote(m, cudasim::OP_BALLOT, p != 0, 0); }
inline int __any_sync(unsigned m, int p) { return cudasim::vote(m, cudasim::OP_ANY, p != 0, 0) != 0; }
inline int __all_sync(unsigned m, int p) { return cudasim::vote(m, cudasim::OP_ALL, p != 0, 0) == m; }
template <class T> inline unsigned __match_any_sync(unsigned m, T v) {
    static_assert(sizeof(T) <= 8, "__match_any_sync compares at most 8 bytes");
    uint64_t b = 0;
    memcpy(&b, &v, sizeof v);
    return cudasim::vote(m, cudasim::OP_MATCH, b, 1);
}
inline unsigned __activemask() { cudasim::fail("__activemask: the emulator has no notion of converged lanes"); }

// ---------------------------------------------------------------------------------------------
// Integer and float intrinsics (IEEE round-to-nearest on the CPU, as the _rn forms promise)

inline int __popc(unsigned x) { return __builtin_popcount(x); }
inline int __popcll(unsigned long long x) { return __builtin_popcountll(x); }
inline int __ffs(int x) { return __builtin_ffs(x); }
inline int __ffsll(long long x) { return __builtin_ffsll(x); }
inline int __clz(int x) { return x ? __builtin_clz((unsigned)x) : 32; }
inline unsigned __umulhi(unsigned a, unsigned b) { return (unsigned)(((unsigned long long)a * b) >> 32); }
inline float __expf(float x) { return expf(x); }
inline float __logf(float x) { return logf(x); }
inline float __fdividef(float a, float b) { return a / b; }
inline float rsqrtf(float x) { return 1.0f / sqrtf(x); }
inline float __saturatef(float x) { return x < 0 ? 0 : x > 1 ? 1 : x; }
template <class T> inline T __ldg(const T *p) { return *p; }
inline void __threadfence() { std::atomic_thread_fence(std::memory_order_seq_cst); }
inline void __threadfence_block() { std::atomic_thread_fence(std::memory_order_seq_cst); }
[[noreturn]] inline void __trap() { cudasim::fail("__trap() (the kernel aborted itself)"); }
inline float __fadd_rn(float a, float b) { return a + b; }
inline float __fsub_rn(float a, float b) { return a - b; }
inline float __fmul_rn(float a, float b) { return a * b; }
inline float __fdiv_rn(float a, float b) { return a / b; }
inline float __fsqrt_rn(float a) { return sqrtf(a); }
inline float __frcp_rn(float a) { return 1.0f / a; }
inline float __fmaf_rn(float a, float b, float c) { return fmaf(a, b, c); }
inline double __dadd_rn(double a, double b) { return a + b; }
inline double __dmul_rn(double a, double b) { return a * b; }

// Atomics: blocks run one at a time on one OS thread, so these only need to be correct, not
// fast; std::atomic_ref keeps them honest should that change.
template <class T> inline T atomicAdd(T *p, T v) { return std::atomic_ref<T>(*p).fetch_add(v); }
template <class T> inline T atomicSub(T *p, T v) { return std::atomic_ref<T>(*p).fetch_sub(v); }
template <class T> inline T atomicExch(T *p, T v) { return std::atomic_ref<T>(*p).exchange(v); }
template <class T> inline T atomicCAS(T *p, T c, T v) {
    std::atomic_ref<T>(*p).compare_exchange_strong(c, v);
    return c;
}
template <class T> inline T atomicMin(T *p, T v) {
    std::atomic_ref<T> a(*p);
    T o = a.load();
    while (v < o && !a.compare_exchange_weak(o, v)) {}
    return o;
}
template <class T> inline T atomicMax(T *p, T v) {
    std::atomic_ref<T> a(*p);
    T o = a.load();
    while (v > o && !a.compare_exchange_weak(o, v)) {}
    return o;
}
template <class T> inline T atomicOr(T *p, T v) { return std::atomic_ref<T>(*p).fetch_or(v); }
template <class T> inline T atomicAnd(T *p, T v) { return std::atomic_ref<T>(*p).fetch_and(v); }

// cudaFuncSetAttribute(kernel, ...) with a typed kernel pointer, as nvcc's headers allow.
template <class T> inline cudaError_t cudaFuncSetAttribute(T *f, cudaFuncAttribute a, int v) {
    return ::cudaFuncSetAttribute((const void *)f, a, v);
}
