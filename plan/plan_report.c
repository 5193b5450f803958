// plan/plan_report.c — `moetrain plan`'s output: the text table, the JSON, the changes that
// would make a run fit, and for --case the source document's figures beside ours.
#include <cjson/cJSON.h>
#include <string.h>

#include "core/common.h"
#include "quant/quant.h"
#include "plan/plan.h"

// ---------------------------------------------------------------------------------------------
// Formatting helpers

static double gb(uint64_t bytes) { return (double)bytes / 1e9; }
static double gib(double bytes) { return bytes / 1073741824.0; }

// 2114125824 → "2,114,125,824"
static const char *commas(int64_t v, char *buf, size_t n) {
    char digits[32];
    int len = snprintf(digits, sizeof digits, "%lld", (long long)(v < 0 ? -v : v)), o = 0;
    if (v < 0 && (size_t)o + 1 < n) buf[o++] = '-';
    for (int i = 0; i < len && (size_t)o + 2 < n; i++) {
        if (i && (len - i) % 3 == 0) buf[o++] = ',';
        buf[o++] = digits[i];
    }
    buf[o] = 0;
    return buf;
}

// A card size without trailing zeros: "44", "42.95".
static const char *short_gb(double bytes, char *buf, size_t n) {
    snprintf(buf, n, "%.2f", bytes / 1e9);
    char *end = buf + strlen(buf) - 1;
    while (*end == '0') *end-- = 0;
    if (*end == '.') *end = 0;
    return buf;
}

// "all", or the members as ranges: "0-5,7".
static const char *index_set_text(const mt_index_set *s, char *buf, size_t n) {
    size_t o = 0;
    if (s->all) {
        snprintf(buf, n, "all");
        return buf;
    }
    buf[0] = 0;
    for (int j = 0; j < s->count && o < n;) {
        int k = j;
        while (k + 1 < s->count && s->items[k + 1] == s->items[k] + 1) k++;
        if (k < j + 2) k = j;  // runs of three or more become ranges: "0-5", but "0,1"
        o += (size_t)snprintf(buf + o, n - o, j ? ",%d" : "%d", s->items[j]);
        if (k > j && o < n) o += (size_t)snprintf(buf + o, n - o, "-%d", s->items[k]);
        j = k + 1;
    }
    return buf;
}

static const char *targets_text(unsigned t, char *buf, size_t n) {
    static const struct { unsigned bit; const char *name; } names[] = {
        {MT_TARGET_W1, "w1"}, {MT_TARGET_W2, "w2"}, {MT_TARGET_W3, "w3"}, {MT_TARGET_GATE, "gate"},
        {MT_TARGET_Q, "q"},   {MT_TARGET_K, "k"},   {MT_TARGET_V, "v"},   {MT_TARGET_O, "o"},
    };
    size_t o = 0;
    buf[0] = 0;
    for (size_t i = 0; i < MT_ARRAY_LEN(names) && o < n; i++)
        if (t & names[i].bit) o += (size_t)snprintf(buf + o, n - o, "%s%s", o ? "," : "", names[i].name);
    return buf;
}

// "experts, attention" (what --quant-targets makes 4-bit)
static const char *quant_targets_text(unsigned t, char *buf, size_t n) {
    snprintf(buf, n, "%s%s%s%s", t & MT_QTARGET_EXPERTS ? "experts" : "",
             (t & MT_QTARGET_EXPERTS) && (t & MT_QTARGET_ATTN) ? ", " : "", t & MT_QTARGET_ATTN ? "attention" : "",
             t & MT_QTARGET_ROUTER ? (t & (MT_QTARGET_EXPERTS | MT_QTARGET_ATTN) ? ", routers" : "routers") : "");
    if (!buf[0]) snprintf(buf, n, "nothing (--quant-targets none)");
    return buf;
}

static const char *base_format_text(const mt_plan_opts *o, const mt_plan *p, char *buf, size_t n) {
    switch (o->quant) {
    case MT_QUANT_NONE: snprintf(buf, n, "bf16"); break;
    case MT_QUANT_MXFP4: snprintf(buf, n, "MXFP4, block 32, e8m0 scales (%.3f bits/weight)", p->quant_bits); break;
    case MT_QUANT_INT4:
        snprintf(buf, n, "INT4, group %d (%.3f bits/weight)", mt_q4_blocksize_or_default(o->quant, o->quant_blocksize),
                 p->quant_bits);
        break;
    default:
        snprintf(buf, n, "%s%s, block %d (%.3f bits/weight)", o->quant == MT_QUANT_FP4 ? "FP4" : "NF4",
                 o->double_quant ? " + double quant" : "", mt_q4_blocksize_or_default(o->quant, o->quant_blocksize),
                 p->quant_bits);
    }
    return buf;
}

// "12 × 176,160,768 experts + 6 × 32,768 routers"
static const char *parts_text(const mt_plan *p, char *buf, size_t n) {
    size_t o = 0;
    buf[0] = 0;
    for (int i = 0; i < p->n_parts && o < n; i++) {
        char a[32], b[32];
        o += (size_t)snprintf(buf + o, n - o, "%s%s × %s %s", i ? " + " : "", commas(p->parts[i].count, a, sizeof a),
                              commas(p->parts[i].each, b, sizeof b), p->parts[i].what);
    }
    return buf;
}

static const char *category_label(mt_mem_cat c, const mt_plan_opts *o, const mt_plan *p) {
    int off = o->offload_optimizer;
    switch (c) {
    case MT_MEM_BASE: return "frozen weights + quant constants";
    case MT_MEM_TRAIN: return "trainable weights (bf16)";
    case MT_MEM_GRAD: return o->zero >= 2 ? "gradients (bf16, ZeRO-2)" : "gradients (bf16)";
    case MT_MEM_OPTIM:
        return off ? "Adam m, v: in host memory" : o->adam_8bit ? "Adam m, v (8-bit)" : "Adam m, v (fp32)";
    case MT_MEM_MASTER:
        return !o->master_weights ? "master weights: none" : off ? "master weights: in host memory"
                                                                  : "master weights (fp32)";
    case MT_MEM_ACT:
        switch (o->checkpointing) {
        case MT_CKPT_NONE: return "activations (no recomputation)";
        case MT_CKPT_ATTENTION: return "activations (attention recomputed)";
        case MT_CKPT_EXPERTS: return "activations (MLP part recomputed)";
        default: return "activations (full recomputation)";
        }
    case MT_MEM_WORK:
        if (o->cuda && (p->expert_dequant_bytes || p->expert_dropout_bytes))
            return p->workspace_guessed ? "CUDA ctx + libs (guess) + experts'" : "workspace (--workspace + experts')";
        return !p->workspace_guessed ? "workspace (--workspace)"
               : o->cpu              ? "workspace (cpu: no CUDA context)"
                                     : "CUDA ctx + cuBLAS/NCCL ws (a guess)";
    case MT_MEM_COMM: return "ZeRO-1's flat copy of the grads";
    default: return "?";
    }
}

// ---------------------------------------------------------------------------------------------
// The source document's figures (docs/memory.md "Omissions corrected"), for --case

typedef enum { OURS_PARAMS, OURS_STATE, OURS_BASE, OURS_ACT, OURS_TOTAL } ours_kind;

typedef struct {
    char which;
    const char *item, *source;
    ours_kind ours;
    const char *note;
} source_row;

static const source_row source_rows[] = {
    {'A', "trainable params", "1.05M (routers)", OURS_PARAMS, "agrees: 32 layers × 4096 × 8 = 1,048,576"},
    {'A', "trainable state", "16.8 MB", OURS_STATE, "agrees: 16 B/param"},
    {'A', "frozen base", "omitted", OURS_BASE,
     "the frozen model stays resident: 93.40 GB in bf16, 24.48 GB NF4-DQ"},
    {'A', "activations", "14.45 GB", OURS_ACT,
     "14.45 is GiB (15.52 GB) from Korthikanti Eq. 1 (GeLU, dropout, softmax), reused; Mixtral "
     "with flash attention: 1.04 GB with full checkpointing, 8.97 GB without"},
    {'A', "total", "not given", OURS_TOTAL,
     "frozen weights, not activations, dominate: one card needs a 4-bit base; bf16 needs EP >= 4"},
    {'B', "trainable params", "12 experts + routers", OURS_PARAMS,
     "12 × 176,160,768 + 6 × 32,768; \"routers\" (6 or 32) is ambiguous but costs <= 17 MB"},
    {'B', "model states", "4.23+4.23+16.9+8.46 = 33.8 GB", OURS_STATE, "agrees: 16 B/param"},
    {'B', "frozen base", "omitted", OURS_BASE, "23.39 GB NF4-DQ (89.18 GB bf16) stays resident"},
    {'B', "activations", "not given", OURS_ACT, "training the bottom layers makes backprop run through all 32"},
    {'B', "total", "33.8 GB (states only)", OURS_TOTAL,
     "with the base one card needs 59.76 GB (NF4-DQ) or 125.54 GB (bf16): no fit; EP=2 with a 4-bit base fits"},
    {'C', "trainable params", "226.6M", OURS_PARAMS,
     "226.6M rounds 7.08M × 32; experts only is 226,492,416; router LoRA (2,101,248) is missing"},
    {'C', "trainable state", "3.6 GB", OURS_STATE, "16 B/param × 228,593,664 = 3.66 GB"},
    {'C', "frozen base", "omitted", OURS_BASE, "the NF4-DQ base is 24.48 GB (26.65 GB without DQ)"},
    {'C', "total", "far below 44 GB", OURS_TOTAL, "about 70% of the card: ~13 GB of headroom"},
};

static const char *size_text(uint64_t bytes, char *buf, size_t n) {
    if (bytes < 100000000ull) snprintf(buf, n, "%.1f MB", (double)bytes / 1e6);
    else snprintf(buf, n, "%.2f GB", gb(bytes));
    return buf;
}

static const char *ours_text(ours_kind k, const mt_plan *p, char *buf, size_t n) {
    uint64_t state = p->bytes[MT_MEM_TRAIN] + p->bytes[MT_MEM_GRAD] + p->bytes[MT_MEM_OPTIM] +
                     p->bytes[MT_MEM_MASTER] + p->host_bytes;
    switch (k) {
    case OURS_PARAMS: return commas(p->trainable_params, buf, n);
    case OURS_STATE: return size_text(state, buf, n);
    case OURS_BASE: return size_text(p->bytes[MT_MEM_BASE], buf, n);
    case OURS_ACT: return size_text(p->bytes[MT_MEM_ACT], buf, n);
    case OURS_TOTAL: snprintf(buf, n, "%.2f GB (%.0f%%)", gb(p->total), p->percent); return buf;
    }
    return "?";
}

static void print_source(FILE *out, const mt_plan_report *r) {
    fprintf(out, "\ncase %c beside the source document (docs/memory.md, 'Omissions corrected'), both on the case's own settings\n"
                 "(one 44 GB card, s=1024, b=1, NF4-DQ base, full checkpointing):\n",
            r->opts->plan_case);
    fprintf(out, "  %-18s %-32s %s\n", "item", "source", "ours");
    for (size_t i = 0; i < MT_ARRAY_LEN(source_rows); i++) {
        const source_row *s = &source_rows[i];
        if (s->which != r->opts->plan_case) continue;
        char ours[64];
        fprintf(out, "  %-18s %-32s %s\n", s->item, s->source, ours_text(s->ours, r->case_plan, ours, sizeof ours));
        fprintf(out, "      %s\n", s->note);
    }
}

// ---------------------------------------------------------------------------------------------
// Text

static void print_run(FILE *out, const mt_plan_report *r) {
    const mt_plan_opts *o = r->opts;
    char layers[256], experts[256], targets[64], fmt[96];
    fprintf(out, "moetrain plan: %s", r->model_name);
    if (o->plan_case) fprintf(out, ", case %c", o->plan_case);
    fprintf(out, "\n  run     %s", mt_mode_name(o->mode));
    if (o->mode == MT_MODE_LORA)
        fprintf(out, " r=%d on %s", o->lora_r, targets_text(o->targets, targets, sizeof targets));
    if (o->mode != MT_MODE_FULL) fprintf(out, ", layers %s", index_set_text(&o->layers, layers, sizeof layers));
    if (o->mode == MT_MODE_LORA || o->mode == MT_MODE_UNFREEZE)
        fprintf(out, ", experts %s", index_set_text(&o->experts, experts, sizeof experts));
    fprintf(out, "; seq %lld, batch %lld, recompute %s\n", (long long)o->seq, (long long)o->batch,
            r->recompute && r->recompute[0] ? r->recompute : mt_ckpt_name(o->checkpointing));
    if (o->mode == MT_MODE_FULL) fprintf(out, "  base    none: every weight is trained\n");
    else if (o->quant == MT_QUANT_NONE)  // the GPU step stores the base bf16 whatever the checkpoint's dtype
        fprintf(out, "  base    every frozen weight as stored (%s in the checkpoint; bf16 on a GPU, as planned here)\n",
                r->cfg ? mt_dtype_name(r->cfg->torch_dtype) : "?");
    else fprintf(out, "  base    %s on %s%s; the rest bf16\n", base_format_text(o, r->plan, fmt, sizeof fmt),
                 quant_targets_text(o->quant_targets, targets, sizeof targets),
                 r->cfg && r->cfg->mxfp4 && (o->quant_targets & MT_QTARGET_EXPERTS)
                     ? " (the experts in the checkpoint's own MXFP4, 4.25 bits, kept as stored; bits/weight: the mix)"
                     : "");
    fprintf(out, "  GPUs    %d (EP %d, ZeRO %d); Adam %s, master weights %s%s\n", o->gpus, o->ep, o->zero,
            o->adam_8bit ? "8-bit" : "fp32", o->master_weights ? "fp32" : "none",
            o->offload_optimizer ? "; optimizer offloaded to host" : "");
}

static void print_params(FILE *out, const mt_plan_report *r) {
    const mt_plan *p = r->plan;
    char a[32], parts[512];
    fprintf(out, "\nparameters\n");
    fprintf(out, "  %-30s %16s\n", "model", commas(p->model_params, a, sizeof a));
    fprintf(out, "  %-30s %16s = %s\n", "trainable, whole run", commas(p->trainable_params, a, sizeof a),
            parts_text(p, parts, sizeof parts));
    fprintf(out, "  %-30s %16s", "trainable on this GPU", commas(p->trainable_gpu, a, sizeof a));
    if (p->units && r->opts->ep > 1)
        fprintf(out, " (%lld of the %lld trainable expert units, round-robin over EP %d)",
                (long long)p->units_gpu, (long long)p->units, r->opts->ep);
    fprintf(out, "\n");
    if (p->frozen_quant_gpu)
        fprintf(out, "  %-30s %16s → %.3f GB\n", "frozen on this GPU, 4-bit", commas(p->frozen_quant_gpu, a, sizeof a),
                gb(p->frozen_quant_bytes));
    fprintf(out, "  %-30s %16s → %.3f GB\n", "frozen on this GPU, bf16", commas(p->frozen_bf16_gpu, a, sizeof a),
            2.0 * (double)p->frozen_bf16_gpu / 1e9);
    if (p->dequant_cache_bytes)
        fprintf(out, "  %-30s %16s → %.3f GB (--dequant-cache: 4-bit weights outside the experts, kept in bf16)\n",
                "  and bf16 copies", commas((int64_t)(p->dequant_cache_bytes / 2), a, sizeof a), gb(p->dequant_cache_bytes));
    if (p->expert_cache_bytes)
        fprintf(out, "  %-30s %16s → %.3f GB (--expert-cache: the last %d MoE layers' experts, kept in bf16; their "
                "%.3f GB of 4-bit codes given back, the last expert's %.3f GB still held at base's peak: %.3f GB a "
                "layer net)\n",
                "  and kept experts", commas((int64_t)(p->expert_cache_bytes / 2), a, sizeof a), gb(p->expert_cache_bytes),
                p->expert_cache_layers, gb(p->expert_cache_freed), gb(p->expert_cache_held),
                gb(p->expert_cache_layer_bytes));
}

static void print_table(FILE *out, const mt_plan_report *r) {
    const mt_plan *p = r->plan;
    char card[32];
    fprintf(out, "\nmemory per GPU (the most loaded one)%19s\n", "GB");
    for (int c = 0; c < MT_MEM_COUNT; c++)
        fprintf(out, "  %-7s %-36s %8.3f\n", mt_mem_cat_name((mt_mem_cat)c),
                category_label((mt_mem_cat)c, r->opts, p), gb(p->bytes[c]));
    fprintf(out, "  %-44s %8.2f GB (%.2f GiB)\n", "total", gb(p->total), gib((double)p->total));
    if (p->host_bytes)
        fprintf(out, "  %-44s %8.2f GB (not in the total)\n", "host memory (Adam m, v + master), per GPU",
                gb(p->host_bytes));
    if (r->opts->data_host_bytes)
        fprintf(out, "  %-44s %8.3f GB (up to %.2f GB for a line of --max-line-bytes; not in the total)\n",
                "host memory (data loading, per rank)", gb(r->opts->data_host_bytes), gb(r->opts->data_host_bound));
    if (p->workspace_guessed && !r->opts->cpu)
        fprintf(out, "  (work is a guess of the CUDA context, cuBLAS and NCCL workspaces and allocator slack,\n"
                     "   1.5 GB on one GPU and 2.0 GB on more, until measured; --workspace sets it)\n");
    if (p->expert_dequant_bytes)
        fprintf(out, "  %-44s %8.3f GB (%s)\n", "experts' dequantization scratch (2 slots)", gb(p->expert_dequant_bytes),
                r->opts->cuda ? "in work: --device cuda" : "the GPU step's; not in this cpu run's work");
    if (p->expert_dropout_bytes)
        fprintf(out, "  %-44s %8.3f GB (%s)\n", "experts' LoRA dropout buffer (T·k × max(h, f))",
                gb(p->expert_dropout_bytes), r->opts->cuda ? "in work: --device cuda" : "the GPU step's; not in work here");
    fprintf(out, "fits on a %s GB (%.2f GiB) card: %s (%.0f%%)\n", short_gb(p->gpu_mem, card, sizeof card),
            gib(p->gpu_mem), p->fits ? "yes" : "NO", p->percent);
    // auto chose by the measured step, which fits where the plan's total does not: say both.
    const mt_plan_recompute_choice *c = r->auto_choice;
    if (!p->fits && c && c->fits && !r->measured)
        fprintf(out, "  by the measured step --recompute auto chose from: yes (%.2f GB with 1 GB for the CUDA context, "
                     "%.0f%%); --measure prints it and decides the exit status\n",
                ((double)c->total + MT_PLAN_CUDA_RESERVE) / 1e9,
                100.0 * ((double)c->total + MT_PLAN_CUDA_RESERVE) / p->gpu_mem);
}

static void print_suggestions(FILE *out, const mt_plan_report *r) {
    if (r->plan->fits) return;
    if (!r->n_suggestions) {
        fprintf(out, "\nno single change makes it fit (4-bit base, expert parallelism, 8-bit Adam without master,\n"
                     "optimizer offload, full checkpointing, half the sequence or batch); combine them.\n");
        return;
    }
    fprintf(out, "\nwhat would make it fit (each change alone; new total per GPU):\n");
    for (int i = 0; i < r->n_suggestions; i++) {
        const mt_plan *s = &r->suggestions[i].plan;
        fprintf(out, "  %-34s %7.2f GB (%.0f%%)", r->suggestions[i].change, gb(s->total), s->percent);
        if (s->host_bytes) fprintf(out, " + %.2f GB of host memory", gb(s->host_bytes));
        fprintf(out, "\n");
    }
}

// ---------------------------------------------------------------------------------------------
// --measure: the null backend's peaks beside the plan

// The plan's figure a measured category is compared with: the plan's own, except act, which is
// compared with the model's set (mt_plan_act_terms says how it differs from docs/memory.md's).
static uint64_t planned_for(const mt_plan *p, mt_mem_cat c) {
    return c == MT_MEM_ACT ? p->act_model : p->bytes[c];
}

static double diff_percent(uint64_t planned, uint64_t measured) {
    if (!planned) return measured ? 100.0 : 0.0;
    return 100.0 * ((double)measured - (double)planned) / (double)planned;
}

static void print_measured_table(FILE *out, const mt_plan_report *r) {
    const mt_plan *p = r->plan;
    const mt_plan_measurement *m = r->measured;
    fprintf(out, "\n  %-8s %12s %12s %9s\n", "category", "planned GB", "measured GB", "diff");
    for (int c = 0; c < MT_MEM_COUNT; c++) {
        uint64_t pl = planned_for(p, (mt_mem_cat)c), me = m->peak[c];
        if (c == MT_MEM_COMM && !pl && !me) continue;
        fprintf(out, "  %-8s %12.3f %12.3f ", mt_mem_cat_name((mt_mem_cat)c), gb(pl), gb(me));
        if (c == MT_MEM_WORK) fprintf(out, "%9s   planned: a guess; measured: the step's scratch (below)\n", "-");
        else if (c == MT_MEM_ACT) fprintf(out, "%8.2f%%   the model's set; the plan's act is docs/memory.md's %.3f (below)\n",
                                          diff_percent(pl, me), gb(p->bytes[MT_MEM_ACT]));
        else fprintf(out, "%8.2f%%\n", diff_percent(pl, me));
    }
    fprintf(out, "  %-8s %12.3f %12.3f %8.2f%%   the plan's total; measured: the peak of the sum\n", "total",
            gb(p->total), gb(m->total_peak), diff_percent(p->total, m->total_peak));
    fprintf(out, "  work: the plan's figure is a guess for what the null backend cannot see (CUDA context,\n"
                 "  cuBLAS and NCCL workspaces, allocator slack); the measured peak is the GPU step's own\n"
                 "  scratch as the cuda backend allocates it (bf16 activation gradients, the bf16 dequant\n"
                 "  buffer of the largest 4-bit W outside the experts unless --dequant-cache keeps them in\n"
                 "  bf16, the experts' two dequantization slots and LoRA dxa), and the fused loss's chunk of\n"
                 "  fp32 logits, which the plan counts within its 10·s·b·V under act (never whole).\n");
    double pct = 100.0 * (double)m->total_peak / p->gpu_mem;
    fprintf(out, "fits on a %.0f GB card by the measured total (with --measure it decides): %s (%.0f%%)",
            p->gpu_mem / 1e9, mt_plan_measured_fits(m, p->gpu_mem) ? "yes" : "NO", pct);
    if (mt_plan_measured_fits(m, p->gpu_mem) != p->fits)
        fprintf(out, "; the plan's total says %s", p->fits ? "yes" : "no");
    fprintf(out, "\n  (neither total holds the CUDA context and library workspaces outside the ledger)\n");
}

static void print_act_terms(FILE *out, const mt_plan_report *r) {
    mt_plan_act_term t[MT_PLAN_MAX_ACT_TERMS];
    int n = mt_plan_act_terms(r->cfg, r->opts, t);
    const char *formula[] = {"full recomputation: L·2sbh + A_layer + k·s·b·6f + 10·s·b·V",
                             "no recomputation: L·A_layer + k·s·b·6f + 10·s·b·V",
                             "attention recomputed: L·2sbh + A_attn + L·A_mlp + k·s·b·6f + 10·s·b·V",
                             "MLP part recomputed: L·A_attn + A_mlp + k·s·b·6f + 10·s·b·V"};
    mt_ckpt c = r->opts->checkpointing == MT_CKPT_AUTO ? MT_CKPT_FULL : r->opts->checkpointing;
    fprintf(out, "\nact: docs/memory.md 'Activations' (the plan's act) against the set the model allocates, term by term, MB\n");
    fprintf(out, "  %11.3f  docs/memory.md 'Activations', %s\n", r->plan->bytes[MT_MEM_ACT] / 1e6, formula[c]);
    for (int i = 0; i < n; i++)
        if (t[i].bytes) fprintf(out, "  %+11.3f  %s\n", (double)t[i].bytes / 1e6, t[i].what);
    fprintf(out, "  %11.3f  = the model's set, compared above\n", r->plan->act_model / 1e6);
}

static void print_measured(FILE *out, const mt_plan_report *r) {
    const mt_plan_measurement *m = r->measured;
    fprintf(out, "\nmeasured: one training step on the null backend in %.3f s (build, AdamW state, forward, "
                 "backward,\nupdate; nothing allocated or computed, every buffer counted in the ledger). Storage as "
                 "a GPU\nrun keeps it: trainable weights, LoRA and their grads bf16; Adam m, v and master fp32; "
                 "activations\nbf16 (fp32: rstd, lse, router logits and probs, top-k weights, a chunk of lm_head logits). "
                 "Routing has no\ndata there: balanced, each expert T·k/E = %lld rows", m->seconds,
            (long long)m->rows_per_expert);
    if (m->rows_extra) fprintf(out, " (the first %lld one more)", (long long)m->rows_extra);
    fprintf(out, ", as the planner assumes.\n");
    print_measured_table(out, r);
    print_act_terms(out, r);
}

void mt_plan_print(FILE *out, const mt_plan_report *r) {
    print_run(out, r);
    print_params(out, r);
    print_table(out, r);
    print_suggestions(out, r);
    if (r->measured) print_measured(out, r);
    if (r->opts->plan_case && r->case_plan) print_source(out, r);
}

// ---------------------------------------------------------------------------------------------
// JSON

static void json_settings(cJSON *root, const mt_plan_opts *o) {
    char buf[256];
    cJSON *s = cJSON_AddObjectToObject(root, "settings");
    cJSON_AddStringToObject(s, "mode", mt_mode_name(o->mode));
    cJSON_AddNumberToObject(s, "r", o->lora_r);
    cJSON_AddStringToObject(s, "targets", targets_text(o->targets, buf, sizeof buf));
    cJSON_AddStringToObject(s, "layers", index_set_text(&o->layers, buf, sizeof buf));
    cJSON_AddStringToObject(s, "experts", index_set_text(&o->experts, buf, sizeof buf));
    cJSON_AddStringToObject(s, "quant", mt_quant_name(o->quant));
    cJSON_AddBoolToObject(s, "double_quant", o->double_quant);
    cJSON_AddNumberToObject(s, "blocksize", mt_q4_blocksize_or_default(o->quant, o->quant_blocksize));
    cJSON_AddNumberToObject(s, "seq", (double)o->seq);
    cJSON_AddNumberToObject(s, "batch", (double)o->batch);
    cJSON_AddStringToObject(s, "checkpointing", mt_ckpt_name(o->checkpointing));
    cJSON_AddStringToObject(s, "recompute", mt_ckpt_name(o->checkpointing));
    cJSON_AddNumberToObject(s, "gpus", o->gpus);
    cJSON_AddNumberToObject(s, "ep", o->ep);
    cJSON_AddNumberToObject(s, "zero", o->zero);
    cJSON_AddBoolToObject(s, "adam_8bit", o->adam_8bit);
    cJSON_AddBoolToObject(s, "master_weights", o->master_weights);
    cJSON_AddBoolToObject(s, "offload_optimizer", o->offload_optimizer);
}

static void json_params(cJSON *root, const mt_plan *p) {
    cJSON *j = cJSON_AddObjectToObject(root, "params");
    cJSON_AddNumberToObject(j, "model", (double)p->model_params);
    cJSON_AddNumberToObject(j, "trainable", (double)p->trainable_params);
    cJSON_AddNumberToObject(j, "trainable_gpu", (double)p->trainable_gpu);
    cJSON_AddNumberToObject(j, "expert_units", (double)p->units);
    cJSON_AddNumberToObject(j, "expert_units_gpu", (double)p->units_gpu);
    cJSON_AddNumberToObject(j, "frozen_4bit_gpu", (double)p->frozen_quant_gpu);
    cJSON_AddNumberToObject(j, "frozen_bf16_gpu", (double)p->frozen_bf16_gpu);
    cJSON_AddNumberToObject(j, "bits_per_4bit_weight", p->quant_bits);
    cJSON *parts = cJSON_AddArrayToObject(j, "parts");
    for (int i = 0; i < p->n_parts; i++) {
        cJSON *x = cJSON_CreateObject();
        cJSON_AddStringToObject(x, "what", p->parts[i].what);
        cJSON_AddNumberToObject(x, "count", (double)p->parts[i].count);
        cJSON_AddNumberToObject(x, "each", (double)p->parts[i].each);
        cJSON_AddBoolToObject(x, "replicated", p->parts[i].replicated);
        cJSON_AddItemToArray(parts, x);
    }
}

// Bytes as integers and GB as numbers, per category and in total.
static void json_memory(cJSON *root, const mt_plan *p) {
    cJSON *bytes = cJSON_AddObjectToObject(root, "bytes"), *g = cJSON_AddObjectToObject(root, "gb");
    for (int c = 0; c < MT_MEM_COUNT; c++) {
        cJSON_AddNumberToObject(bytes, mt_mem_cat_name((mt_mem_cat)c), (double)p->bytes[c]);
        cJSON_AddNumberToObject(g, mt_mem_cat_name((mt_mem_cat)c), gb(p->bytes[c]));
    }
    cJSON_AddNumberToObject(bytes, "total", (double)p->total);
    cJSON_AddNumberToObject(g, "total", gb(p->total));
    cJSON_AddNumberToObject(root, "total_gib", gib((double)p->total));
    cJSON_AddNumberToObject(root, "host_bytes", (double)p->host_bytes);
    cJSON_AddNumberToObject(root, "act_layer_bytes", (double)p->act_layer);
    cJSON_AddBoolToObject(root, "workspace_is_guess", p->workspace_guessed);
    cJSON_AddNumberToObject(root, "expert_dequant_scratch_bytes", (double)p->expert_dequant_bytes);
    cJSON_AddNumberToObject(root, "dequant_cache_bytes", (double)p->dequant_cache_bytes);
    cJSON_AddNumberToObject(root, "expert_cache_layers", p->expert_cache_layers);
    cJSON_AddNumberToObject(root, "expert_cache_bytes", (double)p->expert_cache_bytes);
    cJSON_AddNumberToObject(root, "expert_cache_layer_bytes", (double)p->expert_cache_layer_bytes);
    cJSON_AddNumberToObject(root, "expert_cache_freed_bytes", (double)p->expert_cache_freed);
    cJSON_AddNumberToObject(root, "expert_cache_held_bytes", (double)(p->expert_cache_layers ? p->expert_cache_held : 0));
    cJSON_AddNumberToObject(root, "expert_dropout_scratch_bytes", (double)p->expert_dropout_bytes);
    cJSON_AddNumberToObject(root, "gpu_mem_bytes", p->gpu_mem);
    cJSON_AddNumberToObject(root, "gpu_mem_gb", p->gpu_mem / 1e9);
    cJSON_AddNumberToObject(root, "gpu_mem_gib", gib(p->gpu_mem));
    cJSON_AddBoolToObject(root, "fits", p->fits);
    cJSON_AddNumberToObject(root, "percent", p->percent);
}

static void json_suggestions(cJSON *root, const mt_plan_report *r) {
    cJSON *arr = cJSON_AddArrayToObject(root, "suggestions");
    for (int i = 0; i < r->n_suggestions; i++) {
        const mt_plan *s = &r->suggestions[i].plan;
        cJSON *x = cJSON_CreateObject();
        cJSON_AddStringToObject(x, "change", r->suggestions[i].change);
        cJSON_AddNumberToObject(x, "total_bytes", (double)s->total);
        cJSON_AddNumberToObject(x, "total_gb", gb(s->total));
        cJSON_AddNumberToObject(x, "host_bytes", (double)s->host_bytes);
        cJSON_AddNumberToObject(x, "percent", s->percent);
        cJSON_AddBoolToObject(x, "fits", s->fits);
        cJSON_AddItemToArray(arr, x);
    }
}

static void json_source(cJSON *root, const mt_plan_report *r) {
    cJSON *arr = cJSON_AddArrayToObject(root, "source");
    for (size_t i = 0; i < MT_ARRAY_LEN(source_rows); i++) {
        const source_row *s = &source_rows[i];
        if (s->which != r->opts->plan_case) continue;
        char ours[64];
        cJSON *x = cJSON_CreateObject();
        cJSON_AddStringToObject(x, "item", s->item);
        cJSON_AddStringToObject(x, "source", s->source);
        cJSON_AddStringToObject(x, "ours", ours_text(s->ours, r->case_plan, ours, sizeof ours));
        cJSON_AddStringToObject(x, "note", s->note);
        cJSON_AddItemToArray(arr, x);
    }
}

// "measured": peaks, the figures they are compared with (act: the model's set), the
// differences, and the act terms.
static void json_measured(cJSON *root, const mt_plan_report *r) {
    const mt_plan_measurement *m = r->measured;
    cJSON *j = cJSON_AddObjectToObject(root, "measured");
    cJSON *peak = cJSON_AddObjectToObject(j, "bytes"), *pl = cJSON_AddObjectToObject(j, "planned_bytes");
    cJSON *diff = cJSON_AddObjectToObject(j, "diff_percent");
    for (int c = 0; c < MT_MEM_COUNT; c++) {
        const char *name = mt_mem_cat_name((mt_mem_cat)c);
        uint64_t p = planned_for(r->plan, (mt_mem_cat)c);
        cJSON_AddNumberToObject(peak, name, (double)m->peak[c]);
        cJSON_AddNumberToObject(pl, name, (double)p);
        cJSON_AddNumberToObject(diff, name, diff_percent(p, m->peak[c]));
    }
    cJSON_AddNumberToObject(j, "total_peak_bytes", (double)m->total_peak);
    cJSON_AddBoolToObject(j, "fits", mt_plan_measured_fits(m, r->plan->gpu_mem));
    cJSON_AddNumberToObject(j, "act_budgets_bytes", (double)r->plan->bytes[MT_MEM_ACT]);
    cJSON *terms = cJSON_AddArrayToObject(j, "act_terms");
    mt_plan_act_term t[MT_PLAN_MAX_ACT_TERMS];
    for (int i = 0, n = mt_plan_act_terms(r->cfg, r->opts, t); i < n; i++) {
        cJSON *x = cJSON_CreateObject();
        cJSON_AddStringToObject(x, "what", t[i].what);
        cJSON_AddNumberToObject(x, "bytes", (double)t[i].bytes);
        cJSON_AddItemToArray(terms, x);
    }
    cJSON_AddNumberToObject(j, "rows_per_expert", (double)m->rows_per_expert);
    cJSON_AddNumberToObject(j, "seconds", m->seconds);
}

char *mt_plan_json(const mt_plan_report *r) {
    cJSON *root = cJSON_CreateObject();
    char c[2] = {r->opts->plan_case, 0};
    cJSON_AddStringToObject(root, "model", r->model_name);
    if (r->opts->plan_case) cJSON_AddStringToObject(root, "case", c);
    else cJSON_AddNullToObject(root, "case");
    json_settings(root, r->opts);
    if (r->recompute && r->recompute[0]) cJSON_AddStringToObject(root, "recompute_choice", r->recompute);
    json_params(root, r->plan);
    json_memory(root, r->plan);
    cJSON_AddNumberToObject(root, "data_host_bytes", (double)r->opts->data_host_bytes);
    cJSON_AddNumberToObject(root, "data_host_bound", (double)r->opts->data_host_bound);
    json_suggestions(root, r);
    if (r->opts->plan_case && r->case_plan) json_source(root, r);
    if (r->measured) json_measured(root, r);
    char *text = cJSON_Print(root);
    cJSON_Delete(root);
    if (!text) mt_fatal(MT_EXIT_OOM, "out of host memory printing JSON");
    char *copy = mt_xstrdup(text);
    cJSON_free(text);
    return copy;
}
