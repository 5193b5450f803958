// model/ — the transformer: config, weights, the model built for a training mode (model/spec.h),
// its forward and backward, expert parallelism, saving adapters and trained tensors. Uses core/,
// quant/, lora/, moe/; used by optim/params, plan/ (--measure) and trainer/. Main header.
//
// model/mixtral.h — a Mixtral-family model built from a checkpoint for one training mode, and its
// forward and backward on the CPU backend (the reference the CUDA step is tested against).
#pragma once
#include <stdint.h>

#include "core/backend.h"
#include "core/comm.h"
#include "model/config.h"
#include "model/linear.h"
#include "moe/moe.h"
#include "model/spec.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct mt_layer {
    mt_tensor *ln1, *ln2;        // input_layernorm, post_attention_layernorm [H]
    mt_tensor *dln1, *dln2;      // their gradients (full mode)
    mt_tensor *qn, *kn;          // self_attn.q_norm, k_norm (families with a q/k RMSNorm), or NULL
    mt_tensor *dqn, *dkn;        // their gradients (full mode)
    mt_tensor *bias[4], *dbias[4];  // q/k/v/o_proj biases where the family has them (NULL: none),
                                    // their gradients (full mode)
    mt_linear q, k, v, o;        // self_attn.{q,k,v,o}_proj
    mt_tensor *sinks, *dsinks;   // self_attn.sinks [heads] (gpt-oss), or NULL; gradient in full mode
    // MLA (DeepSeek-V2/V3; docs/families.md "DeepSeek-style"): q is q_b_proj's output (in `q`) of
    // q_a_layernorm(q_a_proj(x)), or q_proj's (in `q`) without q_lora_rank; kv_a_proj_with_mqa gives the
    // latent and the shared rope key, kv_b_proj the heads' k_nope | v from the normed latent; o is o_proj.
    // bias[0]: q_a_proj's, bias[1]: kv_a_proj_with_mqa's, bias[3]: o_proj's (attention_bias).
    mt_linear q_a, kv_a, kv_b;
    mt_tensor *q_a_norm, *kv_a_norm, *dq_a_norm, *dkv_a_norm;
    mt_tensor *score_bias;       // the router's e_score_correction_bias [E], fp32 on every backend:
                                 // it moves the choice (and --router-bias-update moves it), never the weight
    mt_linear gate;              // block_sparse_moe.gate, the router [E, H]
    mt_tensor *gate_bias, *dgate_bias;  // the router's bias [E] (gpt-oss), or NULL; trains with the router
    mt_tensor *ebias[3], *debias[3];    // the experts' biases (gpt-oss): w1 [E, f], w2 [E, H], w3 [E, f]
                                        // (gate_up_proj_bias de-interleaved), or NULL
    mt_linear *w1, *w2, *w3;     // block_sparse_moe.experts.E.{w1,w2,w3}, [E] each
    // --expert-cache: this layer's frozen 4-bit experts kept dequantized in bf16 (model/mixtral.c
    // keep_experts), [E] each: [0] the stacked [W1;W3], [1] W2, in the layout the grouped calls use
    // (room for the LoRAs' blocks), dequantized when the model is built (the 4-bit experts' codes
    // then given back: their mt_qweight only describes them); NULL where not kept.
    mt_tensor **experts_bf16[2];
    // A dense layer (Qwen's mlp_only_layers, decoder_sparse_step): no router and no experts (their
    // Linears stay empty), its MLP in mlp[]. An MoE layer with a shared expert (Qwen2-MoE): the
    // shared expert in mlp[] and its gate, scaled by sigmoid(shared_gate(x)) (model/mlp.c).
    int dense;
    mt_linear mlp[3];            // mlp.{gate,down,up}_proj or mlp.shared_expert.{gate,down,up}_proj
    mt_linear shared_gate;       // mlp.shared_expert_gate [1, H], or empty
} mt_layer;

// What every layer keeps from forward, with or without recomputation (ledger: act): its input and
// its routing decisions, which a recomputed layer replays so it can never route differently.
typedef struct mt_layer_kept {
    mt_tensor *x;                        // [T, H] layer input
    mt_tensor *ids, *order, *offsets;    // [T, k] chosen experts; [T·k] expert order; [E+1]
    int32_t *counts;                     // tokens per expert (host), for load logging
    int32_t *host_offsets;               // [E+1] offsets on the host, for the expert loop
    int offsets_pending;                 // their download begun, not yet collected (mt_op_permute_wait)
    int rows_on_device;                  // this step left them on the device (model/expert_rows.c):
                                         // host_offsets and counts arrive with the loss statistics
    // Expert parallelism (model/expert_parallel.c): rows each EP rank sends each expert [P × E],
    // exchanged once by the first forward and reused by recomputation and backward; and the
    // owner-side layout of this rank's experts, expert-major then by source rank [E + 1].
    int64_t *peer_counts, *own_offsets;
} mt_layer_kept;

// The rest of a layer's forward state (ledger: act). Without recomputation each layer has its
// own; a part that --recompute names is one set shared by every layer, refilled by recomputing
// that part of each layer before its backward.
typedef struct mt_layer_acts {
    mt_tensor *ln1, *rstd1, *q, *k, *v, *att, *lse, *h, *ln2, *rstd2;
    mt_tensor *mlp_g, *mlp_u, *mlp_a, *mlp_y;        // dense MLP or shared expert [T, f], y [T, H]
    mt_tensor *mlp_gu;                               // the GPU step's g | u side by side [T, 2f]
                                                     // (as an expert's gu), in place of g and u
    mt_tensor *mlp_s;                                // [T] sigmoid(shared_gate(x)) (shared expert)
    mt_tensor *xa_mlp[3], *xa_sgate;                 // their LoRA xa [T, r] (NULL without LoRA)
    mt_tensor *v_raw;                                // clip_qkv: v_proj's output before clamping
    mt_tensor *q_raw, *k_raw;                        // q/k norm: q_proj, k_proj outputs before it
    mt_tensor *rstd_q, *rstd_k;                      // and its statistics (NULL without q/k norm)
    mt_tensor *q_a, *q_an, *rstd_qa, *kv_a, *kv_an, *rstd_kva, *kvb;  // MLA: q_a_proj's output and its norm,
                                                     // kv_a's [T, kvr + rope] and the latent's norm, kv_b's
    mt_tensor *xa_qa, *xa_kva, *xa_kvb;              // their LoRA xa (NULL without LoRA)
    mt_tensor *logits, *probs, *weights;
    mt_tensor *xs, *g, *u, *a;                       // [rows, ...] this rank's experts' rows (xs
                                                     // [rows, H + mt_experts_xs_extra]); g, u
                                                     // on the cpu, gu on the GPU step (below)
    mt_tensor *gu;                                   // [rows, 2f]: w1's and w3's outputs side by
                                                     // side, one GEMM with N = 2f (GPU step)
    mt_tensor *ys;                                   // [T·k, H] in expert order
    mt_tensor *xa_q, *xa_k, *xa_v, *xa_o, *xa_gate;  // LoRA xa [T, r] (NULL without LoRA)
    mt_tensor *xa_w1, *xa_w3, *xa_w2;                // LoRA xa [rows, r]; w1's and w3's NULL when
                                                     // they live beside x in xs (mt_experts_xs_extra)
    int64_t expert_rows;  // rows the expert buffers hold: T·k on one rank; with EP what the
                          // rank's experts receive, regrown when routing sends more
    int expert_lora[3];   // w1, w2, w3 of these layers have LoRA here (their xa wanted)
} mt_layer_acts;

typedef struct mt_batch {
    int B, S;
    const int32_t *tokens;  // [B, S]
    const int32_t *labels;  // [B, S], -100 = not in the loss; the model shifts them by one
    const int32_t *mask;    // [B, S], 1 = real token, 0 = padding; NULL = no padding
} mt_batch;

typedef struct mt_loss {
    double loss;        // ce + aux_coef·aux + z_coef·z + seq_aux_coef·seq_aux
    double ce, aux, z;  // ce: mean over counted tokens
    double seq_aux;     // DeepSeek's sequence-wise balance loss: over the MoE layers, the sum of its
                        // mean over sequences (0 unless seq_aux_coef ≠ 0)
    int64_t tokens;     // tokens counted in ce
} mt_loss;

// How the model is spread over ranks (trainer: --ep, and the ranks of mpirun). Each layer's
// experts are partitioned over the EP group, E/P each (the first E mod P ranks one more): the
// trainable ones first, round-robin over the ranks in (layer, expert) order across the whole
// model, then the frozen ones to fill each rank's share, lowest rank first. So trainable experts
// (and their optimizer state) spread as evenly as they can, as the planner assumes, and every
// rank computes the same number of experts per layer. An expert's owner alone holds its weights,
// LoRA and optimizer state; the rest of the model is replicated on every rank.
typedef struct mt_model_par {
    int ep_rank, ep_size;  // this rank in its EP group, and the group's size (1: no EP)
    mt_comm *ep;           // the EP group (NULL when ep_size is 1, or counting as one rank)
    mt_comm *data;         // every rank with tokens of its own: loss and aux statistics are summed
                           // over it, so each rank's gradient is its part of the global batch's
                           // (NULL: this rank's batch is the whole batch)
} mt_model_par;

typedef struct mt_model {
    mt_model_config cfg;
    mt_backend *be;
    mt_model_spec spec;         // the mode, targets and quantization it was built for
    // The null backend (moetrain plan --measure): every allocation of a step is made and
    // counted, no kernel runs and no device data is read. It follows the cuda step's dtypes and
    // allocations (model/model_internal.h: step_dtype), where the cpu backend keeps f32.
    int counting;
    int rows_mode;              // model/expert_rows.c: 0 undecided, 1 expert offsets may stay on the device, -1 not
    int xs_extra_known;         // model/experts_gpu.c mt_experts_xs_extra's answer, once asked
    int64_t xs_extra;
    int a_extra_known;          // and mt_experts_a_extra's
    int64_t a_extra;
    mt_dtype wdtype;            // dense weights, LoRA and their gradients: F32 (cpu), BF16 (cuda, null)
    mt_tensor *embed, *dembed;  // [V, H]
    mt_tensor *norm, *dnorm;    // [H]
    mt_linear lm_head;          // [V, H]
    mt_layer *layers;
    float aux_coef, z_coef;
    float seq_aux_coef;         // DeepSeek's sequence-wise balance loss (config: aux_loss_alpha with
                                // seq_aux; trainer: --seq-aux-coef), 0: off
    // step state
    int B, S;                   // activations are sized for this batch shape
    // --recompute (model/spec.h): the parts of every layer the backward recomputes, attention
    // (ln1 to h) and the MLP part (ln2 onwards). A recomputed part's buffers are one set for all
    // layers, `shared` (which owns them); acts[L] points at them beside its own kept part.
    int recompute_attn, recompute_mlp;
    mt_layer_kept *kept;        // [layers]
    mt_layer_acts *acts;        // [layers]
    mt_layer_acts shared;       // the recomputed parts' tensors (none without recomputation)
    mt_tensor *x_final, *xf, *rstdf;  // [T, H], [T, H], [T]: the loss reads xf (model/loss.c)
    int64_t loss_chunk_rows;    // rows of logits the loss holds at once; 0: mt_loss_chunk_rows's
    int dweights_from_ys;       // tests: the cpu takes the router's top-k weight gradient from ys,
                                // as the GPU step does (model/experts.c)
    mt_tensor *dxf_early;       // [T, H] the loss's unscaled gradient of xf, made by a training
                                // forward (mt_model_forward_train) for its backward (ledger: act)
    int32_t *tokens, *targets, *positions;     // [T] host
    uint8_t *row_mask;                         // [T] host, 1 = real token
    // What the kernels read: the host arrays above on the cpu backend; on cuda their copies in
    // batch_dev, uploaded once per forward. aux_dev: the aux statistics on cuda (raw doubles).
    int32_t *step_tokens, *step_targets, *step_positions;
    uint8_t *step_mask;
    mt_tensor *batch_dev, *aux_dev;
    int has_mask;                              // 0: no padding in this batch (row_mask unused)
    int pad_right;                             // 1: each sequence's padding is at its end, after
                                               // ≥ 1 real token (its mask as lengths: cuDNN's form)
    moe_aux_stats aux;
    double z_sum;
    int64_t z_rows, ce_count;
    double seq_aux[2];          // the balance loss's sum over (MoE layer, sequence) pairs, and their count
    int lowest_trainable;       // backward stops below this layer (nothing there trains), the
                                // same on every rank whichever experts it holds
    mt_model_par par;
    int32_t *owner;             // [layers × experts] the EP rank holding each expert
    mt_tensor *dequant;         // GPU step: bf16 scratch of the largest 4-bit W outside the experts
                                // (whose grouped kernels dequantize tile by tile), shared by those
                                // Linears (ledger: work; the dequantization buffer of docs/memory.md "Workspace")
    uint64_t host_syncs;        // the backend's host waits when the last step began (metrics)
    double *bias_load;          // --router-bias-update: [layers × experts] tokens each expert got since the
                                // last update (memory of `be`, doubles, bias_load_t's), or NULL
    mt_tensor *bias_load_t;
    // The experts each MoE layer routes to, given: [layers] host arrays of [B·S·top_k] ids (NULL for
    // a dense layer), taken in place of the router's top-k; their weights still come from this
    // router's scores. NULL (always, but in tests): the router chooses. tests/test_cuda_family.c gives
    // the GPU step the cpu's choices, which bf16's scores would tip otherwise at near ties.
    const int32_t *const *routing_given;
    // RoPE's frequency table (model/rope.h, from the config at build): inv_freq [head_dim/2] on the
    // host, its copy on the device for cuda (ledger: act; made but not written on the null
    // backend), and the factor on cos and sin (1 but for YaRN).
    float *rope_inv_freq;
    mt_tensor *rope_inv_freq_dev;
    float rope_scale;
} mt_model;

// The attention Linears of a layer and their module names under "model.layers.L.": q, k, v, o, or
// MLA's q_a_proj (with q_lora_rank), q_b_proj (or q_proj), kv_a_proj_with_mqa, kv_b_proj, o_proj.
// Returns how many (at most MT_ATTN_LINEARS); names may be NULL.
#define MT_ATTN_LINEARS 5
int mt_layer_attn_linears(mt_layer *ly, const mt_model_config *c, mt_linear **ls, const char **names);

// The EP rank that holds expert e of layer L, and whether it is this one.
static inline int mt_expert_owner(const mt_model *m, int L, int e) { return m->owner[(int64_t)L * m->cfg.experts + e]; }
static inline int mt_expert_is_local(const mt_model *m, int L, int e) {
    return mt_expert_owner(m, L, e) == m->par.ep_rank;
}

// Builds the model of the checkpoint folder `dir` for spec->mode (lora / router / unfreeze /
// full). The checkpoint streams through mt_quant_load: dense frozen Linears that
// spec->quant_targets names are quantized to spec->quant as they arrive; a checkpoint written by
// `moetrain quantize` (bnb-4bit NF4/FP4, or INT4) loads as stored, and with --quant none (or a
// target not in quant_targets) its 4-bit tensors are dequantized on load. A weight that trains
// must be stored dense: a 4-bit one is refused, naming it. On the null backend nothing is read:
// `dir` may be a config.json, and every tensor is allocated (counted) without data.
// 0, or -1 with an error.
int mt_model_load(mt_model *m, mt_backend *be, const char *dir, const mt_model_spec *spec);
// The same from a config already read (`moetrain plan --case` has a built-in one). dir NULL:
// no checkpoint; on the null backend nothing is filled, on the others the weights are random
// (N(0, 0.02²), norms 1, drawn from spec->seed; frozen targets quantized as the run asks): for
// benchmarks of full-size shapes.
int mt_model_build(mt_model *m, mt_backend *be, const mt_model_config *cfg, const char *dir,
                   const mt_model_spec *spec);
// The same for one rank of a parallel run: only this EP rank's experts are read and kept. `par`
// NULL is one rank. Counting (null backend) with ep_size > 1 and no comm measures EP rank
// ep_rank of a balanced run.
int mt_model_build_par(mt_model *m, mt_backend *be, const mt_model_config *cfg, const char *dir,
                       const mt_model_spec *spec, const mt_model_par *par);
// "expert e -> EP rank": the placement, one line per EP rank ("rank 0: experts 0,2,4,6").
void mt_model_placement(const mt_model *m, char *buf, size_t n);
// Collective over the EP group: EP rank 0 receives every other rank's trained expert tensors
// (LoRA A/B, or the weight itself) into tensors of its own, so that it can save the whole
// adapter or trained file; the other ranks only send. For the end of a run: the copies stay.
void mt_model_gather_experts(mt_model *m);
void mt_model_free(mt_model *m);
// Loads a PEFT adapter folder into the model's LoRAs (built with --mode lora and matching
// targets and rank); the adapter's alpha and dropout replace the run's. 0 or -1 with an error.
int mt_model_load_adapter(mt_model *m, const char *dir);
// The Linear of a module path ("model.layers.0.block_sparse_moe.experts.3.w1"), or NULL.
mt_linear *mt_model_find_linear(mt_model *m, const char *module);

// DeepSeek-V3's aux-loss-free balancing (model/router_balance.c): start counting each expert's
// tokens (0, or -1 for a family without e_score_correction_bias); after a step, the counts summed
// over `ranks` (NULL: this one), every layer's bias += rate · sign(mean − load), counting restarts.
// max_over_mean [layers] gets each layer's max/mean load of the step (0 for a dense layer).
int mt_model_bias_balance_start(mt_model *m);
int mt_model_bias_balance_step(mt_model *m, mt_comm *ranks, float rate, double *max_over_mean);
// The biases it moved, kept (a run's checkpoints and products): layer L's checkpoint name
// (model.layers.L.mlp.gate.e_score_correction_bias; -1 where the layer has none), the bias of a
// name (or NULL), and a file of them all (F32 [E] each; MT_SCORE_BIAS_FILE in an adapter folder).
// Loading refuses a tensor that is not a score bias of the model, by file and name.
#define MT_SCORE_BIAS_FILE "router_bias.safetensors"
int mt_model_score_bias_name(const mt_model *m, int L, char *name, size_t n);
mt_tensor *mt_model_score_bias_named(mt_model *m, const char *name);
int mt_model_save_score_biases(mt_model *m, const char *path);
int mt_model_load_score_biases(mt_model *m, const char *path);

// Outputs (model/save.c): a PEFT adapter folder of the LoRAs; the trained full-precision tensors
// under their checkpoint names (router, unfreeze, full modes), and that file read back.
int mt_model_save_adapter(mt_model *m, const char *dir, const char *base_model_name);  // v4 layout
// peft_format: MT_PEFT_V4 or MT_PEFT_V5 (lora/peft.h: per-expert or fused-expert layout).
int mt_model_save_adapter_as(mt_model *m, const char *dir, const char *base_model_name, int peft_format);
// 0 unless a LoRA with dropout would go to PEFT's target_parameters in every adapter layout
// (gpt-oss's experts and router, DeepSeek-style routers): PEFT refuses lora_dropout there, so the
// error names --dropout. With warn, a warning where only layout peft_format (v5) puts one there.
int mt_model_adapter_dropout_check(mt_model *m, int peft_format, int warn);
int mt_model_save_trained(mt_model *m, const char *path);
int mt_model_load_trained(mt_model *m, const char *path);

// Forward of one micro-batch with the loss; keeps what backward needs. 0 or -1 (bad tokens).
int mt_model_forward(mt_model *m, const mt_batch *b, mt_loss *out);
// The same for a training step, whose backward follows: with a frozen lm_head the loss's pass
// also makes the final hidden states' gradient, chunk by chunk, from the logits it has in hand
// (its 1/count scale applied by the backward, which then recomputes no logits).
int mt_model_forward_train(mt_model *m, const mt_batch *b, mt_loss *out);
// Backward of the last forward: accumulates every trainable's gradient.
void mt_model_backward(mt_model *m);
void mt_model_zero_grad(mt_model *m);
// The last forward's logits of rows [t0, t0 + n) into host out [n, V] fp32, computed again from
// the kept final-norm output (the loss never holds [T, V] logits: model/loss.c). 0 or -1.
int mt_model_logits(mt_model *m, int64_t t0, int64_t n, float *out);
// Rows of logits the fused loss computes at once for T tokens: LOSS_CHUNK_BYTES of fp32 logits
// (≤ 256 MB of loss scratch at V = 32000 for any T), or m->loss_chunk_rows when set (tests).
int64_t mt_loss_chunk_rows(const mt_model *m, int64_t T);

#ifdef __cplusplus
}
#endif
