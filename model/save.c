// model/save.c — what a run produces: the LoRAs as a PEFT adapter folder (lora mode), or the
// trained full-precision tensors under their checkpoint names (router, unfreeze, full), and that
// file read back (resume, eval, merge).
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "core/common.h"
#include "core/safetensors.h"
#include "lora/peft.h"
#include "model/fused_experts.h"
#include "model/mixtral.h"
#include "model/weights.h"

// ---------------------------------------------------------------------------------------------
// The Linears, by module path, in Hugging Face's module order

enum { LIN_OTHER, LIN_ROUTER, LIN_EXPERT };

typedef struct {
    size_t n;
    char (*name)[128];  // "model.layers.0.block_sparse_moe.experts.3.w1"
    mt_linear **l;
    unsigned char *kind;  // LIN_*
} linear_list;

static void linears_list(mt_model *m, linear_list *out) {
    const mt_model_config *c = &m->cfg;
    size_t cap = (size_t)(c->layers * (10 + 3 * c->experts) + 1);
    out->name = mt_xcalloc(cap, sizeof *out->name);
    out->l = mt_xcalloc(cap, sizeof *out->l);
    out->kind = mt_xcalloc(cap, 1);
    out->n = 0;
    const mt_family *fam = mt_config_family(c);  // the family's module names
    for (int L = 0; L < c->layers; L++) {
        mt_layer *ly = &m->layers[L];
        mt_linear *al[MT_ATTN_LINEARS];
        const char *an[MT_ATTN_LINEARS];
        for (int i = 0, na = mt_layer_attn_linears(ly, c, al, an); i < na; i++) {
            snprintf(out->name[out->n], sizeof out->name[0], "model.layers.%d.%s", L, an[i]);
            out->l[out->n++] = al[i];
        }
        for (int i = 0; i < 3 && ly->mlp[i].out; i++) {  // a dense layer's MLP or the shared expert
            snprintf(out->name[out->n], sizeof out->name[0], "model.layers.%d.%s.%s%s%s", L, fam->moe_module,
                     ly->dense ? "" : fam->shared_expert, ly->dense ? "" : ".", fam->mlp[i]);
            out->l[out->n++] = &ly->mlp[i];
        }
        if (ly->shared_gate.out) {
            snprintf(out->name[out->n], sizeof out->name[0], "model.layers.%d.%s.%s", L, fam->moe_module,
                     fam->shared_gate);
            out->l[out->n++] = &ly->shared_gate;
        }
        if (ly->dense) continue;
        snprintf(out->name[out->n], sizeof out->name[0], "model.layers.%d.%s.%s", L, fam->moe_module, fam->router);
        out->kind[out->n] = LIN_ROUTER;
        out->l[out->n++] = &ly->gate;
        for (int e = 0; e < c->experts; e++) {
            mt_linear *el[] = {&ly->w1[e], &ly->w2[e], &ly->w3[e]};
            for (int i = 0; i < 3; i++) {
                snprintf(out->name[out->n], sizeof out->name[0], "model.layers.%d.%s.experts.%d.%s", L,
                         fam->moe_module, e, fam->expert[i]);
                out->kind[out->n] = LIN_EXPERT;
                out->l[out->n++] = el[i];
            }
        }
    }
    snprintf(out->name[out->n], sizeof out->name[0], "lm_head");
    out->l[out->n++] = &m->lm_head;
}

static void linears_free(linear_list *ll) {
    free(ll->name), free(ll->l), free(ll->kind);
    memset(ll, 0, sizeof *ll);
}

// ---------------------------------------------------------------------------------------------
// PEFT adapter

// The decimal of fewest digits that is `f` as a float, as a double: 0.05f -> 0.05, not
// 0.05000000074505806 (the values a float-held scale or dropout came from).
static double shortest_of_float(float f) {
    char buf[32];
    for (int p = 1; p <= 9; p++) {
        snprintf(buf, sizeof buf, "%.*g", p, (double)f);
        if ((float)strtod(buf, NULL) == f) break;
    }
    return strtod(buf, NULL);
}

static int fill_lora(void *ctx, size_t i, char which, float *dst) {
    const mt_lora *lo = ((mt_lora *const *)ctx)[i];
    mt_tensor_download_f32(which == 'A' ? lo->a : lo->b, dst);  // bf16 on the GPU step
    return 0;
}

// Whether Linear i's LoRA goes to target_parameters (PEFT's ParamWrapper) in layout fmt, and
// *always: in every layout (gpt-oss's fused experts and its router, a router transformers 4 keeps
// as a bare parameter). In v5 also every router and expert, and a kept Linear whose leaf PEFT's
// converter would rewrite (lora/peft.h, mt_peft_write_v5).
static int param_target(const mt_family *fam, const linear_list *ll, size_t i, int fmt, int *always) {
    int moe = ll->kind[i] != LIN_OTHER;
    *always = (fam->fused_experts && moe) || (fam->router_param && ll->kind[i] == LIN_ROUTER);
    if (*always || moe) return *always || fmt == MT_PEFT_V5;
    if (fmt != MT_PEFT_V5) return 0;
    const char *dot = strrchr(ll->name[i], '.'), *leaf = dot ? dot + 1 : ll->name[i];
    for (int k = 0; k < 3; k++)
        if (strcmp(leaf, fam->expert[k]) == 0) return 1;
    return strcmp(leaf, fam->router) == 0;
}

int mt_model_adapter_dropout_check(mt_model *m, int peft_format, int warn) {
    const mt_family *fam = mt_config_family(&m->cfg);
    linear_list ll;
    linears_list(m, &ll);
    int rc = 0, warned = !warn;
    for (size_t i = 0; i < ll.n && rc == 0; i++) {
        const mt_lora *lo = ll.l[i]->lora;
        int always;
        if (!lo || !(lo->dropout > 0) || !param_target(fam, &ll, i, peft_format, &always)) continue;
        // PEFT's ParamWrapper raises "does not work with lora_dropout != 0": it cannot apply dropout
        // to the input of a weight it adds B·A to. What PEFT refuses to build, moetrain refuses to train.
        if (always) {
            mt_error_set("--dropout %g: PEFT cannot load %s's LoRA with dropout (it reaches '%s' only through "
                         "target_parameters, whose ParamWrapper refuses lora_dropout != 0, on transformers 4 and 5 "
                         "alike): use --dropout 0, or leave the %s out of --targets", (double)lo->dropout,
                         m->cfg.model_type, ll.name[i], ll.kind[i] == LIN_ROUTER ? "router (gate)" : "experts (w1,w2,w3)");
            rc = -1;
        } else if (!warned) {
            mt_warn("--dropout %g with --peft-format v5: PEFT will refuse this adapter ('%s' and the like are "
                    "target_parameters, whose ParamWrapper refuses lora_dropout != 0); --peft-format v4 loads in "
                    "PEFT on transformers 4, or train with --dropout 0", (double)lo->dropout, ll.name[i]);
            warned = 1;
        }
    }
    linears_free(&ll);
    return rc;
}

int mt_model_save_adapter_as(mt_model *m, const char *dir, const char *base_model_name, int peft_format) {
    if (mt_model_adapter_dropout_check(m, peft_format, 0) != 0) return mt_error_prefix("%s", dir), -1;
    linear_list ll;
    linears_list(m, &ll);
    unsigned char *adapted = mt_xcalloc(ll.n, 1);
    const char **names = mt_xcalloc(ll.n, sizeof *names);
    mt_peft_module *mods = mt_xcalloc(ll.n, sizeof *mods);
    mt_lora **loras = mt_xcalloc(ll.n, sizeof *loras);
    size_t n = 0;
    const mt_lora *first = NULL;
    int rc = -1;
    for (size_t i = 0; i < ll.n; i++) {
        names[i] = ll.name[i];
        mt_lora *lo = ll.l[i]->lora;
        if (!lo) continue;
        if (!first) first = lo;
        // one r and one scale: PEFT's rank_pattern / alpha_pattern are not written
        if (lo->r != first->r || lo->scale != first->scale) {
            mt_error_set("%s: LoRA of '%s' has r=%d scale=%g where others have r=%d scale=%g "
                         "(per-module rank or alpha is not supported)", dir, ll.name[i], lo->r,
                         (double)lo->scale, first->r, (double)first->scale);
            goto done;
        }
        adapted[i] = 1;
        mods[n] = (mt_peft_module){ll.name[i], lo->in, lo->out, NULL, NULL};
        loras[n++] = lo;
    }
    if (!first) {
        mt_error_set("%s: the model has no LoRA to save (built in --mode %s)", dir, mt_mode_name(m->spec.mode));
        goto done;
    }
    const mt_model_spec *o = &m->spec;
    mt_peft_config cfg = {.r = first->r, .use_rslora = o->use_rslora};
    double root = o->use_rslora ? sqrt((double)cfg.r) : (double)cfg.r;
    // alpha: the run's (--alpha, default r) unless the LoRAs were given another scale since
    // (an adapter loaded with its own alpha): then the one their scale implies.
    cfg.lora_alpha = mt_model_spec_lora_alpha(o);
    if ((float)(cfg.lora_alpha / root) != first->scale)
        cfg.lora_alpha = shortest_of_float((float)((double)first->scale * root));
    cfg.lora_dropout = (float)o->lora_dropout == first->dropout ? o->lora_dropout : shortest_of_float(first->dropout);
    const mt_family *fam = mt_config_family(&m->cfg);
    // gpt-oss's experts are fused in transformers 4.57 too, and PEFT 0.17's ParamWrapper reads its
    // [E, H, 2f] as (experts, in, out) as PEFT 0.21's does (is_transposed): the fused layout is the
    // only one PEFT has for them, on both stacks (docs/families.md "Adapters").
    for (size_t i = 0; i < ll.n && fam->fused_experts; i++)
        if (adapted[i] && ll.kind[i] != LIN_OTHER) peft_format = MT_PEFT_V5;
    if (peft_format == MT_PEFT_V5) {
        mt_peft_v5_model md = {m->cfg.layers, m->cfg.experts, fam->moe_module, fam->router,
                               {fam->expert[0], fam->expert[1], fam->expert[2]}, names, adapted, ll.n,
                               fam->fused_experts};
        rc = mt_peft_write_v5(dir, &cfg, base_model_name, &md, mods, n, fill_lora, loras);
        goto done;
    }
    rc = mt_peft_write_v4(dir, &cfg, base_model_name, names, adapted, ll.n, fam->router_param ? fam->router : NULL,
                          mods, n, fill_lora, loras);
done:
    free(adapted), free(names), free(mods), free(loras);
    linears_free(&ll);
    return rc;
}

int mt_model_save_adapter(mt_model *m, const char *dir, const char *base_model_name) {
    return mt_model_save_adapter_as(m, dir, base_model_name, MT_PEFT_V4);
}

// ---------------------------------------------------------------------------------------------
// Trained full-precision tensors

// The model's tensor for checkpoint tensor `w` when it trains in this run, else NULL.
static mt_tensor *trained_tensor(mt_model *m, const mt_weight_desc *w) {
    if (w->kind == MT_WEIGHT_EMBED) return m->dembed ? m->embed : NULL;
    if (w->kind == MT_WEIGHT_BIAS) {
        static const char *proj[] = {".q_proj.bias", ".k_proj.bias", ".v_proj.bias", ".o_proj.bias"},
                          *mla[] = {".q_a_proj.bias", ".kv_a_proj_with_mqa.bias"};
        mt_layer *ly = &m->layers[w->layer];
        for (int i = 0; i < 4; i++)
            if (strstr(w->name, proj[i]) || (i < 2 && strstr(w->name, mla[i]))) return ly->dbias[i] ? ly->bias[i] : NULL;
        return m->bias_load ? mt_model_score_bias_named(m, w->name) : NULL;  // moved by --router-bias-update
    }
    if (w->kind == MT_WEIGHT_PARAM) {  // gpt-oss's sinks and router bias
        mt_layer *ly = &m->layers[w->layer];
        if (strstr(w->name, ".self_attn.sinks")) return ly->dsinks ? ly->sinks : NULL;
        return ly->dgate_bias ? ly->gate_bias : NULL;
    }
    if (w->kind == MT_WEIGHT_EXPERTS) return NULL;  // split per expert (trained_list_make)
    if (w->kind == MT_WEIGHT_NORM) {
        if (w->layer < 0) return m->dnorm ? m->norm : NULL;
        mt_layer *ly = &m->layers[w->layer];
        if (strstr(w->name, ".input_layernorm.")) return ly->dln1 ? ly->ln1 : NULL;
        if (strstr(w->name, ".post_attention_layernorm.")) return ly->dln2 ? ly->ln2 : NULL;
        if (strstr(w->name, ".self_attn.q_norm.")) return ly->dqn ? ly->qn : NULL;
        if (strstr(w->name, ".self_attn.k_norm.")) return ly->dkn ? ly->kn : NULL;
        if (strstr(w->name, ".self_attn.q_a_layernorm.")) return ly->dq_a_norm ? ly->q_a_norm : NULL;
        if (strstr(w->name, ".self_attn.kv_a_layernorm.")) return ly->dkv_a_norm ? ly->kv_a_norm : NULL;
        return NULL;
    }
    char module[128];
    size_t len = strlen(w->name) - strlen(".weight");
    memcpy(module, w->name, len);
    module[len] = 0;
    mt_linear *l = mt_model_find_linear(m, module);
    return l && l->dw ? l->w : NULL;
}

// t2: gpt-oss's gate_up_proj_bias [E, 2f], whose file tensor interleaves w1's bias (t, even
// columns) with w3's (t2, odd), as the checkpoint does.
typedef struct {
    size_t n;
    const mt_weight_desc **desc;
    mt_tensor **t, **t2;
    mt_weight_desc *all, *split;  // split: experts' Linears out of gpt-oss's fused tensors
} trained_list;

// The trained experts of fused tensor `w` (gpt-oss) as Linears of their own, by the names of the
// per-expert slots (model/fused_experts.h): the fused tensor holds frozen experts too, which an
// unfreeze run does not have in full precision.
static void add_split_experts(mt_model *m, trained_list *tl, const mt_weight_desc *w) {
    const mt_family *fam = mt_config_family(&m->cfg);
    size_t pre;
    int down = mt_fused_tensor_of(w->name, &pre) == 1;
    for (int64_t e = 0; e < w->shape[0]; e++)
        for (int k = 0; k < (down ? 1 : 2); k++) {
            int which = down ? 1 : k ? 2 : 0;
            char module[sizeof w->name - 8];  // room for ".weight"
            snprintf(module, sizeof module, "%.*s.%lld.%s", (int)pre, w->name, (long long)e, fam->expert[which]);
            mt_linear *l = mt_model_find_linear(m, module);
            if (!l || !l->dw) continue;
            mt_weight_desc *d = &tl->split[tl->n];
            *d = (mt_weight_desc){.kind = MT_WEIGHT_LINEAR, .ndim = 2, .shape = {l->out, l->in}, .layer = w->layer,
                                  .expert = (int)e};
            snprintf(d->name, sizeof d->name, "%s.weight", module);
            tl->desc[tl->n] = d;
            tl->t[tl->n++] = l->w;
        }
}

static void trained_list_make(mt_model *m, trained_list *tl) {
    size_t n = mt_weights_list(&m->cfg, &tl->all), cap = n + 3 * (size_t)(m->cfg.layers * m->cfg.experts);
    tl->desc = mt_xcalloc(cap, sizeof *tl->desc);
    tl->t = mt_xcalloc(cap, sizeof *tl->t), tl->t2 = mt_xcalloc(cap, sizeof *tl->t2);
    tl->split = mt_xcalloc(cap, sizeof *tl->split);
    tl->n = 0;
    for (size_t i = 0; i < n; i++) {
        const mt_weight_desc *w = &tl->all[i];
        if (w->kind == MT_WEIGHT_EXPERTS) {
            add_split_experts(m, tl, w);
            continue;
        }
        mt_layer *ly = w->layer >= 0 ? &m->layers[w->layer] : NULL;
        mt_tensor *t = trained_tensor(m, w), *t2 = NULL;
        if (ly && w->kind == MT_WEIGHT_BIAS && strstr(w->name, ".experts.gate_up_proj_bias") && ly->debias[0])
            t = ly->ebias[0], t2 = ly->ebias[2];
        else if (ly && w->kind == MT_WEIGHT_BIAS && strstr(w->name, ".experts.down_proj_bias") && ly->debias[1])
            t = ly->ebias[1];
        if (!t) continue;
        tl->desc[tl->n] = w;
        tl->t2[tl->n] = t2;
        tl->t[tl->n++] = t;
    }
}

static void trained_list_free(trained_list *tl) {
    free(tl->desc), free(tl->t), free(tl->t2), free(tl->all), free(tl->split);
    memset(tl, 0, sizeof *tl);
}

// Tensor i's f32 values in the file's layout (gate_up_proj_bias interleaved) to or from `x`.
static void trained_get(const trained_list *tl, size_t i, float *x) {
    if (!tl->t2[i]) {
        mt_tensor_download_f32(tl->t[i], x);
        return;
    }
    int64_t E = tl->t[i]->shape[0], f = tl->t[i]->shape[1];
    float *h = mt_xmalloc((size_t)(2 * E * f) * sizeof(float));
    mt_tensor_download_f32(tl->t[i], h), mt_tensor_download_f32(tl->t2[i], h + E * f);
    mt_fused_bias_join(x, E, f, h, h + E * f);
    free(h);
}

static void trained_put(const trained_list *tl, size_t i, const float *x) {
    if (!tl->t2[i]) {
        mt_tensor_upload_f32(tl->t[i], x);  // into the model's dtype (bf16 on the GPU step)
        return;
    }
    int64_t E = tl->t[i]->shape[0], f = tl->t[i]->shape[1];
    float *h = mt_xmalloc((size_t)(2 * E * f) * sizeof(float));
    mt_fused_bias_split(x, E, f, h, h + E * f);
    mt_tensor_upload_f32(tl->t[i], h), mt_tensor_upload_f32(tl->t2[i], h + E * f);
    free(h);
}

static size_t trained_numel(const trained_list *tl, size_t i) {
    return (size_t)mt_tensor_numel(tl->t[i]) * (tl->t2[i] ? 2 : 1);
}

static int fill_trained(void *ctx, size_t index, void *dst, size_t nbytes) {
    const trained_list *tl = ctx;
    size_t want = trained_numel(tl, index) * sizeof(float);  // written F32 whatever the model keeps
    if (nbytes != want) {
        mt_error_set("'%s': %zu bytes as f32 in the model, %zu in the file layout", tl->desc[index]->name, want,
                     nbytes);
        return -1;
    }
    trained_get(tl, index, dst);
    return 0;
}

int mt_model_save_trained(mt_model *m, const char *path) {
    trained_list tl;
    trained_list_make(m, &tl);
    int rc = -1;
    if (tl.n == 0) {
        mt_error_set("%s: the model has no trained full-precision tensor (--mode %s%s)", path,
                     mt_mode_name(m->spec.mode), m->spec.mode == MT_MODE_LORA ? ": lora mode writes an adapter" : "");
    } else {
        mt_st_entry *e = mt_xcalloc(tl.n, sizeof *e);
        for (size_t i = 0; i < tl.n; i++) {
            e[i].name = tl.desc[i]->name;
            e[i].dtype = "F32";
            e[i].ndim = tl.desc[i]->ndim;
            for (int d = 0; d < e[i].ndim; d++) e[i].shape[d] = tl.desc[i]->shape[d];
        }
        rc = mt_st_write(path, e, tl.n, "{\"format\":\"pt\"}", fill_trained, &tl);
        free(e);
    }
    trained_list_free(&tl);
    return rc;
}

static void shape_text(char *buf, size_t n, int ndim, const int64_t *shape) {
    size_t k = (size_t)snprintf(buf, n, "[");
    for (int d = 0; d < ndim && k < n; d++) k += (size_t)snprintf(buf + k, n - k, "%s%lld", d ? ", " : "", (long long)shape[d]);
    if (k < n) snprintf(buf + k, n - k, "]");
}

int mt_model_load_trained(mt_model *m, const char *path) {
    mt_st_file f;
    if (mt_st_file_open(&f, path) != 0) return -1;
    trained_list tl;
    trained_list_make(m, &tl);
    int rc = 0;
    // every tensor of the file is a trainable of this run ...
    for (size_t i = 0; i < f.n_tensors && rc == 0; i++) {
        size_t j = 0;
        while (j < tl.n && strcmp(tl.desc[j]->name, f.tensors[i].name) != 0) j++;
        mt_tensor *score_bias = j == tl.n ? mt_model_score_bias_named(m, f.tensors[i].name) : NULL;
        mt_dtype dt;
        if (score_bias && f.tensors[i].ndim == 1 && f.tensors[i].shape[0] == m->cfg.experts &&
            mt_st_float_dtype(f.tensors[i].dtype, &dt) == 0) {  // a bias the run's balancing moved
            float *h = mt_xmalloc((size_t)m->cfg.experts * sizeof(float));
            mt_convert(h, MT_F32, f.tensors[i].data, dt, (size_t)m->cfg.experts);
            mt_tensor_upload_f32(score_bias, h);
            free(h);
        } else if (j == tl.n) {
            mt_error_set("%s: tensor '%s' is not trained in this run (--mode %s; see --layers, --experts)",
                         path, f.tensors[i].name, mt_mode_name(m->spec.mode));
            rc = -1;
        }
    }
    // ... and every trainable is in the file, with its shape
    float *host = NULL;
    for (size_t j = 0; j < tl.n && rc == 0; j++) {
        const mt_weight_desc *w = tl.desc[j];
        const mt_st_tensor *t = mt_st_file_find(&f, w->name);
        if (!t) {
            mt_error_set("%s: tensor '%s' (trained in this run) is missing", path, w->name);
            rc = -1;
            break;
        }
        int ok = t->ndim == w->ndim;
        for (int d = 0; ok && d < w->ndim; d++) ok = t->shape[d] == w->shape[d];
        if (!ok) {
            char got[96], want[96];
            shape_text(got, sizeof got, t->ndim, t->shape);
            shape_text(want, sizeof want, w->ndim, w->shape);
            mt_error_set("%s: tensor '%s' has shape %s where the model has %s", path, w->name, got, want);
            rc = -1;
            break;
        }
        mt_dtype dt;
        if (mt_st_float_dtype(t->dtype, &dt) != 0) {
            mt_error_set("%s: tensor '%s' has dtype %s (expected F32, BF16 or F16)", path, w->name, t->dtype);
            rc = -1;
            break;
        }
        size_t numel = trained_numel(&tl, j);
        host = mt_xrealloc(host, numel * sizeof(float));
        mt_convert(host, MT_F32, t->data, dt, numel);
        trained_put(&tl, j, host);
    }
    free(host);
    trained_list_free(&tl);
    mt_st_file_close(&f);
    return rc;
}
