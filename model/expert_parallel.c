// model/expert_parallel.c — experts spread over the EP group: the rows each rank routes to an
// expert travel to the expert's owner by an all-to-all and come back the same way.
//
// Layouts of one layer's T·k assignment rows (P ranks; experts placed as mixtral.h says):
//   local  this rank's rows in expert order (offsets[e] .. offsets[e+1]), as on one rank;
//   wire   the same rows grouped by owner: for p = 0..P-1, for p's experts ascending;
//   inbox  what arrives: for source q = 0..P-1, for this rank's experts ascending;
//   own    what the experts compute on: for this rank's experts ascending, for q = 0..P-1.
// Within one expert the own layout lists rank 0's rows, then rank 1's, ...: when the ranks hold
// consecutive slices of the global batch this is the order one process would see, so the
// expert's matmuls (and its LoRA dropout, keyed by row) are those of the single-process run.
// Rows move by the backend's copy and the comm's all-to-all: host memory and MPI on the cpu
// backend, device memory and NCCL on cuda (that path has not run: no multi-GPU machine here).
// The wire and the inbox hold w columns a row; the local and own layouts may hold more (a row
// stride ld ≥ w: the GPU step's room beside x and dy for the experts' LoRA folds,
// model/experts_gpu.c), of which the exchange moves the first w.
#include <string.h>

#include "core/common.h"
#include "model/model_internal.h"

// peer_counts [P × E] and own_offsets [E + 1] of layer L from this rank's routing. Counting
// (null backend, no comm), every rank is taken to route like this one: balanced.
void mt_ep_exchange_counts(mt_model *m, int L) {
    mt_layer_kept *kp = &m->kept[L];
    int P = m->par.ep_size, me = m->par.ep_rank, E = (int)m->cfg.experts;
    int64_t *C = kp->peer_counts;
    memset(C, 0, (size_t)P * (size_t)E * sizeof *C);
    for (int e = 0; e < E; e++) C[(int64_t)me * E + e] = kp->counts[e];
    if (m->par.ep) {
        mt_comm_host_all_reduce(m->par.ep, C, (size_t)P * (size_t)E, MT_COMM_I64, MT_COMM_SUM, 0);
    } else {
        for (int q = 0; q < P; q++) memcpy(C + (int64_t)q * E, C + (int64_t)me * E, (size_t)E * sizeof *C);
    }
    int64_t row = 0;
    for (int e = 0; e < E; e++) {
        kp->own_offsets[e] = row;
        if (mt_expert_is_local(m, L, e))
            for (int q = 0; q < P; q++) row += C[(int64_t)q * E + e];
    }
    kp->own_offsets[E] = row;
}

int64_t mt_ep_own_rows(const mt_model *m, int L) { return m->kept[L].own_offsets[m->cfg.experts]; }

// n rows of w elements from src (row stride ls) to dst (ld), in act_dtype(m).
static void copy_rows(const mt_model *m, char *dst, int64_t ld, const char *src, int64_t ls, int64_t n, int64_t w) {
    size_t es = mt_dtype_bytes(act_dtype(m), 1);
    if (ld == w && ls == w) m->be->ops->copy(m->be, dst, src, (size_t)(n * w) * es);
    else m->be->ops->copy2d(m->be, dst, (size_t)ld * es, src, (size_t)ls * es, (size_t)w * es, (size_t)n);
}

// local <-> wire (to_wire = 1: pack for sending; 0: unpack what came back). rows[p]: rows per peer.
static void wire_rows(const mt_model *m, int L, char *wire, char *local, int64_t ld, int64_t w, int to_wire,
                      int64_t *rows) {
    const mt_layer_kept *kp = &m->kept[L];
    int P = m->par.ep_size, me = m->par.ep_rank, E = (int)m->cfg.experts;
    const int32_t *off = kp->host_offsets;
    int64_t at_row = 0;
    for (int p = 0; p < P; p++) {
        rows[p] = 0;
        for (int e = 0; e < E; e++) {
            if (mt_expert_owner(m, L, e) != p) continue;
            int64_t n = kp->peer_counts[(int64_t)me * E + e];
            if (wire && n) {
                size_t es = mt_dtype_bytes(act_dtype(m), 1);
                char *a = wire + at_row * w * es, *b = local + (int64_t)off[e] * ld * es;
                if (to_wire) copy_rows(m, a, w, b, ld, n, w);
                else copy_rows(m, b, ld, a, w, n, w);
            }
            at_row += n, rows[p] += n;
        }
    }
}

// inbox <-> own (to_own = 1 after receiving; 0 before sending back). rows[q]: rows per peer.
static void inbox_rows(const mt_model *m, int L, char *inbox, char *own, int64_t ld, int64_t w, int to_own,
                       int64_t *rows) {
    const mt_layer_kept *kp = &m->kept[L];
    int P = m->par.ep_size, me = m->par.ep_rank, E = (int)m->cfg.experts;
    const int64_t *C = kp->peer_counts;
    int64_t at_row = 0;
    for (int q = 0; q < P; q++) {
        rows[q] = 0;
        for (int e = 0; e < E; e++) {
            if (mt_expert_owner(m, L, e) != me) continue;
            int64_t n = C[(int64_t)q * E + e], dst = kp->own_offsets[e];
            for (int q2 = 0; q2 < q; q2++) dst += C[(int64_t)q2 * E + e];
            if (inbox && n) {
                size_t es = mt_dtype_bytes(act_dtype(m), 1);
                char *a = inbox + at_row * w * es, *b = own + dst * ld * es;
                if (to_own) copy_rows(m, b, ld, a, w, n, w);
                else copy_rows(m, a, w, b, ld, n, w);
            }
            at_row += n, rows[q] += n;
        }
    }
}

// One exchange: out = 1 sends local rows to their owners (local -> wire -> all-to-all -> inbox ->
// own); out = 0 brings the owners' rows back (own -> inbox -> all-to-all -> wire -> local).
// Rows are the step's storage (f32 on the cpu, bf16 on cuda).
static void exchange(mt_model *m, int L, mt_act *local_rows, int64_t ld_local, mt_act *own_rows, int64_t ld_own,
                     int64_t w, int out) {
    int P = m->par.ep_size, run = !m->counting;
    int64_t Tk = (int64_t)m->B * m->S * m->cfg.top_k, R = mt_ep_own_rows(m, L);
    int64_t *wire_n = mt_xcalloc((size_t)P, sizeof(int64_t)), *inbox_n = mt_xcalloc((size_t)P, sizeof(int64_t));
    mt_dtype dt = act_dtype(m);
    mt_comm_type ct = MT_COMM_F32;
    if (mt_comm_type_of(dt, &ct) != 0) mt_fatal(MT_EXIT_ERROR, "expert parallelism: %s", mt_error_get());
    char *local = local_rows, *own = own_rows;
    char *wire = mt_work_alloc(m->be, mt_dtype_bytes(dt, (size_t)(Tk * w)));
    char *inbox = mt_work_alloc(m->be, mt_dtype_bytes(dt, (size_t)(R * w)));
    // Pack the side that sends; only count the side that receives.
    wire_rows(m, L, run && out ? wire : NULL, local, ld_local, w, 1, wire_n);
    inbox_rows(m, L, run && !out ? inbox : NULL, own, ld_own, w, 0, inbox_n);
    if (m->par.ep) {
        if (out) mt_comm_all_to_all_v(m->par.ep, wire, wire_n, inbox, inbox_n, (size_t)w, ct, 0);
        else mt_comm_all_to_all_v(m->par.ep, inbox, inbox_n, wire, wire_n, (size_t)w, ct, 0);
    }
    if (run && out) inbox_rows(m, L, inbox, own, ld_own, w, 1, inbox_n);
    if (run && !out) wire_rows(m, L, wire, local, ld_local, w, 0, wire_n);
    mt_work_free(m->be, inbox, mt_dtype_bytes(dt, (size_t)(R * w)));
    mt_work_free(m->be, wire, mt_dtype_bytes(dt, (size_t)(Tk * w)));
    free(wire_n), free(inbox_n);
}

// local [T·k rows, ld_local apart] (this rank's rows in expert order) -> own [own rows, ld_own
// apart] on the owners: the first w columns of each row.
void mt_ep_dispatch(mt_model *m, int L, mt_act *own, int64_t ld_own, mt_act *local, int64_t ld_local, int64_t w) {
    exchange(m, L, local, ld_local, own, ld_own, w, 1);
}

// The way back: own -> local on the ranks the rows came from (the same layouts).
void mt_ep_return(mt_model *m, int L, mt_act *local, int64_t ld_local, mt_act *own, int64_t ld_own, int64_t w) {
    exchange(m, L, local, ld_local, own, ld_own, w, 0);
}

// ---------------------------------------------------------------------------------------------
// The end of a run: EP rank 0 collects the trained experts it does not hold.

// One tensor of `bytes` from the expert's owner: into `dst` on EP rank 0 (a tensor it made),
// into scratch on the others that do not own it.
static void bcast_tensor(mt_model *m, mt_tensor *mine, mt_tensor *dst, size_t numel, int owner) {
    int me = m->par.ep_rank;
    size_t bytes = mt_dtype_bytes(m->wdtype, numel);
    mt_comm_type type;
    if (mt_comm_type_of(m->wdtype, &type) != 0) mt_comm_abort(m->par.ep, MT_EXIT_ERROR, "%s", mt_error_get());
    void *buf = me == owner ? mine->data : me == 0 ? dst->data : mt_work_alloc(m->be, bytes);
    mt_comm_broadcast(m->par.ep, buf, numel, type, owner, 0);
    if (me != owner && me != 0) mt_work_free(m->be, buf, bytes);
}

static void gather_linear(mt_model *m, mt_linear *l, int owner) {
    int me = m->par.ep_rank, lora = me == owner ? l->lora != NULL : l->remote == MT_REMOTE_LORA;
    int trains = me == owner ? l->dw != NULL : l->remote == MT_REMOTE_TRAINS;
    if (!lora && !trains) return;
    const mt_model_spec *o = &m->spec;
    int r = o->lora_r;
    if (lora) {
        mt_lora *got = NULL;
        if (me == 0) {
            got = mt_xcalloc(1, sizeof *got);
            if (mt_lora_init(got, m->be, m->wdtype, l->in, l->out, r, mt_model_spec_lora_alpha(o), o->use_rslora,
                             o->lora_dropout, o->seed, 0) != 0)
                mt_comm_abort(m->par.ep, MT_EXIT_OOM, "gathering the experts' LoRA: %s", mt_error_get());
            l->lora = got;
        }
        const mt_lora *src = me == owner ? l->lora : got;
        bcast_tensor(m, src ? src->a : NULL, got ? got->a : NULL, (size_t)(r * l->in), owner);
        bcast_tensor(m, src ? src->b : NULL, got ? got->b : NULL, (size_t)(l->out * r), owner);
        float sd[2] = {src ? src->scale : 0.0f, src ? src->dropout : 0.0f};  // an adapter loaded may set them
        mt_comm_host_broadcast(m->par.ep, sd, 2, MT_COMM_F32, owner);
        if (got) got->scale = sd[0], got->dropout = sd[1];
        return;
    }
    mt_tensor *w = NULL;
    if (me == 0) {
        int64_t shape[2] = {l->out, l->in};
        w = mt_tensor_new(m->be, MT_MEM_TRAIN, m->wdtype, 2, shape);
        mt_tensor *g = w ? mt_tensor_new(m->be, MT_MEM_GRAD, m->wdtype, 2, shape) : NULL;
        if (!g) mt_comm_abort(m->par.ep, MT_EXIT_OOM, "gathering the trained experts: %s", mt_error_get());
        l->w = w, l->dw = g;  // dw marks it trained for the save
    }
    bcast_tensor(m, me == owner ? l->w : NULL, w, (size_t)(l->out * l->in), owner);
}

void mt_model_gather_experts(mt_model *m) {
    if (m->par.ep_size == 1 || !m->par.ep) return;
    for (int L = 0; L < m->cfg.layers; L++)
        for (int e = 0; e < m->cfg.experts; e++) {
            int owner = mt_expert_owner(m, L, e);
            if (owner == 0) continue;
            mt_layer *ly = &m->layers[L];
            gather_linear(m, &ly->w1[e], owner), gather_linear(m, &ly->w2[e], owner),
                gather_linear(m, &ly->w3[e], owner);
        }
}
