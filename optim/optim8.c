// optim/optim8.c — the 8-bit optimizer state: bitsandbytes' blockwise dynamic quantization of
// Adam's m (signed map) and v (unsigned map), blocks of 256 with an fp32 absmax (optim.h has the
// rules; the update that uses them is in optim.c).
#include <math.h>
#include <string.h>

#include "core/common.h"
#include "quant/formats.h"  // MT_DYNAMIC_MAP_VALUES (the signed map), mt_q8_code
#include "optim/optim.h"

// create_dynamic_map(signed=False, max_exponent_bits=7, total_bits=8): for each decade
// 10^-6 .. 10^0, the midpoints of torch.linspace(0.1, 1, 2^(i+1) + 1) in fp32, then 0 and 1,
// sorted. Dumped from bitsandbytes 0.50.2 (name2qmap["udynamic"], bitsandbytes/optim/
// optimizer.py fill_qmap) as hex floats, like the signed map in quant/formats.h.
static const float umap[256] = {
    0x0p+0f, 0x1.5cf754p-22f, 0x1.a0133p-21f, 0x1.1d367p-19f,
    0x1.2599ecp-18f, 0x1.bc98a2p-18f, 0x1.29cbaap-17f, 0x1.0624dcp-16f,
    0x1.c2e34p-16f, 0x1.3fd0dp-15f, 0x1.9e3p-15f, 0x1.fc8f34p-15f,
    0x1.2d7732p-14f, 0x1.5ca6c8p-14f, 0x1.8bd662p-14f, 0x1.0cb296p-13f,
    0x1.82a994p-13f, 0x1.f8a092p-13f, 0x1.374bc8p-12f, 0x1.724744p-12f,
    0x1.ad42c6p-12f, 0x1.e83e44p-12f, 0x1.119ce2p-11f, 0x1.2f1aap-11f,
    0x1.4c986p-11f, 0x1.6a162p-11f, 0x1.8793dep-11f, 0x1.a511ap-11f,
    0x1.c28f5ep-11f, 0x1.e00d1cp-11f, 0x1.fd8adcp-11f, 0x1.2b020cp-10f,
    0x1.74bc6ap-10f, 0x1.be76c8p-10f, 0x1.041894p-9f, 0x1.28f5c2p-9f,
    0x1.4dd2fp-9f, 0x1.72b02p-9f, 0x1.978d4ep-9f, 0x1.bc6a8p-9f,
    0x1.e147aep-9f, 0x1.03126ep-8f, 0x1.158104p-8f, 0x1.27ef9ep-8f,
    0x1.3a5e34p-8f, 0x1.4cccccp-8f, 0x1.5f3b64p-8f, 0x1.71a9fap-8f,
    0x1.841894p-8f, 0x1.96872ap-8f, 0x1.a8f5c2p-8f, 0x1.bb645cp-8f,
    0x1.cdd2fp-8f, 0x1.e0418ap-8f, 0x1.f2b01ep-8f, 0x1.028f5cp-7f,
    0x1.0bc6a8p-7f, 0x1.14fdf2p-7f, 0x1.1e354p-7f, 0x1.276c8ap-7f,
    0x1.30a3d6p-7f, 0x1.39db24p-7f, 0x1.43126ep-7f, 0x1.5eb854p-7f,
    0x1.8ccccep-7f, 0x1.bae146p-7f, 0x1.e8f5c4p-7f, 0x1.0b851ep-6f,
    0x1.228f5ep-6f, 0x1.39999ap-6f, 0x1.50a3d6p-6f, 0x1.67ae16p-6f,
    0x1.7eb852p-6f, 0x1.95c28ep-6f, 0x1.accccep-6f, 0x1.c3d70ep-6f,
    0x1.dae146p-6f, 0x1.f1eb86p-6f, 0x1.047aep-5f, 0x1.1p-5f,
    0x1.1b851ep-5f, 0x1.270a3ep-5f, 0x1.328f5ep-5f, 0x1.3e147ap-5f,
    0x1.49999ap-5f, 0x1.551eb8p-5f, 0x1.60a3d6p-5f, 0x1.6c28f6p-5f,
    0x1.77ae14p-5f, 0x1.833334p-5f, 0x1.8eb85p-5f, 0x1.9a3d7p-5f,
    0x1.a5c28ep-5f, 0x1.b147aep-5f, 0x1.bccccep-5f, 0x1.c851eep-5f,
    0x1.d3d70ep-5f, 0x1.df5c2ap-5f, 0x1.eae146p-5f, 0x1.f66666p-5f,
    0x1.00f5c4p-4f, 0x1.06b854p-4f, 0x1.0c7ae2p-4f, 0x1.123d7p-4f,
    0x1.18p-4f, 0x1.1dc29p-4f, 0x1.23852p-4f, 0x1.2947aep-4f,
    0x1.2f0a3ep-4f, 0x1.34cccep-4f, 0x1.3a8f5ep-4f, 0x1.4051ecp-4f,
    0x1.46147cp-4f, 0x1.4bd70ap-4f, 0x1.51999ap-4f, 0x1.575c2ap-4f,
    0x1.5d1eb8p-4f, 0x1.62e148p-4f, 0x1.68a3d6p-4f, 0x1.6e6666p-4f,
    0x1.7428f6p-4f, 0x1.79eb86p-4f, 0x1.7fae16p-4f, 0x1.8570a4p-4f,
    0x1.8b3334p-4f, 0x1.90f5c4p-4f, 0x1.96b852p-4f, 0x1.a8p-4f,
    0x1.c4ccccp-4f, 0x1.e1999ap-4f, 0x1.fe6666p-4f, 0x1.0d9998p-3f,
    0x1.1cp-3f, 0x1.2a6668p-3f, 0x1.38ccccp-3f, 0x1.473334p-3f,
    0x1.559998p-3f, 0x1.64p-3f, 0x1.726668p-3f, 0x1.80ccccp-3f,
    0x1.8f3334p-3f, 0x1.9d9998p-3f, 0x1.acp-3f, 0x1.ba6668p-3f,
    0x1.c8ccccp-3f, 0x1.d73334p-3f, 0x1.e59998p-3f, 0x1.f4p-3f,
    0x1.013332p-2f, 0x1.086666p-2f, 0x1.0f999ap-2f, 0x1.16ccccp-2f,
    0x1.1ep-2f, 0x1.253334p-2f, 0x1.2c6666p-2f, 0x1.339998p-2f,
    0x1.3accccp-2f, 0x1.42p-2f, 0x1.493334p-2f, 0x1.506666p-2f,
    0x1.579998p-2f, 0x1.5eccccp-2f, 0x1.66p-2f, 0x1.6d3334p-2f,
    0x1.746666p-2f, 0x1.7b9998p-2f, 0x1.82ccccp-2f, 0x1.8ap-2f,
    0x1.913334p-2f, 0x1.986666p-2f, 0x1.9f9998p-2f, 0x1.a6ccccp-2f,
    0x1.aep-2f, 0x1.b53334p-2f, 0x1.bc6666p-2f, 0x1.c39998p-2f,
    0x1.caccccp-2f, 0x1.d2p-2f, 0x1.d93334p-2f, 0x1.e06666p-2f,
    0x1.e79998p-2f, 0x1.eeccccp-2f, 0x1.f6p-2f, 0x1.fd3332p-2f,
    0x1.023334p-1f, 0x1.05ccccp-1f, 0x1.096666p-1f, 0x1.0dp-1f,
    0x1.109998p-1f, 0x1.143334p-1f, 0x1.17ccccp-1f, 0x1.1b6668p-1f,
    0x1.1fp-1f, 0x1.22999ap-1f, 0x1.263334p-1f, 0x1.29ccccp-1f,
    0x1.2d6668p-1f, 0x1.31p-1f, 0x1.34999ap-1f, 0x1.383334p-1f,
    0x1.3bccccp-1f, 0x1.3f6668p-1f, 0x1.43p-1f, 0x1.46999ap-1f,
    0x1.4a3334p-1f, 0x1.4dccccp-1f, 0x1.516668p-1f, 0x1.55p-1f,
    0x1.58999ap-1f, 0x1.5c3334p-1f, 0x1.5fccccp-1f, 0x1.636668p-1f,
    0x1.67p-1f, 0x1.6a999ap-1f, 0x1.6e3334p-1f, 0x1.71ccccp-1f,
    0x1.756668p-1f, 0x1.79p-1f, 0x1.7c999ap-1f, 0x1.803334p-1f,
    0x1.83ccccp-1f, 0x1.876668p-1f, 0x1.8bp-1f, 0x1.8e9998p-1f,
    0x1.923334p-1f, 0x1.95ccccp-1f, 0x1.996668p-1f, 0x1.9dp-1f,
    0x1.a09998p-1f, 0x1.a43334p-1f, 0x1.a7ccccp-1f, 0x1.ab6668p-1f,
    0x1.afp-1f, 0x1.b29998p-1f, 0x1.b63334p-1f, 0x1.b9ccccp-1f,
    0x1.bd6668p-1f, 0x1.c1p-1f, 0x1.c49998p-1f, 0x1.c83334p-1f,
    0x1.cbccccp-1f, 0x1.cf6668p-1f, 0x1.d3p-1f, 0x1.d69998p-1f,
    0x1.da3334p-1f, 0x1.ddccccp-1f, 0x1.e16668p-1f, 0x1.e5p-1f,
    0x1.e89998p-1f, 0x1.ec3334p-1f, 0x1.efccccp-1f, 0x1.f36668p-1f,
    0x1.f7p-1f, 0x1.fa9998p-1f, 0x1.fe3334p-1f, 0x1p+0f
};
static const float smap[256] = {MT_DYNAMIC_MAP_VALUES};

const float *mt_adam8_map(int is_signed) { return is_signed ? smap : umap; }

void mt_adam8_quantize(int is_signed, const float *x, int64_t n, uint8_t *codes, float *absmax) {
    const float *map = mt_adam8_map(is_signed);
    const uint8_t zero = is_signed ? 127 : 0;  // the code of 0.0
    for (int64_t b = 0, s = 0; s < n; b++, s += MT_ADAM8_BLOCK) {
        int64_t len = MT_MIN((int64_t)MT_ADAM8_BLOCK, n - s);
        float a = 0.0f;
        for (int64_t i = 0; i < len; i++) a = fmaxf(a, fabsf(x[s + i]));
        absmax[b] = a;
        if (a == 0.0f) {
            memset(codes + s, zero, (size_t)len);
            continue;
        }
        for (int64_t i = 0; i < len; i++) {
            float xi = x[s + i];
            unsigned c = mt_q8_code(map, xi / a);
            // The kernel's sign fix: a code whose value has the other sign bit than m (a small
            // negative m rounded to +0.0) moves one step toward m's side.
            if (is_signed && signbit(map[c]) != signbit(xi)) c = xi > 0.0f ? c + 1 : c - 1;
            codes[s + i] = (uint8_t)c;
        }
    }
}

void mt_adam8_dequantize(int is_signed, const uint8_t *codes, const float *absmax, int64_t n,
                         float *y) {
    const float *map = mt_adam8_map(is_signed);
    for (int64_t i = 0; i < n; i++) y[i] = map[codes[i]] * absmax[i / MT_ADAM8_BLOCK];
}
