// lora/peft_write.c — writing PEFT adapter folders (docs/formats.md "PEFT adapters"): adapter_config.json as
// PEFT's save_pretrained writes it, adapter_model.safetensors, and the target_modules rule.
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/common.h"
#include "core/fileio.h"
#include "core/safetensors.h"
#include "lora/peft.h"

// ---------------------------------------------------------------------------------------------
// A growable string

typedef struct {
    char *p;
    size_t len, cap;
} sbuf;

static void sb_put(sbuf *b, const char *s, size_t n) {
    if (b->len + n + 1 > b->cap) {
        b->cap = MT_MAX(b->cap * 2, b->len + n + 64);
        b->p = mt_xrealloc(b->p, b->cap);
    }
    memcpy(b->p + b->len, s, n);
    b->len += n;
    b->p[b->len] = 0;
}

static void sb_str(sbuf *b, const char *s) { sb_put(b, s, strlen(s)); }

static void sb_printf(sbuf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void sb_printf(sbuf *b, const char *fmt, ...) {
    char tmp[256];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(tmp, sizeof tmp, fmt, ap);
    va_end(ap);
    if (n >= 0 && (size_t)n < sizeof tmp) {
        sb_put(b, tmp, (size_t)n);
        return;
    }
    char *big = mt_xmalloc((size_t)n + 1);
    va_start(ap, fmt);
    vsnprintf(big, (size_t)n + 1, fmt, ap);
    va_end(ap);
    sb_put(b, big, (size_t)n);
    free(big);
}

static char *sb_take(sbuf *b) {
    if (!b->p) sb_put(b, "", 0);
    return b->p;
}

// ---------------------------------------------------------------------------------------------
// JSON as Python's json.dumps writes it (ensure_ascii: non-ASCII as \uXXXX, surrogate pairs
// above the BMP), so our adapter_config.json is byte for byte what PEFT would write.

static void json_string(sbuf *b, const char *s) {
    sb_str(b, "\"");
    const unsigned char *p = (const unsigned char *)s;
    while (*p) {
        unsigned c = *p;
        if (c == '"') sb_str(b, "\\\""), p++;
        else if (c == '\\') sb_str(b, "\\\\"), p++;
        else if (c == '\n') sb_str(b, "\\n"), p++;
        else if (c == '\r') sb_str(b, "\\r"), p++;
        else if (c == '\t') sb_str(b, "\\t"), p++;
        else if (c == '\b') sb_str(b, "\\b"), p++;
        else if (c == '\f') sb_str(b, "\\f"), p++;
        else if (c < 0x20 || c == 0x7f) {
            if (c == 0x7f) sb_put(b, (const char *)p, 1);  // DEL is ASCII: json.dumps keeps it
            else sb_printf(b, "\\u%04x", c);
            p++;
        } else if (c < 0x80) {
            sb_put(b, (const char *)p, 1), p++;
        } else {  // UTF-8 sequence -> code point (an invalid byte is written as U+FFFD)
            unsigned cp = 0xfffd;
            int len = c >= 0xf0 ? 4 : c >= 0xe0 ? 3 : c >= 0xc0 ? 2 : 1, ok = len > 1;
            for (int i = 1; ok && i < len; i++) ok = (p[i] & 0xc0) == 0x80;
            if (ok) {
                cp = c & (0x7f >> len);
                for (int i = 1; i < len; i++) cp = cp << 6 | (p[i] & 0x3f);
            } else len = 1;
            p += len;
            if (cp >= 0x10000) {
                cp -= 0x10000;
                sb_printf(b, "\\u%04x\\u%04x", 0xd800 + (cp >> 10), 0xdc00 + (cp & 0x3ff));
            } else sb_printf(b, "\\u%04x", cp);
        }
    }
    sb_str(b, "\"");
}

// Python's repr() of a float: the shortest text that reads back as v ("0.0", "0.05", "1e-05").
static void py_float(double v, char *buf, size_t n) {
    if (v == floor(v) && fabs(v) < 1e16) {
        snprintf(buf, n, "%.1f", v);
        return;
    }
    for (int p = 1; p <= 17; p++) {
        snprintf(buf, n, "%.*g", p, v);
        if (strtod(buf, NULL) == v) return;
    }
}

// ---------------------------------------------------------------------------------------------
// target_modules

void mt_peft_targets_free(mt_peft_targets *t) {
    for (int i = 0; t->names && i < t->n; i++) free(t->names[i]);
    free(t->names);
    memset(t, 0, sizeof *t);
}

static const char *leaf_of(const char *name) {
    const char *dot = strrchr(name, '.');
    return dot ? dot + 1 : name;
}

// Per leaf: the leaf name when every module carrying it is adapted, else the adapted modules'
// full paths. PEFT matches a list entry as the whole name or a ".entry" suffix, so the list
// selects exactly the adapted modules; and PEFT's v4->v5 converter rewrites list entries one by
// one (a regex it can only guess at), so nothing is silently dropped on a newer stack.
int mt_peft_targets_make(mt_peft_targets *t, const char *const *all, size_t n, const unsigned char *adapted) {
    memset(t, 0, sizeof *t);
    size_t count = 0;
    for (size_t i = 0; i < n; i++) count += adapted[i] != 0;
    if (count == 0) {
        mt_error_set("no module is adapted: nothing to put in target_modules");
        return -1;
    }
    t->names = mt_xcalloc(count, sizeof(char *));
    for (size_t i = 0; i < n; i++) {
        if (!adapted[i]) continue;
        const char *leaf = leaf_of(all[i]);
        int whole = 1, seen = 0;
        for (size_t j = 0; j < n && whole; j++)
            if (!adapted[j] && strcmp(leaf_of(all[j]), leaf) == 0) whole = 0;
        const char *entry = whole ? leaf : all[i];
        for (int j = 0; j < t->n && !seen; j++) seen = strcmp(t->names[j], entry) == 0;
        if (!seen) t->names[t->n++] = mt_xstrdup(entry);
    }
    return 0;
}

// ---------------------------------------------------------------------------------------------
// adapter_config.json

typedef struct {
    const char *key;
    char *value;  // rendered JSON (owned)
} field;

static int field_cmp(const void *a, const void *b) {
    return strcmp(((const field *)a)->key, ((const field *)b)->key);
}

static char *dup_json_string(const char *s) {
    sbuf b = {0};
    json_string(&b, s);
    return sb_take(&b);
}

char *mt_peft_json_string(const char *s) { return dup_json_string(s); }

// A JSON list of strings as json.dumps(indent=2) writes it at the second level; "null" when empty.
char *mt_peft_json_list(const char *const *names, int n) {
    if (n == 0) return mt_xstrdup("null");
    sbuf b = {0};
    sb_str(&b, "[");
    for (int i = 0; i < n; i++) {
        sb_str(&b, i ? ",\n    " : "\n    ");
        json_string(&b, names[i]);
    }
    sb_str(&b, "\n  ]");
    return sb_take(&b);
}

// The number as json.dumps writes a Python int (integral) or float.
static char *py_number(double v, int as_int) {
    char num[64];
    if (as_int && v == floor(v) && fabs(v) < 1e15) snprintf(num, sizeof num, "%lld", (long long)v);
    else py_float(v, num, sizeof num);
    return mt_xstrdup(num);
}

char *mt_peft_config_json_ex(const mt_peft_config *cfg, const char *target_modules, const char *target_parameters,
                             const char *rank_pattern, const char *alpha_pattern, const char *base_model) {
    // PEFT's LoraConfig fields with the values of an adapter like ours; defaults elsewhere.
    // Fields of newer PEFT releases (lora_bias, ...) are left out: older releases refuse unknown
    // keys, newer ones take their defaults for missing ones. target_parameters (PEFT >= 0.17)
    // only in v5 adapters, which need it.
    field f[] = {
        {"alpha_pattern", mt_xstrdup(alpha_pattern ? alpha_pattern : "{}")},
        {"base_model_name_or_path", base_model ? dup_json_string(base_model) : mt_xstrdup("null")},
        {"bias", mt_xstrdup("\"none\"")},
        {"fan_in_fan_out", mt_xstrdup("false")},
        {"inference_mode", mt_xstrdup("true")},
        {"init_lora_weights", mt_xstrdup("true")},
        {"layers_pattern", mt_xstrdup("null")},
        {"layers_to_transform", mt_xstrdup("null")},
        {"lora_alpha", py_number(cfg->lora_alpha, 1)},
        {"lora_dropout", py_number(cfg->lora_dropout, 0)},
        {"modules_to_save", mt_xstrdup("null")},
        {"peft_type", mt_xstrdup("\"LORA\"")},
        {"r", py_number(cfg->r, 1)},
        {"rank_pattern", mt_xstrdup(rank_pattern ? rank_pattern : "{}")},
        {"revision", mt_xstrdup("null")},
        {"target_modules", mt_xstrdup(target_modules)},
        {"task_type", mt_xstrdup("\"CAUSAL_LM\"")},
        {"use_dora", mt_xstrdup("false")},
        {"use_rslora", mt_xstrdup(cfg->use_rslora ? "true" : "false")},
        {"target_parameters", target_parameters ? mt_xstrdup(target_parameters) : NULL},
    };
    size_t nf = MT_ARRAY_LEN(f) - (target_parameters ? 0 : 1);
    qsort(f, nf, sizeof f[0], field_cmp);  // sort_keys=True
    sbuf b = {0};
    sb_str(&b, "{");
    for (size_t i = 0; i < nf; i++) {
        sb_str(&b, i ? ",\n  " : "\n  ");
        json_string(&b, f[i].key);
        sb_str(&b, ": ");
        sb_str(&b, f[i].value);
        free(f[i].value);
    }
    sb_str(&b, "\n}");  // json.dumps adds no newline, and PEFT writes its output as is
    return sb_take(&b);
}

char *mt_peft_config_json(const mt_peft_config *cfg, const mt_peft_targets *targets, const char *base_model) {
    char *tm = mt_peft_json_list((const char *const *)targets->names, targets->n);
    char *json = mt_peft_config_json_ex(cfg, tm, NULL, NULL, NULL, base_model);
    free(tm);
    return json;
}

// ---------------------------------------------------------------------------------------------
// The folder

typedef struct {
    const mt_peft_module *mods;
    mt_peft_fill_fn fill;
    void *ctx;
} write_ctx;

static int fill_entry(void *ctx, size_t index, void *dst, size_t nbytes) {
    write_ctx *w = ctx;
    const mt_peft_module *m = &w->mods[index / 2];
    char which = index % 2 ? 'B' : 'A';
    const float *src = which == 'A' ? m->a : m->b;
    if (src) {
        memcpy(dst, src, nbytes);
        return 0;
    }
    if (!w->fill) {
        mt_error_set("module '%s': no lora_%c data and no fill function", m->module, which);
        return -1;
    }
    return w->fill(w->ctx, index / 2, which, dst);
}

// adapter_model.safetensors, then adapter_config.json (`json`, freed here).
static int write_folder(const char *dir, const mt_peft_config *cfg, char *json, const mt_peft_module *mods, size_t n,
                        mt_peft_fill_fn fill, void *ctx) {
    if (mt_mkdir_p(dir) != 0) return free(json), -1;
    mt_st_entry *e = mt_xcalloc(2 * n, sizeof *e);
    char **names = mt_xcalloc(2 * n, sizeof *names);
    for (size_t i = 0; i < n; i++)
        for (int k = 0; k < 2; k++) {
            size_t len = strlen(mods[i].module) + 64;
            names[2 * i + k] = mt_xmalloc(len);
            snprintf(names[2 * i + k], len, "base_model.model.%s.lora_%c.weight", mods[i].module, k ? 'B' : 'A');
            mt_st_entry *x = &e[2 * i + k];
            x->name = names[2 * i + k];
            x->dtype = "F32";
            x->ndim = 2;
            x->shape[0] = k ? mods[i].out : cfg->r;
            x->shape[1] = k ? cfg->r : mods[i].in;
        }
    write_ctx w = {mods, fill, ctx};
    char path[4200];
    snprintf(path, sizeof path, "%s/adapter_model.safetensors", dir);
    int rc = mt_st_write(path, e, 2 * n, "{\"format\":\"pt\"}", fill_entry, &w);
    for (size_t i = 0; i < 2 * n; i++) free(names[i]);
    free(names), free(e);
    if (rc == 0) {
        snprintf(path, sizeof path, "%s/adapter_config.json", dir);
        rc = mt_write_file_atomic(path, json, strlen(json));
    }
    free(json);
    return rc;
}

int mt_peft_write(const char *dir, const mt_peft_config *cfg, const mt_peft_targets *targets,
                  const char *base_model, const mt_peft_module *mods, size_t n, mt_peft_fill_fn fill,
                  void *ctx) {
    if (n == 0) {
        mt_error_set("%s: no adapted module to write", dir);
        return -1;
    }
    if (cfg->r < 1 || !targets || targets->n < 1) {
        mt_error_set("%s: an adapter needs r >= 1 and target_modules", dir);
        return -1;
    }
    return write_folder(dir, cfg, mt_peft_config_json(cfg, targets, base_model), mods, n, fill, ctx);
}

// The target list (JSON) of the adapted Linears among all[0..n_all) whose leaf is (params) or is not
// (!params) param_leaf, entries followed by ".weight" for target_parameters; NULL when none is adapted.
static char *v4_list(const char *const *all, const unsigned char *adapted, size_t n_all, const char *param_leaf,
                     int params) {
    const char **sel = mt_xcalloc(n_all + 1, sizeof *sel);
    unsigned char *ad = mt_xcalloc(n_all + 1, 1);
    size_t k = 0, count = 0;
    for (size_t i = 0; i < n_all; i++) {
        int is_param = param_leaf && strcmp(leaf_of(all[i]), param_leaf) == 0;
        if (is_param != params) continue;
        sel[k] = all[i], ad[k] = adapted[i], count += ad[k++] != 0;
    }
    char *json = NULL;
    mt_peft_targets t;
    if (count && mt_peft_targets_make(&t, sel, k, ad) == 0) {
        char **names = mt_xcalloc((size_t)t.n, sizeof *names);
        for (int i = 0; i < t.n; i++) {
            size_t len = strlen(t.names[i]) + 8;
            names[i] = mt_xmalloc(len);
            snprintf(names[i], len, "%s%s", t.names[i], params ? ".weight" : "");
        }
        json = mt_peft_json_list((const char *const *)names, t.n);
        for (int i = 0; i < t.n; i++) free(names[i]);
        free(names);
        mt_peft_targets_free(&t);
    }
    free(sel), free(ad);
    return json;
}

int mt_peft_write_v4(const char *dir, const mt_peft_config *cfg, const char *base_model, const char *const *all,
                     const unsigned char *adapted, size_t n_all, const char *param_leaf, const mt_peft_module *mods,
                     size_t n, mt_peft_fill_fn fill, void *ctx) {
    if (n == 0 || cfg->r < 1) {
        mt_error_set("%s: no adapted module to write (or r < 1)", dir);
        return -1;
    }
    char *tm = v4_list(all, adapted, n_all, param_leaf, 0), *tp = v4_list(all, adapted, n_all, param_leaf, 1);
    // target_modules null beside target_parameters is PEFT's own form when only parameters are targeted
    char *json = mt_peft_config_json_ex(cfg, tm ? tm : "null", tp, NULL, NULL, base_model);
    free(tm), free(tp);
    return write_folder(dir, cfg, json, mods, n, fill, ctx);
}
