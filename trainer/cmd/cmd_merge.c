// trainer/cmd/cmd_merge.c — `moetrain merge`: an adapter folded into a Hugging Face checkpoint.
//
// For every adapted Linear W [out, in]: W' = W + scale · B · A (PEFT's merge, docs/formats.md "LoRA math"),
// computed in f32 and written in --dtype (by default the base's own dtype). The base is read, never written:
// a 4-bit base (a bnb-4bit checkpoint, or a dense one with --quant nf4|fp4|int4, quantized here
// exactly as `moetrain train` quantizes it on load) is dequantized to f32 first, then the delta
// is added. Everything else is copied through, converted to --dtype. A trained-tensor file
// (router, unfreeze, full modes) given as --adapter replaces the tensors it holds instead.
//
// Tensors are produced one at a time inside the writer's fill callback (streaming, like init
// and quantize): peak memory is one tensor in f32 plus the adapter.
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "core/common.h"
#include "core/gemm.h"
#include "core/fileio.h"
#include "core/safetensors.h"
#include "lora/peft.h"
#include "model/config.h"
#include "model/fused_experts.h"
#include "model/weights.h"
#include "quant/quant.h"
#include "trainer/cmd/commands.h"
#include "trainer/cmd/fused_write.h"

static void merge_usage(FILE *out) {
    fprintf(out,
            "usage: moetrain merge --model DIR --adapter DIR|FILE.safetensors --out DIR\n"
            "                      [--dtype bf16|f32|f16] [--quant none|nf4|fp4|int4]\n"
            "                      [--blocksize N] [--double-quant] [--quant-targets LIST]\n"
            "                      [--shard-size SIZE] [--out-quant mxfp4]\n\n"
            "Writes DIR (--out): config.json (without quantization_config) and the weights with\n"
            "W + scale·B·A folded into every adapted Linear (model.safetensors, or shards with an index\n"
            "above --shard-size, default 5GB), plus the base's tokenizer files. The base is never\n"
            "modified: a bnb-4bit base is dequantized, then the delta added. --quant quantizes a dense base's\n"
            "--quant-targets first, as training on a 4-bit base did, so that the merge reproduces the model\n"
            "the adapter was trained against. Default: what the training run recorded beside the adapter\n"
            "(moetrain_base.json: --quant, --blocksize, --double-quant, --quant-targets), else none.\n"
            "Writes SHA256SUMS last (moetrain verify DIR checks it).\n"
            "--dtype: the output's dtype (default: the base's own, config.json's torch_dtype; bf16 for a\n"
            "4-bit base stored without one).\n"
            "--out-quant mxfp4: gpt-oss's fused experts written as MXFP4 like its release (blocks and scales,\n"
            "quantization_config mxfp4), the rest in --dtype; the re-quantization's error is reported.\n"
            "Without it they are written dense: an MXFP4 base is dequantized and the delta kept exactly.\n");
}

typedef struct {
    char *module;
    int64_t in, out;
    float *a, *b;  // A [r, in], B [out, r]
    int used;
} lora_pair;

typedef struct {
    mt_st_model st;
    const mt_weight_desc *desc;  // [n] output tensors
    size_t n;
    // PEFT adapter
    lora_pair *pairs;
    size_t n_pairs, cap_pairs;  // cap_pairs: pairs' room, doubled (tens of thousands of expert LoRAs)
    int r;
    float scale;
    const mt_family *fam;  // the base's module names: the PEFT reader's Mixtral names mapped to them
    // or trained tensors
    mt_st_file trained;
    int have_trained;
    // 4-bit base
    mt_quant quant;
    int blocksize, double_quant;
    unsigned quant_targets;  // what training quantized (--quant-targets)
    int fp8_block[2];        // a block-FP8 base (config.json's weight_block_size); 0: none
    mt_dtype out_dtype;
    mt_backend *cpu;
    float *w;  // f32 scratch of the largest tensor
    // gpt-oss's fused experts; the output entries (an MXFP4 tensor is two) and their descriptors
    mt_fused_write fused;
    int mxfp4_out;
    size_t *ent_desc;
    int *ent_part;
} merge_ctx;

// A base weight stored block-FP8 (with its "_scale_inv" beside it), which training dequantizes on load.
static int is_fp8(const merge_ctx *c, const mt_st_tensor *t) {
    return c->fp8_block[0] && strcmp(t->dtype, "F8_E4M3") == 0;
}

// "P.weight_scale_inv" of a block-FP8 base beside its P.weight: read with it, not a tensor of its own.
static int fp8_scale_name(const merge_ctx *c, const char *name) {
    char base[600];
    return c->fp8_block[0] && mt_fp8_scale_base(name, base, sizeof base) && mt_st_model_find(&c->st, base);
}

static int dtype_of(const mt_st_tensor *t, mt_dtype *dt) {
    if (mt_st_float_dtype(t->dtype, dt) != 0) {
        mt_error_set("tensor '%s' has dtype %s (expected F32, BF16 or F16)", t->name, t->dtype);
        return -1;
    }
    return 0;
}

static int collect_pair(void *ctx, const char *module, const mt_st_tensor *a, const mt_st_tensor *b) {
    merge_ctx *c = ctx;
    mt_dtype da, db;
    if (dtype_of(a, &da) != 0 || dtype_of(b, &db) != 0) return -1;
    if (c->n_pairs == c->cap_pairs)
        c->pairs = mt_xrealloc(c->pairs, (c->cap_pairs = c->cap_pairs ? 2 * c->cap_pairs : 64) * sizeof *c->pairs);
    lora_pair *p = &c->pairs[c->n_pairs++];
    memset(p, 0, sizeof *p);
    char renamed[300];
    p->module = mt_xstrdup(mt_family_module_name(c->fam, module, renamed, sizeof renamed));
    p->in = a->shape[1], p->out = b->shape[0];
    p->a = mt_xmalloc((size_t)(a->shape[0] * p->in) * sizeof(float));
    p->b = mt_xmalloc((size_t)(p->out * b->shape[1]) * sizeof(float));
    mt_convert(p->a, MT_F32, a->data, da, (size_t)(a->shape[0] * p->in));
    mt_convert(p->b, MT_F32, b->data, db, (size_t)(p->out * b->shape[1]));
    return 0;
}

static lora_pair *find_pair(merge_ctx *c, const char *weight_name) {
    size_t len = strlen(weight_name);
    if (len < 7 || strcmp(weight_name + len - 7, ".weight") != 0) return NULL;
    for (size_t i = 0; i < c->n_pairs; i++)
        if (strlen(c->pairs[i].module) == len - 7 && strncmp(c->pairs[i].module, weight_name, len - 7) == 0)
            return &c->pairs[i];
    return NULL;
}

static size_t numel_of(const mt_weight_desc *d) { return (size_t)mt_weight_numel(d); }

// The 4-bit base training used for weight `name` [out, in]: the same quantization as
// mt_model_load's, undone, when --quant and --quant-targets reach it.
static int requantize(merge_ctx *c, const char *name, float *w, int64_t out, int64_t in) {
    if (c->quant == MT_QUANT_NONE || !(mt_quant_target_of(name) & c->quant_targets)) return 0;
    mt_qweight q;
    if (mt_qweight_quantize(&q, c->cpu, name, w, out, in, c->quant, c->blocksize, c->double_quant) != 0) return -1;
    mt_qweight_dequantize_rows_cpu(&q, w, 0, q.out);
    mt_qweight_free(&q);
    return 0;
}

// W [out, in] of weight `name` += scale · B [out, r] · A [r, in] when the adapter has its module.
static void add_delta(merge_ctx *c, const char *name, float *w) {
    lora_pair *p = find_pair(c, name);
    if (!p) return;
    mt_sgemm(0, 0, (int)p->out, (int)p->in, c->r, c->scale, p->b, c->r, p->a, (int)p->in, 1.0f, w, (int)p->in);
    p->used = 1;
}

// Tensor `index` of the output: the base's values in f32 (dequantized when 4-bit), replaced by
// a trained tensor or plus the adapter's delta, in the output dtype.
static int fill_tensor(void *ctx, size_t index, void *dst, size_t nbytes) {
    merge_ctx *c = ctx;
    const mt_weight_desc *d = &c->desc[c->ent_desc[index]];
    if (d->kind == MT_WEIGHT_EXPERTS)
        return mt_fused_write_fill(&c->fused, d, c->mxfp4_out, c->out_dtype, c->ent_part[index], dst, nbytes);
    size_t n = numel_of(d);
    float *w = c->w;
    (void)nbytes;
    const mt_st_tensor *tt = c->have_trained ? mt_st_file_find(&c->trained, d->name) : NULL;
    mt_bnb_parts parts;
    int pre = tt ? 0 : mt_bnb_find_parts(&c->st, d->name, &parts);
    if (pre < 0) return -1;
    mt_dtype dt;
    if (tt) {  // a trained tensor replaces the base's
        if (dtype_of(tt, &dt) != 0) return -1;
        mt_convert(w, MT_F32, tt->data, dt, n);
    } else if (pre) {  // serialised 4-bit: dequantize
        mt_qweight q;
        if (mt_qweight_import(&q, c->cpu, d->name, &parts) != 0) return -1;
        if ((size_t)(q.out * q.in) != n || q.out != d->shape[0]) {
            mt_error_set("'%s': quant_state shape [%lld, %lld] where the config implies [%lld, %lld]", d->name,
                         (long long)q.out, (long long)q.in, (long long)d->shape[0], (long long)d->shape[1]);
            mt_qweight_free(&q);
            return -1;
        }
        mt_qweight_dequantize_rows_cpu(&q, w, 0, q.out);
        mt_qweight_free(&q);
    } else {
        const mt_st_tensor *t = mt_st_model_find(&c->st, d->name);
        if (is_fp8(c, t)) {  // block FP8: dequantized as training's load does, then as a dense weight
            float *f = mt_fp8_dequantize_tensor(&c->st, t, c->fp8_block);
            if (!f) return -1;
            memcpy(w, f, n * sizeof(float));
            free(f);
        } else {
            if (dtype_of(t, &dt) != 0) return -1;
            mt_convert(w, MT_F32, t->data, dt, n);
        }
        if (d->kind == MT_WEIGHT_LINEAR && requantize(c, d->name, w, d->shape[0], d->shape[1]) != 0) return -1;
    }
    if (!tt) add_delta(c, d->name, w);
    mt_convert(dst, c->out_dtype, w, MT_F32, n);
    return 0;
}

// Expert Linear `module` of a fused tensor (fused_write.c's callback): replaced by the trained
// tensor of that name, or re-quantized as training's load did and plus the adapter's delta.
static int apply_expert(void *ctx, const char *module, float *w, int64_t out, int64_t in, int mxfp4_base) {
    merge_ctx *c = ctx;
    char name[220];
    snprintf(name, sizeof name, "%s.weight", module);
    const mt_st_tensor *tt = c->have_trained ? mt_st_file_find(&c->trained, name) : NULL;
    mt_dtype dt;
    if (tt) {  // its shape was checked against the expert's (check_adapter)
        if (dtype_of(tt, &dt) != 0) return -1;
        mt_convert(w, MT_F32, tt->data, dt, (size_t)(out * in));
        return 0;
    }
    // gpt-oss's MXFP4 experts train as stored, whatever --quant said (model/mixtral.c fused_mxfp4)
    if (!mxfp4_base && requantize(c, name, w, out, in) != 0) return -1;
    add_delta(c, name, w);
    return 0;
}

// Shape check of the base's tensor (its unquantized shape for a 4-bit one).
static int check_base(merge_ctx *c, const mt_weight_desc *d) {
    if (d->kind == MT_WEIGHT_EXPERTS) return mt_fused_write_check(&c->fused, d);
    const mt_st_tensor *t = mt_st_model_find(&c->st, d->name);
    if (!t) {
        mt_error_set("tensor '%s' is missing from the base checkpoint", d->name);
        return -1;
    }
    mt_bnb_parts parts;
    int pre = mt_bnb_find_parts(&c->st, d->name, &parts);
    if (pre < 0) return -1;
    if (pre) return 0;  // checked against its quant_state when dequantized
    int ok = t->ndim == d->ndim;
    for (int k = 0; ok && k < d->ndim; k++) ok = t->shape[k] == d->shape[k];
    if (!ok) {
        mt_error_set("tensor '%s' of the base does not have the shape its config implies", d->name);
        return -1;
    }
    mt_dtype dt;
    return is_fp8(c, t) ? 0 : dtype_of(t, &dt);  // an FP8 weight's scale is checked when it is read
}

// The shape [out, in] of Linear `name` ("P.weight"): a Linear of the checkpoint, or one expert's
// Linear inside gpt-oss's fused tensors ("....experts.E.gate_proj.weight"). 0 when it is neither.
static int linear_shape(const merge_ctx *c, const char *name, int64_t shape[2]) {
    for (size_t j = 0; j < c->n; j++)
        if (strcmp(c->desc[j].name, name) == 0) {
            if (c->desc[j].kind != MT_WEIGHT_LINEAR) return 0;
            shape[0] = c->desc[j].shape[0], shape[1] = c->desc[j].shape[1];
            return 1;
        }
    const char *at = strstr(name, ".experts.");
    int e, len = 0;
    char leaf[32];
    if (!c->fam || !c->fam->fused_experts || !at || sscanf(at, ".experts.%d.%31[a-z_].weight%n", &e, leaf, &len) != 2 ||
        at[len] != 0)
        return 0;
    char fused[200];
    snprintf(fused, sizeof fused, "%.*s.experts.down_proj", (int)(at - name), name);
    for (size_t j = 0; j < c->n; j++)
        if (c->desc[j].kind == MT_WEIGHT_EXPERTS && strcmp(c->desc[j].name, fused) == 0 && e >= 0 &&
            e < c->desc[j].shape[0])
            for (int which = 0; which < 3; which++)
                if (strcmp(leaf, c->fam->expert[which]) == 0) {
                    mt_fused_part p = mt_fused_part_of(which, c->fused.hidden, c->fused.inter);
                    shape[0] = p.rows / p.stride, shape[1] = p.in;
                    return 1;
                }
    return 0;
}

static int check_adapter(merge_ctx *c) {
    for (size_t i = 0; i < c->n_pairs; i++) {
        lora_pair *p = &c->pairs[i];
        char name[300];
        snprintf(name, sizeof name, "%s.weight", p->module);
        int64_t shape[2];
        if (!linear_shape(c, name, shape)) {
            mt_error_set("adapter module '%s' is not a Linear of the base model", p->module);
            return -1;
        }
        if (shape[0] != p->out || shape[1] != p->in) {
            mt_error_set("adapter module '%s': A [%d, %lld], B [%lld, %d] do not fit the weight [%lld, %lld]",
                         p->module, c->r, (long long)p->in, (long long)p->out, c->r, (long long)shape[0],
                         (long long)shape[1]);
            return -1;
        }
    }
    if (c->have_trained)
        for (size_t i = 0; i < c->trained.n_tensors; i++) {
            const mt_st_tensor *t = &c->trained.tensors[i];
            size_t j = 0;
            while (j < c->n && strcmp(c->desc[j].name, t->name) != 0) j++;
            int ok = j < c->n && t->ndim == c->desc[j].ndim && c->desc[j].kind != MT_WEIGHT_EXPERTS;
            for (int k = 0; ok && k < t->ndim; k++) ok = t->shape[k] == c->desc[j].shape[k];
            int64_t shape[2];
            if (j == c->n && linear_shape(c, t->name, shape))  // one expert of a fused tensor
                ok = t->ndim == 2 && t->shape[0] == shape[0] && t->shape[1] == shape[1];
            if (!ok) {
                mt_error_set("%s: tensor '%s' is not a tensor of the base model with this shape", c->trained.path,
                             t->name);
                return -1;
            }
        }
    return 0;
}

// Tokenizer and generation files beside the weights, so the output is a complete checkpoint.
static int copy_side_files(const char *from, const char *to) {
    static const char *files[] = {"tokenizer.model", "tokenizer.json", "tokenizer_config.json",
                                  "special_tokens_map.json", "generation_config.json"};
    for (size_t i = 0; i < MT_ARRAY_LEN(files); i++) {
        char src[4200], dst[4200];
        snprintf(src, sizeof src, "%s/%s", from, files[i]);
        snprintf(dst, sizeof dst, "%s/%s", to, files[i]);
        struct stat st;
        if (stat(src, &st) != 0) continue;
        char *data;
        size_t len;
        if (mt_read_file(src, (size_t)1 << 30, &data, &len) != 0) return -1;
        int rc = mt_write_file_atomic(dst, data, len);
        free(data);
        if (rc) return -1;
    }
    return 0;
}

static int same_dir(const char *a, const char *b) {
    char ra[PATH_MAX], rb[PATH_MAX];
    return realpath(a, ra) && realpath(b, rb) && strcmp(ra, rb) == 0;
}

// An MXFP4 base's "_blocks" / "_scales" of a fused tensor (written with it, never warned about).
static int fused_part_name(const merge_ctx *c, const char *name) {
    size_t len = strlen(name);
    for (size_t j = 0; j < c->n; j++)
        if (c->desc[j].kind == MT_WEIGHT_EXPERTS && len == strlen(c->desc[j].name) + 7 &&
            strncmp(name, c->desc[j].name, len - 7) == 0 &&
            (strcmp(name + len - 7, "_blocks") == 0 || strcmp(name + len - 7, "_scales") == 0))
            return 1;
    return 0;
}

static void report_mxfp4(const mt_fused_mxfp4_error *e) {
    if (!e->n) return;
    double rms = sqrt(e->err2 / (double)e->n), w = sqrt(e->w2 / (double)e->n), d = sqrt(e->delta2 / (double)e->n);
    mt_info("merge: the experts re-quantized to MXFP4: error RMS %.4g (%.3g%% of the weights' RMS %.4g), max |error| "
            "%.4g; the merged delta's RMS is %.4g%s", rms, w > 0 ? 100.0 * rms / w : 0.0, w, e->max_err, d,
            d > 0 && rms > d ? ": the rounding is larger than what the adapter changed (a dense merge keeps it)" : "");
}

// out_dtype -1: the base's own dtype (config.json's torch_dtype), so an f32 base merges to f32.
// mxfp4_out: gpt-oss's fused experts written as MXFP4.
static int run_merge(const mt_run_opts *o, int out_dtype_or_base, double shard_size, int mxfp4_out) {
    mt_model_config cfg;
    if (mt_model_config_load(o->model, &cfg) != 0) return -1;
    if (mxfp4_out && !mt_config_family(&cfg)->fused_experts) {
        mt_error_set("--out-quant mxfp4: only gpt-oss's fused experts are written as MXFP4, and %s (model_type %s) "
                     "has none", o->model, cfg.model_type);
        return -1;
    }
    mt_dtype out_dtype = out_dtype_or_base >= 0 ? (mt_dtype)out_dtype_or_base : cfg.torch_dtype;
    if (out_dtype != MT_BF16 && out_dtype != MT_F32 && out_dtype != MT_F16) out_dtype = MT_BF16;
    if (mt_is_dir(o->out) && same_dir(o->out, o->model)) {
        mt_error_set("--out %s is the base checkpoint's folder: merge never rewrites the base", o->out);
        return -1;
    }
    merge_ctx c;
    memset(&c, 0, sizeof c);
    c.fam = mt_config_family(&cfg);
    c.mxfp4_out = mxfp4_out;
    c.fused = (mt_fused_write){.fam = c.fam, .hidden = cfg.hidden, .inter = cfg.intermediate, .apply = apply_expert,
                               .ctx = &c};
    c.quant = o->quant, c.blocksize = o->quant_blocksize, c.double_quant = o->double_quant;
    c.quant_targets = o->quant_targets;
    c.fp8_block[0] = cfg.fp8_block[0], c.fp8_block[1] = cfg.fp8_block[1];
    c.out_dtype = out_dtype;
    mt_weight_desc *desc = NULL;
    int rc = -1;
    mt_st_entry *e = NULL;
    char (*names)[160] = NULL;  // the MXFP4 parts' names
    if (mt_st_model_open(&c.st, o->model) != 0) return -1;
    c.fused.st = &c.st;
    struct stat st;
    if (stat(o->adapter, &st) == 0 && S_ISREG(st.st_mode)) {
        if (mt_st_file_open(&c.trained, o->adapter) != 0) goto done;
        c.have_trained = 1;
    } else {
        mt_peft_config pc;
        mt_peft_layout lay = {.gate_up_interleaved = c.fam->fused_experts};  // gpt-oss's gate/up rows
        if (mt_peft_read_as(o->adapter, &lay, &pc, collect_pair, &c) != 0) goto done;
        c.r = pc.r;
        // the scale the model applies (mt_lora_init's), so merged == base + adapter
        c.scale = (float)(pc.use_rslora ? pc.lora_alpha / sqrt((double)pc.r) : pc.lora_alpha / pc.r);
        // the score biases the run's --router-bias-update moved replace the base's, as trained tensors
        char biases[4200];
        snprintf(biases, sizeof biases, "%s/%s", o->adapter, MT_SCORE_BIAS_FILE);
        if (stat(biases, &st) == 0) {
            if (mt_st_file_open(&c.trained, biases) != 0) goto done;
            c.have_trained = 1;
        }
    }
    c.n = mt_weights_list(&cfg, &desc);
    c.desc = desc;
    size_t largest = 0;
    for (size_t i = 0; i < c.n; i++) {
        if (check_base(&c, &desc[i]) != 0) goto done;
        largest = MT_MAX(largest, numel_of(&desc[i]));
    }
    if (check_adapter(&c) != 0) goto done;
    for (size_t i = 0; i < c.st.n_tensors; i++) {  // what a checkpoint of the family should not hold
        const char *name = c.st.tensors[i]->name;
        size_t j = 0;
        while (j < c.n && strcmp(desc[j].name, name) != 0) j++;
        if (j == c.n && !mt_bnb_is_part_name(name) && !fused_part_name(&c, name) && !fp8_scale_name(&c, name))
            mt_warn("merge: base tensor '%s' is not part of a %s checkpoint and is not copied", name, cfg.model_type);
    }
    c.cpu = mt_backend_cpu_new();
    c.w = mt_xmalloc(largest * sizeof(float));
    e = mt_xcalloc(2 * c.n, sizeof *e);  // an MXFP4 tensor is two entries
    names = mt_xcalloc(2 * c.n, sizeof *names);
    c.ent_desc = mt_xcalloc(2 * c.n, sizeof *c.ent_desc);
    c.ent_part = mt_xcalloc(2 * c.n, sizeof *c.ent_part);
    size_t n_ent = 0;
    for (size_t i = 0; i < c.n; i++) {
        int k = 1;
        if (desc[i].kind == MT_WEIGHT_EXPERTS) {
            k = mt_fused_write_entries(&desc[i], mxfp4_out, mt_st_dtype_of(out_dtype), &names[2 * i], &e[n_ent]);
            if (k < 0) goto done;
        } else {
            e[n_ent].name = desc[i].name;
            e[n_ent].dtype = mt_st_dtype_of(out_dtype);
            e[n_ent].ndim = desc[i].ndim;
            for (int d = 0; d < desc[i].ndim; d++) e[n_ent].shape[d] = desc[i].shape[d];
        }
        for (int p = 0; p < k; p++) c.ent_desc[n_ent] = i, c.ent_part[n_ent++] = p;
    }
    if (mt_mkdir_p(o->out) != 0 ||
        mt_st_write_sharded(o->out, e, n_ent, (uint64_t)shard_size, fill_tensor, &c) != 0)
        goto done;
    for (size_t i = 0; i < c.n_pairs; i++)
        if (!c.pairs[i].used) {  // cannot happen after check_adapter; a guard for the invariant
            mt_error_set("adapter module '%s' was not merged", c.pairs[i].module);
            goto done;
        }
    cfg.quantized = 0, cfg.mxfp4 = mxfp4_out;  // dense, or gpt-oss's own MXFP4 experts
    cfg.fp8_block[0] = cfg.fp8_block[1] = 0;
    cfg.torch_dtype = out_dtype;
    char path[4200];
    snprintf(path, sizeof path, "%s/config.json", o->out);
    if (mt_model_config_write(&cfg, path) != 0 || copy_side_files(o->model, o->out) != 0 ||
        mt_model_sums_write(o->out) != 0)
        goto done;
    mt_info("merge: wrote %s: %zu tensors, %s%s, %zu adapted Linears%s%s", o->out, c.n, mt_dtype_name(out_dtype),
            mxfp4_out ? " (experts MXFP4)" : "", c.n_pairs, c.have_trained ? ", trained tensors from " : "",
            c.have_trained ? o->adapter : "");
    if (mxfp4_out) report_mxfp4(&c.fused.err);
    rc = 0;
done:
    for (size_t i = 0; i < c.n_pairs; i++) free(c.pairs[i].module), free(c.pairs[i].a), free(c.pairs[i].b);
    free(c.pairs);
    free(c.w);
    free(e), free(names), free(c.ent_desc), free(c.ent_part);
    mt_fused_write_free(&c.fused);
    free(desc);
    if (c.cpu) mt_backend_free(c.cpu);
    if (c.have_trained) mt_st_file_close(&c.trained);
    mt_st_model_close(&c.st);
    return rc;
}

#define QUANT_UNSET ((mt_quant)99)

// No --quant: the base the adapter was trained against, as the training run recorded it
// (moetrain_base.json), so that the merged model is the one that was trained; the base as stored
// when nothing is recorded. Says which on stderr.
static int default_quant(mt_run_opts *o) {
    if (o->quant != QUANT_UNSET) return 0;
    mt_base_record r;
    int got = mt_base_record_read(o->adapter, &r);
    if (got < 0) return -1;
    o->quant = MT_QUANT_NONE;
    if (got == 0) {
        fprintf(stderr, "merge: %s records no base quantization (not written by moetrain train): merging into the base "
                "as stored; pass --quant nf4|fp4|int4 if it was trained on a base quantized on load\n", o->adapter);
        return 0;
    }
    if (r.quant == MT_QUANT_NONE) {
        fprintf(stderr, "merge: the adapter was trained on the base as stored (%s): merging into it as stored\n", r.path);
        return 0;
    }
    o->quant = r.quant, o->quant_blocksize = r.blocksize, o->double_quant = r.double_quant;
    o->quant_targets = r.quant_targets;
    fprintf(stderr, "merge: the adapter was trained on a base quantized to %s on load (blocksize %d%s, --quant-targets %s; "
            "%s): merging into the same 4-bit base, dequantized, so the merged model is the trained one; --quant none "
            "merges into the stored weights instead\n", mt_quant_name(r.quant), r.blocksize,
            r.double_quant ? ", double quant" : "", r.targets, r.path);
    return 0;
}

int cmd_merge(int argc, char **argv) {
    // --dtype, --shard-size and --out-quant are merge's own; the rest are run options.
    const char *dtype_name = NULL;  // the base's
    int mxfp4_out = 0;
    double shard_size = 5e9;
    char **rest = mt_xcalloc((size_t)argc + 1, sizeof(char *));
    int nrest = 0, rc = MT_EXIT_USAGE;
    for (int i = 0; i < argc; i++) {
        const char *a = argv[i];
        if (strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0) {
            merge_usage(stdout);
            free(rest);
            return MT_EXIT_OK;
        }
        int is_dtype = strncmp(a, "--dtype", 7) == 0 && (a[7] == 0 || a[7] == '=');
        int is_shard = strncmp(a, "--shard-size", 12) == 0 && (a[12] == 0 || a[12] == '=');
        int is_oq = strncmp(a, "--out-quant", 11) == 0 && (a[11] == 0 || a[11] == '=');
        if (!is_dtype && !is_shard && !is_oq) {
            rest[nrest++] = argv[i];
            continue;
        }
        const char *eq = strchr(a, '='), *v = eq ? eq + 1 : i + 1 < argc ? argv[++i] : NULL;
        if (!v) {
            fprintf(stderr, "moetrain merge: %s needs a value\n", a);
            goto out;
        }
        if (is_dtype) dtype_name = v;
        else if (is_oq) {
            if (strcmp(v, "mxfp4") != 0 && strcmp(v, "none") != 0) {
                fprintf(stderr, "moetrain merge: --out-quant '%s' is not mxfp4 or none\n", v);
                goto out;
            }
            mxfp4_out = strcmp(v, "mxfp4") == 0;
        } else if (mt_parse_bytes(v, &shard_size) != 0 || shard_size < 1) {
            fprintf(stderr, "moetrain merge: --shard-size: %s\n", mt_error_get());
            goto out;
        }
    }
    mt_dtype out_dtype = MT_BF16;
    if (dtype_name && (mt_dtype_parse(dtype_name, &out_dtype) != 0 ||
                       (out_dtype != MT_BF16 && out_dtype != MT_F32 && out_dtype != MT_F16))) {
        fprintf(stderr, "moetrain merge: --dtype '%s' is not bf16, f32 or f16\n", dtype_name);
        goto out;
    }
    mt_run_opts o;
    mt_run_opts_default(&o);
    o.quant = QUANT_UNSET;  // merge's default: the training run's base (below)
    if (mt_run_opts_parse_cmd(&o, nrest, rest, "merge", NULL) != 0) {
        fprintf(stderr, "moetrain merge: %s\n", mt_error_get());
        goto out;
    }
    if (!o.model[0] || !o.adapter[0] || !o.out[0]) {
        fprintf(stderr, "moetrain merge: --model, --adapter and --out are required\n");
        merge_usage(stderr);
        goto out;
    }
    if (default_quant(&o) != 0) {
        fprintf(stderr, "moetrain merge: %s\n", mt_error_get());
        rc = MT_EXIT_ERROR;
        goto out;
    }
    if (run_merge(&o, dtype_name ? (int)out_dtype : -1, shard_size, mxfp4_out) != 0) {
        fprintf(stderr, "moetrain merge: %s\n", mt_error_get());
        rc = MT_EXIT_ERROR;
        goto out;
    }
    rc = MT_EXIT_OK;
out:
    free(rest);
    return rc;
}
