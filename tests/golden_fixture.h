// tests/golden_fixture.h — a transformers golden fixture (golden.safetensors beside its checkpoint,
// made by scripts/make_*_goldens.py) and the checks the family tests share: the losses and the real
// tokens' logits of one step, the LoRA factors the fixture used, and every LoRA gradient against
// autograd's. Include after criterion.h.
#pragma once
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "core/common.h"
#include "core/safetensors.h"
#include "lora/lora.h"
#include "model/mixtral.h"

typedef struct {
    mt_st_file g;
    int B, S;
    int32_t *tokens, *labels, *mask;
} golden_fixture;

static inline const mt_st_tensor *golden_need(const golden_fixture *fx, const char *name) {
    const mt_st_tensor *t = mt_st_file_find(&fx->g, name);
    cr_assert_not_null(t, "golden.safetensors lacks %s", name);
    return t;
}

static inline int32_t *golden_ints(const golden_fixture *fx, const char *name) {
    const mt_st_tensor *t = golden_need(fx, name);
    int32_t *v = mt_xmalloc(t->nbytes);
    memcpy(v, t->data, t->nbytes);
    return v;
}

static inline void golden_open(golden_fixture *fx, const char *dir) {
    char path[512];
    snprintf(path, sizeof path, "%s/golden.safetensors", dir);
    cr_assert_eq(mt_st_file_open(&fx->g, path), 0, "%s", mt_error_get());
    const mt_st_tensor *t = golden_need(fx, "tokens");
    fx->B = (int)t->shape[0], fx->S = (int)t->shape[1];
    fx->tokens = golden_ints(fx, "tokens"), fx->labels = golden_ints(fx, "labels");
    fx->mask = golden_ints(fx, "attention_mask");
}

static inline void golden_close(golden_fixture *fx) {
    mt_st_file_close(&fx->g);
    free(fx->tokens), free(fx->labels), free(fx->mask);
}

static inline void golden_expect_close(const char *what, const mt_tensor *got, const mt_st_tensor *want, double tol) {
    cr_assert_eq(got->nbytes, want->nbytes, "%s: %zu bytes, golden %zu", what, (size_t)got->nbytes, (size_t)want->nbytes);
    const float *g = got->data, *w = want->data;
    double diff = 0, scale = 0;
    for (size_t i = 0; i < want->nbytes / sizeof(float); i++)
        diff = fmax(diff, fabs((double)g[i] - w[i])), scale = fmax(scale, fabs((double)w[i]));
    double e = scale > 0 ? diff / scale : diff;
    cr_expect_leq(e, tol, "%s: relative error %.3g > %.1g", what, e, tol);
}

// One forward and backward; `prefix`.ce and .loss (and .aux with with_aux) to 1e-4 relative, the
// real tokens' logits to 1e-4 of their largest.
static inline void golden_step(mt_model *m, const golden_fixture *fx, const char *prefix, int with_aux) {
    mt_batch b = {fx->B, fx->S, fx->tokens, fx->labels, fx->mask};
    mt_loss l;
    mt_model_zero_grad(m);
    cr_assert_eq(mt_model_forward(m, &b, &l), 0, "%s", mt_error_get());
    int T = fx->B * fx->S, V = (int)m->cfg.vocab;
    float *got = mt_xmalloc((size_t)T * V * sizeof(float));
    cr_assert_eq(mt_model_logits(m, 0, T, got), 0, "%s", mt_error_get());
    mt_model_backward(m);
    char name[64];
    struct { const char *key; double got; } v[] = {{"ce", l.ce}, {"loss", l.loss}, {"aux", l.aux}};
    for (size_t i = 0; i < (with_aux ? 3u : 2u); i++) {
        snprintf(name, sizeof name, "%s.%s", prefix, v[i].key);
        double want = *(const double *)golden_need(fx, name)->data;
        cr_expect_leq(fabs(v[i].got - want) / fabs(want), 1e-4, "%s: %.8f vs transformers %.8f", name, v[i].got, want);
    }
    snprintf(name, sizeof name, "%s.logits", prefix);
    const float *w = golden_need(fx, name)->data;
    double diff = 0, scale = 0;
    for (int t = 0; t < T; t++)
        for (int j = 0; fx->mask[t] && j < V; j++)
            diff = fmax(diff, fabs((double)got[(size_t)t * V + j] - w[(size_t)t * V + j])),
            scale = fmax(scale, fabs((double)w[(size_t)t * V + j]));
    cr_expect_leq(diff / scale, 1e-4, "%s: relative error %.3g", name, diff / scale);
    free(got);
}

// The fixture's LoRA factors (lora.A.<module>, lora.B.<module>) into the model's LoRAs; how many.
static inline int golden_set_lora(mt_model *m, const golden_fixture *fx) {
    int set = 0;
    for (size_t i = 0; i < fx->g.n_tensors; i++) {
        const mt_st_tensor *t = &fx->g.tensors[i];
        if (strncmp(t->name, "lora.A.", 7) != 0) continue;
        mt_linear *l = mt_model_find_linear(m, t->name + 7);
        cr_assert(l && l->lora, "no LoRA on %s", t->name + 7);
        char bname[256];
        snprintf(bname, sizeof bname, "lora.B.%s", t->name + 7);
        const mt_st_tensor *tb = golden_need(fx, bname);
        cr_assert(l->lora->a->nbytes == t->nbytes && l->lora->b->nbytes == tb->nbytes, "%s: shapes", t->name + 7);
        memcpy(l->lora->a->data, t->data, t->nbytes);
        memcpy(l->lora->b->data, tb->data, tb->nbytes);
        set++;
    }
    return set;
}

// Every lora.dA / lora.dB of the fixture against the model's LoRA gradients, to `tol`; how many.
static inline int golden_expect_lora_grads(mt_model *m, const golden_fixture *fx, double tol) {
    int checked = 0;
    for (size_t i = 0; i < fx->g.n_tensors; i++) {
        const mt_st_tensor *t = &fx->g.tensors[i];
        int isa = strncmp(t->name, "lora.dA.", 8) == 0;
        if (!isa && strncmp(t->name, "lora.dB.", 8) != 0) continue;
        mt_linear *l = mt_model_find_linear(m, t->name + 8);
        cr_assert(l && l->lora, "%s", t->name);
        golden_expect_close(t->name, isa ? l->lora->da : l->lora->db, t, tol);
        checked++;
    }
    return checked;
}
