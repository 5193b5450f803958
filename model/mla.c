// model/mla.c — Multi-head Latent Attention's key and value assembly (DeepSeek V2/V3), CPU, fp32
// (model/ops.h). kv_b_proj gives each head its own no-rope key part and its value; the rope part
// of the key is one vector per token (kv_a_proj_with_mqa's last rope columns, rotated) shared by
// every head, as transformers' DeepseekV3Attention.expand_kv builds key_states.
#include <string.h>

#include "core/common.h"
#include "model/ops.h"

static void mla_check(int nh, int nope, int rope, int vd, int64_t krot_stride) {
    if (nh <= 0 || nope < 0 || rope < 0 || vd <= 0 || krot_stride < rope)
        mt_fatal(MT_EXIT_ERROR, "mla_kv: nh=%d nope=%d rope=%d vd=%d krot_stride=%lld", nh, nope, rope, vd,
                 (long long)krot_stride);
}

// k [T, nh, nope + rope] = kvb[:, h, :nope] | krot[t], v [T, nh, vd] = kvb[:, h, nope:]
void mla_kv_forward_cpu(float *k, float *v, const float *kvb, const float *krot, int64_t krot_stride, int T, int nh,
                        int nope, int rope, int vd) {
    mla_check(nh, nope, rope, vd, krot_stride);
    const int dk = nope + rope, dkv = nope + vd;
#pragma omp parallel for
    for (int t = 0; t < T; t++)
        for (int h = 0; h < nh; h++) {
            const float *src = kvb + ((int64_t)t * nh + h) * dkv;
            float *kr = k + ((int64_t)t * nh + h) * dk;
            memcpy(kr, src, sizeof(float) * nope);
            memcpy(kr + nope, krot + (int64_t)t * krot_stride, sizeof(float) * rope);
            memcpy(v + ((int64_t)t * nh + h) * vd, src + nope, sizeof(float) * vd);
        }
}

// dkvb += (dk's no-rope part | dv), dkrot[t] += Σ_h dk[t, h, nope:] (summed in head order, then added)
void mla_kv_backward_cpu(float *dkvb, float *dkrot, const float *dk, const float *dv, int64_t krot_stride, int T,
                         int nh, int nope, int rope, int vd) {
    mla_check(nh, nope, rope, vd, krot_stride);
    const int dkd = nope + rope, dkv = nope + vd;
#pragma omp parallel for
    for (int t = 0; t < T; t++) {
        if (dkvb)
            for (int h = 0; h < nh; h++) {
                float *g = dkvb + ((int64_t)t * nh + h) * dkv;
                const float *gk = dk + ((int64_t)t * nh + h) * dkd, *gv = dv + ((int64_t)t * nh + h) * vd;
                for (int e = 0; e < nope; e++) g[e] += gk[e];
                for (int e = 0; e < vd; e++) g[nope + e] += gv[e];
            }
        if (dkrot)
            for (int e = 0; e < rope; e++) {
                float s = 0.0f;
                for (int h = 0; h < nh; h++) s += dk[((int64_t)t * nh + h) * dkd + nope + e];
                dkrot[(int64_t)t * krot_stride + e] += s;
            }
    }
}
