// model/loss.c — the fused, chunked lm_head + cross-entropy: logits [T, V] fp32 never exist
// whole. A chunk of rows at a time: logits = lm_head(xf rows), then the loss (forward) or the
// gradient written over that chunk and its dxf rows and lm_head gradients accumulated
// (backward). The same code on every backend: the cpu (fp32 reference), cuda, and the null
// backend that counts the GPU step's allocations for `plan --measure`.
//
// Design: an evaluation forward keeps nothing but the loss sum and the counted rows. A training
// forward (mt_model_forward_train) with a frozen lm_head also turns each chunk's logits into
// their gradient right there, unscaled, and adds its dxf rows into m->dxf_early [T, H] (act):
// the backward scales it by 1/count (known only after the forward: with data parallelism it is
// the count summed over ranks) and computes no logits again. A trainable lm_head (--mode full),
// whose dW must not take an unscaled gradient, and any forward without a backward after it,
// take the other way: the backward recomputes each chunk's logits (one more lm_head GEMM,
// 2·T·H·V flops). Either way recomputation of the layers is unaffected: xf is kept, and the
// loss's chunk is released before the first layer is replayed, so the two peaks never add.
#include "core/common.h"
#include "core/profile.h"
#include "model/linear.h"
#include "model/model_internal.h"
#include "model/ops_cuda.h"  // MT_CE_ACC_BYTES: the null backend counts the cuda accumulator

// The chunk's fp32 logits take at most this much; the GPU step's bf16 copy of the chunk's
// gradient (model/linear.c, DY_CHUNK_BYTES) at most half of it again. At V = 32000 that is
// 1048 rows and 134 + 67 MB: under 256 MB at any T.
enum { LOSS_CHUNK_BYTES = 128 << 20 };

int64_t mt_loss_chunk_rows(const mt_model *m, int64_t T) {
    int64_t rows = m->loss_chunk_rows > 0 ? m->loss_chunk_rows
                                          : MT_MAX((int64_t)1, LOSS_CHUNK_BYTES / (4 * (int64_t)m->cfg.vocab));
    return MT_MAX((int64_t)1, MT_MIN(rows, T));
}

// Whether rows [r0, r0 + n) have a counted target (host targets, on every backend): a chunk
// with none has no loss and a zero gradient, and is skipped (generation's forwards).
static int any_counted(const mt_model *m, int64_t r0, int64_t n) {
    for (int64_t t = r0; t < r0 + n; t++)
        if (m->targets[t] != -100) return 1;
    return 0;
}

// lg [n, V] fp32 = lm_head(xf rows [r0, r0 + n)).
static mt_tensor chunk_logits(mt_model *m, const mt_tensor *lg, int64_t r0, int64_t n) {
    mt_tensor y = mt_view_rows(lg, 0, n), x = mt_view_rows(m->xf, r0, n);
    mt_prof_push("lm_head GEMM + loss");
    mt_linear_forward(&m->lm_head, &y, &x, NULL, NULL);
    mt_prof_pop();
    return y;
}

// The GPU step sums the chunks' losses on the device and waits once, at the end (the cpu adds
// each chunk's sum on the host); its accumulator goes through the ledger, so the null backend
// counts it too. Either way the rows are summed in order: the same sum at any thread count.
// The gradient of xf made in the forward: only where lm_head has nothing to learn.
static int early_gradient(const mt_model *m) { return !m->lm_head.dw && !m->lm_head.lora; }

double mt_model_loss_forward(mt_model *m, int64_t *count, int with_grad) {
    int64_t T = (int64_t)m->B * m->S, V = m->cfg.vocab, c = mt_loss_chunk_rows(m, T), H = m->cfg.hidden;
    int run = !m->counting, dev = gpu_step(m);
    double sum = 0.0;
    *count = 0;
    mt_tensor_free(m->dxf_early);  // a forward without its backward left one
    m->dxf_early = NULL;
    if (with_grad && early_gradient(m)) {
        int64_t shape[2] = {T, H};
        m->dxf_early = mt_tensor_new(m->be, MT_MEM_ACT, act_dtype(m), 2, shape);
        if (!m->dxf_early) mt_fatal(MT_EXIT_OOM, "the loss's gradient for B=%d S=%d: %s", m->B, m->S, mt_error_get());
        m->be->ops->fill_zero(m->be, m->dxf_early->data, m->dxf_early->nbytes);
    }
    mt_tensor lg = step_work(m, MT_F32, c, V, 0);
    mt_tensor acc = dev ? step_work(m, MT_U8, (int64_t)MT_CE_ACC_BYTES(c), 1, 0) : (mt_tensor){0};
    if (run && dev) mt_op_ce_acc_start(m, acc.data, (int)c);
    for (int64_t r0 = 0; r0 < T; r0 += c) {
        int64_t n = MT_MIN(c, T - r0), k = 0;
        if (!any_counted(m, r0, n)) continue;
        mt_tensor y = chunk_logits(m, &lg, r0, n);
        int grad = m->dxf_early != NULL;
        if (run && dev) mt_op_ce_acc_add(m, acc.data, (int)c, F(&y), r0, (int)n, (int)V);
        if (run && !dev)  // the cpu's loss, and with grad the gradient over the logits in the same pass
            sum += mt_op_cross_entropy(m, grad ? F(&y) : NULL, 1.0f, &k, F(&y), m->step_targets + r0, (int)n, (int)V);
        else if (run && grad)  // cuda: the gradient alone, no host wait
            mt_op_cross_entropy(m, F(&y), 1.0f, NULL, F(&y), m->step_targets + r0, (int)n, (int)V);
        if (grad) {  // dxf rows += unscaled gradient · W
            mt_tensor x = mt_view_rows(m->xf, r0, n), dx = mt_view_rows(m->dxf_early, r0, n);
            mt_prof_push("lm_head GEMM (dx)");
            mt_linear_backward(&m->lm_head, &dx, &y, &x, NULL, NULL);
            mt_prof_pop();
        }
        *count += k;
    }
    if (run && dev) sum = mt_op_ce_acc_finish(m, acc.data, (int)c, (int)V, count);
    if (dev) step_unwork(m, &acc);
    step_unwork(m, &lg);
    return sum;
}

void mt_model_loss_backward(mt_model *m, const mt_tensor *dxf) {
    int64_t T = (int64_t)m->B * m->S, V = m->cfg.vocab, c = mt_loss_chunk_rows(m, T);
    int run = !m->counting;
    float dscale = m->ce_count ? 1.0f / (float)m->ce_count : 0.0f;
    mt_tensor lg = step_work(m, MT_F32, c, V, 0);
    for (int64_t r0 = 0; r0 < T; r0 += c) {
        int64_t n = MT_MIN(c, T - r0);
        if (!any_counted(m, r0, n)) continue;  // ignored rows: dxf stays 0, nothing to dW
        mt_tensor y = chunk_logits(m, &lg, r0, n);
        // the gradient alone, written over the chunk's logits (on cuda: no host wait)
        if (run) mt_op_cross_entropy(m, F(&y), dscale, NULL, F(&y), m->step_targets + r0, (int)n, (int)V);
        mt_tensor x = mt_view_rows(m->xf, r0, n), dx = mt_view_rows(dxf, r0, n);
        mt_prof_push("lm_head GEMM (dx)");
        mt_linear_backward(&m->lm_head, &dx, &y, &x, NULL, NULL);
        mt_prof_pop();
    }
    step_unwork(m, &lg);
}

int mt_model_logits(mt_model *m, int64_t t0, int64_t n, float *out) {
    int64_t T = (int64_t)m->B * m->S, V = m->cfg.vocab;
    if (!m->xf || t0 < 0 || n < 0 || t0 + n > T) {
        mt_error_set("logits of rows %lld..%lld: the last forward has %lld rows", (long long)t0,
                     (long long)(t0 + n), m->xf ? (long long)T : 0LL);
        return -1;
    }
    int64_t c = mt_loss_chunk_rows(m, T);
    mt_tensor lg = step_work(m, MT_F32, c, V, 0);
    for (int64_t r = 0; r < n; r += c) {
        int64_t k = MT_MIN(c, n - r);
        mt_tensor y = chunk_logits(m, &lg, t0 + r, k);
        if (y.data) m->be->ops->download(m->be, out + r * V, y.data, (size_t)(k * V) * sizeof(float));
    }
    step_unwork(m, &lg);
    return 0;
}
