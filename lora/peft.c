// lora/peft.c — PEFT adapter folders: the config and the A/B pairs.
#include "lora/peft.h"

#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/common.h"
#include "core/fileio.h"

static const char PREFIX[] = "base_model.model.";

static int read_config(const char *path, mt_peft_config *cfg) {
    char *text;
    size_t len;
    if (mt_read_file(path, 1 << 20, &text, &len) != 0) return -1;
    int rc = mt_peft_config_parse(text, len, path, cfg);
    free(text);
    return rc;
}

// An empty target_modules ([] or "") adapts nothing: PEFT itself refuses it.
static int empty_targets(const cJSON *t) {
    return (cJSON_IsArray(t) && cJSON_GetArraySize(t) == 0) || (cJSON_IsString(t) && !t->valuestring[0]);
}

// Which fused expert parameter a rank_pattern / alpha_pattern key names: 1 gate_up_proj,
// 2 down_proj, 0 neither.
static int pattern_target(const char *key) {
    size_t n = strlen(key);
    if (n >= 12 && strcmp(key + n - 12, "gate_up_proj") == 0) return 1;
    if (n >= 9 && strcmp(key + n - 9, "down_proj") == 0) return 2;
    return 0;
}

// rank_pattern / alpha_pattern: only for v5's fused experts (PEFT's converter gives gate_up_proj
// rank 2r, alpha 2·alpha), and only where the scale stays the adapter's: one scale per adapter.
static int read_patterns(const cJSON *root, const char *path, mt_peft_config *cfg) {
    const cJSON *ranks = cJSON_GetObjectItemCaseSensitive(root, "rank_pattern");
    const cJSON *alphas = cJSON_GetObjectItemCaseSensitive(root, "alpha_pattern");
    if (!cJSON_IsObject(ranks)) ranks = NULL;
    if (!cJSON_IsObject(alphas)) alphas = NULL;
    double want = cfg->lora_alpha / (cfg->use_rslora ? sqrt(cfg->r) : cfg->r);
    double alpha_of[3] = {0, cfg->lora_alpha, cfg->lora_alpha};
    int rank_of[3] = {0, cfg->r, cfg->r};
    const cJSON *it;
    cJSON_ArrayForEach(it, ranks) {
        int w = pattern_target(it->string);
        if (!w || !cJSON_IsNumber(it) || it->valuedouble < 1 || it->valuedouble > MT_PEFT_MAX_R ||
            it->valuedouble != floor(it->valuedouble)) {
            mt_error_set("%s: rank_pattern \"%s\" is not supported (only an integer rank for the fused experts' "
                         "gate_up_proj / down_proj)", path, it->string);
            return -1;
        }
        rank_of[w] = (int)it->valuedouble;
    }
    cJSON_ArrayForEach(it, alphas) {
        int w = pattern_target(it->string);
        if (!w || !cJSON_IsNumber(it) || !(it->valuedouble > 0)) {
            mt_error_set("%s: alpha_pattern \"%s\" is not supported (only a positive alpha for the fused experts' "
                         "gate_up_proj / down_proj)", path, it->string);
            return -1;
        }
        alpha_of[w] = it->valuedouble;
    }
    for (int w = 1; w <= 2; w++) {
        double s = alpha_of[w] / (cfg->use_rslora ? sqrt(rank_of[w]) : rank_of[w]);
        if (fabs(s - want) > 1e-6 * want) {
            mt_error_set("%s: rank_pattern / alpha_pattern give %s the scale %g where the adapter's is %g "
                         "(one scale per adapter is supported)", path, w == 1 ? "gate_up_proj" : "down_proj", s, want);
            return -1;
        }
    }
    cfg->r_gate_up = rank_of[1] != cfg->r ? rank_of[1] : 0;
    cfg->r_down = rank_of[2] != cfg->r ? rank_of[2] : 0;
    return 0;
}

// adapter_config.json fields beyond those read above. A field that changes what the adapter
// computes is honoured (read above) or refused by name when set; bookkeeping and how PEFT made
// the adapter are ignored; a field PEFT added later is accepted only when off (null, false, 0,
// empty), because an adapter that uses it computes something moetrain does not.
static const char *const PEFT_READ[] = {
    "r", "lora_alpha", "peft_type", "use_dora", "bias", "use_rslora", "lora_dropout", "target_modules",
    "target_parameters", "rank_pattern", "alpha_pattern",
};
static const char *const PEFT_IGNORED[] = {
    "base_model_name_or_path", "revision", "task_type", "inference_mode", "init_lora_weights", "auto_mapping",
    "peft_version", "exclude_modules", "layers_to_transform", "layers_pattern", "corda_config", "eva_config",
    "loftq_config", "lora_ga_config", "qalora_group_size", "runtime_config", "ensure_weight_tying",
    "megatron_core",  // the module megatron_config would use: without that config, nothing
};
// Keys the adapter file alone decides (which modules and layers carry A/B pairs is read from
// adapter_model.safetensors): exclude_modules, layers_to_transform, layers_pattern. How the weights
// were initialised (init_lora_weights, loftq/eva/corda configs) does not change what they compute.

// Off: null, false, 0, "" or an empty list/object (the value PEFT writes when a feature is unused).
static int value_off(const cJSON *v) {
    return cJSON_IsNull(v) || cJSON_IsFalse(v) || (cJSON_IsNumber(v) && v->valuedouble == 0) ||
           (cJSON_IsString(v) && !v->valuestring[0]) || ((cJSON_IsArray(v) || cJSON_IsObject(v)) && !v->child);
}

static int check_fields(const cJSON *root, const char *path) {
    for (const cJSON *c = root->child; c; c = c->next) {
        if (!c->string || mt_str_in(PEFT_READ, MT_ARRAY_LEN(PEFT_READ), c->string) ||
            mt_str_in(PEFT_IGNORED, MT_ARRAY_LEN(PEFT_IGNORED), c->string) || value_off(c))
            continue;
        // fan_in_fan_out, lora_bias, modules_to_save, use_qalora, layer_replication,
        // trainable_token_indices, megatron_config, alora_invocation_tokens, and whatever PEFT
        // adds next: each changes the computation when set.
        char *v = cJSON_PrintUnformatted(c);
        mt_error_set("%s: %.60s = %.60s is not supported: moetrain would compute another adapter than PEFT "
                     "(only the plain LoRA of r, lora_alpha, use_rslora, rank/alpha patterns is)", path, c->string,
                     v ? v : "?");
        free(v);
        return -1;
    }
    return 0;
}

int mt_peft_config_parse(const char *text, size_t len, const char *path, mt_peft_config *cfg) {
    cJSON *root = cJSON_ParseWithLength(text, len);
    int rc = -1;
    const cJSON *r = cJSON_GetObjectItemCaseSensitive(root, "r");
    const cJSON *alpha = cJSON_GetObjectItemCaseSensitive(root, "lora_alpha");
    const cJSON *type = cJSON_GetObjectItemCaseSensitive(root, "peft_type");
    const cJSON *dora = cJSON_GetObjectItemCaseSensitive(root, "use_dora");
    const cJSON *bias = cJSON_GetObjectItemCaseSensitive(root, "bias");
    const cJSON *rs = cJSON_GetObjectItemCaseSensitive(root, "use_rslora");
    const cJSON *drop = cJSON_GetObjectItemCaseSensitive(root, "lora_dropout");
    if (!cJSON_IsObject(root)) mt_error_set("%s: not a JSON object", path);
    else if (!cJSON_IsString(type) || strcmp(type->valuestring, "LORA") != 0)
        mt_error_set("%s: peft_type is not \"LORA\"", path);
    else if (!cJSON_IsNumber(r) || !(r->valuedouble >= 1 && r->valuedouble <= MT_PEFT_MAX_R) ||
             r->valuedouble != floor(r->valuedouble))
        mt_error_set("%s: key \"r\" must be an integer in 1..%d", path, MT_PEFT_MAX_R);
    else if (alpha && (!cJSON_IsNumber(alpha) || !(alpha->valuedouble > 0 && alpha->valuedouble <= 1e6)))
        mt_error_set("%s: key \"lora_alpha\" must be a number in (0, 1e6]", path);
    else if (drop && !cJSON_IsNull(drop) &&
             (!cJSON_IsNumber(drop) || !(drop->valuedouble >= 0 && drop->valuedouble < 1)))
        mt_error_set("%s: key \"lora_dropout\" must be a number in [0, 1)", path);
    else if (empty_targets(cJSON_GetObjectItemCaseSensitive(root, "target_modules")))
        mt_error_set("%s: key \"target_modules\" is empty: the adapter would adapt nothing", path);
    else if (cJSON_IsTrue(dora)) mt_error_set("%s: use_dora adapters are not supported", path);
    else if (cJSON_IsString(bias) && strcmp(bias->valuestring, "none") != 0)
        mt_error_set("%s: bias \"%s\" is not supported (only \"none\")", path, bias->valuestring);
    else if (check_fields(root, path) != 0)
        ;  // the error is set
    else {
        cfg->r = (int)r->valuedouble;
        cfg->lora_alpha = alpha ? alpha->valuedouble : 8.0;  // PEFT's default
        cfg->use_rslora = cJSON_IsTrue(rs);
        cfg->lora_dropout = cJSON_IsNumber(drop) ? drop->valuedouble : 0.0;
        cfg->r_gate_up = cfg->r_down = 0;
        rc = read_patterns(root, path, cfg);
    }
    cJSON_Delete(root);
    return rc;
}

// "base_model.model.<module>.lora_A.weight" -> module and 'A' / 'B'; 0 when it is such a key.
int mt_peft_split_key(const char *key, char *module, size_t cap, char *which) {
    size_t n = strlen(key), p = sizeof PREFIX - 1, s = sizeof ".lora_A.weight" - 1;
    if (n <= p + s || strncmp(key, PREFIX, p) != 0) return -1;
    const char *tail = key + n - s;
    if (strcmp(tail, ".lora_A.weight") == 0) *which = 'A';
    else if (strcmp(tail, ".lora_B.weight") == 0) *which = 'B';
    else return -1;
    if (n - p - s >= cap) return -1;
    memcpy(module, key + p, n - p - s);
    module[n - p - s] = 0;
    return 0;
}

static int ends_with(const char *s, const char *suffix) {
    size_t n = strlen(s), k = strlen(suffix);
    return n >= k && strcmp(s + n - k, suffix) == 0;
}

// PEFT's target_parameters rule: an entry equals the parameter's name or is a ".entry" suffix.
static int targets_param(const cJSON *list, const char *name) {
    const cJSON *it;
    if (!cJSON_IsArray(list)) return 0;
    cJSON_ArrayForEach(it, list) {
        if (!cJSON_IsString(it)) continue;
        size_t n = strlen(name), k = strlen(it->valuestring);
        if (strcmp(name, it->valuestring) == 0 || (n > k && name[n - k - 1] == '.' && ends_with(name, it->valuestring)))
            return 1;
    }
    return 0;
}

// A v5 "model.layers.L.mlp.experts" pair without a base_layer beside it holds whichever of
// gate_up_proj / down_proj target_parameters names for the layer: 1 gate_up, 0 down, -1 unknown.
static int lone_experts_kind(const char *dir, const char *module) {
    char path[4200], name[600], *text;
    size_t len;
    snprintf(path, sizeof path, "%s/adapter_config.json", dir);
    if (mt_read_file(path, 1 << 20, &text, &len) != 0) return -1;
    cJSON *root = cJSON_ParseWithLength(text, len);
    const cJSON *tp = cJSON_GetObjectItemCaseSensitive(root, "target_parameters");
    snprintf(name, sizeof name, "%s.gate_up_proj", module);
    int gu = targets_param(tp, name);
    snprintf(name, sizeof name, "%s.down_proj", module);
    int down = targets_param(tp, name);
    cJSON_Delete(root);
    free(text);
    return gu == down ? -1 : gu;
}

// One A/B pair of the file: a v4 module as it is, a v5 router under its v4 name, v5 fused experts
// split per expert.
static int visit_pair(const char *dir, const char *path, const mt_st_file *f, const mt_peft_config *cfg,
                      const mt_peft_layout *layout, const char *module, const mt_st_tensor *a, const mt_st_tensor *b,
                      mt_peft_pair_fn fn, void *ctx) {
    char prefix[512], other[600];
    size_t n = strlen(module);
    if (ends_with(module, ".mlp.gate") && n - 9 < sizeof prefix - 32) {
        snprintf(prefix, sizeof prefix, "%.*s.block_sparse_moe.gate", (int)(n - 9), module);
        return fn(ctx, prefix, a, b);
    }
    int gate_up = -1;
    if (ends_with(module, ".mlp.experts.base_layer")) gate_up = 1, n -= strlen(".mlp.experts.base_layer");
    else if (ends_with(module, ".mlp.experts")) {
        n -= strlen(".mlp.experts");
        snprintf(other, sizeof other, "%s%s.base_layer.lora_A.weight", PREFIX, module);
        gate_up = mt_st_file_find(f, other) ? 0 : lone_experts_kind(dir, module);
        if (gate_up < 0) {
            mt_error_set("%s: '%s' cannot be told gate_up_proj or down_proj: adapter_config.json's "
                         "target_parameters must name exactly one of them for '%s'", path, a->name, module);
            return -1;
        }
    }
    if (gate_up < 0) return fn(ctx, module, a, b);
    if (n >= sizeof prefix) n = sizeof prefix - 1;
    memcpy(prefix, module, n);
    prefix[n] = 0;
    return mt_peft_v5_experts(path, cfg, layout, prefix, gate_up, a, b, fn, ctx);
}

int mt_peft_read(const char *dir, mt_peft_config *cfg, mt_peft_pair_fn fn, void *ctx) {
    return mt_peft_read_as(dir, NULL, cfg, fn, ctx);
}

int mt_peft_read_as(const char *dir, const mt_peft_layout *layout, mt_peft_config *cfg, mt_peft_pair_fn fn, void *ctx) {
    char path[4200];
    snprintf(path, sizeof path, "%s/adapter_config.json", dir);
    if (read_config(path, cfg) != 0) return -1;
    snprintf(path, sizeof path, "%s/adapter_model.safetensors", dir);
    mt_st_file f;
    if (mt_st_file_open(&f, path) != 0) return -1;
    int rc = 0;
    for (size_t i = 0; i < f.n_tensors && rc == 0; i++) {
        const mt_st_tensor *t = &f.tensors[i];
        char module[512], which, other[600];
        if (mt_peft_split_key(t->name, module, sizeof module, &which) != 0) {
            mt_error_set("%s: key '%s' is not a LoRA A/B weight (base_model.model.<module>.lora_A.weight)",
                         path, t->name);
            rc = -1;
            break;
        }
        if (which == 'B') continue;  // visited with its A
        snprintf(other, sizeof other, "%s%s.lora_B.weight", PREFIX, module);
        const mt_st_tensor *b = mt_st_file_find(&f, other);
        if (!b) {
            mt_error_set("%s: '%s' has no matching '%s'", path, t->name, other);
            rc = -1;
        } else if (ends_with(module, ".mlp.experts") || ends_with(module, ".mlp.experts.base_layer")) {
            // fused: ranks checked per expert
            rc = visit_pair(dir, path, &f, cfg, layout, module, t, b, fn, ctx);
        } else if (t->ndim != 2 || b->ndim != 2 || t->shape[0] != cfg->r || b->shape[1] != cfg->r) {
            mt_error_set("%s: module '%s': A [%lld, ...] and B [..., %lld] do not have the rank r=%d of "
                         "adapter_config.json", path, module, (long long)t->shape[0],
                         (long long)(b->ndim == 2 ? b->shape[1] : -1), cfg->r);
            rc = -1;
        } else if ((rc = visit_pair(dir, path, &f, cfg, layout, module, t, b, fn, ctx)) != 0) {
            mt_error_prefix("%s", path);
        }
    }
    for (size_t i = 0; i < f.n_tensors && rc == 0; i++) {  // every B has its A
        char module[512], which, other[600];
        mt_peft_split_key(f.tensors[i].name, module, sizeof module, &which);
        snprintf(other, sizeof other, "%s%s.lora_A.weight", PREFIX, module);
        if (which == 'B' && !mt_st_file_find(&f, other)) {
            mt_error_set("%s: '%s' has no matching '%s'", path, f.tensors[i].name, other);
            rc = -1;
        }
    }
    mt_st_file_close(&f);
    return rc;
}
