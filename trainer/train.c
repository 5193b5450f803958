// trainer/train.c — `moetrain [train]`: the training loop.
//
// plan → load → (resume) → for each step: accumulate micro-batches (forward, backward), clip,
// AdamW, log; checkpoints every --save-every and at the end; SIGINT/SIGTERM save and stop.
#include <dirent.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "core/common.h"
#include "core/fileio.h"
#include "core/rng.h"
#include "core/sha256.h"
#include "core/threads.h"
#include "lora/peft.h"
#include "model/mixtral.h"
#include "quant/formats.h"
#include "trainer/checkpoint.h"
#include "trainer/cmd/commands.h"
#include "data/data.h"
#include "optim/dist.h"
#include "trainer/metrics.h"
#include "optim/params.h"
#include "plan/plan.h"
#include "optim/schedule.h"
#include "data/tokenizer.h"

static volatile sig_atomic_t stop_requested;
static void on_signal(int sig) { stop_requested = sig; }

static double now_s(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + t.tv_nsec * 1e-9;
}

// What must not change between a run and its resume.
static void run_id(const mt_run_opts *o, const mt_model_config *c, char *buf, size_t n) {
    char layers[64] = "all", experts[64] = "all";
    if (!o->layers.all) snprintf(layers, sizeof layers, "%d@%d", o->layers.count, o->layers.count ? o->layers.items[0] : -1);
    if (!o->experts.all) snprintf(experts, sizeof experts, "%d@%d", o->experts.count, o->experts.count ? o->experts.items[0] : -1);
    snprintf(buf, n,
             "mode=%s r=%d alpha=%g rslora=%d dropout=%g targets=%#x layers=%s experts=%s quant=%s dq=%d block=%d "
             "qtargets=%#x seq=%lld batch=%lld accum=%d seed=%llu model=%lldx%lldx%lldx%lld ranks=%d ep=%d zero=%d",
             mt_mode_name(o->mode), o->lora_r, o->lora_alpha, o->use_rslora, o->lora_dropout, o->targets, layers,
             experts, mt_quant_name(o->quant), o->double_quant, mt_q4_blocksize_or_default(o->quant, o->quant_blocksize),
             o->quant_targets, (long long)o->seq, (long long)o->batch, o->accum, (unsigned long long)o->seed, (long long)c->layers,
             (long long)c->hidden, (long long)c->experts, (long long)c->vocab, o->gpus, o->ep, o->zero);
}

// --batch × --seq against this machine's memory, before anything is allocated: the host's token
// buffers (tokens, labels, mask of every rank's rows), and on the cpu the whole plan too.
static int check_host_memory(const mt_run_opts *o, const mt_plan *plan) {
    double phys = (double)sysconf(_SC_PHYS_PAGES) * (double)sysconf(_SC_PAGESIZE);
    double need = 3.0 * 4.0 * (double)o->batch * (double)o->gpus * (double)o->seq;
    if (strcmp(o->backend, "cpu") == 0) need += (double)plan->total;
    if (phys > 0 && need > phys) {
        mt_error_set("--batch %lld × --seq %lld needs about %.2f GB of host memory, more than this machine's %.2f GB: "
                     "lower --batch or --seq (gradient accumulation, --accum, keeps the tokens per step)",
                     (long long)o->batch, (long long)o->seq, need / 1e9, phys / 1e9);
        return -1;
    }
    return 0;
}

// The one-line plan (the full table with --verbose), then whether it fits: --gpu-mem on a cuda run
// (and on the cpu when given), --mem on the cpu. 0, 1 when it does not fit (exit 3), -1 on error.
static int print_plan(const mt_model_config *cfg, const mt_run_opts *o, const char *recompute, int gpu_mem_given,
                      int say) {
    mt_plan plan;
    mt_plan_opts po = mt_run_opts_plan(o);
    int cpu = strcmp(o->backend, "cpu") == 0;
    po.cpu = cpu;  // no CUDA context or library workspace counted on the cpu
    if (mt_plan_compute(cfg, &po, &plan) != 0) return -1;
    mt_plan_report rep = {.model_name = o->model, .cfg = cfg, .opts = &po, .plan = &plan, .recompute = recompute};
    if (!say) {  // another rank: the same verdict, printed once by rank 0
    } else if (o->verbose) {
        mt_plan_print(stdout, &rep);
    } else {  // one line: the total, the fit and the three largest categories (--verbose or `plan`: all)
        int top[3] = {-1, -1, -1};
        for (int c = 0; c < MT_MEM_COUNT; c++)
            for (int k = 0; k < 3; k++)
                if (top[k] < 0 || plan.bytes[c] > plan.bytes[top[k]]) {
                    for (int j = 2; j > k; j--) top[j] = top[j - 1];
                    top[k] = c;
                    break;
                }
        if (cpu && !gpu_mem_given && o->mem_bytes > 0)
            printf("plan: %.3g GB on the cpu of --mem %.3g GB, %s; largest:", plan.total / 1e9, o->mem_bytes / 1e9,
                   (double)plan.total <= o->mem_bytes ? "fits" : "DOES NOT FIT");
        else if (cpu && !gpu_mem_given)
            printf("plan: %.3g GB on the cpu (--mem sets a limit); largest:", plan.total / 1e9);
        else
            printf("plan: %.2f GB per GPU of %.0f GB (%.0f%%), %s; largest:", plan.total / 1e9, plan.gpu_mem / 1e9,
                   plan.percent, plan.fits ? "fits" : "DOES NOT FIT");
        for (int k = 0; k < 3; k++)
            if (plan.bytes[top[k]]) printf("%s %s %.3g GB", k ? "," : "", mt_mem_cat_name((mt_mem_cat)top[k]), plan.bytes[top[k]] / 1e9);
        printf("; recompute: %s (full table: --verbose or `moetrain plan`)\n", recompute);
    }
    if (o->mem_bytes > 0 && (double)plan.total > o->mem_bytes) {
        mt_error_set("the plan needs %.3g GB but --mem allows %.3g GB; see `moetrain plan` for what would fit",
                     plan.total / 1e9, o->mem_bytes / 1e9);
        return 1;
    }
    if ((!cpu || gpu_mem_given) && !plan.fits) {
        mt_error_set("the plan needs %.3g GB per GPU but --gpu-mem is %.3g GB: nothing was trained; `moetrain plan` "
                     "with the same flags lists what would fit", plan.total / 1e9, plan.gpu_mem / 1e9);
        return 1;
    }
    return check_host_memory(o, &plan);
}

typedef struct {
    mt_run_opts *o;
    mt_backend *be;            // cpu, or cuda (--device)
    mt_comm *world, *ep, *dp;  // NULL on one cpu process without a launcher
    int rank, ranks;           // world rank and size: rank r trains rows [r·B, r·B + B) of each
                               // micro-batch of B·ranks rows that every rank reads alike
    mt_dist dist;
    mt_model m;
    mt_tokenizer tok;
    mt_dataset data, eval;
    int have_eval;
    mt_param *params;
    int n_params;
    mt_param *saved;  // what a checkpoint keeps: params, then the score biases --router-bias-update
    int n_saved;      // moves (no gradient; names owned here, the rest params')
    mt_adamw opt;
    mt_metrics metrics;
    mt_train_state st;
    char run_id[1024];
    int32_t *tokens, *labels, *mask;
    float *load;  // [layers × experts] expert load of the last step
    int exit_code;  // 0, or 128 + the signal that stopped the run after its checkpoint was saved
    int fail_code;  // the exit code of a failed setup: 2 for a bad flag, 3 for a plan that does not fit
    const mt_opt_pairs *given;     // the run's settings, kept in each checkpoint's state.json
    const mt_opt_pairs *overrides; // --resume-override: "key", "was -> now" pairs, logged in metrics.jsonl
    double best_eval;              // --early-stop-patience: the lowest eval loss so far, its step
    int64_t best_step, evals_since_best;
} trainer;

// Mean CE over one pass of the eval data, with LoRA dropout off for the pass.
static double evaluate(trainer *t, int64_t *tokens_out) {
    mt_model_set_lora_dropout(&t->m, 0.0f);
    mt_eval_result r;
    int rc = mt_eval_dataset(&t->m, &t->eval, (int)t->o->batch, (int)t->o->seq, &r);
    mt_model_set_lora_dropout(&t->m, (float)t->o->lora_dropout);
    *tokens_out = rc == 0 ? r.tokens : 0;
    return rc == 0 ? r.loss : NAN;
}

// The share of each layer's assignments each expert got in the last micro-batch: the whole
// batch's when several ranks hold a slice of it.
static void expert_load(trainer *t) {
    const mt_model_config *c = &t->m.cfg;
    size_t n = (size_t)(c->layers * c->experts);
    int32_t *all = mt_xcalloc(n, sizeof(int32_t));
    for (int L = 0; L < c->layers; L++) memcpy(all + L * c->experts, t->m.kept[L].counts, (size_t)c->experts * 4);
    if (t->world) mt_comm_host_all_reduce(t->world, all, n, MT_COMM_I32, MT_COMM_SUM, 0);
    for (int L = 0; L < c->layers; L++) {
        double total = 0;
        for (int e = 0; e < c->experts; e++) total += all[L * c->experts + e];
        for (int e = 0; e < c->experts; e++)
            t->load[L * c->experts + e] = total > 0 ? (float)(all[L * c->experts + e] / total) : 0.0f;
    }
    free(all);
}

// --router-bias-update: the step's load moves every layer's e_score_correction_bias; the worst
// layer's max/mean load is logged at the first step and every tenth (1: balanced).
static void balance_router(trainer *t) {
    const mt_model_config *c = &t->m.cfg;
    double *mm = mt_xcalloc((size_t)c->layers, sizeof(double)), worst = 0;
    mt_model_bias_balance_step(&t->m, t->ranks > 1 ? t->world : NULL, (float)t->o->router_bias_update, mm);
    int wl = 0;
    for (int L = 0; L < c->layers; L++)
        if (mm[L] > worst) worst = mm[L], wl = L;
    if (t->rank == 0 && (t->st.step == 1 || t->st.step % 10 == 0))
        mt_info("step %lld: router bias update %g; expert load max/mean %.3f (layer %d, the worst)",
                (long long)t->st.step, t->o->router_bias_update, worst, wl);
    free(mm);
}

static int save(trainer *t) {
    if (mt_checkpoint_save(t->o->out, t->saved, t->n_saved, t->dist.opt, t->dist.n_opt, &t->opt, &t->st,
                           t->run_id, t->world) != 0)
        return -1;
    if (t->rank == 0) mt_checkpoint_prune(t->o->out, t->o->save_total_limit);
    char f[96];
    snprintf(f, sizeof f, "\"step\":%lld", (long long)t->st.step);
    if (t->rank == 0) mt_metrics_event(&t->metrics, "save", f);
    return 0;
}

// The run's product: a PEFT adapter (lora) or the trained tensors (router, unfreeze, full).
static int write_outputs(trainer *t) {
    mt_model_gather_experts(&t->m);  // EP: rank 0 collects the experts the others trained
    if (t->rank != 0) return 0;
    char path[4200];
    // how the rows were rendered, for `generate` to render its prompt alike
    mt_train_template rec = {.text = t->data.stats.text, .instruction = t->data.stats.instruction,
                             .chat = t->data.stats.chat, .pretokenized = t->data.stats.pretokenized};
    if (rec.chat) snprintf(rec.chat_template, sizeof rec.chat_template, "%s", mt_chat_style_name(t->data.opts.chat.style));
    if (t->o->mode == MT_MODE_LORA) {
        snprintf(path, sizeof path, "%s/adapter", t->o->out);
        // moetrain_base.json: the base's quantization, which `moetrain merge` defaults to;
        // training_template.json: how the rows were rendered, which `generate` follows
        // and MT_SCORE_BIAS_FILE: the biases --router-bias-update moved (eval, generate and merge read it)
        static const char *const files[] = {"adapter_config.json", "adapter_model.safetensors", MT_BASE_RECORD,
                                            MT_TRAIN_TEMPLATE_FILE, MT_SCORE_BIAS_FILE};
        char list[4300], biases[4400];
        snprintf(list, sizeof list, "%s/SHA256SUMS", path);
        snprintf(biases, sizeof biases, "%s/%s", path, MT_SCORE_BIAS_FILE);
        int moved = t->o->router_bias_update > 0;
        mt_peft_format fmt;
        if (mt_peft_format_parse(t->o->peft_format, t->o->model, &fmt) != 0) return -1;
        if (mt_model_save_adapter_as(&t->m, path, t->o->model, fmt) != 0 ||
            mt_base_record_write(path, &t->m.cfg, t->o) != 0 || mt_train_template_write(path, &rec) != 0 ||
            (moved && mt_model_save_score_biases(&t->m, biases) != 0) ||
            mt_sha256sums_write(list, path, files, 4 + moved) != 0)
            return -1;
    } else {
        static const char *const files[] = {"trained.safetensors"};
        char list[4300];
        snprintf(path, sizeof path, "%s/trained.safetensors", t->o->out);
        snprintf(list, sizeof list, "%s.sha256", path);
        if (mt_model_save_trained(&t->m, path) != 0 || mt_sha256sums_write(list, t->o->out, files, 1) != 0 ||
            mt_base_record_write(t->o->out, &t->m.cfg, t->o) != 0 || mt_train_template_write(t->o->out, &rec) != 0)
            return -1;
    }
    mt_info("wrote %s", path);
    return 0;
}

static int64_t total_steps(trainer *t) {
    if (t->o->steps > 0) return t->o->steps;
    int64_t rows = mt_data_epoch_rows(&t->data, 0, (int)t->o->seq);
    int64_t per_step = t->o->batch * t->o->accum;
    int64_t steps = (int64_t)ceil(t->o->epochs * (double)rows / (double)per_step);
    return steps > 0 ? steps : 1;
}

// A launched run (mpirun, srun), one asking for several GPUs, or any cuda run (a 1-rank NCCL
// world without a launcher, so that one GPU runs the path of many): the world, its EP × DP grid.
static int start_ranks(trainer *t) {
    mt_run_opts *o = t->o;
    int cuda = t->be->ops->kind == MT_BACKEND_CUDA;
    t->ranks = 1;
    if (o->zero > 1) {
        mt_error_set("--zero %d: ZeRO-2 (sharded gradients) is planned by `moetrain plan`, not implemented; "
                     "--zero 1 shards Adam state and master weights", o->zero);
        return -1;
    }

    if (!cuda && !mt_comm_launched() && o->gpus == 1 && o->ep == 1) return 0;
    if (!(t->world = mt_comm_init(MT_COMM_AUTO, cuda ? t->be : NULL))) return -1;
    t->rank = mt_comm_rank(t->world), t->ranks = mt_comm_size(t->world);
    if (o->gpus != 1 && o->gpus != t->ranks) {
        mt_error_set("--gpus %d, but the launcher started %d ranks (mpirun -np %d ...)", o->gpus, t->ranks, o->gpus);
        return -1;
    }
    o->gpus = t->ranks;
    if (o->ep < 1 || t->ranks % o->ep != 0) {
        mt_error_set("--ep %d does not divide the %d rank%s%s", o->ep, t->ranks, t->ranks == 1 ? "" : "s",
                     t->ranks == 1 ? " (start the ranks with a launcher: mpirun -np N moetrain ... --ep N)" : "");
        return -1;
    }
    if (o->ep > 1 && o->mode == MT_MODE_FULL) {
        mt_error_set("--ep with --mode full is not supported: every rank would hold the whole model");
        return -1;
    }
    return mt_comm_grid(t->world, o->ep, &t->ep, &t->dp);
}

// A resumed run with --early-stop-patience: the best so far is the lowest eval loss its checkpoints
// up to the resumed step record (the count of evaluations since then starts again at 0).
static void best_so_far(trainer *t) {
    DIR *d = opendir(t->o->out);
    for (struct dirent *e; d && (e = readdir(d));) {
        if (strncmp(e->d_name, "checkpoint-", 11) != 0) continue;
        char path[4400], run[8];
        snprintf(path, sizeof path, "%.1023s/%.255s/state.json", t->o->out, e->d_name);
        mt_train_state st = {0};
        if (mt_ckpt_state_parse(path, &st, run, sizeof run) != 0) continue;
        if (st.eval_loss == st.eval_loss && st.step <= t->st.step && (t->best_step == 0 || st.eval_loss < t->best_eval))
            t->best_eval = st.eval_loss, t->best_step = st.step;
    }
    if (d) closedir(d);
    mt_error_clear();
}

// --adapter of another rank than --r: say which --r it needs (before its tensors' shapes disagree).
static int check_adapter_rank(const mt_run_opts *o) {
    char path[4200], *text;
    size_t len;
    snprintf(path, sizeof path, "%.1023s/adapter_config.json", o->adapter);
    if (mt_read_file(path, 1 << 20, &text, &len) != 0) return 0;  // the loader names what is missing
    mt_peft_config pc;
    int rc = mt_peft_config_parse(text, len, path, &pc);
    free(text);
    if (rc == 0 && pc.r != o->lora_r) {
        mt_error_set("--adapter %s has rank %d but this run's --r is %d: pass --r %d", o->adapter, pc.r, o->lora_r, pc.r);
        return -1;
    }
    return 0;
}

// What a run writes into --out (and the debris of killed ones): what --overwrite may remove.
static int is_run_output(const char *name) {
    static const char *const exact[] = {"metrics.jsonl", "latest", "adapter", "trained.safetensors",
                                        "trained.safetensors.sha256", MT_TRAIN_TEMPLATE_FILE, MT_BASE_RECORD,
                                        "runs"};
    for (size_t i = 0; i < MT_ARRAY_LEN(exact); i++)
        if (strcmp(name, exact[i]) == 0) return 1;
    return strncmp(name, "checkpoint-", 11) == 0 || strncmp(name, ".checkpoint-", 12) == 0 ||
           strncmp(name, "latest.tmp", 10) == 0 || strncmp(name, "events.out.tfevents.", 20) == 0 ||
           strncmp(name, ".metrics.jsonl", 14) == 0 || (name[0] == '.' && strstr(name, ".tmp"));
}

// A new run (no --resume) into a folder that holds something: refused naming what is there, or
// with --overwrite an earlier run's outputs removed first (anything else there is still refused:
// --overwrite removes only what moetrain wrote). 0, or -1 with an error.
static int check_out(const mt_run_opts *o) {
    DIR *d = opendir(o->out);
    if (!d) return 0;  // absent: made later
    char seen[512] = "", other[512] = "";
    int n = 0, n_other = 0;
    for (struct dirent *e; (e = readdir(d));) {
        if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0) continue;
        n++;
        char *list = is_run_output(e->d_name) ? seen : other;
        n_other += list == other;
        if (strlen(list) + strlen(e->d_name) + 8 < sizeof seen)
            snprintf(list + strlen(list), sizeof seen - strlen(list), "%s%s", list[0] ? ", " : "", e->d_name);
    }
    closedir(d);
    if (n == 0) return 0;
    if (!o->overwrite) {
        mt_error_set("--out %s is not empty (it holds %s%s%s): pass --resume %s to continue the run there, "
                     "--overwrite to replace its outputs, or another --out", o->out, seen, seen[0] && other[0] ? ", " : "",
                     other, o->out);
        return -1;
    }
    if (n_other) {
        mt_error_set("--out %s holds files moetrain did not write (%s): --overwrite removes only a run's outputs; "
                     "choose another --out", o->out, other);
        return -1;
    }
    if (!(d = opendir(o->out))) return 0;
    int rc = 0;
    for (struct dirent *e; rc == 0 && (e = readdir(d));) {
        if (!is_run_output(e->d_name) || strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0) continue;
        char path[4400];
        snprintf(path, sizeof path, "%.1023s/%.255s", o->out, e->d_name);
        rc = mt_is_dir(path) ? mt_remove_flat_dir(path) : unlink(path) == 0 ? 0 : (mt_error_set("%s: cannot remove", path), -1);
    }
    closedir(d);
    if (rc == 0) mt_info("--overwrite: removed the earlier run's outputs from %s (%s)", o->out, seen);
    return rc;
}

static int setup(trainer *t) {
    mt_run_opts *o = t->o;
    t->fail_code = MT_EXIT_USAGE;  // until the flags are checked against each other and the model
    if (!o->model[0] || !o->data[0]) {
        mt_error_set("--model and --data are required, or --resume OUT alone to continue a run (see moetrain train "
                     "--help)");
        return -1;
    }
    if (strcmp(o->backend, "cpu") != 0 && strcmp(o->backend, "cuda") != 0) {
        mt_error_set("--device %s: training runs on cpu or cuda", o->backend);
        return -1;
    }
    if (o->early_stop_patience > 0 && (!o->eval_data[0] || o->eval_every <= 0)) {
        mt_error_set("--early-stop-patience %lld watches the eval loss: it needs --eval-data and --eval-every N",
                     (long long)o->early_stop_patience);
        return -1;
    }
    // Before MPI starts: the node-local rank picks the GPU.
    t->be = strcmp(o->backend, "cuda") == 0 ? mt_backend_cuda_new(mt_comm_local_rank()) : mt_backend_cpu_new();
    if (!t->be) return -1;
    t->fail_code = MT_EXIT_ERROR;
    if (start_ranks(t) != 0) return -1;
    t->fail_code = MT_EXIT_USAGE;
    if (!o->out[0]) snprintf(o->out, sizeof o->out, "moetrain-out");
    if (o->accum < 1 || o->batch < 1 || o->seq < 2) {
        mt_error_set("--accum and --batch must be at least 1 and --seq at least 2");
        return -1;
    }
    // Rank 0 looks at --out (and clears it with --overwrite) before any rank writes there.
    int out_bad = !o->resume[0] && t->rank == 0 && check_out(o) != 0;
    if (t->world ? mt_comm_any(t->world, out_bad) : out_bad) {
        if (!out_bad) mt_error_set("rank 0 refused --out %s", o->out);
        return -1;
    }
    t->fail_code = MT_EXIT_ERROR;
    // Debris of killed runs (temporary folders whose process is gone), before anything is written;
    // the checkpoint to resume from verified before anything is loaded.
    if (t->rank == 0) mt_checkpoint_remove_stale(o->out);
    t->st.eval_loss = NAN;
    char dir[4096];
    int bad = o->resume[0] && mt_checkpoint_find_verified(o->resume, dir) != 0;
    if (t->world ? mt_comm_any(t->world, bad) : bad) {
        if (!bad) mt_error_set("another rank found no checkpoint that verifies");
        return -1;
    }
    if (t->world && o->resume[0] && mt_comm_check_same(t->world, "checkpoint to resume", mt_hash_string(dir)) != 0)
        return -1;
    mt_model_config cfg;
    if (mt_model_config_load(o->model, &cfg) != 0) return -1;
    // Flags the model cannot take are bad flags (exit 2), said before anything is built.
    t->fail_code = MT_EXIT_USAGE;
    for (int i = 0; !o->layers.all && i < o->layers.count; i++)
        if (o->layers.items[i] >= cfg.layers) {
            mt_error_set("--layers names layer %d but the model has %lld (0-%lld)", o->layers.items[i],
                         (long long)cfg.layers, (long long)cfg.layers - 1);
            return -1;
        }
    for (int i = 0; !o->experts.all && i < o->experts.count; i++)
        if (o->experts.items[i] >= cfg.experts) {
            mt_error_set("--experts names expert %d but the model has %lld (0-%lld)", o->experts.items[i],
                         (long long)cfg.experts, (long long)cfg.experts - 1);
            return -1;
        }
    // As `plan --max-seq` stops at max_position_embeddings, training does not go past it (RoPE
    // without scaling would train on angles the model never saw): the default --seq is capped
    // there, as TRL caps max_seq_length at the model's, and a --seq given above it is refused.
    if (cfg.max_positions > 0 && o->seq > cfg.max_positions) {
        if (t->given && mt_opt_pairs_get(t->given, "seq")) {
            mt_error_set("--seq %lld is above the model's max_position_embeddings %lld (%s's config.json): use --seq "
                         "%lld or less", (long long)o->seq, (long long)cfg.max_positions, o->model,
                         (long long)cfg.max_positions);
            return -1;
        }
        if (t->rank == 0)
            mt_info("--seq %lld (the default) capped at the model's max_position_embeddings: %lld", (long long)o->seq,
                    (long long)cfg.max_positions);
        o->seq = cfg.max_positions;
    }
    t->fail_code = MT_EXIT_ERROR;
    run_id(o, &cfg, t->run_id, sizeof t->run_id);
    if (t->world && mt_comm_check_same(t->world, "run options", mt_hash_string(t->run_id)) != 0) return -1;
    if (t->rank == 0) mt_note_quant_on_load(&cfg, o, "train");
    // Without --gpu-mem a cuda run plans for the card it has (the default 44 GB is for `plan`): an
    // 80 GB H100 keeps what a 44 GB card would recompute.
    size_t dev_free, dev_total;
    int gpu_mem_given = t->given && mt_opt_pairs_get(t->given, "gpu-mem"), gpu = strcmp(o->backend, "cpu") != 0;
    if (!gpu_mem_given && t->be->ops->kind == MT_BACKEND_CUDA && mt_cuda_mem_info(t->be, &dev_free, &dev_total) == 0)
        o->gpu_mem_bytes = (double)dev_total, gpu = MT_GPU_MEM_OF_CARD;
    // --recompute auto: the least recomputation that fits this device, the same on every rank.
    char recompute[512];
    if (mt_run_opts_resolve_recompute(o, &cfg, gpu, recompute, sizeof recompute, NULL) != 0)
        return -1;
    if (t->world && mt_comm_check_same(t->world, "--recompute's choice", (uint64_t)o->checkpointing) != 0) return -1;
    if (t->world && mt_comm_check_same(t->world, "--dequant-cache's choice", (uint64_t)o->dequant_cache) != 0) return -1;
    if (t->world && mt_comm_check_same(t->world, "--expert-cache's choice", (uint64_t)o->expert_cache) != 0) return -1;
    // Every rank reaches the same verdict (the same plan), so every rank exits 3 alike.
    int fit = print_plan(&cfg, o, recompute, gpu_mem_given, t->rank == 0);
    if (fit) t->fail_code = fit > 0 ? MT_EXIT_NOFIT : MT_EXIT_ERROR;
    if (fit) return -1;
    mt_backend *be = t->be;
    mt_model_par par = {.ep_rank = t->ep ? mt_comm_rank(t->ep) : 0, .ep_size = o->ep,
                        .ep = o->ep > 1 ? t->ep : NULL, .data = t->ranks > 1 ? t->world : NULL};
    mt_model_spec spec = mt_run_opts_model_spec(o);
    if (mt_model_build_par(&t->m, be, &cfg, o->model, &spec, &par) != 0) return -1;
    if (o->ep > 1 && t->rank == 0) {
        char where[1024];
        mt_model_placement(&t->m, where, sizeof where);
        mt_info("expert placement over %d EP ranks (%d DP groups): %s", o->ep, t->ranks / o->ep, where);
    }
    if (o->router_bias_update > 0 && mt_model_bias_balance_start(&t->m) != 0) return t->fail_code = MT_EXIT_USAGE, -1;
    if (o->aux_coef >= 0) t->m.aux_coef = (float)o->aux_coef;
    t->m.z_coef = (float)o->z_coef;
    if (o->seq_aux_coef >= 0) t->m.seq_aux_coef = (float)o->seq_aux_coef;
    if (t->m.seq_aux_coef != 0.0f && t->rank == 0)
        mt_info("seq-aux: DeepSeek's sequence-wise balance loss x %g in the training loss (%s; transformers applies "
                "none: --seq-aux-coef 0 to match it)", t->m.seq_aux_coef,
                o->seq_aux_coef >= 0 ? "--seq-aux-coef" : "config.json's aux_loss_alpha with seq_aux");
    // --adapter: the LoRAs start from a PEFT adapter (v4 or v5 layout; its alpha replaces --alpha);
    // a --resume checkpoint, restored later, still wins.
    if (o->adapter[0] && o->mode != MT_MODE_LORA) {
        mt_error_set("--adapter %s: a PEFT adapter starts a --mode lora run (this run is --mode %s)", o->adapter,
                     mt_mode_name(o->mode));
        return -1;
    }
    if (o->adapter[0] && check_adapter_rank(o) != 0) return t->fail_code = MT_EXIT_USAGE, -1;
    if (o->adapter[0] && mt_model_load_adapter(&t->m, o->adapter) != 0) return mt_error_prefix("--adapter"), -1;
    if (o->mode == MT_MODE_LORA) {  // before training, not at the end: an adapter PEFT would refuse
        mt_peft_format fmt;
        if (mt_peft_format_parse(o->peft_format, o->model, &fmt) != 0 ||
            mt_model_adapter_dropout_check(&t->m, fmt, t->rank == 0) != 0)
            return t->fail_code = MT_EXIT_USAGE, -1;
    }
    if (mt_tokenizer_open(&t->tok, o->model, cfg.vocab, (int32_t)cfg.bos_token_id, (int32_t)cfg.eos_token_id) != 0)
        return -1;
    mt_data_opts dopts;
    mt_data_opts_default(&dopts);
    dopts.seq = o->seq;
    dopts.max_line_bytes = (uint64_t)o->max_line_bytes;
    dopts.packing = o->packing;
    dopts.seed = o->seed;
    if (mt_overlong_parse(o->overlong, &dopts.overlong) != 0) return mt_error_prefix("--overlong"), -1;
    if (mt_prompt_style_parse(o->instruction_template, &dopts.prompt) != 0)
        return mt_error_prefix("--instruction-template"), -1;
    if (mt_chat_template_load(&dopts.chat, o->model, o->chat_template, t->tok.kind) != 0 ||
        mt_chat_date_set(&dopts.chat, o->chat_date) != 0)
        return -1;
    if (mt_dataset_load(&t->data, o->data, &t->tok, &dopts) != 0) return -1;
    char stats[512], notes[1024];
    mt_data_stats_format(&t->data.stats, stats, sizeof stats);
    mt_data_notes_format(&t->data.stats, &dopts, notes, sizeof notes);
    mt_info("data: %s%s%s", stats, notes[0] ? "; " : "", notes);
    if (o->eval_data[0]) {
        dopts.shuffle = 0, dopts.whole_epochs = 1;
        if (mt_dataset_load(&t->eval, o->eval_data, &t->tok, &dopts) != 0) return -1;
        t->have_eval = 1;
    }
    t->n_params = mt_model_params(&t->m, &t->params);
    if (t->n_params == 0 && t->ranks == 1) {  // with EP a rank may hold no trainable expert
        mt_error_set("nothing to train: check --mode, --targets, --layers and --experts");
        return -1;
    }
    // A checkpoint keeps the trainables and, under --router-bias-update, the biases it moves: a
    // resumed run starts from them, not from the base's.
    t->saved = mt_xcalloc((size_t)(t->n_params + t->m.cfg.layers), sizeof *t->saved);
    memcpy(t->saved, t->params, (size_t)t->n_params * sizeof *t->saved);
    t->n_saved = t->n_params;
    for (int L = 0; L < t->m.cfg.layers && o->router_bias_update > 0; L++) {
        char name[128];
        if (mt_model_score_bias_name(&t->m, L, name, sizeof name) != 0) continue;
        t->saved[t->n_saved++] = (mt_param){.name = mt_xstrdup(name), .w = t->m.layers[L].score_bias};
    }
    mt_dist_ranks dr = {.world = t->ranks > 1 ? t->world : NULL, .ep = o->ep > 1 ? t->ep : NULL,
                        .dp = t->ranks / o->ep > 1 ? t->dp : NULL, .world_rank = t->rank, .world_size = t->ranks,
                        .dp_rank = t->dp ? mt_comm_rank(t->dp) : 0, .dp_size = t->ranks / o->ep};
    if (mt_dist_init(&t->dist, be, t->params, t->n_params, &dr, o->zero) != 0) return -1;
    mt_adamw_opts aopts = mt_adamw_opts_default();
    aopts.lr = o->lr;
    aopts.weight_decay = o->weight_decay;
    aopts.adam_8bit = o->adam_8bit, aopts.master_weights = o->master_weights;
    aopts.offload = o->offload_optimizer;
    if (mt_adamw_init(&t->opt, be, t->dist.opt, t->dist.n_opt, &aopts) != 0) return -1;
    if (aopts.offload) mt_info("optimizer state in host memory: %.3f GB", mt_adamw_host_bytes(&t->opt) / 1e9);
    t->st.data_fingerprint = mt_dataset_fingerprint(&t->data);
    t->st.options = t->given;
    if (o->resume[0]) {
        if (mt_checkpoint_load(dir, t->saved, t->n_saved, t->dist.opt, t->dist.n_opt, &t->opt, &t->st, t->run_id,
                               t->world) != 0)
            return -1;
        if (t->st.data_fingerprint != mt_dataset_fingerprint(&t->data)) {
            mt_error_set("%s was trained on different data than --data %s", dir, o->data);
            return -1;
        }
        if (mt_train_state_check(&t->st, &t->data, total_steps(t), dir) != 0) return -1;
        mt_info("resumed from %s at step %lld", dir, (long long)t->st.step);
        if (o->early_stop_patience > 0) best_so_far(t);
    }
    if (mt_mkdir_p(o->out) != 0) return -1;
    char path[4200];
    snprintf(path, sizeof path, "%.1023s/metrics.jsonl", o->out);
    if (mt_metrics_open_ex(&t->metrics, t->rank == 0 ? path : NULL, o->resume[0] != 0) != 0) return -1;
    for (int i = 0; t->overrides && t->rank == 0 && i < t->overrides->n; i++) {
        char f[2400];
        snprintf(f, sizeof f, "\"step\":%lld,\"key\":\"%s\",\"change\":\"%.2000s\"", (long long)t->st.step,
                 t->overrides->kv[2 * i], t->overrides->kv[2 * i + 1]);
        mt_metrics_event(&t->metrics, "resume_override", f);
        mt_warn("--resume-override: --%s %s", t->overrides->kv[2 * i], t->overrides->kv[2 * i + 1]);
    }
    snprintf(path, sizeof path, "%.1023s/runs", o->out);  // --report-to tensorboard: OUT/runs, as HF's Trainer
    if (t->rank == 0 && strcmp(o->report_to, "tensorboard") == 0 && mt_metrics_tensorboard(&t->metrics, path) != 0)
        return -1;
    // Off a terminal, about 20 progress lines a run (the JSONL has every step).
    int64_t planned = total_steps(t);
    t->metrics.every = (int)MT_MAX(1, planned / 20);
    size_t n = (size_t)(o->batch * t->ranks * o->seq);  // the micro-batch of every rank
    t->tokens = mt_xcalloc(n, sizeof(int32_t)), t->labels = mt_xcalloc(n, sizeof(int32_t));
    t->mask = mt_xcalloc(n, sizeof(int32_t));
    t->load = mt_xcalloc((size_t)(cfg.layers * cfg.experts), sizeof(float));
    mt_info("train: %s, %d tensors, %llu trainable params%s", mt_mode_name(o->mode), t->n_params,
            (unsigned long long)mt_params_count(t->params, t->n_params), t->ranks > 1 ? " on this rank" : "");
    if (t->ranks > 1 && t->rank == 0)
        mt_info("%d ranks: EP %d x DP %d, %lld sequences per micro-batch (%lld per rank)%s", t->ranks, o->ep,
                t->ranks / o->ep, (long long)(o->batch * t->ranks), (long long)o->batch,
                o->zero ? ", ZeRO-1" : "");
    return 0;
}

static void teardown(trainer *t) {
    mt_metrics_close(&t->metrics);
    mt_adamw_free(&t->opt);
    mt_dist_free(&t->dist);
    for (int i = t->n_params; i < t->n_saved; i++) free((char *)t->saved[i].name);
    free(t->saved);
    mt_params_free(t->params, t->n_params);
    mt_model_free(&t->m);
    mt_dataset_free(&t->data);
    if (t->have_eval) mt_dataset_free(&t->eval);
    mt_tokenizer_free(&t->tok);
    free(t->tokens), free(t->labels), free(t->mask), free(t->load);
}

// The communicators (the world last), then the backend their NCCL streams belong to.
static void end_ranks(trainer *t) {
    mt_comm_free(t->ep), mt_comm_free(t->dp), mt_comm_free(t->world);
    mt_backend_free(t->be);
}

static int run(trainer *t) {
    mt_run_opts *o = t->o;
    mt_schedule sched;
    if (mt_schedule_parse(o->schedule, &sched) != 0) return mt_error_prefix("--schedule"), -1;
    int64_t total = total_steps(t);
    int B = (int)o->batch, S = (int)o->seq, in_a_row = 0;
    double t_start = now_s();
    int64_t first = t->st.step;
    signal(SIGINT, on_signal);
    signal(SIGTERM, on_signal);
    int64_t rows = (int64_t)B * S, mine = (int64_t)t->rank * rows;  // this rank's slice
    int stop = 0;  // a signal on any rank stops every rank at the same step
    int early = 0;  // --early-stop-patience ran out
    while (t->st.step < total && !(stop = t->world ? mt_comm_any(t->world, stop_requested != 0) : stop_requested != 0)) {
        mt_threads_adapt();  // the cores others leave free (core/threads.h); the same bits at any count
        double t0 = now_s(), loss = 0, ce = 0, aux = 0, z = 0, seq_aux = 0;
        int64_t tokens = 0;
        uint64_t syncs0 = t->m.be->host_syncs;
        mt_model_zero_grad(&t->m);
        t->st.eval_loss = NAN;  // set again when this step evaluates
        for (int micro = 0; micro < o->accum; micro++) {
            mt_data_next_batch(&t->data, &t->st.cursor, B * t->ranks, S, t->tokens, t->labels, t->mask);
            mt_batch b = {B, S, t->tokens + mine, t->labels + mine, t->mask + mine};
            mt_loss l;
            // Each rank draws its own masks (docs/design.md, "Parallelism: EP, DP, ZeRO"); rank 0's are those of a single process.
            mt_model_set_dropout_seed(&t->m, o->seed + (uint64_t)t->rank * 0x9e3779b97f4a7c15ull, t->st.step, micro);
            if (mt_model_forward_train(&t->m, &b, &l) != 0) return -1;
            mt_model_backward(&t->m);
            loss += l.loss / o->accum, ce += l.ce / o->accum, aux += l.aux / o->accum, z += l.z / o->accum;
            seq_aux += l.seq_aux / o->accum;
            for (int64_t i = 0; i < rows * t->ranks; i++) tokens += t->mask[i] != 0;
        }
        if (o->accum > 1) mt_params_scale_grads(t->params, t->n_params, 1.0f / (float)o->accum);
        mt_dist_reduce_grads(&t->dist);
        double lr = mt_lr_at(t->st.step, total, o->warmup, o->lr, sched), gnorm = mt_dist_grad_norm(&t->dist);
        // loss and norm are the same on every rank: every rank skips the same steps
        int skipped = !isfinite(loss);
        if (!skipped) {
            int rc = mt_adamw_step_norm(&t->opt, t->dist.opt, t->dist.n_opt, lr, o->clip, gnorm);
            if (rc < 0) return -1;  // an error, not a non-finite step: its message stands
            skipped = rc == 1;
        }
        if (!skipped) mt_dist_share_weights(&t->dist);
        if (skipped) {
            t->st.skips++;
            if (++in_a_row > o->max_skips) {
                mt_error_set("%d non-finite steps in a row (the last at step %lld): stopping; the last checkpoint "
                             "in %s is intact", in_a_row, (long long)t->st.step, o->out);
                return -1;
            }
        } else {
            in_a_row = 0;
        }
        t->st.step++;
        if (o->router_bias_update > 0) balance_router(t);
        expert_load(t);
        double dt = now_s() - t0, per_step = (now_s() - t_start) / (double)(t->st.step - first);
        mt_step_record r = {.step = t->st.step, .total = total, .loss = loss, .ce = ce, .aux = aux, .z = z,
                            .seq_aux = seq_aux, .has_seq_aux = t->m.seq_aux_coef != 0.0f, .lr = lr, .grad_norm = gnorm, .tokens_per_s = dt > 0 ? tokens / dt : 0,
                            .eta_s = per_step * (double)(total - t->st.step),
                            .peak_bytes = t->m.be->ledger.total_peak, .skipped = skipped,
                            .host_syncs = t->m.be->host_syncs - syncs0,
                            .layers = (int)t->m.cfg.layers, .experts = (int)t->m.cfg.experts,
                            .expert_load = t->load};
        if (t->rank == 0) mt_metrics_step(&t->metrics, &r);
        if (t->have_eval && o->eval_every > 0 && t->st.step % o->eval_every == 0) {
            int64_t n;
            double el = evaluate(t, &n);
            t->st.eval_loss = el;
            char f[160];
            snprintf(f, sizeof f, "\"step\":%lld,\"loss\":%.9g,\"ppl\":%.9g,\"tokens\":%lld", (long long)t->st.step,
                     el, exp(el), (long long)n);
            if (t->rank == 0) mt_metrics_event(&t->metrics, "eval", f);
            // Early stopping: each new best is saved (retention keeps it); patience counts evals.
            if (o->early_stop_patience > 0 && el == el) {
                if (t->best_step == 0 || el < t->best_eval) {
                    t->best_eval = el, t->best_step = t->st.step, t->evals_since_best = 0;
                    if (t->st.step < total && save(t) != 0) return -1;
                } else if (++t->evals_since_best >= o->early_stop_patience) {
                    early = 1;
                }
            }
        }
        if (o->save_every > 0 && t->st.step % o->save_every == 0 && t->st.step < total &&
            !(t->best_step == t->st.step && t->st.step > 0) && save(t) != 0)
            return -1;
        if (early) break;
    }
    if (save(t) != 0) return -1;
    if (early) {
        char best[4200], f[200];
        snprintf(best, sizeof best, "%s/checkpoint-%lld", o->out, (long long)t->best_step);
        mt_info("early stop at step %lld: no lower eval loss in %lld evaluations; the best, %.6g at step %lld, is "
                "what is written (%s)", (long long)t->st.step, (long long)o->early_stop_patience, t->best_eval,
                (long long)t->best_step, best);
        snprintf(f, sizeof f, "\"step\":%lld,\"best_step\":%lld,\"best_loss\":%.9g", (long long)t->st.step,
                 (long long)t->best_step, t->best_eval);
        if (t->rank == 0) mt_metrics_event(&t->metrics, "early_stop", f);
        if (mt_checkpoint_load(best, t->saved, t->n_saved, t->dist.opt, t->dist.n_opt, &t->opt, &t->st, t->run_id,
                               t->world) != 0)
            return -1;
    }
    if (stop) {
        mt_info("stopped by signal %d at step %lld; checkpoint saved: resume with --resume %s", (int)stop_requested,
                (long long)t->st.step, o->out);
        // as shells report a death by signal: 130 for SIGINT, 143 for SIGTERM (a rank stopped
        // because another was signalled: 130)
        t->exit_code = 128 + (stop_requested ? (int)stop_requested : SIGINT);
        return 0;
    }
    if (t->have_eval) {
        int64_t n;
        double el = evaluate(t, &n);
        char f[160];
        snprintf(f, sizeof f, "\"step\":%lld,\"loss\":%.9g,\"ppl\":%.9g,\"tokens\":%lld", (long long)t->st.step, el,
                 exp(el), (long long)n);
        if (t->rank == 0) mt_metrics_event(&t->metrics, "eval", f);
    }
    return write_outputs(t);
}

// --resume OUT: the run's settings from its checkpoint's state.json, then what is given beside
// --resume: a flag that changes what the run computes is refused naming it (exit 2) unless
// --resume-override, when each change is listed in `overrides` (logged in metrics.jsonl).
// `given` becomes the stored settings plus the new ones. A checkpoint of an earlier moetrain
// (no stored settings) leaves everything as given. Returns an exit code.
static int resume_settings(mt_run_opts *o, mt_opt_pairs *given, mt_opt_pairs *overrides) {
    char dir[4096];
    if (mt_checkpoint_find(o->resume, dir) != 0) {
        if (o->model[0] && o->data[0]) return MT_EXIT_OK;  // setup says there is none
        mt_error_set("--resume %s: no checkpoint there to take the run's settings from: start the run with --model "
                     "and --data (and --overwrite when the folder holds a run stopped before its first save)",
                     o->resume);
        return MT_EXIT_ERROR;
    }
    mt_opt_pairs stored = {0};
    int rc = mt_ckpt_state_options(dir, &stored);
    // A damaged latest: the settings of the checkpoint setup will fall back to (it says which).
    if (rc < 0 && mt_checkpoint_find_verified(o->resume, dir) == 0) rc = mt_ckpt_state_options(dir, &stored);
    if (rc != 0) {
        mt_opt_pairs_free(&stored);
        return rc > 0 ? MT_EXIT_OK : MT_EXIT_ERROR;
    }
    mt_run_opts *was = mt_xmalloc(sizeof *was), *now = mt_xmalloc(sizeof *now);
    mt_run_opts_default(was);
    int code = MT_EXIT_OK;
    for (int i = 0; i < stored.n && code == MT_EXIT_OK; i++)
        if (mt_run_opts_set(was, stored.kv[2 * i], stored.kv[2 * i + 1]) != 0) {
            mt_error_prefix("%s/state.json", dir);
            code = MT_EXIT_ERROR;
        }
    memcpy(now, was, sizeof *now);
    for (int i = 0; i < given->n && code == MT_EXIT_OK; i++) {
        const char *key = given->kv[2 * i], *value = given->kv[2 * i + 1];
        int last = 1;  // a key given twice (a --config file's, then a flag): the last one counts
        for (int j = i + 1; j < given->n && last; j++) last = strcmp(given->kv[2 * j], key) != 0;
        if (last && mt_opt_changes_run(key) && mt_run_opts_differs(was, key, value) == 1) {
            const char *before = mt_opt_pairs_get(&stored, key);
            char change[2100];
            snprintf(change, sizeof change, "%.1000s -> %.1000s", before ? before : "(default)", value);
            if (!o->resume_override) {
                mt_error_set("--%s %s changes the run being resumed (it was %s, %s/state.json): leave it out to "
                             "continue the run as it was, or add --resume-override to change it (logged in "
                             "metrics.jsonl)", key, value, before ? before : "the default", dir);
                code = MT_EXIT_USAGE;
                break;
            }
            mt_opt_pairs_add(overrides, key, change);
        }
        if (mt_run_opts_set(now, key, value) != 0) code = MT_EXIT_USAGE;
    }
    if (code == MT_EXIT_OK) {
        // the resume flags themselves stay as given
        memcpy(now->resume, o->resume, sizeof o->resume);
        now->resume_override = o->resume_override, now->overwrite = o->overwrite;
        memcpy(o, now, sizeof *o);
        for (int i = 0; i < given->n; i++) mt_opt_pairs_add(&stored, given->kv[2 * i], given->kv[2 * i + 1]);
        mt_opt_pairs_free(given);
        *given = stored;
        mt_info("resuming %s with the settings it was started with%s", dir,
                overrides->n ? " and the overrides below" : "");
    } else {
        mt_opt_pairs_free(&stored);
    }
    free(was), free(now);
    return code;
}

int cmd_train(int argc, char **argv) {
    if (mt_args_want_help(argc, argv)) {
        printf("usage: moetrain [train] --model DIR --data FILE [--mode lora|router|unfreeze|full] [FLAGS]\n"
               "       moetrain [train] --resume OUT     (continue a stopped run with its own settings)\n\n");
        mt_run_opts_print_help(stdout);
        printf("\n");
        mt_exit_codes_print(stdout);
        return MT_EXIT_OK;
    }
    mt_run_opts o;
    mt_run_opts_default(&o);
    mt_opt_pairs given = {0}, overrides = {0};
    if (mt_run_opts_parse_cmd(&o, argc, argv, "train", &given) != 0) {
        fprintf(stderr, "moetrain train: %s\n", mt_error_get());
        mt_opt_pairs_free(&given);
        return MT_EXIT_USAGE;
    }
    int rc = o.resume[0] ? resume_settings(&o, &given, &overrides) : MT_EXIT_OK;
    if (rc != MT_EXIT_OK) {
        fprintf(stderr, "moetrain train: %s\n", mt_error_get());
        mt_opt_pairs_free(&given), mt_opt_pairs_free(&overrides);
        return rc;
    }
    trainer t;
    memset(&t, 0, sizeof t);
    t.o = &o;
    t.given = &given, t.overrides = &overrides;
    rc = setup(&t) == 0 && run(&t) == 0 ? MT_EXIT_OK : t.fail_code ? t.fail_code : MT_EXIT_ERROR;
    if (rc != MT_EXIT_OK) {
        if (t.ranks > 1) fprintf(stderr, "moetrain train: [rank %d/%d] %s\n", t.rank, t.ranks, mt_error_get());
        else fprintf(stderr, "moetrain train: %s\n", mt_error_get());
    } else if (t.exit_code) {
        rc = t.exit_code;
    }
    if (t.m.be) teardown(&t);
    end_ranks(&t);
    mt_opt_pairs_free(&given), mt_opt_pairs_free(&overrides);
    return rc;
}
