// core/comm_nccl.cu — the NCCL communicator, on device buffers of a CUDA backend.
//
// NEVER RUN: written and compiled where no GPU was available. Everything below follows NCCL's
// documented API (2.28 headers), but no line of it has executed; see core/comm.h.
//
// Shape of it:
//   * Bootstrap: rank 0 of the host communicator (MPI, or single for a 1-rank run without a
//     launcher) calls ncclGetUniqueId, broadcasts it over MPI, and every rank calls
//     ncclCommInitRankConfig with a NON-BLOCKING config, so that no NCCL call can block the host
//     past the deadline: each call may return ncclInProgress, and settle() polls
//     ncclCommGetAsyncError until it is done, failed, or the deadline passed.
//   * Streams: each communicator has its own stream. A collective records an event on the
//     backend's stream, makes the comm stream wait on it, enqueues the NCCL call(s), records a
//     completion event, and (unless MT_COMM_ASYNC) makes the backend's stream wait on that.
//   * Watchdog: one thread per communicator retires completion events in order (cudaEventQuery)
//     and checks ncclCommGetAsyncError. A collective not complete within the deadline, or an
//     async error, ends the job: message, ncclCommAbort on every live NCCL communicator,
//     MPI_Abort.
//   * Counts are elements; the all-to-all is grouped ncclSend/ncclRecv (the copy to itself a
//     cudaMemcpyAsync); MT_COMM_EXACT is grouped send/recv of parts, a fold kernel in rank
//     order, and grouped ncclBroadcast of the folded parts, with its scratch in the backend's
//     ledger under `comm` (kept between calls, grown when a larger call needs it).
// Calls on the non-blocking communicator go through NCCL_CALL / NCCL_QUEUE, which accept
// ncclInProgress and end the job through comm_fail (ncclCommAbort + MPI_Abort) on an error;
// MT_CHECK_NCCL would count ncclInProgress as an error and exit without aborting anything.
// The calls that take no communicator (ncclGetUniqueId) and ncclCommDestroy use MT_CHECK_NCCL.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <nccl.h>
#include <pthread.h>
#include <string.h>
#include <time.h>

#include "core/cuda_check.h"  // first: it makes core/common.h digestible for nvcc
#include "core/comm_internal.h"

enum {
    NCCL_PENDING = 256,  // collectives queued and not yet seen complete, per communicator
    WATCHDOG_NS = 10 * 1000 * 1000,  // 10 ms between the watchdog's looks
};

typedef struct {
    cudaEvent_t ev;
    const char *op;
    uint64_t seq;
    size_t count;
    mt_comm_type type;
    double t0;
} pending;

typedef struct nccl_impl {
    ncclComm_t nccl;
    int device;
    cudaStream_t compute;  // the backend's stream
    cudaStream_t stream;   // this communicator's stream
    cudaEvent_t ready;     // compute → stream, before each collective
    cudaEvent_t tail;      // stream → compute (mt_comm_wait) or host (mt_comm_sync, free)
    pthread_mutex_t mu;    // guards ring, head, count and the comm's done_* fields
    pending ring[NCCL_PENDING];
    int head, count;
    pthread_t watchdog;
    int has_watchdog;
    int stop;  // __atomic builtins
    void *scratch;  // EXACT's parts, device memory counted under MT_MEM_COMM
    size_t scratch_bytes;
    mt_comm *self;
    struct nccl_impl *next;  // the live list, for aborting them all
} nccl_impl;

static pthread_mutex_t live_mu = PTHREAD_MUTEX_INITIALIZER;
static nccl_impl *live;

static nccl_impl *impl_of(const mt_comm *c) { return (nccl_impl *)c->impl; }

#define COMM_CUDA(c, expr)                                                                      \
    do {                                                                                        \
        cudaError_t e_ = (expr);                                                                \
        if (e_ != cudaSuccess)                                                                  \
            comm_fail((c), e_ == cudaErrorMemoryAllocation ? MT_EXIT_OOM : MT_EXIT_ERROR,       \
                      "CUDA error '%s' (%s) in `%s`; hint: %s", cudaGetErrorString(e_),         \
                      cudaGetErrorName(e_), #expr, mt_cuda_error_hint(e_));                     \
    } while (0)

// A call outside a group: checked, then settled (issued) with the deadline.
#define NCCL_CALL(c, expr) nccl_call((c), (expr), #expr)
// ncclGroupStart and the calls inside a group: checked only; ncclGroupEnd settles them all.
#define NCCL_QUEUE(c, expr) nccl_queue((c), (expr), #expr)

static void nccl_fail(const mt_comm *c, ncclResult_t r, const char *expr) {
    nccl_impl *m = impl_of(c);
    const char *last = m->nccl ? ncclGetLastError(m->nccl) : NULL;
    comm_fail(c, MT_EXIT_ERROR, "NCCL error '%s' (%d) in `%s` (%s #%llu)%s%s; hint: %s",
              ncclGetErrorString(r), (int)r, expr, c->op ? c->op : "?",
              (unsigned long long)c->seq, last && *last ? ": " : "", last ? last : "",
              r == ncclSystemError || r == ncclRemoteError
                  ? "a system call, the network or a peer failed; rerun with NCCL_DEBUG=INFO"
                  : "rerun with NCCL_DEBUG=INFO (and check every rank reached this call)");
}

// Non-blocking communicator: wait until the call just made has been issued (or failed).
static void settle(const mt_comm *c, const char *expr) {
    nccl_impl *m = impl_of(c);
    double t0 = comm_now();
    unsigned round = 0;
    for (;;) {
        ncclResult_t st = ncclSuccess;
        ncclResult_t r = ncclCommGetAsyncError(m->nccl, &st);
        if (r != ncclSuccess) nccl_fail(c, r, "ncclCommGetAsyncError");
        if (st == ncclSuccess) return;
        if (st != ncclInProgress) nccl_fail(c, st, expr);
        comm_backoff(&round);
        if (c->timeout_s > 0 && round > 256) {
            double waited = comm_now() - t0;
            if (waited > c->timeout_s) comm_fail_deadline(c, waited);
        }
    }
}

static void nccl_call(const mt_comm *c, ncclResult_t r, const char *expr) {
    if (r != ncclSuccess && r != ncclInProgress) nccl_fail(c, r, expr);
    settle(c, expr);
}

static void nccl_queue(const mt_comm *c, ncclResult_t r, const char *expr) {
    if (r != ncclSuccess && r != ncclInProgress) nccl_fail(c, r, expr);
}

static ncclDataType_t nccl_type(mt_comm_type t) {
    switch (t) {
    case MT_COMM_F32: return ncclFloat32;
    case MT_COMM_F64: return ncclFloat64;
    case MT_COMM_BF16: return ncclBfloat16;
    case MT_COMM_F16: return ncclFloat16;
    case MT_COMM_I32: return ncclInt32;
    case MT_COMM_I64: return ncclInt64;
    default: return ncclUint8;
    }
}

static ncclRedOp_t nccl_op(mt_comm_op op) {
    return op == MT_COMM_SUM ? ncclSum : op == MT_COMM_MAX ? ncclMax : ncclMin;
}

// ---------------------------------------------------------------------------------------------
// Completion tracking (main thread and watchdog)

// Pops the collectives that have completed, oldest first. Called with m->mu held. Returns an
// error of the stream, if any, with the entry it belongs to in *bad.
static cudaError_t retire(mt_comm *c, nccl_impl *m, const pending **bad) {
    while (m->count) {
        pending *p = &m->ring[m->head];
        cudaError_t e = cudaEventQuery(p->ev);
        if (e == cudaErrorNotReady) return cudaSuccess;
        if (e != cudaSuccess) {
            *bad = p;
            return e;
        }
        c->done_op = p->op;
        c->done_seq = p->seq;
        m->head = (m->head + 1) % NCCL_PENDING;
        m->count--;
    }
    return cudaSuccess;
}

static void fail_overdue(mt_comm *c, nccl_impl *m, const pending *p, double waited) {
    const pending *tail = &m->ring[(m->head + m->count - 1) % NCCL_PENDING];
    comm_fail(c, MT_EXIT_ERROR,
              "NCCL collective %s #%llu (%zu × %s) has not completed %.1f s after it was queued "
              "(deadline %g s: MT_COMM_TIMEOUT or mt_comm_set_timeout); last completed on this "
              "comm: %s #%llu; last queued: %s #%llu. Some rank of '%s' has not reached it "
              "(stalled, dead, or calling a different collective; MT_COMM_CHECK=1 tells which). "
              "Aborting the job.",
              p->op, (unsigned long long)p->seq, p->count, mt_comm_type_name(p->type), waited,
              c->timeout_s, c->done_op ? c->done_op : "none", (unsigned long long)c->done_seq,
              tail->op, (unsigned long long)tail->seq, c->name);
}

static void check_stream(mt_comm *c, nccl_impl *m) {
    const pending *bad = NULL;
    cudaError_t e = retire(c, m, &bad);
    if (e != cudaSuccess)
        comm_fail(c, MT_EXIT_ERROR, "CUDA error '%s' (%s) on the stream of NCCL collective %s "
                  "#%llu; hint: %s", cudaGetErrorString(e), cudaGetErrorName(e), bad->op,
                  (unsigned long long)bad->seq, mt_cuda_error_hint(e));
    if (m->count && c->timeout_s > 0) {
        const pending *p = &m->ring[m->head];
        double waited = comm_now() - p->t0;
        if (waited > c->timeout_s) fail_overdue(c, m, p, waited);
    }
}

static void *watchdog_main(void *arg) {
    mt_comm *c = (mt_comm *)arg;
    nccl_impl *m = impl_of(c);
    cudaSetDevice(m->device);
    while (!__atomic_load_n(&m->stop, __ATOMIC_ACQUIRE)) {
        pthread_mutex_lock(&m->mu);
        check_stream(c, m);
        pthread_mutex_unlock(&m->mu);
        ncclResult_t st = ncclSuccess;
        if (ncclCommGetAsyncError(m->nccl, &st) == ncclSuccess && st != ncclSuccess &&
            st != ncclInProgress)
            nccl_fail(c, st, "(asynchronous error)");
        struct timespec ts = {0, WATCHDOG_NS};
        nanosleep(&ts, NULL);
    }
    return NULL;
}

// Host wait for everything queued on the comm stream, with the deadline.
static void quiesce(mt_comm *c, nccl_impl *m) {
    COMM_CUDA(c, cudaEventRecord(m->tail, m->stream));
    double t0 = comm_now();
    unsigned round = 0;
    for (;;) {
        cudaError_t e = cudaEventQuery(m->tail);
        if (e == cudaSuccess) break;
        if (e != cudaErrorNotReady) COMM_CUDA(c, e);
        ncclResult_t st = ncclSuccess;
        if (ncclCommGetAsyncError(m->nccl, &st) == ncclSuccess && st != ncclSuccess &&
            st != ncclInProgress)
            nccl_fail(c, st, "(asynchronous error)");
        comm_backoff(&round);
        if (c->timeout_s > 0 && round > 256) {
            double waited = comm_now() - t0;
            if (waited > c->timeout_s) comm_fail_deadline(c, waited);
        }
    }
    pthread_mutex_lock(&m->mu);
    check_stream(c, m);
    pthread_mutex_unlock(&m->mu);
}

static void stream_begin(mt_comm *c, nccl_impl *m) {
    COMM_CUDA(c, cudaEventRecord(m->ready, m->compute));
    COMM_CUDA(c, cudaStreamWaitEvent(m->stream, m->ready, 0));
}

static void stream_end(mt_comm *c, nccl_impl *m, int flags) {
    pthread_mutex_lock(&m->mu);
    for (unsigned round = 0; m->count == NCCL_PENDING;) {  // full: wait for the oldest
        check_stream(c, m);
        if (m->count < NCCL_PENDING) break;
        pthread_mutex_unlock(&m->mu);
        comm_backoff(&round);
        pthread_mutex_lock(&m->mu);
    }
    pending *p = &m->ring[(m->head + m->count) % NCCL_PENDING];
    COMM_CUDA(c, cudaEventRecord(p->ev, m->stream));
    p->op = c->op;
    p->seq = c->seq;
    p->count = c->op_count;
    p->type = c->op_type;
    p->t0 = comm_now();
    m->count++;
    // Only this thread records events, so p->ev cannot be re-recorded before the wait below.
    if (!(flags & MT_COMM_ASYNC)) COMM_CUDA(c, cudaStreamWaitEvent(m->compute, p->ev, 0));
    pthread_mutex_unlock(&m->mu);
}

// ---------------------------------------------------------------------------------------------
// Fixed-order fold on the device: dst [n] = rows[0] op rows[1] op ... (rows [nrows, stride]),
// left to right; bf16/f16 accumulate in f32 and round once, as comm_fold does on the host.

template <typename T> struct fold_acc {
    typedef T acc;
    static __device__ T load(T x) { return x; }
    static __device__ T store(T x) { return x; }
};
template <> struct fold_acc<__nv_bfloat16> {
    typedef float acc;
    static __device__ float load(__nv_bfloat16 x) { return __bfloat162float(x); }
    static __device__ __nv_bfloat16 store(float x) { return __float2bfloat16_rn(x); }
};
template <> struct fold_acc<__half> {
    typedef float acc;
    static __device__ float load(__half x) { return __half2float(x); }
    static __device__ __half store(float x) { return __float2half_rn(x); }
};

template <typename T>
__global__ void fold_kernel(T *dst, const T *rows, int nrows, size_t n, size_t stride, int op) {
    typedef fold_acc<T> F;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x) {
        typename F::acc acc = F::load(rows[i]);
        for (int q = 1; q < nrows; q++) {
            typename F::acc x = F::load(rows[(size_t)q * stride + i]);
            if (op == MT_COMM_SUM) acc = acc + x;
            else if (op == MT_COMM_MAX) acc = x > acc ? x : acc;
            else acc = x < acc ? x : acc;
        }
        dst[i] = F::store(acc);
    }
}

template <typename T>
static void fold_launch(void *dst, const void *rows, int nrows, size_t n, size_t stride,
                        mt_comm_op op, cudaStream_t s) {
    size_t blocks = (n + 255) / 256;
    if (blocks > 4096) blocks = 4096;
    fold_kernel<T><<<(unsigned)blocks, 256, 0, s>>>((T *)dst, (const T *)rows, nrows, n, stride,
                                                     (int)op);
}

static void fold_device(mt_comm *c, void *dst, const void *rows, int nrows, size_t n,
                        size_t stride, mt_comm_type t, mt_comm_op op) {
    if (!n) return;
    cudaStream_t s = impl_of(c)->stream;
    switch (t) {
    case MT_COMM_F32: fold_launch<float>(dst, rows, nrows, n, stride, op, s); break;
    case MT_COMM_F64: fold_launch<double>(dst, rows, nrows, n, stride, op, s); break;
    case MT_COMM_BF16: fold_launch<__nv_bfloat16>(dst, rows, nrows, n, stride, op, s); break;
    case MT_COMM_F16: fold_launch<__half>(dst, rows, nrows, n, stride, op, s); break;
    case MT_COMM_I32: fold_launch<int32_t>(dst, rows, nrows, n, stride, op, s); break;
    case MT_COMM_I64: fold_launch<int64_t>(dst, rows, nrows, n, stride, op, s); break;
    default: fold_launch<uint8_t>(dst, rows, nrows, n, stride, op, s); break;
    }
    COMM_CUDA(c, cudaGetLastError());
}

// EXACT's scratch, grown when needed (after the stream has drained: the old one may be in use).
static char *scratch(mt_comm *c, nccl_impl *m, size_t bytes) {
    if (bytes <= m->scratch_bytes) return (char *)m->scratch;
    quiesce(c, m);
    if (m->scratch) mt_backend_release(c->be, MT_MEM_COMM, m->scratch_bytes, m->scratch);
    m->scratch = NULL;
    m->scratch_bytes = 0;
    if (mt_backend_alloc(c->be, MT_MEM_COMM, bytes, &m->scratch) != 0)
        comm_fail(c, MT_EXIT_OOM, "scratch of %s (MT_COMM_EXACT): %s", c->op, mt_error_get());
    m->scratch_bytes = bytes;
    return (char *)m->scratch;
}

// ---------------------------------------------------------------------------------------------
// Collectives

static void exact_all_reduce(mt_comm *c, nccl_impl *m, char *buf, size_t n, mt_comm_type t,
                             mt_comm_op op) {
    int size = c->size, me = c->rank;
    size_t es = mt_comm_type_size(t), mine = comm_part_len(n, size, me);
    char *s = scratch(c, m, (size_t)size * mine * es + 1);
    ncclDataType_t dt = nccl_type(t);
    // Part q of every rank to rank q; the copy to itself on the stream.
    if (mine)
        COMM_CUDA(c, cudaMemcpyAsync(s + (size_t)me * mine * es,
                                     buf + comm_part_off(n, size, me) * es, mine * es,
                                     cudaMemcpyDeviceToDevice, m->stream));
    NCCL_QUEUE(c, ncclGroupStart());
    for (int q = 0; q < size; q++) {
        if (q == me) continue;
        size_t len = comm_part_len(n, size, q);
        if (len)
            NCCL_QUEUE(c, ncclSend(buf + comm_part_off(n, size, q) * es, len, dt, q, m->nccl,
                                  m->stream));
        if (mine)
            NCCL_QUEUE(c, ncclRecv(s + (size_t)q * mine * es, mine, dt, q, m->nccl, m->stream));
    }
    NCCL_CALL(c, ncclGroupEnd());
    fold_device(c, buf + comm_part_off(n, size, me) * es, s, size, mine, mine, t, op);
    // Every part from its owner to everyone.
    NCCL_QUEUE(c, ncclGroupStart());
    for (int q = 0; q < size; q++) {
        size_t len = comm_part_len(n, size, q);
        char *p = buf + comm_part_off(n, size, q) * es;
        if (len) NCCL_QUEUE(c, ncclBroadcast(p, p, len, dt, q, m->nccl, m->stream));
    }
    NCCL_CALL(c, ncclGroupEnd());
}

static void nccl_all_reduce(mt_comm *c, void *buf, size_t n, mt_comm_type t, mt_comm_op op,
                            int flags) {
    nccl_impl *m = impl_of(c);
    stream_begin(c, m);
    if ((flags & MT_COMM_EXACT) && op == MT_COMM_SUM && c->size > 1)
        exact_all_reduce(c, m, (char *)buf, n, t, op);
    else
        NCCL_CALL(c, ncclAllReduce(buf, buf, n, nccl_type(t), nccl_op(op), m->nccl, m->stream));
    stream_end(c, m, flags);
}

static void nccl_broadcast(mt_comm *c, void *buf, size_t n, mt_comm_type t, int root,
                           int flags) {
    nccl_impl *m = impl_of(c);
    stream_begin(c, m);
    NCCL_CALL(c, ncclBroadcast(buf, buf, n, nccl_type(t), root, m->nccl, m->stream));
    stream_end(c, m, flags);
}

static void nccl_reduce_scatter(mt_comm *c, const void *send, void *recv, size_t n,
                                mt_comm_type t, mt_comm_op op, int flags) {
    nccl_impl *m = impl_of(c);
    size_t es = mt_comm_type_size(t);
    stream_begin(c, m);
    if ((flags & MT_COMM_EXACT) && op == MT_COMM_SUM && c->size > 1) {
        char *s = scratch(c, m, (size_t)c->size * n * es);
        const char *in = (const char *)send;
        COMM_CUDA(c, cudaMemcpyAsync(s + (size_t)c->rank * n * es, in + (size_t)c->rank * n * es,
                                     n * es, cudaMemcpyDeviceToDevice, m->stream));
        NCCL_QUEUE(c, ncclGroupStart());
        for (int q = 0; q < c->size; q++) {
            if (q == c->rank) continue;
            NCCL_QUEUE(c, ncclSend(in + (size_t)q * n * es, n, nccl_type(t), q, m->nccl,
                                   m->stream));
            NCCL_QUEUE(c, ncclRecv(s + (size_t)q * n * es, n, nccl_type(t), q, m->nccl, m->stream));
        }
        NCCL_CALL(c, ncclGroupEnd());
        fold_device(c, recv, s, c->size, n, n, t, op);
    } else {
        NCCL_CALL(c, ncclReduceScatter(send, recv, n, nccl_type(t), nccl_op(op), m->nccl,
                                       m->stream));
    }
    stream_end(c, m, flags);
}

static void nccl_all_gather(mt_comm *c, const void *send, void *recv, size_t n, mt_comm_type t,
                            int flags) {
    nccl_impl *m = impl_of(c);
    stream_begin(c, m);
    NCCL_CALL(c, ncclAllGather(send, recv, n, nccl_type(t), m->nccl, m->stream));
    stream_end(c, m, flags);
}

static void nccl_all_to_all_v(mt_comm *c, const void *send, const int64_t *send_rows,
                              void *recv, const int64_t *recv_rows, size_t row_elems,
                              mt_comm_type t, int flags) {
    nccl_impl *m = impl_of(c);
    size_t row_bytes = row_elems * mt_comm_type_size(t);
    int me = c->rank;
    if (send_rows[me] != recv_rows[me])
        comm_fail(c, MT_EXIT_ERROR, "all_to_all_v: sends %lld rows to itself but expects %lld",
                  (long long)send_rows[me], (long long)recv_rows[me]);
    stream_begin(c, m);
    const char *in = (const char *)send;
    char *out = (char *)recv;
    size_t so = 0, ro = 0, self_so = 0, self_ro = 0;
    NCCL_QUEUE(c, ncclGroupStart());
    for (int p = 0; p < c->size; p++) {
        size_t sr = (size_t)send_rows[p], rr = (size_t)recv_rows[p];
        if (p == me) {
            self_so = so, self_ro = ro;
        } else {
            if (sr)
                NCCL_QUEUE(c, ncclSend(in + so * row_bytes, sr * row_elems, nccl_type(t), p,
                                      m->nccl, m->stream));
            if (rr)
                NCCL_QUEUE(c, ncclRecv(out + ro * row_bytes, rr * row_elems, nccl_type(t), p,
                                      m->nccl, m->stream));
        }
        so += sr;
        ro += rr;
    }
    NCCL_CALL(c, ncclGroupEnd());
    if (send_rows[me])
        COMM_CUDA(c, cudaMemcpyAsync(out + self_ro * row_bytes, in + self_so * row_bytes,
                                     (size_t)send_rows[me] * row_bytes, cudaMemcpyDeviceToDevice,
                                     m->stream));
    stream_end(c, m, flags);
}

static void nccl_wait(mt_comm *c) {
    nccl_impl *m = impl_of(c);
    COMM_CUDA(c, cudaEventRecord(m->tail, m->stream));
    COMM_CUDA(c, cudaStreamWaitEvent(m->compute, m->tail, 0));
}

static void nccl_sync(mt_comm *c) { quiesce(c, impl_of(c)); }

// ---------------------------------------------------------------------------------------------
// Lifetime

static void abort_all(void) {
    // Runs on the way out of a failing process: no locks that a failing thread may hold.
    for (nccl_impl *m = live; m; m = m->next)
        if (m->nccl) ncclCommAbort(m->nccl);
}

static mt_comm *nccl_split(mt_comm *c, int color, int key, const char *name);
static void nccl_free(mt_comm *c);

static const comm_ops nccl_ops = {
    .all_reduce = nccl_all_reduce,
    .broadcast = nccl_broadcast,
    .reduce_scatter = nccl_reduce_scatter,
    .all_gather = nccl_all_gather,
    .all_to_all_v = nccl_all_to_all_v,
    .wait = nccl_wait,
    .sync = nccl_sync,
    .split = nccl_split,
    .free = nccl_free,
};

// A communicator over the ranks of `host` (already made), on the device and stream of `be`.
static mt_comm *nccl_new(mt_comm *host, mt_backend *be, const char *name, const mt_comm *parent) {
    mt_comm *c = (mt_comm *)mt_xcalloc(1, sizeof *c);
    nccl_impl *m = (nccl_impl *)mt_xcalloc(1, sizeof *m);
    c->impl = m;
    c->be = be;
    comm_setup(c, &nccl_ops, MT_COMM_NCCL, host->rank, host->size, name, parent);
    c->host = host;
    c->world_rank = host->world_rank;
    m->self = c;
    pthread_mutex_init(&m->mu, NULL);
    COMM_CUDA(c, cudaGetDevice(&m->device));
    m->compute = (cudaStream_t)mt_cuda_backend_stream(be);
    COMM_CUDA(c, cudaStreamCreateWithFlags(&m->stream, cudaStreamNonBlocking));
    COMM_CUDA(c, cudaEventCreateWithFlags(&m->ready, cudaEventDisableTiming));
    COMM_CUDA(c, cudaEventCreateWithFlags(&m->tail, cudaEventDisableTiming));
    for (int i = 0; i < NCCL_PENDING; i++)
        COMM_CUDA(c, cudaEventCreateWithFlags(&m->ring[i].ev, cudaEventDisableTiming));

    ncclUniqueId id;
    memset(&id, 0, sizeof id);
    if (host->rank == 0) MT_CHECK_NCCL(ncclGetUniqueId(&id));
    mt_comm_host_broadcast(host, &id, sizeof id, MT_COMM_U8, 0);
    c->op = "ncclCommInitRankConfig";
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    config.blocking = 0;  // every call returns at once; settle() waits with the deadline
    NCCL_CALL(c, ncclCommInitRankConfig(&m->nccl, c->size, id, c->rank, &config));
    c->op = NULL;

    pthread_mutex_lock(&live_mu);
    m->next = live;
    live = m;
    pthread_mutex_unlock(&live_mu);
    comm_set_abort_hooks(abort_all, NULL);
    if (pthread_create(&m->watchdog, NULL, watchdog_main, c) != 0)
        comm_fail(c, MT_EXIT_ERROR, "cannot start the NCCL watchdog thread");
    m->has_watchdog = 1;
    return c;
}

static mt_comm *nccl_split(mt_comm *c, int color, int key, const char *name) {
    mt_comm *h = mt_comm_split(c->host, color, key, name);
    return nccl_new(h, c->be, name, c);
}

static void nccl_free(mt_comm *c) {
    nccl_impl *m = impl_of(c);
    quiesce(c, m);
    if (m->has_watchdog) {
        __atomic_store_n(&m->stop, 1, __ATOMIC_RELEASE);
        pthread_join(m->watchdog, NULL);
    }
    pthread_mutex_lock(&live_mu);
    for (nccl_impl **p = &live; *p; p = &(*p)->next)
        if (*p == m) {
            *p = m->next;
            break;
        }
    pthread_mutex_unlock(&live_mu);
    c->op = "ncclCommFinalize";
    NCCL_CALL(c, ncclCommFinalize(m->nccl));
    MT_CHECK_NCCL(ncclCommDestroy(m->nccl));
    m->nccl = NULL;
    for (int i = 0; i < NCCL_PENDING; i++) cudaEventDestroy(m->ring[i].ev);
    cudaEventDestroy(m->ready);
    cudaEventDestroy(m->tail);
    cudaStreamDestroy(m->stream);
    if (m->scratch) mt_backend_release(c->be, MT_MEM_COMM, m->scratch_bytes, m->scratch);
    pthread_mutex_destroy(&m->mu);
    mt_comm_free(c->host);
    free(m);
}

extern "C" mt_comm *comm_nccl_world(mt_backend *be) {
    if (!be || be->ops->kind != MT_BACKEND_CUDA) {
        mt_error_set("the nccl communicator needs a CUDA backend (it works on device memory)");
        return NULL;
    }
    // The host side: MPI when launched (bootstrap and host helpers), else one process.
    mt_comm *host = mt_comm_launched() ? comm_mpi_world(NULL) : comm_single_new(NULL);
    if (!host) return NULL;
    return nccl_new(host, be, "world", NULL);
}
