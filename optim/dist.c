// optim/dist.c — gradient reduction, the global norm and ZeRO-1 over the groups of dist.h.
#include "optim/dist.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

#include "core/common.h"

static int is_expert(const mt_param *p) { return p->name && strstr(p->name, ".experts.") != NULL; }

// A tensor header over elements [off, off + len) of `data` (1-D): the optimizer's piece of a
// weight or of the flat gradients. It owns nothing; free() it, never mt_tensor_free.
static mt_tensor *view(mt_backend *be, mt_dtype dt, void *data, int64_t off, int64_t len) {
    mt_tensor *t = mt_xcalloc(1, sizeof *t);
    t->dtype = dt, t->ndim = 1, t->shape[0] = len, t->be = be, t->cat = MT_MEM_TRAIN;
    t->nbytes = mt_dtype_bytes(dt, (size_t)len);
    t->data = data ? (char *)data + mt_dtype_bytes(dt, (size_t)off) : NULL;
    return t;
}

// Copies the flat range [lo, hi) between the group's params (`grads`: their g, else their w) and
// the flat buffer (to_flat: params -> flat). Padding past the last tensor is zeroed on the way in.
static void copy_range(mt_dist *d, mt_dist_group *g, int64_t lo, int64_t hi, int grads, int to_flat) {
    size_t esz = mt_dtype_bytes(g->dtype, 1);
    for (int i = 0; i < g->n; i++) {
        const mt_param *p = &d->params[g->idx[i]];
        mt_tensor *t = grads ? p->g : p->w;
        int64_t a = MT_MAX(lo, g->start[i]), b = MT_MIN(hi, g->start[i] + mt_tensor_numel(t));
        if (a >= b) continue;
        char *f = (char *)g->flat + (size_t)a * esz, *x = (char *)t->data + (size_t)(a - g->start[i]) * esz;
        d->be->ops->copy(d->be, to_flat ? f : x, to_flat ? x : f, (size_t)(b - a) * esz);
    }
    if (to_flat && hi > g->numel) {
        int64_t a = MT_MAX(lo, g->numel);
        d->be->ops->fill_zero(d->be, (char *)g->flat + (size_t)a * esz, (size_t)(hi - a) * esz);
    }
}

// Doubling room: one realloc per parameter copied the array each time (36,000 LoRA tensors of
// Qwen3-30B-A3B: 77 s of plan under ASan, whose realloc always moves).
static void add_opt(mt_dist *d, mt_param p, int piece) {
    if (d->n_opt == d->cap_opt) {
        d->cap_opt = d->cap_opt ? 2 * d->cap_opt : 64;
        d->opt = mt_xrealloc(d->opt, (size_t)d->cap_opt * sizeof *d->opt);
        d->piece = mt_xrealloc(d->piece, (size_t)d->cap_opt);
    }
    d->piece[d->n_opt] = (unsigned char)piece;
    d->opt[d->n_opt++] = p;
}

// ZeRO: the optimizer's params are the pieces of this group's tensors inside this rank's chunk:
// weights viewed in place, gradients viewed in the flat buffer (where the reduce-scatter lands).
static void add_pieces(mt_dist *d, mt_dist_group *g) {
    int64_t lo = (int64_t)g->rank * g->chunk, hi = lo + g->chunk;
    for (int i = 0; i < g->n; i++) {
        const mt_param *p = &d->params[g->idx[i]];
        int64_t a = MT_MAX(lo, g->start[i]), b = MT_MIN(hi, g->start[i] + mt_tensor_numel(p->w));
        if (a >= b) continue;
        char name[400];
        snprintf(name, sizeof name, "%s[%lld:%lld]", p->name, (long long)(a - g->start[i]),
                 (long long)(b - g->start[i]));
        add_opt(d, (mt_param){.name = mt_xstrdup(name),
                              .w = view(d->be, g->dtype, p->w->data, a - g->start[i], b - a),
                              .g = view(d->be, g->dtype, g->flat, a, b - a),
                              .decay = p->decay},
                1);
    }
}

int mt_dist_init(mt_dist *d, mt_backend *be, const mt_param *params, int n, const mt_dist_ranks *r, int zero) {
    memset(d, 0, sizeof *d);
    d->be = be, d->params = params, d->n_params = n, d->zero = zero, d->ep = r->ep;
    d->counting = be->ops->kind == MT_BACKEND_NULL;
    mt_comm *comms[MT_DIST_GROUPS] = {r->world, r->dp};
    int ranks[MT_DIST_GROUPS] = {r->world_rank, r->dp_rank}, sizes[MT_DIST_GROUPS] = {r->world_size, r->dp_size};
    for (int k = 0; k < MT_DIST_GROUPS; k++) {
        mt_dist_group *g = &d->group[k];
        g->comm = comms[k], g->rank = ranks[k], g->size = sizes[k];
        g->idx = mt_xcalloc((size_t)(n ? n : 1), sizeof(int));
        g->start = mt_xcalloc((size_t)(n ? n : 1), sizeof(int64_t));
        g->dtype = n ? params[0].w->dtype : MT_F32;
        for (int i = 0; i < n; i++) {
            if (is_expert(&params[i]) != (k == MT_DIST_EXPERTS)) continue;
            if (params[i].w->dtype != g->dtype) {
                mt_error_set("trainable '%s' is %s where the others are %s", params[i].name,
                             mt_dtype_name(params[i].w->dtype), mt_dtype_name(g->dtype));
                return mt_dist_free(d), -1;
            }
            g->idx[g->n] = i, g->start[g->n++] = g->numel;
            g->numel += mt_tensor_numel(params[i].w);
        }
        g->chunk = (g->numel + g->size - 1) / g->size;
        if (zero && g->size > 1 && g->numel > 0) {
            g->flat_bytes = mt_dtype_bytes(g->dtype, (size_t)(g->chunk * g->size));
            g->sharded = 1;
            if (mt_backend_alloc(be, MT_MEM_COMM, g->flat_bytes, &g->flat) != 0) {
                mt_error_prefix("the %s gradients' flat buffer", k ? "experts'" : "replicated");
                return mt_dist_free(d), -1;
            }
        }
        if (g->sharded) {
            add_pieces(d, g);
        } else {
            for (int i = 0; i < g->n; i++) {
                mt_param p = params[g->idx[i]];
                p.name = mt_xstrdup(p.name);
                add_opt(d, p, 0);
            }
        }
    }
    return 0;
}

void mt_dist_free(mt_dist *d) {
    for (int k = 0; k < MT_DIST_GROUPS; k++) {
        mt_dist_group *g = &d->group[k];
        if (g->flat_bytes) mt_backend_release(d->be, MT_MEM_COMM, g->flat_bytes, g->flat);
        free(g->idx), free(g->start);
    }
    for (int i = 0; i < d->n_opt; i++) {
        free((char *)d->opt[i].name);
        if (d->piece[i]) free(d->opt[i].w), free(d->opt[i].g);
    }
    free(d->piece);
    free(d->opt);
    memset(d, 0, sizeof *d);
}

static mt_comm_type comm_type(mt_dtype dt) {
    mt_comm_type t = MT_COMM_F32;
    mt_comm_type_of(dt, &t);
    return t;
}

void mt_dist_reduce_grads(mt_dist *d) {
    for (int k = 0; k < MT_DIST_GROUPS && !d->counting; k++) {
        mt_dist_group *g = &d->group[k];
        if (g->size == 1) continue;
        if (g->sharded) {  // ZeRO: this rank's chunk of the sum lands where its pieces' g look
            copy_range(d, g, 0, g->chunk * g->size, 1, 1);
            void *mine = (char *)g->flat + mt_dtype_bytes(g->dtype, (size_t)(g->rank * g->chunk));
            mt_comm_reduce_scatter(g->comm, g->flat, mine, (size_t)g->chunk, comm_type(g->dtype), MT_COMM_SUM,
                                   MT_COMM_EXACT);
            continue;
        }
        for (int i = 0; i < g->n; i++) {  // in place, tensor by tensor: no copy of the gradients
            mt_tensor *t = d->params[g->idx[i]].g;
            mt_comm_all_reduce(g->comm, t->data, (size_t)mt_tensor_numel(t), comm_type(g->dtype), MT_COMM_SUM,
                               MT_COMM_EXACT);
        }
    }
}

// Σg² of chunk c: the pieces of the group's tensors inside it, each in the blocked order, added
// in order; read from the flat buffer (ZeRO) or from the tensors: the same numbers.
static double chunk_sumsq(mt_dist *d, mt_dist_group *g, int c) {
    int64_t lo = (int64_t)c * g->chunk, hi = lo + g->chunk;
    const void **x = mt_xcalloc((size_t)g->n + 1, sizeof *x);
    int64_t *len = mt_xcalloc((size_t)g->n + 1, sizeof *len);
    double *sums = mt_xcalloc((size_t)g->n + 1, sizeof *sums), s = 0.0;
    int count = 0;
    for (int i = 0; i < g->n; i++) {
        const mt_tensor *t = d->params[g->idx[i]].g;
        int64_t a = MT_MAX(lo, g->start[i]), b = MT_MIN(hi, g->start[i] + mt_tensor_numel(t));
        if (a >= b) continue;
        x[count] = g->sharded ? (const char *)g->flat + mt_dtype_bytes(g->dtype, (size_t)a)
                              : (const char *)t->data + mt_dtype_bytes(g->dtype, (size_t)(a - g->start[i]));
        len[count++] = b - a;
    }
    mt_sumsq_pieces(d->be, x, g->dtype, len, count, sums);  // on cuda: one host wait
    for (int i = 0; i < count; i++) s += sums[i];
    free(x), free(len), free(sums);
    return s;
}

// Σg² of a group: chunks folded in order. With ZeRO each chunk is summed by its owner, the only
// rank holding it reduced; without, every rank sums every chunk.
static double group_sumsq(mt_dist *d, mt_dist_group *g) {
    double *part = mt_xcalloc((size_t)g->size, sizeof(double));
    for (int c = 0; c < g->size; c++)
        if (!g->sharded || c == g->rank) part[c] = chunk_sumsq(d, g, c);
    if (g->sharded) mt_comm_host_all_reduce(g->comm, part, (size_t)g->size, MT_COMM_F64, MT_COMM_SUM, MT_COMM_EXACT);
    double s = 0.0;
    for (int c = 0; c < g->size; c++) s += part[c];
    free(part);
    return s;
}

double mt_dist_grad_norm(mt_dist *d) {
    if (d->counting) return 0.0;
    double experts = group_sumsq(d, &d->group[MT_DIST_EXPERTS]);
    if (d->ep) experts = mt_comm_sum_f64(d->ep, experts);  // each EP rank holds other experts
    return sqrt(group_sumsq(d, &d->group[MT_DIST_REPLICATED]) + experts);
}

void mt_dist_share_weights(mt_dist *d) {
    if (!d->zero || d->counting) return;
    for (int k = 0; k < MT_DIST_GROUPS; k++) {
        mt_dist_group *g = &d->group[k];
        if (!g->sharded) continue;
        int64_t lo = (int64_t)g->rank * g->chunk;
        copy_range(d, g, lo, lo + g->chunk, 0, 1);
        void *mine = (char *)g->flat + mt_dtype_bytes(g->dtype, (size_t)lo);
        mt_comm_all_gather(g->comm, mine, g->flat, (size_t)g->chunk, comm_type(g->dtype), 0);
        copy_range(d, g, 0, g->chunk * g->size, 0, 0);
    }
}
