// tests/test_compare.h — comparing a GPU-step result with the CPU's (relative L2 error, cosine),
// a tensor's values as host f32, and a fresh tiny checkpoint. Include after criterion.h.
#pragma once
#include <math.h>
#include <stdint.h>
#include <stdio.h>

#include "core/backend.h"
#include "core/common.h"
#include "tests/test_util.h"

// ‖a − b‖ / ‖a‖ over n floats (‖a − b‖ when a is zero).
static inline double rel_l2(const float *a, const float *b, int64_t n) {
    double d = 0, s = 0;
    for (int64_t i = 0; i < n; i++) d += ((double)a[i] - b[i]) * ((double)a[i] - b[i]), s += (double)a[i] * a[i];
    return s > 0 ? sqrt(d / s) : sqrt(d);
}

// cos(a, b) over n floats (1 when both are zero).
static inline double cosine(const float *a, const float *b, int64_t n) {
    double ab = 0, aa = 0, bb = 0;
    for (int64_t i = 0; i < n; i++) ab += (double)a[i] * b[i], aa += (double)a[i] * a[i], bb += (double)b[i] * b[i];
    return aa == 0 && bb == 0 ? 1.0 : ab / sqrt(aa * bb);
}

// A tensor's values as f32 on the host (the GPU step keeps bf16); the caller frees them.
static inline float *host_copy(const mt_tensor *t) {
    float *h = mt_xmalloc((size_t)mt_tensor_numel(t) * sizeof(float) + 4);
    mt_tensor_download_f32(t, h);
    return h;
}

// A fresh tiny checkpoint (`moetrain init`, V = 256) in dir [128], below a new temporary folder
// tmp [64].
static inline void tiny_checkpoint(char *tmp, char *dir, int seed) {
    char out[4096];
    mt_test_tmpdir(tmp, 64);
    snprintf(dir, 128, "%s/tiny", tmp);
    cr_assert_eq(mt_test_run(out, sizeof out, "init --config %s/configs/tiny.json --out %s --seed %d", MT_REPO_ROOT,
                             dir, seed), 0, "%s", out);
}
