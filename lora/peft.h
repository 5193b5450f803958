// lora/peft.h — reading and writing PEFT LoRA adapter folders (docs/formats.md "PEFT adapters"): adapter_config.json and
// adapter_model.safetensors with keys "base_model.model.<module>.lora_{A,B}.weight".
#pragma once
#include "core/safetensors.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct mt_peft_config {
    int r;
    double lora_alpha;
    double lora_dropout;
    int use_rslora;
    // v5 fused experts (rank_pattern): the rank of gate_up_proj / down_proj's per-expert blocks,
    // 0 when it is r. alpha_pattern must keep their scale equal to the adapter's.
    int r_gate_up, r_down;
} mt_peft_config;

// The two adapter layouts (docs/formats.md "Layout v4", "Layout v5"): v4 per-expert Linears (transformers 4.x),
// v5 fused experts through target_parameters (transformers 5.x).
typedef enum { MT_PEFT_V4 = 4, MT_PEFT_V5 = 5 } mt_peft_format;

// Called once per adapted module with its A [r, in] and B [out, r] tensors (any float dtype).
// Return non-zero (with mt_error_set) to stop.
typedef int (*mt_peft_pair_fn)(void *ctx, const char *module, const mt_st_tensor *a,
                               const mt_st_tensor *b);

// Reads the folder's config and walks its adapter pairs. Errors name the file and the key:
// a lora_A without its lora_B, an unknown key form, a rank that differs from the config's r
// (rank_pattern only for v5 fused experts with an unchanged scale), DoRA or bias terms.
// Both layouts: a v5 adapter's fused experts are split into per-expert v4 pairs
// ("model.layers.L.block_sparse_moe.experts.E.w1", A [r, in], B [out, r], F32) and its router
// "mlp.gate" is reported as "block_sparse_moe.gate"; an expert whose A and B are all zero (not
// trained) is not reported.
int mt_peft_read(const char *dir, mt_peft_config *cfg, mt_peft_pair_fn fn, void *ctx);
// How a family's fused gate_up_proj orders its output rows (the one thing a fused adapter's tensors
// do not say): gate rows then up rows (transformers 5's Mixtral, Qwen, OLMoE, DeepSeek-style), or
// interleaved, gate in the even rows and up in the odd (gpt-oss: gate_up[..., ::2], [..., 1::2]).
typedef struct mt_peft_layout {
    int gate_up_interleaved;
} mt_peft_layout;
// mt_peft_read for a family's layout (NULL: gate rows then up rows, as mt_peft_read).
int mt_peft_read_as(const char *dir, const mt_peft_layout *layout, mt_peft_config *cfg, mt_peft_pair_fn fn, void *ctx);
// adapter_config.json's text (len bytes; `path` names it in errors): r an integer in
// 1..MT_PEFT_MAX_R, lora_alpha in (0, 1e6], lora_dropout in [0, 1), target_modules not empty.
#define MT_PEFT_MAX_R 65536
int mt_peft_config_parse(const char *text, size_t len, const char *path, mt_peft_config *cfg);
// "base_model.model.<module>.lora_A.weight" -> module (cap bytes) and 'A' / 'B'; 0 when it is
// such a key, -1 otherwise.
int mt_peft_split_key(const char *key, char *module, size_t cap, char *which);

// ---------------------------------------------------------------------------------------------
// Writing (lora/peft_write.c)

// PEFT's target_modules for the adapted subset of a model's Linear module paths all[0..n): per
// leaf name ("q_proj", "w1", ...; in order of first appearance) the leaf itself when every module
// carrying it is adapted, else the full paths of its adapted modules. Never a regular expression:
// PEFT's v4->v5 converter rewrites lists entry by entry but can only guess at a regex.
typedef struct mt_peft_targets {
    int n;
    char **names;
} mt_peft_targets;
// 0, or -1 with an error when nothing is adapted.
int mt_peft_targets_make(mt_peft_targets *t, const char *const *all, size_t n,
                         const unsigned char *adapted);
void mt_peft_targets_free(mt_peft_targets *t);

// One adapted module to write: A [r, in], B [out, r] (f32), given directly or through fill.
typedef struct mt_peft_module {
    const char *module;  // "model.layers.0.block_sparse_moe.experts.3.w1"
    int64_t in, out;
    const float *a, *b;  // host data, or NULL: fill provides it
} mt_peft_module;
// Fills dst (f32, A: r·in or B: out·r elements) for module i; which is 'A' or 'B'. 0, or
// non-zero after mt_error_set() to abandon the write.
typedef int (*mt_peft_fill_fn)(void *ctx, size_t i, char which, float *dst);

// Writes the adapter folder `dir` (created if missing): adapter_model.safetensors (F32,
// "base_model.model.<module>.lora_A.weight" / ".lora_B.weight", metadata {"format":"pt"}), then
// adapter_config.json (PEFT's LoraConfig fields, json.dumps(indent=2, sort_keys=True)), each
// file atomically (temporary + rename). base_model may be NULL (written as null).
int mt_peft_write(const char *dir, const mt_peft_config *cfg, const mt_peft_targets *targets,
                  const char *base_model, const mt_peft_module *mods, size_t n,
                  mt_peft_fill_fn fill, void *ctx);
// mt_peft_write for the v4 layout of a model whose Linears are all[0..n_all) (module paths, adapted[i]
// set for those in mods), with target_modules made by mt_peft_targets_make; except that the
// Linears whose leaf is param_leaf (not NULL) go to target_parameters as "<entry>.weight": a
// router transformers 4 keeps as a bare parameter (DeepSeek-style, gpt-oss), which PEFT's
// target_modules refuses ("... is not supported") and its ParamWrapper adapts (keys unchanged).
int mt_peft_write_v4(const char *dir, const mt_peft_config *cfg, const char *base_model, const char *const *all,
                     const unsigned char *adapted, size_t n_all, const char *param_leaf, const mt_peft_module *mods,
                     size_t n, mt_peft_fill_fn fill, void *ctx);
// The adapter_config.json text alone (malloc'ed, NUL-terminated; the caller frees).
char *mt_peft_config_json(const mt_peft_config *cfg, const mt_peft_targets *targets,
                          const char *base_model);

// adapter_config.json from rendered JSON values (target_parameters NULL: the key is left out;
// rank_pattern / alpha_pattern NULL: {}), and the helpers that render them (malloc'ed):
// a list of strings at the config's indentation ("null" when n is 0) and one string.
char *mt_peft_config_json_ex(const mt_peft_config *cfg, const char *target_modules,
                             const char *target_parameters, const char *rank_pattern,
                             const char *alpha_pattern, const char *base_model);
char *mt_peft_json_list(const char *const *names, int n);
char *mt_peft_json_string(const char *s);

// The model a v5 adapter is written for: its counts, the v4 names of its MoE parts (from the
// family table, model/family.h) and every Linear it has (v4 module paths) with which are adapted.
typedef struct mt_peft_v5_model {
    int layers, experts;
    const char *moe_module;       // "block_sparse_moe" (Mixtral) / "mlp" (Qwen2/3-MoE, OLMoE)
    const char *router;           // "gate" (gpt-oss: "router"); transformers 5 names it mlp.<router>
    const char *expert[3];        // an expert's gate, down, up: "w1","w2","w3" / "gate_proj",...
    const char *const *linears;   // [n_linears] "model.layers.0.self_attn.q_proj", ..., "lm_head"
    const unsigned char *adapted; // [n_linears] 1: has a LoRA (one of mods)
    size_t n_linears;
    int gate_up_interleaved;      // gate_up_proj's rows: gate in the even, up in the odd (gpt-oss)
} mt_peft_v5_model;

// The v5 layout (lora/peft_v5.c) of the same v4 modules (names as in mt_peft_module, in the
// model's v4 names, "model.layers.L.<moe_module>.experts.E.<expert[i]>"), the same for every
// family (transformers 5 names every MoE block "mlp"): the router as "mlp.<router>" through
// target_parameters "<router>.weight"; per layer the experts' gate+up fused into
// "mlp.experts.gate_up_proj" (rank 2r: A rows e·2r.., gate's then up's; B block-diagonal,
// columns k·E+e, rows gate's then up's or, gate_up_interleaved, 2i and 2i+1) and down into
// "mlp.experts.down_proj" (rank r), experts not adapted as zeros. gpt-oss's [E, H, 2f] and
// [E, f, H] (x·W, is_transposed) take the same A [R·E, in] and B [out, R·E] as the others'
// [E, 2f, H] and [E, H, f] (PEFT swaps in and out for those), so only the row order differs.
// With both in a layer, down_proj is the outer ParamWrapper ("mlp.experts.lora_A") and
// gate_up_proj the inner ("mlp.experts.base_layer.lora_A"). Every other Linear keeps its name:
// in target_modules, except one whose leaf is an expert's or the router's (a shared expert's or
// dense MLP's gate_proj): that one through target_parameters "<path>.weight", because PEFT's
// v4->v5 config converter rewrites such target_modules entries into the fused parameters.
// Target lists name full paths only where a leaf is adapted in some modules and not others.
int mt_peft_write_v5(const char *dir, const mt_peft_config *cfg, const char *base_model,
                     const mt_peft_v5_model *model, const mt_peft_module *mods, size_t n,
                     mt_peft_fill_fn fill, void *ctx);
// (peft.c's reader) One fused expert tensor pair of a v5 adapter in `path` — gate_up (1) or
// down (0) of the layer whose module prefix is "model.layers.L" — split into per-expert pairs.
int mt_peft_v5_experts(const char *path, const mt_peft_config *cfg, const mt_peft_layout *layout, const char *prefix,
                       int gate_up, const mt_st_tensor *a, const mt_st_tensor *b, mt_peft_pair_fn fn, void *ctx);
// "auto" -> the format of the transformers a model folder declares (config.json's
// "transformers_version": 4.x -> v4, else v5; none declared -> v5). model may be a config.json.
int mt_peft_format_parse(const char *text, const char *model, mt_peft_format *out);

#ifdef __cplusplus
}
#endif
