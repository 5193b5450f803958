// lora/lora.c — LoRA adapter: init, forward, backward (CPU reference), with regenerated dropout.
#include "lora/lora.h"

#include <math.h>
#include <string.h>

#include "core/common.h"
#include "core/gemm.h"
#include "core/rng.h"
#include "lora/lora_dropout.h"

int mt_lora_init(mt_lora *l, mt_backend *be, mt_dtype dtype, int64_t in, int64_t out, int r,
                 double alpha, int rslora, double dropout, uint64_t seed, uint64_t stream) {
    memset(l, 0, sizeof *l);
    if (be->ops->kind == MT_BACKEND_CPU && dtype != MT_F32) {
        mt_error_set("lora: the cpu backend computes in f32, not %s", mt_dtype_name(dtype));
        return -1;
    }
    l->in = in, l->out = out, l->r = r;
    l->stream = stream;
    l->scale = (float)(rslora ? alpha / sqrt((double)r) : alpha / r);
    l->dropout = (float)dropout;
    int64_t sa[2] = {r, in}, sb[2] = {out, r};
    if (!(l->a = mt_tensor_new(be, MT_MEM_TRAIN, dtype, 2, sa)) ||
        !(l->b = mt_tensor_new(be, MT_MEM_TRAIN, dtype, 2, sb)) ||
        !(l->da = mt_tensor_new(be, MT_MEM_GRAD, dtype, 2, sa)) ||
        !(l->db = mt_tensor_new(be, MT_MEM_GRAD, dtype, 2, sb))) {
        mt_lora_free(l);
        return -1;
    }
    if (be->ops->kind == MT_BACKEND_NULL) return 0;  // counted, never read
    // A drawn on the host (the same numbers on every backend), in the tensors' dtype.
    mt_rng rng;
    mt_rng_seed(&rng, seed, stream);
    float bound = 1.0f / sqrtf((float)in), *a = mt_xmalloc((size_t)(r * in) * sizeof(float));
    for (int64_t i = 0; i < r * in; i++) a[i] = bound * (2.0f * mt_rng_uniform(&rng) - 1.0f);
    void *host = a;
    if (dtype != MT_F32) {
        host = mt_xmalloc(l->a->nbytes);
        mt_convert(host, dtype, a, MT_F32, (size_t)(r * in));
    }
    mt_tensor_upload(l->a, host);
    if (host != a) free(host);
    free(a);
    be->ops->fill_zero(be, l->b->data, l->b->nbytes);
    be->ops->fill_zero(be, l->da->data, l->da->nbytes);
    be->ops->fill_zero(be, l->db->data, l->db->nbytes);
    return 0;
}

void mt_lora_free(mt_lora *l) {
    mt_tensor_free(l->a), mt_tensor_free(l->b), mt_tensor_free(l->da), mt_tensor_free(l->db);
    memset(l, 0, sizeof *l);
}

// Inverted dropout factor of element i: 0 or 1/(1-p), a pure function of (seed, i).
static inline float dropout_factor(const mt_lora *l, uint64_t i) {
    return mt_lora_dropout_factor(l->dropout_seed, l->dropout, i);
}

// The null backend: the same scratch is reserved and released, nothing is computed.
static int counting(const mt_lora *l) { return l->a->be->ops->kind == MT_BACKEND_NULL; }

// dropout(x) in work scratch (n·in floats), or x itself when there is no dropout.
static const float *dropped(const mt_lora *l, const float *x, int64_t n, float **buf) {
    *buf = NULL;
    if (l->dropout <= 0.0f) return x;
    *buf = mt_work_alloc(l->a->be, (size_t)(n * l->in) * sizeof(float));
    for (int64_t i = 0; *buf && i < n * l->in; i++) (*buf)[i] = x[i] * dropout_factor(l, (uint64_t)i);
    return *buf;
}

// Releases what dropped() reserved (nothing without dropout).
static void release(const mt_lora *l, float *buf, int64_t n) {
    if (l->dropout > 0.0f) mt_work_free(l->a->be, buf, (size_t)(n * l->in) * sizeof(float));
}

void mt_lora_project_cpu(const mt_lora *l, float *xa, const float *x, int64_t n) {
    if (n == 0) return;
    float *buf;
    const float *xd = dropped(l, x, n, &buf);
    if (!counting(l))  // xa [n, r] = xd [n, in] · Aᵀ
        mt_sgemm(0, 1, (int)n, l->r, (int)l->in, 1.0f, xd, (int)l->in, l->a->data, (int)l->in, 0.0f, xa, l->r);
    release(l, buf, n);
}

void mt_lora_forward_cpu(const mt_lora *l, float *y, const float *x, float *xa, int64_t n) {
    if (n == 0) return;
    mt_lora_project_cpu(l, xa, x, n);
    if (counting(l)) return;
    // y [n, out] += scale · xa · Bᵀ
    mt_sgemm(0, 1, (int)n, (int)l->out, l->r, l->scale, xa, l->r, l->b->data, l->r, 1.0f, y, (int)l->out);
}

void mt_lora_backward_cpu(const mt_lora *l, float *dx, const float *dy, const float *x,
                          const float *xa, float *scratch, int64_t n) {
    if (n == 0) return;
    if (counting(l)) {  // the cpu path's scratch, reserved and released; dx taken as wanted
        float *buf;
        for (int i = 0; i < 2; i++) {  // dropout(x) for dA, then the dropout' buffer for dx
            dropped(l, x, n, &buf);
            release(l, buf, n);
        }
        return;
    }
    int r = l->r, in = (int)l->in, out = (int)l->out;
    // dB [out, r] += scale · dyᵀ · xa
    mt_sgemm(1, 0, out, r, (int)n, l->scale, dy, out, xa, r, 1.0f, l->db->data, r);
    // dxa [n, r] = scale · dy · B
    float *dxa = scratch;
    mt_sgemm(0, 0, (int)n, r, out, l->scale, dy, out, l->b->data, r, 0.0f, dxa, r);
    float *buf;
    const float *xd = dropped(l, x, n, &buf);
    // dA [r, in] += dxaᵀ · dropout(x)
    mt_sgemm(1, 0, r, in, (int)n, 1.0f, dxa, r, xd, in, 1.0f, l->da->data, in);
    release(l, buf, n);
    if (!dx) return;
    if (l->dropout <= 0.0f) {
        // dx [n, in] += dxa · A
        mt_sgemm(0, 0, (int)n, in, r, 1.0f, dxa, r, l->a->data, in, 1.0f, dx, in);
        return;
    }
    float *t = mt_work_alloc(l->a->be, (size_t)(n * in) * sizeof(float));
    mt_sgemm(0, 0, (int)n, in, r, 1.0f, dxa, r, l->a->data, in, 0.0f, t, in);
    for (int64_t i = 0; i < n * in; i++) dx[i] += t[i] * dropout_factor(l, (uint64_t)i);
    release(l, t, n);
}
