// model/fused_experts.c — one expert's Linear out of, and back into, gpt-oss's fused tensors
// (model/fused_experts.h). Used by the loader (split) and by merge (fold back).
#include "model/fused_experts.h"

mt_fused_part mt_fused_part_of(int which, int64_t hidden, int64_t inter) {
    if (which == 1) return (mt_fused_part){hidden, inter, 1, 0};  // down: H rows of f
    return (mt_fused_part){2 * inter, hidden, 2, which == 2};     // gate_up: 2f rows of H, interleaved
}

void mt_fused_get(const float *slice, mt_fused_part p, float *w) {
    int64_t out = p.rows / p.stride;
    for (int64_t i = 0; i < out; i++)
        for (int64_t x = 0; x < p.in; x++) w[i * p.in + x] = slice[x * p.rows + p.off + p.stride * i];
}

void mt_fused_put(float *slice, mt_fused_part p, const float *w) {
    int64_t out = p.rows / p.stride;
    for (int64_t i = 0; i < out; i++)
        for (int64_t x = 0; x < p.in; x++) slice[x * p.rows + p.off + p.stride * i] = w[i * p.in + x];
}
