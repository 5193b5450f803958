// scripts/step_model.h — the FLOPs and bytes of one QLoRA training step of a Mixtral-family
// model, op by op, for the roofline projection (scripts/roofline.c) and for bench_gpu.c's MFU and
// HFU: one model, so that the projection and the measurement count the same things.
//
// Conventions (docs/design.md, "GPU performance conventions"):
//   * N = matmul parameters active per token: mt_config_active_params less the input embedding
//     table (a lookup, no FLOPs; the lm_head, a GEMM, stays in); the norms' weights (0.27 M for
//     Mixtral-8x7B) stay in too, a 2e-5 error not worth a second convention.
//   * Model FLOPs per token = 4·N (2 forward + 2 for dx backward: the base is frozen, so no dW)
//     + causal attention 6·S·(heads·head_dim) per layer: forward QKᵀ and P·V each cost
//     2·hd per (query, key) pair and head, over S²/2 visible pairs per sequence, i.e.
//     2·S·d_attn per token; the textbook backward is twice that (dQ, dK, dV, dP). No credit for
//     the recompute or for LoRA's own FLOPs.
//   * Hardware FLOPs (HFU) = every FLOP the step executes as counted per op below: forward,
//     the recompute forward (--checkpointing full), backward dx, LoRA's 2 + 2 + 4 small GEMMs,
//     attention as today's tensor-core kernels run it (forward 2, recompute 2, backward 7 units
//     of S·d_attn per token: the dq kernel recomputes QKᵀ and dO·Vᵀ and runs dS·K, the dk/dv
//     kernel recomputes both again and runs Pᵀ·dO and dSᵀ·Q; the diagonal tiles' masked half,
//     ~64/S of the work, is not counted), one FLOP
//     per element for each dequantization (the scale multiply) of a whole W (attention's, the
//     experts' into their bf16 scratch), and the elementwise ops' few.
// Bytes are what each op reads and writes in device memory, every operand once per kernel
// (accumulating outputs read and written); L2 reuse inside a kernel (flash attention's K/V
// re-reads, GEMM tiles) is not traffic. Storage follows issue 12's dtype rule: bf16 activations,
// weights, LoRA and gradients; fp32 rstd, lse, router logits, lm_head logits, optimizer state.
#pragma once
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "model/config.h"
#include "model/spec.h"
#include "quant/qweight.h"

// STEP_GEMM: a cuBLASLt GEMM (its efficiency by shape, scripts/step_time.h); STEP_ATTN: the
// WMMA flash kernels; STEP_SDPA: cuDNN's SDPA; STEP_MEM: memory-bound kernels; STEP_DEQUANT: the
// experts' 4-bit -> bf16 dequantization kernel, bound by its bytes or by its instructions' issue
// slots.
typedef enum { STEP_GEMM, STEP_ATTN, STEP_MEM, STEP_SDPA, STEP_DEQUANT } step_class;

typedef struct {
    char name[48];
    char phase;         // 'F' forward, 'R' recompute forward, 'B' backward, 'O' optimizer
    double count;       // kernel calls (or GEMMs) in the step
    double flops, bytes;
    double m;           // GEMMs: rows per call (the M the efficiency depends on)
    double n, k;        // cuBLASLt GEMMs: the call's N and K (0: unknown, M alone decides)
    double instr;       // STEP_DEQUANT: thread instructions issued (SASS), whole step
    double imbalance;   // routed GEMMs: rows per call spread ±this around m (STEP_ROUTING_SPREAD)
    step_class cls;
} step_op;

typedef struct {
    mt_model_config cfg;
    int64_t batch, seq;
    int lora_r;
    unsigned targets;       // MT_TARGET_* bits with LoRA
    int quant_experts, quant_attn;  // frozen Linears stored 4-bit: dequantized to bf16 per use
    int dequant_cache;      // --dequant-cache on: attention's 4-bit W kept in bf16, never dequantized
    int expert_cache;       // --expert-cache: the last this many layers' experts kept in bf16, never
                            // dequantized after the first step (their LoRA blocks still written per call)
    mt_quant quant;
    int blocksize, double_quant;
    int recompute;          // --recompute full: one recompute forward of every layer (both parts)
    int recompute_attn, recompute_mlp;  // --recompute attention / experts: that part of every
                                        // layer recomputed (model/spec.h); `recompute` sets both
    int dequants_per_use;   // 1: every forward, recompute and backward call dequantizes
    // The experts: every 4-bit W dequantized to bf16 by a kernel (once in the forward, once in the
    // backward for its recompute and dx), then cuBLASLt GEMMs per expert, w1‖w3 as one of N = 2f,
    // LoRA through cuBLAS (model/grouped_cuda.cu). attn_cudnn 1: cuDNN's SDPA forward and
    // backward; 0: the WMMA flash kernels.
    int attn_cudnn;
    double dequant_instr;   // SASS instructions per element of the dequantization kernel (0: 8)
    double lora_dropout;    // > 0: the experts' LoRA dropout copies
} step_shape;

#define STEP_DEQUANT_INSTR_DEFAULT 8.0

enum { STEP_MAX_OPS = 64 };

// Routing is never exactly balanced: an expert's rows, assumed spread uniformly ±20% around the
// balanced T·k/E (the GEMMs' tile use averages over the spread, scripts/step_time.h).
#define STEP_ROUTING_SPREAD 0.20

typedef struct {
    step_op op[STEP_MAX_OPS];
    int n;
} step_ops;

static inline step_op *step_add(step_ops *s, const char *name, char phase, double count, double flops, double bytes,
                                double m, step_class cls) {
    static step_op sink;  // a row not added (count 0, table full): written to, never read
    if (s->n >= STEP_MAX_OPS || count <= 0) return &sink;
    step_op *o = &s->op[s->n++];
    memset(o, 0, sizeof *o);
    strncpy(o->name, name, sizeof o->name - 1);
    o->phase = phase, o->count = count, o->flops = flops, o->bytes = bytes, o->m = m, o->cls = cls;
    return o;
}

// A cuBLASLt GEMM row: rows M per call, N and K of each call (the efficiency's shape).
static inline void step_gemm(step_ops *s, const char *name, char phase, double count, double flops, double bytes,
                             double m, double n, double k) {
    step_op *o = step_add(s, name, phase, count, flops, bytes, m, STEP_GEMM);
    o->n = n, o->k = k;
}

// An expert GEMM row: its rows per call follow the routing.
static inline void step_expert_gemm(step_ops *s, const char *name, char phase, double count, double flops,
                                    double bytes, double m, double n, double k) {
    step_op *o = step_add(s, name, phase, count, flops, bytes, m, STEP_GEMM);
    o->n = n, o->k = k, o->imbalance = STEP_ROUTING_SPREAD;
}

// N: matmul parameters per token (see the conventions above).
static inline double step_matmul_params(const mt_model_config *c) {
    double embed_in = c->tie_word_embeddings ? 0.0 : (double)c->vocab * (double)c->hidden;
    return (double)mt_config_active_params(c) - embed_in;
}

// Model FLOPs per token at sequence length `seq`: 4·N + 6·S·d_attn per layer.
static inline double step_model_flops_per_token(const mt_model_config *c, int64_t seq) {
    return 4.0 * step_matmul_params(c) + 6.0 * (double)seq * (double)(c->heads * c->head_dim) * (double)c->layers;
}

// One LoRA pair on an [out, in] Linear over `rows` rows: forward x·Aᵀ then (xa)·Bᵀ added into y;
// backward dB, dxa, dA, and dx += dxa·A. `recompute`: the forward again in phase R. first_y,
// first_dx: the LoRA's product writes y (its dx) before the base GEMM adds onto it
// (model/experts_gpu.c's lora_first): written only, where an addition reads and writes it;
// first_y 2: B folded into the base GEMM (its FLOPs and bytes are that GEMM's): xa = x·Aᵀ alone;
// first_dx 2: its dx folded into the base GEMM (model/experts_gpu.c's w2 fold): no dx product
// here (the base GEMM's K carries it), dx neither read nor written, x read for dA only;
// first_dx 3: dxa made by the base dx GEMM (B beside W), dx += dxa·A after it.
// first_y 3, first_dx 4: as 2 and 3 for the second of a pair whose A lie in one matrix
// (model/experts_gpu.c's a13_paired: w3's beside w1's): its xa, dA and dx are its pair's products'
// rows and columns, so it reads no x of its own, and reads and writes no dx.
static inline void step_lora_ordered(step_ops *s, const char *name, double calls, double rows, double in, double out,
                                     double r, int recompute, int first_y, int first_dx) {
    const double bf = 2.0;
    double f_flops = 2.0 * rows * r * (in + (first_y >= 2 ? 0 : out));
    double f_bytes = first_y == 3   ? bf * (r * in + rows * r)
                     : first_y == 2 ? bf * (rows * in + r * in + rows * r)
                                    : bf * (rows * in + r * in + 2 * rows * r + r * out + (first_y ? 1 : 2) * rows * out);
    const int fold = first_dx == 2;
    double b_flops = 4.0 * rows * r * (in + out) - (fold ? 2.0 * rows * r * in : 0);
    // dB += dyᵀ·xa (dB read and written), dxa = dy·B, dA += dxaᵀ·x, dx += dxa·A (dx read and written).
    double b_bytes = bf * (rows * (2 * out + (fold ? 3 : 4) * r + (fold ? 1 : first_dx ? 2 : 3) * in) +
                           (fold ? 3 * r * out + 2 * r * in : 3 * r * (in + out)));
    if (first_dx >= 3) {  // dxa made by the base dx GEMM (B beside W): no dxa = dy·B of its own
        b_flops = 4.0 * rows * r * (in + out) - 2.0 * rows * r * out;
        b_bytes = bf * (rows * (out + 3 * r + (first_dx == 4 ? 0 : 3) * in) + 2 * r * out + 3 * r * in);
    }
    // The shape of the larger product (x·Aᵀ: N = r, K = in): LoRA's GEMMs are memory-bound.
    step_gemm(s, name, 'F', calls, f_flops * calls, f_bytes * calls, rows, r, in);
    if (recompute) step_gemm(s, name, 'R', calls, f_flops * calls, f_bytes * calls, rows, r, in);
    step_gemm(s, name, 'B', calls, b_flops * calls, b_bytes * calls, rows, r, in);
}

static inline void step_lora(step_ops *s, const char *name, double calls, double rows, double in, double out,
                             double r, int recompute) {
    step_lora_ordered(s, name, calls, rows, in, out, r, recompute, 0, 0);
}

// LoRA products of several Linears summed into one row per phase (the step profiles them as one).
static inline void step_lora_rows(step_ops *s, const step_ops *tmp, const char *name, double calls_div, double m) {
    const char phases[3] = {'F', 'R', 'B'};
    for (int p = 0; p < 3; p++) {
        double cnt = 0, fl = 0, by = 0, n = 0, k = 0;
        for (int i = 0; i < tmp->n; i++)
            if (tmp->op[i].phase == phases[p])
                cnt += tmp->op[i].count, fl += tmp->op[i].flops, by += tmp->op[i].bytes, n = tmp->op[i].n,
                k = fmax(k, tmp->op[i].k);
        step_gemm(s, name, phases[p], cnt / calls_div, fl, by, m, n, k);
    }
}

// The step, op by op. Row names are the step's profile rows (core/profile.h mt_prof_push), so a
// measured step lands beside this line by line (scripts/profile_table.h). Phase R holds the
// parts --recompute recomputes: the attention part (ln1 to h: norm, q, k, v, RoPE, attention, o,
// the first residual add) and the MLP part (ln2 onwards: norm, router, the gather, the experts;
// a replay combines nothing and makes no layer output).
static inline void step_build(const step_shape *sh, step_ops *s) {
    const mt_model_config *c = &sh->cfg;
    const double bf = 2.0, f32 = 4.0;
    const double T = (double)(sh->batch * sh->seq), S = (double)sh->seq, L = (double)c->layers;
    const double h = (double)c->hidden, f = (double)c->intermediate, E = (double)c->experts, K = (double)c->top_k;
    const double V = (double)c->vocab, H = (double)c->heads, dq = (double)(c->heads * c->head_dim);
    const double dkv = (double)(c->kv_heads * c->head_dim), r = (double)sh->lora_r;
    const double Tk = T * K, Me = Tk / E;  // expert rows: every token k times, spread evenly (assumed)
    const int RA = sh->recompute || sh->recompute_attn, RM = sh->recompute || sh->recompute_mlp;
    // The backward stops early in the lowest layer: nothing below it trains (the embedding is
    // frozen), so its ln1 and q, k, v dx are never made and, with no adapter in its attention,
    // neither its attention's backward nor its MLP part's input gradient (the router's dx, w1‖w3's
    // dx and its dequantization): Lb layers run those (the H200's profile, 2026-11-27: 3 of 4). Not
    // modelled: an adapter on o alone (the step then skips the attention backward too).
    const int attn_lora = (sh->targets & MT_TARGET_ATTN) != 0;
    const double Lb = attn_lora ? L : L - 1;
    memset(s, 0, sizeof *s);

    step_add(s, "embedding", 'F', 1, 0, 2 * bf * T * h, T, STEP_MEM);

    // Two RMSNorms per layer and the final one (not recomputed: it is outside the layers); a
    // recomputed part runs its own again.
    double nf_b = 2 * bf * T * h + f32 * T, nb_b = 4 * bf * T * h + f32 * T, nR = (double)(RA + RM) * L;
    step_add(s, "rmsnorm", 'F', 2 * L + 1, 4 * T * h * (2 * L + 1), nf_b * (2 * L + 1), T, STEP_MEM);
    step_add(s, "rmsnorm", 'R', nR, 4 * T * h * nR, nf_b * nR, T, STEP_MEM);
    const double nB = 2 * L + 1 - (attn_lora ? 1 : 2);
    step_add(s, "rmsnorm", 'B', nB, 6 * T * h * nB, nb_b * nB, T, STEP_MEM);

    // Attention projections: q, k, v as three GEMMs reading x each; o. Base frozen: backward is dx
    // only. The shapes: q's (N = dq, K = h) stands for the three.
    const double nqkv = dq + 2 * dkv;
    double qkv_f = 2 * T * h * nqkv, qkv_fb = bf * (h * nqkv + 3 * T * h + T * nqkv);
    double qkv_bb = bf * (h * nqkv + T * nqkv + 3 * 2 * T * h);
    step_gemm(s, "q,k,v GEMMs", 'F', 3 * L, qkv_f * L, qkv_fb * L, T, dq, h);
    if (RA) step_gemm(s, "q,k,v GEMMs", 'R', 3 * L, qkv_f * L, qkv_fb * L, T, dq, h);
    step_gemm(s, "q,k,v GEMMs (dx)", 'B', 3 * (L - 1), qkv_f * (L - 1), qkv_bb * (L - 1), T, h, dq);
    double o_f = 2 * T * dq * h, o_fb = bf * (dq * h + T * dq + T * h), o_bb = bf * (dq * h + T * h + 2 * T * dq);
    step_gemm(s, "o GEMM", 'F', L, o_f * L, o_fb * L, T, h, dq);
    if (RA) step_gemm(s, "o GEMM", 'R', L, o_f * L, o_fb * L, T, h, dq);
    step_gemm(s, "o GEMM (dx)", 'B', Lb, o_f * Lb, o_bb * Lb, T, dq, h);
    if (sh->targets & MT_TARGET_ATTN) {
        // Per adapted projection; q, k, v, o have (in, out) = (h, dq), (h, dkv), (h, dkv), (dq, h).
        step_ops tmp;
        memset(&tmp, 0, sizeof tmp);
        const unsigned bits[4] = {MT_TARGET_Q, MT_TARGET_K, MT_TARGET_V, MT_TARGET_O};
        const double ins[4] = {h, h, h, dq}, outs[4] = {dq, dkv, dkv, h};
        for (int i = 0; i < 4; i++)
            if (sh->targets & bits[i]) step_lora(&tmp, "x", L, T, ins[i], outs[i], r, RA);
        step_lora_rows(s, &tmp, "LoRA q,k,v,o", 1, T);
    }

    double rope_b = 2 * bf * T * (dq + dkv), rope_f = 6 * T * (dq + dkv) / 2;
    step_add(s, "rope (q, k)", 'F', L, rope_f * L, rope_b * L, T, STEP_MEM);
    if (RA) step_add(s, "rope (q, k)", 'R', L, rope_f * L, rope_b * L, T, STEP_MEM);
    step_add(s, "rope (q, k)", 'B', Lb, rope_f * Lb, rope_b * Lb, T, STEP_MEM);

    // Attention, causal: forward 2·T·S·d_attn (QKᵀ and P·V over the visible half). Backward as
    // the kernels run it: the WMMA pair 7 units (the dq kernel recomputes QKᵀ and dO·Vᵀ and runs
    // dS·K, the dk/dv kernel recomputes both and runs Pᵀ·dO and dSᵀ·Q); cuDNN's (FlashAttention-2's
    // algorithm, one pass) 5 units: QKᵀ again, dO·Vᵀ, dV, dQ, dK. Bytes: q, k, v, out once each
    // (K/V re-reads per query block are L2 traffic), lse; backward D, dq, dk, dv read and written.
    double at_fb = bf * (2 * T * dq + 2 * T * dkv) + f32 * T * H;
    double at_bb = bf * (3 * T * dq + 2 * T * dkv + T * dq + 2 * T * dkv) + f32 * 2 * T * H;
    const char *att_f = sh->attn_cudnn ? "attention fwd (cuDNN SDPA)" : "attention fwd (wmma bf16)";
    const char *att_b = sh->attn_cudnn ? "attention bwd (cuDNN SDPA)" : "attention bwd (wmma bf16)";
    step_class ac = sh->attn_cudnn ? STEP_SDPA : STEP_ATTN;
    double bwd_units = sh->attn_cudnn ? 5 : 7;
    step_add(s, att_f, 'F', L, 2 * T * S * dq * L, at_fb * L, T, ac);
    if (RA) step_add(s, att_f, 'R', L, 2 * T * S * dq * L, at_fb * L, T, ac);
    step_add(s, att_b, 'B', Lb, bwd_units * T * S * dq * Lb, at_bb * Lb, T, ac);

    // Router: x·Wgᵀ to fp32 logits, softmax and top-k (folded in); backward dx = dlogits·Wg.
    double ro_f = 2 * T * h * E, ro_fb = bf * (T * h + E * h) + f32 * (2 * T * E) + (f32 + 4) * Tk;
    double ro_bb = f32 * 2 * T * E + bf * (E * h + 2 * T * h);
    // Three launches a layer: the GEMM, the top-k, the aux statistics (a replay: the weights).
    step_gemm(s, "router GEMM + top-k", 'F', 3 * L, ro_f * L, ro_fb * L, T, E, h);
    if (RM) step_gemm(s, "router GEMM + top-k", 'R', 3 * L, ro_f * L, ro_fb * L, T, E, h);
    step_gemm(s, "router GEMM (dx)", 'B', Lb, ro_f * Lb, ro_bb * Lb, T, h, E);
    if (sh->targets & MT_TARGET_GATE) step_lora(s, "LoRA gate", L, T, h, E, r, RM);

    // Tokens to expert rows (each token k times) and back, weighted by the router; a replay
    // gathers only. Backward: the combine's reads dout (T·h) and ys, writes dys (Tk·h each); the
    // gather's reads dxs and writes dx (both write their outputs whole: nothing zeroed or re-read).
    double pc_fb = bf * (2 * Tk * h + Tk * h + T * h), pc_bb = bf * (3 * Tk * h + 2 * T * h);
    step_add(s, "permute/gather + combine", 'F', 2 * L, 2 * Tk * h * L, pc_fb * L, Tk, STEP_MEM);
    if (RM) step_add(s, "permute/gather + combine", 'R', L, 0, bf * 2 * Tk * h * L, Tk, STEP_MEM);
    step_add(s, "permute/gather + combine", 'B', 2 * L, 4 * Tk * h * L, pc_bb * L, Tk, STEP_MEM);

    // Dequantization. Attention's 4-bit q, k, v, o to bf16 once per use (forward, recompute,
    // backward), unless their bf16 copies are kept (--dequant-cache: made once at load). The experts (model/grouped_cuda.cu): each expert's w1‖w3 and w2 whole into a bf16
    // scratch slot per use: the forward, the recompute when the experts are recomputed, the
    // backward's dx (1 FLOP an element, the scale; bytes: 4-bit in with its constants, bf16 out).
    const char phases[3] = {'F', 'R', 'B'};
    // w1's and w3's LoRA B fold into the forward's base GEMM (model/experts_gpu.c
    // mt_experts_xs_extra): gu = [x | xa1 | xa3]·[[W1 | s·B1 | 0]; [W3 | 0 | s·B3]]ᵀ, K = h + 2r.
    const int fold13 = sh->quant_experts && (sh->targets & MT_TARGET_W1) &&
                       (sh->targets & MT_TARGET_W3) && sh->lora_r % 8 == 0 && c->hidden % 8 == 0;
    // w2's LoRA B folds into the forward's w2 GEMM (mt_experts_a_extra): ys = [a | xa2]·[W2 | s·B2]ᵀ,
    // K = f + r.
    const int fold2f = sh->quant_experts && (sh->targets & MT_TARGET_W2) && sh->lora_r % 8 == 0 &&
                       c->intermediate % 8 == 0;
    for (int p = 0; p < 3; p++) {
        int attn_r = phases[p] != 'R' || RA, mlp_r = phases[p] != 'R' || RM;
        if (sh->quant_experts && mlp_r) {
            double in = (double)mt_qweight_dequant_bytes_of(sh->quant, c->intermediate, c->hidden, sh->blocksize,
                                                            sh->double_quant, MT_BF16);  // one [f, h] matrix
            double instr = sh->dequant_instr > 0 ? sh->dequant_instr : STEP_DEQUANT_INSTR_DEFAULT;
            // The backward's: w2 in every layer, w1‖w3 in the Lb that make dx (the lowest layer skips
            // it). The kept layers (--expert-cache, the top Lc) dequantize nothing.
            const double Lc = fmin((double)sh->expert_cache, L), Lu = L - Lc;
            double mats = phases[p] == 'B' ? E * (Lu + 2 * fmax(0, Lb - Lc)) : 3 * E * Lu;
            // w2's LoRA A copied under each W2 for the backward's folded dx GEMM: read and written;
            // w1's and w3's B beside [W1;W3] for the forward's folded GEMM: read, and written with
            // the zeros of the other block (2f rows of 2r columns).
            double under = phases[p] == 'B' && (sh->targets & MT_TARGET_W2) && !(sh->lora_dropout > 0)
                               ? 2 * bf * E * L * r * f : 0;
            if (fold13) under += bf * E * (phases[p] == 'B' ? Lb : L) * 6 * f * r;  // the B phase's: dx's
            if (fold2f && phases[p] != 'B') under += bf * E * L * 2 * h * r;  // B2 beside W2: read, written
            step_op *o = step_add(s, "expert dequant 4-bit->bf16", phases[p], phases[p] == 'B' ? E * (Lu + fmax(0, Lb - Lc)) : 2 * E * Lu,
                                  h * f * mats, mats * in + under, 0, STEP_DEQUANT);
            o->instr = instr * h * f * mats;
        }
        if (sh->quant_attn && !sh->dequant_cache && attn_r) {
            double by = 0;
            const int64_t ins[4] = {c->hidden, c->hidden, c->hidden, c->heads * c->head_dim};
            const int64_t outs[4] = {c->heads * c->head_dim, c->kv_heads * c->head_dim, c->kv_heads * c->head_dim,
                                     c->hidden};
            for (int i = 0; i < 4; i++)
                by += (double)mt_qweight_dequant_bytes_of(sh->quant, outs[i], ins[i], sh->blocksize, sh->double_quant,
                                                          MT_BF16);
            double n = (phases[p] == 'B' ? Lb : L) * sh->dequants_per_use;
            step_add(s, "dequant NF4->bf16 q,k,v,o", phases[p], 4 * n, (h * nqkv + dq * h) * n, by * n, 0, STEP_MEM);
        }
    }

    // Experts. W's bytes: bf16, the dequantization's scratch read back (or the weight, not quantized).
    double w_f_h = bf * f * h;  // one [f, h] matrix
    const double k13 = h + (fold13 ? 2 * r : 0);  // the forward's K: the folded B's columns beside W
    double e13_ff = 2 * Tk * k13 * 2 * f, e13_ffb = 2 * E * w_f_h * k13 / h + bf * (Tk * k13 + Tk * 2 * f);
    const double k2 = f + (fold2f ? r : 0);  // the forward's K: w2's folded B beside W2
    double e2_f = 2 * Tk * k2 * h, e2_fb = E * w_f_h * k2 / f + bf * (Tk * k2 + Tk * h);
    double e2_bb = E * w_f_h + bf * (Tk * h + Tk * f);
    double e2_bf = 2 * Tk * f * h;  // the backward's: w2's LoRA may fold into it (A2 under W2)
    double sw_fb = bf * 3 * Tk * f, sw_bb = bf * (3 * Tk * f + 2 * Tk * f);  // dgu written over gu
    // cuBLAS experts whose LoRAs cover w1 and w3 (w2): the LoRA writes gu (ys; in the backward da)
    // first and the base GEMM reads it back as its C (model/experts_gpu.c's lora_first).
    const unsigned t = sh->targets;
    const int first13 = (t & MT_TARGET_W1) && (t & MT_TARGET_W3), first2 = (t & MT_TARGET_W2) != 0;
    // w2's LoRA without dropout folds into the dx GEMM: da = [dys | dxa]·[W2; A2], K = h + r.
    const int fold2 = first2 && sh->quant_experts && !(sh->lora_dropout > 0);  // mt_experts_dys_extra: 4-bit W2
    if (first13 && !fold13) e13_ffb += bf * Tk * 2 * f;
    // Backward: w1's LoRA writes dxs first (its dx), the base dx GEMM then reads it back as C;
    // folded, the base dx GEMM writes it first (with the LoRAs' dxa beside).
    const int first_dx1 = (t & MT_TARGET_W1) && !fold13;
    if (first2 && !fold2f) e2_fb += bf * Tk * h;
    if (fold2) e2_bf += 2 * Tk * r * f, e2_bb += bf * (Tk * r + E * r * f);
    else if (first2) e2_bb += bf * Tk * f;
    // Per expert: w1‖w3 as one GEMM (N = 2f), dx as one (K = 2f, written once); dx makes
    // [dx | dxa1 | dxa3] = dgu·[[W1 | s·B1 | 0]; [W3 | 0 | s·B3]] when they fold (N = h + 2r).
    const double e13_bb = 2 * E * w_f_h * k13 / h + bf * (Tk * 2 * f + (first_dx1 ? 2 * Tk * h : Tk * k13));
    step_expert_gemm(s, "expert GEMM w1+w3 (cuBLAS)", 'F', E * L, e13_ff * L, e13_ffb * L, Me, 2 * f, k13);
    if (RM) step_expert_gemm(s, "expert GEMM w1+w3 (cuBLAS)", 'R', E * L, e13_ff * L, e13_ffb * L, Me, 2 * f, k13);
    step_expert_gemm(s, "expert GEMM w1+w3 (dx, cuBLAS)", 'B', E * Lb, e13_ff * Lb, e13_bb * Lb, Me, k13, 2 * f);
    step_add(s, "SwiGLU", 'F', L, 8 * Tk * f * L, sw_fb * L, Tk, STEP_MEM);
    if (RM) step_add(s, "SwiGLU", 'R', L, 8 * Tk * f * L, sw_fb * L, Tk, STEP_MEM);
    step_add(s, "SwiGLU", 'B', L, 12 * Tk * f * L, sw_bb * L, Tk, STEP_MEM);
    step_expert_gemm(s, "expert GEMM w2 (cuBLAS)", 'F', E * L, e2_f * L, e2_fb * L, Me, h, k2);
    if (RM) step_expert_gemm(s, "expert GEMM w2 (cuBLAS)", 'R', E * L, e2_f * L, e2_fb * L, Me, h, k2);
    step_expert_gemm(s, "expert GEMM w2 (dx, cuBLAS)", 'B', E * L, e2_bf * L, e2_bb * L, Me, f, h + (fold2 ? r : 0));
    if (sh->targets & MT_TARGET_EXPERTS) {
        step_ops tmp;
        memset(&tmp, 0, sizeof tmp);
        const int y13 = fold13 ? 2 : first13;
        // w1's and w3's A as one matrix (their LoRAs made as a pair, no dropout): w3's products are
        // w1's (model/experts_gpu.c's a13_paired)
        const int pair13 = fold13 && !(sh->lora_dropout > 0);
        if (t & MT_TARGET_W1) step_lora_ordered(&tmp, "x", E * L, Me, h, f, r, RM, y13, fold13 ? 3 : first_dx1);
        if (t & MT_TARGET_W3) {
            const int first = tmp.n;
            step_lora_ordered(&tmp, "x", E * L, Me, h, f, r, RM, pair13 ? 3 : y13, pair13 ? 4 : fold13 ? 3 : 0);
            // paired: no forward launch of its own (x·[A1; A3]ᵀ is w1's); its backward has dB3's,
            // and where no dx is wanted (the lowest layer without attention adapters: L - Lb of
            // them) the step's backward goes unpaired, dA3 reading x itself
            for (int i = first; pair13 && i < tmp.n; i++) {
                if (tmp.op[i].phase == 'B') tmp.op[i].bytes += bf * E * (L - Lb) * Me * h;
                else tmp.op[i].count = 0;
            }
        }
        if (t & MT_TARGET_W2)
            step_lora_ordered(&tmp, "x", E * L, Me, f, h, r, RM, fold2f ? 2 : first2, fold2 ? 2 : first2);
        // One launch for all E experts: cuBLAS's grouped GEMM.
        step_lora_rows(s, &tmp, "LoRA experts w1,w3,w2 (cuBLAS)", E, Me);
        // Dropout on the LoRA input: a masked copy of each adapted Linear's input rows (h for
        // w1, w3, f for w2) in every forward, and the f32 product it masks in the backward.
        double drop_in = 0;
        if (sh->targets & MT_TARGET_W1) drop_in += h;
        if (sh->targets & MT_TARGET_W3) drop_in += h;
        if (sh->targets & MT_TARGET_W2) drop_in += f;
        if (sh->lora_dropout > 0) {
            double fb = 2 * bf * Tk * drop_in, bb = (bf + 2 * f32) * Tk * drop_in;  // read, write; f32 product
            step_add(s, "LoRA dropout copy", 'F', 3 * E * L, Tk * drop_in * L, fb * L, Tk, STEP_MEM);
            if (RM) step_add(s, "LoRA dropout copy", 'R', 3 * E * L, Tk * drop_in * L, fb * L, Tk, STEP_MEM);
            step_add(s, "LoRA dropout copy", 'B', 3 * E * L, Tk * drop_in * L, bb * L, Tk, STEP_MEM);
        }
    }

    // Residual adds, two per layer forward (the backward passes gradients through by
    // accumulation); a replay makes h only (the attention part's add).
    step_add(s, "residual adds", 'F', 2 * L, 2 * T * h * L, 2 * 3 * bf * T * h * L, T, STEP_MEM);
    if (RA) step_add(s, "residual adds", 'R', L, T * h * L, 3 * bf * T * h * L, T, STEP_MEM);

    // lm_head (frozen bf16) to fp32 logits a chunk of rows at a time (model/loss.c): a training
    // forward takes the loss, writes each chunk's gradient over its logits and takes dx =
    // dlogits·W at once (the backward only scales dx). The logits [T, V] never exist whole;
    // their bytes still move.
    step_gemm(s, "lm_head GEMM + loss", 'F', 1, 2 * T * h * V + 3 * T * V, bf * (V * h + T * h) + 2 * f32 * T * V, T,
              V, h);
    step_add(s, "cross-entropy gradient", 'F', 1, 3 * T * V, 2 * f32 * T * V, T, STEP_MEM);
    step_gemm(s, "lm_head GEMM (dx)", 'F', 1, 2 * T * h * V, bf * (V * h + 2 * T * h) + f32 * T * V, T, h, V);

    // AdamW on the LoRA parameters: bf16 param and grad, fp32 m, v and master, read and written,
    // and the gradient zeroed: 2+2+4+4+4 read, 2+4+4+4 written, 2 zeroed = 32 bytes a parameter.
    double P = 0;
    const unsigned eb[3] = {MT_TARGET_W1, MT_TARGET_W3, MT_TARGET_W2};
    for (int i = 0; i < 3; i++)
        if (sh->targets & eb[i]) P += L * E * r * (h + f);
    if (sh->targets & MT_TARGET_Q) P += L * r * (h + dq);
    if (sh->targets & MT_TARGET_K) P += L * r * (h + dkv);
    if (sh->targets & MT_TARGET_V) P += L * r * (h + dkv);
    if (sh->targets & MT_TARGET_O) P += L * r * (dq + h);
    if (sh->targets & MT_TARGET_GATE) P += L * r * (h + E);
    step_add(s, "AdamW", 'O', 1, 15 * P, 32 * P, 0, STEP_MEM);
}

// Hardware FLOPs of the step: the sum over its ops.
static inline double step_hw_flops(const step_ops *s) {
    double x = 0;
    for (int i = 0; i < s->n; i++) x += s->op[i].flops;
    return x;
}

// LoRA parameters the optimizer updates (from the AdamW row's bytes, 32 a parameter).
static inline double step_lora_params(const step_ops *s) {
    for (int i = 0; i < s->n; i++)
        if (s->op[i].phase == 'O') return s->op[i].bytes / 32.0;
    return 0;
}
