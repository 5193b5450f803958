// lora/peft_write.c — writing PEFT adapter folders (FORMATS.md §2): adapter_config.json as
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

static int all_digits(const char *s, size_t n) {
    if (n == 0) return 0;
    for (size_t i = 0; i < n; i++)
        if (s[i] < '0' || s[i] > '9') return 0;
    return 1;
}

// A module path split into its prefix components (all but the leaf); numeric ones are the
// variables of its template.
#define MAX_COMPS 32
typedef struct {
    int ncomp;
    char *comp[MAX_COMPS];  // prefix components (the leaf excluded)
    int numeric[MAX_COMPS];
    int nvar;
    const char *var[MAX_COMPS];  // the numeric components, in order
    const char *leaf;
    char *buf;
} path_parts;

static int path_split(const char *name, path_parts *p) {
    memset(p, 0, sizeof *p);
    p->buf = mt_xstrdup(name);
    char *s = p->buf, *last = strrchr(s, '.');
    p->leaf = last ? last + 1 : s;
    if (!last) return 0;
    *last = 0;
    for (char *save, *tok = strtok_r(s, ".", &save); tok; tok = strtok_r(NULL, ".", &save)) {
        if (p->ncomp == MAX_COMPS) {
            mt_error_set("module path '%s' has more than %d components", name, MAX_COMPS);
            return -1;
        }
        p->comp[p->ncomp] = tok;
        p->numeric[p->ncomp] = all_digits(tok, strlen(tok));
        if (p->numeric[p->ncomp]) p->var[p->nvar++] = tok;
        p->ncomp++;
    }
    return 0;
}

// Two paths share a template: the same components, numbers aside.
static int same_template(const path_parts *a, const path_parts *b) {
    if (a->ncomp != b->ncomp) return 0;
    for (int i = 0; i < a->ncomp; i++) {
        if (a->numeric[i] != b->numeric[i]) return 0;
        if (!a->numeric[i] && strcmp(a->comp[i], b->comp[i]) != 0) return 0;
    }
    return 1;
}

// Numeric strings in numeric order ("2" < "10").
static int num_cmp(const char *a, const char *b) {
    size_t la = strlen(a), lb = strlen(b);
    return la != lb ? (la < lb ? -1 : 1) : strcmp(a, b);
}

// A tuple of variable values: the vars of one path, from index d on.
typedef struct {
    const char *const *v;
    int k;
} tuple;

static int tuple_cmp(const tuple *a, const tuple *b) {
    for (int i = 0; i < a->k; i++) {
        int c = num_cmp(a->v[i], b->v[i]);
        if (c) return c;
    }
    return 0;
}

static int tuple_qcmp(const void *x, const void *y) { return tuple_cmp(x, y); }

// Sorted, duplicate-free tuple sets compare equal element by element.
static int tuple_sets_equal(const tuple *a, int na, const tuple *b, int nb) {
    if (na != nb) return 0;
    for (int i = 0; i < na; i++)
        if (tuple_cmp(&a[i], &b[i]) != 0) return 0;
    return 1;
}

static void regex_escape(sbuf *b, const char *s) {
    for (; *s; s++) {
        char c = *s;
        int plain = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_';
        if (!plain) sb_put(b, "\\", 1);
        sb_put(b, &c, 1);
    }
}

// The components ci.. of template `p` for the tuple set T (sorted, unique; tuples start at the
// variable of component ci): literals as they are, each variable as the alternation of its
// values, factored so that values with the same set of continuations share one branch.
static void render(sbuf *b, const path_parts *p, int ci, const tuple *T, int nT) {
    if (ci == p->ncomp) return;
    const char *sep = ci + 1 < p->ncomp ? "\\." : "";
    if (!p->numeric[ci]) {
        regex_escape(b, p->comp[ci]);
        sb_str(b, sep);
        render(b, p, ci + 1, T, nT);
        return;
    }
    // runs of T with the same first value: [start[g], start[g+1])
    int *start = mt_xmalloc(((size_t)nT + 1) * sizeof(int)), ng = 0;
    for (int i = 0; i < nT; i++)
        if (i == 0 || strcmp(T[i].v[0], T[i - 1].v[0]) != 0) start[ng++] = i;
    start[ng] = nT;
    tuple *rest = mt_xmalloc((size_t)nT * sizeof(tuple));
    for (int i = 0; i < nT; i++) rest[i] = (tuple){T[i].v + 1, T[i].k - 1};
    int *done = mt_xcalloc((size_t)ng, sizeof(int)), branches = 0;
    sbuf alt = {0};
    for (int g = 0; g < ng; g++) {
        if (done[g]) continue;
        // every value whose continuations equal g's joins g's branch
        int members = 0;
        sbuf vals = {0};
        for (int h = g; h < ng; h++) {
            if (done[h] || !tuple_sets_equal(rest + start[g], start[g + 1] - start[g], rest + start[h],
                                             start[h + 1] - start[h]))
                continue;
            done[h] = 1;
            if (members++) sb_str(&vals, "|");
            sb_str(&vals, T[start[h]].v[0]);
        }
        if (branches++) sb_str(&alt, "|");
        if (members > 1) sb_printf(&alt, "(%s)", vals.p);
        else sb_str(&alt, vals.p);
        sb_str(&alt, sep);
        render(&alt, p, ci + 1, rest + start[g], start[g + 1] - start[g]);
        free(vals.p);
    }
    if (branches > 1) sb_printf(b, "(%s)", alt.p);
    else sb_str(b, alt.p);
    free(alt.p), free(done), free(rest), free(start);
}

static int leaves_make(mt_peft_targets *t, const char *const *all, size_t n, const unsigned char *adapted) {
    for (size_t i = 0; i < n; i++) {
        if (!adapted[i]) continue;
        const char *leaf = leaf_of(all[i]);
        int seen = 0;
        for (int j = 0; j < t->n && !seen; j++) seen = strcmp(t->names[j], leaf) == 0;
        if (seen) continue;
        for (size_t j = 0; j < n; j++)
            if (!adapted[j] && strcmp(leaf_of(all[j]), leaf) == 0) return -1;  // a subset: no list
        t->names = mt_xrealloc(t->names, (size_t)(t->n + 1) * sizeof(char *));
        t->names[t->n++] = mt_xstrdup(leaf);
    }
    return 0;
}

int mt_peft_targets_make(mt_peft_targets *t, const char *const *all, size_t n, const unsigned char *adapted) {
    memset(t, 0, sizeof *t);
    size_t count = 0;
    for (size_t i = 0; i < n; i++) count += adapted[i] != 0;
    if (count == 0) {
        mt_error_set("no module is adapted: nothing to put in target_modules");
        return -1;
    }
    if (leaves_make(t, all, n, adapted) == 0) return 0;
    mt_peft_targets_free(t);

    // Regex: one piece per (template, set of tuples), carrying every leaf with that set.
    path_parts *pp = mt_xcalloc(count, sizeof *pp);
    size_t np = 0;
    int rc = 0;
    for (size_t i = 0; i < n && rc == 0; i++)
        if (adapted[i]) rc = path_split(all[i], &pp[np++]);
    sbuf re = {0};
    int pieces = 0;
    unsigned char *used = mt_xcalloc(np, 1);
    tuple *T = mt_xmalloc(np * sizeof(tuple)), *U = mt_xmalloc(np * sizeof(tuple));
    const char **leaves = mt_xmalloc(np * sizeof(char *));
    for (size_t i = 0; i < np && rc == 0; i++) {
        if (used[i]) continue;
        // The leaves of this template whose tuple set equals the tuple set of pp[i]'s leaf.
        int nT = 0;
        for (size_t j = 0; j < np; j++)
            if (same_template(&pp[i], &pp[j]) && strcmp(pp[j].leaf, pp[i].leaf) == 0)
                T[nT++] = (tuple){pp[j].var, pp[j].nvar};
        qsort(T, (size_t)nT, sizeof *T, tuple_qcmp);
        int nl = 0;
        for (size_t j = i; j < np; j++) {
            if (used[j] || !same_template(&pp[i], &pp[j])) continue;
            int nU = 0;
            for (size_t k = 0; k < np; k++)
                if (same_template(&pp[i], &pp[k]) && strcmp(pp[k].leaf, pp[j].leaf) == 0)
                    U[nU++] = (tuple){pp[k].var, pp[k].nvar};
            qsort(U, (size_t)nU, sizeof *U, tuple_qcmp);
            if (!tuple_sets_equal(T, nT, U, nU)) continue;
            for (size_t k = 0; k < np; k++)  // every path of this leaf is covered by the piece
                if (same_template(&pp[i], &pp[k]) && strcmp(pp[k].leaf, pp[j].leaf) == 0) used[k] = 1;
            leaves[nl++] = pp[j].leaf;
        }
        if (pieces++) sb_str(&re, "|");
        render(&re, &pp[i], 0, T, nT);
        if (pp[i].ncomp) sb_str(&re, "\\.");
        if (nl > 1) sb_str(&re, "(");
        for (int l = 0; l < nl; l++) {
            if (l) sb_str(&re, "|");
            regex_escape(&re, leaves[l]);
        }
        if (nl > 1) sb_str(&re, ")");
    }
    for (size_t i = 0; i < np; i++) free(pp[i].buf);
    free(pp), free(used), free(T), free(U), free(leaves);
    if (rc) {
        free(re.p);
        return -1;
    }
    t->regex = 1;
    t->n = 1;
    t->names = mt_xmalloc(sizeof(char *));
    t->names[0] = sb_take(&re);
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

char *mt_peft_config_json(const mt_peft_config *cfg, const mt_peft_targets *targets, const char *base_model) {
    char num[64];
    sbuf tm = {0};
    if (targets->regex) json_string(&tm, targets->names[0]);
    else {
        sb_str(&tm, "[");
        for (int i = 0; i < targets->n; i++) {
            sb_str(&tm, i ? ",\n    " : "\n    ");
            json_string(&tm, targets->names[i]);
        }
        sb_str(&tm, "\n  ]");
    }
    double alpha = cfg->lora_alpha;
    if (alpha == floor(alpha) && fabs(alpha) < 1e15) snprintf(num, sizeof num, "%lld", (long long)alpha);
    else py_float(alpha, num, sizeof num);
    char *alpha_s = mt_xstrdup(num);
    py_float(cfg->lora_dropout, num, sizeof num);
    char *dropout_s = mt_xstrdup(num);
    snprintf(num, sizeof num, "%d", cfg->r);
    // PEFT's LoraConfig fields with the values of an adapter like ours; defaults elsewhere.
    // Fields of newer PEFT releases (lora_bias, target_parameters, ...) are left out: older
    // releases refuse unknown keys, newer ones take their defaults for missing ones.
    field f[] = {
        {"alpha_pattern", mt_xstrdup("{}")},
        {"base_model_name_or_path", base_model ? dup_json_string(base_model) : mt_xstrdup("null")},
        {"bias", mt_xstrdup("\"none\"")},
        {"fan_in_fan_out", mt_xstrdup("false")},
        {"inference_mode", mt_xstrdup("true")},
        {"init_lora_weights", mt_xstrdup("true")},
        {"layers_pattern", mt_xstrdup("null")},
        {"layers_to_transform", mt_xstrdup("null")},
        {"lora_alpha", alpha_s},
        {"lora_dropout", dropout_s},
        {"modules_to_save", mt_xstrdup("null")},
        {"peft_type", mt_xstrdup("\"LORA\"")},
        {"r", mt_xstrdup(num)},
        {"rank_pattern", mt_xstrdup("{}")},
        {"revision", mt_xstrdup("null")},
        {"target_modules", sb_take(&tm)},
        {"task_type", mt_xstrdup("\"CAUSAL_LM\"")},
        {"use_dora", mt_xstrdup("false")},
        {"use_rslora", mt_xstrdup(cfg->use_rslora ? "true" : "false")},
    };
    qsort(f, MT_ARRAY_LEN(f), sizeof f[0], field_cmp);  // sort_keys=True
    sbuf b = {0};
    sb_str(&b, "{");
    for (size_t i = 0; i < MT_ARRAY_LEN(f); i++) {
        sb_str(&b, i ? ",\n  " : "\n  ");
        json_string(&b, f[i].key);
        sb_str(&b, ": ");
        sb_str(&b, f[i].value);
        free(f[i].value);
    }
    sb_str(&b, "\n}");  // json.dumps adds no newline, and PEFT writes its output as is
    return sb_take(&b);
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
    if (mt_mkdir_p(dir) != 0) return -1;
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
    if (rc != 0) return -1;
    char *json = mt_peft_config_json(cfg, targets, base_model);
    snprintf(path, sizeof path, "%s/adapter_config.json", dir);
    rc = mt_write_file_atomic(path, json, strlen(json));
    free(json);
    return rc;
}
