// core/comm_single.c — the one-process communicator: size 1, no MPI at run time.
// Reductions and broadcasts leave the buffer as it is; gathers, scatters and the all-to-all copy
// (memmove: the in-place layouts of comm.h are allowed).
#include <string.h>

#include "core/comm_internal.h"

static void single_all_reduce(mt_comm *c, void *buf, size_t n, mt_comm_type t, mt_comm_op op,
                              int flags) {
    (void)c, (void)buf, (void)n, (void)t, (void)op, (void)flags;
}

static void single_broadcast(mt_comm *c, void *buf, size_t n, mt_comm_type t, int root,
                             int flags) {
    (void)c, (void)buf, (void)n, (void)t, (void)root, (void)flags;
}

static void single_reduce_scatter(mt_comm *c, const void *send, void *recv, size_t n,
                                  mt_comm_type t, mt_comm_op op, int flags) {
    (void)c, (void)op, (void)flags;
    if (send != recv) memmove(recv, send, n * mt_comm_type_size(t));
}

static void single_all_gather(mt_comm *c, const void *send, void *recv, size_t n,
                              mt_comm_type t, int flags) {
    (void)c, (void)flags;
    if (send != recv) memmove(recv, send, n * mt_comm_type_size(t));
}

static void single_all_to_all_v(mt_comm *c, const void *send, const int64_t *send_rows,
                                void *recv, const int64_t *recv_rows, size_t row_elems,
                                mt_comm_type t, int flags) {
    (void)flags;
    if (send_rows[0] != recv_rows[0])
        comm_fail(c, MT_EXIT_ERROR, "all_to_all_v: sends %lld rows to itself but expects %lld",
                  (long long)send_rows[0], (long long)recv_rows[0]);
    if (send != recv) memmove(recv, send, (size_t)send_rows[0] * row_elems * mt_comm_type_size(t));
}

static mt_comm *single_split(mt_comm *c, int color, int key, const char *name);
static void single_free(mt_comm *c) { (void)c; }

static const comm_ops single_ops = {
    .all_reduce = single_all_reduce,
    .broadcast = single_broadcast,
    .reduce_scatter = single_reduce_scatter,
    .all_gather = single_all_gather,
    .all_to_all_v = single_all_to_all_v,
    .split = single_split,
    .free = single_free,
};

static mt_comm *single_split(mt_comm *c, int color, int key, const char *name) {
    (void)color, (void)key;
    mt_comm *s = mt_xcalloc(1, sizeof *s);
    comm_setup(s, &single_ops, MT_COMM_SINGLE, 0, 1, name, c);
    return s;
}

mt_comm *comm_single_new(mt_backend *be) {
    mt_comm *c = mt_xcalloc(1, sizeof *c);
    c->be = be;
    comm_setup(c, &single_ops, MT_COMM_SINGLE, 0, 1, "world", NULL);
    return c;
}
