// lora/peft.h — reading and writing PEFT LoRA adapter folders (FORMATS.md §2): adapter_config.json and
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
} mt_peft_config;

// Called once per adapted module with its A [r, in] and B [out, r] tensors (any float dtype).
// Return non-zero (with mt_error_set) to stop.
typedef int (*mt_peft_pair_fn)(void *ctx, const char *module, const mt_st_tensor *a,
                               const mt_st_tensor *b);

// Reads the folder's config and walks its adapter pairs. Errors name the file and the key:
// a lora_A without its lora_B, an unknown key form, a rank that differs from the config's r
// (rank_pattern is not supported), DoRA or bias terms.
int mt_peft_read(const char *dir, mt_peft_config *cfg, mt_peft_pair_fn fn, void *ctx);
// adapter_config.json's text (len bytes; `path` names it in errors): r an integer in
// 1..MT_PEFT_MAX_R, lora_alpha in (0, 1e6], lora_dropout in [0, 1), target_modules not empty.
#define MT_PEFT_MAX_R 65536
int mt_peft_config_parse(const char *text, size_t len, const char *path, mt_peft_config *cfg);
// "base_model.model.<module>.lora_A.weight" -> module (cap bytes) and 'A' / 'B'; 0 when it is
// such a key, -1 otherwise.
int mt_peft_split_key(const char *key, char *module, size_t cap, char *which);

// ---------------------------------------------------------------------------------------------
// Writing (lora/peft_write.c)

// PEFT's target_modules for the adapted subset of a model's Linear module paths all[0..n):
//   * the leaf names (["q_proj", "w1", ...], in order of first appearance) when every module
//     carrying a listed leaf is adapted (PEFT matches a list entry as the name or a ".leaf"
//     suffix, so the list then selects exactly the adapted modules);
//   * otherwise one regular expression that matches exactly the adapted paths under PEFT's
//     re.fullmatch: numeric path components become alternations factored per component,
//     e.g. model\.layers\.(0|1)\.block_sparse_moe\.experts\.(0|3)\.(w1|w2|w3).
typedef struct mt_peft_targets {
    int regex;     // 1: names[0] is a regular expression; 0: names[0..n) are leaf names
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
// The adapter_config.json text alone (malloc'ed, NUL-terminated; the caller frees).
char *mt_peft_config_json(const mt_peft_config *cfg, const mt_peft_targets *targets,
                          const char *base_model);

#ifdef __cplusplus
}
#endif
