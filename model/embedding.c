// model/embedding.c — token embedding lookup and its scatter-add backward (CPU reference, fp32).
#include <string.h>

#include "model/ops.h"

// out [T, H] = wte[tokens[t]]                         wte [V, H], tokens [T]
void embedding_forward_cpu(float *out, const int32_t *tokens, const float *wte, int T, int H) {
#pragma omp parallel for
    for (int t = 0; t < T; t++)
        memcpy(out + (int64_t)t * H, wte + (int64_t)tokens[t] * H, (size_t)H * sizeof(float));
}

// dwte [V, H] += dout [T, H] scattered by token. A token may repeat, so rows of dwte are shared:
// serial over t (deterministic order), which is O(T·H) and never the bottleneck.
void embedding_backward_cpu(float *dwte, const float *dout, const int32_t *tokens, int T, int H) {
    if (!dwte) return;
    for (int t = 0; t < T; t++) {
        float *dw = dwte + (int64_t)tokens[t] * H;
        const float *g = dout + (int64_t)t * H;
        for (int i = 0; i < H; i++) dw[i] += g[i];
    }
}
