// lora/peft.c — PEFT adapter folders: the config and the A/B pairs.
#include "lora/peft.h"

#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
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
    const cJSON *ranks = cJSON_GetObjectItemCaseSensitive(root, "rank_pattern");
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
    else if (cJSON_IsObject(ranks) && cJSON_GetArraySize(ranks) > 0)
        mt_error_set("%s: rank_pattern is not supported", path);
    else {
        cfg->r = (int)r->valuedouble;
        cfg->lora_alpha = alpha ? alpha->valuedouble : 8.0;  // PEFT's default
        cfg->use_rslora = cJSON_IsTrue(rs);
        cfg->lora_dropout = cJSON_IsNumber(drop) ? drop->valuedouble : 0.0;
        rc = 0;
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

int mt_peft_read(const char *dir, mt_peft_config *cfg, mt_peft_pair_fn fn, void *ctx) {
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
        } else if (t->ndim != 2 || b->ndim != 2 || t->shape[0] != cfg->r || b->shape[1] != cfg->r) {
            mt_error_set("%s: module '%s': A [%lld, ...] and B [..., %lld] do not have the rank r=%d of "
                         "adapter_config.json", path, module, (long long)t->shape[0],
                         (long long)(b->ndim == 2 ? b->shape[1] : -1), cfg->r);
            rc = -1;
        } else if ((rc = fn(ctx, module, t, b)) != 0) {
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
