// core/comm.h — communicators and collectives: one process, MPI (CPU), NCCL (CUDA).
//
// Launch is the launcher's: `mpirun -np N moetrain ...` or Slurm's `srun` (with Open MPI built
// for it). Rank and size come from MPI; nothing here starts processes or opens sockets.
//
//   mt_comm *world = mt_comm_init(MT_COMM_AUTO, be);     // single, MPI or NCCL, see below
//   if (!world) mt_fatal(MT_EXIT_ERROR, "%s", mt_error_get());
//   if (mt_comm_check_same(world, "config", mt_hash_string(cfg_text)) != 0)
//       mt_fatal(MT_EXIT_ERROR, "%s", mt_error_get());     // every rank refuses, same message
//   mt_comm *ep, *dp;
//   mt_comm_grid(world, ep_size, &ep, &dp);              // EP groups of consecutive ranks
//   mt_comm_all_reduce(dp, grads, n, MT_COMM_F32, MT_COMM_SUM, MT_COMM_EXACT);
//   ...
//   mt_comm_free(ep); mt_comm_free(dp); mt_comm_free(world);   // world last: MPI_Finalize
//
// Three implementations behind one interface:
//   single  one process, size 1; needs no launcher and never calls MPI (the library is linked,
//           but MPI_Init is not called). Every collective is the identity or a copy.
//   mpi     Open MPI on host buffers (the CPU backend). Built when the Makefile finds mpicc
//           (-DMT_MPI); without it, asking for MPI is an error naming the missing package.
//   nccl    NCCL on device buffers of a CUDA backend, with an MPI communicator beside it for
//           host-side helpers and for the bootstrap: ncclGetUniqueId on rank 0, MPI_Bcast to the
//           others, ncclCommInitRankConfig. Without a launcher it is a 1-rank NCCL communicator
//           and needs no MPI. NOTE: this path has been compiled and linked but has NEVER RUN —
//           no GPU was available where it was written. Treat it as untested until a 1-rank run
//           on a lent GPU (and a multi-GPU run somewhere) has passed tests/mpi's checks.
//
// Memory. "Data" collectives (all_reduce, broadcast, reduce_scatter, all_gather, all_to_all_v)
// take the comm's memory: host pointers for single and mpi, device pointers of the backend
// for nccl. The `host_` functions and the helpers (counts, flag, check_same, barrier) always
// take host memory, for every kind. Counts are in ELEMENTS of the given type, never bytes.
//
// Ordering (nccl). A data collective runs on the comm's own stream: it waits (by an event) for
// the work already queued on the backend's stream, and the backend's stream waits for it in
// turn, so kernels queued after the call see the result; the host does not block. With
// MT_COMM_ASYNC the backend's stream does not wait, so compute can overlap the transfer; call
// mt_comm_wait() before touching the buffers again. Buffers must stay alive until then.
// On single and mpi every call has completed when it returns (ASYNC is accepted and ignored).
//
// Determinism. MT_COMM_EXACT makes a reduction a fixed-order one: element i of the result is
// x_0[i] op x_1[i] op ... op x_{n-1}[i], folded left to right in rank order, computed once by
// the rank that owns that part (all-to-all of parts, fold, then all-gather), so every rank gets
// the same bits and a rerun gets the same bits again. It costs one all-to-all plus one
// all-gather (the bandwidth of a ring all-reduce) and a scratch of `count` elements, counted in
// the backend's ledger under `comm` when a backend was given. bf16/f16 are folded in f32 and
// rounded once at the end. Without EXACT the rounding of a sum is the library's: Open MPI and
// NCCL give every rank the same bits with the algorithms they use in practice, but neither
// promises it and the result may change with message size or rank count — use EXACT for the
// gradients of replicated weights (replicas must not drift) and for anything compared across
// runs. MAX and MIN are exact either way. MPI has no bf16/f16 type: their reductions always
// take the fixed-order path on mpi.
//
// Failure. Every error inside a collective is fatal for the whole job, never a hang and never a
// return code (a rank that leaves a collective alone strands the others): the rank prints
// "moetrain: fatal: comm '<name>' rank r/n (world rank w): ..." and then aborts the job —
// ncclCommAbort on its NCCL communicators, then MPI_Abort(MPI_COMM_WORLD), which makes
// mpirun/srun kill every rank. Specifically:
//   * Deadline: every collective waits at most the comm's timeout (MT_COMM_TIMEOUT seconds in
//     the environment, default 600; 0 disables; mt_comm_set_timeout() per comm). MPI waits by
//     non-blocking collectives and MPI_Test polling; NCCL by a non-blocking communicator
//     (ncclInProgress polled through ncclCommGetAsyncError) and a watchdog thread that checks
//     each queued collective's completion event and the communicator's async error. On expiry
//     the message names the collective, its sequence number, count and type, and the last one
//     that completed on that comm.
//   * A rank that exits without mt_comm_free(world) (exit(3), mt_fatal, a return from main) is
//     caught by an on_exit handler that calls MPI_Abort with its exit status, so the others end
//     at once even under launchers that would wait. A rank killed by a signal cannot run it:
//     Open MPI's mpirun notices ("process rank 1 ... exited on signal 9") and kills the rest;
//     under srun use --kill-on-bad-exit=1, and the deadline catches whatever remains.
//   * mt_comm_check_same() at start-up refuses mismatched config/code/expert counts and names
//     the ranks that differ. MT_COMM_CHECK=1 in the environment additionally verifies before
//     every data collective that all ranks of the comm call the same one (op, count, type,
//     root) and aborts naming each rank's call when they do not (one extra tiny all-gather).
// A rank-local error that must stop everyone goes through mt_comm_abort().
//
// Threads: call from the main thread only (MPI is initialised MPI_THREAD_FUNNELED); OpenMP
// regions must not call into comm. The NCCL watchdog thread calls MPI_Abort alone, on the way
// out. Deadline polling spins, then yields, then sleeps up to 200 µs between polls: on MPI a
// one-element all-reduce costs ~1 µs more than a blocking MPI_Allreduce between two ranks on
// one machine, and a 16 MB one 10-25% more (Open MPI's non-blocking collectives).
#pragma once
#include <stddef.h>
#include <stdint.h>

#include "core/backend.h"
#include "core/common.h"
#include "core/dtype.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum { MT_COMM_AUTO, MT_COMM_SINGLE, MT_COMM_MPI, MT_COMM_NCCL } mt_comm_kind;

// Element types of a collective (dtype.h has no f64; reproducible scalars want it).
typedef enum {
    MT_COMM_F32,
    MT_COMM_F64,
    MT_COMM_BF16,
    MT_COMM_F16,
    MT_COMM_I32,
    MT_COMM_I64,
    MT_COMM_U8,
    MT_COMM_TYPE_COUNT
} mt_comm_type;

typedef enum { MT_COMM_SUM, MT_COMM_MAX, MT_COMM_MIN, MT_COMM_OP_COUNT } mt_comm_op;

// Flags of the data collectives (OR them).
enum {
    MT_COMM_EXACT = 1,  // reductions: fixed rank-order fold, same bits on every rank and rerun
    MT_COMM_ASYNC = 2,  // nccl: do not make the backend's stream wait; see mt_comm_wait()
};

typedef struct mt_comm mt_comm;

// --- Launch and lifetime ----------------------------------------------------------------------

// 1 when this process was started by an MPI launcher: Open MPI's mpirun (OMPI_COMM_WORLD_SIZE),
// a PMI/PMIx launcher such as srun --mpi=pmix or MPICH's hydra (PMIX_RANK, PMI_SIZE), or a
// Slurm job step (SLURM_STEP_NUM_TASKS; not SLURM_NTASKS, which a batch script sees too).
int mt_comm_launched(void);
// The node-local rank the launcher gave this process (0 when not launched), to choose the GPU
// before the CUDA backend exists: mt_backend_cuda_new(mt_comm_local_rank() % gpus).
int mt_comm_local_rank(void);

// The world communicator. AUTO: MT_COMM=single|mpi|nccl in the environment when set; else
// nccl when `be` is a CUDA backend (a 1-rank NCCL communicator without a launcher, so that one
// GPU runs the same path as many), mpi when mt_comm_launched(), single otherwise. single and
// mpi work on host memory and refuse a CUDA backend; `be` may be NULL for them (EXACT's
// scratch is then plain malloc, outside any ledger). nccl needs the CUDA backend whose device
// and stream it will use. Logging is set to this rank
// (mt_log_set_rank). One world per process: MPI cannot be initialised again after it was
// finalised. NULL with mt_error_set() on failure (no MPI in this build, bad MT_COMM_TIMEOUT,
// NCCL without a CUDA backend, ...); a failure of MPI_Init itself is the library's to report.
mt_comm *mt_comm_init(mt_comm_kind kind, mt_backend *be);
// Frees a communicator (after its outstanding work, waited for with the deadline). Freeing the
// world finalises MPI; free sub-communicators first. NULL is fine.
void mt_comm_free(mt_comm *c);

// Sub-groups, collective over `c`: ranks with the same color (>= 0) form one communicator,
// ordered by key then by rank in `c`. `name` ("ep", "dp") appears in every message about it.
// Inherits kind, backend and timeout. Never NULL (failure aborts the job).
mt_comm *mt_comm_split(mt_comm *c, int color, int key, const char *name);
// The EP × DP grid of `world` (size = ep × dp): EP groups are runs of `ep` consecutive ranks
// (rank / ep is the group, rank % ep the rank in it) so that an all-to-all stays within a node
// when ranks are placed by node; DP groups join the ranks with the same rank % ep. Returns 0,
// or -1 with mt_error_set() on every rank when ep < 1 or size % ep != 0 (nothing is created).
int mt_comm_grid(mt_comm *world, int ep, mt_comm **ep_comm, mt_comm **dp_comm);

int mt_comm_rank(const mt_comm *c);
int mt_comm_size(const mt_comm *c);
int mt_comm_world_rank(const mt_comm *c);  // this process's rank in the world
mt_comm_kind mt_comm_kind_of(const mt_comm *c);
const char *mt_comm_name(const mt_comm *c);  // "world", or the name given to split
const char *mt_comm_kind_name(mt_comm_kind kind);  // "auto", "single", "mpi", "nccl"
int mt_comm_kind_parse(const char *s, mt_comm_kind *out);  // 0, or -1 with an error
size_t mt_comm_type_size(mt_comm_type t);
const char *mt_comm_type_name(mt_comm_type t);
// The collective type of a tensor dtype: 0, or -1 with an error for MT_Q4 (move it as MT_U8).
int mt_comm_type_of(mt_dtype d, mt_comm_type *out);

// Deadline of every later collective on `c`, in seconds; 0 waits forever.
void mt_comm_set_timeout(mt_comm *c, double seconds);
double mt_comm_timeout(const mt_comm *c);

// --- Data collectives: the comm's memory (host for single/mpi, device for nccl) ----------------
// Every rank of `c` must make the same calls in the same order with the same counts, types,
// ops and roots (MT_COMM_CHECK=1 verifies it).

// In place: buf [count] = op over ranks of buf [count].
void mt_comm_all_reduce(mt_comm *c, void *buf, size_t count, mt_comm_type type, mt_comm_op op,
                        int flags);
// In place: buf [count] of `root` to every rank.
void mt_comm_broadcast(mt_comm *c, void *buf, size_t count, mt_comm_type type, int root,
                       int flags);
// send [size × recv_count] → recv [recv_count] = op over ranks of chunk `rank` of send.
// In place when recv == send + rank × recv_count (ZeRO: the shard inside the full gradient);
// the other chunks of send are clobbered then. Otherwise send and recv must not overlap.
void mt_comm_reduce_scatter(mt_comm *c, const void *send, void *recv, size_t recv_count,
                            mt_comm_type type, mt_comm_op op, int flags);
// send [send_count] of every rank → recv [size × send_count], rank order. In place when
// send == recv + rank × send_count (ZeRO: each rank's shard already inside the full buffer).
void mt_comm_all_gather(mt_comm *c, const void *send, void *recv, size_t send_count,
                        mt_comm_type type, int flags);
// Rows of `row_elems` elements: send_rows[p] rows go to peer p, recv_rows[q] rows come from
// peer q (host arrays of `size` counts, zeros allowed). Both buffers are packed in peer order:
// the rows for peer 0, then for peer 1, ...; recv likewise by source. recv_rows must equal what
// the peers send (exchange them first with mt_comm_all_to_all_counts); a mismatch aborts.
void mt_comm_all_to_all_v(mt_comm *c, const void *send, const int64_t *send_rows, void *recv,
                          const int64_t *recv_rows, size_t row_elems, mt_comm_type type,
                          int flags);
// nccl: make the backend's stream wait for every collective queued on `c` (after ASYNC ones).
// No-op on single and mpi.
void mt_comm_wait(mt_comm *c);
// nccl: block the host until every collective queued on `c` has completed (with the deadline).
// No-op on single and mpi.
void mt_comm_sync(mt_comm *c);

// --- Host helpers: host memory on every kind -------------------------------------------------

// Same as the data collectives, on host buffers (nccl comms run them over their MPI comm).
void mt_comm_host_all_reduce(mt_comm *c, void *buf, size_t count, mt_comm_type type,
                             mt_comm_op op, int flags);
void mt_comm_host_broadcast(mt_comm *c, void *buf, size_t count, mt_comm_type type, int root);
// send[p] = rows this rank sends to peer p → recv[q] = rows peer q sends to this rank.
void mt_comm_all_to_all_counts(mt_comm *c, const int64_t *send, int64_t *recv);
// 1 on every rank when `flag` is non-zero on any rank ("every rank skips the same step").
int mt_comm_any(mt_comm *c, int flag);
// Sum of one double over ranks, in rank order (EXACT): the same bits on every rank.
double mt_comm_sum_f64(mt_comm *c, double x);
void mt_comm_barrier(mt_comm *c);
// Start-up agreement: 0 when every rank passed the same hash of `what` ("config", "code",
// "experts"); else -1 on every rank with an error naming the ranks that differ from the value
// most ranks hold (rank 0's on a tie) and their hashes. The caller exits non-zero.
int mt_comm_check_same(mt_comm *c, const char *what, uint64_t hash);

// A rank-local failure that must end the job: prints the message with this rank, aborts NCCL
// communicators, then MPI_Abort(MPI_COMM_WORLD, code) (exit(code) on single). NULL `c` is fine.
MT_NORETURN void mt_comm_abort(mt_comm *c, int code, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

#ifdef __cplusplus
}
#endif
