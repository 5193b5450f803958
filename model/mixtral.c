// model/mixtral.c — building a Mixtral-family model for one training mode: from a checkpoint
// streamed tensor by tensor through quant/ (dense ones quantized on load, bnb-4bit / INT4 ones
// imported as stored), or from its config alone on the null backend (allocated, never read).
#include "model/mixtral.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/common.h"
#include "core/rng.h"
#include "model/fused_experts.h"
#include "model/model_internal.h"
#include "model/rope.h"
#include "quant/quant.h"

// ---------------------------------------------------------------------------------------------
// Where each checkpoint tensor goes: one slot per tensor of the model built for the run's mode.

typedef enum { FROZEN_DENSE, FROZEN_QUANT, TRAINABLE } weight_role;

typedef struct {
    char name[160];       // checkpoint name, "<module>.weight"
    weight_role role;
    int lora;             // a LoRA is attached (Linears only)
    int ndim;
    int64_t shape[2];
    mt_linear *lin;       // the Linear, or NULL for an embedding or a norm
    mt_tensor **w, **g;   // embedding or norm: its tensor, and its gradient when it trains
    int filled;
    int remote;           // an expert another EP rank holds: skipped unread
    int f32;              // kept fp32 on every backend (a router buffer: model_internal.h's dtype rule)
} slot;

typedef struct {
    mt_model *m;
    slot *slots;          // model order (LoRAs are attached in it)
    slot **by_name;       // sorted, for the loader's lookups
    size_t n, cap;
    int dequantized;      // frozen tensors stored 4-bit, handed over dense
    int other_format;     // 4-bit tensors stored in another format than the run's options
    const char *other_name;
    int layer;            // the layer whose slots are being added (0 for the embedding)
    int lowest;           // the lowest layer with a trainable, counting every rank's experts
    mt_backend *cpu;      // MXFP4 experts wanted dense are dequantized on it (made when needed)
    int mtp_skipped;      // tensors of multi-token-prediction layers, skipped unread
    int unknown;          // tensors that are no weight of this model (nor another rank's): ignored, and said
    char unknown_name[160];
} loader;

static slot *add_slot(loader *ld, const char *name, weight_role role, int ndim, int64_t d0, int64_t d1) {
    if (ld->n == ld->cap) ld->slots = mt_xrealloc(ld->slots, (ld->cap = ld->cap ? 2 * ld->cap : 256) * sizeof(slot));
    slot *s = &ld->slots[ld->n++];
    memset(s, 0, sizeof *s);
    snprintf(s->name, sizeof s->name, "%s", name);
    s->role = role, s->ndim = ndim, s->shape[0] = d0, s->shape[1] = d1;
    return s;
}

static slot *dense_slot(loader *ld, const char *name, weight_role role, int ndim, int64_t d0, int64_t d1,
                        mt_tensor **w, mt_tensor **g) {
    slot *s = add_slot(ld, name, role, ndim, d0, d1);
    s->w = w, s->g = g;
    if (role == TRAINABLE) ld->lowest = MT_MIN(ld->lowest, ld->layer);
    return s;
}

// `remote`: an expert another EP rank holds; the Linear records only what it would be there.
static void linear_slot(loader *ld, const char *module, mt_linear *l, int64_t out, int64_t in, weight_role role,
                        int lora, int remote) {
    char name[208];
    snprintf(name, sizeof name, "%.160s.weight", module);
    slot *s = add_slot(ld, name, role, 2, out, in);
    s->lin = l, s->lora = lora, s->remote = remote;
    l->out = out, l->in = in;
    if (remote) l->remote = lora ? MT_REMOTE_LORA : role == TRAINABLE ? MT_REMOTE_TRAINS : MT_REMOTE_FROZEN;
    if (role == TRAINABLE || lora) ld->lowest = MT_MIN(ld->lowest, ld->layer);
}

// A frozen Linear is 4-bit when --quant is a format and --quant-targets names its kind.
static weight_role frozen_role(const mt_model_spec *o, unsigned qtarget) {
    return o->quant != MT_QUANT_NONE && (o->quant_targets & qtarget) ? FROZEN_QUANT : FROZEN_DENSE;
}

// Expert e of layer L is one --layers and --experts name.
static int expert_chosen(const mt_model_spec *o, int L, int e) {
    return mt_index_set_contains(&o->layers, L) && mt_index_set_contains(&o->experts, e);
}

// MLA's tensors (model/weights.c mla_weights): the projections are attention Linears for
// --quant-targets and --mode full; LoRA targets: q covers q_proj / q_a_proj / q_b_proj, k
// kv_a_proj_with_mqa, v kv_b_proj, o o_proj (trainer/options.c also takes those names).
static void mla_slots(loader *ld, int L, const char *p, int lora) {
    mt_model *m = ld->m;
    const mt_model_config *c = &m->cfg;
    const mt_model_spec *o = &m->spec;
    mt_layer *ly = &m->layers[L];
    int full = o->mode == MT_MODE_FULL;
    weight_role lin = full ? TRAINABLE : frozen_role(o, MT_QTARGET_ATTN), vec = full ? TRAINABLE : FROZEN_DENSE;
    int64_t h = c->hidden, nh = c->heads, qr = c->q_lora_rank, kvr = c->kv_lora_rank, kva = kvr + c->qk_rope_dim;
    char n[160];
    if (qr) {
        snprintf(n, sizeof n, "%s.self_attn.q_a_proj", p);
        linear_slot(ld, n, &ly->q_a, qr, h, lin, lora && (o->targets & MT_TARGET_Q), 0);
        if (c->o_bias) {
            snprintf(n, sizeof n, "%s.self_attn.q_a_proj.bias", p);
            dense_slot(ld, n, vec, 1, qr, 0, &ly->bias[0], &ly->dbias[0]);
        }
        snprintf(n, sizeof n, "%s.self_attn.q_a_layernorm.weight", p);
        dense_slot(ld, n, vec, 1, qr, 0, &ly->q_a_norm, &ly->dq_a_norm);
    }
    snprintf(n, sizeof n, "%s.self_attn.%s", p, qr ? "q_b_proj" : "q_proj");
    linear_slot(ld, n, &ly->q, nh * c->head_dim, qr ? qr : h, lin, lora && (o->targets & MT_TARGET_Q), 0);
    snprintf(n, sizeof n, "%s.self_attn.kv_a_proj_with_mqa", p);
    linear_slot(ld, n, &ly->kv_a, kva, h, lin, lora && (o->targets & MT_TARGET_K), 0);
    if (c->o_bias) {
        snprintf(n, sizeof n, "%s.self_attn.kv_a_proj_with_mqa.bias", p);
        dense_slot(ld, n, vec, 1, kva, 0, &ly->bias[1], &ly->dbias[1]);
    }
    snprintf(n, sizeof n, "%s.self_attn.kv_a_layernorm.weight", p);
    dense_slot(ld, n, vec, 1, kvr, 0, &ly->kv_a_norm, &ly->dkv_a_norm);
    snprintf(n, sizeof n, "%s.self_attn.kv_b_proj", p);
    linear_slot(ld, n, &ly->kv_b, nh * (c->qk_nope_dim + c->v_head_dim), kvr, lin, lora && (o->targets & MT_TARGET_V), 0);
    snprintf(n, sizeof n, "%s.self_attn.o_proj", p);
    linear_slot(ld, n, &ly->o, h, nh * c->v_head_dim, lin, lora && (o->targets & MT_TARGET_O), 0);
    if (c->o_bias) {
        snprintf(n, sizeof n, "%s.self_attn.o_proj.bias", p);
        dense_slot(ld, n, vec, 1, h, 0, &ly->bias[3], &ly->dbias[3]);
    }
}

static void layer_slots(loader *ld, int L) {
    mt_model *m = ld->m;
    const mt_model_config *c = &m->cfg;
    const mt_model_spec *o = &m->spec;
    mt_layer *ly = &m->layers[L];
    int in_layers = mt_index_set_contains(&o->layers, L), full = o->mode == MT_MODE_FULL;
    int lora = o->mode == MT_MODE_LORA && in_layers;
    int64_t h = c->hidden, qd = c->heads * c->head_dim, kvd = c->kv_heads * c->head_dim;
    char p[64], n[160];
    snprintf(p, sizeof p, "model.layers.%d", L);
    snprintf(n, sizeof n, "%s.input_layernorm.weight", p);
    dense_slot(ld, n, full ? TRAINABLE : FROZEN_DENSE, 1, h, 0, &ly->ln1, &ly->dln1);
    snprintf(n, sizeof n, "%s.post_attention_layernorm.weight", p);
    dense_slot(ld, n, full ? TRAINABLE : FROZEN_DENSE, 1, h, 0, &ly->ln2, &ly->dln2);
    struct { mt_linear *l; const char *name; int64_t out, in; unsigned target; } attn[] = {
        {&ly->q, "q_proj", qd, h, MT_TARGET_Q}, {&ly->k, "k_proj", kvd, h, MT_TARGET_K},
        {&ly->v, "v_proj", kvd, h, MT_TARGET_V}, {&ly->o, "o_proj", h, qd, MT_TARGET_O},
    };
    const mt_family *fam = mt_config_family(c);
    if (c->mla) mla_slots(ld, L, p, lora);
    for (size_t i = 0; i < MT_ARRAY_LEN(attn) && !c->mla; i++) {
        snprintf(n, sizeof n, "%s.self_attn.%s", p, attn[i].name);
        linear_slot(ld, n, attn[i].l, attn[i].out, attn[i].in, full ? TRAINABLE : frozen_role(o, MT_QTARGET_ATTN),
                    lora && (o->targets & attn[i].target), 0);
    }
    for (size_t i = 0; i < MT_ARRAY_LEN(attn) && !c->mla; i++)  // biases: dense, training in --mode full only
        if (i < 3 ? c->qkv_bias : c->o_bias) {
            snprintf(n, sizeof n, "%s.self_attn.%s.bias", p, attn[i].name);
            dense_slot(ld, n, full ? TRAINABLE : FROZEN_DENSE, 1, attn[i].out, 0, &ly->bias[i], &ly->dbias[i]);
        }
    if (fam->attn_sinks) {  // a logit per head: trains with the other dense tensors, in --mode full
        snprintf(n, sizeof n, "%s.self_attn.sinks", p);
        dense_slot(ld, n, full ? TRAINABLE : FROZEN_DENSE, 1, c->heads, 0, &ly->sinks, &ly->dsinks);
    }
    if (c->qk_norm != MT_QK_NORM_NONE) {  // [head_dim] per head, or the whole projection's width
        int per_head = c->qk_norm == MT_QK_NORM_HEAD;
        snprintf(n, sizeof n, "%s.self_attn.q_norm.weight", p);
        dense_slot(ld, n, full ? TRAINABLE : FROZEN_DENSE, 1, per_head ? c->head_dim : qd, 0, &ly->qn, &ly->dqn);
        snprintf(n, sizeof n, "%s.self_attn.k_norm.weight", p);
        dense_slot(ld, n, full ? TRAINABLE : FROZEN_DENSE, 1, per_head ? c->head_dim : kvd, 0, &ly->kn, &ly->dkn);
    }
    // The MLP of a dense layer or the shared expert: 4-bit while frozen when --quant-targets names
    // the experts (every MLP's projections, quant/quant.h), the shared gate [1, H] dense; LoRA
    // where the experts' targets name its projection (PEFT's target_modules would too).
    int64_t mf = !mt_config_layer_is_moe(c, L) ? c->dense_intermediate : c->shared_intermediate;
    ly->dense = !mt_config_layer_is_moe(c, L);
    if (mf) {
        const char *sub = ly->dense ? "" : ".", *shared = ly->dense ? "" : fam->shared_expert;
        struct { int64_t out, in; unsigned target; } mp[3] = {
            {mf, h, MT_TARGET_W1}, {h, mf, MT_TARGET_W2}, {mf, h, MT_TARGET_W3}};
        for (int i = 0; i < 3; i++) {
            snprintf(n, sizeof n, "%s.%s.%s%s%s", p, fam->moe_module, shared, sub, fam->mlp[i]);
            linear_slot(ld, n, &ly->mlp[i], mp[i].out, mp[i].in, full ? TRAINABLE : frozen_role(o, MT_QTARGET_EXPERTS),
                        lora && (o->targets & mp[i].target), 0);
        }
        if (!ly->dense && fam->shared_gate) {
            snprintf(n, sizeof n, "%s.%s.%s", p, fam->moe_module, fam->shared_gate);
            linear_slot(ld, n, &ly->shared_gate, 1, h, full ? TRAINABLE : FROZEN_DENSE, 0, 0);
        }
    }
    if (ly->dense) return;  // no router, no experts
    // The router: full precision unless --quant-targets names it (then 4-bit only while frozen).
    int gate_trains = full || ((o->mode == MT_MODE_ROUTER || o->mode == MT_MODE_UNFREEZE) && in_layers);
    snprintf(n, sizeof n, "%s.%s.%s", p, fam->moe_module, fam->router);
    linear_slot(ld, n, &ly->gate, c->experts, h, gate_trains ? TRAINABLE : frozen_role(o, MT_QTARGET_ROUTER),
                lora && (o->targets & MT_TARGET_GATE), 0);
    if (fam->router_bias) {  // dense; trains where the router's weight does
        snprintf(n, sizeof n, "%s.%s.%s.bias", p, fam->moe_module, fam->router);
        dense_slot(ld, n, gate_trains ? TRAINABLE : FROZEN_DENSE, 1, c->experts, 0, &ly->gate_bias, &ly->dgate_bias);
    }
    if (fam->score_bias) {  // fp32, frozen: no gradient moves it (--router-bias-update does, by DeepSeek's rule)
        snprintf(n, sizeof n, "%s.%s.%s.%s", p, fam->moe_module, fam->router, fam->score_bias);
        dense_slot(ld, n, FROZEN_DENSE, 1, c->experts, 0, &ly->score_bias, NULL)->f32 = 1;
    }
    if (fam->fused_experts) {  // the fused biases, split per projection (fused_sink); full mode trains them
        int64_t bd[3] = {c->intermediate, h, c->intermediate};
        for (int i = 0; i < 3; i++) {
            snprintf(n, sizeof n, "%s.%s.experts.%s_bias", p, fam->moe_module, fam->expert[i]);
            dense_slot(ld, n, full ? TRAINABLE : FROZEN_DENSE, 2, c->experts, bd[i], &ly->ebias[i], &ly->debias[i]);
        }
    }
    for (int e = 0; e < c->experts; e++) {
        int chosen = expert_chosen(o, L, e);
        weight_role role = full || (o->mode == MT_MODE_UNFREEZE && chosen) ? TRAINABLE
                                                                           : frozen_role(o, MT_QTARGET_EXPERTS);
        struct { mt_linear *l; const char *name; int64_t out, in; unsigned target; } ex[] = {
            {&ly->w1[e], fam->expert[0], c->intermediate, h, MT_TARGET_W1},
            {&ly->w2[e], fam->expert[1], h, c->intermediate, MT_TARGET_W2},
            {&ly->w3[e], fam->expert[2], c->intermediate, h, MT_TARGET_W3},
        };
        for (size_t i = 0; i < MT_ARRAY_LEN(ex); i++) {
            snprintf(n, sizeof n, "%s.%s.experts.%d.%s", p, fam->moe_module, e, ex[i].name);
            linear_slot(ld, n, ex[i].l, ex[i].out, ex[i].in, role, lora && chosen && (o->targets & ex[i].target),
                        !mt_expert_is_local(m, L, e));
        }
    }
}

static int by_name_cmp(const void *a, const void *b) {
    return strcmp((*(slot *const *)a)->name, (*(slot *const *)b)->name);
}

// Every tensor of the model in checkpoint order, with the model's arrays allocated to hold them.
static void loader_init(loader *ld, mt_model *m) {
    memset(ld, 0, sizeof *ld);
    ld->m = m;
    ld->lowest = (int)m->cfg.layers;
    const mt_model_config *c = &m->cfg;
    weight_role outer = m->spec.mode == MT_MODE_FULL ? TRAINABLE : FROZEN_DENSE;
    m->layers = mt_xcalloc((size_t)c->layers, sizeof(mt_layer));
    dense_slot(ld, "model.embed_tokens.weight", outer, 2, c->vocab, c->hidden, &m->embed, &m->dembed);
    for (int L = 0; L < c->layers; L++) {
        mt_layer *ly = &m->layers[L];
        ly->w1 = mt_xcalloc((size_t)c->experts, sizeof(mt_linear));
        ly->w2 = mt_xcalloc((size_t)c->experts, sizeof(mt_linear));
        ly->w3 = mt_xcalloc((size_t)c->experts, sizeof(mt_linear));
        ld->layer = L;
        layer_slots(ld, L);
    }
    ld->layer = (int)c->layers;  // the head: training it alone needs no layer's backward
    dense_slot(ld, "model.norm.weight", outer, 1, c->hidden, 0, &m->norm, &m->dnorm);
    linear_slot(ld, "lm_head", &m->lm_head, c->vocab, c->hidden, outer, 0, 0);
    ld->by_name = mt_xmalloc(ld->n * sizeof *ld->by_name);
    for (size_t i = 0; i < ld->n; i++) ld->by_name[i] = &ld->slots[i];
    qsort(ld->by_name, ld->n, sizeof *ld->by_name, by_name_cmp);
}

static void loader_free(loader *ld) {
    mt_backend_free(ld->cpu);
    free(ld->slots);
    free(ld->by_name);
}

static slot *find_slot(loader *ld, const char *name) {
    slot key, *kp = &key;
    snprintf(key.name, sizeof key.name, "%s", name);
    slot **hit = bsearch(&kp, ld->by_name, ld->n, sizeof *ld->by_name, by_name_cmp);
    return hit ? *hit : NULL;
}

// ---------------------------------------------------------------------------------------------
// Placing one tensor

// A dense tensor in the model's storage dtype, from `data` (any float dtype; NULL: none, as on
// the null backend), and a zeroed gradient when it trains.
static int place_dense(loader *ld, slot *s, const void *data, mt_dtype dtype) {
    mt_backend *be = ld->m->be;
    mt_dtype dt = s->f32 ? MT_F32 : ld->m->wdtype;
    mt_tensor *t = mt_tensor_new(be, s->role == TRAINABLE ? MT_MEM_TRAIN : MT_MEM_BASE, dt, s->ndim, s->shape);
    if (!t) return -1;
    if (data) {
        void *host = mt_xmalloc(t->nbytes);  // one tensor at a time: host peak ≈ the largest one
        mt_convert(host, dt, data, dtype, (size_t)mt_tensor_numel(t));
        mt_tensor_upload(t, host);
        free(host);
    }
    mt_tensor *g = NULL;
    if (s->role == TRAINABLE) {
        if (!(g = mt_tensor_new(be, MT_MEM_GRAD, dt, s->ndim, s->shape))) return mt_tensor_free(t), -1;
        be->ops->fill_zero(be, g->data, g->nbytes);
    }
    if (s->lin) s->lin->w = t, s->lin->dw = g;
    else {
        *s->w = t;
        if (s->g) *s->g = g;  // NULL: a tensor that never trains (the router's score bias)
    }
    return 0;
}

static int shape_matches(const slot *s, const mt_quant_item *it) {
    if (it->ndim != s->ndim) return 0;
    for (int d = 0; d < s->ndim; d++)
        if (it->shape[d] != s->shape[d]) return 0;
    return 1;
}

// Notes a 4-bit tensor stored in another format than the run asks for (it is used as stored).
static void note_format(loader *ld, const slot *s, const mt_qweight *q) {
    const mt_model_spec *o = &ld->m->spec;
    int bs = mt_q4_blocksize_or_default(o->quant, o->quant_blocksize);
    int dq = o->double_quant && q->type != MT_QUANT_INT4 && q->type != MT_QUANT_MXFP4;
    if (q->type != o->quant || q->blocksize != bs || q->double_quant != dq)
        if (ld->other_format++ == 0) ld->other_name = s->name;
}

static int place(loader *ld, slot *s, mt_quant_item *it) {
    if (!shape_matches(s, it)) {
        mt_error_set("tensor '%s' has shape [%lld%s] where the config implies [%lld%s]", s->name,
                     (long long)it->shape[0], it->ndim > 1 ? ", ..." : "", (long long)s->shape[0],
                     s->ndim > 1 ? ", ..." : "");
        return -1;
    }
    if (s->filled++) {
        mt_error_set("tensor '%s' appears twice in the checkpoint", s->name);
        return -1;
    }
    if (s->role == FROZEN_QUANT) {
        if (!it->q) {
            mt_error_set("tensor '%s' arrived dense where a 4-bit weight was asked for", s->name);
            return -1;
        }
        note_format(ld, s, it->q);
        s->lin->q = mt_xmalloc(sizeof *s->lin->q);
        *s->lin->q = *it->q;  // taken from the loader
        memset(it->q, 0, sizeof *it->q);
        return 0;
    }
    if (it->dequantized && s->role == TRAINABLE) {
        mt_error_set("tensor '%s' trains in this mode but is stored 4-bit in the checkpoint; training a "
                     "dequantized copy would start from the quantization error: use the unquantized "
                     "(bf16/f16/f32) checkpoint it was made from", s->name);
        return -1;
    }
    ld->dequantized += it->dequantized;
    return place_dense(ld, s, it->data, it->dtype);
}

// ---------------------------------------------------------------------------------------------
// Sources: a checkpoint streamed through quant/, or the config alone on the null backend

// ---------------------------------------------------------------------------------------------
// gpt-oss's fused experts (docs/families.md "gpt-oss"): gate_up_proj [E, H, 2f] holds expert e's
// gate (w1) in its even columns and up (w3) in its odd ones, down_proj [E, f, H] is w2ᵀ; the
// biases [E, 2f] interleave alike. Each expert's slices become the per-expert slots (their
// names as Qwen's: experts.e.gate_proj.weight), quantized on load when the run asks.

static const char *name_ends(const char *s, const char *suffix) {
    size_t n = strlen(s), k = strlen(suffix);
    return n >= k && strcmp(s + n - k, suffix) == 0 ? s + n - k : NULL;
}

// One expert's Linear from its f32 values [out, in], as a dense or 4-bit item.
static int place_expert(loader *ld, slot *s, const float *w) {
    const mt_model_spec *o = &ld->m->spec;
    mt_quant_item it = {.name = s->name, .ndim = 2, .shape = {s->shape[0], s->shape[1]}, .data = w, .dtype = MT_F32};
    mt_qweight q;
    memset(&q, 0, sizeof q);
    if (s->role == FROZEN_QUANT) {
        if (mt_qweight_quantize(&q, ld->m->be, s->name, w, s->shape[0], s->shape[1], o->quant, o->quant_blocksize,
                                o->double_quant) != 0)
            return -1;
        it.q = &q, it.data = NULL;
    }
    int rc = place(ld, s, &it);
    mt_qweight_free(&q);  // a no-op once placed
    return rc;
}

// One expert's Linear [out, in] from its MXFP4 rows (blocks out·in/2 bytes, scales out·in/32):
// kept as stored where the slot is 4-bit, else dequantized. Unlike a bitsandbytes checkpoint made
// from a bf16 one, gpt-oss was released in MXFP4: those values are the model, with no original to
// prefer, so an expert that trains (unfreeze, full) starts from them.
static int place_expert_mxfp4(loader *ld, slot *s, const uint8_t *blocks, const uint8_t *scales) {
    int64_t out = s->shape[0], in = s->shape[1];
    size_t nb = (size_t)(out * in / 2), ns = (size_t)(out * in / 32);
    mt_qweight q;
    memset(&q, 0, sizeof q);
    mt_quant_item it = {.name = s->name, .ndim = 2, .shape = {out, in}};
    if (s->role == FROZEN_QUANT) {
        if (mt_qweight_from_mxfp4(&q, ld->m->be, s->name, blocks, nb, scales, ns, out, in) != 0) return -1;
        it.q = &q;
        int rc = place(ld, s, &it);
        mt_qweight_free(&q);
        return rc;
    }
    if (!ld->cpu) ld->cpu = mt_backend_cpu_new();
    if (mt_qweight_from_mxfp4(&q, ld->cpu, s->name, blocks, nb, scales, ns, out, in) != 0) return -1;
    float *w = mt_xmalloc((size_t)(out * in) * sizeof(float));
    mt_qweight_dequantize_rows_cpu(&q, w, 0, out);
    mt_qweight_free(&q);
    it.data = w, it.dtype = MT_F32, it.dequantized = s->role != TRAINABLE;
    int rc = place(ld, s, &it);
    free(w);
    return rc;
}

// gpt-oss's MXFP4 experts as stored: gate_up_proj_blocks [E, 2f, H/32, 16] (row 2i expert e's
// gate row i, row 2i + 1 its up row i) and down_proj_blocks [E, H, f/32, 16] (w2's rows), with
// their scales. Rows move whole (a row's blocks run along its input), so nothing is re-quantized.
static int fused_mxfp4(loader *ld, mt_quant_item *it, int down, int pre) {
    const mt_model_config *c = &ld->m->cfg;
    const mt_family *fam = mt_config_family(c);
    int64_t E = c->experts, H = c->hidden, f = c->intermediate;
    int64_t rows = down ? H : 2 * f, in = down ? f : H;
    if (it->ndim != 4 || it->shape[0] != E || it->shape[1] != rows || in % 32 || it->shape[2] != in / 32) {
        mt_error_set("tensor '%s': expected MXFP4 blocks [%lld, %lld, %lld, 16] for this config", it->name,
                     (long long)E, (long long)rows, (long long)(in / 32));
        return -1;
    }
    size_t rb = (size_t)in / 2, rs = (size_t)in / 32;  // bytes of one row's blocks, scales
    uint8_t *b = down ? NULL : mt_xmalloc((size_t)f * rb), *sc = down ? NULL : mt_xmalloc((size_t)f * rs);
    char n[200];
    int rc = 0;
    for (int64_t e = 0; e < E && rc == 0; e++) {
        const uint8_t *eb = it->mx_blocks + (size_t)e * rows * rb, *es = it->mx_scales + (size_t)e * rows * rs;
        for (int k = 0; k < (down ? 1 : 2) && rc == 0; k++) {
            snprintf(n, sizeof n, "%.*s.experts.%lld.%s.weight", pre, it->name, (long long)e,
                     fam->expert[down ? 1 : k ? 2 : 0]);
            slot *s = find_slot(ld, n);
            if (!s || s->remote) continue;
            if (!down)
                for (int64_t i = 0; i < f; i++) {
                    memcpy(b + i * rb, eb + (size_t)(2 * i + k) * rb, rb);
                    memcpy(sc + i * rs, es + (size_t)(2 * i + k) * rs, rs);
                }
            rc = place_expert_mxfp4(ld, s, down ? eb : b, down ? es : sc);
        }
    }
    free(b), free(sc);
    return rc;
}

// A fused tensor of `prefix` (".../mlp.experts"): 1 when it was one (placed or failed: *rc), 0 when not.
static int fused_sink(loader *ld, mt_quant_item *it, int *rc) {
    const mt_model_config *c = &ld->m->cfg;
    const mt_family *fam = mt_config_family(c);
    const char *leaf = NULL;
    int which = -1;  // 0 gate_up_proj, 1 down_proj, 2 gate_up_proj_bias, 3 down_proj_bias
    static const char *const suffix[] = {".experts.gate_up_proj", ".experts.down_proj", ".experts.gate_up_proj_bias",
                                         ".experts.down_proj_bias"};
    for (int i = 0; i < 4 && which < 0; i++)
        if ((leaf = name_ends(it->name, suffix[i]))) which = i;
    if (fam->fused_experts && which < 0 && it->mx_blocks) {
        const char *mx[] = {".experts.gate_up_proj_blocks", ".experts.down_proj_blocks"};
        for (int i = 0; i < 2; i++)
            if ((leaf = name_ends(it->name, mx[i]))) return *rc = fused_mxfp4(ld, it, i, (int)(leaf - it->name)), 1;
    }
    if (it->mx_blocks) {  // MXFP4 anywhere else: not a tensor this family stores so
        mt_error_set("tensor '%s': MXFP4 blocks where %s stores none", it->name, c->model_type);
        return *rc = -1, 1;
    }
    if (!fam->fused_experts || which < 0) return 0;
    int64_t E = c->experts, H = c->hidden, f = c->intermediate;
    int64_t want[4][3] = {{E, H, 2 * f}, {E, f, H}, {E, 2 * f, 0}, {E, H, 0}};
    int nd = which < 2 ? 3 : 2;
    int ok = it->data && it->ndim == nd;
    for (int d = 0; ok && d < nd; d++) ok = it->shape[d] == want[which][d];
    if (!ok) {
        char third[32] = "";
        if (nd == 3) snprintf(third, sizeof third, ", %lld", (long long)want[which][2]);
        mt_error_set("tensor '%s': expected a dense [%lld, %lld%s] for this config (%d dimensions given)", it->name,
                     (long long)want[which][0], (long long)want[which][1], third, it->ndim);
        return *rc = -1, 1;
    }
    char n[200];
    int pre = (int)(leaf - it->name);
    size_t numel = (size_t)(E * want[which][1] * (nd == 3 ? want[which][2] : 1));
    float *all = mt_xmalloc(numel * sizeof(float));
    mt_quant_item_to_f32(it, all);
    *rc = 0;
    if (which >= 2) {  // biases: [E, 2f] split into w1's and w3's [E, f]; [E, H] as it is
        if (which == 3) {
            snprintf(n, sizeof n, "%.*s.experts.%s_bias", pre, it->name, fam->expert[1]);
            slot *s = find_slot(ld, n);
            mt_quant_item b = {.name = n, .ndim = 2, .shape = {E, H}, .data = all, .dtype = MT_F32};
            *rc = s ? place(ld, s, &b) : 0;
        } else {
            float *half = mt_xmalloc((size_t)(2 * E * f) * sizeof(float));  // gate's [E, f], then up's
            mt_fused_bias_split(all, E, f, half, half + E * f);
            for (int k = 0; k < 2 && *rc == 0; k++) {
                snprintf(n, sizeof n, "%.*s.experts.%s_bias", pre, it->name, fam->expert[k ? 2 : 0]);
                slot *s = find_slot(ld, n);
                mt_quant_item b = {.name = n, .ndim = 2, .shape = {E, f}, .data = half + k * E * f, .dtype = MT_F32};
                *rc = s ? place(ld, s, &b) : 0;
            }
            free(half);
        }
        free(all);
        return 1;
    }
    float *w = mt_xmalloc((size_t)(f * H) * sizeof(float));
    for (int64_t e = 0; e < E && *rc == 0; e++) {
        for (int k = 0; k < (which == 0 ? 2 : 1) && *rc == 0; k++) {
            int lin = which == 1 ? 1 : k ? 2 : 0;  // w1 / w3 from gate_up, w2 from down
            mt_fused_get(all + e * H * f * (which == 0 ? 2 : 1), mt_fused_part_of(lin, H, f), w);
            snprintf(n, sizeof n, "%.*s.experts.%lld.%s.weight", pre, it->name, (long long)e, fam->expert[lin]);
            slot *s = find_slot(ld, n);
            if (s && !s->remote) *rc = place_expert(ld, s, w);
        }
    }
    free(w);
    free(all);
    return 1;
}

static int sink(void *ctx, mt_quant_item *it) {
    loader *ld = ctx;
    int rc;
    if (fused_sink(ld, it, &rc)) return rc;
    slot *s = find_slot(ld, it->name);
    if (!s && !ld->unknown++) snprintf(ld->unknown_name, sizeof ld->unknown_name, "%s", it->name);
    return s && !s->remote ? place(ld, s, it) : 0;  // not a weight of this model (or rank): ignored
}

// A tensor of DeepSeek's multi-token-prediction layers (model.layers.N.., N = num_hidden_layers,
// num_nextn_predict_layers of them): transformers' modeling drops them on load, and so does moetrain.
static int mtp_tensor(const loader *ld, const char *name) {
    const mt_model_config *c = &ld->m->cfg;
    int L;
    return c->mtp_layers > 0 && sscanf(name, "model.layers.%d.", &L) == 1 && L >= c->layers &&
           L < c->layers + c->mtp_layers;
}

static int want_4bit(void *ctx, const char *name) {
    slot *s = find_slot(ctx, name);
    if (s && s->remote) return -1;
    if (!s && mtp_tensor(ctx, name)) return ((loader *)ctx)->mtp_skipped++, -1;  // skipped unread
    return s && s->role == FROZEN_QUANT;  // trainables and dense-kept targets arrive dense
}

static int load_checkpoint(loader *ld, const char *dir) {
    const mt_model_spec *o = &ld->m->spec;
    mt_quant_load_opts q = {.type = o->quant, .blocksize = o->quant_blocksize, .double_quant = o->double_quant,
                            .targets = o->quant_targets, .want = want_4bit, .want_ctx = ld,
                            .fp8_block = {ld->m->cfg.fp8_block[0], ld->m->cfg.fp8_block[1]}};
    return mt_quant_load(dir, ld->m->be, &q, sink, ld);
}

// Random weights (benchmarks of full-size shapes, nothing read): N(0, 0.02²) like transformers'
// initializer_range, norms 1. One random matrix per shape serves every tensor of that shape, so
// building Mixtral-8x7B costs a few draws and one quantization per shape.
static int build_random(loader *ld, uint64_t seed) {
    const mt_model_spec *o = &ld->m->spec;
    // Values are drawn once per shape and reused; so is a shape's 4-bit form: quantized once,
    // then copied on the device from the first weight placed (Mixtral-8x7B's 768 expert weights:
    // 3 quantizations, not 187 GB of f32 uploaded to be quantized; no extra memory held).
    typedef struct { int64_t d0, d1; float *v; const mt_qweight *q; } shape_values;
    shape_values cache[8];
    memset(cache, 0, sizeof cache);
    int n_cache = 0, rc = 0;
    mt_rng rng;
    mt_rng_seed(&rng, seed, 0x72616e64ull);
    for (size_t i = 0; i < ld->n && rc == 0; i++) {
        slot *s = &ld->slots[i];
        if (s->remote) continue;
        int64_t d1 = s->ndim > 1 ? s->shape[1] : 1;
        shape_values *c = NULL;
        for (int k = 0; k < n_cache && !c; k++)
            if (cache[k].d0 == s->shape[0] && cache[k].d1 == d1) c = &cache[k];
        float *v = c ? c->v : NULL;
        if (!v) {
            v = mt_xmalloc((size_t)(s->shape[0] * d1) * sizeof(float));
            for (int64_t j = 0; j < s->shape[0] * d1; j++) v[j] = s->ndim == 1 ? 1.0f : 0.02f * mt_rng_normal(&rng);
            if (n_cache < (int)MT_ARRAY_LEN(cache)) c = &cache[n_cache++], c->d0 = s->shape[0], c->d1 = d1, c->v = v;
        }
        mt_quant_item it = {.name = s->name, .ndim = s->ndim, .shape = {s->shape[0], s->shape[1]}, .data = v,
                            .dtype = MT_F32};
        mt_qweight q;
        memset(&q, 0, sizeof q);
        if (s->role == FROZEN_QUANT) {
            rc = c && c->q ? mt_qweight_clone(&q, c->q, s->name)
                           : mt_qweight_quantize(&q, ld->m->be, s->name, v, s->shape[0], s->shape[1], o->quant,
                                                 o->quant_blocksize, o->double_quant);
            it.q = &q, it.data = NULL;
        }
        if (rc == 0) rc = place(ld, s, &it);
        if (rc == 0 && c && !c->q && s->role == FROZEN_QUANT) c->q = s->lin->q;  // placed: the model owns it
        mt_qweight_free(&q);
        if (!c) free(v);
    }
    for (int k = 0; k < n_cache; k++) free(cache[k].v);
    return rc;
}

// The null backend: every tensor allocated (counted), none read; 4-bit ones in the run's format.
static int build_counted(loader *ld) {
    const mt_model_spec *o = &ld->m->spec;
    for (size_t i = 0; i < ld->n; i++) {
        slot *s = &ld->slots[i];
        if (s->remote) continue;
        mt_quant_item it = {.name = s->name, .ndim = s->ndim, .shape = {s->shape[0], s->shape[1]}};
        mt_qweight q;
        memset(&q, 0, sizeof q);
        if (s->role == FROZEN_QUANT) {
            // gpt-oss's MXFP4 experts are kept as stored whatever --quant says (fused_mxfp4)
            int stored = ld->m->cfg.mxfp4 && (mt_quant_target_of(s->name) & MT_QTARGET_EXPERTS);
            if (mt_qweight_alloc(&q, ld->m->be, s->name, s->shape[0], s->shape[1], stored ? MT_QUANT_MXFP4 : o->quant,
                                 stored ? 32 : o->quant_blocksize, stored ? 0 : o->double_quant, 0) != 0)
                return -1;
            it.q = &q;
        }
        int rc = place(ld, s, &it);
        mt_qweight_free(&q);  // a no-op once placed
        if (rc) return -1;
    }
    return 0;
}

// Expert e's Linear of `arr` [E] when l is one of them (addresses compared as integers: l may
// belong to any array).
static int in_experts(const mt_linear *arr, int64_t E, const mt_linear *l, int *e) {
    uintptr_t a = (uintptr_t)arr, p = (uintptr_t)l;
    if (!arr || p < a || p >= a + (uintptr_t)E * sizeof *arr) return 0;
    *e = (int)((p - a) / sizeof *arr);
    return 1;
}

// Which expert Linear a slot's is: 1 w1, 3 w3 of expert *e in layer *L, else 0.
static int expert_linear(const mt_model *m, const mt_linear *l, int *L, int *e) {
    for (int i = 0; i < m->cfg.layers; i++) {
        const mt_layer *ly = &m->layers[i];
        if (in_experts(ly->w1, m->cfg.experts, l, e)) return *L = i, 1;
        if (in_experts(ly->w3, m->cfg.experts, l, e)) return *L = i, 3;
    }
    return 0;
}

// The module name of a slot ("<module>.weight") and its stream id.
static uint64_t module_stream(const slot *s, char *module, size_t n) {
    snprintf(module, n, "%.*s", (int)(strlen(s->name) - strlen(".weight")), s->name);
    return mt_hash_string(module);
}

// The LoRAs, in slot order. On the GPU step an expert's w1 and w3 adapters are made as a pair
// (lora/lora.h mt_lora_init_pair: A1 and A3 adjacent), when both have one here: the step then
// multiplies x by [A1; A3] once (model/experts_gpu.c). The same values either way.
static int attach_loras(loader *ld) {
    mt_model *m = ld->m;
    const mt_model_spec *o = &m->spec;
    const double alpha = mt_model_spec_lora_alpha(o);
    const int64_t E = m->cfg.experts;
    // each expert's w1 and w3 slots that get a LoRA here ([L·E + e]; the GPU step only)
    const size_t cells = (size_t)(m->cfg.layers * E + 1);
    slot **w1 = gpu_step(m) ? mt_xcalloc(cells, sizeof *w1) : NULL, **w3 = w1 ? mt_xcalloc(cells, sizeof *w3) : NULL;
    for (size_t i = 0; w1 && i < ld->n; i++) {
        slot *s = &ld->slots[i];
        int L, e, which = s->lora && !s->remote && s->lin ? expert_linear(m, s->lin, &L, &e) : 0;
        if (which) (which == 1 ? w1 : w3)[(int64_t)L * E + e] = s;
    }
    int rc = 0;
    for (size_t i = 0; rc == 0 && i < ld->n; i++) {
        slot *s = &ld->slots[i], *partner = NULL;
        if (!s->lora || s->remote) continue;
        int L, e, which = w1 && s->lin ? expert_linear(m, s->lin, &L, &e) : 0;
        if (which) {
            slot *p1 = w1[(int64_t)L * E + e], *p3 = w3[(int64_t)L * E + e];
            int pair = p1 && p3 && p1->lin->in == p3->lin->in && p1->lin->out == p3->lin->out;
            if (pair && which == 3) continue;  // made with its w1
            if (pair) partner = p3;
        }
        char module[160], module3[160];
        uint64_t stream = module_stream(s, module, sizeof module);
        s->lin->lora = mt_xcalloc(1, sizeof *s->lin->lora);
        if (partner) {
            uint64_t stream3 = module_stream(partner, module3, sizeof module3);
            partner->lin->lora = mt_xcalloc(1, sizeof *partner->lin->lora);
            rc = mt_lora_init_pair(s->lin->lora, partner->lin->lora, m->be, m->wdtype, s->lin->in, s->lin->out,
                                   o->lora_r, alpha, o->use_rslora, o->lora_dropout, o->seed, stream, stream3);
        } else {
            rc = mt_lora_init(s->lin->lora, m->be, m->wdtype, s->lin->in, s->lin->out, o->lora_r, alpha, o->use_rslora,
                              o->lora_dropout, o->seed, stream);
        }
        if (rc) mt_error_prefix("loading %s", module);
    }
    free(w1), free(w3);
    return rc ? -1 : 0;
}

static int finish(loader *ld) {
    mt_model *m = ld->m;
    const mt_model_spec *o = &m->spec;
    for (size_t i = 0; i < ld->n; i++)
        if (!ld->slots[i].filled && !ld->slots[i].remote) {
            mt_error_set("tensor '%s' is missing from the checkpoint", ld->slots[i].name);
            return -1;
        }
    if (attach_loras(ld) != 0) return -1;
    if (ld->dequantized)
        mt_info("%d frozen tensors stored 4-bit were dequantized on load (--quant %s and --quant-targets keep "
                "them dense)", ld->dequantized, mt_quant_name(o->quant));
    if (ld->unknown)  // as transformers' "unexpected keys": a checkpoint of another shape of model would show here
        mt_warn("%d tensors of the checkpoint are no part of this %s model and were ignored (the first: %s)",
                ld->unknown, m->cfg.model_type, ld->unknown_name);
    if (ld->mtp_skipped)
        mt_info("%d tensors of the checkpoint's %lld multi-token-prediction layer(s) (model.layers.%lld on) were "
                "skipped: transformers' modeling does not use them, and moetrain trains the main model only",
                ld->mtp_skipped, (long long)ld->m->cfg.mtp_layers, (long long)ld->m->cfg.layers);
    if (ld->other_format)
        mt_info("%d 4-bit tensors (e.g. %s) are stored in another format than --quant %s --blocksize %d asks: "
                "used as stored (re-quantizing would compound the error)", ld->other_format, ld->other_name,
                mt_quant_name(o->quant), mt_q4_blocksize_or_default(o->quant, o->quant_blocksize));
    return 0;
}

// The first part of the config's family that the step does not implement yet (docs/families.md),
// or NULL. The model is refused by that part's name, on every backend, so no family ever runs
// with a part silently left out.
static const char *missing_part(const mt_model_config *c) {
    if (c->clip_qkv > 0 && c->qk_norm == MT_QK_NORM_NONE) return "clip_qkv without a q/k norm";
    return NULL;
}

static int check_opts(const mt_model_config *c, const mt_model_spec *o) {
    const char *missing = missing_part(c);
    if (missing) {
        mt_error_set("model_type %s: the training step does not implement %s yet (init, plan and config "
                     "reading support this family; see docs/families.md)", c->model_type, missing);
        return -1;
    }
    for (int i = 0; i < o->layers.count; i++)
        if (!o->layers.all && o->layers.items[i] >= c->layers) {
            mt_error_set("--layers names layer %d but the model has %lld", o->layers.items[i], (long long)c->layers);
            return -1;
        }
    for (int i = 0; i < o->experts.count; i++)
        if (!o->experts.all && o->experts.items[i] >= c->experts) {
            mt_error_set("--experts names expert %d but the model has %lld", o->experts.items[i], (long long)c->experts);
            return -1;
        }
    if (o->mode == MT_MODE_FULL && o->quant != MT_QUANT_NONE) {
        mt_error_set("--mode full trains every weight, so the base cannot be 4-bit: add --quant none");
        return -1;
    }
    if (o->mode == MT_MODE_LORA && o->lora_r < 1) {
        mt_error_set("--r must be at least 1 in lora mode");
        return -1;
    }
    if (o->checkpointing < MT_CKPT_FULL || o->checkpointing >= MT_CKPT_AUTO) {  // auto: the planner's to resolve
        mt_error_set("--recompute %s reached the model unresolved: the trainer and the planner choose none, "
                     "attention, experts or full for it", mt_ckpt_name(o->checkpointing));
        return -1;
    }
    if (c->router_jitter_noise != 0.0) {
        mt_error_set("router_jitter_noise %g is not supported (Mixtral uses 0)", c->router_jitter_noise);
        return -1;
    }
    return 0;
}

int mt_model_load(mt_model *m, mt_backend *be, const char *dir, const mt_model_spec *spec) {
    mt_model_config cfg;
    memset(m, 0, sizeof *m);
    if (mt_model_config_load(dir, &cfg) != 0) return -1;
    return mt_model_build(m, be, &cfg, dir, spec);
}

// Every 4-bit Linear of the model outside the experts (with `visit`), for the shared
// dequantization scratch or the kept bf16 copies. The experts have neither: their grouped calls
// dequantize into scratch slots of their own (model/experts_gpu.c), or read the last layers'
// experts kept in bf16 (keep_experts below).
static void each_4bit(mt_model *m, void (*visit)(mt_model *, mt_linear *, int64_t *), int64_t *acc) {
    for (int L = 0; L < m->cfg.layers; L++) {
        mt_layer *ly = &m->layers[L];
        mt_linear *ls[] = {&ly->q, &ly->k, &ly->v, &ly->o, &ly->gate, &ly->mlp[0], &ly->mlp[1], &ly->mlp[2],
                           &ly->q_a, &ly->kv_a, &ly->kv_b};
        for (size_t i = 0; i < MT_ARRAY_LEN(ls); i++) if (ls[i]->q) visit(m, ls[i], acc);
    }
}
static void largest(mt_model *m, mt_linear *l, int64_t *acc) { (void)m, *acc = MT_MAX(*acc, l->out * l->in); }
static void attach(mt_model *m, mt_linear *l, int64_t *acc) { (void)acc, l->dequant = m->dequant; }

// The GPU step: one bf16 scratch that every 4-bit Linear dequantizes its W into, in turn (the
// step runs one Linear at a time on one stream), instead of an allocation per call.
static int share_dequant_scratch(mt_model *m) {
    int64_t n = 0;
    each_4bit(m, largest, &n);
    if (n == 0) return 0;
    if (!(m->dequant = mt_tensor_new(m->be, MT_MEM_WORK, MT_BF16, 1, &n))) return -1;
    each_4bit(m, attach, NULL);
    return 0;
}

// --dequant-cache: every 4-bit Linear outside the experts keeps a bf16 copy (base memory: as
// frozen as the 4-bit weight), dequantized once here, which the step reads instead of
// dequantizing at each use. *acc: 0, or -1 once an allocation failed.
static void keep_dequantized(mt_model *m, mt_linear *l, int64_t *acc) {
    int64_t shape[2] = {l->out, l->in};
    if (*acc || !(l->wcache = mt_tensor_new(m->be, MT_MEM_BASE, MT_BF16, 2, shape))) {
        *acc = -1;
        return;
    }
    if (mt_qweight_dequantize(l->q, l->wcache) != 0) *acc = -1;
}

static int keep_dequantized_all(mt_model *m) {
    int64_t failed = 0;
    each_4bit(m, keep_dequantized, &failed);
    if (failed) mt_error_prefix("--dequant-cache: the bf16 copies of the 4-bit weights outside the experts");
    return failed ? -1 : 0;
}

// --expert-cache N: the last N MoE layers keep their frozen 4-bit experts (those this rank holds)
// dequantized in bf16, in base memory, laid out as the grouped calls (model/grouped_cuda.cu) want
// them: [W1;W3] with room for w1's and w3's LoRA B beside (mt_experts_xs_extra), W2 with room for
// w2's B beside (mt_experts_a_extra) and for its A under (mt_experts_dys_extra); rows with room
// beside rounded up to 8 elements (16 bytes: the strided dequantization's and cuBLASLt's), as a
// slot's are (model/grouped.h mt_grouped_slot_ld). Each expert is dequantized here, then its 4-bit
// codes are given back (nothing reads them again; the mt_qweight stays as the Linear's
// description), so a kept layer costs its bf16 less its codes, and base's peak is the end's plus
// the last expert's codes. The planner counts the same bytes (plan/plan.c expert_cache).
static int keep_experts(mt_model *m, int n) {
    const mt_model_config *c = &m->cfg;
    int moe = (int)mt_config_moe_layers(c);
    if (n > 0 && m->spec.mode != MT_MODE_LORA && m->spec.mode != MT_MODE_ROUTER) {  // the planner's rule
        mt_error_set("--expert-cache %d: --mode %s trains experts; only a run whose experts are all frozen (--mode "
                     "lora or router) keeps them in bf16", n, mt_mode_name(m->spec.mode));
        return -1;
    }
    if (n > moe) {
        mt_error_set("--expert-cache %d: the model has %d MoE layers", n, moe);
        return -1;
    }
    const int64_t h = c->hidden, f = c->intermediate, E = c->experts;
    const int64_t x13 = mt_experts_xs_extra(m), x2 = mt_experts_a_extra(m);
    const int64_t ld13 = x13 ? (h + x13 + 7) / 8 * 8 : h, ld2 = x2 ? (f + x2 + 7) / 8 * 8 : f;
    for (int L = c->layers - 1, kept = 0; L >= 0 && kept < n; L--) {
        mt_layer *ly = &m->layers[L];
        if (ly->dense) continue;
        kept++;
        const int64_t shape[2][2] = {{2 * f, ld13}, {h + (mt_experts_dys_extra(m, L) ? m->spec.lora_r : 0), ld2}};
        for (int i = 0; i < 2; i++) ly->experts_bf16[i] = mt_xcalloc((size_t)E, sizeof(mt_tensor *));
        for (int64_t e = 0; e < E; e++) {
            mt_qweight *q[3] = {ly->w1[e].q, ly->w3[e].q, ly->w2[e].q};
            if (!q[0] || !q[1] || !q[2]) continue;  // another rank's, or trained dense
            for (int i = 0; i < 2; i++)
                if (!(ly->experts_bf16[i][e] = mt_tensor_new(m->be, MT_MEM_BASE, MT_BF16, 2, shape[i]))) {
                    mt_error_prefix("--expert-cache: layer %d expert %lld's bf16 weights", L, (long long)e);
                    return -1;
                }
            char *k13 = ly->experts_bf16[0][e]->data, *k2 = ly->experts_bf16[1][e]->data;
            const mt_tensor dst[3] = {mt_view2(m->be, k13, MT_BF16, f, h, ld13),
                                      mt_view2(m->be, k13 ? k13 + mt_dtype_bytes(MT_BF16, (size_t)(f * ld13)) : NULL,
                                               MT_BF16, f, h, ld13),
                                      mt_view2(m->be, k2, MT_BF16, h, f, ld2)};
            for (int i = 0; i < 3; i++)
                if (mt_qweight_dequantize_2d(q[i], &dst[i]) != 0) {
                    mt_error_prefix("--expert-cache: layer %d expert %lld", L, (long long)e);
                    return -1;
                }
            for (int i = 0; i < 3; i++) mt_qweight_release_codes(q[i]);
        }
    }
    // The codes went back to the cuda backend's pool in pieces no larger than one expert's Linear:
    // handed on to the driver, so that the step's larger buffers do not come on top of them.
    if (n > 0 && m->be->ops->kind == MT_BACKEND_CUDA && mt_cuda_mem_trim(m->be) != 0) return -1;
    return 0;
}

// RoPE's table from the config, once; the GPU step reads a device copy (model/rope.h).
static int rope_table_init(mt_model *m) {
    mt_rope_params p;
    mt_rope_params_from_config(&m->cfg, &p);
    int64_t half = mt_config_rotary_dim(&m->cfg) / 2;
    m->rope_inv_freq = mt_xcalloc((size_t)(half > 0 ? half : 1), sizeof(float));
    if (mt_rope_table(&p, m->rope_inv_freq, &m->rope_scale) != 0) return -1;
    if (!gpu_step(m)) return 0;
    // A small device buffer beside batch_dev and aux_dev (ledger: act; plan/plan.c counts it there).
    if (!(m->rope_inv_freq_dev = mt_tensor_new(m->be, MT_MEM_ACT, MT_F32, 1, &half))) return -1;
    if (m->be->ops->kind == MT_BACKEND_CUDA) mt_tensor_upload(m->rope_inv_freq_dev, m->rope_inv_freq);
    return 0;
}

int mt_model_build(mt_model *m, mt_backend *be, const mt_model_config *cfg, const char *dir,
                   const mt_model_spec *spec) {
    return mt_model_build_par(m, be, cfg, dir, spec, NULL);
}

// Whether expert e of layer L trains (its weights, or a LoRA on one of its Linears). A dense
// layer has no experts: none of its takes a place in the round-robin.
static int expert_trains(const mt_model *m, int L, int e) {
    const mt_model_spec *o = &m->spec;
    int chosen = expert_chosen(o, L, e) && mt_config_layer_is_moe(&m->cfg, L);
    return o->mode == MT_MODE_FULL || (o->mode == MT_MODE_UNFREEZE && chosen) ||
           (o->mode == MT_MODE_LORA && chosen && (o->targets & (MT_TARGET_W1 | MT_TARGET_W2 | MT_TARGET_W3)));
}

// The placement of mixtral.h: trainable experts round-robin over the whole model, frozen ones
// filling each rank's share of the layer.
static void place_experts(mt_model *m) {
    int P = m->par.ep_size, E = (int)m->cfg.experts;
    m->owner = mt_xcalloc((size_t)(m->cfg.layers * E), sizeof(int32_t));
    int *left = mt_xcalloc((size_t)P, sizeof(int));
    int64_t next = 0;  // the round-robin's position, carried from layer to layer
    for (int L = 0; L < m->cfg.layers; L++) {
        for (int p = 0; p < P; p++) left[p] = E / P + (p < E % P);
        for (int e = 0; e < E; e++) {
            if (!expert_trains(m, L, e)) continue;
            while (left[next % P] == 0) next++;
            m->owner[(int64_t)L * E + e] = (int32_t)(next % P);
            left[next++ % P]--;
        }
        for (int e = 0, p = 0; e < E; e++) {
            if (expert_trains(m, L, e)) continue;
            while (left[p] == 0) p++;
            m->owner[(int64_t)L * E + e] = p;
            left[p]--;
        }
    }
    free(left);
}

int mt_model_build_par(mt_model *m, mt_backend *be, const mt_model_config *cfg, const char *dir,
                       const mt_model_spec *spec, const mt_model_par *par) {
    memset(m, 0, sizeof *m);
    m->cfg = *cfg;
    m->par = par ? *par : (mt_model_par){.ep_rank = 0, .ep_size = 1};
    if (check_opts(&m->cfg, spec) != 0) return -1;
    if (m->par.ep_size < 1 || m->par.ep_rank < 0 || m->par.ep_rank >= m->par.ep_size ||
        m->par.ep_size > cfg->experts) {
        mt_error_set("expert parallelism over %d ranks (this one %d) needs 1 to %lld ranks, one expert each at least",
                     m->par.ep_size, m->par.ep_rank, (long long)cfg->experts);
        return -1;
    }
    if (mt_config_family(cfg)->fused_experts && spec->mode == MT_MODE_FULL && m->par.ep_size > 1) {
        mt_error_set("--mode full with --ep %d: %s's expert biases are one tensor a layer, which expert "
                     "parallelism would split across ranks; train them on one rank, or use --mode unfreeze "
                     "(its biases stay frozen)", m->par.ep_size, cfg->model_type);
        return -1;
    }
    const char *name = dir ? dir : "the config";
    if (m->cfg.tie_word_embeddings) {
        mt_error_set("%s: tied word embeddings are not supported yet (Mixtral unties them)", name);
        return -1;
    }
    m->be = be;
    m->spec = *spec;
    place_experts(m);
    m->aux_coef = (float)m->cfg.router_aux_loss_coef;
    m->seq_aux_coef = m->cfg.seq_aux ? (float)m->cfg.aux_loss_alpha : 0.0f;
    m->recompute_attn = mt_ckpt_attention(spec->checkpointing), m->recompute_mlp = mt_ckpt_mlp(spec->checkpointing);
    m->counting = be->ops->kind == MT_BACKEND_NULL;
    m->wdtype = act_dtype(m);
    loader ld;
    loader_init(&ld, m);
    int rc = m->counting ? build_counted(&ld) : !dir ? build_random(&ld, spec->seed) : load_checkpoint(&ld, dir);
    int named = rc && !m->counting;  // mt_quant_load's errors name the folder already
    if (rc == 0) rc = finish(&ld);
    m->lowest_trainable = m->dembed ? 0 : ld.lowest;  // from every rank's slots: the same on all
    loader_free(&ld);
    if (rc == 0 && gpu_step(m)) rc = spec->dequant_cache ? keep_dequantized_all(m) : share_dequant_scratch(m);
    if (rc == 0 && gpu_step(m)) rc = keep_experts(m, spec->expert_cache);
    if (rc == 0 && be->ops->kind == MT_BACKEND_CUDA && mt_config_moe_layers(&m->cfg)) mt_rows_decide(m);
    if (rc == 0) rc = rope_table_init(m);
    if (rc) {
        if (!named) mt_error_prefix("%s", name);
        mt_model_free(m);
        return -1;
    }
    return 0;
}

void mt_model_placement(const mt_model *m, char *buf, size_t n) {
    size_t used = 0;
    buf[0] = 0;
    int E = (int)m->cfg.experts;
    for (int p = 0; p < m->par.ep_size && used < n; p++) {
        int trains = 0, held = 0;
        for (int L = 0; L < m->cfg.layers; L++)
            for (int e = 0; e < E; e++)
                if (mt_expert_owner(m, L, e) == p) held++, trains += expert_trains(m, L, e);
        used += (size_t)snprintf(buf + used, n - used, "%sEP rank %d: %d experts (%d trainable), layer 0:", p ? "; " : "",
                                 p, held, trains);
        for (int e = 0; e < E && used < n; e++)
            if (mt_expert_owner(m, 0, e) == p) used += (size_t)snprintf(buf + used, n - used, " %d", e);
    }
}

int mt_layer_attn_linears(mt_layer *ly, const mt_model_config *c, mt_linear **ls, const char **names) {
    static const char *const std[] = {"self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj"};
    static const char *const mla[] = {"self_attn.q_a_proj", "self_attn.q_b_proj", "self_attn.kv_a_proj_with_mqa",
                                      "self_attn.kv_b_proj", "self_attn.o_proj"};
    int n = 0;
    if (!c->mla) {
        mt_linear *l[] = {&ly->q, &ly->k, &ly->v, &ly->o};
        for (; n < 4; n++) ls[n] = l[n], names ? names[n] = std[n] : 0;
        return n;
    }
    mt_linear *l[] = {&ly->q_a, &ly->q, &ly->kv_a, &ly->kv_b, &ly->o};
    for (int i = c->q_lora_rank ? 0 : 1; i < 5; i++, n++) {
        ls[n] = l[i];
        if (names) names[n] = i == 1 && !c->q_lora_rank ? std[0] : mla[i];
    }
    return n;
}

mt_linear *mt_model_find_linear(mt_model *m, const char *module) {
    if (strcmp(module, "lm_head") == 0) return &m->lm_head;
    const mt_family *fam = mt_config_family(&m->cfg);
    int L, e, n = 0;
    char rest[96];
    if (sscanf(module, "model.layers.%d.%95s%n", &L, rest, &n) != 2 || L < 0 || L >= m->cfg.layers)
        return NULL;
    mt_layer *ly = &m->layers[L];
    const char *attn[MT_ATTN_LINEARS];
    mt_linear *al[MT_ATTN_LINEARS];
    for (int i = 0, na = mt_layer_attn_linears(ly, &m->cfg, al, attn); i < na; i++)
        if (strcmp(rest, attn[i]) == 0) return al[i];
    char want[96], which[24];
    for (int i = 0; i < 3; i++) {  // a dense layer's MLP, or the shared expert and its gate
        if (ly->dense) snprintf(want, sizeof want, "%s.%s", fam->moe_module, fam->mlp[i]);
        else snprintf(want, sizeof want, "%s.%s.%s", fam->moe_module, fam->shared_expert ? fam->shared_expert : "-", fam->mlp[i]);
        if (ly->mlp[i].out && strcmp(rest, want) == 0) return &ly->mlp[i];
    }
    snprintf(want, sizeof want, "%s.%s", fam->moe_module, fam->shared_gate ? fam->shared_gate : "-");
    if (ly->shared_gate.out && strcmp(rest, want) == 0) return &ly->shared_gate;
    if (ly->dense) return NULL;
    snprintf(want, sizeof want, "%s.%s", fam->moe_module, fam->router);
    if (strcmp(rest, want) == 0) return &ly->gate;
    int wl = snprintf(want, sizeof want, "%s.experts.", fam->moe_module);
    if (strncmp(rest, want, (size_t)wl) == 0 && sscanf(rest + wl, "%d.%23s", &e, which) == 2 && e >= 0 &&
        e < m->cfg.experts) {
        char check[96];
        snprintf(check, sizeof check, "%d.%s", e, which);
        if (strcmp(check, rest + wl) != 0) return NULL;
        mt_linear *ex[3] = {&ly->w1[e], &ly->w2[e], &ly->w3[e]};  // the family's gate, down, up
        for (int i = 0; i < 3; i++)
            if (strcmp(which, fam->expert[i]) == 0) return ex[i];
    }
    return NULL;
}

const char *mt_mode_name(mt_mode m) {
    static const char *n[] = {"lora", "router", "unfreeze", "full"};
    return m <= MT_MODE_FULL ? n[m] : "?";
}

const char *mt_ckpt_name(mt_ckpt c) {
    static const char *n[] = {"full", "none", "attention", "experts", "auto"};
    return c >= MT_CKPT_FULL && c <= MT_CKPT_AUTO ? n[c] : "?";
}

double mt_model_spec_lora_alpha(const mt_model_spec *s) { return s->lora_alpha == s->lora_alpha ? s->lora_alpha : s->lora_r; }
