// trainer/cmd/cmd_eval.c — `moetrain eval`: loss and perplexity of a model, with or without an
// adapter, on a data file; and the model builder that eval, generate and merge share.
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>

#include "core/common.h"
#include "core/safetensors.h"
#include "core/threads.h"
#include "lora/peft.h"
#include "trainer/cmd/commands.h"

static void eval_usage(FILE *out) {
    fprintf(out,
            "usage: moetrain eval --model DIR --data FILE [--adapter DIR|FILE.safetensors]\n"
            "                     [--seq N] [--batch N] [--quant nf4|fp4|int4|none] [--packing]\n\n"
            "Prints loss=<mean cross-entropy over the loss tokens> and perplexity=exp(loss), in one\n"
            "pass over FILE (JSONL or a token file) in file order, and aux=<the router load-balancing loss>\n"
            "(transformers' load_balancing_loss_func per batch, averaged over batches; not in loss).\n"
            "--adapter: a PEFT adapter folder, or a trained-tensor .safetensors (router, unfreeze or\n"
            "full mode). The frozen base is built as training builds it (--quant, default nf4).\n"
            "--save-tokens FILE: also write the samples as read (tokenized, chat templates applied,\n"
            "loss-masked) as a token file, e.g. for scripts/check_peft.py --data FILE.\n"
            "--max-line-bytes N: a JSONL line keeping more than N bytes is refused naming the line (its\n"
            "strings are kept only to what --seq can use; default 64MiB). Exit 4: out of host memory.\n");
}

// ---------------------------------------------------------------------------------------------
// The model with its adapter

static void set_from_bitmap(mt_index_set *s, const unsigned char *member) {
    memset(s, 0, sizeof *s);
    for (int i = 0; i < MT_MAX_INDEX; i++)
        if (member[i]) s->items[s->count++] = (uint16_t)i;
}

typedef struct {
    unsigned targets;
    unsigned char layers[MT_MAX_INDEX], experts[MT_MAX_INDEX];
    int any_expert;
    int full;  // trained file: embeddings, norms or lm_head
    const mt_family *fam;  // the model's module names (model/family.h)
} span;

// Records where a module path lies: its layer, expert and target bit. -1 for a path that is not
// a decoder Linear (the caller decides whether that is an error).
static int span_add(span *s, const char *module) {
    char router[96];
    snprintf(router, sizeof router, "%s.%s", s->fam->moe_module, s->fam->router);
    const struct { const char *leaf; unsigned bit; } leaves[] = {
        {"self_attn.q_proj", MT_TARGET_Q}, {"self_attn.k_proj", MT_TARGET_K}, {"self_attn.v_proj", MT_TARGET_V},
        {"self_attn.o_proj", MT_TARGET_O}, {router, MT_TARGET_GATE},
        // MLA (DeepSeek-V2/V3): q covers q_a/q_b, k the latent kv_a, v kv_b (docs/families.md)
        {"self_attn.q_a_proj", MT_TARGET_Q}, {"self_attn.q_b_proj", MT_TARGET_Q},
        {"self_attn.kv_a_proj_with_mqa", MT_TARGET_K}, {"self_attn.kv_b_proj", MT_TARGET_V},
    };
    int L, e, n = 0, used = 0;
    char rest[128], experts[96];
    if (sscanf(module, "model.layers.%d.%127s%n", &L, rest, &n) != 2 || L < 0 || L >= MT_MAX_INDEX) return -1;
    for (size_t i = 0; i < MT_ARRAY_LEN(leaves); i++)
        if (strcmp(rest, leaves[i].leaf) == 0) {
            s->targets |= leaves[i].bit, s->layers[L] = 1;
            return 0;
        }
    for (int i = 0; i < 3; i++) {  // a dense layer's MLP, or the shared expert: the experts' targets
        char dense[96], shared[96];
        snprintf(dense, sizeof dense, "%s.%s", s->fam->moe_module, s->fam->mlp[i]);
        snprintf(shared, sizeof shared, "%s.%s.%s", s->fam->moe_module,
                 s->fam->shared_expert ? s->fam->shared_expert : "-", s->fam->mlp[i]);
        if (strcmp(rest, dense) == 0 || strcmp(rest, shared) == 0) {
            s->targets |= i == 0 ? MT_TARGET_W1 : i == 1 ? MT_TARGET_W2 : MT_TARGET_W3, s->layers[L] = 1;
            return 0;
        }
    }
    char which[24];
    snprintf(experts, sizeof experts, "%s.experts.%%d.%%n", s->fam->moe_module);
    if (sscanf(rest, experts, &e, &used) == 1 && used > 0 && e >= 0 && e < MT_MAX_INDEX &&
        snprintf(which, sizeof which, "%s", rest + used) < (int)sizeof which) {
        // the family's gate, down and up projections are moetrain's w1, w2, w3
        unsigned bit = strcmp(which, s->fam->expert[0]) == 0 ? MT_TARGET_W1
                     : strcmp(which, s->fam->expert[1]) == 0 ? MT_TARGET_W2
                     : strcmp(which, s->fam->expert[2]) == 0 ? MT_TARGET_W3 : 0;
        if (!bit) return -1;
        s->targets |= bit, s->layers[L] = 1, s->experts[e] = 1, s->any_expert = 1;
        return 0;
    }
    return -1;
}

static int span_pair(void *ctx, const char *module, const mt_st_tensor *a, const mt_st_tensor *b) {
    (void)a, (void)b;
    char renamed[300];
    module = mt_family_module_name(((span *)ctx)->fam, module, renamed, sizeof renamed);
    if (span_add(ctx, module) != 0) {
        const mt_family *f = ((span *)ctx)->fam;
        mt_error_set("adapter module '%s' is not a LoRA target moetrain trains for %s (q/k/v/o_proj, %s.%s, "
                     "experts' %s/%s/%s)", module, f->model_type, f->moe_module, f->router, f->expert[0],
                     f->expert[1], f->expert[2]);
        return -1;
    }
    return 0;
}

static int is_file(const char *path) {
    struct stat st;
    return stat(path, &st) == 0 && S_ISREG(st.st_mode);
}

// A trained-tensor file: the mode and span its tensor names imply.
static int span_of_trained(const char *path, span *s) {
    mt_st_file f;
    if (mt_st_file_open(&f, path) != 0) return -1;
    int rc = 0;
    for (size_t i = 0; i < f.n_tensors && rc == 0; i++) {
        const char *name = f.tensors[i].name;
        char module[256];
        size_t len = strlen(name);
        if (strcmp(name, "model.embed_tokens.weight") == 0 || strcmp(name, "model.norm.weight") == 0 ||
            strcmp(name, "lm_head.weight") == 0 || strstr(name, "layernorm.weight") || strstr(name, "_norm.weight")) {
            s->full = 1;
            continue;
        }
        // gpt-oss's router bias trains with the router (router, unfreeze modes); any other bias, the
        // experts' fused biases and the attention sinks only in full mode
        int router_bias = 0;
        if (len > 5 && strcmp(name + len - 5, ".bias") == 0 && len - 5 < sizeof module) {
            memcpy(module, name, len - 5);
            module[len - 5] = 0;
            size_t mlen = strlen(module), rlen = strlen(s->fam->router);
            router_bias = mlen > rlen && module[mlen - rlen - 1] == '.' && strcmp(module + mlen - rlen, s->fam->router) == 0;
            if (router_bias) {
                if (span_add(s, module) != 0) rc = -1, mt_error_set("%s: tensor '%s' is not a router's bias", path, name);
                continue;
            }
        }
        if ((len > 5 && strcmp(name + len - 5, ".bias") == 0) || (len > 5 && strcmp(name + len - 5, "_bias") == 0) ||
            (len > 6 && strcmp(name + len - 6, ".sinks") == 0)) {
            s->full = 1;
            continue;
        }
        if (len < 8 || len - 7 >= sizeof module || strcmp(name + len - 7, ".weight") != 0) {
            mt_error_set("%s: tensor '%s' is not a checkpoint weight", path, name);
            rc = -1;
            break;
        }
        memcpy(module, name, len - 7);
        module[len - 7] = 0;
        if (span_add(s, module) != 0) {
            mt_error_set("%s: tensor '%s' is not a checkpoint weight of a decoder layer", path, name);
            rc = -1;
        }
    }
    mt_st_file_close(&f);
    return rc;
}

static void lora_dropout_off(mt_model *m) {
    for (int L = 0; L < m->cfg.layers; L++) {
        mt_layer *ly = &m->layers[L];
        mt_linear *ls[] = {&ly->q, &ly->k, &ly->v, &ly->o, &ly->gate, &ly->mlp[0], &ly->mlp[1], &ly->mlp[2]};
        for (int i = 0; i < 8; i++)
            if (ls[i]->lora) ls[i]->lora->dropout = 0.0f;
        for (int e = 0; e < m->cfg.experts; e++) {
            mt_linear *ex[] = {&ly->w1[e], &ly->w2[e], &ly->w3[e]};
            for (int i = 0; i < 3; i++)
                if (ex[i]->lora) ex[i]->lora->dropout = 0.0f;
        }
    }
}

// mt_model_load of the model the run options describe.
static int load_as(mt_model *m, mt_backend *be, const mt_run_opts *o) {
    mt_model_spec spec = mt_run_opts_model_spec(o);
    return mt_model_load(m, be, o->model, &spec);
}

int mt_model_load_for_inference(mt_model *m, mt_backend *be, mt_run_opts *o) {
    memset(m, 0, sizeof *m);
    if (!o->adapter[0]) {
        // No adapter: nothing trains, so the mode only decides what is 4-bit (as training's base).
        o->mode = MT_MODE_LORA;
        o->targets = 0;
        o->layers.all = 0, o->layers.count = 0;
        return load_as(m, be, o);
    }
    span s;
    memset(&s, 0, sizeof s);
    mt_model_config cfg;
    if (mt_model_config_load(o->model, &cfg) != 0) return -1;
    s.fam = mt_config_family(&cfg);
    if (is_file(o->adapter)) {
        if (span_of_trained(o->adapter, &s) != 0) return -1;
        if (s.full) {
            o->mode = MT_MODE_FULL;
            o->quant = MT_QUANT_NONE;
            o->layers.all = o->experts.all = 1;
        } else {
            o->mode = s.any_expert ? MT_MODE_UNFREEZE : MT_MODE_ROUTER;
            set_from_bitmap(&o->layers, s.layers);
            if (s.any_expert) set_from_bitmap(&o->experts, s.experts);
        }
        if (load_as(m, be, o) != 0) return -1;
        if (mt_model_load_trained(m, o->adapter) != 0) {
            mt_model_free(m);
            return -1;
        }
        return 0;
    }
    // A training run's output folder given for its product: name the file or folder to pass.
    char probe[4200];
    snprintf(probe, sizeof probe, "%s/adapter_config.json", o->adapter);
    if (!is_file(probe)) {
        snprintf(probe, sizeof probe, "%s/trained.safetensors", o->adapter);
        int trained = is_file(probe);
        snprintf(probe, sizeof probe, "%s/adapter/adapter_config.json", o->adapter);
        if (trained || is_file(probe)) {
            mt_error_set("--adapter %s is a training run's output folder: pass %s/%s (what its --mode %s run wrote)",
                         o->adapter, o->adapter, trained ? "trained.safetensors" : "adapter",
                         trained ? "router, unfreeze or full" : "lora");
            return -1;
        }
    }
    mt_peft_config pc;
    mt_peft_layout lay = {.gate_up_interleaved = s.fam->fused_experts};
    if (mt_peft_read_as(o->adapter, &lay, &pc, span_pair, &s) != 0) return -1;
    o->mode = MT_MODE_LORA;
    o->lora_r = pc.r;
    o->lora_alpha = pc.lora_alpha;
    o->use_rslora = pc.use_rslora;
    o->lora_dropout = 0;
    o->targets = s.targets;
    set_from_bitmap(&o->layers, s.layers);
    if (s.any_expert) set_from_bitmap(&o->experts, s.experts);
    if (load_as(m, be, o) != 0) return -1;
    if (mt_model_load_adapter(m, o->adapter) != 0) {
        mt_model_free(m);
        return -1;
    }
    lora_dropout_off(m);  // the adapter's dropout is a training setting
    return 0;
}

// ---------------------------------------------------------------------------------------------
// Evaluation

void mt_note_quant_on_load(const mt_model_config *cfg, const mt_run_opts *o, const char *cmd) {
    if (o->quant == MT_QUANT_NONE || cfg->quantized || o->quant_targets == 0 || o->mode == MT_MODE_FULL) return;
    if (cfg->fp8_block[0]) {
        fprintf(stderr, "%s: the block-FP8 checkpoint is dequantized and quantized to %s on load (--quant-targets); "
                "--quant none dequantizes it to %s\n", cmd, mt_quant_name(o->quant), mt_dtype_name(cfg->torch_dtype));
        return;
    }
    fprintf(stderr, "%s: the dense %s checkpoint is quantized to %s on load (--quant-targets); --quant none keeps it %s\n",
            cmd, mt_dtype_name(cfg->torch_dtype), mt_quant_name(o->quant), mt_dtype_name(cfg->torch_dtype));
}

int mt_eval_dataset(mt_model *m, mt_dataset *d, int B, int S, mt_eval_result *r) {
    memset(r, 0, sizeof *r);
    // Several ranks (a parallel training run): each reads the same batches of B·ranks rows and
    // evaluates its own B of them; the model sums the loss over ranks, so every rank gets the
    // whole batch's figures. A rank left without rows by a short last batch still takes part
    // (the EP all-to-alls and the sums are collective) with one padded row outside the loss.
    int rank = m->par.data ? mt_comm_rank(m->par.data) : 0, ranks = m->par.data ? mt_comm_size(m->par.data) : 1;
    size_t cells = (size_t)B * (size_t)ranks * (size_t)S;
    int32_t *tokens = mt_xmalloc(cells * sizeof(int32_t)), *labels = mt_xmalloc(cells * sizeof(int32_t));
    int32_t *mask = mt_xmalloc(cells * sizeof(int32_t));
    mt_data_cursor c = {0, 0};
    double ce_sum = 0, aux_sum = 0;
    int rc = 0;
    while (c.epoch == 0) {
        int64_t index = c.index;
        int rows = mt_data_next_batch(d, &c, B * ranks, S, tokens, labels, mask);
        if (rows < 0) {
            rc = -1;
            break;
        }
        if (rows == 0) break;
        mt_threads_adapt();  // the cores others leave free (core/threads.h)
        // Only the rows holding data (the last batch of the pass may be short).
        int first = rank * B, mine = MT_MAX(0, MT_MIN(B, rows - first));
        if (mine == 0) {
            first = 0, mine = 1;
            for (int i = 0; i < S; i++) tokens[i] = 0, labels[i] = -100, mask[i] = 0;
        }
        int64_t at = (int64_t)first * S;
        mt_batch b = {mine, S, tokens + at, labels + at, mask + at};
        mt_loss l;
        if (mt_model_forward(m, &b, &l) != 0) {
            rc = -1;
            break;
        }
        ce_sum += l.ce * (double)l.tokens;
        aux_sum += l.aux;
        r->tokens += l.tokens;
        r->batches++;
        r->samples += (c.epoch > 0 ? d->n : c.index) - index;
    }
    free(tokens), free(labels), free(mask);
    if (rc) return -1;
    if (r->tokens == 0) {
        mt_error_set("%s: no token is in the loss", d->source);
        return -1;
    }
    r->loss = ce_sum / (double)r->tokens;
    r->aux = aux_sum / (double)MT_MAX(r->batches, 1);
    r->perplexity = exp(r->loss);
    return 0;
}

// The tokenizer of the model folder; a token file needs none beyond the vocabulary bound, so
// models too small for the byte tokenizer (vocab < 256, the golden fixtures) still evaluate one.
static int open_tokenizer(mt_tokenizer *tok, const mt_run_opts *o, const mt_model_config *cfg) {
    if (mt_tokenizer_open(tok, o->model, cfg->vocab, (int32_t)cfg->bos_token_id, (int32_t)cfg->eos_token_id) == 0)
        return 0;
    char magic[6] = {0};
    FILE *f = fopen(o->data, "rb");
    if (!f) {
        mt_error_set("--data %s: cannot open: %s", o->data, strerror(errno));
        return -1;
    }
    int tokfile = f && fread(magic, 1, 6, f) == 6 && memcmp(magic, "MTTOK1", 6) == 0;
    fclose(f);
    if (!tokfile) return -1;
    memset(tok, 0, sizeof *tok);
    tok->kind = MT_TOKENIZER_BYTE;
    tok->vocab = cfg->vocab;
    tok->bos = (int32_t)cfg->bos_token_id, tok->eos = (int32_t)cfg->eos_token_id;
    tok->add_bos = tok->bos >= 0;
    snprintf(tok->source, sizeof tok->source, "none (token file)");
    mt_error_clear();
    return 0;
}

int mt_eval_run(mt_run_opts *o, mt_eval_result *r) {
    if (!o->model[0] || !o->data[0]) {
        mt_error_set("--model and --data are required");
        return -1;
    }
    if (o->batch < 1 || o->batch > 1 << 20 || o->seq < 2 || o->seq > 1 << 24) {
        mt_error_set("--batch must be at least 1 and --seq at least 2");
        return -1;
    }
    if (strcmp(o->backend, "cpu") != 0) {
        mt_error_set("--device %s: eval runs on the cpu backend", o->backend);
        return -1;
    }
    mt_model_config cfg;
    if (mt_model_config_load(o->model, &cfg) != 0) return -1;
    mt_note_quant_on_load(&cfg, o, "eval");
    mt_tokenizer tok;
    if (open_tokenizer(&tok, o, &cfg) != 0) return -1;
    mt_data_opts dopts;
    mt_data_opts_default(&dopts);
    dopts.seq = o->seq;
    dopts.max_line_bytes = (uint64_t)o->max_line_bytes;
    dopts.packing = o->packing;
    dopts.seed = o->seed;
    dopts.shuffle = 0;
    dopts.whole_epochs = 1;
    mt_dataset d;
    int rc = -1;
    mt_backend *be = NULL;
    mt_model m;
    int loaded = 0;
    if (mt_overlong_parse(o->overlong, &dopts.overlong) != 0) {
        mt_error_prefix("--overlong");
        memset(&d, 0, sizeof d);
        goto done;
    }
    if (mt_prompt_style_parse(o->instruction_template, &dopts.prompt) != 0) {
        mt_error_prefix("--instruction-template");
        memset(&d, 0, sizeof d);
        goto done;
    }
    if (mt_chat_template_load(&dopts.chat, o->model, o->chat_template, tok.kind) != 0 ||
        mt_chat_date_set(&dopts.chat, o->chat_date) != 0) {
        memset(&d, 0, sizeof d);
        goto done;
    }
    if (mt_dataset_load(&d, o->data, &tok, &dopts) != 0) goto done;
    char notes[1024];
    mt_data_notes_format(&d.stats, &dopts, notes, sizeof notes);
    if (notes[0]) fprintf(stderr, "eval: data: %s\n", notes);
    if (o->save_tokens[0]) {  // the rows as eval reads them, for check_peft.py and the like
        if (mt_dataset_save_tokens(&d, o->save_tokens) != 0) {
            mt_error_prefix("--save-tokens %s", o->save_tokens);
            goto done;
        }
        fprintf(stderr, "eval: wrote the %lld samples it reads to %s\n", (long long)d.stats.samples, o->save_tokens);
    }
    be = mt_backend_cpu_new();
    if (mt_model_load_for_inference(&m, be, o) != 0) goto done;
    loaded = 1;
    // Rows as long as the longest sample (right padding changes no loss), or --seq when packing.
    int S = (int)(o->packing ? o->seq : MT_MIN(o->seq, d.stats.longest));
    rc = mt_eval_dataset(&m, &d, (int)o->batch, S, r);
done:
    if (loaded) mt_model_free(&m);
    if (be) mt_backend_free(be);
    mt_dataset_free(&d);
    mt_tokenizer_free(&tok);
    return rc;
}

int cmd_eval(int argc, char **argv) {
    if (mt_args_want_help(argc, argv)) {
        eval_usage(stdout);
        return MT_EXIT_OK;
    }
    mt_run_opts o;
    mt_run_opts_default(&o);
    if (mt_run_opts_parse_cmd(&o, argc, argv, "eval", NULL) != 0) {
        fprintf(stderr, "moetrain eval: %s\n", mt_error_get());
        return MT_EXIT_USAGE;
    }
    if (!o.model[0] || !o.data[0]) {
        fprintf(stderr, "moetrain eval: --model and --data are required\n");
        eval_usage(stderr);
        return MT_EXIT_USAGE;
    }
    mt_eval_result r;
    if (mt_eval_run(&o, &r) != 0) {
        fprintf(stderr, "moetrain eval: %s\n", mt_error_get());
        return MT_EXIT_ERROR;
    }
    printf("eval: model=%s adapter=%s data=%s mode=%s quant=%s samples=%lld batches=%lld\n", o.model,
           o.adapter[0] ? o.adapter : "none", o.data, mt_mode_name(o.mode), mt_quant_name(o.quant),
           (long long)r.samples, (long long)r.batches);
    printf("loss=%.6f perplexity=%.6f tokens=%lld aux=%.6f\n", r.loss, r.perplexity, (long long)r.tokens, r.aux);
    printf("(loss: mean cross-entropy over the loss tokens; aux: the router load-balancing loss, mean over "
           "batches, not included in loss)\n");
    return MT_EXIT_OK;
}
