// model/adapter.c — putting a PEFT adapter's A and B into the model's LoRAs.
#include <math.h>
#include <stdio.h>
#include <unistd.h>
#include <string.h>

#include "core/common.h"
#include "lora/peft.h"
#include "model/mixtral.h"

static int to_f32(const mt_st_tensor *t, float *dst, size_t n) {
    mt_dtype dt;
    if (mt_st_float_dtype(t->dtype, &dt) != 0) {
        mt_error_set("'%s' has dtype %s (expected F32, BF16 or F16)", t->name, t->dtype);
        return -1;
    }
    mt_convert(dst, MT_F32, t->data, dt, n);
    return 0;
}

static int set_pair(void *ctx, const char *module, const mt_st_tensor *a, const mt_st_tensor *b) {
    mt_model *m = ctx;
    char renamed[300];
    module = mt_family_module_name(mt_config_family(&m->cfg), module, renamed, sizeof renamed);
    mt_linear *l = mt_model_find_linear(m, module);
    if (!l) {
        mt_error_set("adapter module '%s' is not a Linear of this model", module);
        return -1;
    }
    mt_lora *lo = l->lora;
    if (!lo) {
        mt_error_set("adapter module '%s' is not a LoRA target of this run (see --targets, --layers, --experts)",
                     module);
        return -1;
    }
    if (a->shape[1] != lo->in || b->shape[0] != lo->out || a->shape[0] != lo->r) {
        mt_error_set("adapter module '%s': A [%lld, %lld], B [%lld, %lld] where the model expects A [%d, %lld], "
                     "B [%lld, %d]", module, (long long)a->shape[0], (long long)a->shape[1],
                     (long long)b->shape[0], (long long)b->shape[1], lo->r, (long long)lo->in,
                     (long long)lo->out, lo->r);
        return -1;
    }
    size_t na = (size_t)(lo->r * lo->in), nb = (size_t)(lo->out * lo->r);
    float *host = mt_xmalloc(MT_MAX(na, nb) * sizeof(float));
    int rc = to_f32(a, host, na);
    if (!rc) mt_tensor_upload_f32(lo->a, host);  // into the model's dtype (bf16 on the GPU step)
    if (!rc && !(rc = to_f32(b, host, nb))) mt_tensor_upload_f32(lo->b, host);
    free(host);
    return rc;
}

int mt_model_load_adapter(mt_model *m, const char *dir) {
    mt_peft_config cfg;
    mt_peft_layout lay = {.gate_up_interleaved = mt_config_family(&m->cfg)->fused_experts};
    // A rank that differs from the run's is caught pair by pair (shape check in set_pair).
    if (mt_peft_read_as(dir, &lay, &cfg, set_pair, m) != 0) return -1;
    char path[4200];  // the score biases the run's --router-bias-update moved, beside the adapter
    snprintf(path, sizeof path, "%s/%s", dir, MT_SCORE_BIAS_FILE);
    if (access(path, F_OK) == 0 && mt_model_load_score_biases(m, path) != 0) return -1;
    // The adapter's own scaling and dropout replace the run's.
    float scale = (float)(cfg.use_rslora ? cfg.lora_alpha / sqrt(cfg.r) : cfg.lora_alpha / cfg.r);
    for (int L = 0; L < m->cfg.layers; L++) {
        mt_layer *ly = &m->layers[L];
        // attention's Linears by the layer's own list (MLA has q_a, kv_a, kv_b besides q and o)
        mt_linear *ls[MT_ATTN_LINEARS + 5];
        int n = mt_layer_attn_linears(ly, &m->cfg, ls, NULL);
        mt_linear *rest[] = {&ly->gate, &ly->mlp[0], &ly->mlp[1], &ly->mlp[2], &ly->shared_gate};
        for (int i = 0; i < 5; i++) ls[n++] = rest[i];
        for (int i = 0; i < n; i++)
            if (ls[i]->lora) ls[i]->lora->scale = scale, ls[i]->lora->dropout = (float)cfg.lora_dropout;
        for (int e = 0; e < m->cfg.experts; e++) {
            mt_linear *ex[] = {&ly->w1[e], &ly->w2[e], &ly->w3[e]};
            for (int i = 0; i < 3; i++)
                if (ex[i]->lora) ex[i]->lora->scale = scale, ex[i]->lora->dropout = (float)cfg.lora_dropout;
        }
    }
    return 0;
}
