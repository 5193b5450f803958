// model/weights.c — checkpoint tensor names and shapes; random initialisation.
#include "model/weights.h"

#include <stdio.h>

#include "core/common.h"
#include "core/rng.h"

static mt_weight_desc *add(mt_weight_desc *list, size_t *n, mt_weight_kind kind, int layer,
                           int expert, int64_t d0, int64_t d1, const char *fmt, ...)
    __attribute__((format(printf, 8, 9)));

#include <stdarg.h>
static mt_weight_desc *add(mt_weight_desc *list, size_t *n, mt_weight_kind kind, int layer,
                           int expert, int64_t d0, int64_t d1, const char *fmt, ...) {
    mt_weight_desc *w = &list[(*n)++];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(w->name, sizeof w->name, fmt, ap);
    va_end(ap);
    w->kind = kind;
    w->layer = layer;
    w->expert = expert;
    w->ndim = d1 ? 2 : 1;
    w->shape[0] = d0;
    w->shape[1] = d1;
    return w;
}

size_t mt_weights_list(const mt_model_config *c, mt_weight_desc **out) {
    size_t cap = 3 + (size_t)c->layers * (7 + 3 * (size_t)c->experts), n = 0;
    mt_weight_desc *l = mt_xcalloc(cap, sizeof *l);
    int64_t h = c->hidden, q = c->heads * c->head_dim, kv = c->kv_heads * c->head_dim;
    add(l, &n, MT_WEIGHT_EMBED, -1, -1, c->vocab, h, "model.embed_tokens.weight");
    for (int L = 0; L < c->layers; L++) {
        const char *p = "model.layers";
        add(l, &n, MT_WEIGHT_NORM, L, -1, h, 0, "%s.%d.input_layernorm.weight", p, L);
        add(l, &n, MT_WEIGHT_LINEAR, L, -1, q, h, "%s.%d.self_attn.q_proj.weight", p, L);
        add(l, &n, MT_WEIGHT_LINEAR, L, -1, kv, h, "%s.%d.self_attn.k_proj.weight", p, L);
        add(l, &n, MT_WEIGHT_LINEAR, L, -1, kv, h, "%s.%d.self_attn.v_proj.weight", p, L);
        add(l, &n, MT_WEIGHT_LINEAR, L, -1, h, q, "%s.%d.self_attn.o_proj.weight", p, L);
        add(l, &n, MT_WEIGHT_NORM, L, -1, h, 0, "%s.%d.post_attention_layernorm.weight", p, L);
        add(l, &n, MT_WEIGHT_LINEAR, L, -1, c->experts, h, "%s.%d.block_sparse_moe.gate.weight", p, L);
        for (int e = 0; e < c->experts; e++) {
            const char *x = "block_sparse_moe.experts";
            add(l, &n, MT_WEIGHT_LINEAR, L, e, c->intermediate, h, "%s.%d.%s.%d.w1.weight", p, L, x, e);
            add(l, &n, MT_WEIGHT_LINEAR, L, e, h, c->intermediate, "%s.%d.%s.%d.w2.weight", p, L, x, e);
            add(l, &n, MT_WEIGHT_LINEAR, L, e, c->intermediate, h, "%s.%d.%s.%d.w3.weight", p, L, x, e);
        }
    }
    add(l, &n, MT_WEIGHT_NORM, -1, -1, h, 0, "model.norm.weight");
    if (!c->tie_word_embeddings) add(l, &n, MT_WEIGHT_LINEAR, -1, -1, c->vocab, h, "lm_head.weight");
    *out = l;
    return n;
}

void mt_weights_init_fill(const mt_model_config *cfg, const mt_weight_desc *w, uint64_t seed,
                          mt_dtype dtype, void *dst) {
    size_t numel = (size_t)w->shape[0] * (size_t)(w->ndim == 2 ? w->shape[1] : 1);
    mt_rng rng;
    mt_rng_seed(&rng, seed, mt_hash_string(w->name));
    float std = (float)cfg->initializer_range;
    enum { CHUNK = 4096 };
    float buf[CHUNK];
    for (size_t i = 0; i < numel; i += CHUNK) {
        size_t m = MT_MIN((size_t)CHUNK, numel - i);
        for (size_t j = 0; j < m; j++) buf[j] = w->kind == MT_WEIGHT_NORM ? 1.0f : std * mt_rng_normal(&rng);
        mt_convert((char *)dst + mt_dtype_bytes(dtype, i), dtype, buf, MT_F32, m);
    }
}
