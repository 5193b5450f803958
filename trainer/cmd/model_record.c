// trainer/cmd/model_record.c — what a written model or adapter carries beside its tensors:
// SHA256SUMS over a model folder (init, merge, quantize), and the base's quantization a training
// run used (moetrain_base.json beside its adapter or trained tensors), which merge defaults to.
#include <cjson/cJSON.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>

#include "core/common.h"
#include "core/fileio.h"
#include "core/sha256.h"
#include "quant/quant.h"
#include "trainer/cmd/commands.h"

static int is_file(const char *dir, const char *name) {
    char p[4400];
    struct stat st;
    snprintf(p, sizeof p, "%s/%s", dir, name);
    return stat(p, &st) == 0 && S_ISREG(st.st_mode);
}

int mt_model_sums_write(const char *dir) {
    static const char *const side[] = {"config.json", "generation_config.json", "tokenizer.model", "tokenizer.json",
                                       "tokenizer_config.json", "special_tokens_map.json"};
    const char **names = NULL;
    int n = 0, cap = 0, rc = -1;
    cJSON *index = NULL;
#define ADD(s) (n == cap ? (cap = 2 * cap + 16, names = mt_xrealloc(names, (size_t)cap * sizeof *names)) : 0, names[n++] = (s))
    for (size_t i = 0; i < MT_ARRAY_LEN(side); i++)
        if (is_file(dir, side[i])) ADD(side[i]);
    // The weights as a reader finds them: model.safetensors, else the shards the index names.
    if (is_file(dir, "model.safetensors")) ADD("model.safetensors");
    else if (is_file(dir, "model.safetensors.index.json")) {
        char path[4400], *text;
        size_t len;
        snprintf(path, sizeof path, "%s/model.safetensors.index.json", dir);
        if (mt_read_file(path, 256u << 20, &text, &len) != 0) goto done;
        index = cJSON_ParseWithLength(text, len);
        free(text);
        const cJSON *map = cJSON_GetObjectItemCaseSensitive(index, "weight_map"), *e;
        if (!cJSON_IsObject(map)) {
            mt_error_set("%s: no weight_map", path);
            goto done;
        }
        ADD("model.safetensors.index.json");
        cJSON_ArrayForEach(e, map) {
            if (!cJSON_IsString(e)) continue;
            int seen = 0;
            for (int k = 0; k < n && !seen; k++) seen = strcmp(names[k], e->valuestring) == 0;
            if (!seen) ADD(e->valuestring);
        }
    }
#undef ADD
    char list[4400];
    snprintf(list, sizeof list, "%s/SHA256SUMS", dir);
    rc = mt_sha256sums_write(list, dir, names, n);
done:
    cJSON_Delete(index);
    free(names);
    return rc;
}

static int quant_parse(const char *text, mt_quant *out) {
    for (int q = MT_QUANT_NF4; q <= MT_QUANT_NONE; q++)
        if (strcmp(text, mt_quant_name((mt_quant)q)) == 0) {
            *out = (mt_quant)q;
            return 0;
        }
    return -1;
}

static void targets_text(unsigned t, char *buf, size_t n) {
    static const struct { unsigned bit; const char *name; } parts[] = {
        {MT_QTARGET_EXPERTS, "experts"}, {MT_QTARGET_ATTN, "attn"}, {MT_QTARGET_ROUTER, "router"}};
    buf[0] = 0;
    for (size_t i = 0; i < MT_ARRAY_LEN(parts); i++)
        if (t & parts[i].bit) snprintf(buf + strlen(buf), n - strlen(buf), "%s%s", buf[0] ? "," : "", parts[i].name);
    if (!buf[0]) snprintf(buf, n, "none");
}

int mt_base_record_write(const char *dir, const mt_model_config *cfg, const mt_run_opts *o) {
    // What training did to the base: quantized a dense checkpoint on load (mt_note_quant_on_load's
    // rule), or used it as stored (dense with --quant none, or a bnb-4bit checkpoint).
    int on_load = o->quant != MT_QUANT_NONE && !cfg->quantized && o->quant_targets != 0 && o->mode != MT_MODE_FULL;
    char targets[64], text[512], path[4400];
    targets_text(o->quant_targets, targets, sizeof targets);
    snprintf(text, sizeof text,
             "{\n  \"quant\": \"%s\",\n  \"blocksize\": %d,\n  \"double_quant\": %s,\n  \"quant_targets\": \"%s\",\n"
             "  \"base_stored_4bit\": %s\n}\n",
             on_load ? mt_quant_name(o->quant) : "none", on_load ? mt_q4_blocksize_or_default(o->quant, o->quant_blocksize) : 0,
             on_load && o->double_quant ? "true" : "false", on_load ? targets : "none", cfg->quantized ? "true" : "false");
    snprintf(path, sizeof path, "%s/" MT_BASE_RECORD, dir);
    return mt_write_file_atomic(path, text, strlen(text));
}

int mt_base_record_read(const char *adapter, mt_base_record *r) {
    char dir[4096], path[4400], *text;
    size_t len;
    struct stat st;
    memset(r, 0, sizeof *r);
    snprintf(dir, sizeof dir, "%s", adapter);
    if (stat(adapter, &st) == 0 && S_ISREG(st.st_mode)) {  // trained tensors: the record beside them
        char *slash = strrchr(dir, '/');
        if (slash) *slash = 0;
        else snprintf(dir, sizeof dir, ".");
    }
    snprintf(path, sizeof path, "%s/" MT_BASE_RECORD, dir);
    snprintf(r->path, sizeof r->path, "%s", path);
    if (stat(path, &st) != 0) return 0;
    if (mt_read_file(path, 1u << 20, &text, &len) != 0) return -1;
    cJSON *root = cJSON_ParseWithLength(text, len);
    free(text);
    const cJSON *q = cJSON_GetObjectItemCaseSensitive(root, "quant"), *b = cJSON_GetObjectItemCaseSensitive(root, "blocksize");
    const cJSON *d = cJSON_GetObjectItemCaseSensitive(root, "double_quant");
    const cJSON *t = cJSON_GetObjectItemCaseSensitive(root, "quant_targets");
    int rc = -1;
    if (!cJSON_IsString(q) || quant_parse(q->valuestring, &r->quant) != 0 || !cJSON_IsNumber(b) || !cJSON_IsBool(d) ||
        !cJSON_IsString(t) || mt_quant_targets_parse(t->valuestring, &r->quant_targets) != 0)
        mt_error_set("%s: not a base record moetrain wrote (quant, blocksize, double_quant, quant_targets)", path);
    else {
        r->blocksize = b->valueint;
        r->double_quant = cJSON_IsTrue(d);
        snprintf(r->targets, sizeof r->targets, "%s", t->valuestring);
        rc = 1;
    }
    cJSON_Delete(root);
    return rc;
}
