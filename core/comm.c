// core/comm.c — the communicator interface: kind selection, argument checks, the cross-rank
// call check, the job-wide failure path, and the host helpers shared by every implementation.
#include "core/comm.h"

#include <errno.h>
#include <math.h>
#include <sched.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <string.h>
#include <time.h>

#include "core/comm_internal.h"

// ---------------------------------------------------------------------------------------------
// Names, types

static const struct {
    const char *name;
    size_t size;
} type_info[MT_COMM_TYPE_COUNT] = {
    [MT_COMM_F32] = {"f32", 4}, [MT_COMM_F64] = {"f64", 8}, [MT_COMM_BF16] = {"bf16", 2},
    [MT_COMM_F16] = {"f16", 2}, [MT_COMM_I32] = {"i32", 4}, [MT_COMM_I64] = {"i64", 8},
    [MT_COMM_U8] = {"u8", 1},
};
static const char *const op_names[MT_COMM_OP_COUNT] = {"sum", "max", "min"};
static const char *const kind_names[] = {"auto", "single", "mpi", "nccl"};

size_t mt_comm_type_size(mt_comm_type t) {
    return (unsigned)t < MT_COMM_TYPE_COUNT ? type_info[t].size : 0;
}
const char *mt_comm_type_name(mt_comm_type t) {
    return (unsigned)t < MT_COMM_TYPE_COUNT ? type_info[t].name : "?";
}
const char *mt_comm_kind_name(mt_comm_kind kind) {
    return (unsigned)kind < MT_ARRAY_LEN(kind_names) ? kind_names[kind] : "?";
}

int mt_comm_kind_parse(const char *s, mt_comm_kind *out) {
    for (size_t i = 0; i < MT_ARRAY_LEN(kind_names); i++)
        if (s && strcmp(s, kind_names[i]) == 0) {
            *out = (mt_comm_kind)i;
            return 0;
        }
    mt_error_set("unknown communicator '%s' (expected auto, single, mpi or nccl)", s ? s : "");
    return -1;
}

int mt_comm_type_of(mt_dtype d, mt_comm_type *out) {
    switch (d) {
    case MT_F32: *out = MT_COMM_F32; return 0;
    case MT_BF16: *out = MT_COMM_BF16; return 0;
    case MT_F16: *out = MT_COMM_F16; return 0;
    case MT_U8: *out = MT_COMM_U8; return 0;
    case MT_I32: *out = MT_COMM_I32; return 0;
    case MT_I64: *out = MT_COMM_I64; return 0;
    default:
        mt_error_set("no collective type for dtype %s (move packed data as u8 bytes)",
                     mt_dtype_name(d));
        return -1;
    }
}

// ---------------------------------------------------------------------------------------------
// Launch detection

static int env_set(const char *name) {
    const char *v = getenv(name);
    return v && *v;
}

int mt_comm_launched(void) {
    return env_set("OMPI_COMM_WORLD_SIZE") || env_set("PMIX_RANK") || env_set("PMI_SIZE") ||
           env_set("PMI_RANK") || env_set("SLURM_STEP_NUM_TASKS");
}

int mt_comm_local_rank(void) {
    static const char *const vars[] = {"OMPI_COMM_WORLD_LOCAL_RANK", "MPI_LOCALRANKID",
                                       "SLURM_LOCALID", "PMI_LOCAL_RANK"};
    for (size_t i = 0; i < MT_ARRAY_LEN(vars); i++) {
        const char *v = getenv(vars[i]);
        if (v && *v) return atoi(v);
    }
    return 0;
}

// ---------------------------------------------------------------------------------------------
// Failure

static void (*hook_nccl_abort_all)(void);
static void (*hook_mpi_abort)(int code);
static atomic_int failing;

void comm_set_abort_hooks(void (*nccl_abort_all)(void), void (*mpi_abort)(int code)) {
    if (nccl_abort_all) hook_nccl_abort_all = nccl_abort_all;
    if (mpi_abort) hook_mpi_abort = mpi_abort;
}

static MT_NORETURN void abort_job(int code) {
    fflush(stdout);
    fflush(stderr);
    if (hook_nccl_abort_all) hook_nccl_abort_all();
    if (hook_mpi_abort) hook_mpi_abort(code);  // does not return
    exit(code);
}

static void vfail_print(const mt_comm *c, const char *fmt, va_list ap) {
    fflush(stdout);
    if (c)
        fprintf(stderr, "moetrain: fatal: comm '%s' rank %d/%d (world rank %d): ", c->name,
                c->rank, c->size, c->world_rank);
    else
        fprintf(stderr, "moetrain: fatal: comm: ");
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    fflush(stderr);
}

// A second failure (the watchdog and the main thread at once) waits for the first to end the
// process rather than printing over it.
static MT_NORETURN void vfail(const mt_comm *c, int code, const char *fmt, va_list ap) {
    if (atomic_fetch_add(&failing, 1) != 0)
        for (;;) {
            struct timespec ts = {1, 0};
            nanosleep(&ts, NULL);
        }
    vfail_print(c, fmt, ap);
    abort_job(code);
}

void comm_fail(const mt_comm *c, int code, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vfail(c, code, fmt, ap);
}

void mt_comm_abort(mt_comm *c, int code, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vfail(c, code, fmt, ap);
}

void comm_fail_deadline(const mt_comm *c, double waited_s) {
    char last[96];
    if (c->done_op)
        snprintf(last, sizeof last, "%s #%llu", c->done_op, (unsigned long long)c->done_seq);
    else
        snprintf(last, sizeof last, "none");
    comm_fail(c, MT_EXIT_ERROR,
              "collective %s #%llu (%zu × %s) did not complete within %.1f s "
              "(deadline %g s: MT_COMM_TIMEOUT or mt_comm_set_timeout); last completed on this "
              "comm: %s. Some rank of '%s' has not reached it (stalled, dead, or calling a "
              "different collective; MT_COMM_CHECK=1 tells which). Aborting the job.",
              c->op ? c->op : "?", (unsigned long long)c->seq, c->op_count,
              mt_comm_type_name(c->op_type), waited_s, c->timeout_s, last, c->name);
}

double comm_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

void comm_backoff(unsigned *round) {
    unsigned r = (*round)++;
    if (r < 256) return;  // spin: most small collectives finish in microseconds
    if (r < 4096) {       // then yield, so that a peer sharing this core can run
        sched_yield();
        return;
    }
    long ns = 1000L << MT_MIN(r - 4096, 8u);  // then sleep: 1 µs doubling to 200 µs
    if (ns > 200000) ns = 200000;
    struct timespec ts = {0, ns};
    nanosleep(&ts, NULL);
}

// ---------------------------------------------------------------------------------------------
// Fold (fixed-order reduction on the host)

#define FOLD_LOOP(T, A, LOAD, STORE)                                                              \
    do {                                                                                       \
        const T *r_ = (const T *)rows;                                                         \
        T *d_ = (T *)dst;                                                                      \
        for (size_t i = 0; i < n; i++) {                                                       \
            A acc = LOAD(r_[i]);                                                               \
            for (int q = 1; q < nrows; q++) {                                                  \
                A x = LOAD(r_[(size_t)q * stride + i]);                          \
                if (op == MT_COMM_SUM) acc = acc + x;                                          \
                else if (op == MT_COMM_MAX) acc = x > acc ? x : acc;                           \
                else acc = x < acc ? x : acc;                                                  \
            }                                                                                  \
            d_[i] = STORE(acc);                                                                \
        }                                                                                      \
    } while (0)
#define ID(x) (x)

void comm_fold(void *dst, const void *rows, int nrows, size_t n, size_t stride, mt_comm_type t,
               mt_comm_op op) {
    switch (t) {
    case MT_COMM_F32: FOLD_LOOP(float, float, ID, ID); break;
    case MT_COMM_F64: FOLD_LOOP(double, double, ID, ID); break;
    case MT_COMM_I32: FOLD_LOOP(int32_t, int32_t, ID, ID); break;
    case MT_COMM_I64: FOLD_LOOP(int64_t, int64_t, ID, ID); break;
    case MT_COMM_U8: FOLD_LOOP(uint8_t, uint8_t, ID, ID); break;
    case MT_COMM_BF16: FOLD_LOOP(uint16_t, float, mt_bf16_to_f32, mt_f32_to_bf16); break;
    case MT_COMM_F16: FOLD_LOOP(uint16_t, float, mt_f16_to_f32, mt_f32_to_f16); break;
    default: break;
    }
}

void *comm_host_scratch(const mt_comm *c, size_t bytes) {
    if (c->be && c->be->ops->kind == MT_BACKEND_CPU) {
        void *p = NULL;
        if (mt_backend_alloc(c->be, MT_MEM_COMM, bytes, &p) != 0)
            comm_fail(c, MT_EXIT_OOM, "scratch of %s: %s", c->op ? c->op : "?", mt_error_get());
        return p;
    }
    return mt_xmalloc(bytes);
}

void comm_host_scratch_free(const mt_comm *c, void *p, size_t bytes) {
    if (c->be && c->be->ops->kind == MT_BACKEND_CPU)
        mt_backend_release(c->be, MT_MEM_COMM, bytes, p);
    else
        free(p);
}

// ---------------------------------------------------------------------------------------------
// Lifetime

// Defaults of a world communicator, read from the environment by mt_comm_init before the
// implementation's constructor runs (its bootstrap already needs the deadline).
static double default_timeout_s = 600;
static int default_check = 0;

void comm_setup(mt_comm *c, const comm_ops *ops, mt_comm_kind kind, int rank, int size,
                const char *name, const mt_comm *parent) {
    c->ops = ops;
    c->kind = kind;
    c->rank = rank;
    c->size = size;
    snprintf(c->name, sizeof c->name, "%s", name && *name ? name : parent ? "split" : "world");
    c->host = c;
    c->world_rank = parent ? parent->world_rank : rank;
    c->be = parent ? parent->be : c->be;
    c->timeout_s = parent ? parent->timeout_s : default_timeout_s;
    c->check = parent ? parent->check : default_check;
}

static int read_env(void) {
    const char *t = getenv("MT_COMM_TIMEOUT");
    if (t && *t) {
        char *end;
        errno = 0;
        double v = strtod(t, &end);
        if (errno || *end || !(v >= 0) || !isfinite(v)) {
            mt_error_set("MT_COMM_TIMEOUT='%s' is not a number of seconds >= 0 (0 disables the "
                         "deadline)", t);
            return -1;
        }
        default_timeout_s = v;
    }
    const char *k = getenv("MT_COMM_CHECK");
    default_check = k && *k && strcmp(k, "0") != 0;
    return 0;
}

mt_comm *mt_comm_init(mt_comm_kind kind, mt_backend *be) {
    if (read_env() != 0) return NULL;
    if (kind == MT_COMM_AUTO) {
        const char *e = getenv("MT_COMM");
        if (e && *e && mt_comm_kind_parse(e, &kind) != 0) {
            mt_error_prefix("MT_COMM");
            return NULL;
        }
    }
    int cuda = be && be->ops->kind == MT_BACKEND_CUDA;
    if (kind == MT_COMM_AUTO)
        kind = cuda ? MT_COMM_NCCL : mt_comm_launched() ? MT_COMM_MPI : MT_COMM_SINGLE;
    if (cuda && kind != MT_COMM_NCCL) {
        mt_error_set("the %s communicator works on host memory; a CUDA backend needs nccl",
                     mt_comm_kind_name(kind));
        return NULL;
    }
    mt_comm *c = NULL;
    switch (kind) {
    case MT_COMM_SINGLE: c = comm_single_new(be); break;
    case MT_COMM_MPI: c = comm_mpi_world(be); break;
    case MT_COMM_NCCL:
#ifdef MT_CUDA
        c = comm_nccl_world(be);
#else
        mt_error_set("the nccl communicator needs a CUDA build (make CUDA=1)");
#endif
        break;
    default: mt_error_set("unknown communicator kind %d", (int)kind); break;
    }
    if (!c) return NULL;
    mt_log_set_world(c->world_rank, c->size);
    return c;
}

void mt_comm_free(mt_comm *c) {
    if (!c) return;
    c->ops->free(c);
    free(c);
}

mt_comm *mt_comm_split(mt_comm *c, int color, int key, const char *name) {
    if (!c) mt_comm_abort(NULL, MT_EXIT_ERROR, "mt_comm_split on a NULL communicator");
    if (color < 0) comm_fail(c, MT_EXIT_ERROR, "split '%s': color %d < 0", name ? name : "", color);
    c->op = "split";
    c->op_count = 0;
    c->op_type = MT_COMM_I32;
    mt_comm *s = c->ops->split(c, color, key, name);
    return s;
}

int mt_comm_grid(mt_comm *world, int ep, mt_comm **ep_comm, mt_comm **dp_comm) {
    *ep_comm = *dp_comm = NULL;
    if (ep < 1 || world->size % ep != 0) {
        mt_error_set("--ep %d does not divide the %d ranks of '%s' (EP × DP must equal the world "
                     "size)", ep, world->size, world->name);
        return -1;
    }
    *ep_comm = mt_comm_split(world, world->rank / ep, world->rank, "ep");
    *dp_comm = mt_comm_split(world, world->rank % ep, world->rank, "dp");
    return 0;
}

int mt_comm_rank(const mt_comm *c) { return c->rank; }
int mt_comm_size(const mt_comm *c) { return c->size; }
int mt_comm_world_rank(const mt_comm *c) { return c->world_rank; }
mt_comm_kind mt_comm_kind_of(const mt_comm *c) { return c->kind; }
const char *mt_comm_name(const mt_comm *c) { return c->name; }
double mt_comm_timeout(const mt_comm *c) { return c->timeout_s; }

void mt_comm_set_timeout(mt_comm *c, double seconds) {
    if (!(seconds >= 0) || !isfinite(seconds)) seconds = 0;
    c->timeout_s = seconds;
    if (c->host != c) c->host->timeout_s = seconds;
}

// ---------------------------------------------------------------------------------------------
// Calls: checks, progress, and the optional cross-rank agreement check

enum { OP_ALL_REDUCE = 1, OP_BROADCAST, OP_REDUCE_SCATTER, OP_ALL_GATHER, OP_ALL_TO_ALL_V };
static const char *const call_names[] = {"?", "all_reduce", "broadcast", "reduce_scatter",
                                         "all_gather", "all_to_all_v"};

static void begin(mt_comm *c, const char *op, size_t count, mt_comm_type t) {
    c->seq++;
    c->op = op;
    c->op_count = count;
    c->op_type = t;
}

// single and mpi calls have completed when they return; nccl's complete on the stream.
static void end(mt_comm *c) {
    if (!c->ops->sync) {
        c->done_seq = c->seq;
        c->done_op = c->op;
    }
}

static void check_args(mt_comm *c, const char *op, const void *p, size_t count, mt_comm_type t,
                       int flags) {
    if (!c) mt_comm_abort(NULL, MT_EXIT_ERROR, "%s on a NULL communicator", op);
    if ((unsigned)t >= MT_COMM_TYPE_COUNT)
        comm_fail(c, MT_EXIT_ERROR, "%s: bad type %d", op, (int)t);
    if (flags & ~(MT_COMM_EXACT | MT_COMM_ASYNC))
        comm_fail(c, MT_EXIT_ERROR, "%s: unknown flags 0x%x", op, (unsigned)flags);
    if (count && !p) comm_fail(c, MT_EXIT_ERROR, "%s: NULL buffer for %zu elements", op, count);
}

// MT_COMM_CHECK: every rank states its call; all must agree or the job aborts naming them.
static void check_same_call(mt_comm *c, int id, size_t count, mt_comm_type t, int64_t arg,
                            int flags) {
    if (!c->check || c->size == 1) return;
    int64_t mine[5] = {id, (int64_t)count, t, arg, flags & MT_COMM_EXACT};
    int64_t *all = mt_xmalloc(sizeof mine * (size_t)c->size);
    mt_comm *h = c->host;
    h->ops->all_gather(h, mine, all, 5, MT_COMM_I64, 0);
    int bad = 0;
    for (int r = 0; r < c->size; r++)
        if (memcmp(all + 5 * r, all, sizeof mine) != 0) bad = 1;
    if (bad) {
        char msg[2048];
        size_t len = 0;
        for (int r = 0; r < c->size && len < sizeof msg - 128; r++) {
            int64_t *a = all + 5 * r;
            char arg[32];
            if (a[0] == OP_ALL_REDUCE || a[0] == OP_REDUCE_SCATTER)
                snprintf(arg, sizeof arg, " %s",
                         a[3] >= 0 && a[3] < MT_COMM_OP_COUNT ? op_names[a[3]] : "?");
            else if (a[0] == OP_BROADCAST)
                snprintf(arg, sizeof arg, " root %lld", (long long)a[3]);
            else
                arg[0] = 0;
            len += (size_t)snprintf(msg + len, sizeof msg - len, "%srank %d: %s of %lld %s%s%s",
                                    r ? "; " : "", r, call_names[a[0] >= 1 && a[0] <= 5 ? a[0] : 0],
                                    (long long)a[1], mt_comm_type_name((mt_comm_type)a[2]), arg,
                                    a[4] ? " exact" : "");
        }
        comm_fail(c, MT_EXIT_ERROR, "MT_COMM_CHECK: ranks disagree on collective #%llu: %s",
                  (unsigned long long)c->seq, msg);
    }
    free(all);
}

void mt_comm_all_reduce(mt_comm *c, void *buf, size_t count, mt_comm_type type, mt_comm_op op,
                        int flags) {
    check_args(c, "all_reduce", buf, count, type, flags);
    if ((unsigned)op >= MT_COMM_OP_COUNT)
        comm_fail(c, MT_EXIT_ERROR, "all_reduce: bad op %d", (int)op);
    begin(c, "all_reduce", count, type);
    check_same_call(c, OP_ALL_REDUCE, count, type, op, flags);
    if (count) c->ops->all_reduce(c, buf, count, type, op, flags);
    end(c);
}

void mt_comm_broadcast(mt_comm *c, void *buf, size_t count, mt_comm_type type, int root,
                       int flags) {
    check_args(c, "broadcast", buf, count, type, flags);
    if (root < 0 || root >= c->size)
        comm_fail(c, MT_EXIT_ERROR, "broadcast: root %d outside 0..%d", root, c->size - 1);
    begin(c, "broadcast", count, type);
    check_same_call(c, OP_BROADCAST, count, type, root, flags);
    if (count) c->ops->broadcast(c, buf, count, type, root, flags);
    end(c);
}

void mt_comm_reduce_scatter(mt_comm *c, const void *send, void *recv, size_t recv_count,
                            mt_comm_type type, mt_comm_op op, int flags) {
    check_args(c, "reduce_scatter", send, recv_count, type, flags);
    check_args(c, "reduce_scatter", recv, recv_count, type, flags);
    if ((unsigned)op >= MT_COMM_OP_COUNT)
        comm_fail(c, MT_EXIT_ERROR, "reduce_scatter: bad op %d", (int)op);
    begin(c, "reduce_scatter", recv_count, type);
    check_same_call(c, OP_REDUCE_SCATTER, recv_count, type, op, flags);
    if (recv_count) c->ops->reduce_scatter(c, send, recv, recv_count, type, op, flags);
    end(c);
}

void mt_comm_all_gather(mt_comm *c, const void *send, void *recv, size_t send_count,
                        mt_comm_type type, int flags) {
    check_args(c, "all_gather", send, send_count, type, flags);
    check_args(c, "all_gather", recv, send_count, type, flags);
    begin(c, "all_gather", send_count, type);
    check_same_call(c, OP_ALL_GATHER, send_count, type, 0, flags);
    if (send_count) c->ops->all_gather(c, send, recv, send_count, type, flags);
    end(c);
}

void mt_comm_all_to_all_v(mt_comm *c, const void *send, const int64_t *send_rows, void *recv,
                          const int64_t *recv_rows, size_t row_elems, mt_comm_type type,
                          int flags) {
    check_args(c, "all_to_all_v", send_rows, 1, type, flags);
    check_args(c, "all_to_all_v", recv_rows, 1, type, flags);
    int64_t ns = 0, nr = 0;
    for (int p = 0; p < c->size; p++) {
        if (send_rows[p] < 0 || recv_rows[p] < 0)
            comm_fail(c, MT_EXIT_ERROR, "all_to_all_v: negative row count for peer %d (send %lld, "
                      "recv %lld)", p, (long long)send_rows[p], (long long)recv_rows[p]);
        ns += send_rows[p];
        nr += recv_rows[p];
    }
    check_args(c, "all_to_all_v", send, (size_t)ns * row_elems, type, flags);
    check_args(c, "all_to_all_v", recv, (size_t)nr * row_elems, type, flags);
    begin(c, "all_to_all_v", (size_t)ns * row_elems, type);
    check_same_call(c, OP_ALL_TO_ALL_V, row_elems, type, 0, flags);
    if (c->check && c->size > 1) {  // what each peer sends must be what this rank expects
        mt_comm *h = c->host;
        int64_t *got = mt_xmalloc(sizeof *got * 2 * (size_t)c->size), *ones = got + c->size;
        for (int p = 0; p < c->size; p++) ones[p] = 1;
        h->ops->all_to_all_v(h, send_rows, ones, got, ones, 1, MT_COMM_I64, 0);
        for (int p = 0; p < c->size; p++)
            if (got[p] != recv_rows[p])
                comm_fail(c, MT_EXIT_ERROR, "MT_COMM_CHECK: all_to_all_v #%llu: rank %d sends %lld "
                          "rows here but this rank expects %lld", (unsigned long long)c->seq, p,
                          (long long)got[p], (long long)recv_rows[p]);
        free(got);
    }
    if (row_elems)
        c->ops->all_to_all_v(c, send, send_rows, recv, recv_rows, row_elems, type, flags);
    end(c);
}

void mt_comm_wait(mt_comm *c) {
    if (c->ops->wait) c->ops->wait(c);
}

void mt_comm_sync(mt_comm *c) {
    if (c->ops->sync) c->ops->sync(c);
}

// ---------------------------------------------------------------------------------------------
// Host helpers: run on c->host (c itself for single and mpi; nccl's MPI comm)

void mt_comm_host_all_reduce(mt_comm *c, void *buf, size_t count, mt_comm_type type,
                             mt_comm_op op, int flags) {
    mt_comm_all_reduce(c->host, buf, count, type, op, flags & ~MT_COMM_ASYNC);
}

void mt_comm_host_broadcast(mt_comm *c, void *buf, size_t count, mt_comm_type type, int root) {
    mt_comm_broadcast(c->host, buf, count, type, root, 0);
}

void mt_comm_all_to_all_counts(mt_comm *c, const int64_t *send, int64_t *recv) {
    mt_comm *h = c->host;
    int64_t *ones = mt_xmalloc(sizeof *ones * (size_t)h->size);
    for (int p = 0; p < h->size; p++) ones[p] = 1;
    mt_comm_all_to_all_v(h, send, ones, recv, ones, 1, MT_COMM_I64, 0);
    free(ones);
}

int mt_comm_any(mt_comm *c, int flag) {
    int32_t v = flag != 0;
    mt_comm_all_reduce(c->host, &v, 1, MT_COMM_I32, MT_COMM_MAX, 0);
    return v != 0;
}

double mt_comm_sum_f64(mt_comm *c, double x) {
    mt_comm_all_reduce(c->host, &x, 1, MT_COMM_F64, MT_COMM_SUM, MT_COMM_EXACT);
    return x;
}

// An all-reduce completes on no rank before every rank has entered it.
void mt_comm_barrier(mt_comm *c) {
    int32_t v = 0;
    mt_comm_all_reduce(c->host, &v, 1, MT_COMM_I32, MT_COMM_MAX, 0);
}

int mt_comm_check_same(mt_comm *c, const char *what, uint64_t hash) {
    mt_comm *h = c->host;
    int n = h->size;
    uint64_t *all = mt_xmalloc(sizeof *all * (size_t)n);
    mt_comm_all_gather(h, &hash, all, 1, MT_COMM_I64, 0);
    // The reference is the value most ranks hold; rank 0's on a tie.
    int best = 0, best_votes = 0;
    for (int r = 0; r < n; r++) {
        int votes = 0;
        for (int q = 0; q < n; q++) votes += all[q] == all[r];
        if (votes > best_votes) best = r, best_votes = votes;
    }
    uint64_t ref = all[best];
    if (best_votes == n) {
        free(all);
        return 0;
    }
    char list[1024];
    size_t len = 0;
    int shown = 0;
    for (int r = 0; r < n; r++) {
        if (all[r] == ref) continue;
        if (shown++ == 16 || len > sizeof list - 64) {
            len += (size_t)snprintf(list + len, sizeof list - len, ", ...");
            break;
        }
        len += (size_t)snprintf(list + len, sizeof list - len, "%srank %d (%016llx)",
                                shown > 1 ? ", " : "", r, (unsigned long long)all[r]);
    }
    mt_error_set("%s differs across the ranks of '%s': %d of %d rank(s) have %016llx, but %s "
                 "differ%s; every rank must run the same %s", what, h->name, best_votes, n,
                 (unsigned long long)ref, list, n - best_votes == 1 ? "s" : "", what);
    free(all);
    return -1;
}
