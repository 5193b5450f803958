// model/linear.c — frozen or trainable Linear with an optional LoRA, CPU reference.
#include "model/linear.h"

#include <cblas.h>
#include <stdlib.h>

#include "core/common.h"
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
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)n, (int)l->out, (int)l->in, 1.0f, x,
                    (int)l->in, l->w->data, (int)l->in, 0.0f, y, (int)l->out);
    if (l->lora) mt_lora_forward_cpu(l->lora, y, x, lora_xa, n);
}

void mt_linear_backward_cpu(const mt_linear *l, float *dx, const float *dy, const float *x,
                            const float *lora_xa, int64_t n) {
    if (n == 0) return;
    int run = !counting(l);
    if (l->dw && run)  // dW [out, in] += dyᵀ · x
        cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, (int)l->out, (int)l->in, (int)n, 1.0f, dy,
                    (int)l->out, x, (int)l->in, 1.0f, l->dw->data, (int)l->in);
    if (dx || !run) {  // dx [n, in] += dy · W
        if (l->q) mt_qweight_matmul_t_cpu(dx, dy, l->q, n);
        else if (run)
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (int)n, (int)l->in, (int)l->out, 1.0f,
                        dy, (int)l->out, l->w->data, (int)l->in, 1.0f, dx, (int)l->in);
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
// Any backend: the CPU kernels above, or the backend's matmul (cuBLASLt) on f32 views of the
// rows, a frozen 4-bit W dequantized into an f32 scratch for the call, and the LoRA's twin.

static mt_backend *backend_of(const mt_linear *l) {
    return l->w ? l->w->be : l->q ? l->q->be : l->lora ? l->lora->a->be : NULL;
}

#ifdef MT_CUDA
#include "model/ops_cuda.h"

static mt_tensor rows_view(mt_backend *be, const float *p, int64_t rows, int64_t cols) {
    mt_tensor t = {.dtype = MT_F32, .ndim = 2, .shape = {rows, cols}, .data = (void *)p, .be = be,
                   .cat = MT_MEM_WORK};
    t.nbytes = (size_t)(rows * cols) * sizeof(float);
    return t;
}

static void check(int rc, const char *what) {
    if (rc != 0) mt_fatal(MT_EXIT_ERROR, "linear %s: %s", what, mt_error_get());
}

// y = x·Wᵀ (+ beta·y), or (transposed) dx = dy·W + dx, W dense or dequantized into scratch.
static void dense_or_4bit(const mt_linear *l, mt_tensor *out, const mt_tensor *in, int transposed) {
    mt_backend *be = backend_of(l);
    if (!l->q) {
        check(mt_matmul(out, in, l->w, 0, !transposed, 1.0f, transposed ? 1.0f : 0.0f), "matmul");
        return;
    }
    size_t bytes = (size_t)(l->out * l->in) * sizeof(float);
    float *s = l->dequant ? NULL : mt_work_alloc(be, bytes);  // per call only without the model's
    mt_tensor scratch = l->dequant ? *l->dequant : rows_view(be, s, l->out, l->in);
    check(transposed ? mt_qweight_matmul_t(out, in, l->q, &scratch, 1.0f) : mt_qweight_matmul(out, in, l->q, &scratch, 0.0f),
          "4-bit matmul");
    if (s) mt_work_free(be, s, bytes);
}
#endif

void mt_linear_forward(const mt_linear *l, float *y, const float *x, float *lora_xa, int64_t n) {
    mt_backend *be = backend_of(l);
    if (!be || be->ops->kind != MT_BACKEND_CUDA) {
        mt_linear_forward_cpu(l, y, x, lora_xa, n);
        return;
    }
#ifdef MT_CUDA
    if (n == 0) return;
    mt_tensor yv = rows_view(be, y, n, l->out), xv = rows_view(be, x, n, l->in);
    dense_or_4bit(l, &yv, &xv, 0);
    if (l->lora) mt_lora_forward_cuda(be, l->lora, y, x, lora_xa, n);
#endif
}

void mt_linear_backward(const mt_linear *l, float *dx, const float *dy, const float *x, const float *lora_xa,
                        int64_t n) {
    mt_backend *be = backend_of(l);
    if (!be || be->ops->kind != MT_BACKEND_CUDA) {
        mt_linear_backward_cpu(l, dx, dy, x, lora_xa, n);
        return;
    }
#ifdef MT_CUDA
    if (n == 0) return;
    mt_tensor dyv = rows_view(be, dy, n, l->out), xv = rows_view(be, x, n, l->in);
    if (l->dw) check(mt_matmul(l->dw, &dyv, &xv, 1, 0, 1.0f, 1.0f), "weight gradient");  // dW += dyᵀ·x
    if (dx) {
        mt_tensor dxv = rows_view(be, dx, n, l->in);
        dense_or_4bit(l, &dxv, &dyv, 1);
    }
    if (l->lora) {
        size_t bytes = (size_t)n * (size_t)l->lora->r * sizeof(float);
        float *scratch = mt_work_alloc(be, bytes);
        mt_lora_backward_cuda(be, l->lora, dx, dy, x, lora_xa, scratch, n);
        mt_work_free(be, scratch, bytes);
    }
#endif
}

void mt_linear_free(mt_linear *l) {
    mt_tensor_free(l->w);
    mt_tensor_free(l->dw);
    if (l->q) {
        mt_qweight_free(l->q);
        free(l->q);
    }
    if (l->lora) {
        mt_lora_free(l->lora);
        free(l->lora);
    }
    l->w = l->dw = NULL;
    l->q = NULL;
    l->lora = NULL;
}
