// model/rmsnorm.c — RMSNorm as transformers' MixtralRMSNorm (CPU reference, fp32):
// y = w · (x · rsqrt(mean(x²) + eps)).
// The row loops are `omp simd` reductions (in double, as before), built for x86-64-v3 and the
// baseline (core/vmath.h's MT_HOT).
#include <math.h>

#include "core/vmath.h"
#include "model/ops.h"

// x [T, H], w [H] → y [T, H], rstd [T] = 1/sqrt(mean(x²) + eps) (kept for backward)
MT_HOT void rmsnorm_forward_cpu(float *restrict y, float *restrict rstd, const float *restrict x,
                               const float *restrict w, int T, int H, float eps) {
#pragma omp parallel for
    for (int t = 0; t < T; t++) {
        const float *xt = x + (int64_t)t * H;
        float *yt = y + (int64_t)t * H;
        double ss = 0.0;  // mean of squares accumulated in double: closer to exact than torch's
#pragma omp simd reduction(+ : ss)
        for (int i = 0; i < H; i++) ss += (double)xt[i] * xt[i];
        float r = 1.0f / sqrtf((float)(ss / H) + eps);
#pragma omp simd
        for (int i = 0; i < H; i++) yt[i] = w[i] * (xt[i] * r);  // HF: weight * (x * rstd)
        rstd[t] = r;
    }
}

// With n = x·r (r = rstd), y = w ⊙ n and dr/dx_k = -r³ x_k / H:
//   dx_k += r · (w_k dy_k − n_k · mean_i(w_i dy_i n_i)),   dw_i += Σ_t dy_i n_i.
// dy, x [T, H], w [H], rstd [T] → dx [T, H] +=, dw [H] += (either may be NULL)
MT_HOT void rmsnorm_backward_cpu(float *restrict dx, float *restrict dw, const float *restrict dy,
                                 const float *restrict x, const float *restrict w, const float *restrict rstd,
                                 int T, int H) {
    if (dx) {
#pragma omp parallel for
        for (int t = 0; t < T; t++) {
            const float *xt = x + (int64_t)t * H, *gt = dy + (int64_t)t * H;
            float *dxt = dx + (int64_t)t * H;
            float r = rstd[t];
            double dot = 0.0;  // Σ_i w_i dy_i n_i
#pragma omp simd reduction(+ : dot)
            for (int i = 0; i < H; i++) dot += (double)w[i] * gt[i] * (xt[i] * r);
            float c = (float)(dot / H);
#pragma omp simd
            for (int i = 0; i < H; i++) dxt[i] += r * (w[i] * gt[i] - (xt[i] * r) * c);
        }
    }
    if (dw) {
        // Columns are independent: parallel over i, each summing its column over t in order.
#pragma omp parallel for
        for (int i = 0; i < H; i++) {
            double s = 0.0;
            for (int t = 0; t < T; t++) s += (double)dy[(int64_t)t * H + i] * (x[(int64_t)t * H + i] * rstd[t]);
            dw[i] += (float)s;
        }
    }
}
