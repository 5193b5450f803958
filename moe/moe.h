// moe/ — routing and experts: top-k router, aux and z losses, permute/gather/combine, SwiGLU.
// Uses core/; used by model/ (the MoE block). This is its main header.
//
// moe/moe.h — routing and experts, CPU reference kernels, fp32 (conventions of model/ops.h:
// forward writes, backward ACCUMULATES, NULL gradient = not needed).
//
// T tokens, E experts, k experts per token. An "assignment" a = t·k + j is token t's j-th choice.
#pragma once
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

// Router as transformers does it (docs/design.md "The step's arithmetic"): probs [T, E] = softmax(logits [T, E]) in
// fp32 over all experts; ids [T, k] = top-k of probs, highest first, ties to the lower expert
// index; weights [T, k] = the chosen probs, renormalised to sum 1 when norm_topk.
void router_forward_cpu(int32_t *ids, float *weights, float *probs, const float *logits, int T,
                        int E, int k, int norm_topk);
// dlogits [T, E] += the gradient through weights (dweights [T, k]); top-k selection is constant.
void router_backward_cpu(float *dlogits, const float *dweights, const float *probs,
                         const int32_t *ids, const float *weights, int T, int E, int k, int norm_topk);

// DeepSeek-style router (moe/router_grouped.c; transformers' DeepseekV3TopkRouter,
// Glm4MoeTopkRouter, DeepseekV2TopkRouter): scores = sigmoid(logits) or softmax over E; the
// choice score = score + bias (e_score_correction_bias, fp32; NULL: none); with groups, only the
// experts of the best topk_group groups may be chosen; ids = top-k of the choice score, highest
// first, ties to the lower index (groups likewise); weights = the UNBIASED scores of the chosen
// experts, divided by (their sum + 1e-20) when norm_topk, times scaling.
typedef struct moe_route_rule {
    int sigmoid;              // 1: sigmoid (DeepSeek-V3, GLM-4.5); 0: softmax over E (DeepSeek-V2)
    int n_group, topk_group;  // group-limited choice; n_group <= 1: none. E % n_group == 0
    int group_top2;           // group score: sum of the group's top-2 choice scores (V3/GLM); 0: the max (V2)
    int norm_topk;            // weights /= (sum + 1e-20) (V3/GLM with norm_topk_prob; V2 never)
    float scaling;            // routed_scaling_factor
} moe_route_rule;
enum { MOE_ROUTE_MAX_GROUPS = 64 };
// Exits with a message unless the rule fits E and k: 1 ≤ k ≤ E ≤ 1024; with groups
// (n_group > 1): n_group ≤ 64, E % n_group == 0, 1 ≤ topk_group ≤ n_group, k ≤ the experts of
// topk_group groups, and groups of 2 or more for group_top2.
void moe_route_rule_check(const char *what, moe_route_rule rule, int E, int k);
// logits [T, E] → scores [T, E] (unbiased), ids [T, k], weights [T, k]
void router_grouped_forward_cpu(int32_t *ids, float *weights, float *scores, const float *logits,
                                const float *bias, int T, int E, int k, moe_route_rule rule);
// dlogits [T, E] += the gradient through weights (dweights [T, k]); the choice and the bias are
// constant. Sigmoid: only the chosen experts' logits; softmax: all of them.
void router_grouped_backward_cpu(float *dlogits, const float *dweights, const float *scores,
                                 const int32_t *ids, const float *weights, int T, int E, int k,
                                 moe_route_rule rule);
// Replay: weights [T, k] of the recorded ids from fresh scores [T, E] (the forward's last step).
void router_grouped_weights_of_choices_cpu(float *weights, const float *scores, const int32_t *ids,
                                           int T, int E, int k, moe_route_rule rule);

// DeepSeek-V3's auxiliary-loss-free balancing. counts [E] += the unmasked rows (row_mask[t] != 0;
// NULL: all) that chose e; ids outside [0, E) are not counted.
void router_load_accumulate_cpu(double *counts, const int32_t *ids, const uint8_t *row_mask, int T,
                                int E, int k);
// After a step: bias[e] += rate · sign(mean load − counts[e]) (sign(0) = 0). counts are the
// step's, over every rank (sum them first).
void router_bias_update_cpu(float *bias, const double *counts, int E, float rate);
// max load / mean load for a log line (1: balanced); 0 when nothing was counted.
double router_load_max_over_mean(const double *counts, int E);

// DeepSeek's sequence-wise balance loss (V2's seq_aux, V3's complementary L_Bal), one layer of
// B sequences of S rows; rows with row_mask[t] == 0 (NULL: none) are left out. Per sequence,
// over its n unmasked rows, with ids the recorded choices and s the router's scores:
//   f_e = E/(k·n) · Σ_t 1[e chosen at t],  P_e = (1/n) · Σ_t s_te / Σ_e' s_te',  L_b = Σ_e f_e·P_e.
// Returns Σ_b L_b over the sequences with a row and adds their count to *seqs: the loss is
// α · sum / seqs (DeepSeek adds the layers' losses). A row whose scores sum to 0 adds nothing to P.
double router_seq_aux_sum_cpu(int64_t *seqs, const float *scores, const int32_t *ids,
                              const uint8_t *row_mask, int B, int S, int E, int k);
// dlogits [B·S, E] += dscale · d(Σ_b L_b)/dlogits (dscale = α / seqs): f is constant; through P,
// the per-row normalisation and the sigmoid (sigmoid = 1) or softmax, every expert's logit.
void router_seq_aux_backward_cpu(float *dlogits, float dscale, const float *scores, const int32_t *ids,
                                 const uint8_t *row_mask, int B, int S, int E, int k, int sigmoid);

// Load-balancing aux loss (transformers' load_balancing_loss_func), over the rows of all layers
// together: f[j,e] = mean over rows of 1[choice j = e], P_e = mean over rows of probs[e],
// L = E · Σ_j Σ_e f[j,e] · P_e (only Σ_j f[j,e] matters, so counts are kept per expert).
// Rows with row_mask[t] == 0 (padding) are left out; row_mask may be NULL.
typedef struct moe_aux_stats {
    int E, k;
    double counts[1024];     // [E]: Σ over rows and choices of 1[choice = e]
    double prob_sums[1024];  // [E]: Σ over rows of probs[e]
    int64_t rows;
} moe_aux_stats;
void moe_aux_init(moe_aux_stats *s, int E, int k);
void moe_aux_accumulate_cpu(moe_aux_stats *s, const float *probs, const int32_t *ids,
                            const uint8_t *row_mask, int T);
double moe_aux_loss(const moe_aux_stats *s);
// dlogits [T, E] += coef · dL/dlogits for one layer's rows (f is constant; the gradient flows
// through P and the softmax). `s` holds the totals over every layer.
void moe_aux_backward_cpu(float *dlogits, float coef, const moe_aux_stats *s, const float *probs,
                          const uint8_t *row_mask, int T);

// Router z-loss (ST-MoE): mean over unmasked rows of logsumexp(logits)². Returns the sum over
// this layer's rows and adds the row count to *rows; the caller divides by the total.
double moe_zloss_sum_cpu(int64_t *rows, const float *logits, const uint8_t *row_mask, int T, int E);
// dlogits += dscale · 2 · lse · softmax, on unmasked rows (dscale = coef / total rows).
void moe_zloss_backward_cpu(float *dlogits, float dscale, const float *logits,
                            const uint8_t *row_mask, int T, int E);

// Stable counting sort of the T·k assignments by expert: order [T·k] lists assignment indices
// expert by expert (within an expert, in assignment order); offsets [E+1]: expert e owns
// order[offsets[e] .. offsets[e+1]); counts [E] (may be NULL) the tokens per expert.
void moe_permute_cpu(int32_t *order, int32_t *offsets, int32_t *counts, const int32_t *ids, int T,
                     int E, int k);
// xs [T·k, H] (rows ldo ≥ H apart; the columns beyond H are not touched): row i = x [order[i] / k]
void moe_gather_cpu(float *xs, int64_t ldo, const float *x, const int32_t *order, int n, int H, int k);
// dx [T, H] = the sum of token t's rows i of dxs (t = order[i] / k, in ascending i; written, not
// added to: the caller need not zero it)
// (dxs's rows ldi ≥ H apart: the columns beyond H are not read)
void moe_gather_backward_cpu(float *dx, const float *dxs, int64_t ldi, const int32_t *order, int n, int H, int k);
// out [T, H] += weights[a] · ys[i], a = order[i], t = a / k   (the weighted combine)
void moe_combine_cpu(float *out, const float *ys, const float *weights, const int32_t *order, int n,
                     int H, int k);
// dys [T·k, H] (rows ldd apart) = weights[a] · dout[t] (written: its earlier values are neither
// read nor kept, so the caller need not zero it); dweights [T·k] += <dout[t], ys[i]>
// (a = order[i], t = a / k); either gradient may be NULL
void moe_combine_backward_cpu(float *dys, int64_t ldd, float *dweights, const float *dout, const float *ys,
                              const float *weights, const int32_t *order, int n, int H, int k);

// SwiGLU: a [n] = silu(g) ⊙ u, silu(g) = g·sigmoid(g)
void swiglu_forward_cpu(float *a, const float *g, const float *u, int64_t n);
// dg, du [n] +=
void swiglu_backward_cpu(float *dg, float *du, const float *da, const float *g, const float *u, int64_t n);
// gpt-oss's clamped SwiGLU (transformers' GptOssExperts._apply_gate): g' = min(g, limit),
// u' = clamp(u, ±limit), a = (u' + 1) · g'·σ(alpha·g'). The clamps pass the gradient where the
// value was inside (bounds included, as torch.clamp's backward), 0 elsewhere.
void swiglu_clamped_forward_cpu(float *a, const float *g, const float *u, int64_t n, float alpha, float limit);
void swiglu_clamped_backward_cpu(float *dg, float *du, const float *da, const float *g, const float *u, int64_t n,
                                 float alpha, float limit);
// The same over the fused w1‖w3 output (the GPU step's one GEMM): row r of gu [rows, 2f] is
// [g_r (f values) | u_r (f values)]. Element for element the split kernels' arithmetic, so the
// results are equal bit for bit (tests/test_moe_ops.c); the fp32 twins of swiglu_fused_*_cuda.
// a [rows, f] (row stride lda ≥ f: columns past f untouched) = silu(gu[:, :f]) ⊙ gu[:, f:]
void swiglu_fused_forward_cpu(float *a, int64_t lda, const float *gu, int64_t rows, int64_t f);
// dgu [rows, 2f] = (d/dg, d/du) of a given da [rows, f] (row stride ldda), written (not added);
// dgu may be gu
void swiglu_fused_backward_cpu(float *dgu, const float *da, int64_t ldda, const float *gu, int64_t rows, int64_t f);
// gpt-oss's clamped SwiGLU over the fused layout (the twins of swiglu_clamped_fused_*_cuda):
// element for element swiglu_clamped_*_cpu's arithmetic, so equal to them bit for bit; dgu
// written, 0 where a clamp cut (bounds pass, as torch.clamp); dgu may be gu.
void swiglu_clamped_fused_forward_cpu(float *a, int64_t lda, const float *gu, int64_t rows, int64_t f, float alpha,
                                      float limit);
void swiglu_clamped_fused_backward_cpu(float *dgu, const float *da, int64_t ldda, const float *gu, int64_t rows,
                                       int64_t f, float alpha, float limit);

#ifdef __cplusplus
}
#endif
