// model/linear.c — frozen or trainable Linear with an optional LoRA, CPU reference.
#include "model/linear.h"

#include <stdlib.h>

#include "core/common.h"
#include "core/profile.h"
#include "core/gemm.h"
#include "model/ops_cuda.h"
#include "quant/qweight.h"

// The null backend: a Linear makes the cpu path's allocations (4-bit tiles, LoRA scratch) and
// computes nothing; every input gradient counts as wanted, since no buffer there has data.
static int counting(const mt_linear *l) {
    const mt_backend *be = l->w ? l->w->be : l->q ? l->q->be : NULL;
    return be && be->ops->kind == MT_BACKEND_NULL;
}

void mt_linear_forward_cpu(const mt_linear *l, float *y, const float *x, float *lora_xa, int64_t n) {
    if (n == 0) return;
    if (l->q) mt_qweight_matmul_cpu(y, x, l->q, n, 0);
    else if (!counting(l))
        mt_sgemm(0, 1, (int)n, (int)l->out, (int)l->in, 1.0f, x, (int)l->in, l->w->data, (int)l->in, 0.0f, y,
                 (int)l->out);
    if (l->lora) mt_lora_forward_cpu(l->lora, y, x, lora_xa, n);
}

void mt_linear_backward_cpu(const mt_linear *l, float *dx, const float *dy, const float *x,
                            const float *lora_xa, int64_t n) {
    if (n == 0) return;
    int run = !counting(l);
    if (l->dw && run)  // dW [out, in] += dyᵀ · x
        mt_sgemm(1, 0, (int)l->out, (int)l->in, (int)n, 1.0f, dy, (int)l->out, x, (int)l->in, 1.0f, l->dw->data,
                 (int)l->in);
    if (dx || !run) {  // dx [n, in] += dy · W
        if (l->q) mt_qweight_matmul_t_cpu(dx, dy, l->q, n);
        else if (run)
            mt_sgemm(0, 0, (int)n, (int)l->in, (int)l->out, 1.0f, dy, (int)l->out, l->w->data, (int)l->in, 1.0f, dx,
                     (int)l->in);
    }
    if (l->lora) {
        mt_backend *be = l->lora->a->be;
        size_t bytes = (size_t)n * (size_t)l->lora->r * sizeof(float);
        float *scratch = mt_work_alloc(be, bytes);
        mt_lora_backward_cpu(l->lora, dx, dy, x, lora_xa, scratch, n);
        mt_work_free(be, scratch, bytes);
    }
}

// ---------------------------------------------------------------------------------------------
// Any backend: the CPU kernels above, or the GPU step on views.


static mt_backend *backend_of(const mt_linear *l) {
    return l->w ? l->w->be : l->q ? l->q->be : l->lora ? l->lora->a->be : NULL;
}

static void check(int rc, const char *what) {
    if (rc != 0) mt_fatal(MT_EXIT_ERROR, "linear %s: %s", what, mt_error_get());
}

// dst = bf16(src), rows of an f32 view (cuda; the null backend has nothing to convert).
static void to_bf16(mt_backend *be, mt_tensor *dst, const mt_tensor *src) {
#ifdef MT_CUDA
    int64_t ld = mt_tensor_ld(src), cols = src->shape[1];
    if (ld == cols) {
        mt_f32_to_bf16_cuda(be, dst->data, src->data, src->shape[0] * cols);
    } else {
        for (int64_t r = 0; r < src->shape[0]; r++)
            mt_f32_to_bf16_cuda(be, (mt_bf16 *)dst->data + r * cols, (const float *)src->data + r * ld, cols);
    }
#else
    (void)be, (void)dst, (void)src;
#endif
}

// The cpu kernels take contiguous f32 rows.
static float *cpu_rows(const mt_tensor *t) {
    if (!t) return NULL;
    if (t->dtype != MT_F32 || mt_tensor_ld(t) != t->shape[1])
        mt_fatal(MT_EXIT_ERROR, "linear: the cpu path takes contiguous f32 rows (got %s, ld %lld)",
                 mt_dtype_name(t->dtype), (long long)t->ld);
    return t->data;
}

mt_tensor mt_linear_weight(const mt_linear *l, mt_tensor *scratch) {
    if (l->wcache) return mt_view2(l->wcache->be, l->wcache->data, MT_BF16, l->out, l->in, 0);
    if (!l->q) return mt_view2(l->w->be, l->w->data, l->w->dtype, l->out, l->in, 0);
    mt_tensor w;
    // The profile's row is step_model's: the 4-bit Linears outside the experts are attention's
    // by default (MT_QTARGET_DEFAULT); --quant-targets all adds the router's here.
    mt_prof_push("dequant NF4->bf16 q,k,v,o");
    mt_prof_count((double)l->out * (double)l->in, (double)mt_qweight_dequant_bytes(l->q, scratch->dtype));
    check(mt_qweight_dequantize_view(l->q, scratch, &w), "4-bit dequantize");
    mt_prof_pop();
    return w;
}

// A 4-bit W's bf16 scratch: none when a copy is kept, the model's shared one, or (none attached)
// one for this call.
static mt_tensor dequant_scratch(const mt_linear *l, void **own) {
    *own = NULL;
    if (l->wcache) return (mt_tensor){0};
    if (l->dequant) return *l->dequant;
    size_t bytes = mt_dtype_bytes(MT_BF16, (size_t)(l->out * l->in));
    *own = mt_work_alloc(l->q->be, bytes);
    return mt_view2(l->q->be, *own, MT_BF16, l->out, l->in, 0);
}

static void dequant_release(const mt_linear *l, void *own) {
    if (l->q && !l->dequant && !l->wcache) mt_work_free(l->q->be, own, mt_dtype_bytes(MT_BF16, (size_t)(l->out * l->in)));
}

void mt_linear_forward_w(const mt_linear *l, const mt_tensor *w, const mt_tensor *y, const mt_tensor *x,
                         const mt_tensor *xa, const mt_lora_scratch *sc) {
    if (x->shape[0] == 0) return;
    mt_tensor yv = *y, xv = *x, wv = *w;
    check(mt_matmul(&yv, &xv, &wv, 0, 1, 1.0f, 0.0f), "forward");  // y = x · Wᵀ
    if (l->lora) {
        mt_prof_push_alt();  // the adapter's row of the caller's region
        mt_lora_forward_dev(l->lora, y, x, xa, sc);
        mt_prof_pop();
    }
}

void mt_linear_forward(const mt_linear *l, const mt_tensor *y, const mt_tensor *x, const mt_tensor *xa,
                       const mt_lora_scratch *sc) {
    mt_backend *be = backend_of(l);
    int64_t n = x->shape[0];
    if (be->ops->kind == MT_BACKEND_CPU) {
        mt_linear_forward_cpu(l, cpu_rows(y), cpu_rows(x), cpu_rows(xa), n);
        return;
    }
    if (n == 0) return;
    void *own = NULL;
    mt_tensor scratch = l->q ? dequant_scratch(l, &own) : (mt_tensor){0};
    mt_tensor w = mt_linear_weight(l, &scratch);
    mt_linear_forward_w(l, &w, y, x, xa, sc);
    dequant_release(l, own);
}

// Rows of an f32 dy rounded to bf16 per chunk, so that no bf16 copy of a whole T×V gradient
// exists: at most this many bytes.
enum { DY_CHUNK_BYTES = 64 << 20 };

static void backward_rows(const mt_linear *l, const mt_tensor *dx, const mt_tensor *dy, const mt_tensor *x,
                          const mt_tensor *xa, const mt_tensor *w, const mt_lora_scratch *sc) {
    mt_tensor dyv = *dy, xv = *x;
    if (l->dw) {  // dW += dyᵀ · x
        mt_tensor dwv = mt_view2(l->dw->be, l->dw->data, l->dw->dtype, l->out, l->in, 0);
        check(mt_matmul(&dwv, &dyv, &xv, 1, 0, 1.0f, 1.0f), "weight gradient");
    }
    if (dx) {  // dx += dy · W: the transpose flag, never a transposed copy
        mt_tensor dxv = *dx, wv = *w;
        check(mt_matmul(&dxv, &dyv, &wv, 0, 0, 1.0f, 1.0f), "input gradient");
    }
    if (l->lora) {
        mt_prof_push_alt();
        mt_lora_backward_dev(l->lora, dx, dy, x, xa, sc);
        mt_prof_pop();
    }
}

void mt_linear_backward_w(const mt_linear *l, const mt_tensor *w, const mt_tensor *dx, const mt_tensor *dy,
                          const mt_tensor *x, const mt_tensor *xa, const mt_lora_scratch *sc) {
    int64_t n = x->shape[0];
    if (n == 0) return;
    if (dy->dtype == MT_BF16) {
        backward_rows(l, dx, dy, x, xa, w, sc);
        return;
    }
    // f32 (the logits' gradients): bf16 rows a chunk at a time
    mt_backend *be = backend_of(l);
    int64_t chunk = MT_MIN(n, MT_MAX((int64_t)1, (int64_t)(DY_CHUNK_BYTES / (l->out * 2))));
    size_t bytes = mt_dtype_bytes(MT_BF16, (size_t)(chunk * l->out));
    mt_tensor conv = mt_view2(be, mt_work_alloc(be, bytes), MT_BF16, chunk, l->out, 0);
    for (int64_t r0 = 0; r0 < n; r0 += chunk) {
        int64_t rows = MT_MIN(chunk, n - r0);
        mt_tensor c = mt_view_rows(&conv, 0, rows), dyr = mt_view_rows(dy, r0, rows);
        if (conv.data) to_bf16(be, &c, &dyr);
        mt_tensor xr = mt_view_rows(x, r0, rows);
        mt_tensor dxr = dx ? mt_view_rows(dx, r0, rows) : (mt_tensor){0};
        mt_tensor xar = xa ? mt_view_rows(xa, r0, rows) : (mt_tensor){0};
        backward_rows(l, dx ? &dxr : NULL, &c, &xr, xa ? &xar : NULL, w, sc);
    }
    mt_work_free(be, conv.data, bytes);
}

void mt_linear_backward(const mt_linear *l, const mt_tensor *dx, const mt_tensor *dy, const mt_tensor *x,
                        const mt_tensor *xa, const mt_lora_scratch *sc) {
    mt_backend *be = backend_of(l);
    int64_t n = x->shape[0];
    if (be->ops->kind == MT_BACKEND_CPU) {
        mt_linear_backward_cpu(l, cpu_rows(dx), cpu_rows(dy), cpu_rows(x), cpu_rows(xa), n);
        return;
    }
    if (n == 0) return;
    void *own = NULL;
    mt_tensor scratch = l->q && dx ? dequant_scratch(l, &own) : (mt_tensor){0};
    mt_tensor w = dx ? mt_linear_weight(l, &scratch) : (mt_tensor){0};
    mt_linear_backward_w(l, &w, dx, dy, x, xa, sc);
    if (dx) dequant_release(l, own);
}

void mt_linear_free(mt_linear *l) {
    mt_tensor_free(l->w);
    mt_tensor_free(l->dw);
    mt_tensor_free(l->wcache);
    if (l->q) {
        mt_qweight_free(l->q);
        free(l->q);
    }
    if (l->lora) {
        mt_lora_free(l->lora);
        free(l->lora);
    }
    l->w = l->dw = l->wcache = NULL;
    l->q = NULL;
    l->lora = NULL;
}
