// model/rope.c — rotary position embedding (docs/design.md "The step's arithmetic"), CPU
// reference, fp32: Hugging Face's non-interleaved form (dimension j pairs with j + rot/2,
// rotate_half) or DeepSeek's interleaved pairs (2j, 2j + 1), on all of a head or a part of it
// (model/ops.h). The frequency table (default or YaRN) is mt_rope_table's (model/rope.h),
// computed once per model.
#include <math.h>

#include "core/common.h"
#include "model/ops.h"
#include "model/rope.h"

// transformers' fp32 table (modeling_rope_utils.py), so that we match it to ~1e-6 rather than to
// the error of fp32 angles (~1e-4 rad at position 1000 in fp32, whichever of us would be "more
// exact"):
//   pos_freqs = base ** (torch.arange(0, dim, 2).float() / dim)          fp32 powf of fp32 base
//   default:  inv_freq = 1.0 / pos_freqs                                  fp32
//   YaRN:     extrapolation 1/pos_freqs, interpolation 1/(factor·pos_freqs), blended by
//             1 − a linear ramp (fp32 arange minus fp32 low, over fp32 (high − low)) between the
//             correction dims of beta_fast and beta_slow (double, Python's math), each step fp32.
// One rounding per fp32 step: -std=c11 does not contract a·b + c·d into an FMA.
static double yarn_correction_dim(double rot, int dim, double base, double max_pos) {
    return (dim * log(max_pos / (rot * 2 * M_PI))) / (2 * log(base));
}

static double yarn_mscale(double scale, double mscale) { return scale <= 1 ? 1.0 : 0.1 * mscale * log(scale) + 1.0; }

int mt_rope_table(const mt_rope_params *p, float *inv_freq, float *scale) {
    const int hd = p->hd, half = hd / 2;
    if (hd < 2 || hd % 2) return mt_error_set("rope: head_dim %d must be even and at least 2", hd), -1;
    if (!(p->theta > 0) || !isfinite(p->theta)) return mt_error_set("rope: rope_theta %g must be positive", p->theta), -1;
    const float base = (float)p->theta;
    if (!p->yarn) {
        for (int j = 0; j < half; j++) inv_freq[j] = 1.0f / powf(base, (float)(2 * j) / (float)hd);
        *scale = 1.0f;
        return 0;
    }
    if (p->original_max <= 0)
        return mt_error_set("rope: yarn needs original_max_position_embeddings > 0 (got %lld)", (long long)p->original_max), -1;
    double factor = p->factor != 0 ? p->factor : (double)p->max_positions / (double)p->original_max;
    if (!(factor > 0) || !isfinite(factor)) return mt_error_set("rope: yarn factor %g must be positive", factor), -1;
    double af = p->attention_factor;
    if (af == 0)
        af = p->mscale != 0 && p->mscale_all_dim != 0 ? yarn_mscale(factor, p->mscale) / yarn_mscale(factor, p->mscale_all_dim)
                                                      : yarn_mscale(factor, 1);
    if (!(af > 0) || !isfinite(af)) return mt_error_set("rope: yarn attention_factor %g must be positive", af), -1;
    const double beta_fast = p->beta_fast != 0 ? p->beta_fast : 32, beta_slow = p->beta_slow != 0 ? p->beta_slow : 1;
    double low = yarn_correction_dim(beta_fast, hd, p->theta, (double)p->original_max);
    double high = yarn_correction_dim(beta_slow, hd, p->theta, (double)p->original_max);
    if (p->truncate) low = floor(low), high = ceil(high);
    low = low > 0 ? low : 0, high = high < hd - 1 ? high : hd - 1;
    if (low == high) high += 0.001;  // transformers' guard against a zero-width ramp
    const float lo = (float)low, width = (float)(high - low), f = (float)factor;
    for (int j = 0; j < half; j++) {
        float pos_freq = powf(base, (float)(2 * j) / (float)hd);
        float extra = 1.0f / pos_freq, inter = 1.0f / (f * pos_freq);
        float ramp = ((float)j - lo) / width;
        ramp = ramp < 0.0f ? 0.0f : ramp > 1.0f ? 1.0f : ramp;
        float ef = 1.0f - ramp;  // inv_freq_extrapolation_factor
        float a = inter * (1.0f - ef), b = extra * ef;
        inv_freq[j] = a + b;
    }
    *scale = (float)af;
    return 0;
}

void mt_rope_params_from_config(const mt_model_config *c, mt_rope_params *p) {
    // the dims RoPE turns: GLM-4.5's partial rotary, MLA's rope part (transformers' `dim`)
    *p = (mt_rope_params){.yarn = c->rope_yarn, .hd = (int)mt_config_rotary_dim(c), .theta = c->rope_theta, .truncate = 1};
    if (c->rope_yarn) {
        p->factor = c->rope_factor, p->beta_fast = c->rope_beta_fast, p->beta_slow = c->rope_beta_slow;
        p->mscale = c->rope_mscale, p->mscale_all_dim = c->rope_mscale_all_dim;
        p->attention_factor = c->rope_attention_factor, p->truncate = c->rope_truncate;
        p->original_max = c->rope_original_max, p->max_positions = c->max_positions;
    }
}

// x [T, n_heads, stride] rotated in place by +angle (direction 1) or −angle (−1), pos [T]: pair j
// of each head (dims a = off + j and b = off + j + rot/2, or a = off + 2j and b = off + 2j + 1
// when interleaved) becomes
//   x'[a] = x[a]·cos − x[b]·sin,   x'[b] = x[b]·cos + x[a]·sin,   cos, sin = cos, sin(pos · inv_freq[j]) · scale
// Negating sin is exact, so the −angle rotation is bit for bit the transpose written out (the
// scale too: the transpose of scale·R is scale·Rᵀ).
//
// Interleaved pairs: transformers' DeepSeek V3 (apply_rotary_pos_emb_interleave) turns the same
// pairs (2j, 2j + 1) by the same angles but writes them de-interleaved: pair j's results go to
// dims j and j + rot/2 (its V2's complex form writes them in place, as here). The two outputs differ
// by one fixed permutation of the rotated dims, the same for q and for k; attention reads q and k
// only through dot products q·k, which a shared permutation leaves unchanged (so the scores, the
// loss and every gradient before the rotation are the same). tests/test_model_ops.c checks the
// scores against transformers' formula.
static void rope_rotate(float *x, const int32_t *pos, int T, int n_heads, int stride, int off, int rot, int interleave,
                        const float *inv_freq, float scale, float direction) {
    const int half = rot / 2, step = interleave ? 2 : 1, partner = interleave ? 1 : half;
#pragma omp parallel for
    for (int t = 0; t < T; t++) {
        for (int j = 0; j < half; j++) {
            float angle = (float)pos[t] * inv_freq[j];  // freqs = position_ids.float() @ inv_freq: one product
            float c = cosf(angle) * scale, s = sinf(angle) * scale * direction;
            for (int h = 0; h < n_heads; h++) {
                float *xa = x + ((int64_t)t * n_heads + h) * stride + off + (int64_t)j * step, *xb = xa + partner;
                float a = *xa, b = *xb;
                *xa = a * c - b * s;  // HF: x·cos + (−x2)·sin, two roundings then one add
                *xb = b * c + a * s;
            }
        }
    }
}

static void rope_check(int stride, int off, int rot) {
    if (rot < 2 || rot % 2 || off < 0 || off + rot > stride)
        mt_fatal(MT_EXIT_ERROR, "rope: dims [%d, %d + %d) must be even in number (at least 2) and inside a head of %d",
                 off, off, rot, stride);
}

void rope_forward_cpu(float *x, const int32_t *pos, int T, int n_heads, int stride, int off, int rot, int interleave,
                      const float *inv_freq, float scale) {
    rope_check(stride, off, rot);
    rope_rotate(x, pos, T, n_heads, stride, off, rot, interleave, inv_freq, scale, 1.0f);
}

// The transpose rotation, in place on dx: the gradient of the rotated tensor becomes the
// gradient of the unrotated one.
void rope_backward_cpu(float *dx, const int32_t *pos, int T, int n_heads, int stride, int off, int rot, int interleave,
                       const float *inv_freq, float scale) {
    rope_check(stride, off, rot);
    rope_rotate(dx, pos, T, n_heads, stride, off, rot, interleave, inv_freq, scale, -1.0f);
}
