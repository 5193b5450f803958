// trainer/train.c — `moetrain [train]`: the training loop.
//
// plan → load → (resume) → for each step: accumulate micro-batches (forward, backward), clip,
// AdamW, log; checkpoints every --save-every and at the end; SIGINT/SIGTERM save and stop.
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

static int print_plan(const mt_model_config *cfg, const mt_run_opts *o, const char *recompute) {
    mt_plan plan;
    mt_plan_opts po = mt_run_opts_plan(o);
    if (mt_plan_compute(cfg, &po, &plan) != 0) return -1;
    mt_plan_report rep = {.model_name = o->model, .cfg = cfg, .opts = &po, .plan = &plan, .recompute = recompute};
    if (o->verbose) mt_plan_print(stdout, &rep);
    else {  // one line: the total, the fit and the three largest categories (--verbose or `plan`: all)
        int top[3] = {-1, -1, -1};
        for (int c = 0; c < MT_MEM_COUNT; c++)
            for (int k = 0; k < 3; k++)
                if (top[k] < 0 || plan.bytes[c] > plan.bytes[top[k]]) {
                    for (int j = 2; j > k; j--) top[j] = top[j - 1];
                    top[k] = c;
                    break;
                }
        printf("plan: %.2f GB per GPU of %.0f GB (%.0f%%), %s; largest:", plan.total / 1e9, plan.gpu_mem / 1e9,
               plan.percent, plan.fits ? "fits" : "DOES NOT FIT");
        for (int k = 0; k < 3; k++)
            if (plan.bytes[top[k]]) printf("%s %s %.3g GB", k ? "," : "", mt_mem_cat_name((mt_mem_cat)top[k]), plan.bytes[top[k]] / 1e9);
        printf("; recompute: %s (full table: --verbose or `moetrain plan`)\n", recompute);
    }
    if (o->mem_bytes > 0 && (double)plan.total > o->mem_bytes) {
        mt_error_set("the plan needs %.2f GB but --mem allows %.2f GB; see `moetrain plan` for what would fit",
                     plan.total / 1e9, o->mem_bytes / 1e9);
        return -1;
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
    mt_adamw opt;
    mt_metrics metrics;
    mt_train_state st;
    char run_id[1024];
    int32_t *tokens, *labels, *mask;
    float *load;  // [layers × experts] expert load of the last step
    int exit_code;  // 0, or 128 + the signal that stopped the run after its checkpoint was saved
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

static int save(trainer *t) {
    if (mt_checkpoint_save(t->o->out, t->params, t->n_params, t->dist.opt, t->dist.n_opt, &t->opt, &t->st,
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
    if (t->o->mode == MT_MODE_LORA) {
        snprintf(path, sizeof path, "%s/adapter", t->o->out);
        // moetrain_base.json: the base's quantization, which `moetrain merge` defaults to
        static const char *const files[] = {"adapter_config.json", "adapter_model.safetensors", MT_BASE_RECORD};
        char list[4300];
        snprintf(list, sizeof list, "%s/SHA256SUMS", path);
        mt_peft_format fmt;
        if (mt_peft_format_parse(t->o->peft_format, t->o->model, &fmt) != 0) return -1;
        if (mt_model_save_adapter_as(&t->m, path, t->o->model, fmt) != 0 ||
            mt_base_record_write(path, &t->m.cfg, t->o) != 0 || mt_sha256sums_write(list, path, files, 3) != 0)
            return -1;
    } else {
        static const char *const files[] = {"trained.safetensors"};
        char list[4300];
        snprintf(path, sizeof path, "%s/trained.safetensors", t->o->out);
        snprintf(list, sizeof list, "%s.sha256", path);
        if (mt_model_save_trained(&t->m, path) != 0 || mt_sha256sums_write(list, t->o->out, files, 1) != 0 ||
            mt_base_record_write(t->o->out, &t->m.cfg, t->o) != 0)
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

static int setup(trainer *t) {
    mt_run_opts *o = t->o;
    if (!o->model[0] || !o->data[0]) {
        mt_error_set("--model and --data are required (see moetrain train --help)");
        return -1;
    }
    if (strcmp(o->backend, "cpu") != 0 && strcmp(o->backend, "cuda") != 0) {
        mt_error_set("--device %s: training runs on cpu or cuda", o->backend);
        return -1;
    }
    // Before MPI starts: the node-local rank picks the GPU.
    t->be = strcmp(o->backend, "cuda") == 0 ? mt_backend_cuda_new(mt_comm_local_rank()) : mt_backend_cpu_new();
    if (!t->be) return -1;
    if (start_ranks(t) != 0) return -1;
    if (!o->out[0]) snprintf(o->out, sizeof o->out, "moetrain-out");
    if (o->accum < 1 || o->batch < 1 || o->seq < 2) {
        mt_error_set("--accum and --batch must be at least 1 and --seq at least 2");
        return -1;
    }
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
    run_id(o, &cfg, t->run_id, sizeof t->run_id);
    if (t->world && mt_comm_check_same(t->world, "run options", mt_hash_string(t->run_id)) != 0) return -1;
    if (t->rank == 0) mt_note_quant_on_load(&cfg, o, "train");
    // --recompute auto: the least recomputation that fits this device, the same on every rank.
    char recompute[256];
    if (mt_run_opts_resolve_recompute(o, &cfg, strcmp(o->backend, "cpu") != 0, recompute, sizeof recompute) != 0)
        return -1;
    if (t->world && mt_comm_check_same(t->world, "--recompute's choice", (uint64_t)o->checkpointing) != 0) return -1;
    if (t->rank == 0 && print_plan(&cfg, o, recompute) != 0) return -1;
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
    if (o->aux_coef >= 0) t->m.aux_coef = (float)o->aux_coef;
    t->m.z_coef = (float)o->z_coef;
    // --adapter: the LoRAs start from a PEFT adapter (v4 or v5 layout; its alpha replaces --alpha);
    // a --resume checkpoint, restored later, still wins.
    if (o->adapter[0] && o->mode != MT_MODE_LORA) {
        mt_error_set("--adapter %s: a PEFT adapter starts a --mode lora run (this run is --mode %s)", o->adapter,
                     mt_mode_name(o->mode));
        return -1;
    }
    if (o->adapter[0] && mt_model_load_adapter(&t->m, o->adapter) != 0) return mt_error_prefix("--adapter"), -1;
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
    if (mt_chat_template_load(&dopts.chat, o->model, o->chat_template, t->tok.kind) != 0) return -1;
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
    if (o->resume[0]) {
        if (mt_checkpoint_load(dir, t->params, t->n_params, t->dist.opt, t->dist.n_opt, &t->opt, &t->st, t->run_id,
                               t->world) != 0)
            return -1;
        if (t->st.data_fingerprint != mt_dataset_fingerprint(&t->data)) {
            mt_error_set("%s was trained on different data than --data %s", dir, o->data);
            return -1;
        }
        if (mt_train_state_check(&t->st, &t->data, total_steps(t), dir) != 0) return -1;
        mt_info("resumed from %s at step %lld", dir, (long long)t->st.step);
    }
    if (mt_mkdir_p(o->out) != 0) return -1;
    char path[4200];
    snprintf(path, sizeof path, "%.1023s/metrics.jsonl", o->out);
    if (mt_metrics_open_ex(&t->metrics, t->rank == 0 ? path : NULL, o->resume[0] != 0) != 0) return -1;
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
    while (t->st.step < total && !(stop = t->world ? mt_comm_any(t->world, stop_requested != 0) : stop_requested != 0)) {
        mt_threads_adapt();  // the cores others leave free (core/threads.h); the same bits at any count
        double t0 = now_s(), loss = 0, ce = 0, aux = 0, z = 0;
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
        expert_load(t);
        double dt = now_s() - t0, per_step = (now_s() - t_start) / (double)(t->st.step - first);
        mt_step_record r = {.step = t->st.step, .total = total, .loss = loss, .ce = ce, .aux = aux, .z = z,
                            .lr = lr, .grad_norm = gnorm, .tokens_per_s = dt > 0 ? tokens / dt : 0,
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
        }
        if (o->save_every > 0 && t->st.step % o->save_every == 0 && t->st.step < total && save(t) != 0) return -1;
    }
    if (save(t) != 0) return -1;
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

int cmd_train(int argc, char **argv) {
    if (mt_args_want_help(argc, argv)) {
        printf("usage: moetrain [train] --model DIR --data FILE [--mode lora|router|unfreeze|full] [FLAGS]\n\n");
        mt_run_opts_print_help(stdout);
        printf("\nexit codes: 0 done; 1 error (message on stderr); 2 bad flag or value; 3 the plan does not fit;\n"
               "  4 out of memory; 130 stopped by SIGINT, 143 by SIGTERM (after saving a checkpoint: resume\n"
               "  with --resume OUT)\n");
        return MT_EXIT_OK;
    }
    mt_run_opts o;
    mt_run_opts_default(&o);
    if (mt_run_opts_parse(&o, argc, argv) != 0) {
        fprintf(stderr, "moetrain train: %s\n", mt_error_get());
        return MT_EXIT_USAGE;
    }
    trainer t;
    memset(&t, 0, sizeof t);
    t.o = &o;
    int rc = setup(&t) == 0 && run(&t) == 0 ? MT_EXIT_OK : MT_EXIT_ERROR;
    if (rc != MT_EXIT_OK) fprintf(stderr, "moetrain train: %s\n", mt_error_get());
    else if (t.exit_code) rc = t.exit_code;
    if (t.m.be) teardown(&t);
    end_ranks(&t);
    return rc;
}
