// model/attention_scratch.c — see model/attention_scratch.h.
#include "model/attention_scratch.h"

static size_t up256(size_t n) { return (n + 255) / 256 * 256; }

size_t mt_att_cudnn_scratch_bytes(int bwd, int B, int S, int nh, int hd, int lens, int kv_given) {
    const size_t rows = (size_t)B * nh * S, len = lens ? up256((size_t)B * 4) : 0;
    return (kv_given ? 1 : 2) * len + up256(rows * 4) + (bwd ? up256(rows * 4) + up256(rows * (size_t)hd * 4) : 0);
}

size_t mt_att_cudnn_staging_bytes(int B, int S, int nh, int nkv, int hd, int hd_v) {
    const size_t rows = (size_t)B * S;
    return rows * ((size_t)nh * hd + (size_t)nkv * hd + (size_t)nkv * hd_v) * 2;
}

size_t mt_att_wmma_scratch_bytes(int bwd, int B, int S, int nh) { return bwd ? (size_t)B * S * nh * 4 : 0; }

int mt_att_cudnn_needs_lens(int bwd, int S, int kv_given, size_t version) {
    return kv_given || (bwd && S % 128 != 0 && version <= 91500);
}

const char *mt_att_cudnn_shape_refusal(int has_key_mask, int has_kv_len, int nh, int nkv, int hd, int hd_v) {
    // d_qk ≠ d_v is cuDNN's to take or refuse at plan time (Hopper takes MLA's 192 | 128).
    if (hd <= 0 || hd > 256 || hd % 8 || hd_v <= 0 || hd_v > 256 || hd_v % 8)
        return "head dims not multiples of 8 up to 256 (cuDNN SDPA's bf16 limits)";
    if (nkv <= 0 || nh % nkv) return "query heads not a multiple of key heads";
    if (has_key_mask && !has_kv_len) return "a key mask not given as sequence lengths";
    return NULL;
}

size_t mt_att_cudnn_workspace_guess(int bwd, int B, int S, int nh, int hd) {
    return bwd ? (size_t)B * S * nh * hd * 4 + 256 : 0;
}
