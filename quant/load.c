// quant/load.c — bnb-4bit import (docs/formats.md "Serialized quant_state") and quantize-on-load: a checkpoint streamed
// tensor by tensor, targets quantized one at a time, each tensor's mmapped pages dropped once
// it is done. Block-FP8 weights are dequantized to f32 first (quant/fp8.c), then loaded as dense.
#include <float.h>
#include <math.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cjson/cJSON.h>

#include "core/common.h"
#include "quant/quant.h"

// ---------------------------------------------------------------------------------------------
// Names

static int ends_with(const char *s, const char *suffix) {
    size_t a = strlen(s), b = strlen(suffix);
    return a >= b && memcmp(s + a - b, suffix, b) == 0;
}

static const char *const part_suffixes[] = {
    ".absmax", ".zero", ".quant_map", ".nested_absmax", ".nested_quant_map",
    ".quant_state.bitsandbytes__nf4", ".quant_state.bitsandbytes__fp4", ".quant_state.moetrain__int4",
};
enum { N_QS_FIRST = 5 };  // part_suffixes[5..7] are the quant_state keys

int mt_bnb_is_part_name(const char *name) {
    for (size_t i = 0; i < MT_ARRAY_LEN(part_suffixes); i++)
        if (ends_with(name, part_suffixes[i])) return 1;
    return 0;
}

// The base weight's name of a part ("P.weight.absmax" -> "P.weight"), into buf; 0 if not a part.
static int part_base(const char *name, char *buf, size_t n) {
    for (size_t i = 0; i < MT_ARRAY_LEN(part_suffixes); i++)
        if (ends_with(name, part_suffixes[i])) {
            size_t len = strlen(name) - strlen(part_suffixes[i]);
            if (len == 0 || len >= n) return 0;
            memcpy(buf, name, len);
            buf[len] = 0;
            return 1;
        }
    return 0;
}

unsigned mt_quant_target_of(const char *name) {
    char base[512];
    size_t len = strlen(name);
    if (len >= sizeof base) return 0;
    strcpy(base, name);
    if (ends_with(base, ".weight")) base[len - 7] = 0;
    static const char *const expert_leaf[] = {".w1", ".w2", ".w3", ".gate_proj", ".up_proj", ".down_proj"};
    static const char *const attn_leaf[] = {".self_attn.q_proj", ".self_attn.k_proj", ".self_attn.v_proj",
                                            ".self_attn.o_proj", ".self_attn.q_a_proj", ".self_attn.q_b_proj",
                                            ".self_attn.kv_a_proj_with_mqa", ".self_attn.kv_b_proj"};  // + MLA's
    if (strstr(base, ".experts."))
        for (size_t i = 0; i < MT_ARRAY_LEN(expert_leaf); i++)
            if (ends_with(base, expert_leaf[i])) return MT_QTARGET_EXPERTS;
    static const char *const mlp_leaf[] = {".mlp.gate_proj", ".mlp.up_proj", ".mlp.down_proj",
                                           ".mlp.shared_expert.gate_proj", ".mlp.shared_expert.up_proj",
                                           ".mlp.shared_expert.down_proj", ".mlp.shared_experts.gate_proj",
                                           ".mlp.shared_experts.up_proj", ".mlp.shared_experts.down_proj"};
    for (size_t i = 0; i < MT_ARRAY_LEN(mlp_leaf); i++)  // a dense layer's MLP, the shared expert
        if (ends_with(base, mlp_leaf[i])) return MT_QTARGET_EXPERTS;
    for (size_t i = 0; i < MT_ARRAY_LEN(attn_leaf); i++)
        if (ends_with(base, attn_leaf[i])) return MT_QTARGET_ATTN;
    if (ends_with(base, ".block_sparse_moe.gate") || ends_with(base, ".mlp.gate")) return MT_QTARGET_ROUTER;
    return 0;  // embeddings, norms, lm_head, anything unknown
}

int mt_quant_targets_parse(const char *text, unsigned *out) {
    static const struct { const char *name; unsigned bits; } names[] = {
        {"experts", MT_QTARGET_EXPERTS}, {"attn", MT_QTARGET_ATTN},   {"router", MT_QTARGET_ROUTER},
        {"gate", MT_QTARGET_ROUTER},     {"all", MT_QTARGET_ALL},     {"none", 0},
        {"default", MT_QTARGET_DEFAULT},
    };
    unsigned bits = 0;
    const char *p = text;
    if (!*p) goto bad;
    while (*p) {
        size_t len = strcspn(p, ",");
        size_t i;
        for (i = 0; i < MT_ARRAY_LEN(names); i++)
            if (strlen(names[i].name) == len && strncmp(p, names[i].name, len) == 0) break;
        if (i == MT_ARRAY_LEN(names)) goto bad;
        bits |= names[i].bits;
        p += len;
        if (*p == ',' && !*++p) goto bad;
    }
    *out = bits;
    return 0;
bad:
    mt_error_set("'%s' is not a list of quantization targets (experts, attn, router; all, none, default)", text);
    return -1;
}

void mt_quant_load_opts_default(mt_quant_load_opts *o) {
    o->type = MT_QUANT_NF4;
    o->blocksize = 0;
    o->double_quant = 1;
    o->targets = MT_QTARGET_DEFAULT;
    o->want = NULL;
    o->want_ctx = NULL;
    o->fp8_block[0] = o->fp8_block[1] = 0;
}

// ---------------------------------------------------------------------------------------------
// Finding and checking the parts of a serialised weight

int mt_bnb_find_parts(const mt_st_model *m, const char *name, mt_bnb_parts *p) {
    memset(p, 0, sizeof *p);
    char key[600];
    const mt_st_tensor **slots[] = {&p->absmax, &p->zero, &p->quant_map, &p->nested_absmax,
                                    &p->nested_quant_map};
    if (strlen(name) > 512) return 0;
    p->weight = mt_st_model_find(m, name);
    int found = 0;
    for (size_t i = 0; i < MT_ARRAY_LEN(slots); i++) {
        snprintf(key, sizeof key, "%s%s", name, part_suffixes[i]);
        if ((*slots[i] = mt_st_model_find(m, key))) found = 1;
    }
    for (size_t i = N_QS_FIRST; i < MT_ARRAY_LEN(part_suffixes); i++) {
        snprintf(key, sizeof key, "%s%s", name, part_suffixes[i]);
        const mt_st_tensor *t = mt_st_model_find(m, key);
        if (!t) continue;
        if (p->quant_state) {
            mt_error_set("'%s': two quant_state tensors (%s and %s)", name, p->quant_state->name, t->name);
            return -1;
        }
        p->quant_state = t;
        p->quant_state_key = t->name;
    }
    if (p->quant_state) return 1;
    if (found) {
        mt_error_set("'%s': quantization constants without a quant_state (expected %s.quant_state."
                     "bitsandbytes__nf4 or __fp4)", name, name);
        return -1;
    }
    return 0;
}

static void shape_str(const mt_st_tensor *t, char *buf, size_t n) {
    size_t k = (size_t)snprintf(buf, n, "[");
    for (int d = 0; d < t->ndim && k < n; d++)
        k += (size_t)snprintf(buf + k, n - k, "%s%lld", d ? ", " : "", (long long)t->shape[d]);
    if (k < n) snprintf(buf + k, n - k, "]");
}

// A part must be there, of `dtype`, holding `count` elements as [count] (or [count, 1] when
// `column`).
static int check_part(const char *name, const char *what, const mt_st_tensor *t, const char *dtype,
                      int64_t count, int column) {
    if (!t) {
        mt_error_set("'%s': missing %s.%s", name, name, what);
        return -1;
    }
    if (strcmp(t->dtype, dtype) != 0) {
        mt_error_set("'%s': wrong dtype %s for %s (expected %s)", t->name, t->dtype, what, dtype);
        return -1;
    }
    int ok = column ? t->ndim == 2 && t->shape[0] == count && t->shape[1] == 1
                    : t->ndim == 1 && t->shape[0] == count;
    if (!ok) {
        char got[128];
        shape_str(t, got, sizeof got);
        mt_error_set("'%s': wrong shape %s for %s (expected [%lld%s])", t->name, got, what,
                     (long long)count, column ? ", 1" : "");
        return -1;
    }
    return 0;
}

static float f32_at(const mt_st_tensor *t, int64_t i) {
    float v;
    memcpy(&v, (const char *)t->data + 4 * i, 4);  // the mmap gives no alignment guarantee
    return v;
}

static int check_finite(const char *what, const mt_st_tensor *t) {
    int64_t n = (int64_t)(t->nbytes / 4);
    for (int64_t i = 0; i < n; i++)
        if (!isfinite(f32_at(t, i))) {
            mt_error_set("'%s': %s element %lld is %g", t->name, what, (long long)i, f32_at(t, i));
            return -1;
        }
    return 0;
}

// The quant_state JSON: every field bitsandbytes writes, nothing else (as QuantState.from_dict).
typedef struct {
    mt_quant type;
    int blocksize, nested;
    mt_dtype dtype;
    int64_t out, in;
    float offset;
} quant_state;

static int json_int(const cJSON *o, const char *key, int64_t *v) {
    const cJSON *x = cJSON_GetObjectItemCaseSensitive(o, key);
    if (!cJSON_IsNumber(x) || x->valuedouble != floor(x->valuedouble) || fabs(x->valuedouble) > 1e15) return -1;
    *v = (int64_t)x->valuedouble;
    return 0;
}

static int torch_dtype(const char *s, mt_dtype *out) {
    if (strcmp(s, "bfloat16") == 0) *out = MT_BF16;
    else if (strcmp(s, "float16") == 0) *out = MT_F16;
    else if (strcmp(s, "float32") == 0) *out = MT_F32;
    else return -1;
    return 0;
}

static int parse_quant_state(const char *name, const mt_bnb_parts *p, quant_state *qs) {
    const mt_st_tensor *t = p->quant_state;
    const char *key = p->quant_state_key;
    memset(qs, 0, sizeof *qs);
    mt_quant key_type = ends_with(key, "__nf4") ? MT_QUANT_NF4 : ends_with(key, "__fp4") ? MT_QUANT_FP4 : MT_QUANT_INT4;
    if (strcmp(t->dtype, "U8") != 0 || t->ndim != 1) {
        mt_error_set("'%s': quant_state must be U8 bytes of JSON, got %s with %d dimensions", key, t->dtype, t->ndim);
        return -1;
    }
    cJSON *root = cJSON_ParseWithLength((const char *)t->data, (size_t)t->nbytes);
    if (!root || !cJSON_IsObject(root)) {
        mt_error_set("'%s': malformed quant_state: %s", key, root ? "not a JSON object" : "not valid JSON");
        cJSON_Delete(root);
        return -1;
    }
    static const char *const known[] = {"quant_type", "blocksize", "dtype", "shape", "nested_blocksize",
                                        "nested_dtype", "nested_offset"};
    const char *bad = NULL;
    char why[160] = "", unknown[64];
    for (const cJSON *it = root->child; it && !bad; it = it->next) {
        size_t i = 0;
        while (i < MT_ARRAY_LEN(known) && strcmp(it->string, known[i]) != 0) i++;
        if (i == MT_ARRAY_LEN(known)) {
            snprintf(unknown, sizeof unknown, "%s", it->string);  // outlives the JSON tree
            bad = unknown, snprintf(why, sizeof why, "unknown key");
        }
    }
    const cJSON *qt = cJSON_GetObjectItemCaseSensitive(root, "quant_type");
    const cJSON *dt = cJSON_GetObjectItemCaseSensitive(root, "dtype");
    const cJSON *shape = cJSON_GetObjectItemCaseSensitive(root, "shape");
    int64_t bs = 0, nbs = 0;
    if (bad) {
    } else if (!cJSON_IsString(qt) || strcmp(qt->valuestring, mt_qformats[key_type].name) != 0) {
        bad = "quant_type", snprintf(why, sizeof why, "must be \"%s\" (the key's suffix)", mt_qformats[key_type].name);
    } else if (json_int(root, "blocksize", &bs) != 0 || !mt_q4_blocksize_ok((int)bs)) {
        bad = "blocksize", snprintf(why, sizeof why, "must be a power of two in 32..4096");
    } else if (!cJSON_IsString(dt) || torch_dtype(dt->valuestring, &qs->dtype) != 0) {
        bad = "dtype", snprintf(why, sizeof why, "must be \"bfloat16\", \"float16\" or \"float32\"");
    } else if (!cJSON_IsArray(shape) || cJSON_GetArraySize(shape) != 2 ||
               !cJSON_IsNumber(cJSON_GetArrayItem(shape, 0)) || !cJSON_IsNumber(cJSON_GetArrayItem(shape, 1)) ||
               cJSON_GetArrayItem(shape, 0)->valuedouble < 1 || cJSON_GetArrayItem(shape, 1)->valuedouble < 1 ||
               cJSON_GetArrayItem(shape, 0)->valuedouble > 1e9 || cJSON_GetArrayItem(shape, 1)->valuedouble > 1e9) {
        bad = "shape", snprintf(why, sizeof why, "must be [out, in] with positive sizes");
    }
    if (!bad) {
        qs->type = key_type;
        qs->blocksize = (int)bs;
        qs->out = (int64_t)cJSON_GetArrayItem(shape, 0)->valuedouble;
        qs->in = (int64_t)cJSON_GetArrayItem(shape, 1)->valuedouble;
        qs->nested = cJSON_GetObjectItemCaseSensitive(root, "nested_offset") != NULL;
        if (qs->nested && key_type == MT_QUANT_INT4) {
            bad = "nested_offset", snprintf(why, sizeof why, "int4 has no double quantization");
        } else if (qs->nested) {
            const cJSON *ndt = cJSON_GetObjectItemCaseSensitive(root, "nested_dtype");
            const cJSON *off = cJSON_GetObjectItemCaseSensitive(root, "nested_offset");
            if (json_int(root, "nested_blocksize", &nbs) != 0 || nbs != MT_Q4_NESTED_BLOCKSIZE)
                bad = "nested_blocksize", snprintf(why, sizeof why, "must be 256");
            else if (!cJSON_IsString(ndt) || strcmp(ndt->valuestring, "float32") != 0)
                bad = "nested_dtype", snprintf(why, sizeof why, "must be \"float32\"");
            else if (!cJSON_IsNumber(off) || !(fabs(off->valuedouble) <= FLT_MAX))  // stored as a float32
                bad = "nested_offset", snprintf(why, sizeof why, "must be a finite float32");
            else
                qs->offset = (float)off->valuedouble;
        } else if (cJSON_GetObjectItemCaseSensitive(root, "nested_blocksize") ||
                   cJSON_GetObjectItemCaseSensitive(root, "nested_dtype")) {
            bad = "nested_offset", snprintf(why, sizeof why, "missing while other nested_* keys are there");
        }
    }
    cJSON_Delete(root);
    if (bad) {
        mt_error_set("'%s': malformed quant_state: \"%s\" %s", key, bad, why);
        return -1;
    }
    (void)name;
    return 0;
}

int mt_qweight_import(mt_qweight *q, mt_backend *be, const char *name, const mt_bnb_parts *p) {
    memset(q, 0, sizeof *q);
    quant_state qs;
    if (!p->quant_state) {
        mt_error_set("'%s': missing %s.quant_state.bitsandbytes__nf4 (or __fp4)", name, name);
        return -1;
    }
    if (parse_quant_state(name, p, &qs) != 0) return -1;
    int64_t n = qs.out * qs.in, nb = mt_q4_blocks(n, qs.blocksize);
    if (check_part(name, "weight", p->weight, "U8", mt_q4_packed_bytes(n), 1) != 0) return -1;
    int own_map = 0;
    if (qs.type == MT_QUANT_INT4) {
        if (check_part(name, "absmax", p->absmax, "F16", nb, 0) != 0 ||
            check_part(name, "zero", p->zero, "F16", nb, 0) != 0)
            return -1;
    } else {
        if (check_part(name, "absmax", p->absmax, qs.nested ? "U8" : "F32", nb, 0) != 0 ||
            check_part(name, "quant_map", p->quant_map, "F32", 16, 0) != 0)
            return -1;
        const float *canon = mt_q4_quant_map(qs.type);
        for (int i = 0; i < 16; i++)
            if (f32_at(p->quant_map, i) != canon[i]) {  // as values: a -0.0 for FP4's code 8 is fine
                mt_error_set("'%s': quant_map[%d] = %.9g is not bitsandbytes' %s codebook (%.9g); "
                             "bitsandbytes ignores stored 4-bit maps, so this file is not one of its",
                             p->quant_map->name, i, f32_at(p->quant_map, i), mt_qformats[qs.type].name, canon[i]);
                return -1;
            }
        if (!qs.nested && check_finite("absmax", p->absmax) != 0) return -1;
        if (qs.nested) {
            if (check_part(name, "nested_absmax", p->nested_absmax, "F32",
                           mt_q4_blocks(nb, MT_Q4_NESTED_BLOCKSIZE), 0) != 0 ||
                check_part(name, "nested_quant_map", p->nested_quant_map, "F32", 256, 0) != 0 ||
                check_finite("nested_absmax", p->nested_absmax) != 0 ||
                check_finite("nested_quant_map", p->nested_quant_map) != 0)
                return -1;
            for (int i = 0; i < 256; i++)
                if (f32_at(p->nested_quant_map, i) != mt_dynamic_map[i]) own_map = 1;
        } else if (p->nested_absmax || p->nested_quant_map) {
            mt_error_set("'%s': nested constants present but the quant_state has no nested_offset", name);
            return -1;
        }
    }
    if (mt_qweight_alloc(q, be, name, qs.out, qs.in, qs.type, qs.blocksize, qs.nested, own_map) != 0) return -1;
    q->dtype = qs.dtype;
    q->offset = qs.offset;
    mt_tensor_upload(q->packed, p->weight->data);
    mt_tensor_upload(q->absmax, p->absmax->data);
    if (q->zero) mt_tensor_upload(q->zero, p->zero->data);
    if (q->nested_absmax) mt_tensor_upload(q->nested_absmax, p->nested_absmax->data);
    if (q->nested_map) mt_tensor_upload(q->nested_map, p->nested_quant_map->data);
    return 0;
}

// ---------------------------------------------------------------------------------------------
// Streaming a checkpoint

// Drops the pages of [p, p + n) from this process (the mapping is read-only and private, so
// they are re-read from the page cache if touched again).
void mt_quant_drop_pages(const void *p, size_t n) {
    if (!n) return;
    uintptr_t pg = (uintptr_t)sysconf(_SC_PAGESIZE);
    uintptr_t a = (uintptr_t)p & ~(pg - 1), b = ((uintptr_t)p + n + pg - 1) & ~(pg - 1);
    (void)madvise((void *)a, b - a, MADV_DONTNEED);
}

static void drop_tensor(const mt_st_tensor *t) {
    if (t) mt_quant_drop_pages(t->data, (size_t)t->nbytes);
}

void mt_quant_item_to_f32(const mt_quant_item *it, float *dst) {
    size_t n = 1;
    for (int d = 0; d < it->ndim; d++) n *= (size_t)it->shape[d];
    mt_convert(dst, MT_F32, it->data, it->dtype, n);
}

static int st_dtype(const mt_st_tensor *t, mt_dtype *out) {
    if (mt_st_float_dtype(t->dtype, out) != 0) {
        mt_error_set("'%s': wrong dtype %s (a checkpoint tensor must be F32, BF16 or F16, a bitsandbytes "
                     "4-bit weight with its quant_state, or an F8_E4M3 weight with its weight_scale_inv)",
                     t->name, t->dtype);
        return -1;
    }
    return 0;
}

// A block-FP8 scale that sits beside a weight not stored FP8: a half-converted checkpoint.
static int stray_fp8_scale(const mt_st_model *m, const mt_st_tensor *t) {
    char sname[600];
    snprintf(sname, sizeof sname, "%.580s_scale_inv", t->name);
    if (!mt_st_model_find(m, sname)) return 0;
    mt_error_set("%s: tensor '%s': stored %s, yet '%s' is there as if it were F8_E4M3", m->files[t->file_index].path,
                 t->name, t->dtype, sname);
    return -1;
}

// One tensor (not a part) of the checkpoint, to the sink. *cpu is a lazily made cpu backend for
// imports that are handed over dense.
static int load_one(const mt_st_model *m, const mt_st_tensor *t, mt_backend *be, mt_backend **cpu,
                    const mt_quant_load_opts *o, mt_quant_sink_fn sink, void *ctx) {
    int veto = o->want ? o->want(o->want_ctx, t->name) : 1;
    if (veto < 0) return 0;  // another rank's: its pages are never touched
    mt_bnb_parts parts;
    int pre = mt_bnb_find_parts(m, t->name, &parts);
    if (pre < 0) return -1;
    int want = o->type != MT_QUANT_NONE && (mt_quant_target_of(t->name) & o->targets) && veto;
    mt_quant_item it;
    memset(&it, 0, sizeof it);
    it.name = t->name;
    it.ndim = t->ndim;
    memcpy(it.shape, t->shape, sizeof t->shape);
    mt_qweight q;
    memset(&q, 0, sizeof q);
    float *dense = NULL;
    int rc = 0;
    if (pre) {
        mt_backend *dst = want ? be : (*cpu ? *cpu : (*cpu = mt_backend_cpu_new()));
        if (mt_qweight_import(&q, dst, t->name, &parts) != 0) return -1;
        it.ndim = 2;
        it.shape[0] = q.out;
        it.shape[1] = q.in;
        if (want) {
            it.q = &q;
        } else {  // handed over dense: the router of a bnb checkpoint, or --quant none
            dense = mt_xmalloc((size_t)(q.out * q.in) * sizeof(float));
            mt_qweight_dequantize_rows_cpu(&q, dense, 0, q.out);
            mt_qweight_free(&q);
            it.data = dense;
            it.dtype = MT_F32;
            it.dequantized = 1;
        }
    } else {
        mt_dtype dt;
        const void *data = t->data;
        if (strcmp(t->dtype, "F8_E4M3") == 0) {  // block FP8: from here on an f32 weight like any other
            if (!(dense = mt_fp8_dequantize_tensor(m, t, o->fp8_block))) return -1;
            data = dense, dt = MT_F32;
        } else if (st_dtype(t, &dt) != 0 || stray_fp8_scale(m, t) != 0) {
            return -1;
        }
        if (want && t->ndim == 2) {
            if (mt_qweight_quantize_from(&q, be, t->name, data, dt, t->shape[0], t->shape[1], o->type, o->blocksize,
                                         o->double_quant, dense ? NULL : mt_quant_drop_pages) != 0) {
                free(dense);
                return -1;
            }
            it.q = &q;
        } else {
            it.data = data;
            it.dtype = dt;
        }
    }
    rc = sink(ctx, &it);
    mt_qweight_free(&q);  // a no-op when the sink took it
    free(dense);
    drop_tensor(t);
    const mt_st_tensor *ps[] = {parts.absmax, parts.zero, parts.quant_map, parts.nested_absmax,
                                parts.nested_quant_map, parts.quant_state};
    for (size_t i = 0; i < MT_ARRAY_LEN(ps); i++) drop_tensor(ps[i]);
    return rc;
}

// "P_blocks" with its "P_scales": handed over as stored (U8, the shapes checked against each
// other); the sink knows which fused tensor it is.
static int load_mxfp4(const mt_st_model *m, const mt_st_tensor *t, mt_quant_sink_fn sink, void *ctx) {
    char sname[600];
    snprintf(sname, sizeof sname, "%.*s_scales", (int)(strlen(t->name) - strlen("_blocks")), t->name);
    const mt_st_tensor *sc = mt_st_model_find(m, sname);
    if (!sc) {
        mt_error_set("'%s': MXFP4 blocks without their scales '%s'", t->name, sname);
        return -1;
    }
    int ok = strcmp(t->dtype, "U8") == 0 && strcmp(sc->dtype, "U8") == 0 && t->ndim >= 2 && t->ndim == sc->ndim + 1 &&
             t->shape[t->ndim - 1] == 16;
    for (int d = 0; ok && d < sc->ndim; d++) ok = t->shape[d] == sc->shape[d];
    if (!ok) {
        mt_error_set("'%s' / '%s': MXFP4 wants U8 blocks [..., rows, n/32, 16] and U8 scales [..., rows, n/32]",
                     t->name, sname);
        return -1;
    }
    mt_quant_item it;
    memset(&it, 0, sizeof it);
    it.name = t->name;
    it.ndim = t->ndim;
    memcpy(it.shape, t->shape, sizeof t->shape);
    it.mx_blocks = t->data, it.mx_scales = sc->data;
    int rc = sink(ctx, &it);
    drop_tensor(t), drop_tensor(sc);
    return rc;
}

int mt_quant_load(const char *dir, mt_backend *be, const mt_quant_load_opts *opts,
                  mt_quant_sink_fn sink, void *ctx) {
    mt_st_model m;
    if (mt_st_model_open(&m, dir) != 0) return -1;
    mt_backend *cpu = NULL;
    int rc = 0;
    for (size_t f = 0; f < m.n_files && rc == 0; f++) {
        const mt_st_file *file = &m.files[f];
        for (size_t i = 0; i < file->n_tensors && rc == 0; i++) {  // file order: sequential reads
            const mt_st_tensor *t = &file->tensors[i];
            char base[600];
            if (part_base(t->name, base, sizeof base)) {
                if (mt_st_model_find(&m, base)) continue;  // loaded with its weight
                mt_error_set("'%s': a quantization constant without its weight '%s'", t->name, base);
                rc = -1;
                break;
            }
            size_t len = strlen(t->name);
            if (mt_fp8_scale_base(t->name, base, sizeof base)) {  // block FP8: read with its weight
                if (mt_st_model_find(&m, base)) continue;
                mt_error_set("%s: tensor '%s': a block-FP8 scale without its weight '%s'", file->path, t->name, base);
                rc = -1;
                break;
            }
            if (ends_with(t->name, "_scales") && len < sizeof base) {  // MXFP4: read with its blocks
                snprintf(base, sizeof base, "%.*s_blocks", (int)(len - 7), t->name);
                if (mt_st_model_find(&m, base)) continue;
            }
            rc = ends_with(t->name, "_blocks") ? load_mxfp4(&m, t, sink, ctx) : load_one(&m, t, be, &cpu, opts, sink, ctx);
        }
    }
    if (rc != 0) mt_error_prefix("%s", dir);
    mt_backend_free(cpu);
    mt_st_model_close(&m);
    return rc;
}
