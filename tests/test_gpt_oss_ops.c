// gpt-oss's attention-side ops (issue 29) against transformers: the learned attention sinks of
// model/attention.c and attention_ref.c, and the YaRN RoPE table of model/rope.c with the rope
// kernels that read it. Fixtures: tests/data/gpt_oss/*.safetensors, made by
// scripts/make_sinks_fixture.py (gpt_oss's eager_attention_forward in float64 with autograd;
// _compute_yarn_parameters; apply_rotary_pos_emb); their metadata names the versions.
#include <criterion/criterion.h>
#include <math.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "tests/fixture_file.h"
#include "core/common.h"
#include "core/safetensors.h"
#include "model/ops.h"
#include "model/rope.h"

#define FIXTURES MT_REPO_ROOT "/tests/data/gpt_oss/"

// A copy of t's bytes (the mmap is not aligned), checked to hold n elements of `bytes` each.
static void *copy_n(const mt_st_file *f, const char *name, size_t n, size_t bytes) {
    const mt_st_tensor *t = st_need(f, name);
    cr_assert_eq(t->nbytes, n * bytes, "%s: %s holds %llu bytes, want %zu", f->path, name,
                 (unsigned long long)t->nbytes, n * bytes);
    void *p = mt_xmalloc(n * bytes + 1);
    memcpy(p, t->data, t->nbytes);
    return p;
}
static float *f32_of(const mt_st_file *f, const char *name, size_t n) {
    cr_assert_str_eq(st_need(f, name)->dtype, "F32", "%s", name);
    return copy_n(f, name, n, 4);
}

static cJSON *meta_json(const mt_st_file *f, const char *key) {
    cJSON *meta = cJSON_Parse(f->metadata_json);
    const cJSON *s = cJSON_GetObjectItemCaseSensitive(meta, key);
    cr_assert(cJSON_IsString(s), "%s: metadata %s", f->path, key);
    cJSON *v = cJSON_Parse(s->valuestring);
    cJSON_Delete(meta);
    cr_assert_not_null(v, "%s: metadata %s is not JSON", f->path, key);
    return v;
}
static double num(const cJSON *o, const char *key, double dflt) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
    return cJSON_IsNumber(v) ? v->valuedouble : cJSON_IsBool(v) ? (double)cJSON_IsTrue(v) : dflt;
}

// Worst |got − want| relative to the largest |want| (+1, as model_ops' tiled tests measure).
static void close_to(const float *got, const float *want, int64_t n, float tol, const char *what) {
    float big = 0;
    for (int64_t i = 0; i < n; i++) big = fmaxf(big, fabsf(want[i]));
    for (int64_t i = 0; i < n; i++)
        cr_assert(fabsf(got[i] - want[i]) <= tol * (1 + big), "%s[%lld]: %.8g vs transformers %.8g", what,
                  (long long)i, got[i], want[i]);
}

// ---------------------------------------------------------------------------------------------
// Sinks

// Both CPU kernels (tiled and scalar reference) against transformers on each case of the
// fixture: out and lse within model_ops' forward tolerance (1e-5), the gradients of Σ out·dout
// (q, k, v and the sinks, accumulated from zero) within its backward one (1e-4 of the largest).
static void sinks_case(const mt_st_file *f, int c, int window, int use_mask, int ref) {
    cJSON *shape = meta_json(f, "shape");
    const int B = (int)num(shape, "B", 0), S = (int)num(shape, "S", 0), nh = (int)num(shape, "nh", 0);
    const int nkv = (int)num(shape, "nkv", 0), hd = (int)num(shape, "hd", 0);
    cJSON_Delete(shape);
    const size_t T = (size_t)B * S, nq = T * nh * hd, nk = T * nkv * hd;
    float *q = f32_of(f, "q", nq), *k = f32_of(f, "k", nk), *v = f32_of(f, "v", nk), *g = f32_of(f, "dout", nq);
    float *sinks = f32_of(f, "sinks", (size_t)nh);
    uint8_t *mask = copy_n(f, "mask", T, 1);
    char name[32], what[96];
    snprintf(name, sizeof name, "out_%d", c);
    float *want_out = f32_of(f, name, nq);
    snprintf(name, sizeof name, "lse_%d", c);
    float *want_lse = f32_of(f, name, T * nh);
    float *out = mt_xcalloc(nq, 4), *lse = mt_xcalloc(T * nh, 4);
    float *dq = mt_xcalloc(nq, 4), *dk = mt_xcalloc(nk, 4), *dv = mt_xcalloc(nk, 4), *ds = mt_xcalloc((size_t)nh, 4);
    const uint8_t *km = use_mask ? mask : NULL;
    const float scale = 1.0f / sqrtf((float)hd);
    (ref ? attention_forward_ref : attention_forward_cpu)(out, lse, q, k, v, sinks, km, B, S, nh, nkv, hd, hd, scale,
                                                          window);
    (ref ? attention_backward_ref : attention_backward_cpu)(dq, dk, dv, ds, g, q, k, v, out, lse, sinks, km, B, S, nh,
                                                            nkv, hd, hd, scale, window);
    const char *kern = ref ? "ref" : "tiled";
    snprintf(what, sizeof what, "case %d (%s) out", c, kern);
    for (size_t i = 0; i < nq; i++)
        cr_assert(fabsf(out[i] - want_out[i]) < 1e-5f, "%s[%zu]: %.8g vs %.8g", what, i, out[i], want_out[i]);
    snprintf(what, sizeof what, "case %d (%s) lse", c, kern);
    for (size_t i = 0; i < T * nh; i++)
        cr_assert(fabsf(lse[i] - want_lse[i]) < 1e-5f * (1 + fabsf(want_lse[i])), "%s[%zu]: %.8g vs %.8g", what, i,
                  lse[i], want_lse[i]);
    float *got[4] = {dq, dk, dv, ds};
    const size_t n[4] = {nq, nk, nk, (size_t)nh};
    static const char *grads[4] = {"dq", "dk", "dv", "dsinks"};
    for (int t = 0; t < 4; t++) {
        snprintf(name, sizeof name, "%s_%d", grads[t], c);
        float *want = f32_of(f, name, n[t]);
        snprintf(what, sizeof what, "case %d (%s) %s", c, kern, grads[t]);
        close_to(got[t], want, (int64_t)n[t], 1e-4f, what);
        free(want);
    }
    free(q), free(k), free(v), free(g), free(sinks), free(mask), free(want_out), free(want_lse);
    free(out), free(lse), free(dq), free(dk), free(dv), free(ds);
}

Test(gpt_oss_ops, sinks_match_transformers_eager_attention) {
    mt_st_file f;
    cr_assert_eq(mt_st_file_open(&f, FIXTURES "sinks.safetensors"), 0, "%s", mt_error_get());
    cJSON *cases = meta_json(&f, "cases");
    cr_assert(cJSON_GetArraySize(cases) >= 3, "the fixture has its three cases");
    int windowed = 0, masked = 0;
    for (int c = 0; c < cJSON_GetArraySize(cases); c++) {
        const cJSON *cs = cJSON_GetArrayItem(cases, c);
        int window = (int)num(cs, "window", -1), use_mask = (int)num(cs, "mask", -1);
        cr_assert(window >= 0 && use_mask >= 0, "case %d: window and mask", c);
        windowed += window > 0, masked += use_mask;
        sinks_case(&f, c, window, use_mask, 0);
        sinks_case(&f, c, window, use_mask, 1);
    }
    cr_assert(windowed && masked, "the fixture covers a window and a padding mask");
    cJSON_Delete(cases);
    mt_st_file_close(&f);
}

// ---------------------------------------------------------------------------------------------
// RoPE tables (model/rope.h)

static void params_of(const cJSON *o, mt_rope_params *p) {
    *p = (mt_rope_params){
        .yarn = 1, .hd = (int)num(o, "head_dim", 0), .theta = num(o, "rope_theta", 0), .factor = num(o, "factor", 0),
        .beta_fast = num(o, "beta_fast", 0), .beta_slow = num(o, "beta_slow", 0),
        .attention_factor = num(o, "attention_factor", 0), .mscale = num(o, "mscale", 0),
        .mscale_all_dim = num(o, "mscale_all_dim", 0), .original_max = (int64_t)num(o, "original_max_position_embeddings", 0),
        .max_positions = (int64_t)num(o, "max_position_embeddings", 0), .truncate = (int)num(o, "truncate", 1)};
}

// inv_freq to fp32 precision: every step is transformers' fp32 step, but its base ** exponent is
// torch's vectorised pow (SLEEF, 1 ulp), which differs from glibc's powf by one ulp at some j
// (2 of 32 for gpt-oss's set); the attention factor exactly. Then the rotation: with transformers'
// own table it matches apply_rotary_pos_emb to 2e-6 at every position; with ours, a one-ulp
// inv_freq moves the angle by pos · 2^-24 · inv_freq (~3e-5 rad at 4096, ~1e-3 at gpt-oss's
// 131071): checked to 5e-5 up to position 4096 (bit-exact long positions need SLEEF's pow).
Test(gpt_oss_ops, yarn_table_and_rope_match_transformers) {
    mt_st_file f;
    cr_assert_eq(mt_st_file_open(&f, FIXTURES "yarn.safetensors"), 0, "%s", mt_error_get());
    cJSON *sets = meta_json(&f, "params");
    cr_assert(cJSON_GetArraySize(sets) >= 2);
    for (int s = 0; s < cJSON_GetArraySize(sets); s++) {
        mt_rope_params p;
        params_of(cJSON_GetArrayItem(sets, s), &p);
        const int half = p.hd / 2;
        float inv[128], scale = 0;
        cr_assert_eq(mt_rope_table(&p, inv, &scale), 0, "set %d: %s", s, mt_error_get());
        char name[32];
        snprintf(name, sizeof name, "inv_freq_%d", s);
        float *want = f32_of(&f, name, (size_t)half);
        int off = 0;
        for (int j = 0; j < half; j++) {
            float ulp = nextafterf(fabsf(want[j]), INFINITY) - fabsf(want[j]);
            cr_assert(fabsf(inv[j] - want[j]) <= ulp, "set %d inv_freq[%d]: %.9g vs transformers %.9g", s, j, inv[j],
                      want[j]);
            off += inv[j] != want[j];
        }
        if (off) cr_log_info("set %d: %d of %d inv_freq one ulp off transformers (SLEEF pow)", s, off, half);
        snprintf(name, sizeof name, "attention_factor_%d", s);
        double af;
        memcpy(&af, st_need(&f, name)->data, sizeof af);
        cr_assert_eq(scale, (float)af, "set %d attention factor %.9g vs transformers %.9g", s, scale, af);

        snprintf(name, sizeof name, "rope_pos_%d", s);
        const mt_st_tensor *pt = st_need(&f, name);
        const int T = (int)(pt->nbytes / 4), nh = 2;
        int32_t *pos = copy_n(&f, name, (size_t)T, 4);
        snprintf(name, sizeof name, "rope_x_%d", s);
        float *x = f32_of(&f, name, (size_t)T * nh * p.hd);
        snprintf(name, sizeof name, "rope_y_%d", s);
        float *y = f32_of(&f, name, (size_t)T * nh * p.hd);
        float *x0 = mt_xmalloc(sizeof(float) * T * nh * p.hd);
        memcpy(x0, x, sizeof(float) * T * nh * p.hd);
        rope_forward_cpu(x, pos, T, nh, p.hd, 0, p.hd, 0, want, scale);  // transformers' own table: the rotation alone
        close_to(x, y, (int64_t)T * nh * p.hd, 2e-6f, "rope with transformers' table");
        memcpy(x, x0, sizeof(float) * T * nh * p.hd);
        rope_forward_cpu(x, pos, T, nh, p.hd, 0, p.hd, 0, inv, scale);  // ours, up to the original context
        for (int t = 0; t < T; t++)
            if (pos[t] <= 4096) close_to(x + t * nh * p.hd, y + t * nh * p.hd, nh * p.hd, 5e-5f, "rope with mt_rope_table's");
        // The backward is the transpose of the scaled rotation: <R x0, g> = <x0, Rᵀ g>.
        float *gr = mt_xmalloc(sizeof(float) * T * nh * p.hd);
        for (int i = 0; i < T * nh * p.hd; i++) gr[i] = y[(i * 7) % (T * nh * p.hd)];
        double lhs = 0, rhs = 0;
        for (int i = 0; i < T * nh * p.hd; i++) lhs += (double)x[i] * gr[i];
        rope_backward_cpu(gr, pos, T, nh, p.hd, 0, p.hd, 0, inv, scale);
        for (int i = 0; i < T * nh * p.hd; i++) rhs += (double)x0[i] * gr[i];
        cr_assert(fabs(lhs - rhs) < 1e-5 * (1 + fabs(lhs)), "set %d: <Rx, g> %.9g vs <x, Rᵀg> %.9g", s, lhs, rhs);
        free(want), free(pos), free(x), free(y), free(x0), free(gr);
    }
    cJSON_Delete(sets);
    mt_st_file_close(&f);
}

// The default table is transformers' default RoPE: 1 / theta^(2j/hd) in fp32, scale 1.
Test(gpt_oss_ops, default_table_is_plain_rope) {
    mt_rope_params p = {.hd = 8, .theta = 10000.0};
    float inv[4], scale;
    cr_assert_eq(mt_rope_table(&p, inv, &scale), 0);
    cr_assert_eq(scale, 1.0f);
    for (int j = 0; j < 4; j++) cr_assert_eq(inv[j], 1.0f / powf(10000.0f, (float)(2 * j) / 8.0f));
}

Test(gpt_oss_ops, rope_table_refuses_bad_values) {
    float inv[64], scale;
    mt_rope_params p = {.hd = 7, .theta = 10000.0};
    cr_assert_eq(mt_rope_table(&p, inv, &scale), -1);
    cr_assert(strstr(mt_error_get(), "head_dim"), "%s", mt_error_get());
    p = (mt_rope_params){.hd = 8, .theta = 0};
    cr_assert_eq(mt_rope_table(&p, inv, &scale), -1);
    p = (mt_rope_params){.yarn = 1, .hd = 8, .theta = 1e4, .factor = 4};
    cr_assert_eq(mt_rope_table(&p, inv, &scale), -1, "yarn without original_max_position_embeddings");
    p = (mt_rope_params){.yarn = 1, .hd = 8, .theta = 1e4, .factor = -2, .original_max = 64};
    cr_assert_eq(mt_rope_table(&p, inv, &scale), -1, "a negative factor");
    p = (mt_rope_params){.yarn = 1, .hd = 8, .theta = 1e4, .original_max = 64, .max_positions = 256};
    cr_assert_eq(mt_rope_table(&p, inv, &scale), 0, "factor derived: %s", mt_error_get());
    cr_assert_float_eq(scale, (float)(0.1 * log(4.0) + 1.0), 1e-7);
}
