// model/spec.h — what model to build from a checkpoint: the training mode, what trains (LoRA
// targets, layers, experts), the frozen base's format and activation recomputation. The CLI fills
// it from its run options (trainer/options.c: mt_run_opts_model_spec); the model keeps a copy.
#pragma once
#include <stdint.h>

#include "core/index_set.h"
#include "quant/formats.h"  // mt_quant

#ifdef __cplusplus
extern "C" {
#endif

typedef enum { MT_MODE_LORA, MT_MODE_ROUTER, MT_MODE_UNFREEZE, MT_MODE_FULL } mt_mode;
// Activation recomputation (--recompute): which part of each layer the backward recomputes
// instead of keeping from the forward. The attention part is ln1 to h (norm, q, k, v, RoPE,
// attention, o); the MLP part is ln2 onwards (norm, router, experts, a dense MLP or shared
// expert). AUTO is the trainer's and the planner's to resolve (mt_ckpt_resolve in plan/): the
// least recomputation whose measured step fits; a model never sees it.
typedef enum { MT_CKPT_FULL, MT_CKPT_NONE, MT_CKPT_ATTENTION, MT_CKPT_EXPERTS, MT_CKPT_AUTO } mt_ckpt;
// Whether a mode recomputes the attention part / the MLP part.
static inline int mt_ckpt_attention(mt_ckpt c) { return c == MT_CKPT_FULL || c == MT_CKPT_ATTENTION; }
static inline int mt_ckpt_mlp(mt_ckpt c) { return c == MT_CKPT_FULL || c == MT_CKPT_EXPERTS; }
// "none", "attention", "experts", "full", "auto".
const char *mt_ckpt_name(mt_ckpt c);

// LoRA targets, as bits.
enum {
    MT_TARGET_W1 = 1 << 0, MT_TARGET_W2 = 1 << 1, MT_TARGET_W3 = 1 << 2,
    MT_TARGET_GATE = 1 << 3,  // the router
    MT_TARGET_Q = 1 << 4, MT_TARGET_K = 1 << 5, MT_TARGET_V = 1 << 6, MT_TARGET_O = 1 << 7,
    MT_TARGET_EXPERTS = MT_TARGET_W1 | MT_TARGET_W2 | MT_TARGET_W3,
    MT_TARGET_ATTN = MT_TARGET_Q | MT_TARGET_K | MT_TARGET_V | MT_TARGET_O,
};

typedef struct mt_model_spec {
    mt_mode mode;
    int lora_r;
    double lora_alpha;        // NaN: r (mt_model_spec_lora_alpha)
    double lora_dropout;
    int use_rslora;
    unsigned targets;         // MT_TARGET_* bits (lora mode)
    mt_index_set layers;      // layers that train
    mt_index_set experts;     // experts that train
    mt_quant quant;           // format of the frozen Linears quant_targets names
    int double_quant;
    int quant_blocksize;      // 0: the format's default (64 NF4/FP4, 128 INT4)
    unsigned quant_targets;   // MT_QTARGET_* bits (quant/quant.h)
    mt_ckpt checkpointing;    // what the backward recomputes (never MT_CKPT_AUTO: resolved before)
    int dequant_cache;        // GPU step: a bf16 copy of each frozen 4-bit Linear outside the experts,
                              // made once at build, instead of a dequantization per use (--dequant-cache)
    int expert_cache;         // GPU step: the last this many MoE layers keep their frozen 4-bit experts
                              // in bf16, dequantized once (--expert-cache; never auto here: resolved before)
    uint64_t seed;            // random weights (no checkpoint) and LoRA init
} mt_model_spec;

const char *mt_mode_name(mt_mode m);
// The LoRA alpha: lora_alpha, or r when it was not given (NaN).
double mt_model_spec_lora_alpha(const mt_model_spec *s);

#ifdef __cplusplus
}
#endif
