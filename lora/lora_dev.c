// lora/lora_dev.c — the LoRA of the GPU step on views: four small GEMMs through the backend's
// matmul (cuBLASLt on cuda), dropout regenerated on the device. On the null backend every
// allocation is made and counted and nothing runs, so `plan --measure` counts what cuda holds.
#include <stddef.h>

#include "core/common.h"
#include "lora/lora.h"
#include "lora/lora_cuda.h"

// c = alpha · op(a) · op(b) + beta · c; a refusal here is a programming error.
static void gemm(mt_tensor c, mt_tensor a, mt_tensor b, int ta, int tb, float alpha, float beta) {
    if (mt_matmul(&c, &a, &b, ta, tb, alpha, beta) != 0) mt_fatal(MT_EXIT_ERROR, "lora: matmul: %s", mt_error_get());
}

// out [rows, in] = dropout(x) (accumulate 0) or out += dropout(x) (1), x and out contiguous.
static void dropout(const mt_lora *l, void *out, const void *x, int64_t rows, int accumulate) {
    mt_backend *be = l->a->be;
    if (be->ops->kind != MT_BACKEND_CUDA) return;  // null: nothing runs
#ifdef MT_CUDA
    mt_lora_dropout_cuda(be, out, l->in, x, l->in, rows, l->in, l->dropout_seed, l->dropout, accumulate);
#else
    (void)out, (void)x, (void)rows, (void)accumulate;
#endif
}

static mt_tensor weight(const mt_tensor *t) { return mt_view2(t->be, t->data, t->dtype, t->shape[0], t->shape[1], 0); }

static void check(const mt_lora *l, const mt_tensor *x) {
    if (x->dtype != l->a->dtype || mt_tensor_ld(x) != x->shape[1] || x->shape[1] != l->in)
        mt_fatal(MT_EXIT_ERROR, "lora: input is %s [%lld, %lld] (ld %lld); the adapter wants contiguous %s rows of %lld",
                 mt_dtype_name(x->dtype), (long long)x->shape[0], (long long)x->shape[1], (long long)x->ld,
                 mt_dtype_name(l->a->dtype), (long long)l->in);
}

size_t mt_lora_dev_scratch_bytes(const mt_lora *l, int64_t n) {
    return mt_dtype_bytes(l->a->dtype, (size_t)(n * l->r)) +
           (l->dropout > 0.0f ? mt_dtype_bytes(l->a->dtype, (size_t)(n * l->in)) : 0);
}

// `bytes` of scratch: the caller's (at least that much), or the ledger's for this call.
static void *take(const mt_lora *l, const mt_lora_scratch *sc, size_t *at, size_t bytes) {
    if (!sc) return mt_work_alloc(l->a->be, bytes);
    if (*at + bytes > sc->bytes) mt_fatal(MT_EXIT_ERROR, "lora: scratch of %zu bytes, %zu wanted", sc->bytes, *at + bytes);
    void *p = sc->data ? (char *)sc->data + *at : NULL;
    *at += bytes;
    return p;
}
static void give(const mt_lora *l, const mt_lora_scratch *sc, void *p, size_t bytes) {
    if (!sc) mt_work_free(l->a->be, p, bytes);
}

void mt_lora_forward_dev(const mt_lora *l, const mt_tensor *y, const mt_tensor *x, const mt_tensor *xa,
                         const mt_lora_scratch *sc) {
    int64_t n = x->shape[0];
    if (n == 0) return;
    check(l, x);
    mt_backend *be = l->a->be;
    size_t xbytes = mt_dtype_bytes(x->dtype, (size_t)(n * l->in)), at = 0;
    void *xd = l->dropout > 0.0f ? take(l, sc, &at, xbytes) : NULL;
    if (l->dropout > 0.0f) dropout(l, xd, x->data, n, 0);
    mt_tensor xin = l->dropout > 0.0f ? mt_view2(be, xd, x->dtype, n, l->in, 0) : *x;
    gemm(*xa, xin, weight(l->a), 0, 1, 1.0f, 0.0f);         // xa = dropout(x) · Aᵀ
    gemm(*y, *xa, weight(l->b), 0, 1, l->scale, 1.0f);      // y += scale · xa · Bᵀ
    if (l->dropout > 0.0f) give(l, sc, xd, xbytes);
}

void mt_lora_backward_dev(const mt_lora *l, const mt_tensor *dx, const mt_tensor *dy, const mt_tensor *x,
                          const mt_tensor *xa, const mt_lora_scratch *sc) {
    int64_t n = x->shape[0], r = l->r;
    if (n == 0) return;
    check(l, x);
    mt_backend *be = l->a->be;
    gemm(weight(l->db), *dy, *xa, 1, 0, l->scale, 1.0f);  // dB += scale · dyᵀ · xa
    size_t dbytes = mt_dtype_bytes(l->a->dtype, (size_t)(n * r)), at = 0;
    mt_tensor dxa = mt_view2(be, take(l, sc, &at, dbytes), l->a->dtype, n, r, 0);
    gemm(dxa, *dy, weight(l->b), 0, 0, l->scale, 0.0f);    // dxa = scale · dy · B
    size_t xbytes = mt_dtype_bytes(x->dtype, (size_t)(n * l->in));
    int drop = l->dropout > 0.0f;
    mt_tensor buf = drop ? mt_view2(be, take(l, sc, &at, xbytes), x->dtype, n, l->in, 0) : *x;
    if (drop) dropout(l, buf.data, x->data, n, 0);
    gemm(weight(l->da), dxa, buf, 1, 0, 1.0f, 1.0f);        // dA += dxaᵀ · dropout(x)
    if (dx && !drop) gemm(*dx, dxa, weight(l->a), 0, 0, 1.0f, 1.0f);  // dx += dxa · A
    if (dx && drop) {  // the same stream: the dA GEMM has read buf before this one overwrites it
        gemm(buf, dxa, weight(l->a), 0, 0, 1.0f, 0.0f);
        dropout(l, dx->data, buf.data, n, 1);      // dx += dropout'(dxa · A)
    }
    if (drop) give(l, sc, buf.data, xbytes);
    give(l, sc, dxa.data, dbytes);
}
