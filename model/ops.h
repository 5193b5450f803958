// model/ops.h — the transformer's CPU reference kernels, fp32, row-major, named after the math.
//
// Conventions (as llm.c): T = tokens of a micro-batch (B sequences × S positions, b-major),
// H = hidden. Forward functions write their outputs (=). Backward functions ACCUMULATE (+=)
// into every gradient they produce, input gradients included; the caller zeroes them.
// A NULL gradient pointer means "not needed" (a frozen weight) and is skipped.
// These are the `_cpu` twins that the CUDA kernels of issue 6 are tested against.
#pragma once
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

// out [T, H] = wte[tokens[t]]                         wte [V, H]
void embedding_forward_cpu(float *out, const int32_t *tokens, const float *wte, int T, int H);
// dwte [V, H] += scatter of dout [T, H] by token
void embedding_backward_cpu(float *dwte, const float *dout, const int32_t *tokens, int T, int H);

// y [T, H] = x · rstd · w, rstd [T] = 1/sqrt(mean(x²) + eps) (saved for backward)
void rmsnorm_forward_cpu(float *y, float *rstd, const float *x, const float *w, int T, int H, float eps);
// dx [T, H] +=, dw [H] += (dw may be NULL)
void rmsnorm_backward_cpu(float *dx, float *dw, const float *dy, const float *x, const float *w,
                          const float *rstd, int T, int H);

// Rotary embedding, in place (docs/design.md "The step's arithmetic"): x [T, n_heads, stride]
// (stride: the head's width), pos [T]; only dims [off, off + rot) of each head turn, the rest are
// left alone (GLM's partial rotary: off 0, rot < head_dim; DeepSeek's MLA: the rope part of a head).
// inv_freq [rot/2] (model/rope.h's table, made for the dim rot: default RoPE or YaRN). Pair j
// (j < rot/2) turns by pos·inv_freq[j]; its two dims are, counted from off,
//   interleave 0: j and j + rot/2 (Hugging Face's rotate_half, the default),
//   interleave 1: 2j and 2j + 1 (DeepSeek's rope_interleave, V2's complex form; model/rope.c).
// x' = x·cos + rotate(x)·sin with cos, sin = cos, sin(pos·inv_freq) · scale (transformers'
// attention_scaling; 1 for the default RoPE). The model's q and k so far: off 0, rot = stride.
void rope_forward_cpu(float *x, const int32_t *pos, int T, int n_heads, int stride, int off, int rot, int interleave,
                      const float *inv_freq, float scale);
// The transpose rotation (scaled the same), in place on dx: the gradient of the rotated tensor
// becomes the gradient of the unrotated one.
void rope_backward_cpu(float *dx, const int32_t *pos, int T, int n_heads, int stride, int off, int rot, int interleave,
                       const float *inv_freq, float scale);

// Causal grouped-query attention over B sequences of S positions (T = B·S):
// q [T, nh, hd], k [T, nkv, hd], v [T, nkv, hd_v] (query head h reads kv head h / (nh/nkv));
// scores s_ij = scale · q_i·k_j (scale: 1/sqrt(hd) for the usual attention; MLA's hd = nope + rope
// differs from hd_v and its scale is hd^-0.5 · mscale²).
// Position i attends to j ≤ i, and only to j > i - window when window > 0 (sliding window),
// and only to keys whose key_mask[b·S + j] is 1 when key_mask is not NULL (padding).
// sinks [nh] or NULL: gpt-oss's learned attention sinks, one logit per query head joining every
// query's softmax (unscaled, never masked) and then dropped:
//   p_ij = exp(s_ij) / (Σ_j' exp(s_ij') + exp(sinks[h])),  out_i = Σ_j p_ij v_j.
// out [T, nh, hd_v]; lse [T, nh] = log-sum-exp of each query's scaled scores, the sink's logit
// included (saved for backward, so no S×S matrix is ever kept). A query with no visible key gets
// out = 0, lse = -INFINITY (sinks[h] with sinks).
void attention_forward_cpu(float *out, float *lse, const float *q, const float *k, const float *v, const float *sinks,
                           const uint8_t *key_mask, int B, int S, int nh, int nkv, int hd, int hd_v, float scale,
                           int window);
// dq [T, nh, hd] +=, dk [T, nkv, hd] +=, dv [T, nkv, hd_v] +=; recomputes the probabilities from
// q, k and lse. dout and out [T, nh, hd_v].
// dsinks [nh] += −Σ_i exp(sinks[h] − lse_ih) · D_ih, D_ih = dout_ih · out_ih (the sink's column of
// the softmax backward: its dP is 0, it has no value row); NULL skips it (and it needs sinks).
void attention_backward_cpu(float *dq, float *dk, float *dv, float *dsinks, const float *dout, const float *q,
                            const float *k, const float *v, const float *out, const float *lse, const float *sinks,
                            const uint8_t *key_mask, int B, int S, int nh, int nkv, int hd, int hd_v, float scale,
                            int window);
// The same two as scalar loops over (query, head, key) (model/attention_ref.c): the reference the
// tiled kernels above are tested against.
void attention_forward_ref(float *out, float *lse, const float *q, const float *k, const float *v, const float *sinks,
                           const uint8_t *key_mask, int B, int S, int nh, int nkv, int hd, int hd_v, float scale,
                           int window);
void attention_backward_ref(float *dq, float *dk, float *dv, float *dsinks, const float *dout, const float *q,
                            const float *k, const float *v, const float *out, const float *lse, const float *sinks,
                            const uint8_t *key_mask, int B, int S, int nh, int nkv, int hd, int hd_v, float scale,
                            int window);

// MLA's keys and values (DeepSeek V2/V3, model/mla.c): from kv_b_proj's output kvb [T, nh, nope + vd]
// and the rotated shared key part krot (row t at krot + t·krot_stride, rope floats: a slice of
// kv_a_proj_with_mqa's output rows), k [T, nh, nope + rope] = kvb[:, h, :nope] | krot (the same
// krot for every head) and v [T, nh, vd] = kvb[:, h, nope:].
void mla_kv_forward_cpu(float *k, float *v, const float *kvb, const float *krot, int64_t krot_stride, int T, int nh,
                        int nope, int rope, int vd);
// dkvb[:, h, :nope] += dk[:, h, :nope], dkvb[:, h, nope:] += dv, dkrot[t] (rows of krot_stride)
// += Σ_h dk[t, h, nope:], the heads summed in order first. dkvb or dkrot NULL: skipped.
void mla_kv_backward_cpu(float *dkvb, float *dkrot, const float *dk, const float *dv, int64_t krot_stride, int T,
                         int nh, int nope, int rope, int vd);

// Cross-entropy of logits [T, V] against targets [T]; targets equal to ignore_index are skipped.
// Returns the summed loss over counted tokens and sets *count. When dlogits is not NULL it is
// ACCUMULATED with dscale · (softmax − onehot) on counted rows (dscale = 1/total count for a mean);
// when it IS logits the gradient replaces them instead, ignored rows zeroed (one T×V buffer).
double cross_entropy_cpu(float *dlogits, float dscale, int64_t *count, const float *logits,
                         const int32_t *targets, int T, int V, int ignore_index);

// The parts some families add (model/bias.c; docs/families.md). y [T, n] += b [n];
// db [n] += Σ_t dy [T, n].
void bias_forward_cpu(float *y, const float *b, int64_t T, int64_t n);
void bias_backward_cpu(float *db, const float *dy, int64_t T, int64_t n);
// gpt-oss's expert biases over the rows of one grouped call of the GPU step's experts
// (model/experts_gpu.c): expert e's rows are [off[e] − off[0], off[e+1] − off[0]) of y and dy.
// The CUDA twins take the struct by value in the launch (1 KiB: no device copy, no host wait,
// and expert parallelism's row offsets live on the host only), or its offsets on the device.
// y [rows, n] (row stride ldy) += b [e(r), :] (b's rows of stride ldb);
// db [e, :] (rows of stride lddb) += Σ over expert e's rows of dy [rows, n] (row stride ldy).
#define MT_EXPERT_OFFSETS_MAX 256
// dev (CUDA only; the CPU twins refuse it): the offsets are a device int32 array [experts+1]
// instead of off (model/expert_rows.c: the host never reads them), and y, dy start at the row
// they count from (off[0] is then found on the device); dev_rows bounds dev[experts] − dev[0].
typedef struct mt_expert_offsets {
    int32_t experts;
    int32_t off[MT_EXPERT_OFFSETS_MAX + 1];
    const int32_t *dev;
    int64_t dev_rows;
} mt_expert_offsets;
void expert_bias_forward_cpu(float *y, int64_t ldy, const float *b, int64_t ldb, int64_t n,
                             const mt_expert_offsets *g);
void expert_bias_backward_cpu(float *db, int64_t lddb, const float *dy, int64_t ldy, int64_t n,
                              const mt_expert_offsets *g);
// clip_qkv: x [n] clamped to [-c, c]; dy [n] zeroed where the value before clamping (x, or
// RMSNorm's output w · (x · rstd) over rows of `width`) was outside [-c, c].
void clip_forward_cpu(float *x, int64_t n, float c);
void clip_backward_cpu(float *dy, const float *x, int64_t n, float c);
void clip_backward_normed_cpu(float *dy, const float *x, const float *rstd, const float *w, int64_t rows,
                              int64_t width, float c);
// The shared expert's gate: x [n] = sigmoid(x) in place; out [T, H] += (s ? s[t] : 1) · y;
// and the backward of out = s ⊙ y: dy [T, H] = s[t] · dx (written, not accumulated),
// ds [T] = s (1 − s) Σ_i dx·y (the gate logit's gradient, written).
void sigmoid_cpu(float *x, int64_t n);
void scaled_add_cpu(float *out, const float *y, const float *s, int64_t T, int64_t H);
void gate_backward_cpu(float *dy, float *ds, const float *dx, const float *y, const float *s, int64_t T, int64_t H);

#ifdef __cplusplus
}
#endif
