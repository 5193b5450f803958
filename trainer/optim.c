// trainer/optim.c — AdamW (formulas in optim.h): state allocation, the global grad norm, the
// update (one static CPU function per weight dtype, so a CUDA twin can sit beside each), and
// the state file.
#include "trainer/optim.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <string.h>

#include "core/common.h"
#include "core/safetensors.h"

#define OPTIM_FORMAT "moetrain-adamw"

mt_adamw_opts mt_adamw_opts_default(void) {
    return (mt_adamw_opts){.lr = 1e-4, .beta1 = 0.9, .beta2 = 0.999, .eps = 1e-8,
                           .weight_decay = 0.0};
}

int mt_param_decays(const mt_tensor *w) { return w && w->ndim >= 2; }

static int same_shape(const mt_tensor *a, const mt_tensor *b) {
    if (a->ndim != b->ndim) return 0;
    for (int d = 0; d < a->ndim; d++)
        if (a->shape[d] != b->shape[d]) return 0;
    return 1;
}

static void shape_str(char *buf, size_t n, int ndim, const int64_t *shape) {
    size_t k = (size_t)snprintf(buf, n, "[");
    for (int d = 0; d < ndim && k < n; d++)
        k += (size_t)snprintf(buf + k, n - k, d ? ", %lld" : "%lld", (long long)shape[d]);
    if (k < n) snprintf(buf + k, n - k, "]");
}

static const char *pname(const mt_param *p, int i, char *buf, size_t n) {
    if (p->name) return p->name;
    snprintf(buf, n, "param #%d", i);
    return buf;
}

// ---------------------------------------------------------------------------------------------
// State
// ---------------------------------------------------------------------------------------------

void mt_adamw_free(mt_adamw *o) {
    if (!o) return;
    for (int i = 0; i < o->n; i++) {
        if (o->m) mt_tensor_free(o->m[i]);
        if (o->v) mt_tensor_free(o->v[i]);
        if (o->master) mt_tensor_free(o->master[i]);
    }
    free(o->m);
    free(o->v);
    free(o->master);
    memset(o, 0, sizeof *o);
}

static int check_opts(const mt_adamw_opts *p) {
    if (!(p->beta1 >= 0 && p->beta1 < 1) || !(p->beta2 >= 0 && p->beta2 < 1)) {
        mt_error_set("adamw: betas (%g, %g) must lie in [0, 1)", p->beta1, p->beta2);
        return -1;
    }
    if (!(p->eps >= 0 && isfinite(p->eps))) {
        mt_error_set("adamw: eps %g must be finite and >= 0", p->eps);
        return -1;
    }
    if (!(p->weight_decay >= 0 && isfinite(p->weight_decay))) {
        mt_error_set("adamw: weight decay %g must be finite and >= 0", p->weight_decay);
        return -1;
    }
    return 0;
}

static int check_param(const mt_param *p, int i) {
    char nb[32];
    const char *name = pname(p, i, nb, sizeof nb);
    if (!p->w || !p->g) {
        mt_error_set("adamw: param '%s': missing weight or gradient tensor", name);
        return -1;
    }
    if (p->w->dtype != MT_F32 && p->w->dtype != MT_BF16) {
        mt_error_set("adamw: param '%s': weight dtype %s is not f32 or bf16", name,
                     mt_dtype_name(p->w->dtype));
        return -1;
    }
    if (p->g->dtype != p->w->dtype) {
        mt_error_set("adamw: param '%s': gradient dtype %s differs from the weight's %s", name,
                     mt_dtype_name(p->g->dtype), mt_dtype_name(p->w->dtype));
        return -1;
    }
    if (!same_shape(p->w, p->g)) {
        char a[96], b[96];
        shape_str(a, sizeof a, p->w->ndim, p->w->shape);
        shape_str(b, sizeof b, p->g->ndim, p->g->shape);
        mt_error_set("adamw: param '%s': gradient shape %s differs from the weight's %s", name, b, a);
        return -1;
    }
    return 0;
}

// master = f32(w), through host memory (init only).
static void master_from_weight(mt_tensor *master, const mt_tensor *w) {
    if (!w->data || !master->data) return;  // null backend: nothing to copy
    size_t n = (size_t)mt_tensor_numel(w);
    void *hw = mt_xmalloc(w->nbytes ? w->nbytes : 1);
    float *hm = mt_xmalloc(n ? n * sizeof(float) : 1);
    mt_tensor_download(w, hw);
    mt_convert(hm, MT_F32, hw, w->dtype, n);
    mt_tensor_upload(master, hm);
    free(hw);
    free(hm);
}

int mt_adamw_init(mt_adamw *o, mt_backend *be, const mt_param *params, int n,
                  const mt_adamw_opts *opts) {
    memset(o, 0, sizeof *o);
    o->opts = opts ? *opts : mt_adamw_opts_default();
    if (check_opts(&o->opts) != 0) return -1;
    if (n < 0 || (n > 0 && !params)) {
        mt_error_set("adamw: %d params", n);
        return -1;
    }
    for (int i = 0; i < n; i++)
        if (check_param(&params[i], i) != 0) return -1;
    o->be = be;
    o->n = n;
    size_t cnt = n ? (size_t)n : 1;
    o->m = mt_xcalloc(cnt, sizeof *o->m);
    o->v = mt_xcalloc(cnt, sizeof *o->v);
    o->master = mt_xcalloc(cnt, sizeof *o->master);
    for (int i = 0; i < n; i++) {
        const mt_tensor *w = params[i].w;
        o->m[i] = mt_tensor_new(be, MT_MEM_OPTIM, MT_F32, w->ndim, w->shape);
        o->v[i] = o->m[i] ? mt_tensor_new(be, MT_MEM_OPTIM, MT_F32, w->ndim, w->shape) : NULL;
        if (o->v[i] && w->dtype != MT_F32)
            o->master[i] = mt_tensor_new(be, MT_MEM_MASTER, MT_F32, w->ndim, w->shape);
        if (!o->m[i] || !o->v[i] || (w->dtype != MT_F32 && !o->master[i])) {
            char nb[32];
            mt_error_prefix("adamw: state of param '%s'", pname(&params[i], i, nb, sizeof nb));
            mt_adamw_free(o);
            return -1;
        }
        be->ops->fill_zero(be, o->m[i]->data, o->m[i]->nbytes);
        be->ops->fill_zero(be, o->v[i]->data, o->v[i]->nbytes);
        if (o->master[i]) master_from_weight(o->master[i], w);
    }
    return 0;
}

// Params given to step/save/load must be the ones given to init (same count, shapes, dtypes).
static int check_match(const mt_adamw *o, const mt_param *params, int n, const char *what) {
    if (n != o->n) {
        mt_error_set("adamw %s: %d params, but the optimizer was built for %d", what, n, o->n);
        return -1;
    }
    for (int i = 0; i < n; i++) {
        const mt_param *p = &params[i];
        char nb[32];
        if (!p->w || !p->g || !same_shape(p->w, o->m[i]) || !same_shape(p->g, o->m[i]) ||
            p->g->dtype != p->w->dtype || (p->w->dtype != MT_F32) != (o->master[i] != NULL)) {
            mt_error_set("adamw %s: param '%s' does not match the one the optimizer was built for",
                         what, pname(p, i, nb, sizeof nb));
            return -1;
        }
    }
    return 0;
}

// ---------------------------------------------------------------------------------------------
// Global grad norm: blocks of NORM_BLOCK elements, each summed in order in double; NORM_GROUP
// blocks at a time in parallel, their sums then added in order. The grouping is fixed, so the
// result does not depend on the number of threads.
// ---------------------------------------------------------------------------------------------

#define NORM_BLOCK 8192
#define NORM_GROUP 64

static double sumsq_f32(const float *x, int64_t n) {
    double s = 0.0;
    for (int64_t i = 0; i < n; i++) s += (double)x[i] * (double)x[i];
    return s;
}

static double sumsq_bf16(const uint16_t *x, int64_t n) {
    double s = 0.0;
    for (int64_t i = 0; i < n; i++) {
        double f = (double)mt_bf16_to_f32(x[i]);
        s += f * f;
    }
    return s;
}

// g [n] f32 or bf16, host memory → Σ g².
static double sumsq_cpu(const mt_tensor *g) {
    int64_t n = mt_tensor_numel(g);
    double total = 0.0;
    for (int64_t base = 0; base < n; base += (int64_t)NORM_BLOCK * NORM_GROUP) {
        double part[NORM_GROUP];
        int64_t left = n - base;
        int nb = (int)MT_MIN((int64_t)NORM_GROUP, (left + NORM_BLOCK - 1) / NORM_BLOCK);
#pragma omp parallel for schedule(static) if (nb > 1)
        for (int b = 0; b < nb; b++) {
            int64_t off = base + (int64_t)b * NORM_BLOCK;
            int64_t len = MT_MIN((int64_t)NORM_BLOCK, n - off);
            part[b] = g->dtype == MT_F32 ? sumsq_f32((const float *)g->data + off, len)
                                         : sumsq_bf16((const uint16_t *)g->data + off, len);
        }
        for (int b = 0; b < nb; b++) total += part[b];
    }
    return total;
}

double mt_grad_norm(const mt_param *params, int n) {
    double total = 0.0;
    for (int i = 0; i < n; i++) {
        const mt_tensor *g = params[i].g;
        if (!g || !g->data || g->be->ops->kind == MT_BACKEND_NULL) continue;  // null: nothing
        if (g->be->ops->kind != MT_BACKEND_CPU) {
            mt_error_set("grad norm: '%s' is on the %s backend, which has no norm kernel yet",
                         params[i].name ? params[i].name : "?", g->be->ops->name);
            return NAN;
        }
        total += sumsq_cpu(g);
    }
    return sqrt(total);
}

// ---------------------------------------------------------------------------------------------
// The update. Scalars once per step in double, rounded to fp32; elements in fp32.
// ---------------------------------------------------------------------------------------------

typedef struct adamw_k {
    float scale;      // clipping factor for g
    float decay_mul;  // 1 − lr·wd, or 1 for params without decay
    float beta1, one_minus_beta1, beta2, one_minus_beta2;
    float step_size;  // lr / (1 − β1^t)
    float bc2_sqrt;   // √(1 − β2^t)
    float eps;
} adamw_k;

// w, g, m, v [n] f32, host memory.
static void adamw_update_f32_cpu(float *w, const float *g, float *m, float *v, int64_t n,
                                 adamw_k k) {
#pragma omp parallel for schedule(static) if (n >= 32768)
    for (int64_t i = 0; i < n; i++) {
        float gi = g[i] * k.scale;
        float wi = w[i] * k.decay_mul;
        float mi = k.beta1 * m[i] + k.one_minus_beta1 * gi;
        float vi = k.beta2 * v[i] + k.one_minus_beta2 * gi * gi;
        float denom = sqrtf(vi) / k.bc2_sqrt + k.eps;
        m[i] = mi;
        v[i] = vi;
        w[i] = wi - k.step_size * (mi / denom);
    }
}

// w, g [n] bf16; master, m, v [n] f32, host memory. The master is updated, w = bf16(master).
static void adamw_update_bf16_cpu(uint16_t *w, float *master, const uint16_t *g, float *m,
                                  float *v, int64_t n, adamw_k k) {
#pragma omp parallel for schedule(static) if (n >= 32768)
    for (int64_t i = 0; i < n; i++) {
        float gi = mt_bf16_to_f32(g[i]) * k.scale;
        float wi = master[i] * k.decay_mul;
        float mi = k.beta1 * m[i] + k.one_minus_beta1 * gi;
        float vi = k.beta2 * v[i] + k.one_minus_beta2 * gi * gi;
        float denom = sqrtf(vi) / k.bc2_sqrt + k.eps;
        m[i] = mi;
        v[i] = vi;
        master[i] = wi - k.step_size * (mi / denom);
        w[i] = mt_f32_to_bf16(master[i]);
    }
}

int mt_adamw_step(mt_adamw *o, const mt_param *params, int n, double lr, double clip,
                  double *grad_norm_out) {
    if (grad_norm_out) *grad_norm_out = 0.0;
    if (check_match(o, params, n, "step") != 0) return -1;
    if (!(lr >= 0 && isfinite(lr))) {
        mt_error_set("adamw step: learning rate %g is negative or not finite", lr);
        return -1;
    }
    for (int i = 0; i < n; i++) {
        mt_backend_kind kw = params[i].w->be->ops->kind, ko = o->m[i]->be->ops->kind;
        if (kw == MT_BACKEND_NULL || ko == MT_BACKEND_NULL) continue;
        if (kw != MT_BACKEND_CPU || ko != MT_BACKEND_CPU ||
            params[i].g->be->ops->kind != MT_BACKEND_CPU) {
            char nb[32];
            mt_error_set("adamw step: param '%s': only the cpu backend has an AdamW update so far",
                         pname(&params[i], i, nb, sizeof nb));
            return -1;
        }
    }
    double norm = mt_grad_norm(params, n);
    if (grad_norm_out) *grad_norm_out = norm;
    if (!isfinite(norm)) return 1;

    const mt_adamw_opts *p = &o->opts;
    int64_t t = o->step + 1;
    double bc1 = 1.0 - pow(p->beta1, (double)t);
    double bc2 = 1.0 - pow(p->beta2, (double)t);
    adamw_k k = {
        .scale = (clip > 0 && norm > clip) ? (float)(clip / norm) : 1.0f,
        .beta1 = (float)p->beta1,
        .one_minus_beta1 = (float)(1.0 - p->beta1),
        .beta2 = (float)p->beta2,
        .one_minus_beta2 = (float)(1.0 - p->beta2),
        .step_size = (float)(lr / bc1),
        .bc2_sqrt = (float)sqrt(bc2),
        .eps = (float)p->eps,
    };
    float decay_mul = (float)(1.0 - lr * p->weight_decay);
    for (int i = 0; i < n; i++) {
        const mt_param *q = &params[i];
        if (!q->w->data || !o->m[i]->data) continue;  // null backend
        k.decay_mul = q->decay ? decay_mul : 1.0f;
        int64_t cnt = mt_tensor_numel(q->w);
        if (q->w->dtype == MT_F32)
            adamw_update_f32_cpu(q->w->data, q->g->data, o->m[i]->data, o->v[i]->data, cnt, k);
        else
            adamw_update_bf16_cpu(q->w->data, o->master[i]->data, q->g->data, o->m[i]->data,
                                  o->v[i]->data, cnt, k);
    }
    o->step = t;
    return 0;
}

// ---------------------------------------------------------------------------------------------
// State file
// ---------------------------------------------------------------------------------------------

static const char *const state_suffix[3] = {".exp_avg", ".exp_avg_sq", ".master"};

static mt_tensor *state_tensor(const mt_adamw *o, int i, int which) {
    return which == 0 ? o->m[i] : which == 1 ? o->v[i] : o->master[i];
}

static char *state_name(const mt_param *p, int i, int which) {
    char nb[32];
    const char *base = pname(p, i, nb, sizeof nb);
    size_t len = strlen(base) + strlen(state_suffix[which]) + 1;
    char *s = mt_xmalloc(len);
    snprintf(s, len, "%s%s", base, state_suffix[which]);
    return s;
}

static int save_fill(void *ctx, size_t index, void *dst, size_t nbytes) {
    mt_tensor *t = ((mt_tensor **)ctx)[index];
    if (t->nbytes != nbytes) {
        mt_error_set("adamw save: internal size mismatch");
        return -1;
    }
    mt_tensor_download(t, dst);
    return 0;
}

int mt_adamw_save(const mt_adamw *o, const mt_param *params, int n, const char *path) {
    if (check_match(o, params, n, "save") != 0) return -1;
    size_t cap = (size_t)(n ? n : 1) * 3;
    mt_st_entry *e = mt_xcalloc(cap, sizeof *e);
    mt_tensor **src = mt_xcalloc(cap, sizeof *src);
    size_t k = 0;
    for (int i = 0; i < n; i++)
        for (int which = 0; which < 3; which++) {
            mt_tensor *t = state_tensor(o, i, which);
            if (!t) continue;
            e[k].name = state_name(&params[i], i, which);
            e[k].dtype = "F32";
            e[k].ndim = t->ndim;
            for (int d = 0; d < t->ndim; d++) e[k].shape[d] = t->shape[d];
            e[k].data = NULL;
            src[k++] = t;
        }
    char meta[128];
    snprintf(meta, sizeof meta, "{\"format\":\"" OPTIM_FORMAT "\",\"step\":\"%" PRId64 "\"}",
             o->step);
    int rc = mt_st_write(path, e, k, meta, save_fill, src);
    for (size_t j = 0; j < k; j++) free((char *)e[j].name);
    free(e);
    free(src);
    return rc;
}

static int load_step(const mt_st_file *f, const char *path, int64_t *step) {
    cJSON *meta = f->metadata_json ? cJSON_Parse(f->metadata_json) : NULL;
    const cJSON *fmt = cJSON_GetObjectItemCaseSensitive(meta, "format");
    const cJSON *st = cJSON_GetObjectItemCaseSensitive(meta, "step");
    int ok = cJSON_IsString(fmt) && strcmp(fmt->valuestring, OPTIM_FORMAT) == 0;
    if (!ok) {
        mt_error_set("%s: not an optimizer state file (metadata \"format\" is not \"" OPTIM_FORMAT
                     "\")", path);
        cJSON_Delete(meta);
        return -1;
    }
    char *end = NULL;
    errno = 0;
    long long v = cJSON_IsString(st) ? strtoll(st->valuestring, &end, 10) : -1;
    if (!cJSON_IsString(st) || errno || end == st->valuestring || *end || v < 0) {
        mt_error_set("%s: metadata \"step\" is missing or not a non-negative integer", path);
        cJSON_Delete(meta);
        return -1;
    }
    *step = v;
    cJSON_Delete(meta);
    return 0;
}

int mt_adamw_load(mt_adamw *o, const mt_param *params, int n, const char *path) {
    if (check_match(o, params, n, "load") != 0) return -1;
    mt_st_file f;
    if (mt_st_file_open(&f, path) != 0) return -1;
    int64_t step;
    if (load_step(&f, path, &step) != 0) {
        mt_st_file_close(&f);
        return -1;
    }
    // Check everything first.
    size_t cap = (size_t)(n ? n : 1) * 3, k = 0;
    const mt_st_tensor **found = mt_xcalloc(cap, sizeof *found);
    mt_tensor **dst = mt_xcalloc(cap, sizeof *dst);
    char **names = mt_xcalloc(cap, sizeof *names);
    int rc = 0;
    for (int i = 0; i < n && rc == 0; i++)
        for (int which = 0; which < 3 && rc == 0; which++) {
            mt_tensor *t = state_tensor(o, i, which);
            if (!t) continue;
            char *name = state_name(&params[i], i, which);
            names[k] = name;
            const mt_st_tensor *s = mt_st_file_find(&f, name);
            char want[96], got[96];
            shape_str(want, sizeof want, t->ndim, t->shape);
            if (!s) {
                mt_error_set("%s: tensor '%s' is missing (expected F32 %s)", path, name, want);
                rc = -1;
            } else if (strcmp(s->dtype, "F32") != 0) {
                mt_error_set("%s: tensor '%s': dtype %s, expected F32", path, name, s->dtype);
                rc = -1;
            } else if (s->ndim != t->ndim || memcmp(s->shape, t->shape, sizeof(int64_t) *
                                                                            (size_t)t->ndim) != 0) {
                shape_str(got, sizeof got, s->ndim, s->shape);
                mt_error_set("%s: tensor '%s': shape %s, expected %s", path, name, got, want);
                rc = -1;
            } else if (s->nbytes != t->nbytes) {
                mt_error_set("%s: tensor '%s': %" PRIu64 " bytes, expected %zu", path, name,
                             s->nbytes, t->nbytes);
                rc = -1;
            }
            found[k] = s;
            dst[k++] = t;
        }
    if (rc == 0 && f.n_tensors != k) {
        for (size_t j = 0; j < f.n_tensors; j++) {
            int known = 0;
            for (size_t q = 0; q < k && !known; q++) known = strcmp(f.tensors[j].name, names[q]) == 0;
            if (!known) {
                mt_error_set("%s: tensor '%s' belongs to no trainable parameter of this run", path,
                             f.tensors[j].name);
                break;
            }
        }
        rc = -1;
    }
    if (rc == 0) {
        for (size_t j = 0; j < k; j++) mt_tensor_upload(dst[j], found[j]->data);
        o->step = step;
    }
    for (size_t j = 0; j < k; j++) free(names[j]);
    free(names);
    free(found);
    free(dst);
    mt_st_file_close(&f);
    return rc;
}
