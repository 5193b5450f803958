// model/rope.c — rotary position embedding, Hugging Face's non-interleaved form (docs/design.md "The step's arithmetic"),
// CPU reference, fp32. Dimension j pairs with j + hd/2 (rotate_half), not with j + 1.
#include <math.h>

#include "model/ops.h"

// cos and sin of position `pos` for the pair (j, j + hd/2), in the fp32 arithmetic transformers
// uses, so that we match it to ~1e-6 rather than to the error of fp32 angles (~1e-4 rad at
// position 1000 in fp32, whichever of us would be "more exact"):
//   inv_freq = 1.0 / (base ** (torch.arange(0, dim, 2).float() / dim))   all fp32: powf, 1.0f/x
//   freqs = position_ids.float() @ inv_freq                              K = 1: one fp32 product
//   cos, sin = emb.cos(), emb.sin()                                      fp32 (attention_scaling 1)
static inline void rope_cos_sin(int32_t pos, int j, int hd, float theta, float *c, float *s) {
    float e = (float)(2 * j) / (float)hd;
    float inv_freq = 1.0f / powf(theta, e);
    float angle = (float)pos * inv_freq;
    *c = cosf(angle);
    *s = sinf(angle);
}

// x [T, n_heads, hd] rotated in place by +angle (direction 1) or −angle (−1), pos [T]:
//   x'[j]        = x[j]·cos − x[j + hd/2]·sin
//   x'[j + hd/2] = x[j + hd/2]·cos + x[j]·sin
// Negating sin is exact, so the −angle rotation is bit for bit the transpose written out.
static void rope_rotate(float *x, const int32_t *pos, int T, int n_heads, int hd, float theta, float direction) {
    int half = hd / 2;
#pragma omp parallel for
    for (int t = 0; t < T; t++) {
        for (int j = 0; j < half; j++) {
            float c, s;
            rope_cos_sin(pos[t], j, hd, theta, &c, &s);
            s *= direction;
            for (int h = 0; h < n_heads; h++) {
                float *xh = x + ((int64_t)t * n_heads + h) * hd;
                float a = xh[j], b = xh[j + half];
                xh[j] = a * c - b * s;  // HF: x·cos + (−x2)·sin, two roundings then one add
                xh[j + half] = b * c + a * s;
            }
        }
    }
}

void rope_forward_cpu(float *x, const int32_t *pos, int T, int n_heads, int hd, float theta) {
    rope_rotate(x, pos, T, n_heads, hd, theta, 1.0f);
}

// The transpose (= inverse) rotation, in place on dx: the gradient of the rotated tensor
// becomes the gradient of the unrotated one.
void rope_backward_cpu(float *dx, const int32_t *pos, int T, int n_heads, int hd, float theta) {
    rope_rotate(dx, pos, T, n_heads, hd, theta, -1.0f);
}
