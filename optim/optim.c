// optim/optim.c — AdamW (formulas and options in optim.h): state allocation (fp32 or 8-bit,
// on the weights' backend or offloaded to the host), the global grad norm, the update (one
// static CPU function per weight dtype, so a CUDA twin can sit beside each, applied block by
// block) and the state file.
#include "optim/optim.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <string.h>

#include "core/common.h"
#include "core/profile.h"
#include "core/safetensors.h"
#include "core/vmath.h"
#include "optim/optim_cuda.h"  // the cuda update and norm (MT_CUDA builds)

#define OPTIM_FORMAT "moetrain-adamw"

mt_adamw_opts mt_adamw_opts_default(void) {
    return (mt_adamw_opts){.lr = 1e-4, .beta1 = 0.9, .beta2 = 0.999, .eps = 1e-8,
                           .weight_decay = 0.0, .adam_8bit = 0, .master_weights = 1, .offload = 0};
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
    mt_tensor **all[5] = {o->m, o->v, o->m_absmax, o->v_absmax, o->master};
    for (int k = 0; k < 5; k++) {
        mt_tensor **arr = all[k];
        for (int i = 0; arr && i < o->n; i++) mt_tensor_free(arr[i]);
        free(arr);
    }
    if (o->host) mt_backend_free(o->host);  // after its tensors
    memset(o, 0, sizeof *o);
}

int mt_adamw_is_8bit(const mt_adamw *o, int i) {
    return o && i >= 0 && i < o->n && o->m && o->m[i] && o->m[i]->dtype == MT_U8;
}

uint64_t mt_adamw_host_bytes(const mt_adamw *o) {
    if (!o || !o->host) return 0;
    return o->host->ledger.cur[MT_MEM_OPTIM] + o->host->ledger.cur[MT_MEM_MASTER];
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

static int64_t adam8_blocks(int64_t n) { return (n + MT_ADAM8_BLOCK - 1) / MT_ADAM8_BLOCK; }

// m, v (and their absmax for 8-bit state) and the master of param i, zeroed / initialised.
static int alloc_state(mt_adamw *o, int i, const mt_tensor *w) {
    mt_backend *sb = o->state_be;
    int64_t numel = mt_tensor_numel(w);
    int q8 = o->opts.adam_8bit && numel >= MT_ADAM8_MIN_SIZE;
    mt_dtype sd = q8 ? MT_U8 : MT_F32;
    int64_t nb[1] = {adam8_blocks(numel)};
    if (!(o->m[i] = mt_tensor_new(sb, MT_MEM_OPTIM, sd, w->ndim, w->shape))) return -1;
    if (!(o->v[i] = mt_tensor_new(sb, MT_MEM_OPTIM, sd, w->ndim, w->shape))) return -1;
    if (q8 && !(o->m_absmax[i] = mt_tensor_new(sb, MT_MEM_OPTIM, MT_F32, 1, nb))) return -1;
    if (q8 && !(o->v_absmax[i] = mt_tensor_new(sb, MT_MEM_OPTIM, MT_F32, 1, nb))) return -1;
    if (w->dtype != MT_F32 && o->opts.master_weights &&
        !(o->master[i] = mt_tensor_new(sb, MT_MEM_MASTER, MT_F32, w->ndim, w->shape)))
        return -1;
    // Zero state: fp32 zeros; 8-bit codes 0 with absmax 0 decode to zeros as well (bitsandbytes
    // starts from zeroed state buffers and absmax too).
    mt_tensor *z[4] = {o->m[i], o->v[i], o->m_absmax[i], o->v_absmax[i]};
    for (int k = 0; k < 4; k++)
        if (z[k]) sb->ops->fill_zero(sb, z[k]->data, z[k]->nbytes);
    if (o->master[i]) master_from_weight(o->master[i], w);
    return 0;
}

// The cuda backend itself, whose memory the update's kernels can read (not merely a device-kind
// backend, such as the tests' stand-in whose memory is the host's).
static int cuda_kernels_run_on(const mt_backend *be) {
#ifdef MT_CUDA
    return be->ops->kind == MT_BACKEND_CUDA && strcmp(be->ops->name, "cuda") == 0;
#else
    (void)be;
    return 0;
#endif
}

int mt_adamw_init(mt_adamw *o, mt_backend *be, const mt_param *params, int n,
                  const mt_adamw_opts *opts) {
    memset(o, 0, sizeof *o);
    o->opts = opts ? *opts : mt_adamw_opts_default();
    o->opts.adam_8bit = !!o->opts.adam_8bit;
    o->opts.master_weights = !!o->opts.master_weights;
    o->opts.offload = !!o->opts.offload;
    if (check_opts(&o->opts) != 0) return -1;
    if (n < 0 || (n > 0 && !params)) {
        mt_error_set("adamw: %d params", n);
        return -1;
    }
    for (int i = 0; i < n; i++)
        if (check_param(&params[i], i) != 0) return -1;
    if (cuda_kernels_run_on(be) && o->opts.adam_8bit && !o->opts.offload) {
        mt_error_set("adamw: 8-bit state is updated on the host only so far: with --adam-8bit on cuda add "
                     "--offload-optimizer");
        return -1;
    }
    o->be = be;
    if (o->opts.offload)  // the host side of a null (measuring) run only counts, too
        o->host = be->ops->kind == MT_BACKEND_NULL ? mt_backend_null_new() : mt_backend_cpu_new();
    o->state_be = o->host ? o->host : be;
    o->n = n;
    size_t cnt = n ? (size_t)n : 1;
    o->m = mt_xcalloc(cnt, sizeof *o->m);
    o->v = mt_xcalloc(cnt, sizeof *o->v);
    o->m_absmax = mt_xcalloc(cnt, sizeof *o->m_absmax);
    o->v_absmax = mt_xcalloc(cnt, sizeof *o->v_absmax);
    o->master = mt_xcalloc(cnt, sizeof *o->master);
    for (int i = 0; i < n; i++) {
        if (alloc_state(o, i, params[i].w) != 0) {
            char nb[32];
            mt_error_prefix("adamw: state of param '%s'", pname(&params[i], i, nb, sizeof nb));
            mt_adamw_free(o);
            return -1;
        }
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
            p->g->dtype != p->w->dtype ||
            (p->w->dtype != MT_F32 && o->opts.master_weights) != (o->master[i] != NULL)) {
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

// x [n] f32 or bf16, host memory: adds Σ x² to *total in groups of NORM_GROUP blocks, in order.
// Feeding a tensor in pieces whose lengths are multiples of NORM_BLOCK · NORM_GROUP gives the
// same bits as feeding it whole (the offloaded norm reads grads in such chunks).
static void sumsq_acc(const void *x, mt_dtype dt, int64_t n, double *total) {
    for (int64_t base = 0; base < n; base += (int64_t)NORM_BLOCK * NORM_GROUP) {
        double part[NORM_GROUP];
        int64_t left = n - base;
        int nb = (int)MT_MIN((int64_t)NORM_GROUP, (left + NORM_BLOCK - 1) / NORM_BLOCK);
#pragma omp parallel for schedule(static) if (nb > 1)
        for (int b = 0; b < nb; b++) {
            int64_t off = base + (int64_t)b * NORM_BLOCK;
            int64_t len = MT_MIN((int64_t)NORM_BLOCK, n - off);
            part[b] = dt == MT_F32 ? sumsq_f32((const float *)x + off, len)
                                   : sumsq_bf16((const uint16_t *)x + off, len);
        }
        for (int b = 0; b < nb; b++) *total += part[b];
    }
}

double mt_sumsq(const void *x, mt_dtype dt, int64_t n) {
    double t = 0.0;
    sumsq_acc(x, dt, n, &t);
    return t;
}

double mt_sumsq_any(mt_backend *be, const void *x, mt_dtype dt, int64_t n) {
#ifdef MT_CUDA
    if (cuda_kernels_run_on(be)) {  // a one-tensor list for the device's blocked sum
        mt_tensor t = {.dtype = dt, .ndim = 1, .shape = {n}, .nbytes = mt_dtype_bytes(dt, (size_t)n),
                       .data = (void *)x, .be = be, .cat = MT_MEM_GRAD};
        mt_param p = {.name = "sumsq", .w = &t, .g = &t};
        double *dev = mt_work_alloc(be, sizeof(double)), s = 0.0;
        be->ops->fill_zero(be, dev, sizeof(double));
        grad_sumsq_cuda(be, dev, &p, 1);
        be->ops->download(be, &s, dev, sizeof(double));
        mt_work_free(be, dev, sizeof(double));
        return s;
    }
#endif
    (void)be;
    return mt_sumsq(x, dt, n);
}

void mt_sumsq_pieces(mt_backend *be, const void *const *x, mt_dtype dt, const int64_t *n, int count, double *sums) {
#ifdef MT_CUDA
    if (cuda_kernels_run_on(be) && count > 0) {  // one device double per piece, one download
        size_t bytes = (size_t)count * sizeof(double);
        double *dev = mt_work_alloc(be, bytes);
        be->ops->fill_zero(be, dev, bytes);
        for (int i = 0; i < count; i++) {
            mt_tensor t = {.dtype = dt, .ndim = 1, .shape = {n[i]}, .nbytes = mt_dtype_bytes(dt, (size_t)n[i]),
                           .data = (void *)x[i], .be = be, .cat = MT_MEM_GRAD};
            mt_param p = {.name = "sumsq", .w = &t, .g = &t};
            grad_sumsq_cuda(be, dev + i, &p, 1);
        }
        be->ops->download(be, sums, dev, bytes);
        mt_work_free(be, dev, bytes);
        return;
    }
#endif
    for (int i = 0; i < count; i++) sums[i] = mt_sumsq_any(be, x[i], dt, n[i]);
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
        double t = 0.0;
        sumsq_acc(g->data, g->dtype, mt_tensor_numel(g), &t);
        total += t;
    }
    return sqrt(total);
}

_Static_assert(MT_ADAM_OFFLOAD_CHUNK % (NORM_BLOCK * NORM_GROUP) == 0 &&
                   MT_ADAM_OFFLOAD_CHUNK % MT_ADAM8_BLOCK == 0,
               "offload chunks hold whole norm groups and whole 8-bit blocks");

// The same norm, the grads read through their backend's download in chunks (offload): any
// backend, and on the cpu one the same bits as mt_grad_norm.
static double grad_norm_streamed(const mt_param *params, int n, void *buf) {
    double total = 0.0;
    for (int i = 0; i < n; i++) {
        const mt_tensor *g = params[i].g;
        if (!g || !g->data || g->be->ops->kind == MT_BACKEND_NULL) continue;
        int64_t numel = mt_tensor_numel(g);
        size_t esz = mt_dtype_bytes(g->dtype, 1);
        double t = 0.0;
        for (int64_t off = 0; off < numel; off += MT_ADAM_OFFLOAD_CHUNK) {
            int64_t len = MT_MIN((int64_t)MT_ADAM_OFFLOAD_CHUNK, numel - off);
            g->be->ops->download(g->be, buf, (const char *)g->data + (size_t)off * esz,
                                 (size_t)len * esz);
            sumsq_acc(buf, g->dtype, len, &t);
        }
        total += t;
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

// One element: g already scaled, w the fp32 weight before decay; updates *m, *v, returns new w.
static inline float adamw_elem(float gi, float w, float *m, float *v, const adamw_k *k) {
    float wi = w * k->decay_mul;
    float mi = k->beta1 * *m + k->one_minus_beta1 * gi;
    float vi = k->beta2 * *v + k->one_minus_beta2 * gi * gi;
    float denom = sqrtf(vi) / k->bc2_sqrt + k->eps;
    *m = mi;
    *v = vi;
    return wi - k->step_size * (mi / denom);
}

// w, g, m, v [n] f32, host memory.
MT_HOT static void adamw_update_f32_cpu(float *restrict w, const float *restrict g, float *restrict m,
                                        float *restrict v, int64_t n, const adamw_k *kp) {
    const adamw_k kk = *kp, *k = &kk;  // a local copy: stores to w cannot alias it
#pragma omp simd
    for (int64_t i = 0; i < n; i++) w[i] = adamw_elem(g[i] * k->scale, w[i], &m[i], &v[i], k);
}

// w, g [n] bf16; master, m, v [n] f32, host memory. The master is updated, w = bf16(master).
static void adamw_update_bf16_cpu(uint16_t *w, float *master, const uint16_t *g, float *m,
                                  float *v, int64_t n, const adamw_k *kp) {
    const adamw_k kk = *kp, *k = &kk;
    for (int64_t i = 0; i < n; i++) {
        master[i] = adamw_elem(mt_bf16_to_f32(g[i]) * k->scale, master[i], &m[i], &v[i], k);
        w[i] = mt_f32_to_bf16(master[i]);
    }
}

// w, g [n] bf16, m, v [n] f32, host memory, no master: w = bf16(update of f32(w)), to nearest.
static void adamw_update_bf16_direct_cpu(uint16_t *w, const uint16_t *g, float *m, float *v,
                                         int64_t n, const adamw_k *kp) {
    const adamw_k kk = *kp, *k = &kk;
    for (int64_t i = 0; i < n; i++)
        w[i] = mt_f32_to_bf16(adamw_elem(mt_bf16_to_f32(g[i]) * k->scale, mt_bf16_to_f32(w[i]),
                                         &m[i], &v[i], k));
}

// Elements [off, off + len) of param i, off a multiple of MT_ADAM8_BLOCK: w and g (host memory,
// the weight's dtype) point at element off; the state is the optimizer's own (host memory).
// Blocks of MT_ADAM8_BLOCK in parallel, each independent: the bits do not depend on threads.
static void update_span(const mt_adamw *o, int i, mt_dtype dt, void *w, const void *g,
                        int64_t off, int64_t len, const adamw_k *k) {
    const int q8 = mt_adamw_is_8bit(o, i);
    const int64_t B = MT_ADAM8_BLOCK, nb = adam8_blocks(len);
    const size_t esz = mt_dtype_bytes(dt, 1);
    float *master = o->master[i] ? (float *)o->master[i]->data + off : NULL;
#pragma omp parallel for schedule(static) if (len >= 32768)
    for (int64_t b = 0; b < nb; b++) {
        int64_t s = b * B, l = MT_MIN(B, len - s), e = off + s;  // e: index in the param
        float mb[MT_ADAM8_BLOCK], vb[MT_ADAM8_BLOCK], *m = mb, *v = vb;
        uint8_t *mq = NULL, *vq = NULL;
        float *ma = NULL, *va = NULL;
        if (q8) {
            mq = (uint8_t *)o->m[i]->data + e, vq = (uint8_t *)o->v[i]->data + e;
            ma = (float *)o->m_absmax[i]->data + e / B, va = (float *)o->v_absmax[i]->data + e / B;
            mt_adam8_dequantize(1, mq, ma, l, mb);
            mt_adam8_dequantize(0, vq, va, l, vb);
        } else {
            m = (float *)o->m[i]->data + e, v = (float *)o->v[i]->data + e;
        }
        void *wb = (char *)w + (size_t)s * esz;
        const void *gb = (const char *)g + (size_t)s * esz;
        if (dt == MT_F32) adamw_update_f32_cpu(wb, gb, m, v, l, k);
        else if (master) adamw_update_bf16_cpu(wb, master + s, gb, m, v, l, k);
        else adamw_update_bf16_direct_cpu(wb, gb, m, v, l, k);
        if (q8) {
            mt_adam8_quantize(1, mb, l, mq, ma);
            mt_adam8_quantize(0, vb, l, vq, va);
        }
    }
}

// Offload: each param in chunks, grads down, weights down (unless a master holds them), the
// update on the host, weights up.
static void step_offloaded(const mt_adamw *o, const mt_param *params, int n, adamw_k k,
                           float decay_mul, char *gbuf, char *wbuf) {
    for (int i = 0; i < n; i++) {
        const mt_param *q = &params[i];
        if (!q->w->data || !o->m[i]->data) continue;  // null backend
        mt_backend *wbe = q->w->be, *gbe = q->g->be;
        mt_dtype dt = q->w->dtype;
        size_t esz = mt_dtype_bytes(dt, 1);
        int64_t numel = mt_tensor_numel(q->w);
        k.decay_mul = q->decay ? decay_mul : 1.0f;
        for (int64_t off = 0; off < numel; off += MT_ADAM_OFFLOAD_CHUNK) {
            int64_t len = MT_MIN((int64_t)MT_ADAM_OFFLOAD_CHUNK, numel - off);
            size_t at = (size_t)off * esz, bytes = (size_t)len * esz;
            gbe->ops->download(gbe, gbuf, (const char *)q->g->data + at, bytes);
            if (!o->master[i]) wbe->ops->download(wbe, wbuf, (const char *)q->w->data + at, bytes);
            update_span(o, i, dt, wbuf, gbuf, off, len, &k);
            wbe->ops->upload(wbe, (char *)q->w->data + at, wbuf, bytes);
        }
    }
}

// given_norm: the caller's norm (a distributed run's), or NULL to compute it here.
static int adamw_step(mt_adamw *o, const mt_param *params, int n, double lr, double clip,
                      const double *given_norm, double *grad_norm_out) {
    if (grad_norm_out) *grad_norm_out = 0.0;
    if (check_match(o, params, n, "step") != 0) return -1;
    if (!(lr >= 0 && isfinite(lr))) {
        mt_error_set("adamw step: learning rate %g is negative or not finite", lr);
        return -1;
    }
    int on_cuda = 0;  // every tensor on a cuda backend: the update runs there (optim_cuda.cu)
#ifdef MT_CUDA
    on_cuda = n > 0 && !o->opts.offload && !o->opts.adam_8bit && cuda_kernels_run_on(o->be);
    for (int i = 0; i < n && on_cuda; i++)
        on_cuda = cuda_kernels_run_on(params[i].w->be) && cuda_kernels_run_on(params[i].g->be);
    if (on_cuda) {
        // MT_PROFILE: the norm and the update as one row, step_model's: per parameter ~15 FLOPs
        // and 32 bytes (bf16 w and g, fp32 m, v and master read and written, g zeroed).
        char phase = mt_prof_set_phase(MT_PROF_OPT);
        mt_prof_push("AdamW");
        if (mt_prof_active) {
            double P = 0;
            for (int i = 0; i < n; i++) P += (double)mt_tensor_numel(params[i].w);
            mt_prof_count(15.0 * P, 32.0 * P);
        }
        double norm = given_norm ? *given_norm : mt_grad_norm_cuda(o->be, params, n);
        if (grad_norm_out) *grad_norm_out = norm;
        int rc = 1;
        if (isfinite(norm)) {
            mt_adamw_scalars k = mt_adamw_scalars_make(&o->opts, o->step + 1, lr, clip, norm);
            rc = adamw_update_cuda(o->be, o, params, n, &k) != 0 ? -1 : 0;
            if (rc == 0) o->step++;
        }
        mt_prof_pop();
        mt_prof_set_phase(phase);
        return rc;
    }
#endif
    for (int i = 0; i < n && !o->opts.offload && !on_cuda; i++) {
        mt_backend_kind kw = params[i].w->be->ops->kind, ko = o->m[i]->be->ops->kind;
        if (kw == MT_BACKEND_NULL || ko == MT_BACKEND_NULL) continue;
        if (kw != MT_BACKEND_CPU || ko != MT_BACKEND_CPU ||
            params[i].g->be->ops->kind != MT_BACKEND_CPU) {
            char nb[32];
            mt_error_set("adamw step: param '%s': the update runs on the cpu backend, or on cuda with fp32 state "
                         "(8-bit state on cuda: --offload-optimizer runs it on the host)",
                         pname(&params[i], i, nb, sizeof nb));
            return -1;
        }
    }
    // Offload: two chunk buffers in host memory, counted as the host's work while they live.
    int staged = o->opts.offload && o->host->ops->kind == MT_BACKEND_CPU;
    size_t chunk_bytes = (size_t)MT_ADAM_OFFLOAD_CHUNK * sizeof(float);
    char *gbuf = staged ? mt_work_alloc(o->host, chunk_bytes) : NULL;
    char *wbuf = staged ? mt_work_alloc(o->host, chunk_bytes) : NULL;
    double norm = given_norm ? *given_norm : staged ? grad_norm_streamed(params, n, gbuf) : mt_grad_norm(params, n);
    if (grad_norm_out) *grad_norm_out = norm;
    int rc = 0;
    if (!isfinite(norm)) {
        rc = 1;
        goto done;
    }

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
    if (staged) {
        step_offloaded(o, params, n, k, decay_mul, gbuf, wbuf);
    } else {
        for (int i = 0; i < n; i++) {
            const mt_param *q = &params[i];
            if (!q->w->data || !o->m[i]->data) continue;  // null backend
            k.decay_mul = q->decay ? decay_mul : 1.0f;
            update_span(o, i, q->w->dtype, q->w->data, q->g->data, 0, mt_tensor_numel(q->w), &k);
        }
    }
    o->step = t;
done:
    if (staged) mt_work_free(o->host, wbuf, chunk_bytes), mt_work_free(o->host, gbuf, chunk_bytes);
    return rc;
}

int mt_adamw_step(mt_adamw *o, const mt_param *params, int n, double lr, double clip,
                  double *grad_norm_out) {
    return adamw_step(o, params, n, lr, clip, NULL, grad_norm_out);
}

int mt_adamw_step_norm(mt_adamw *o, const mt_param *params, int n, double lr, double clip,
                       double grad_norm) {
    return adamw_step(o, params, n, lr, clip, &grad_norm, NULL);
}

// ---------------------------------------------------------------------------------------------
// State file
// ---------------------------------------------------------------------------------------------

#define N_STATE 5
static const char *const state_suffix[N_STATE] = {".exp_avg", ".exp_avg_sq", ".exp_avg.absmax",
                                                  ".exp_avg_sq.absmax", ".master"};

// Param i's state tensor `which` (in state_suffix's order), or NULL when it has none.
static mt_tensor *state_tensor(const mt_adamw *o, int i, int which) {
    mt_tensor *const t[N_STATE] = {o->m[i], o->v[i], o->m_absmax[i], o->v_absmax[i], o->master[i]};
    return t[which];
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
    size_t cap = (size_t)(n ? n : 1) * N_STATE;
    mt_st_entry *e = mt_xcalloc(cap, sizeof *e);
    mt_tensor **src = mt_xcalloc(cap, sizeof *src);
    size_t k = 0;
    for (int i = 0; i < n; i++)
        for (int which = 0; which < N_STATE; which++) {
            mt_tensor *t = state_tensor(o, i, which);
            if (!t) continue;
            e[k].name = state_name(&params[i], i, which);
            e[k].dtype = mt_st_dtype_of(t->dtype);  // F32, or U8 for 8-bit codes
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
    size_t cap = (size_t)(n ? n : 1) * N_STATE, k = 0;
    const mt_st_tensor **found = mt_xcalloc(cap, sizeof *found);
    mt_tensor **dst = mt_xcalloc(cap, sizeof *dst);
    char **names = mt_xcalloc(cap, sizeof *names);
    int rc = 0;
    for (int i = 0; i < n && rc == 0; i++)
        for (int which = 0; which < N_STATE && rc == 0; which++) {
            mt_tensor *t = state_tensor(o, i, which);
            if (!t) continue;
            char *name = state_name(&params[i], i, which);
            names[k] = name;
            const mt_st_tensor *s = mt_st_file_find(&f, name);
            const char *dt = mt_st_dtype_of(t->dtype);
            const char *hint = mt_adamw_is_8bit(o, i) ? " (this run keeps 8-bit Adam state: was "
                                                        "the file saved without --adam-8bit?)"
                                                      : " (was the file saved with --adam-8bit?)";
            char want[96], got[96];
            shape_str(want, sizeof want, t->ndim, t->shape);
            if (!s) {
                mt_error_set("%s: tensor '%s' is missing (expected %s %s)%s", path, name, dt, want,
                             which == 2 || which == 3 ? hint : "");
                rc = -1;
            } else if (strcmp(s->dtype, dt) != 0) {
                mt_error_set("%s: tensor '%s': dtype %s, expected %s%s", path, name, s->dtype, dt,
                             which < 2 ? hint : "");
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
                const char *nm = f.tensors[j].name;
                size_t ln = strlen(nm);
                int master = ln >= 7 && strcmp(nm + ln - 7, ".master") == 0;
                mt_error_set("%s: tensor '%s' belongs to no trainable parameter of this run%s", path,
                             nm, master && !o->opts.master_weights
                                     ? " (this run keeps no master weights: --no-master-weights)"
                                     : "");
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
