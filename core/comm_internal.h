// core/comm_internal.h — what comm.c (the dispatcher) shares with comm_single.c, comm_mpi.c and
// comm_nccl.cu. Not for use outside core/comm*.
#pragma once
#include "core/comm.h"

#ifdef __cplusplus
extern "C" {
#endif

// One implementation. Arguments are validated by comm.c before these are called; every
// failure inside goes through comm_fail() and does not return.
typedef struct comm_ops {
    void (*all_reduce)(mt_comm *c, void *buf, size_t n, mt_comm_type t, mt_comm_op op, int flags);
    void (*broadcast)(mt_comm *c, void *buf, size_t n, mt_comm_type t, int root, int flags);
    void (*reduce_scatter)(mt_comm *c, const void *send, void *recv, size_t n, mt_comm_type t,
                           mt_comm_op op, int flags);
    void (*all_gather)(mt_comm *c, const void *send, void *recv, size_t n, mt_comm_type t,
                       int flags);
    void (*all_to_all_v)(mt_comm *c, const void *send, const int64_t *send_rows, void *recv,
                         const int64_t *recv_rows, size_t row_elems, mt_comm_type t, int flags);
    void (*wait)(mt_comm *c);  // NULL: nothing to wait for
    void (*sync)(mt_comm *c);  // NULL: nothing to wait for
    mt_comm *(*split)(mt_comm *c, int color, int key, const char *name);
    void (*free)(mt_comm *c);
} comm_ops;

struct mt_comm {
    const comm_ops *ops;
    mt_comm_kind kind;
    int rank, size, world_rank;
    char name[32];
    mt_comm *host;     // runs host-memory calls: this comm (single, mpi) or nccl's MPI/single comm
    mt_backend *be;    // where EXACT scratch is counted (MT_MEM_COMM); may be NULL
    double timeout_s;  // 0: wait forever
    int check;         // MT_COMM_CHECK: verify that every rank makes the same call
    // Progress, for the messages of a deadline or an abort.
    uint64_t seq;          // data collectives started on this comm
    const char *op;        // the one started last
    size_t op_count;       // its count
    mt_comm_type op_type;  // and type
    uint64_t done_seq;     // the last one known complete (host-side completion)
    const char *done_op;
    void *impl;
};

// Constructors of the implementations (comm.c fills the common fields afterwards).
mt_comm *comm_single_new(mt_backend *be);
mt_comm *comm_mpi_world(mt_backend *be);      // NULL with mt_error_set() (no MPI, ...)
mt_comm *comm_nccl_world(mt_backend *be);     // NULL with mt_error_set(); CUDA builds only
int comm_mpi_available(void);                 // 1 when built with MPI

// Common fields of a new communicator made from `parent` (split) or for the world.
void comm_setup(mt_comm *c, const comm_ops *ops, mt_comm_kind kind, int rank, int size,
                const char *name, const mt_comm *parent);

// Fatal for the job: prints "moetrain: fatal: comm '<name>' rank r/n (world rank w): <msg>",
// runs the abort hooks (NCCL communicators, then MPI_Abort) and exits with `code`. Safe from
// any thread; only the first caller prints.
MT_NORETURN void comm_fail(const mt_comm *c, int code, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
// A collective that passed its deadline: names it, the last one completed, then comm_fail.
MT_NORETURN void comm_fail_deadline(const mt_comm *c, double waited_s);
// Hooks run by comm_fail before the process ends (each may be NULL). The MPI one does not
// return (MPI_Abort); the NCCL one aborts every live NCCL communicator and returns.
void comm_set_abort_hooks(void (*nccl_abort_all)(void), void (*mpi_abort)(int code));

double comm_now(void);  // monotonic seconds
// A pause between two polls of an unfinished operation: spins at first, then yields the core
// (ranks may share cores with --oversubscribe), then sleeps with a growing interval up to
// 200 µs. `*round` counts the polls; deadlines are checked from round 256 on.
void comm_backoff(unsigned *round);

// Parts of a fixed-order reduction: n elements split over `size` ranks as evenly as possible;
// part r is [off(r), off(r) + len(r)).
static inline size_t comm_part_len(size_t n, int size, int r) {
    return n / (size_t)size + ((size_t)r < n % (size_t)size ? 1 : 0);
}
static inline size_t comm_part_off(size_t n, int size, int r) {
    size_t rem = n % (size_t)size;
    return (size_t)r * (n / (size_t)size) + ((size_t)r < rem ? (size_t)r : rem);
}
// Host fold: dst[i] = rows[0][i] op rows[1][i] op ... op rows[nrows-1][i], left to right, where
// row q starts at rows + q × stride elements. bf16/f16 fold in f32 and round once. dst may be
// one of the rows.
void comm_fold(void *dst, const void *rows, int nrows, size_t n, size_t stride, mt_comm_type t,
               mt_comm_op op);

// Scratch for EXACT: counted under MT_MEM_COMM in c->be's ledger when there is one.
void *comm_host_scratch(const mt_comm *c, size_t bytes);
void comm_host_scratch_free(const mt_comm *c, void *p, size_t bytes);

#ifdef __cplusplus
}
#endif
