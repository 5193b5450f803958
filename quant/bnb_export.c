// quant/bnb_export.c — a frozen weight as bitsandbytes serialises it (docs/formats.md "Serialized quant_state"): the
// tensors of Linear4bit._save_to_state_dict, in its order, and the quant_state JSON exactly as
// Python's json.dumps writes QuantState.as_dict(packed=True)'s non-tensor items. MXFP4 is no
// bitsandbytes format: it goes out as gpt-oss checkpoints carry it (mxfp4_export, below).
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/common.h"
#include "quant/quant.h"

// ---------------------------------------------------------------------------------------------
// Python's float repr: the shortest digits that read back to the same double; fixed notation
// for decimal exponents -4..15, else d.ddde±XX.

void mt_py_float_repr(double v, char *buf, size_t n) {
    if (isnan(v)) { snprintf(buf, n, "NaN"); return; }
    if (isinf(v)) { snprintf(buf, n, v < 0 ? "-Infinity" : "Infinity"); return; }
    if (v == 0) { snprintf(buf, n, signbit(v) ? "-0.0" : "0.0"); return; }
    char e[40];
    for (int p = 1; p <= 17; p++) {
        snprintf(e, sizeof e, "%.*e", p - 1, v);
        if (strtod(e, NULL) == v) break;
    }
    // e = "[-]d[.ddd]e[+-]XX"
    const char *s = e;
    int neg = *s == '-';
    if (neg) s++;
    char digits[24];
    int nd = 0;
    for (; *s && *s != 'e'; s++)
        if (*s != '.') digits[nd++] = *s;
    int exp10 = atoi(s + 1);
    while (nd > 1 && digits[nd - 1] == '0') nd--;
    digits[nd] = 0;
    char out[64];
    int k = 0;
    if (neg) out[k++] = '-';
    if (exp10 >= -4 && exp10 < 16) {
        if (exp10 >= 0) {
            for (int i = 0; i <= exp10; i++) out[k++] = i < nd ? digits[i] : '0';
            out[k++] = '.';
            if (nd > exp10 + 1)
                for (int i = exp10 + 1; i < nd; i++) out[k++] = digits[i];
            else
                out[k++] = '0';
        } else {
            out[k++] = '0';
            out[k++] = '.';
            for (int i = 0; i < -exp10 - 1; i++) out[k++] = '0';
            for (int i = 0; i < nd; i++) out[k++] = digits[i];
        }
        out[k] = 0;
    } else {
        out[k++] = digits[0];
        if (nd > 1) {
            out[k++] = '.';
            for (int i = 1; i < nd; i++) out[k++] = digits[i];
        }
        snprintf(out + k, sizeof out - (size_t)k, "e%c%02d", exp10 < 0 ? '-' : '+', abs(exp10));
    }
    snprintf(buf, n, "%s", out);
}

static const char *torch_dtype_name(mt_dtype t) {
    return t == MT_BF16 ? "bfloat16" : t == MT_F16 ? "float16" : "float32";
}

char *mt_bnb_quant_state_json(const mt_qweight *q) {
    char buf[512], off[40];
    int k = snprintf(buf, sizeof buf,
                     "{\"quant_type\": \"%s\", \"blocksize\": %d, \"dtype\": \"%s\", \"shape\": [%lld, %lld]",
                     mt_qformats[q->type].name, q->blocksize, torch_dtype_name(q->dtype), (long long)q->out,
                     (long long)q->in);
    if (q->double_quant) {
        mt_py_float_repr((double)q->offset, off, sizeof off);
        k += snprintf(buf + k, sizeof buf - (size_t)k,
                      ", \"nested_blocksize\": %d, \"nested_dtype\": \"float32\", \"nested_offset\": %s",
                      MT_Q4_NESTED_BLOCKSIZE, off);
    }
    snprintf(buf + k, sizeof buf - (size_t)k, "}");
    return mt_xstrdup(buf);
}

// ---------------------------------------------------------------------------------------------
// Entries

static void *keep(mt_bnb_entries *ex, void *p) {
    if (ex->nbufs >= (int)MT_ARRAY_LEN(ex->bufs)) mt_fatal(MT_EXIT_ERROR, "bnb export: too many buffers");
    ex->bufs[ex->nbufs++] = p;
    return p;
}

// Host bytes of t: its own memory on the cpu backend, else a downloaded copy owned by ex.
static const void *host_of(mt_bnb_entries *ex, const mt_tensor *t) {
    if (t->be->ops->kind == MT_BACKEND_CPU) return t->data;
    if (t->be->ops->kind == MT_BACKEND_NULL) return NULL;  // the layout alone
    void *h = keep(ex, mt_xmalloc(t->nbytes ? t->nbytes : 1));
    mt_tensor_download(t, h);
    return h;
}

static void add(mt_bnb_entries *ex, const char *name, const char *suffix, const char *dtype, int ndim,
                int64_t d0, int64_t d1, const void *data) {
    size_t len = strlen(name) + strlen(suffix) + 1;
    char *full = keep(ex, mt_xmalloc(len));
    snprintf(full, len, "%s%s", name, suffix);
    mt_st_entry *e = &ex->entries[ex->n++];
    memset(e, 0, sizeof *e);
    e->name = full;
    e->dtype = dtype;
    e->ndim = ndim;
    e->shape[0] = d0;
    e->shape[1] = d1;
    e->data = data;
}

// MXFP4 as transformers names it for gpt-oss: weight "P.weight" -> "P_blocks" U8 [out, in/32, 16]
// and "P_scales" U8 [out, in/32] (the ".weight" suffix replaced), the stored bytes unchanged. No
// quant_state: the suffixes and the dtype say it all.
static int mxfp4_export(mt_bnb_entries *ex, const char *name, const mt_qweight *q) {
    size_t len = strlen(name);
    if (len > 7 && strcmp(name + len - 7, ".weight") == 0) len -= 7;
    const char *suffix[2] = {"_blocks", "_scales"};
    const mt_tensor *t[2] = {q->packed, q->absmax};
    for (int k = 0; k < 2; k++) {
        size_t n = len + strlen(suffix[k]) + 1;
        char *full = keep(ex, mt_xmalloc(n));
        snprintf(full, n, "%.*s%s", (int)len, name, suffix[k]);
        mt_st_entry *e = &ex->entries[ex->n++];
        memset(e, 0, sizeof *e);
        e->name = full;
        e->dtype = "U8";
        e->ndim = k ? 2 : 3;
        e->shape[0] = q->out;
        e->shape[1] = q->in / MT_MXFP4_BLOCK;
        e->shape[2] = MT_MXFP4_BLOCK / 2;
        e->data = host_of(ex, t[k]);
    }
    return 0;
}

int mt_bnb_export(mt_bnb_entries *ex, const char *name, const mt_qweight *q) {
    memset(ex, 0, sizeof *ex);
    if (q->type == MT_QUANT_MXFP4) return mxfp4_export(ex, name, q);
    int64_t n = q->out * q->in, nb = q->nblocks;
    add(ex, name, "", "U8", 2, mt_q4_packed_bytes(n), 1, host_of(ex, q->packed));
    if (q->type == MT_QUANT_INT4) {
        add(ex, name, ".absmax", "F16", 1, nb, 0, host_of(ex, q->absmax));
        add(ex, name, ".zero", "F16", 1, nb, 0, host_of(ex, q->zero));
    } else {
        add(ex, name, ".absmax", q->double_quant ? "U8" : "F32", 1, nb, 0, host_of(ex, q->absmax));
        add(ex, name, ".quant_map", "F32", 1, 16, 0,
            q->be->ops->kind == MT_BACKEND_NULL ? NULL : (const void *)mt_q4_quant_map(q->type));
        if (q->double_quant) {
            add(ex, name, ".nested_absmax", "F32", 1, mt_q4_blocks(nb, MT_Q4_NESTED_BLOCKSIZE), 0,
                host_of(ex, q->nested_absmax));
            add(ex, name, ".nested_quant_map", "F32", 1, 256, 0,
                q->nested_map ? host_of(ex, q->nested_map)
                : q->be->ops->kind == MT_BACKEND_NULL ? NULL : (const void *)mt_dynamic_map);
        }
    }
    char *json = keep(ex, mt_bnb_quant_state_json(q));
    const char *key = q->type == MT_QUANT_NF4   ? ".quant_state.bitsandbytes__nf4"
                      : q->type == MT_QUANT_FP4 ? ".quant_state.bitsandbytes__fp4"
                                                : ".quant_state.moetrain__int4";
    add(ex, name, key, "U8", 1, (int64_t)strlen(json), 0, json);
    return 0;
}

void mt_bnb_export_free(mt_bnb_entries *ex) {
    for (int i = 0; i < ex->nbufs; i++) free(ex->bufs[i]);
    memset(ex, 0, sizeof *ex);
}
