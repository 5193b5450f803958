// quant/fp8.c — block-FP8 weights as DeepSeek-V3 and Kimi K2 store them (docs/formats.md "Block
// FP8"): "P.weight" F8_E4M3 [out, in] beside "P.weight_scale_inv" [ceil(out/br), ceil(in/bc)].
// Read only: each weight is dequantized to f32 on load, then treated as a dense one (quantized to
// the run's base format, or kept dense), so nothing downstream knows FP8.
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "core/common.h"
#include "quant/quant.h"

void mt_fp8_dequantize_ref(const uint8_t *w, const float *scale_inv, int64_t out, int64_t in, int br, int bc,
                           float *y) {
    float lut[256];  // every e4m3fn byte, exact
    for (int b = 0; b < 256; b++) lut[b] = mt_f8e4m3_to_f32((uint8_t)b);
    int64_t cols = (in + bc - 1) / bc;
#pragma omp parallel for schedule(static) if (out * in >= (1 << 16))
    for (int64_t i = 0; i < out; i++) {
        const float *s = scale_inv + (i / br) * cols;
        const uint8_t *wi = w + i * in;
        float *yi = y + i * in;
        for (int64_t jb = 0; jb < cols; jb++) {
            int64_t j1 = MT_MIN(in, (jb + 1) * bc);
            for (int64_t j = jb * bc; j < j1; j++) yi[j] = lut[wi[j]] * s[jb];  // one rounding, as torch's mul
        }
    }
}

int mt_fp8_scale_base(const char *name, char *base, size_t n) {
    static const char suffix[] = ".weight_scale_inv";
    size_t len = strlen(name), sl = strlen(suffix), keep = len - strlen("_scale_inv");
    if (len < sl || strcmp(name + len - sl, suffix) != 0 || keep >= n) return 0;
    snprintf(base, n, "%.*s", (int)keep, name);
    return 1;
}

float *mt_fp8_dequantize_tensor(const mt_st_model *m, const mt_st_tensor *t, const int block[2]) {
    const char *file = m->files[t->file_index].path;
    if (block[0] <= 0 || block[1] <= 0) {
        mt_error_set("%s: tensor '%s': stored F8_E4M3, but config.json's quantization_config is not block FP8 "
                     "(quant_method \"fp8\" with weight_block_size)", file, t->name);
        return NULL;
    }
    if (t->ndim != 2) {
        mt_error_set("%s: tensor '%s': an F8_E4M3 weight must be 2-D [out, in], not %d-D", file, t->name, t->ndim);
        return NULL;
    }
    int64_t out = t->shape[0], in = t->shape[1];
    int64_t rows = (out + block[0] - 1) / block[0], cols = (in + block[1] - 1) / block[1];
    char sname[600];
    snprintf(sname, sizeof sname, "%.580s_scale_inv", t->name);  // "P.weight" -> "P.weight_scale_inv"
    const mt_st_tensor *s = mt_st_model_find(m, sname);
    if (!s) {
        mt_error_set("%s: tensor '%s': F8_E4M3 weight without its scale '%s' (one per %dx%d block)", file, t->name,
                     sname, block[0], block[1]);
        return NULL;
    }
    const char *sfile = m->files[s->file_index].path;
    mt_dtype sdt;
    if (mt_st_float_dtype(s->dtype, &sdt) != 0) {
        mt_error_set("%s: tensor '%s': dtype %s (a block-FP8 scale is F32, BF16 or F16)", sfile, sname, s->dtype);
        return NULL;
    }
    if (s->ndim != 2 || s->shape[0] != rows || s->shape[1] != cols) {
        char got[64] = "";
        for (int d = 0, k = 0; d < s->ndim && k < (int)sizeof got; d++)
            k += snprintf(got + k, sizeof got - (size_t)k, "%s%lld", d ? ", " : "", (long long)s->shape[d]);
        mt_error_set("%s: tensor '%s': shape [%s], where weight [%lld, %lld] in blocks of %dx%d "
                     "(quantization_config's weight_block_size) needs [%lld, %lld]", sfile, sname, got,
                     (long long)out, (long long)in, block[0], block[1], (long long)rows, (long long)cols);
        return NULL;
    }
    float *scale = mt_xmalloc((size_t)MT_MAX(rows * cols, 1) * sizeof(float));
    mt_convert(scale, MT_F32, s->data, sdt, (size_t)(rows * cols));  // also aligns the mmapped bytes
    for (int64_t k = 0; k < rows * cols; k++)
        if (!isfinite(scale[k])) {  // a corrupt scale would silently ruin its whole block
            mt_error_set("%s: tensor '%s': element [%lld, %lld] is %g", sfile, sname, (long long)(k / cols),
                         (long long)(k % cols), scale[k]);
            free(scale);
            return NULL;
        }
    float *y = mt_xmalloc((size_t)MT_MAX(out * in, 1) * sizeof(float));
    mt_fp8_dequantize_ref(t->data, scale, out, in, block[0], block[1], y);
    free(scale);
    mt_quant_drop_pages(s->data, (size_t)s->nbytes);
    return y;
}
