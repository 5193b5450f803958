// trainer/cmd/cmd_plan.c — `moetrain plan`: the per-GPU memory of a run by category, whether it fits,
// and what would make it fit (the arithmetic is in plan/plan.c).
#include <string.h>

#include "core/common.h"
#include "model/config.h"
#include "trainer/cmd/commands.h"
#include "trainer/options.h"
#include "plan/plan.h"

static void plan_usage(FILE *out) {
    fprintf(out,
            "usage: moetrain plan --model DIR|CONFIG.json [FLAGS]\n"
            "       moetrain plan --case A|B|C [FLAGS]    (docs/memory.md's Mixtral-8x7B cases; flags override)\n\n"
            "Prints the memory of one training step on the most loaded GPU, by category (GB = 1e9 B),\n"
            "whether it fits --gpu-mem, and which single changes would make it fit.\n"
            "Exit status: 0 fits, 3 does not fit, 2 bad flag, 1 bad model.\n\n"
            "--measure also runs one training step of the real code on the null backend (the model built\n"
            "from its config, nothing read, allocated or computed; the ledger counts every buffer) and\n"
            "prints the measured peak per category beside the plan; then the measured total decides the\n"
            "exit status (the plan's total is an upper bound: docs/memory.md's act and a guessed workspace).\n"
            "--max-seq prints the longest --seq that fits (the plan's total; with --measure the measured one).\n\n");
    mt_run_opts_print_help(out);
}

// A case sets the run first; flags and --config given beside it override its settings.
static int parse_opts(int argc, char **argv, mt_run_opts *o, mt_opt_pairs *given) {
    mt_run_opts_default(o);
    if (mt_run_opts_parse_cmd(o, argc, argv, "plan", given) != 0) return -1;
    if (!o->plan_case) return 0;
    char which = o->plan_case;
    mt_run_opts_default(o);
    if (mt_plan_case_apply(o, which) != 0 || mt_run_opts_parse_cmd(o, argc, argv, "plan", NULL) != 0) return -1;
    o->plan_case = which;
    return 0;
}

// The model from --model, or the built-in Mixtral-8x7B for --case. Returns an exit code.
static int load_model(const mt_run_opts *o, mt_model_config *cfg, char *name, size_t n) {
    if (o->model[0]) {
        if (mt_model_config_load(o->model, cfg) != 0) {
            fprintf(stderr, "moetrain plan: %s\n", mt_error_get());
            return MT_EXIT_ERROR;
        }
        snprintf(name, n, "%s", o->model);
        return MT_EXIT_OK;
    }
    if (o->plan_case) {
        mt_plan_mixtral_8x7b(cfg);
        snprintf(name, n, "Mixtral-8x7B (built-in config)");
        return MT_EXIT_OK;
    }
    fprintf(stderr, "moetrain plan: --model is required (a checkpoint folder or its config.json), "
                    "or --case A|B|C for Mixtral-8x7B\n");
    return MT_EXIT_USAGE;
}

// --max-seq: binary search of the sequence over the plan (or, with --measure, over null-backend
// steps), up to the model's max_position_embeddings.
static int max_seq(const mt_run_opts *o, const mt_model_config *cfg, const mt_plan_opts *po) {
    mt_model_spec spec = mt_run_opts_model_spec(o);
    int64_t limit = cfg->max_positions > 0 ? cfg->max_positions : (int64_t)1 << 20;
    uint64_t total = 0;
    int64_t s = mt_plan_max_seq(cfg, po, o->measure ? &spec : NULL, limit, &total);
    if (s < 0) {
        fprintf(stderr, "moetrain plan --max-seq: %s\n", mt_error_get());
        return MT_EXIT_USAGE;
    }
    const char *by = o->measure ? "the measured total (one null-backend step per probe)" : "the plan's total";
    if (s == 0) {
        printf("max-seq: not even --seq 1 fits a %.0f GB card by %s\n", po->gpu_mem_bytes / 1e9, by);
        return MT_EXIT_NOFIT;
    }
    printf("max-seq: %lld tokens (batch %lld) fit a %.0f GB card by %s: %.2f GB (%.0f%%)%s\n", (long long)s,
           (long long)po->batch, po->gpu_mem_bytes / 1e9, by, total / 1e9, 100.0 * (double)total / po->gpu_mem_bytes,
           s == limit ? ", the model's max_position_embeddings" : "");
    return MT_EXIT_OK;
}

int cmd_plan(int argc, char **argv) {
    if (mt_args_want_help(argc, argv)) {
        plan_usage(stdout);
        return MT_EXIT_OK;
    }
    mt_run_opts o;
    mt_opt_pairs given = {0};
    int bad = parse_opts(argc, argv, &o, &given);
    // A plan is per GPU unless the run is named a cpu one (--device cpu): then no CUDA context.
    const char *dev = mt_opt_pairs_get(&given, "device") ? mt_opt_pairs_get(&given, "device")
                                                         : mt_opt_pairs_get(&given, "backend");
    int cpu = dev && strcmp(dev, "cpu") == 0, seq_given = mt_opt_pairs_get(&given, "seq") != NULL;
    mt_opt_pairs_free(&given);
    if (bad) {
        fprintf(stderr, "moetrain plan: %s\n", mt_error_get());
        return MT_EXIT_USAGE;
    }
    mt_model_config cfg;
    char name[1100];
    int rc = load_model(&o, &cfg, name, sizeof name);
    if (rc != MT_EXIT_OK) return rc;

    // --seq past max_position_embeddings, as train takes it: the default capped, a given one warned of
    if (!o.max_seq && !o.plan_case && cfg.max_positions > 0 && o.seq > cfg.max_positions) {
        if (seq_given)
            mt_warn("--seq %lld is above the model's max_position_embeddings %lld: train refuses it (--max-seq stops "
                    "there)", (long long)o.seq, (long long)cfg.max_positions);
        else
            o.seq = cfg.max_positions;
    }
    // --recompute auto: the least recomputation that fits --gpu-mem, by the measured step (and
    // --dequant-cache auto after it; a cpu run keeps no bf16 copies).
    if (cpu && o.dequant_cache == MT_DEQUANT_CACHE_ON)
        mt_warn("--dequant-cache on: a cpu run keeps no bf16 copies (it multiplies the 4-bit tiles); planned without them");
    if (cpu) o.dequant_cache = MT_DEQUANT_CACHE_OFF;
    if (cpu && o.expert_cache != 0 && o.expert_cache != MT_EXPERT_CACHE_AUTO)
        mt_warn("--expert-cache: a cpu run keeps no bf16 experts; planned without them");
    if (cpu) o.expert_cache = 0;
    char recompute[512] = "";
    mt_plan_recompute_choice choice = {0};
    if (!o.max_seq && mt_run_opts_resolve_recompute(&o, &cfg, 1, recompute, sizeof recompute, &choice) != 0) {
        fprintf(stderr, "moetrain plan: %s\n", mt_error_get());
        return MT_EXIT_USAGE;
    }
    // --max-seq resolves nothing (auto keeps only what fits: none at the longest sequence), but
    // all is every MoE layer's, as a count would be.
    if (o.max_seq && o.expert_cache == MT_EXPERT_CACHE_ALL) o.expert_cache = (int)mt_config_moe_layers(&cfg);
    mt_plan_opts po = mt_run_opts_plan(&o);
    po.cpu = cpu;
    if (o.max_seq) return max_seq(&o, &cfg, &po);
    mt_plan plan;
    if (mt_plan_compute(&cfg, &po, &plan) != 0) {
        fprintf(stderr, "moetrain plan: %s\n", mt_error_get());
        return MT_EXIT_USAGE;
    }
    mt_plan_suggestion suggestions[MT_PLAN_MAX_SUGGESTIONS];
    int n = plan.fits ? 0 : mt_plan_suggest(&cfg, &po, suggestions, MT_PLAN_MAX_SUGGESTIONS);
    // For --case, the source's figures are compared with the case on its own settings.
    mt_run_opts case_opts;
    mt_plan case_plan;
    int have_case = 0;
    if (o.plan_case) {
        mt_run_opts_default(&case_opts);
        have_case = mt_plan_case_apply(&case_opts, o.plan_case) == 0 &&
                    mt_plan_compute(&cfg, MT_PLAN_OPTS_OF(&case_opts), &case_plan) == 0;
    }
    mt_plan_measurement measured;
    mt_model_spec spec = mt_run_opts_model_spec(&o);
    if (o.measure && mt_plan_measure(&cfg, o.model[0] ? o.model : NULL, &po, &spec, &measured) != 0) {
        fprintf(stderr, "moetrain plan --measure: %s\n", mt_error_get());
        return MT_EXIT_USAGE;
    }
    mt_plan_report report = {name, &cfg, &po, &plan, suggestions, n, have_case ? &case_plan : NULL,
                             o.measure ? &measured : NULL, recompute, choice.measured ? &choice : NULL};
    if (o.json) {
        char *text = mt_plan_json(&report);
        puts(text);
        free(text);
    } else {
        mt_plan_print(stdout, &report);
    }
    int fits = o.measure ? mt_plan_measured_fits(&measured, po.gpu_mem_bytes) : plan.fits;
    return fits ? MT_EXIT_OK : MT_EXIT_NOFIT;  // --measure: the measured total decides
}
