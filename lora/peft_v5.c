// lora/peft_v5.c — the transformers 5 adapter layout (docs/formats.md "Layout v5", docs/families.md): every
// family's experts fused into mlp.experts.gate_up_proj / down_proj and targeted as parameters,
// the router as mlp.gate.weight. Writing converts our per-expert LoRAs; reading splits the fused tensors back
// into per-expert pairs, so everything downstream sees one (v4) shape of adapter.
#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/common.h"
#include "core/fileio.h"
#include "lora/peft.h"

// ---------------------------------------------------------------------------------------------
// Writing

enum { KIND_DIRECT, KIND_GATE_UP, KIND_DOWN };

typedef struct {
    int kind;
    int mod;    // KIND_DIRECT: the module index
    int layer;  // fused kinds
    char which;
} entry_plan;

typedef struct {
    int *w1, *w2, *w3;  // [experts] module index or -1
    int64_t h, inter;   // hidden and intermediate sizes
    int gate_up, down;  // any w1/w3, any w2 adapted
} layer_experts;

typedef struct {
    const mt_peft_module *mods;
    mt_peft_fill_fn fill;
    void *ctx;
    const entry_plan *plan;
    const layer_experts *lx;
    int r, experts;
    int interleaved;  // gate_up rows: gate 2i, up 2i + 1 (gpt-oss)
    float *tmp;       // one per-expert A or B
} v5_ctx;

static int module_fill(const v5_ctx *c, int mod, char which, float *dst) {
    const mt_peft_module *m = &c->mods[mod];
    const float *src = which == 'A' ? m->a : m->b;
    size_t n = (size_t)c->r * (size_t)(which == 'A' ? m->in : m->out);
    if (src) {
        memcpy(dst, src, n * sizeof(float));
        return 0;
    }
    if (!c->fill) {
        mt_error_set("module '%s': no lora_%c data and no fill function", m->module, which);
        return -1;
    }
    return c->fill(c->ctx, (size_t)mod, which, dst);
}

// Expert e's A [rk, in] goes to rows e·R + off.. of A [R·E, in]; its B [out, rk] to rows
// row0 + i·step and columns (off + k)·E + e of B [rows, R·E] (PEFT's interleaved expert columns).
static int put_expert(const v5_ctx *c, int mod, char which, float *dst, int e, int R, int off, int64_t row0,
                      int64_t step) {
    const mt_peft_module *m = &c->mods[mod];
    if (module_fill(c, mod, which, c->tmp) != 0) return -1;
    int r = c->r, E = c->experts;
    if (which == 'A') {
        memcpy(dst + ((size_t)e * R + off) * (size_t)m->in, c->tmp, (size_t)r * (size_t)m->in * sizeof(float));
        return 0;
    }
    size_t cols = (size_t)R * (size_t)E;
    for (int64_t i = 0; i < m->out; i++)
        for (int k = 0; k < r; k++)
            dst[(size_t)(row0 + i * step) * cols + (size_t)(off + k) * E + e] = c->tmp[(size_t)i * r + k];
    return 0;
}

static int v5_fill(void *ctx, size_t index, void *dst_, size_t nbytes) {
    const v5_ctx *c = ctx;
    const entry_plan *p = &c->plan[index];
    float *dst = dst_;
    if (p->kind == KIND_DIRECT) return module_fill(c, p->mod, p->which, dst);
    memset(dst, 0, nbytes);  // experts not adapted stay exact zeros
    const layer_experts *lx = &c->lx[p->layer];
    for (int e = 0; e < c->experts; e++) {
        int rc = 0;
        if (p->kind == KIND_GATE_UP) {  // rank 2r: w1 in block 0, w3 in block 1
            int64_t step = c->interleaved ? 2 : 1, up0 = c->interleaved ? 1 : lx->inter;
            if (lx->w1[e] >= 0) rc = put_expert(c, lx->w1[e], p->which, dst, e, 2 * c->r, 0, 0, step);
            if (!rc && lx->w3[e] >= 0) rc = put_expert(c, lx->w3[e], p->which, dst, e, 2 * c->r, c->r, up0, step);
        } else if (lx->w2[e] >= 0) {
            rc = put_expert(c, lx->w2[e], p->which, dst, e, c->r, 0, 0, 1);
        }
        if (rc) return -1;
    }
    return 0;
}

// "model.layers.L.<rest>" -> L and rest; -1 when the name is not a layer's.
static int layer_of(const char *module, const char **rest) {
    int L, used = 0;
    if (sscanf(module, "model.layers.%d.%n", &L, &used) != 1 || used == 0 || L < 0) return -1;
    *rest = module + used;
    return L;
}

// Where a v4 module goes in v5: kept as a module (target_modules), kept but targeted as a
// parameter (its leaf is one PEFT's converter would rewrite), the router, or an expert.
enum { PLACE_MODULE, PLACE_PARAM, PLACE_ROUTER, PLACE_EXPERT };

// The place of v4 module path `name`, its layer (-1: none), and for an expert its index and
// which of gate/down/up it is (0..2; -1 when the leaf is none of the family's).
static int place_of(const mt_peft_v5_model *md, const char *name, int *layer, int *e, int *w) {
    const char *rest = "";
    int L = layer_of(name, &rest), used = 0;
    size_t nm = strlen(md->moe_module);
    *layer = L, *e = -1, *w = -1;
    if (L >= 0 && strncmp(rest, md->moe_module, nm) == 0 && rest[nm] == '.') {
        const char *in = rest + nm + 1;
        if (strcmp(in, md->router) == 0) return PLACE_ROUTER;
        if (sscanf(in, "experts.%d.%n", e, &used) == 1 && used > 0) {
            for (int i = 0; i < 3; i++)
                if (strcmp(in + used, md->expert[i]) == 0) *w = i;
            return PLACE_EXPERT;
        }
    }
    const char *dot = strrchr(name, '.'), *leaf = dot ? dot + 1 : name;
    for (int i = 0; i < 3; i++)
        if (strcmp(leaf, md->expert[i]) == 0) return PLACE_PARAM;
    return strcmp(leaf, md->router) == 0 ? PLACE_PARAM : PLACE_MODULE;
}

typedef struct {
    char **v;
    int n;
} strlist;

static void strlist_add(strlist *s, const char *x) {
    for (int i = 0; i < s->n; i++)
        if (strcmp(s->v[i], x) == 0) return;
    s->v = mt_xrealloc(s->v, (size_t)(s->n + 1) * sizeof(char *));
    s->v[s->n++] = mt_xstrdup(x);
}

static void strlist_free(strlist *s) {
    for (int i = 0; i < s->n; i++) free(s->v[i]);
    free(s->v);
}

// Targets of one kind (the router, or a fused parameter) adapted in layers[0..nl): the short name
// when every layer has it, else one full path per layer ("model.layers.L.<path>").
static void add_targets(strlist *s, const unsigned char *in_layer, int nl, const char *short_name, const char *path) {
    int all = 1, any = 0;
    for (int L = 0; L < nl; L++) all &= in_layer[L] != 0, any |= in_layer[L] != 0;
    if (!any) return;
    if (all) {
        strlist_add(s, short_name);
        return;
    }
    char buf[256];
    for (int L = 0; L < nl; L++)
        if (in_layer[L]) snprintf(buf, sizeof buf, "model.layers.%d.%s", L, path), strlist_add(s, buf);
}

// The Linears kept in v5 at one place (PLACE_MODULE or PLACE_PARAM) into s, by PEFT's
// target_modules rule (mt_peft_targets_make), each entry followed by `suffix`. Returns how many
// of them are adapted.
static size_t add_kept(strlist *s, const mt_peft_v5_model *md, int place, const char *suffix) {
    const char **all = mt_xcalloc(md->n_linears + 1, sizeof *all);
    unsigned char *adapted = mt_xcalloc(md->n_linears + 1, 1);
    size_t n = 0, count = 0;
    for (size_t i = 0; i < md->n_linears; i++) {
        int L, e, w;
        if (place_of(md, md->linears[i], &L, &e, &w) != place) continue;
        all[n] = md->linears[i], adapted[n] = md->adapted[i], count += adapted[n++] != 0;
    }
    mt_peft_targets t;
    if (count && mt_peft_targets_make(&t, all, n, adapted) == 0) {
        char buf[600];
        for (int i = 0; i < t.n; i++) snprintf(buf, sizeof buf, "%s%s", t.names[i], suffix), strlist_add(s, buf);
        mt_peft_targets_free(&t);
    }
    free(all), free(adapted);
    return count;
}

int mt_peft_write_v5(const char *dir, const mt_peft_config *cfg, const char *base_model, const mt_peft_v5_model *md,
                     const mt_peft_module *mods, size_t n, mt_peft_fill_fn fill, void *ctx) {
    int layers = md->layers, experts = md->experts;
    if (n == 0 || cfg->r < 1 || layers < 1 || experts < 1) {
        mt_error_set("%s: no adapted module to write (or r, layers, experts < 1)", dir);
        return -1;
    }
    unsigned char *has = mt_xcalloc((size_t)layers * 3, 1);  // per layer: router, gate_up, down
    layer_experts *lx = mt_xcalloc((size_t)layers, sizeof *lx);
    for (int L = 0; L < layers; L++) {
        lx[L].w1 = mt_xmalloc((size_t)experts * sizeof(int));
        lx[L].w2 = mt_xmalloc((size_t)experts * sizeof(int));
        lx[L].w3 = mt_xmalloc((size_t)experts * sizeof(int));
        for (int e = 0; e < experts; e++) lx[L].w1[e] = lx[L].w2[e] = lx[L].w3[e] = -1;
    }
    int rc = -1;
    int64_t max_elems = 0;
    size_t kept = 0;  // modules kept as they are (not router, not experts)
    for (size_t i = 0; i < n; i++) {
        const char *name = mods[i].module;
        int L, e, w, place = place_of(md, name, &L, &e, &w);
        max_elems = MT_MAX(max_elems, MT_MAX(mods[i].in, mods[i].out) * cfg->r);
        if (L >= layers || (place == PLACE_EXPERT && (w < 0 || e < 0 || e >= experts))) {
            mt_error_set("%s: module '%s' has no place in the transformers 5 layout (a model of %d layers, %d "
                         "experts named %s.experts.E.{%s,%s,%s})", dir, name, layers, experts, md->moe_module,
                         md->expert[0], md->expert[1], md->expert[2]);
            goto done;
        }
        if (place == PLACE_ROUTER) has[L * 3] = 1;
        if (place != PLACE_EXPERT) {
            kept += place != PLACE_ROUTER;
            continue;
        }
        layer_experts *x = &lx[L];
        int64_t h = w == 1 ? mods[i].out : mods[i].in, inter = w == 1 ? mods[i].in : mods[i].out;
        if ((x->h && x->h != h) || (x->inter && x->inter != inter)) {
            mt_error_set("%s: expert module '%s' is [%lld -> %lld], unlike the layer's other experts", dir, name,
                         (long long)mods[i].in, (long long)mods[i].out);
            goto done;
        }
        x->h = h, x->inter = inter;
        (w == 0 ? x->w1 : w == 1 ? x->w2 : x->w3)[e] = (int)i;
        if (w == 1) x->down = has[L * 3 + 2] = 1;
        else x->gate_up = has[L * 3 + 1] = 1;
    }

    // adapter_config.json: kept Linears in target_modules (or, leaves the converter rewrites, in
    // target_parameters as "<path>.weight"); router and experts in target_parameters, gate_up_proj
    // before down_proj (the order PEFT nests their ParamWrappers in)
    strlist tm = {0}, tp = {0};
    unsigned char *col = mt_xmalloc((size_t)layers);
    char router_short[96], router_path[112];  // transformers 5's mlp.<router>.weight
    snprintf(router_short, sizeof router_short, "%s.weight", md->router);
    snprintf(router_path, sizeof router_path, "mlp.%s", router_short);
    const char *const short_name[] = {router_short, "gate_up_proj", "down_proj"};
    const char *const path[] = {router_path, "mlp.experts.gate_up_proj", "mlp.experts.down_proj"};
    for (int k = 0; k < 3; k++) {
        for (int L = 0; L < layers; L++) col[L] = has[L * 3 + k];
        add_targets(&tp, col, layers, short_name[k], path[k]);
    }
    free(col);
    size_t listed = add_kept(&tm, md, PLACE_MODULE, "") + add_kept(&tp, md, PLACE_PARAM, ".weight");
    if (listed != kept) {
        mt_error_set("%s: %zu adapted modules besides the routers and experts, but the model's Linear list marks %zu "
                     "adapted", dir, kept, listed);
        strlist_free(&tm), strlist_free(&tp);
        goto done;
    }

    // Entries: the kept and router pairs as they are, then each layer's fused experts.
    size_t cap = 2 * n + 4 * (size_t)layers, ne = 0;
    mt_st_entry *ent = mt_xcalloc(cap, sizeof *ent);
    entry_plan *plan = mt_xcalloc(cap, sizeof *plan);
    char **names = mt_xcalloc(cap, sizeof *names);
    for (size_t i = 0; i < n; i++) {
        int L, e, w, place = place_of(md, mods[i].module, &L, &e, &w);
        if (place == PLACE_EXPERT) continue;
        for (int k = 0; k < 2; k++) {
            size_t len = strlen(mods[i].module) + 64;
            names[ne] = mt_xmalloc(len);
            if (place == PLACE_ROUTER)
                snprintf(names[ne], len, "base_model.model.model.layers.%d.mlp.%s.lora_%c.weight", L, md->router,
                         k ? 'B' : 'A');
            else snprintf(names[ne], len, "base_model.model.%s.lora_%c.weight", mods[i].module, k ? 'B' : 'A');
            ent[ne] = (mt_st_entry){names[ne], "F32", 2, {k ? mods[i].out : cfg->r, k ? cfg->r : mods[i].in}, NULL};
            plan[ne++] = (entry_plan){KIND_DIRECT, (int)i, L, k ? 'B' : 'A'};
        }
    }
    for (int L = 0; L < layers; L++) {
        const layer_experts *x = &lx[L];
        int64_t E = experts, r = cfg->r;
        for (int kind = KIND_GATE_UP; kind <= KIND_DOWN; kind++) {
            if (kind == KIND_GATE_UP ? !x->gate_up : !x->down) continue;
            // nested ParamWrappers: with both, gate_up_proj is the inner one (base_layer)
            const char *place = kind == KIND_GATE_UP && x->down ? "experts.base_layer" : "experts";
            int64_t R = kind == KIND_GATE_UP ? 2 * r : r;
            int64_t in = kind == KIND_GATE_UP ? x->h : x->inter, out = kind == KIND_GATE_UP ? 2 * x->inter : x->h;
            for (int k = 0; k < 2; k++) {
                names[ne] = mt_xmalloc(128);
                snprintf(names[ne], 128, "base_model.model.model.layers.%d.mlp.%s.lora_%c.weight", L, place, k ? 'B' : 'A');
                ent[ne] = (mt_st_entry){names[ne], "F32", 2, {k ? out : R * E, k ? R * E : in}, NULL};
                plan[ne++] = (entry_plan){kind, -1, L, k ? 'B' : 'A'};
            }
        }
    }

    int any_gate_up = 0;
    for (int L = 0; L < layers; L++) any_gate_up |= lx[L].gate_up;
    char *tm_json = mt_peft_json_list((const char *const *)tm.v, tm.n);
    char *tp_json = mt_peft_json_list((const char *const *)tp.v, tp.n);
    char *rank = NULL, *alpha = NULL;
    if (any_gate_up) {
        // PEFT's converter's own patterns: gate_up_proj at rank 2r with a scale equal to the others'
        char num[64], *key = mt_peft_json_string(".*\\.gate_up_proj");
        double a2 = cfg->use_rslora ? cfg->lora_alpha * sqrt(2.0) : 2 * cfg->lora_alpha;
        if (a2 == floor(a2) && a2 < 1e15) snprintf(num, sizeof num, "%lld", (long long)a2);
        else snprintf(num, sizeof num, "%.17g", a2);
        size_t len = strlen(key) + 96;
        rank = mt_xmalloc(len), alpha = mt_xmalloc(len);
        snprintf(rank, len, "{\n    %s: %d\n  }", key, 2 * cfg->r);
        snprintf(alpha, len, "{\n    %s: %s\n  }", key, num);
        free(key);
    }
    char *json = mt_peft_config_json_ex(cfg, tm_json, tp_json, rank, alpha, base_model);
    free(tm_json), free(tp_json), free(rank), free(alpha);
    strlist_free(&tm), strlist_free(&tp);

    v5_ctx c = {mods, fill, ctx, plan, lx, cfg->r, experts, md->gate_up_interleaved,
                mt_xmalloc((size_t)max_elems * sizeof(float))};
    char file[4200];
    if (mt_mkdir_p(dir) == 0) {
        snprintf(file, sizeof file, "%s/adapter_model.safetensors", dir);
        rc = mt_st_write(file, ent, ne, "{\"format\":\"pt\"}", v5_fill, &c);
    }
    if (rc == 0) {
        snprintf(file, sizeof file, "%s/adapter_config.json", dir);
        rc = mt_write_file_atomic(file, json, strlen(json));
    }
    free(c.tmp), free(json);
    for (size_t i = 0; i < ne; i++) free(names[i]);
    free(names), free(ent), free(plan);
done:
    for (int L = 0; L < layers; L++) free(lx[L].w1), free(lx[L].w2), free(lx[L].w3);
    free(lx), free(has);
    return rc;
}

// ---------------------------------------------------------------------------------------------
// --peft-format

int mt_peft_format_parse(const char *text, const char *model, mt_peft_format *out) {
    if (strcmp(text, "v4") == 0) return *out = MT_PEFT_V4, 0;
    if (strcmp(text, "v5") == 0) return *out = MT_PEFT_V5, 0;
    if (strcmp(text, "auto") != 0) {
        mt_error_set("--peft-format: '%s' is not one of v4, v5, auto", text);
        return -1;
    }
    *out = MT_PEFT_V5;  // nothing declared: today's transformers
    if (!model || !model[0]) return 0;
    char path[4200], *t;
    size_t len, ml = strlen(model);
    if (ml >= 5 && strcmp(model + ml - 5, ".json") == 0) snprintf(path, sizeof path, "%s", model);
    else snprintf(path, sizeof path, "%s/config.json", model);
    if (mt_read_file(path, 1 << 22, &t, &len) != 0) {
        mt_error_clear();
        return 0;
    }
    cJSON *root = cJSON_ParseWithLength(t, len);
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(root, "transformers_version");
    if (cJSON_IsString(v) && atoi(v->valuestring) > 0 && atoi(v->valuestring) < 5) *out = MT_PEFT_V4;
    cJSON_Delete(root);
    free(t);
    return 0;
}

// ---------------------------------------------------------------------------------------------
// Reading: the fused tensors split into per-expert pairs (called by mt_peft_read)

static int all_zero(const float *x, size_t n) {
    for (size_t i = 0; i < n; i++)
        if (x[i] != 0) return 0;
    return 1;
}

static float *as_f32(const mt_st_tensor *t, const char *path) {
    mt_dtype dt;
    if (mt_st_float_dtype(t->dtype, &dt) != 0) {
        mt_error_set("%s: '%s' has dtype %s (expected F32, BF16 or F16)", path, t->name, t->dtype);
        return NULL;
    }
    size_t n = (size_t)(t->shape[0] * t->shape[1]);
    float *f = mt_xmalloc(n * sizeof(float));
    mt_convert(f, MT_F32, t->data, dt, n);
    return f;
}

static mt_st_tensor f32_tensor(const char *name, int64_t rows, int64_t cols, const float *data) {
    mt_st_tensor t = {0};
    t.name = (char *)name;
    strcpy(t.dtype, "F32");
    t.dtype_bits = 32;
    t.ndim = 2;
    t.shape[0] = rows, t.shape[1] = cols;
    t.nbytes = (uint64_t)(rows * cols) * 4;
    t.data = data;
    return t;
}

// One expert's pair out of fused A [R·E, in], B [out, R·E]: A rows e·R + k0 .. + rk, B rows
// row0 + i·step (i < nrows), columns (k0 + k)·E + e. Reported unless both are all zero.
static int emit(const char *path, const char *prefix, int e, const char *leaf, const float *A, const float *B, int64_t in,
                int64_t cols, int R, int E, int k0, int rk, int64_t row0, int64_t step, int64_t nrows, mt_peft_pair_fn fn,
                void *ctx) {
    float *a = mt_xmalloc((size_t)(rk * in) * sizeof(float)), *b = mt_xmalloc((size_t)(nrows * rk) * sizeof(float));
    memcpy(a, A + ((size_t)e * R + k0) * (size_t)in, (size_t)(rk * in) * sizeof(float));
    for (int64_t i = 0; i < nrows; i++)
        for (int k = 0; k < rk; k++) b[i * rk + k] = B[(size_t)(row0 + i * step) * (size_t)cols + (size_t)(k0 + k) * E + e];
    int rc = 0;
    if (!all_zero(a, (size_t)(rk * in)) || !all_zero(b, (size_t)(nrows * rk))) {
        char module[512], name_a[600], name_b[600];
        snprintf(module, sizeof module, "%s.block_sparse_moe.experts.%d.%s", prefix, e, leaf);
        snprintf(name_a, sizeof name_a, "%s (v5, expert %d's lora_A)", module, e);
        snprintf(name_b, sizeof name_b, "%s (v5, expert %d's lora_B)", module, e);
        mt_st_tensor ta = f32_tensor(name_a, rk, in, a), tb = f32_tensor(name_b, nrows, rk, b);
        if ((rc = fn(ctx, module, &ta, &tb)) != 0) mt_error_prefix("%s", path);
    }
    free(a), free(b);
    return rc;
}

int mt_peft_v5_experts(const char *path, const mt_peft_config *cfg, const mt_peft_layout *layout, const char *prefix,
                       int gate_up, const mt_st_tensor *ta, const mt_st_tensor *tb, mt_peft_pair_fn fn, void *ctx) {
    int R = gate_up ? (cfg->r_gate_up ? cfg->r_gate_up : cfg->r) : (cfg->r_down ? cfg->r_down : cfg->r);
    const char *what = gate_up ? "gate_up_proj" : "down_proj";
    if (ta->ndim != 2 || tb->ndim != 2 || ta->shape[0] % R != 0 || tb->shape[1] != ta->shape[0] ||
        (gate_up && tb->shape[0] % 2 != 0)) {
        mt_error_set("%s: '%s' [%lld, %lld] and '%s' [%lld, %lld] are not a fused %s LoRA of rank %d per expert "
                     "(A [%d·E, in], B [out, %d·E])", path, ta->name, (long long)ta->shape[0],
                     (long long)(ta->ndim > 1 ? ta->shape[1] : 0), tb->name, (long long)tb->shape[0],
                     (long long)(tb->ndim > 1 ? tb->shape[1] : 0), what, R, R, R);
        return -1;
    }
    int E = (int)(ta->shape[0] / R);
    int64_t in = ta->shape[1], out = tb->shape[0], cols = tb->shape[1];
    float *A = as_f32(ta, path), *B = A ? as_f32(tb, path) : NULL;
    int rc = B ? 0 : -1, r = cfg->r, inter = layout && layout->gate_up_interleaved;
    // gate rows: 0.. (step 1) or the even ones; up rows: I.. or the odd ones
    int64_t I = out / 2, step = inter ? 2 : 1, up0 = inter ? 1 : I;
    for (int e = 0; e < E && rc == 0; e++) {
        if (!gate_up) {
            rc = emit(path, prefix, e, "w2", A, B, in, cols, R, E, 0, R, 0, 1, out, fn, ctx);
            continue;
        }
        if (R == 2 * r) {  // our own (and PEFT's converter's) layout: w1 and w3 blocks, no cross terms
            int cross = 0;
            for (int64_t i = 0; i < out && !cross; i++) {
                int up = inter ? (int)(i & 1) : i >= I;
                for (int k = 0; k < R && !cross; k++)
                    cross = up != (k >= r) && B[(size_t)i * (size_t)cols + (size_t)k * E + e] != 0;
            }
            if (cross) {
                mt_error_set("%s: '%s': expert %d's gate_up_proj LoRA (rank %d) mixes its w1 and w3 halves, which "
                             "a rank-%d per-expert w1/w3 LoRA cannot hold", path, tb->name, e, R, r);
                rc = -1;
                break;
            }
            rc = emit(path, prefix, e, "w1", A, B, in, cols, R, E, 0, r, 0, step, I, fn, ctx);
            if (!rc) rc = emit(path, prefix, e, "w3", A, B, in, cols, R, E, r, r, up0, step, I, fn, ctx);
        } else {  // one A shared by w1 and w3 (a PEFT-trained v5 adapter at rank r)
            rc = emit(path, prefix, e, "w1", A, B, in, cols, R, E, 0, R, 0, step, I, fn, ctx);
            if (!rc) rc = emit(path, prefix, e, "w3", A, B, in, cols, R, E, 0, R, up0, step, I, fn, ctx);
        }
    }
    free(A), free(B);
    return rc;
}
