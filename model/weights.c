// model/weights.c — checkpoint tensor names and shapes; random initialisation.
#include "model/weights.h"

#include <stdio.h>

#include "core/common.h"
#include "core/rng.h"

static mt_weight_desc *add(mt_weight_desc *list, size_t *n, mt_weight_kind kind, int layer,
                           int expert, int64_t d0, int64_t d1, const char *fmt, ...)
    __attribute__((format(printf, 8, 9)));

int64_t mt_weight_numel(const mt_weight_desc *w) {
    int64_t n = 1;
    for (int d = 0; d < w->ndim; d++) n *= w->shape[d];
    return n;
}

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

// MLA's attention (DeepseekV2/V3Attention): q_a_proj, q_a_layernorm, q_b_proj (or q_proj without
// q_lora_rank), kv_a_proj_with_mqa, kv_a_layernorm, kv_b_proj, o_proj; attention_bias gives q_a, kv_a
// and o biases.
static void mla_weights(const mt_model_config *c, mt_weight_desc *l, size_t *n, int L) {
    int64_t h = c->hidden, nh = c->heads, qr = c->q_lora_rank, kva = c->kv_lora_rank + c->qk_rope_dim;
    int b = c->o_bias;
    const char *p = "model.layers";
    if (qr) {
        add(l, n, MT_WEIGHT_LINEAR, L, -1, qr, h, "%s.%d.self_attn.q_a_proj.weight", p, L);
        if (b) add(l, n, MT_WEIGHT_BIAS, L, -1, qr, 0, "%s.%d.self_attn.q_a_proj.bias", p, L);
        add(l, n, MT_WEIGHT_NORM, L, -1, qr, 0, "%s.%d.self_attn.q_a_layernorm.weight", p, L);
        add(l, n, MT_WEIGHT_LINEAR, L, -1, nh * c->head_dim, qr, "%s.%d.self_attn.q_b_proj.weight", p, L);
    } else {
        add(l, n, MT_WEIGHT_LINEAR, L, -1, nh * c->head_dim, h, "%s.%d.self_attn.q_proj.weight", p, L);
    }
    add(l, n, MT_WEIGHT_LINEAR, L, -1, kva, h, "%s.%d.self_attn.kv_a_proj_with_mqa.weight", p, L);
    if (b) add(l, n, MT_WEIGHT_BIAS, L, -1, kva, 0, "%s.%d.self_attn.kv_a_proj_with_mqa.bias", p, L);
    add(l, n, MT_WEIGHT_NORM, L, -1, c->kv_lora_rank, 0, "%s.%d.self_attn.kv_a_layernorm.weight", p, L);
    add(l, n, MT_WEIGHT_LINEAR, L, -1, nh * (c->qk_nope_dim + c->v_head_dim), c->kv_lora_rank,
        "%s.%d.self_attn.kv_b_proj.weight", p, L);
    add(l, n, MT_WEIGHT_LINEAR, L, -1, h, nh * c->v_head_dim, "%s.%d.self_attn.o_proj.weight", p, L);
    if (b) add(l, n, MT_WEIGHT_BIAS, L, -1, h, 0, "%s.%d.self_attn.o_proj.bias", p, L);
}

// The attention of layer L: q/k/v/o, their biases and the q/k norms where the family has them.
static void attn_weights(const mt_model_config *c, mt_weight_desc *l, size_t *n, int L) {
    const mt_family *fam = mt_config_family(c);
    if (c->mla) {
        mla_weights(c, l, n, L);
        return;
    }
    int64_t h = c->hidden, q = c->heads * c->head_dim, kv = c->kv_heads * c->head_dim;
    const char *p = "model.layers";
    struct { const char *name; int64_t out, in; int bias; } proj[] = {
        {"q_proj", q, h, c->qkv_bias}, {"k_proj", kv, h, c->qkv_bias},
        {"v_proj", kv, h, c->qkv_bias}, {"o_proj", h, q, c->o_bias},
    };
    for (size_t i = 0; i < MT_ARRAY_LEN(proj); i++) {
        add(l, n, MT_WEIGHT_LINEAR, L, -1, proj[i].out, proj[i].in, "%s.%d.self_attn.%s.weight", p, L, proj[i].name);
        if (proj[i].bias) add(l, n, MT_WEIGHT_BIAS, L, -1, proj[i].out, 0, "%s.%d.self_attn.%s.bias", p, L, proj[i].name);
    }
    if (fam->attn_sinks) add(l, n, MT_WEIGHT_PARAM, L, -1, c->heads, 0, "%s.%d.self_attn.sinks", p, L);
    if (c->qk_norm != MT_QK_NORM_NONE) {
        int per_head = c->qk_norm == MT_QK_NORM_HEAD;
        add(l, n, MT_WEIGHT_NORM, L, -1, per_head ? c->head_dim : q, 0, "%s.%d.self_attn.q_norm.weight", p, L);
        add(l, n, MT_WEIGHT_NORM, L, -1, per_head ? c->head_dim : kv, 0, "%s.%d.self_attn.k_norm.weight", p, L);
    }
}

// A SwiGLU MLP under `module`: gate [f, H], down [H, f], up [f, H] with the family's leaf names.
static void mlp_weights(mt_weight_desc *l, size_t *n, int L, int e, int64_t h, int64_t f, const char *const leaf[3],
                        const char *module) {
    add(l, n, MT_WEIGHT_LINEAR, L, e, f, h, "%s.%s.weight", module, leaf[0]);
    add(l, n, MT_WEIGHT_LINEAR, L, e, h, f, "%s.%s.weight", module, leaf[1]);
    add(l, n, MT_WEIGHT_LINEAR, L, e, f, h, "%s.%s.weight", module, leaf[2]);
}

size_t mt_weights_list(const mt_model_config *c, mt_weight_desc **out) {
    const mt_family *fam = mt_config_family(c);
    // Per layer at most: 2 norms, 4 Linears + 4 biases + 2 q/k norms (MLA: 10 tensors), router and
    // its 2 biases, shared gate, 3
    // shared-expert Linears (or 3 dense ones), and 3 per expert.
    size_t cap = 3 + (size_t)c->layers * (24 + 3 * (size_t)c->experts), n = 0;
    mt_weight_desc *l = mt_xcalloc(cap, sizeof *l);
    int64_t h = c->hidden;
    char mod[160];
    add(l, &n, MT_WEIGHT_EMBED, -1, -1, c->vocab, h, "model.embed_tokens.weight");
    for (int L = 0; L < c->layers; L++) {
        const char *p = "model.layers";
        add(l, &n, MT_WEIGHT_NORM, L, -1, h, 0, "%s.%d.input_layernorm.weight", p, L);
        attn_weights(c, l, &n, L);
        add(l, &n, MT_WEIGHT_NORM, L, -1, h, 0, "%s.%d.post_attention_layernorm.weight", p, L);
        if (!mt_config_layer_is_moe(c, L)) {  // a dense MLP of intermediate_size
            snprintf(mod, sizeof mod, "%s.%d.%s", p, L, fam->moe_module);
            mlp_weights(l, &n, L, -1, h, c->dense_intermediate, fam->mlp, mod);
            continue;
        }
        add(l, &n, MT_WEIGHT_LINEAR, L, -1, c->experts, h, "%s.%d.%s.%s.weight", p, L, fam->moe_module, fam->router);
        if (fam->router_bias)
            add(l, &n, MT_WEIGHT_PARAM, L, -1, c->experts, 0, "%s.%d.%s.%s.bias", p, L, fam->moe_module, fam->router);
        if (fam->score_bias)  // a buffer, zero at init (transformers' _init_weights)
            add(l, &n, MT_WEIGHT_BIAS, L, -1, c->experts, 0, "%s.%d.%s.%s.%s", p, L, fam->moe_module, fam->router,
                fam->score_bias);
        if (fam->fused_experts) {  // gpt-oss: [E, H, 2f] with gate and up interleaved, [E, f, H]; biases
            int64_t E = c->experts, f = c->intermediate;
            snprintf(mod, sizeof mod, "%s.%d.%s.experts", p, L, fam->moe_module);
            add(l, &n, MT_WEIGHT_EXPERTS, L, -1, E, h, "%s.gate_up_proj", mod)->shape[2] = 2 * f;
            l[n - 1].ndim = 3;
            add(l, &n, MT_WEIGHT_BIAS, L, -1, E, 2 * f, "%s.gate_up_proj_bias", mod);
            add(l, &n, MT_WEIGHT_EXPERTS, L, -1, E, f, "%s.down_proj", mod)->shape[2] = h;
            l[n - 1].ndim = 3;
            add(l, &n, MT_WEIGHT_BIAS, L, -1, E, h, "%s.down_proj_bias", mod);
            continue;
        }
        for (int e = 0; e < c->experts; e++) {
            snprintf(mod, sizeof mod, "%s.%d.%s.experts.%d", p, L, fam->moe_module, e);
            mlp_weights(l, &n, L, e, h, c->intermediate, fam->expert, mod);
        }
        if (fam->shared_expert) {
            snprintf(mod, sizeof mod, "%s.%d.%s.%s", p, L, fam->moe_module, fam->shared_expert);
            mlp_weights(l, &n, L, -1, h, c->shared_intermediate, fam->mlp, mod);
            if (fam->shared_gate)
                add(l, &n, MT_WEIGHT_LINEAR, L, -1, 1, h, "%s.%d.%s.%s.weight", p, L, fam->moe_module, fam->shared_gate);
        }
    }
    add(l, &n, MT_WEIGHT_NORM, -1, -1, h, 0, "model.norm.weight");
    if (!c->tie_word_embeddings) add(l, &n, MT_WEIGHT_LINEAR, -1, -1, c->vocab, h, "lm_head.weight");
    *out = l;
    return n;
}

void mt_weights_init_fill(const mt_model_config *cfg, const mt_weight_desc *w, uint64_t seed,
                          mt_dtype dtype, void *dst) {
    size_t numel = (size_t)mt_weight_numel(w);
    mt_rng rng;
    mt_rng_seed(&rng, seed, mt_hash_string(w->name));
    float std = (float)cfg->initializer_range;
    enum { CHUNK = 4096 };
    float buf[CHUNK];
    for (size_t i = 0; i < numel; i += CHUNK) {
        size_t m = MT_MIN((size_t)CHUNK, numel - i);
        for (size_t j = 0; j < m; j++) buf[j] = w->kind == MT_WEIGHT_NORM   ? 1.0f
                                                     : w->kind == MT_WEIGHT_BIAS ? 0.0f
                                                                                 : std * mt_rng_normal(&rng);
        mt_convert((char *)dst + mt_dtype_bytes(dtype, i), dtype, buf, MT_F32, m);
    }
}
