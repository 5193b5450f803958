// lora/lora.c — LoRA adapter: init, forward, backward (CPU reference), with regenerated dropout.
#include "lora/lora.h"

#include <math.h>
#include <string.h>

#include "core/common.h"
#include "core/gemm.h"
#include "core/rng.h"
#include "lora/lora_dropout.h"

// The adapter's description, no memory yet; -1 for a dtype the backend does not compute in.
static int describe(mt_lora *l, mt_backend *be, mt_dtype dtype, int64_t in, int64_t out, int r, double alpha,
                    int rslora, double dropout, uint64_t stream) {
    memset(l, 0, sizeof *l);
    if (be->ops->kind == MT_BACKEND_CPU && dtype != MT_F32) {
        mt_error_set("lora: the cpu backend computes in f32, not %s", mt_dtype_name(dtype));
        return -1;
    }
    l->in = in, l->out = out, l->r = r;
    l->stream = stream;
    l->scale = (float)(rslora ? alpha / sqrt((double)r) : alpha / r);
    l->dropout = (float)dropout;
    return 0;
}

// A drawn on the host (the same numbers on every backend), in the tensors' dtype; B and the
// gradients zero. The null backend's tensors have no data: nothing to fill.
static void fill(mt_lora *l, mt_backend *be, mt_dtype dtype, uint64_t seed) {
    if (be->ops->kind == MT_BACKEND_NULL) return;
    const int64_t r = l->r, in = l->in;
    mt_rng rng;
    mt_rng_seed(&rng, seed, l->stream);
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
}

int mt_lora_init(mt_lora *l, mt_backend *be, mt_dtype dtype, int64_t in, int64_t out, int r,
                 double alpha, int rslora, double dropout, uint64_t seed, uint64_t stream) {
    if (describe(l, be, dtype, in, out, r, alpha, rslora, dropout, stream) != 0) return -1;
    int64_t sa[2] = {r, in}, sb[2] = {out, r};
    if (!(l->a = mt_tensor_new(be, MT_MEM_TRAIN, dtype, 2, sa)) ||
        !(l->b = mt_tensor_new(be, MT_MEM_TRAIN, dtype, 2, sb)) ||
        !(l->da = mt_tensor_new(be, MT_MEM_GRAD, dtype, 2, sa)) ||
        !(l->db = mt_tensor_new(be, MT_MEM_GRAD, dtype, 2, sb))) {
        mt_lora_free(l);
        return -1;
    }
    fill(l, be, dtype, seed);
    return 0;
}

// Rows [row0, row0 + rows) of a 2-D block as a tensor of its own that owns nothing (mt_lora's
// a_view: freed as a struct).
static mt_tensor *rows_of(const mt_tensor *block, int64_t row0, int64_t rows) {
    mt_tensor *v = mt_xmalloc(sizeof *v);
    *v = *block;
    v->shape[0] = rows;
    v->nbytes = mt_dtype_bytes(block->dtype, (size_t)(rows * block->shape[1]));
    v->data = block->data ? (char *)block->data + mt_dtype_bytes(block->dtype, (size_t)(row0 * block->shape[1])) : NULL;
    return v;
}

int mt_lora_init_pair(mt_lora *l1, mt_lora *l3, mt_backend *be, mt_dtype dtype, int64_t in, int64_t out, int r,
                      double alpha, int rslora, double dropout, uint64_t seed, uint64_t stream1, uint64_t stream3) {
    if (describe(l1, be, dtype, in, out, r, alpha, rslora, dropout, stream1) != 0 ||
        describe(l3, be, dtype, in, out, r, alpha, rslora, dropout, stream3) != 0)
        return -1;
    int64_t s2a[2] = {2 * (int64_t)r, in}, sb[2] = {out, r};
    if (!(l1->a_block = mt_tensor_new(be, MT_MEM_TRAIN, dtype, 2, s2a)) ||
        !(l1->b = mt_tensor_new(be, MT_MEM_TRAIN, dtype, 2, sb)) || !(l3->b = mt_tensor_new(be, MT_MEM_TRAIN, dtype, 2, sb)) ||
        !(l1->da_block = mt_tensor_new(be, MT_MEM_GRAD, dtype, 2, s2a)) ||
        !(l1->db = mt_tensor_new(be, MT_MEM_GRAD, dtype, 2, sb)) || !(l3->db = mt_tensor_new(be, MT_MEM_GRAD, dtype, 2, sb))) {
        mt_lora_free(l3), mt_lora_free(l1);
        return -1;
    }
    l1->a = rows_of(l1->a_block, 0, r), l3->a = rows_of(l1->a_block, r, r);
    l1->da = rows_of(l1->da_block, 0, r), l3->da = rows_of(l1->da_block, r, r);
    l1->a_view = l3->a_view = 1;
    fill(l1, be, dtype, seed), fill(l3, be, dtype, seed);
    return 0;
}

int mt_lora_pair_adjacent(const mt_lora *l1, const mt_lora *l3) {
    if (!l1 || !l3 || !l1->a_block || !l3->a_view || l3->a_block || l1->r != l3->r || l1->in != l3->in) return 0;
    if (!l1->a_block->data) return 1;  // the null backend's: no memory to look at, made as a pair
    const size_t rows = mt_dtype_bytes(l1->a->dtype, (size_t)(l1->r * l1->in));
    return (char *)l3->a->data == (char *)l1->a->data + rows && (char *)l3->da->data == (char *)l1->da->data + rows;
}

void mt_lora_free(mt_lora *l) {
    if (l->a_view) free(l->a), free(l->da);
    else mt_tensor_free(l->a), mt_tensor_free(l->da);
    mt_tensor_free(l->b), mt_tensor_free(l->db), mt_tensor_free(l->a_block), mt_tensor_free(l->da_block);
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
