// model/expert_rows.c — where a MoE layer's expert offsets live in the GPU step. The routing
// writes them on the device (the permute's prefix sum); the experts' GEMMs need each expert's
// rows. With cuBLASLt's grouped matmul (core/gemm_rows.h) they stay there: the GEMMs read them
// on the device and the host never waits for them. Otherwise the host downloads them once per
// layer's forward (model/dispatch.c mt_op_permute): with an older cuBLASLt, or one that failed
// the first use's check, under expert parallelism (the exchange sizes its messages on the host),
// and in a layer where a row of some operand would not start 16 bytes from the last
// (core/gemm_rows.h: a hidden or intermediate size, or an expert LoRA rank, not a multiple of 8).
// MT_EXPERT_ROWS=host asks for the download (to compare the two); =device fails the run when
// the device path cannot be had. The load log's counts of layers whose offsets stayed on the
// device come back with the step's loss statistics, in the same host wait (mt_op_aux_finish).
#include <stdlib.h>
#include <string.h>

#include "core/common.h"
#include "core/gemm_rows.h"
#include "model/model_internal.h"

void mt_rows_decide(mt_model *m) {
    if (m->rows_mode) return;
    const char *env = getenv("MT_EXPERT_ROWS");
    if (env && strcmp(env, "host") && strcmp(env, "device") && strcmp(env, "auto"))
        mt_fatal(MT_EXIT_USAGE, "MT_EXPERT_ROWS=%s: must be host, device or auto", env);
    char why[240] = "";
    int ok = 0;
    if (env && !strcmp(env, "host")) snprintf(why, sizeof why, "MT_EXPERT_ROWS=host");
    else if (m->par.ep_size > 1) snprintf(why, sizeof why, "expert parallelism sizes its exchange on the host");
    else if (m->cfg.hidden % 8 || m->cfg.intermediate % 8)
        snprintf(why, sizeof why, "hidden %lld or intermediate %lld is not a multiple of 8: rows not 16 bytes apart",
                 (long long)m->cfg.hidden, (long long)m->cfg.intermediate);
    else ok = mt_gemm_rows_checked(m->be, why, sizeof why);
    if (!ok && env && !strcmp(env, "device")) mt_fatal(MT_EXIT_ERROR, "MT_EXPERT_ROWS=device: %s", why);
    m->rows_mode = ok ? 1 : -1;
    mt_info("experts' rows: %s (%s)", ok ? "kept on the device, no host wait per MoE layer (a layer with an expert "
                                              "LoRA rank not a multiple of 8 downloads them)"
                                         : "downloaded once per MoE layer's forward", why);
}

int mt_rows_on_device(mt_model *m, int L) {
    if (m->be->ops->kind != MT_BACKEND_CUDA || m->counting || m->layers[L].dense) return 0;
    const mt_layer *ly = &m->layers[L];
    for (int e = 0; e < (int)m->cfg.experts; e++) {
        const mt_linear *ls[3] = {&ly->w1[e], &ly->w2[e], &ly->w3[e]};
        for (int i = 0; i < 3; i++)
            if (ls[i]->lora && ls[i]->lora->r % 8) return 0;
    }
    mt_rows_decide(m);
    return m->rows_mode > 0;
}
