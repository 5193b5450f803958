// tests/test_peft_gpt_oss.c — gpt-oss's PEFT adapter layout (docs/families.md "Adapters"): its fused
// experts gate_up_proj [E, H, 2f] (gate in the even columns, up in the odd; x · W) and down_proj
// [E, f, H], and its router (a bare weight), all through target_parameters. A hand-checked toy
// written by mt_peft_write_v5; PEFT's own adapters (transformers 5.24 + PEFT 0.21.2 and 4.57 +
// PEFT 0.17.1, scripts/make_peft_gpt_oss_fixtures.py) read into per-expert pairs whose scale·B·A
// equal PEFT's get_delta_weight; and the model saved and read back in both --peft-format values.
#include <cjson/cJSON.h>
#include <criterion/criterion.h>
#include <math.h>
#include <string.h>

#include "core/backend.h"
#include "core/common.h"
#include "core/fileio.h"
#include "core/safetensors.h"
#include "lora/peft.h"
#include "model/family.h"
#include "model/mixtral.h"
#include "test_util.h"
#include "trainer/options.h"

// PEFT's delta of a fused LoRA on a 3-D parameter stored (experts, in, out) (gpt-oss's
// is_transposed; PEFT 0.17 always): delta[e][i][o] = s · Σ_k B[o][k·E + e] · A[e·R + k][i],
// A [R·E, in], B [out, R·E] (ParamWrapper.get_delta_weight: einsum "o r e, e r i -> e i o").
static void peft_delta_3d(const float *A, const float *B, int E, int R, int in, int out, double s, double *d) {
    for (int e = 0; e < E; e++)
        for (int i = 0; i < in; i++)
            for (int o = 0; o < out; o++) {
                double acc = 0;
                for (int k = 0; k < R; k++) acc += (double)B[o * R * E + k * E + e] * A[(e * R + k) * in + i];
                d[((size_t)e * in + i) * out + o] = s * acc;
            }
}

// s · B · A [out, in] of one pair.
static void pair_delta(const float *A, const float *B, int r, int in, int out, double s, double *d) {
    for (int o = 0; o < out; o++)
        for (int i = 0; i < in; i++) {
            double acc = 0;
            for (int k = 0; k < r; k++) acc += (double)B[o * r + k] * A[k * in + i];
            d[o * in + i] = s * acc;
        }
}

static const float *tensor(const mt_st_file *f, const char *key, int64_t rows, int64_t cols) {
    const mt_st_tensor *t = mt_st_file_find(f, key);
    cr_assert(t, "no '%s'", key);
    cr_assert_str_eq(t->dtype, "F32", "%s", key);
    cr_assert(t->shape[0] == rows && (t->ndim == 1 || t->shape[1] == cols), "%s is [%lld, %lld], want [%lld, %lld]",
              key, (long long)t->shape[0], (long long)t->shape[1], (long long)rows, (long long)cols);
    return t->data;
}

static int listed(const cJSON *list, const char *name) {
    const cJSON *it;
    cJSON_ArrayForEach(it, list) if (cJSON_IsString(it) && strcmp(it->valuestring, name) == 0) return 1;
    return 0;
}

// ---------------------------------------------------------------------------------------------
// The writer, by hand: one MoE layer, 2 experts, hidden 2, expert size 3, r 1

enum { H = 2, I = 3, E = 2, NM = 1 + 1 + 3 * E };

typedef struct {
    char name[NM][96];
    int64_t in[NM], out[NM];
    float a[NM][8], b[NM][8];
    int seen[NM];
} toy;

// q_proj, the router, each expert's gate/down/up. Expert e's projection p (0 gate, 1 down, 2 up):
// A[j] = 100(e+1) + 10(p+1) + j, B[i] = -(100(e+1) + 10(p+1) + i); q_proj and the router 1000 + ...
static void toy_build(toy *t, const mt_family *f) {
    memset(t, 0, sizeof *t);
    snprintf(t->name[0], 96, "model.layers.0.self_attn.q_proj"), t->in[0] = H, t->out[0] = H;
    snprintf(t->name[1], 96, "model.layers.0.mlp.%s", f->router), t->in[1] = H, t->out[1] = E;
    for (int i = 0; i < 2; i++)
        for (int j = 0; j < 8; j++) t->a[i][j] = (float)(1000 + 10 * i + j), t->b[i][j] = -t->a[i][j];
    for (int e = 0; e < E; e++)
        for (int p = 0; p < 3; p++) {
            int i = 2 + 3 * e + p;
            snprintf(t->name[i], 96, "model.layers.0.mlp.experts.%d.%s", e, f->expert[p]);
            t->in[i] = p == 1 ? I : H, t->out[i] = p == 1 ? H : I;
            for (int j = 0; j < t->in[i]; j++) t->a[i][j] = (float)(100 * (e + 1) + 10 * (p + 1) + j);
            for (int j = 0; j < t->out[i]; j++) t->b[i][j] = -(float)(100 * (e + 1) + 10 * (p + 1) + j);
        }
}

static int toy_write(const toy *t, const mt_family *f, const char *dir) {
    mt_peft_module mods[NM];
    const char *lin[NM];
    unsigned char on[NM];
    for (int i = 0; i < NM; i++) {
        lin[i] = t->name[i], on[i] = 1;
        mods[i] = (mt_peft_module){t->name[i], t->in[i], t->out[i], t->a[i], t->b[i]};
    }
    mt_peft_v5_model md = {1, E, f->moe_module, f->router, {f->expert[0], f->expert[1], f->expert[2]}, lin, on, NM,
                           f->fused_experts};
    mt_peft_config cfg = {.r = 1, .lora_alpha = 2};
    return mt_peft_write_v5(dir, &cfg, NULL, &md, mods, NM, NULL, NULL);
}

typedef struct {
    toy *t;
    const mt_family *f;
} back_ctx;

static int check_back(void *ctx, const char *module, const mt_st_tensor *a, const mt_st_tensor *b) {
    back_ctx *c = ctx;
    char renamed[300];
    module = mt_family_module_name(c->f, module, renamed, sizeof renamed);
    int i = 0;
    while (i < NM && strcmp(c->t->name[i], module) != 0) i++;
    cr_assert_lt(i, NM, "read back '%s', which is no module of the toy", module);
    cr_assert(a->shape[0] == 1 && a->shape[1] == c->t->in[i] && b->shape[0] == c->t->out[i] && b->shape[1] == 1, "%s", module);
    for (int j = 0; j < c->t->in[i]; j++) cr_assert_eq(((const float *)a->data)[j], c->t->a[i][j], "%s A[%d]", module, j);
    for (int j = 0; j < c->t->out[i]; j++) cr_assert_eq(((const float *)b->data)[j], c->t->b[i][j], "%s B[%d]", module, j);
    c->t->seen[i]++;
    return 0;
}

Test(peft_gpt_oss, fused_experts_by_hand) {
    const mt_family *f = mt_family_find("gpt_oss");
    cr_assert(f && f->fused_experts && strcmp(f->router, "router") == 0);
    toy t;
    toy_build(&t, f);
    char tmp[64], path[256];
    mt_test_tmpdir(tmp, sizeof tmp);
    cr_assert_eq(toy_write(&t, f, tmp), 0, "%s", mt_error_get());

    snprintf(path, sizeof path, "%s/adapter_model.safetensors", tmp);
    mt_st_file st;
    cr_assert_eq(mt_st_file_open(&st, path), 0, "%s", mt_error_get());
    // gate_up_proj at rank 2: A rows e·2 + {gate, up}; B [2I, 2E] with column k·E + e (k 0 gate,
    // 1 up) and rows interleaved: gate row i at 2i, up row i at 2i + 1
    static const float gu_a[2 * E * H] = {110, 111, 130, 131, 210, 211, 230, 231};
    static const float gu_b[2 * I * 2 * E] = {-110, -210, 0, 0, 0, 0, -130, -230,  // gate 0, up 0
                                              -111, -211, 0, 0, 0, 0, -131, -231,  // gate 1, up 1
                                              -112, -212, 0, 0, 0, 0, -132, -232}; // gate 2, up 2
    static const float dn_a[E * I] = {120, 121, 122, 220, 221, 222};
    static const float dn_b[H * E] = {-120, -220, -121, -221};
    const char *gu = "base_model.model.model.layers.0.mlp.experts.base_layer.lora_",
               *dn = "base_model.model.model.layers.0.mlp.experts.lora_";
    char key[160];
    const float *A, *B;
    snprintf(key, sizeof key, "%sA.weight", gu), A = tensor(&st, key, 2 * E, H);
    for (int i = 0; i < 2 * E * H; i++) cr_assert_eq(A[i], gu_a[i], "%s[%d] = %g", key, i, A[i]);
    snprintf(key, sizeof key, "%sB.weight", gu), B = tensor(&st, key, 2 * I, 2 * E);
    for (int i = 0; i < 4 * I * E; i++) cr_assert_eq(B[i], gu_b[i], "%s[%d] = %g", key, i, B[i]);
    // what PEFT computes from them: delta[e][h][c] of gate_up_proj [E, H, 2I], x · W, is gate
    // output i = c / 2 (even c) or up output (odd c) of expert e, input h: s · B_p[i] · A_p[h]
    double d[E * H * 2 * I];
    peft_delta_3d(A, B, E, 2, H, 2 * I, 1.0, d);
    for (int e = 0; e < E; e++)
        for (int h = 0; h < H; h++)
            for (int c = 0; c < 2 * I; c++) {
                int p = c % 2 ? 2 : 0, i = c / 2;
                double want = -(double)(100 * (e + 1) + 10 * (p + 1) + i) * (100 * (e + 1) + 10 * (p + 1) + h);
                cr_assert_eq(d[(e * H + h) * 2 * I + c], want, "gate_up delta[%d][%d][%d]", e, h, c);
            }
    snprintf(key, sizeof key, "%sA.weight", dn), A = tensor(&st, key, E, I);
    for (int i = 0; i < E * I; i++) cr_assert_eq(A[i], dn_a[i], "%s[%d] = %g", key, i, A[i]);
    snprintf(key, sizeof key, "%sB.weight", dn), B = tensor(&st, key, H, E);
    for (int i = 0; i < H * E; i++) cr_assert_eq(B[i], dn_b[i], "%s[%d] = %g", key, i, B[i]);
    double dd[E * I * H];  // down_proj [E, I, H]: delta[e][i][h] = B_down[h] · A_down[i]
    peft_delta_3d(A, B, E, 1, I, H, 1.0, dd);
    for (int e = 0; e < E; e++)
        for (int i = 0; i < I; i++)
            for (int h = 0; h < H; h++)
                cr_assert_eq(dd[(e * I + i) * H + h], -(double)(100 * (e + 1) + 20 + h) * (100 * (e + 1) + 20 + i),
                             "down delta[%d][%d][%d]", e, i, h);
    tensor(&st, "base_model.model.model.layers.0.mlp.router.lora_A.weight", 1, H);
    tensor(&st, "base_model.model.model.layers.0.mlp.router.lora_B.weight", E, 1);
    tensor(&st, "base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight", 1, H);
    cr_assert_eq(st.n_tensors, 8, "q_proj, router, gate_up, down: %zu tensors", st.n_tensors);
    mt_st_file_close(&st);

    char *text;
    size_t len;
    snprintf(path, sizeof path, "%s/adapter_config.json", tmp);
    cr_assert_eq(mt_read_file(path, 1 << 20, &text, &len), 0);
    cJSON *root = cJSON_ParseWithLength(text, len);
    const cJSON *tm = cJSON_GetObjectItemCaseSensitive(root, "target_modules");
    const cJSON *tp = cJSON_GetObjectItemCaseSensitive(root, "target_parameters");
    cr_assert(cJSON_GetArraySize(tm) == 1 && listed(tm, "q_proj"), "%s", text);
    cr_assert(cJSON_GetArraySize(tp) == 3 && listed(tp, "router.weight") && listed(tp, "gate_up_proj") &&
              listed(tp, "down_proj"), "%s", text);
    cJSON_Delete(root);
    free(text);

    // read back in gpt-oss's row order: every module once, bit for bit
    back_ctx c = {&t, f};
    mt_peft_config c2;
    mt_peft_layout lay = {.gate_up_interleaved = 1};
    cr_assert_eq(mt_peft_read_as(tmp, &lay, &c2, check_back, &c), 0, "%s", mt_error_get());
    for (int i = 0; i < NM; i++) cr_assert_eq(t.seen[i], 1, "%s read back %d times", t.name[i], t.seen[i]);
    // in the other families' row order the blocks cross: refused, not read wrong
    cr_assert_neq(mt_peft_read(tmp, &c2, check_back, &c), 0, "interleaved rows read as gate-then-up");
    cr_assert(strstr(mt_error_get(), "mixes its w1 and w3"), "%s", mt_error_get());
    mt_test_rmrf(tmp);
}

// ---------------------------------------------------------------------------------------------
// PEFT's own adapters

typedef struct {
    int n;
    char module[16][160];
    int r[16];
    int64_t in[16], out[16];
    float *a[16], *b[16];
} pairs;

static int collect(void *ctx, const char *module, const mt_st_tensor *a, const mt_st_tensor *b) {
    pairs *p = ctx;
    cr_assert_lt(p->n, 16);
    int i = p->n++;
    snprintf(p->module[i], sizeof p->module[i], "%s", module);
    p->r[i] = (int)a->shape[0], p->in[i] = a->shape[1], p->out[i] = b->shape[0];
    cr_assert_str_eq(a->dtype, "F32");
    cr_assert_str_eq(b->dtype, "F32");
    p->a[i] = mt_xmalloc((size_t)a->nbytes), memcpy(p->a[i], a->data, (size_t)a->nbytes);
    p->b[i] = mt_xmalloc((size_t)b->nbytes), memcpy(p->b[i], b->data, (size_t)b->nbytes);
    return 0;
}

static int find(const pairs *p, const char *module) {
    for (int i = 0; i < p->n; i++)
        if (strcmp(p->module[i], module) == 0) return i;
    cr_assert_fail("no pair '%s' read", module);
    return -1;
}

// Expect PEFT's delta `want` (`n` values, in its parameter's layout) from ours `got`, to 1e-5 of
// the largest.
static void expect_delta(const double *got, const float *want, size_t n, const char *what) {
    double big = 0, worst = 0;
    for (size_t i = 0; i < n; i++) big = fmax(big, fabs(want[i]));
    cr_assert_gt(big, 0.1, "%s: PEFT's delta is all but zero", what);
    for (size_t i = 0; i < n; i++) worst = fmax(worst, fabs(got[i] - want[i]));
    cr_assert_leq(worst, 1e-5 * big, "%s: |ours - PEFT's| %g of %g", what, worst, big);
}

static void peft_fixture(const char *stack) {
    char dir[512], path[600];
    snprintf(dir, sizeof dir, MT_REPO_ROOT "/tests/data/peft_gpt_oss/%s", stack);
    pairs p = {0};
    mt_peft_config cfg;
    mt_peft_layout lay = {.gate_up_interleaved = 1};
    cr_assert_eq(mt_peft_read_as(dir, &lay, &cfg, collect, &p), 0, "%s: %s", stack, mt_error_get());
    cr_assert(cfg.r == 2 && cfg.lora_alpha == 6 && !cfg.use_rslora, "%s: r %d alpha %g", stack, cfg.r, cfg.lora_alpha);
    double s = cfg.lora_alpha / cfg.r;
    // q_proj, the router, and per expert gate (w1), up (w3), down (w2) under moetrain's v4 names
    cr_assert_eq(p.n, 2 + 3 * 3, "%s: %d pairs", stack, p.n);
    snprintf(path, sizeof path, "%s/delta.safetensors", dir);
    mt_st_file st;
    cr_assert_eq(mt_st_file_open(&st, path), 0, "%s", mt_error_get());
    const mt_st_tensor *gu = mt_st_file_find(&st, "gate_up_proj"), *dn = mt_st_file_find(&st, "down_proj");
    cr_assert(gu && dn && gu->ndim == 3 && dn->ndim == 3, "%s: delta.safetensors", stack);
    int ne = (int)gu->shape[0], h = (int)gu->shape[1], f2 = (int)gu->shape[2], f = f2 / 2;
    cr_assert(ne == 3 && dn->shape[1] == f && dn->shape[2] == h);
    double *got = mt_xcalloc((size_t)ne * h * f2, sizeof(double)), *one = mt_xcalloc((size_t)h * f2, sizeof(double));
    for (int e = 0; e < ne; e++) {
        char m[160];
        // gate (w1) in the even columns, up (w3) in the odd ones, of x · W [H, 2f]
        for (int w = 0; w < 2; w++) {
            snprintf(m, sizeof m, "model.layers.0.block_sparse_moe.experts.%d.%s", e, w ? "w3" : "w1");
            int i = find(&p, m);
            cr_assert(p.in[i] == h && p.out[i] == f && p.r[i] == 2, "%s: %s shape", stack, m);
            pair_delta(p.a[i], p.b[i], p.r[i], h, f, s, one);  // [f, H]
            for (int o = 0; o < f; o++)
                for (int x = 0; x < h; x++) got[((size_t)e * h + x) * f2 + 2 * o + w] = one[o * h + x];
        }
    }
    expect_delta(got, gu->data, (size_t)ne * h * f2, "gate_up_proj");
    for (int e = 0; e < ne; e++) {  // down_proj [E, f, H] = (s · B · A [H, f])ᵀ per expert
        char m[160];
        snprintf(m, sizeof m, "model.layers.0.block_sparse_moe.experts.%d.w2", e);
        int i = find(&p, m);
        cr_assert(p.in[i] == f && p.out[i] == h, "%s: %s shape", stack, m);
        pair_delta(p.a[i], p.b[i], p.r[i], f, h, s, one);
        for (int x = 0; x < h; x++)
            for (int o = 0; o < f; o++) got[((size_t)e * f + o) * h + x] = one[x * f + o];
    }
    expect_delta(got, dn->data, (size_t)ne * f * h, "down_proj");
    // the router's [E, H] and q_proj's [out, in]: 2-D, PEFT's plain B · A
    static const char *const flat[][2] = {{"model.layers.0.mlp.router", "router"},
                                          {"model.layers.0.self_attn.q_proj", "q_proj"}};
    for (int k = 0; k < 2; k++) {
        int i = find(&p, flat[k][0]);
        const mt_st_tensor *want = mt_st_file_find(&st, flat[k][1]);
        cr_assert(want && want->shape[0] == p.out[i] && want->shape[1] == p.in[i], "%s: %s", stack, flat[k][1]);
        pair_delta(p.a[i], p.b[i], p.r[i], (int)p.in[i], (int)p.out[i], s, got);
        expect_delta(got, want->data, (size_t)(p.in[i] * p.out[i]), flat[k][1]);
    }
    mt_st_file_close(&st);
    free(got), free(one);
    for (int i = 0; i < p.n; i++) free(p.a[i]), free(p.b[i]);
}

// transformers 5.24 decorates GptOssExperts is_transposed, so PEFT 0.21's ParamWrapper keeps
// (experts, in, out); PEFT 0.17 on transformers 4.57 always reads 3-D that way: one layout.
Test(peft_gpt_oss, peft_021_transformers_5_adapter) { peft_fixture("t5"); }
Test(peft_gpt_oss, peft_017_transformers_457_adapter) { peft_fixture("t4"); }

// ---------------------------------------------------------------------------------------------
// The model: every LoRA saved in both --peft-format values (the same fused layout) and read back

#define GOLDEN MT_REPO_ROOT "/tests/data/golden/gpt_oss"

static void fill_loras(mt_model *m) {  // every LoRA a distinct non-zero pattern
    unsigned seed = 7;
    for (int L = 0; L < m->cfg.layers; L++) {
        mt_layer *ly = &m->layers[L];
        mt_linear *ls[3 * 64 + 8];
        int n = mt_layer_attn_linears(ly, &m->cfg, ls, NULL);
        ls[n++] = &ly->gate;
        for (int e = 0; e < m->cfg.experts; e++) ls[n++] = &ly->w1[e], ls[n++] = &ly->w2[e], ls[n++] = &ly->w3[e];
        for (int i = 0; i < n; i++) {
            mt_lora *lo = ls[i]->lora;
            cr_assert(lo, "layer %d Linear %d has no LoRA", L, i);
            mt_tensor *t[2] = {lo->a, lo->b};
            for (int k = 0; k < 2; k++) {
                size_t cnt = (size_t)mt_tensor_numel(t[k]);
                float *v = mt_xmalloc(cnt * sizeof(float));
                for (size_t j = 0; j < cnt; j++) seed = seed * 1103515245u + 12345u, v[j] = (float)((seed >> 8) % 2001) / 1000.0f - 1.0f;
                mt_tensor_upload_f32(t[k], v);
                free(v);
            }
        }
    }
}

static void same_lora(mt_model *a, mt_model *b, const char *module, const char *what) {
    mt_linear *l[2] = {mt_model_find_linear(a, module), mt_model_find_linear(b, module)};
    cr_assert(l[0] && l[1] && l[0]->lora && l[1]->lora, "%s: %s", what, module);
    cr_assert_eq(memcmp(l[0]->lora->a->data, l[1]->lora->a->data, l[0]->lora->a->nbytes), 0, "%s: %s A", what, module);
    cr_assert_eq(memcmp(l[0]->lora->b->data, l[1]->lora->b->data, l[0]->lora->b->nbytes), 0, "%s: %s B", what, module);
    cr_assert_eq(l[0]->lora->scale, l[1]->lora->scale, "%s: %s scale", what, module);
}

static int same_file(const char *a, const char *b) {
    char *x, *y;
    size_t nx, ny;
    cr_assert_eq(mt_read_file(a, 1 << 24, &x, &nx), 0, "%s", a);
    cr_assert_eq(mt_read_file(b, 1 << 24, &y, &ny), 0, "%s", b);
    int same = nx == ny && memcmp(x, y, nx) == 0;
    free(x), free(y);
    return same;
}

Test(peft_gpt_oss, model_round_trip_both_formats) {
    mt_run_opts o;
    mt_run_opts_default(&o);
    o.mode = MT_MODE_LORA, o.lora_r = 2, o.lora_alpha = 6, o.quant = MT_QUANT_NONE;
    o.targets = MT_TARGET_EXPERTS | MT_TARGET_ATTN | MT_TARGET_GATE;
    mt_backend *be = mt_backend_cpu_new();
    mt_model m, back;
    cr_assert_eq(mt_model_load(&m, be, GOLDEN, MT_MODEL_SPEC_OF(&o)), 0, "%s", mt_error_get());
    fill_loras(&m);
    char tmp[64], dir[2][200], path[512];
    mt_test_tmpdir(tmp, sizeof tmp);
    for (int v = 0; v < 2; v++) {
        snprintf(dir[v], sizeof dir[v], "%s/v%d", tmp, 4 + v);
        cr_assert_eq(mt_model_save_adapter_as(&m, dir[v], "x", v ? MT_PEFT_V5 : MT_PEFT_V4), 0, "%s", mt_error_get());
        snprintf(path, sizeof path, "%s/adapter_model.safetensors", dir[v]);
        mt_st_file f;
        cr_assert_eq(mt_st_file_open(&f, path), 0, "%s", mt_error_get());
        cr_assert_not_null(mt_st_file_find(&f, "base_model.model.model.layers.1.mlp.experts.base_layer.lora_A.weight"));
        cr_assert_not_null(mt_st_file_find(&f, "base_model.model.model.layers.2.mlp.router.lora_B.weight"));
        for (size_t i = 0; i < f.n_tensors; i++)
            cr_assert(!strstr(f.tensors[i].name, "experts.0.") && !strstr(f.tensors[i].name, "block_sparse_moe"),
                      "v%d: per-expert key %s (PEFT has none for gpt-oss)", 4 + v, f.tensors[i].name);
        mt_st_file_close(&f);
    }
    // --peft-format v4 is the same layout: the files are equal byte for byte
    for (int k = 0; k < 2; k++) {
        const char *name = k ? "adapter_model.safetensors" : "adapter_config.json";
        char p4[300], p5[300];
        snprintf(p4, sizeof p4, "%s/%s", dir[0], name), snprintf(p5, sizeof p5, "%s/%s", dir[1], name);
        cr_assert(same_file(p4, p5), "v4 and v5 %s differ", name);
    }
    for (int v = 0; v < 2; v++) {
        cr_assert_eq(mt_model_load(&back, be, GOLDEN, MT_MODEL_SPEC_OF(&o)), 0, "%s", mt_error_get());
        cr_assert_eq(mt_model_load_adapter(&back, dir[v]), 0, "%s: %s", dir[v], mt_error_get());
        static const char *const ex[] = {"model.layers.0.mlp.experts.0.gate_proj", "model.layers.1.mlp.experts.5.up_proj",
                                         "model.layers.2.mlp.experts.3.down_proj", "model.layers.1.mlp.router",
                                         "model.layers.0.self_attn.o_proj"};
        for (size_t k = 0; k < MT_ARRAY_LEN(ex); k++) same_lora(&m, &back, ex[k], dir[v]);
        for (int L = 0; L < m.cfg.layers; L++)  // every expert's three, exactly
            for (int e = 0; e < m.cfg.experts; e++) {
                mt_linear *p[3] = {&m.layers[L].w1[e], &m.layers[L].w2[e], &m.layers[L].w3[e]};
                mt_linear *q[3] = {&back.layers[L].w1[e], &back.layers[L].w2[e], &back.layers[L].w3[e]};
                for (int w = 0; w < 3; w++) {
                    cr_assert_eq(memcmp(p[w]->lora->a->data, q[w]->lora->a->data, p[w]->lora->a->nbytes), 0, "L%d e%d w%d A", L, e, w + 1);
                    cr_assert_eq(memcmp(p[w]->lora->b->data, q[w]->lora->b->data, p[w]->lora->b->nbytes), 0, "L%d e%d w%d B", L, e, w + 1);
                }
            }
        mt_model_free(&back);
    }
    mt_model_free(&m);

    // --dropout: PEFT's ParamWrapper refuses it, and gpt-oss's experts and router have no other
    // layout: refused by flag, and attention alone (nn.Linear) still takes it
    o.lora_dropout = 0.1;
    cr_assert_eq(mt_model_load(&m, be, GOLDEN, MT_MODEL_SPEC_OF(&o)), 0, "%s", mt_error_get());
    for (int v = 4; v <= 5; v++) {
        cr_assert_neq(mt_model_adapter_dropout_check(&m, v, 0), 0, "v%d with dropout accepted", v);
        cr_assert(strstr(mt_error_get(), "--dropout 0.1") && strstr(mt_error_get(), "gpt_oss"), "%s", mt_error_get());
    }
    snprintf(path, sizeof path, "%s/drop", tmp);
    cr_assert_neq(mt_model_save_adapter_as(&m, path, "x", MT_PEFT_V5), 0, "saved an adapter PEFT refuses");
    mt_model_free(&m);
    o.targets = MT_TARGET_ATTN;
    cr_assert_eq(mt_model_load(&m, be, GOLDEN, MT_MODEL_SPEC_OF(&o)), 0, "%s", mt_error_get());
    cr_assert_eq(mt_model_adapter_dropout_check(&m, MT_PEFT_V4, 0), 0, "%s", mt_error_get());
    cr_assert_eq(mt_model_adapter_dropout_check(&m, MT_PEFT_V5, 0), 0, "%s", mt_error_get());
    mt_model_free(&m);
    mt_backend_free(be);
    mt_test_rmrf(tmp);
}
