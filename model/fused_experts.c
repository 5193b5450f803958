// model/fused_experts.c — one expert's Linear out of, and back into, gpt-oss's fused tensors
// (model/fused_experts.h). Used by the loader (split) and by merge (fold back).
#include "model/fused_experts.h"

#include <string.h>

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

int mt_fused_tensor_of(const char *name, size_t *experts_len) {
    static const char *const leaf[2] = {".gate_up_proj", ".down_proj"};
    size_t n = strlen(name);
    for (int k = 0; k < 2; k++) {
        size_t pre = n - strlen(leaf[k]);
        if (n > strlen(leaf[k]) + 8 && strcmp(name + pre, leaf[k]) == 0 && strncmp(name + pre - 8, ".experts", 8) == 0) {
            if (experts_len) *experts_len = pre;
            return k;
        }
    }
    return -1;
}

// A bias row is a one-column slice: the gate's and the up's are the Linears' parts of gate_up.
void mt_fused_bias_split(const float *fused, int64_t E, int64_t f, float *gate, float *up) {
    for (int64_t e = 0; e < E; e++) {
        mt_fused_get(fused + e * 2 * f, mt_fused_part_of(0, 1, f), gate + e * f);
        mt_fused_get(fused + e * 2 * f, mt_fused_part_of(2, 1, f), up + e * f);
    }
}

void mt_fused_bias_join(float *fused, int64_t E, int64_t f, const float *gate, const float *up) {
    for (int64_t e = 0; e < E; e++) {
        mt_fused_put(fused + e * 2 * f, mt_fused_part_of(0, 1, f), gate + e * f);
        mt_fused_put(fused + e * 2 * f, mt_fused_part_of(2, 1, f), up + e * f);
    }
}
