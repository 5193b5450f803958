// model/linear.h — one bias-free nn.Linear [out, in] as the model sees it: a frozen weight
// (f32, or 4-bit from quant/) or a trainable one (f32 with its gradient), plus an optional LoRA.
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
    mt_tensor *w;              // f32 [out, in] (base when frozen, train when trainable); NULL if q
    struct mt_qweight *q;      // frozen 4-bit weight, or NULL
    mt_tensor *dw;             // gradient when the weight itself trains (unfreeze, router, full)
    mt_lora *lora;             // adapter, or NULL
    int remote;                // expert held by another EP rank: MT_REMOTE_* (0: held here)
    mt_tensor *dequant;        // cuda: the model's one f32 scratch for a 4-bit W (not owned);
                               // NULL: a scratch is taken for each call
} mt_linear;

enum { MT_REMOTE_FROZEN = 1, MT_REMOTE_TRAINS = 2, MT_REMOTE_LORA = 3 };

// y [n, out] = x [n, in] · Wᵀ (+ LoRA); lora_xa [n, r] is kept for backward (NULL without LoRA).
void mt_linear_forward_cpu(const mt_linear *l, float *y, const float *x, float *lora_xa, int64_t n);
// dx [n, in] += dy · W (+ LoRA's part) when dx is not NULL; dW += dyᵀ · x when trainable;
// LoRA's dA, dB accumulate.
void mt_linear_backward_cpu(const mt_linear *l, float *dx, const float *dy, const float *x,
                            const float *lora_xa, int64_t n);
// The same on the Linear's backend: the CPU kernels above, or on CUDA the backend's matmul
// (cuBLASLt; a 4-bit W dequantized into an f32 scratch for the call) and the LoRA's twin.
void mt_linear_forward(const mt_linear *l, float *y, const float *x, float *lora_xa, int64_t n);
void mt_linear_backward(const mt_linear *l, float *dx, const float *dy, const float *x,
                        const float *lora_xa, int64_t n);
void mt_linear_free(mt_linear *l);

#ifdef __cplusplus
}
#endif
