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
