// DeepSeek-style families on the cpu step against transformers 5.24 (tests/data/golden/{glm4_moe,
// deepseek_v3,deepseek_v2}, made by scripts/make_deepseek_goldens.py): the sigmoid router with
// e_score_correction_bias and group-limited top-k (softmax and max-group for V2), the routed
// scaling, an ungated shared expert, a dense first layer, MLA (q_lora_rank or a plain q_proj, the
// latent norm, the shared rope key, interleaved RoPE, YaRN's mscale on the softmax scale) and
// GLM-4.5's per-head q/k norm, partial RoPE and q/k/v biases. Routing equal to transformers' token
// for token; logits and losses to 1e-4, LoRA and router-only gradients to 1e-3 (tests/test_golden.c's
// tolerances).
#include <criterion/criterion.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/backend.h"
#include "core/common.h"
#include "core/safetensors.h"
#include "lora/lora.h"
#include "model/mixtral.h"
#include "tests/golden_fixture.h"
#include "trainer/options.h"

#define GOLDEN MT_REPO_ROOT "/tests/data/golden/"

static int cmp_i32(const void *a, const void *b) {
    int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
    return (x > y) - (x < y);
}

// The experts every MoE layer chose, as sets per token, against transformers' (routing.ids.L).
static void expect_routing(const mt_model *m, const golden_fixture *fx) {
    int T = fx->B * fx->S, k = (int)m->cfg.top_k, checked = 0;
    for (int L = 0; L < m->cfg.layers; L++) {
        if (m->layers[L].dense) continue;
        char name[64];
        snprintf(name, sizeof name, "routing.ids.%d", L);
        const int32_t *want = golden_need(fx, name)->data;
        int32_t got[64];
        for (int t = 0; t < T; t++) {
            if (!fx->mask[t]) continue;  // a padded row's hidden state is nobody's to match
            memcpy(got, (const int32_t *)m->kept[L].ids->data + (size_t)t * k, (size_t)k * sizeof(int32_t));
            qsort(got, (size_t)k, sizeof(int32_t), cmp_i32);
            for (int j = 0; j < k; j++)
                cr_expect_eq(got[j], want[t * k + j], "layer %d token %d choice %d: expert %d, transformers %d", L, t,
                             j, got[j], want[t * k + j]);
        }
        checked++;
    }
    cr_assert_gt(checked, 0);
}

static void model_open(mt_model *m, mt_backend *be, const char *dir, mt_mode mode) {
    mt_run_opts o;
    mt_run_opts_default(&o);
    o.mode = mode, o.lora_r = 4, o.lora_alpha = 8, o.quant = MT_QUANT_NONE;
    o.targets = MT_TARGET_EXPERTS | MT_TARGET_ATTN;
    cr_assert_eq(mt_model_load(m, be, dir, MT_MODEL_SPEC_OF(&o)), 0, "%s", mt_error_get());
}

// The fixture of `family` and its checkpoint loaded for `mode` on a cpu backend.
typedef struct {
    golden_fixture fx;
    mt_backend *be;
    mt_model m;
} family_case;

static void case_open(family_case *fc, const char *family, mt_mode mode) {
    char dir[256];
    snprintf(dir, sizeof dir, GOLDEN "%s", family);
    golden_open(&fc->fx, dir);
    fc->be = mt_backend_cpu_new();
    model_open(&fc->m, fc->be, dir, mode);
}

static void case_close(family_case *fc) {
    mt_model_free(&fc->m);
    cr_expect_eq(fc->be->ledger.total_cur, 0, "everything the model took went back to the ledger");
    mt_backend_free(fc->be);
    golden_close(&fc->fx);
}

static void lora_case(const char *family) {
    family_case fc;
    case_open(&fc, family, MT_MODE_LORA);
    int set = golden_set_lora(&fc.m, &fc.fx);
    cr_assert_gt(set, 0);
    golden_step(&fc.m, &fc.fx, "lora", 0);
    cr_assert_eq(golden_expect_lora_grads(&fc.m, &fc.fx, 1e-3), 2 * set);
    case_close(&fc);
}

static void router_case(const char *family) {
    family_case fc;
    case_open(&fc, family, MT_MODE_ROUTER);
    golden_step(&fc.m, &fc.fx, "base", 0);
    expect_routing(&fc.m, &fc.fx);
    for (int L = 0; L < fc.m.cfg.layers; L++) {
        if (fc.m.layers[L].dense) continue;
        char name[128], module[96];
        snprintf(module, sizeof module, "model.layers.%d.mlp.gate", L);
        mt_linear *l = mt_model_find_linear(&fc.m, module);
        cr_assert(l && l->dw, "layer %d: the router trains", L);
        snprintf(name, sizeof name, "router.grad.%s.weight", module);
        golden_expect_close(name, l->dw, golden_need(&fc.fx, name), 1e-3);
    }
    case_close(&fc);
}

Test(deepseek, glm4_moe_lora) { lora_case("glm4_moe"); }
Test(deepseek, glm4_moe_router_and_routing) { router_case("glm4_moe"); }
Test(deepseek, deepseek_v3_lora) { lora_case("deepseek_v3"); }
Test(deepseek, deepseek_v3_router_and_routing) { router_case("deepseek_v3"); }
Test(deepseek, deepseek_v2_lora) { lora_case("deepseek_v2"); }
Test(deepseek, deepseek_v2_router_and_routing) { router_case("deepseek_v2"); }
