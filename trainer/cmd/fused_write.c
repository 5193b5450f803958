// trainer/cmd/fused_write.c — gpt-oss's fused experts written out (trainer/cmd/fused_write.h). One
// expert at a time: its slice of the base in f32 ([in, rows]), each of its Linears taken out, changed
// by the caller and put back, then the slice written out. Peak memory: two expert slices.
#include "trainer/cmd/fused_write.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/common.h"
#include "model/fused_experts.h"
#include "quant/quant.h"

// The MXFP4 parts of `d` in the base, or NULL.
static const mt_st_tensor *mx_part(const mt_fused_write *f, const mt_weight_desc *d, const char *suffix) {
    char name[200];
    snprintf(name, sizeof name, "%s%s", d->name, suffix);
    return mt_st_model_find(f->st, name);
}

int mt_fused_write_is_mxfp4(const mt_fused_write *f, const mt_weight_desc *d) {
    return !mt_st_model_find(f->st, d->name) && mx_part(f, d, "_blocks") != NULL;
}

int mt_fused_write_check(const mt_fused_write *f, const mt_weight_desc *d) {
    int64_t E = d->shape[0], in = d->shape[1], rows = d->shape[2];
    const mt_st_tensor *t = mt_st_model_find(f->st, d->name);
    if (t) {
        int ok = t->ndim == 3 && t->shape[0] == E && t->shape[1] == in && t->shape[2] == rows;
        mt_dtype dt;
        if (!ok || mt_st_float_dtype(t->dtype, &dt) != 0) {
            mt_error_set("tensor '%s' of the base is not a float [%lld, %lld, %lld] (its config's fused experts)",
                         d->name, (long long)E, (long long)in, (long long)rows);
            return -1;
        }
        return 0;
    }
    const mt_st_tensor *b = mx_part(f, d, "_blocks"), *s = mx_part(f, d, "_scales");
    if (!b && !s) {
        mt_error_set("tensor '%s' is missing from the base checkpoint (dense, or MXFP4 '%s_blocks' with '%s_scales')",
                     d->name, d->name, d->name);
        return -1;
    }
    int ok = b && s && in % MT_MXFP4_BLOCK == 0 && strcmp(b->dtype, "U8") == 0 && strcmp(s->dtype, "U8") == 0 &&
             b->ndim == 4 && b->shape[0] == E && b->shape[1] == rows && b->shape[2] == in / MT_MXFP4_BLOCK &&
             b->shape[3] == MT_MXFP4_BLOCK / 2 && s->ndim == 3 && s->shape[0] == E && s->shape[1] == rows &&
             s->shape[2] == in / MT_MXFP4_BLOCK;
    if (!ok) {
        mt_error_set("'%s_blocks' / '%s_scales': MXFP4 wants U8 [%lld, %lld, %lld, 16] and U8 [%lld, %lld, %lld] "
                     "for this config", d->name, d->name, (long long)E, (long long)rows, (long long)(in / 32),
                     (long long)E, (long long)rows, (long long)(in / 32));
        return -1;
    }
    return 0;
}

int mt_fused_write_entries(const mt_weight_desc *d, int mxfp4, const char *dtype, char names[2][160],
                           mt_st_entry *e) {
    int64_t E = d->shape[0], in = d->shape[1], rows = d->shape[2];
    memset(e, 0, 2 * sizeof *e);
    if (!mxfp4) {
        snprintf(names[0], 160, "%s", d->name);
        e[0] = (mt_st_entry){.name = names[0], .dtype = dtype, .ndim = 3, .shape = {E, in, rows}};
        return 1;
    }
    if (in % MT_MXFP4_BLOCK) {
        mt_error_set("'%s': MXFP4 wants its input width %lld to be a multiple of 32", d->name, (long long)in);
        return -1;
    }
    snprintf(names[0], 160, "%s_blocks", d->name);
    snprintf(names[1], 160, "%s_scales", d->name);
    e[0] = (mt_st_entry){.name = names[0], .dtype = "U8", .ndim = 4, .shape = {E, rows, in / 32, 16}};
    e[1] = (mt_st_entry){.name = names[1], .dtype = "U8", .ndim = 3, .shape = {E, rows, in / 32}};
    return 2;
}

static void transpose(const float *a, int64_t r, int64_t c, float *t) {  // t [c, r] = aᵀ
    for (int64_t i = 0; i < r; i++)
        for (int64_t j = 0; j < c; j++) t[j * r + i] = a[i * c + j];
}

// Expert e's slice [in, rows] of the base in f32; `rowbuf` [rows, in] scratch.
static void base_slice(const mt_fused_write *f, const mt_weight_desc *d, int64_t e, float *slice, float *rowbuf) {
    int64_t in = d->shape[1], rows = d->shape[2], n = in * rows;
    const mt_st_tensor *t = mt_st_model_find(f->st, d->name);
    if (t) {
        mt_dtype dt;
        mt_st_float_dtype(t->dtype, &dt);  // checked by mt_fused_write_check
        mt_convert(slice, MT_F32, (const char *)t->data + mt_dtype_bytes(dt, (size_t)(e * n)), dt, (size_t)n);
        return;
    }
    const uint8_t *b = mx_part(f, d, "_blocks")->data, *s = mx_part(f, d, "_scales")->data;
    mt_mxfp4_dequantize_ref(b + e * n / 2, s + e * n / MT_MXFP4_BLOCK, 0, n, rowbuf);
    transpose(rowbuf, rows, in, slice);
}

// Each Linear of expert e in the slice, through the caller.
static int apply_expert(mt_fused_write *f, const mt_weight_desc *d, int64_t e, float *slice, int mxfp4_base,
                        float *w, float *before) {
    static const int gate_up[] = {0, 2}, down[] = {1};
    size_t pre;
    int is_down = mt_fused_tensor_of(d->name, &pre) == 1;
    const int *which = is_down ? down : gate_up;
    int n = is_down ? 1 : 2;
    for (int k = 0; k < n; k++) {
        mt_fused_part p = mt_fused_part_of(which[k], f->hidden, f->inter);
        int64_t out = p.rows / p.stride, numel = out * p.in;
        char module[200];
        snprintf(module, sizeof module, "%.*s.%lld.%s", (int)pre, d->name, (long long)e, f->fam->expert[which[k]]);
        mt_fused_get(slice, p, w);
        memcpy(before, w, (size_t)numel * sizeof(float));
        if (f->apply(f->ctx, module, w, out, p.in, mxfp4_base) != 0) return -1;
        for (int64_t i = 0; i < numel; i++) f->err.delta2 += ((double)w[i] - before[i]) * ((double)w[i] - before[i]);
        mt_fused_put(slice, p, w);
    }
    return 0;
}

// Slice [in, rows] → MXFP4 rows at blocks / scales, the error counted.
static void to_mxfp4(mt_fused_write *f, const float *slice, int64_t in, int64_t rows, uint8_t *blocks,
                     uint8_t *scales, float *rowbuf, float *back) {
    int64_t n = in * rows;
    transpose(slice, in, rows, rowbuf);
    mt_mxfp4_quantize_ref(rowbuf, n, blocks, scales);
    mt_mxfp4_dequantize_ref(blocks, scales, 0, n, back);
    for (int64_t i = 0; i < n; i++) {
        double err = (double)back[i] - rowbuf[i];
        f->err.err2 += err * err, f->err.w2 += (double)rowbuf[i] * rowbuf[i];
        if (fabs(err) > f->err.max_err || isnan(err)) f->err.max_err = fabs(err);
    }
    f->err.n += n;
}

int mt_fused_write_fill(mt_fused_write *f, const mt_weight_desc *d, int mxfp4_out, mt_dtype out_dtype, int part,
                        void *dst, size_t nbytes) {
    int64_t E = d->shape[0], in = d->shape[1], rows = d->shape[2], n = in * rows;
    if (part == 1) {  // the scales, made with the blocks just before
        if (!f->scales || f->scales_bytes != nbytes) {
            mt_error_set("'%s_scales': written without its blocks", d->name);
            return -1;
        }
        memcpy(dst, f->scales, nbytes);
        free(f->scales), f->scales = NULL, f->scales_bytes = 0;
        return 0;
    }
    int mxfp4_base = mt_fused_write_is_mxfp4(f, d);
    float *slice = mt_xmalloc((size_t)n * sizeof(float)), *rowbuf = mt_xmalloc((size_t)n * sizeof(float));
    float *w = mt_xmalloc((size_t)n * sizeof(float)), *before = mt_xmalloc((size_t)n * sizeof(float));
    float *back = mxfp4_out ? mt_xmalloc((size_t)n * sizeof(float)) : NULL;
    if (mxfp4_out) {
        free(f->scales);
        f->scales_bytes = (size_t)(E * n / MT_MXFP4_BLOCK);
        f->scales = mt_xmalloc(f->scales_bytes);
    }
    int rc = 0;
    for (int64_t e = 0; e < E && rc == 0; e++) {
        base_slice(f, d, e, slice, rowbuf);
        if (f->apply && (rc = apply_expert(f, d, e, slice, mxfp4_base, w, before)) != 0) break;
        if (mxfp4_out)
            to_mxfp4(f, slice, in, rows, (uint8_t *)dst + e * n / 2, f->scales + e * n / MT_MXFP4_BLOCK, rowbuf, back);
        else
            mt_convert((char *)dst + mt_dtype_bytes(out_dtype, (size_t)(e * n)), out_dtype, slice, MT_F32, (size_t)n);
    }
    free(slice), free(rowbuf), free(w), free(before), free(back);
    return rc;
}

void mt_fused_write_free(mt_fused_write *f) {
    free(f->scales);
    f->scales = NULL;
}
