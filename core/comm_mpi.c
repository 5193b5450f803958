// core/comm_mpi.c — the MPI communicator (Open MPI), on host buffers.
//
// Every collective is the non-blocking MPI call followed by MPI_Test polling against the comm's
// deadline, so that a stalled or dead peer ends in a message and MPI_Abort, never a hang. Errors
// come back as codes (MPI_ERRORS_RETURN) and go through comm_fail. MPI counts are ints: the
// reductions and broadcasts are cut into pieces of 2^30 elements; all_gather, reduce_scatter and
// all_to_all_v refuse a count that does not fit (split such a call). Fixed-order reductions
// (MT_COMM_EXACT, and every bf16/f16 reduction) are an all-to-all of parts, a fold in rank order
// by the part's owner, and an all-gather of the parts.
//
// Built only with -DMT_MPI (the Makefile adds it when it finds mpicc); otherwise asking for an
// MPI communicator is an error that says how to get one.
#include <string.h>

#include "core/comm_internal.h"

#ifdef MT_MPI
#include <limits.h>
#include <mpi.h>

enum { MPI_PIECE = 1 << 30 };  // elements per piece of a long reduction or broadcast

typedef struct {
    MPI_Comm comm;
    int world;  // the world communicator: freeing it finalises MPI
} mpi_impl;

static int we_initialised;  // mt_comm called MPI_Init, so it calls MPI_Finalize
static int world_live;      // the exit guard is armed while the world communicator lives
static int guard_installed;
static int guard_world_rank;

static MPI_Comm comm_of(const mt_comm *c) { return ((const mpi_impl *)c->impl)->comm; }

static void mpi_check(const mt_comm *c, int err, const char *call) {
    if (err == MPI_SUCCESS) return;
    char msg[MPI_MAX_ERROR_STRING + 1];
    int len = 0;
    if (MPI_Error_string(err, msg, &len) != MPI_SUCCESS) len = 0;
    msg[len] = 0;
    comm_fail(c, MT_EXIT_ERROR, "%s (in %s #%llu) failed: %s", call, c->op ? c->op : "?",
              (unsigned long long)c->seq, len ? msg : "unknown MPI error");
}

// Polls `req` until it completes or the comm's deadline passes.
static void mpi_wait(const mt_comm *c, MPI_Request *req, const char *call) {
    double t0 = comm_now();
    unsigned round = 0;
    for (;;) {
        int done = 0;
        mpi_check(c, MPI_Test(req, &done, MPI_STATUS_IGNORE), call);
        if (done) return;
        comm_backoff(&round);
        if (c->timeout_s > 0 && round > 256) {
            double waited = comm_now() - t0;
            if (waited > c->timeout_s) comm_fail_deadline(c, waited);
        }
    }
}

static MPI_Datatype mpi_type(mt_comm_type t) {
    switch (t) {
    case MT_COMM_F32: return MPI_FLOAT;
    case MT_COMM_F64: return MPI_DOUBLE;
    case MT_COMM_I32: return MPI_INT32_T;
    case MT_COMM_I64: return MPI_INT64_T;
    case MT_COMM_U8: return MPI_UINT8_T;
    default: return MPI_UINT16_T;  // bf16, f16: moved as 16-bit words, reduced by comm_fold
    }
}

static int mpi_can_reduce(mt_comm_type t) { return t != MT_COMM_BF16 && t != MT_COMM_F16; }

static MPI_Op mpi_op(mt_comm_op op) {
    return op == MT_COMM_SUM ? MPI_SUM : op == MT_COMM_MAX ? MPI_MAX : MPI_MIN;
}

static int fixed_order(mt_comm_type t, mt_comm_op op, int flags) {
    return !mpi_can_reduce(t) || ((flags & MT_COMM_EXACT) && op == MT_COMM_SUM);
}

static void need_int(const mt_comm *c, size_t n, const char *what) {
    if (n > (size_t)INT_MAX)
        comm_fail(c, MT_EXIT_ERROR, "%s of %zu exceeds MPI's int counts; split the call", what, n);
}

static void ranges_disjoint(const mt_comm *c, const void *a, size_t abytes, const void *b,
                            size_t bbytes) {
    const char *x = a, *y = b;
    if (x < y + bbytes && y < x + abytes)
        comm_fail(c, MT_EXIT_ERROR, "%s: send and receive buffers overlap (only the in-place "
                  "layout of comm.h is allowed)", c->op);
}

// ---------------------------------------------------------------------------------------------
// Collectives

// Fixed-order all-reduce of k <= MPI_PIECE elements: part r of buf is folded by rank r.
static void exact_all_reduce(mt_comm *c, char *buf, size_t k, mt_comm_type t, mt_comm_op op) {
    int n = c->size, me = c->rank;
    size_t es = mt_comm_type_size(t), mine = comm_part_len(k, n, me);
    int *cnt = mt_xmalloc(sizeof(int) * 4 * (size_t)n), *off = cnt + n, *rcnt = off + n,
        *roff = rcnt + n;
    for (int q = 0; q < n; q++) {
        cnt[q] = (int)comm_part_len(k, n, q);
        off[q] = (int)comm_part_off(k, n, q);
        rcnt[q] = (int)mine;
        roff[q] = q * (int)mine;
    }
    size_t sbytes = (size_t)n * mine * es;
    char *scratch = sbytes ? comm_host_scratch(c, sbytes) : NULL;
    MPI_Datatype dt = mpi_type(t);
    MPI_Request req;
    mpi_check(c, MPI_Ialltoallv(buf, cnt, off, dt, scratch, rcnt, roff, dt, comm_of(c), &req),
              "MPI_Ialltoallv");
    mpi_wait(c, &req, "MPI_Ialltoallv");
    if (mine) comm_fold(buf + comm_part_off(k, n, me) * es, scratch, n, mine, mine, t, op);
    mpi_check(c, MPI_Iallgatherv(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, buf, cnt, off, dt, comm_of(c),
                                 &req),
              "MPI_Iallgatherv");
    mpi_wait(c, &req, "MPI_Iallgatherv");
    if (scratch) comm_host_scratch_free(c, scratch, sbytes);
    free(cnt);
}

static void mpi_all_reduce(mt_comm *c, void *buf, size_t n, mt_comm_type t, mt_comm_op op,
                           int flags) {
    size_t es = mt_comm_type_size(t);
    for (size_t at = 0; at < n; at += MPI_PIECE) {
        size_t k = MT_MIN((size_t)MPI_PIECE, n - at);
        char *p = (char *)buf + at * es;
        if (fixed_order(t, op, flags)) {
            exact_all_reduce(c, p, k, t, op);
            continue;
        }
        MPI_Request req;
        mpi_check(c, MPI_Iallreduce(MPI_IN_PLACE, p, (int)k, mpi_type(t), mpi_op(op), comm_of(c),
                                    &req),
                  "MPI_Iallreduce");
        mpi_wait(c, &req, "MPI_Iallreduce");
    }
}

static void mpi_broadcast(mt_comm *c, void *buf, size_t n, mt_comm_type t, int root, int flags) {
    (void)flags;
    size_t es = mt_comm_type_size(t);
    for (size_t at = 0; at < n; at += MPI_PIECE) {
        size_t k = MT_MIN((size_t)MPI_PIECE, n - at);
        MPI_Request req;
        mpi_check(c, MPI_Ibcast((char *)buf + at * es, (int)k, mpi_type(t), root, comm_of(c), &req),
                  "MPI_Ibcast");
        mpi_wait(c, &req, "MPI_Ibcast");
    }
}

static void mpi_reduce_scatter(mt_comm *c, const void *send, void *recv, size_t n,
                               mt_comm_type t, mt_comm_op op, int flags) {
    need_int(c, n, "reduce_scatter count");
    size_t es = mt_comm_type_size(t), size = (size_t)c->size;
    int in_place = (const char *)recv == (const char *)send + (size_t)c->rank * n * es;
    if (!in_place) ranges_disjoint(c, send, size * n * es, recv, n * es);
    MPI_Request req;
    if (fixed_order(t, op, flags)) {
        // Chunk q of every rank to rank q, then a fold in rank order.
        size_t sbytes = size * n * es;
        char *scratch = comm_host_scratch(c, sbytes);
        mpi_check(c, MPI_Ialltoall(send, (int)n, mpi_type(t), scratch, (int)n, mpi_type(t),
                                   comm_of(c), &req),
                  "MPI_Ialltoall");
        mpi_wait(c, &req, "MPI_Ialltoall");
        comm_fold(recv, scratch, c->size, n, n, t, op);
        comm_host_scratch_free(c, scratch, sbytes);
    } else if (in_place) {
        // MPI's in-place form takes the input from the receive buffer and leaves the result at
        // its start; ours leaves it at chunk `rank`.
        mpi_check(c, MPI_Ireduce_scatter_block(MPI_IN_PLACE, (void *)send, (int)n, mpi_type(t),
                                               mpi_op(op), comm_of(c), &req),
                  "MPI_Ireduce_scatter_block");
        mpi_wait(c, &req, "MPI_Ireduce_scatter_block");
        if (c->rank) memmove(recv, send, n * es);
    } else {
        mpi_check(c, MPI_Ireduce_scatter_block(send, recv, (int)n, mpi_type(t), mpi_op(op),
                                               comm_of(c), &req),
                  "MPI_Ireduce_scatter_block");
        mpi_wait(c, &req, "MPI_Ireduce_scatter_block");
    }
}

static void mpi_all_gather(mt_comm *c, const void *send, void *recv, size_t n, mt_comm_type t,
                           int flags) {
    (void)flags;
    need_int(c, n, "all_gather count");
    size_t es = mt_comm_type_size(t);
    MPI_Request req;
    if ((const char *)send == (const char *)recv + (size_t)c->rank * n * es) {
        mpi_check(c, MPI_Iallgather(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, recv, (int)n, mpi_type(t),
                                    comm_of(c), &req),
                  "MPI_Iallgather");
    } else {
        ranges_disjoint(c, send, n * es, recv, (size_t)c->size * n * es);
        mpi_check(c, MPI_Iallgather(send, (int)n, mpi_type(t), recv, (int)n, mpi_type(t),
                                    comm_of(c), &req),
                  "MPI_Iallgather");
    }
    mpi_wait(c, &req, "MPI_Iallgather");
}

static void mpi_all_to_all_v(mt_comm *c, const void *send, const int64_t *send_rows, void *recv,
                             const int64_t *recv_rows, size_t row_elems, mt_comm_type t,
                             int flags) {
    (void)flags;
    int n = c->size;
    size_t row_bytes = row_elems * mt_comm_type_size(t);
    need_int(c, row_bytes, "all_to_all_v row bytes");
    int *sc = mt_xmalloc(sizeof(int) * 4 * (size_t)n), *sd = sc + n, *rc = sd + n, *rd = rc + n;
    int64_t so = 0, ro = 0;
    for (int p = 0; p < n; p++) {
        need_int(c, (size_t)(so + send_rows[p]), "all_to_all_v rows sent");
        need_int(c, (size_t)(ro + recv_rows[p]), "all_to_all_v rows received");
        sc[p] = (int)send_rows[p], sd[p] = (int)so, so += send_rows[p];
        rc[p] = (int)recv_rows[p], rd[p] = (int)ro, ro += recv_rows[p];
    }
    if (so && ro) ranges_disjoint(c, send, (size_t)so * row_bytes, recv, (size_t)ro * row_bytes);
    MPI_Datatype row;
    mpi_check(c, MPI_Type_contiguous((int)row_bytes, MPI_BYTE, &row), "MPI_Type_contiguous");
    mpi_check(c, MPI_Type_commit(&row), "MPI_Type_commit");
    MPI_Request req;
    mpi_check(c, MPI_Ialltoallv(send, sc, sd, row, recv, rc, rd, row, comm_of(c), &req),
              "MPI_Ialltoallv");
    mpi_wait(c, &req, "MPI_Ialltoallv");
    MPI_Type_free(&row);
    free(sc);
}

// ---------------------------------------------------------------------------------------------
// Lifetime

static mt_comm *mpi_split(mt_comm *c, int color, int key, const char *name);
static void mpi_free(mt_comm *c);

static const comm_ops mpi_ops = {
    .all_reduce = mpi_all_reduce,
    .broadcast = mpi_broadcast,
    .reduce_scatter = mpi_reduce_scatter,
    .all_gather = mpi_all_gather,
    .all_to_all_v = mpi_all_to_all_v,
    .split = mpi_split,
    .free = mpi_free,
};

// Every rank of c has arrived (with the deadline): the blocking calls that follow
// (MPI_Comm_split, MPI_Finalize) then do not wait on a peer that never comes.
static void arrive(mt_comm *c) {
    MPI_Request req;
    mpi_check(c, MPI_Ibarrier(comm_of(c), &req), "MPI_Ibarrier");
    mpi_wait(c, &req, "MPI_Ibarrier");
}

static mt_comm *wrap(MPI_Comm comm, int world, const char *name, const mt_comm *parent) {
    int rank, size;
    MPI_Comm_rank(comm, &rank);
    MPI_Comm_size(comm, &size);
    mt_comm *c = mt_xcalloc(1, sizeof *c);
    mpi_impl *m = mt_xcalloc(1, sizeof *m);
    m->comm = comm;
    m->world = world;
    c->impl = m;
    comm_setup(c, &mpi_ops, MT_COMM_MPI, rank, size, name, parent);
    return c;
}

static mt_comm *mpi_split(mt_comm *c, int color, int key, const char *name) {
    arrive(c);
    MPI_Comm sub;
    mpi_check(c, MPI_Comm_split(comm_of(c), color, key, &sub), "MPI_Comm_split");
    mpi_check(c, MPI_Comm_set_errhandler(sub, MPI_ERRORS_RETURN), "MPI_Comm_set_errhandler");
    return wrap(sub, 0, name, c);
}

static void mpi_free(mt_comm *c) {
    mpi_impl *m = c->impl;
    if (m->world) {
        arrive(c);  // nobody finalises while a peer may still need it
        world_live = 0;
        MPI_Comm_free(&m->comm);
        if (we_initialised) MPI_Finalize();
    } else {
        MPI_Comm_free(&m->comm);
    }
    free(m);
}

static void mpi_abort_hook(int code) {
    int init = 0, fin = 0;
    MPI_Initialized(&init);
    MPI_Finalized(&fin);
    if (init && !fin) MPI_Abort(MPI_COMM_WORLD, code ? code : MT_EXIT_ERROR);
    exit(code);
}

// A rank that leaves without mt_comm_free(world) — exit(), mt_fatal, a return from main — ends
// the job at once instead of leaving its peers to wait for it.
static void exit_guard(int status, void *arg) {
    (void)arg;
    int fin = 0;
    if (!world_live || (MPI_Finalized(&fin), fin)) return;
    fprintf(stderr, "moetrain: fatal: comm: world rank %d is exiting (status %d) without "
            "mt_comm_free(world); aborting the job so that the other ranks do not wait for it\n",
            guard_world_rank, status);
    fflush(stderr);
    MPI_Abort(MPI_COMM_WORLD, status ? status : MT_EXIT_ERROR);
}

mt_comm *comm_mpi_world(mt_backend *be) {
    int init = 0, fin = 0;
    MPI_Initialized(&init);
    MPI_Finalized(&fin);
    if (fin || world_live) {
        mt_error_set("MPI %s; one world communicator per process",
                     fin ? "was already finalised" : "already has a world communicator");
        return NULL;
    }
    if (!init) {
        int provided = 0;
        // FUNNELED: only the main thread calls MPI (the NCCL watchdog calls MPI_Abort alone,
        // when the job is ending anyway).
        if (MPI_Init_thread(NULL, NULL, MPI_THREAD_FUNNELED, &provided) != MPI_SUCCESS) {
            mt_error_set("MPI_Init failed");
            return NULL;
        }
        we_initialised = 1;
    }
    MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
    MPI_Comm dup;  // our own context: no message of ours can match anyone else's
    if (MPI_Comm_dup(MPI_COMM_WORLD, &dup) != MPI_SUCCESS) {
        mt_error_set("MPI_Comm_dup(MPI_COMM_WORLD) failed");
        return NULL;
    }
    MPI_Comm_set_errhandler(dup, MPI_ERRORS_RETURN);
    mt_comm *c = wrap(dup, 1, "world", NULL);
    c->be = be;
    comm_set_abort_hooks(NULL, mpi_abort_hook);
    guard_world_rank = c->rank;
    world_live = 1;
    if (!guard_installed) {
        on_exit(exit_guard, NULL);
        guard_installed = 1;
    }
    return c;
}

int comm_mpi_available(void) { return 1; }

#else  // no MPI in this build

mt_comm *comm_mpi_world(mt_backend *be) {
    (void)be;
    mt_error_set("this build has no MPI: the Makefile did not find mpicc (install the Debian "
                 "packages libopenmpi-dev and openmpi-bin, then rebuild)");
    return NULL;
}

int comm_mpi_available(void) { return 0; }

#endif
