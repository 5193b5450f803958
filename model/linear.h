// model/linear.h — one bias-free nn.Linear [out, in] as the model sees it: a frozen weight
// (dense, or 4-bit from quant/) or a trainable one (dense with its gradient), plus an optional
// LoRA. Dense means the model's weight dtype: f32 on the cpu, bf16 on the GPU step.
#pragma once
#include <stdint.h>

#include "core/backend.h"
#include "lora/lora.h"

#ifdef __cplusplus
extern "C" {
#endif

struct mt_qweight;

typedef struct mt_linear {
    int64_t out, in;
    mt_tensor *w;              // [out, in] (base when frozen, train when trainable); NULL if q
    struct mt_qweight *q;      // frozen 4-bit weight, or NULL
    mt_tensor *dw;             // gradient when the weight itself trains (unfreeze, router, full)
    mt_lora *lora;             // adapter, or NULL
    int remote;                // expert held by another EP rank: MT_REMOTE_* (0: held here)
    mt_tensor *dequant;        // GPU step: the model's one bf16 scratch a 4-bit W is dequantized
                               // into (not owned); NULL: a scratch is taken for each call
    mt_tensor *wcache;         // GPU step, --dequant-cache: q dequantized once, bf16 [out, in]
                               // (owned); the step reads it instead of dequantizing
} mt_linear;

enum { MT_REMOTE_FROZEN = 1, MT_REMOTE_TRAINS = 2, MT_REMOTE_LORA = 3 };

// y [n, out] = x [n, in] · Wᵀ (+ LoRA); lora_xa [n, r] is kept for backward (NULL without LoRA).
void mt_linear_forward_cpu(const mt_linear *l, float *y, const float *x, float *lora_xa, int64_t n);
// dx [n, in] += dy · W (+ LoRA's part) when dx is not NULL; dW += dyᵀ · x when trainable;
// LoRA's dA, dB accumulate.
void mt_linear_backward_cpu(const mt_linear *l, float *dx, const float *dy, const float *x,
                            const float *lora_xa, int64_t n);
// The same on the Linear's backend, on 2-D views of rows (core/backend.h: mt_view2): the cpu
// backend runs the f32 kernels above (contiguous f32 views); the GPU step (cuda; the null backend
// makes its allocations and runs nothing) is bf16 × bf16 with fp32 accumulation through the
// backend's matmul, a 4-bit W dequantized to bf16 into l->dequant, the LoRA beside it as
// (x·A)·B. On the GPU step y and dy may be f32 (router and lm_head logits: an f32 dy is rounded
// to bf16 in bounded row chunks first) and may be column blocks of a wider matrix (ld).
// xa: the LoRA's kept x·A rows (NULL without LoRA); dx NULL: not wanted. sc: the LoRA's scratch
// (lora/lora.h), or NULL for one taken per call; the cpu ignores it.
void mt_linear_forward(const mt_linear *l, const mt_tensor *y, const mt_tensor *x, const mt_tensor *xa,
                       const mt_lora_scratch *sc);
void mt_linear_backward(const mt_linear *l, const mt_tensor *dx, const mt_tensor *dy, const mt_tensor *x,
                        const mt_tensor *xa, const mt_lora_scratch *sc);
// The same with W given (a bf16 [out, in] view, dequantized once by the caller for several uses):
// the GPU step only.
void mt_linear_forward_w(const mt_linear *l, const mt_tensor *w, const mt_tensor *y, const mt_tensor *x,
                         const mt_tensor *xa, const mt_lora_scratch *sc);
void mt_linear_backward_w(const mt_linear *l, const mt_tensor *w, const mt_tensor *dx, const mt_tensor *dy,
                          const mt_tensor *x, const mt_tensor *xa, const mt_lora_scratch *sc);
// The GPU step's W as a bf16 [out, in] view: the dense weight, the 4-bit one's kept copy
// (wcache), or the 4-bit one dequantized into `scratch` (bf16, at least out·in elements; a null
// backend's may have no data).
mt_tensor mt_linear_weight(const mt_linear *l, mt_tensor *scratch);
// An expert's w1 and w3 may hold a pair of LoRAs (lora/lora.h mt_lora_init_pair): w1's owns both
// A's memory, so the two are freed together (the model frees whole layers), w1's first or last.
void mt_linear_free(mt_linear *l);

#ifdef __cplusplus
}
#endif
