// trainer/cmd/cmd_quantize.c — `moetrain quantize`: a bf16/f16/f32 checkpoint to a 4-bit one in
// bitsandbytes' layout (docs/formats.md "Serialized quant_state") with the same quantization_config in config.json, so
// that a later run (or transformers) loads it without re-quantizing.
//
// Two passes over the input, both streaming: the first lays out every output tensor (the
// quant_state JSON of a double-quantized weight holds the mean of its absmax, so its length is
// known only after reading the weight); the second writes them, quantizing each target inside
// the writer's fill callback. Input pages are dropped as soon as they are read: peak memory is
// the writer's one scratch buffer (the largest output tensor) plus one quantized weight.
#include <dirent.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "core/common.h"
#include "core/fileio.h"
#include "core/safetensors.h"
#include "model/config.h"
#include "model/fused_experts.h"
#include "quant/quant.h"
#include "trainer/cmd/commands.h"
#include "trainer/cmd/fused_write.h"
#include "trainer/options.h"

static void quantize_usage(FILE *out) {
    fprintf(out,
            "usage: moetrain quantize --model DIR --out DIR [--quant nf4|fp4|int4|mxfp4]\n"
            "                         [--double-quant | --no-double-quant] [--blocksize N]\n"
            "                         [--quant-targets LIST] [--shard-size SIZE] [--backend cpu|cuda]\n\n"
            "Writes DIR (--out) with the targets quantized once, in bitsandbytes' bnb-4bit layout:\n"
            "P.weight (packed U8), .absmax, .quant_map, .nested_absmax, .nested_quant_map and\n"
            ".quant_state.bitsandbytes__nf4|fp4, plus config.json's quantization_config, so that\n"
            "`moetrain --model DIR` (or transformers) starts without re-quantizing. int4 is\n"
            "moetrain's own format (.absmax = fp16 scales, .zero = fp16 minimums,\n"
            ".quant_state.moetrain__int4); only moetrain reads it. mxfp4 is written as gpt-oss\n"
            "checkpoints store it: P_blocks U8 [out, in/32, 16] and P_scales U8 [out, in/32] (e8m0)\n"
            "in place of P.weight. For gpt-oss that is its release's layout: the fused experts as\n"
            "gate_up_proj_blocks [E, 2f, H/32, 16] / _scales and down_proj_blocks / _scales, the rest\n"
            "dense, quantization_config mxfp4; moetrain and transformers load it. Other families'\n"
            "MXFP4 Linears are not loaded by moetrain yet.\n\n"
            "  --quant           nf4 (default), fp4, int4 or mxfp4 (blocks of 32, in %% 32 == 0)\n"
            "  --double-quant    8-bit absmax, nested in 256-blocks (default on; nf4/fp4)\n"
            "  --blocksize       32..4096, a power of two (default 64 for nf4/fp4, 128 for int4)\n"
            "  --quant-targets   experts,attn,router | all | default (default: experts,attn; the\n"
            "                    router gate, embeddings, norms and lm_head stay as they are);\n"
            "                    `moetrain train --quant-targets` reads the same list\n"
            "  --shard-size      largest output shard (default 5GB)\n"
            "  --backend         where to quantize: cpu (default) or cuda\n");
}

// ---------------------------------------------------------------------------------------------
// The output plan

// COPY: as stored; QPART: a part of a weight quantized here; DEQUANT: a 4-bit weight handed back
// dense; FUSED: gpt-oss's fused experts to MXFP4; FP8_DENSE: a block-FP8 weight not targeted, dense.
typedef enum { OUT_COPY, OUT_QPART, OUT_DEQUANT, OUT_FUSED, OUT_FP8_DENSE } out_role;

typedef struct {
    out_role role;
    const mt_st_tensor *src;  // COPY: the tensor copied; QPART/DEQUANT: the source weight
    int group;                // QPART/DEQUANT: index into groups
    int part;                 // QPART: index among the weight's exported entries; FUSED: blocks 0, scales 1
} out_entry;

typedef struct {
    const mt_st_tensor *t;   // the source weight
    mt_bnb_entries layout;   // QPART: the entries (names, shapes, pass-1 quant_state)
    mt_bnb_parts parts;      // DEQUANT: the serialised source
    mt_dtype dtype;          // source dtype (dense; F32 for FP8's dequantized values) or output dtype
                             // (DEQUANT, FP8_DENSE)
    int fp8;                 // stored block-FP8: dequantized (quant/fp8.c) each time it is read
    mt_weight_desc fused;    // FUSED: gpt-oss's fused experts, as MXFP4 blocks and scales
    char fused_names[2][160];
} out_group;

typedef struct {
    const mt_st_model *m;
    mt_backend *be;          // where quantization runs (cpu or cuda)
    mt_backend *cpu;         // imports that are dequantized
    mt_quant type;
    int blocksize, double_quant;
    int fp8_block[2];        // config.json's weight_block_size (0: not an FP8 checkpoint)
    out_entry *entries;
    out_group *groups;
    // the weight being written
    int cur_group;
    mt_qweight cur;
    mt_bnb_entries cur_ex;
    mt_fused_write fused;    // gpt-oss's fused experts to MXFP4
    // totals for the summary
    int64_t quant_params, n_quant, n_dense;
    uint64_t quant_bytes;
} qctx;

static void cur_release(qctx *c) {
    if (c->cur_group < 0) return;
    mt_bnb_export_free(&c->cur_ex);
    mt_qweight_free(&c->cur);
    c->cur_group = -1;
}

static int fill(void *ctx, size_t index, void *dst, size_t nbytes) {
    qctx *c = ctx;
    const out_entry *e = &c->entries[index];
    out_group *g = e->role == OUT_COPY ? NULL : &c->groups[e->group];
    switch (e->role) {
    case OUT_FUSED:
        return mt_fused_write_fill(&c->fused, &g->fused, 1, MT_U8, e->part, dst, nbytes);
    case OUT_COPY:
        memcpy(dst, e->src->data, nbytes);
        mt_quant_drop_pages(e->src->data, nbytes);
        return 0;
    case OUT_FP8_DENSE: {
        float *w = mt_fp8_dequantize_tensor(c->m, g->t, c->fp8_block);
        if (!w) return -1;
        mt_convert(dst, g->dtype, w, MT_F32, (size_t)(g->t->shape[0] * g->t->shape[1]));
        free(w);
        mt_quant_drop_pages(g->t->data, (size_t)g->t->nbytes);
        return 0;
    }
    case OUT_DEQUANT: {
        mt_qweight q;
        if (mt_qweight_import(&q, c->cpu, g->t->name, &g->parts) != 0) return -1;
        if (g->dtype == MT_BF16) {
            mt_qweight_dequantize_rows_bf16_cpu(&q, dst, 0, q.out);
        } else {
            float *f = mt_xmalloc((size_t)(q.out * q.in) * sizeof(float));
            mt_qweight_dequantize_rows_cpu(&q, f, 0, q.out);
            mt_convert(dst, g->dtype, f, MT_F32, (size_t)(q.out * q.in));
            free(f);
        }
        mt_qweight_free(&q);
        return 0;
    }
    case OUT_QPART:
        if (e->part == 0) {
            cur_release(c);
            const mt_st_tensor *t = g->t;
            float *w = g->fp8 ? mt_fp8_dequantize_tensor(c->m, t, c->fp8_block) : NULL;
            if (g->fp8 && !w) return -1;
            int q = mt_qweight_quantize_from(&c->cur, c->be, t->name, w ? (const void *)w : t->data, g->dtype,
                                             t->shape[0], t->shape[1], c->type, c->blocksize, c->double_quant,
                                             w ? NULL : mt_quant_drop_pages);
            free(w);
            if (g->fp8) mt_quant_drop_pages(t->data, (size_t)t->nbytes);
            if (q != 0) return -1;
            c->cur_group = e->group;
            mt_bnb_export(&c->cur_ex, t->name, &c->cur);
            const mt_st_entry *a = &c->cur_ex.entries[c->cur_ex.n - 1], *b = &g->layout.entries[g->layout.n - 1];
            if (c->type != MT_QUANT_MXFP4 &&  // mxfp4 has no quant_state: nothing layout-dependent on the data
                (a->shape[0] != b->shape[0] || memcmp(a->data, b->data, (size_t)a->shape[0]) != 0)) {
                mt_error_set("'%s': quant_state changed between the two passes (%.*s vs %.*s)", t->name,
                             (int)a->shape[0], (const char *)a->data, (int)b->shape[0], (const char *)b->data);
                return -1;
            }
            c->n_quant++;
            c->quant_params += t->shape[0] * t->shape[1];
            c->quant_bytes += mt_qweight_bytes(&c->cur);
        }
        if (c->cur_group != e->group) {
            mt_error_set("'%s': parts written out of order", g->t->name);
            return -1;
        }
        memcpy(dst, c->cur_ex.entries[e->part].data, nbytes);
        if ((size_t)e->part + 1 == c->cur_ex.n) cur_release(c);
        return 0;
    }
    return -1;
}

// ---------------------------------------------------------------------------------------------
// Arguments

typedef struct {
    const char *model, *out, *backend;
    mt_quant type;
    int blocksize, double_quant;
    unsigned targets;
    double shard_size;
} qargs;

// The run options' table parses the flags (--quant-targets, --blocksize, --shard-size, ... as
// training reads them); quantize then refuses what it cannot write.
static int parse_args(qargs *a, mt_run_opts *o, int argc, char **argv) {
    memset(a, 0, sizeof *a);
    mt_run_opts_default(o);
    if (mt_run_opts_parse_cmd(o, argc, argv, "quantize", NULL) != 0) return -1;
    if (o->quant == MT_QUANT_NONE) {
        mt_error_set("--quant: 'none' writes nothing 4-bit (nf4, fp4, int4 or mxfp4)");
        return -1;
    }
    if (strcmp(o->backend, "cpu") != 0 && strcmp(o->backend, "cuda") != 0) {
        mt_error_set("--backend: '%s' is not cpu or cuda", o->backend);
        return -1;
    }
    if (o->shard_bytes < 1) {
        mt_error_set("--shard-size must be at least 1 byte");
        return -1;
    }
    if (!o->model[0] || !o->out[0]) {
        mt_error_set("--model and --out are required");
        return -1;
    }
    a->model = o->model, a->out = o->out, a->backend = o->backend;
    a->type = o->quant;
    a->blocksize = o->quant_blocksize;
    a->double_quant = o->quant == MT_QUANT_INT4 || o->quant == MT_QUANT_MXFP4 ? 0 : o->double_quant;
    a->targets = o->quant_targets;
    a->shard_size = o->shard_bytes;
    return 0;
}

// ---------------------------------------------------------------------------------------------
// Files beside the weights (tokenizer, generation config) are copied as they are.

static int copy_other_files(const char *from, const char *to) {
    DIR *d = opendir(from);
    if (!d) return 0;
    int rc = 0;
    struct dirent *de;
    while (rc == 0 && (de = readdir(d))) {
        const char *n = de->d_name;
        size_t len = strlen(n);
        if (n[0] == '.' || strcmp(n, "config.json") == 0 || strcmp(n, "SHA256SUMS") == 0 || strcmp(n, "model.safetensors.index.json") == 0 ||
            (len > 12 && strcmp(n + len - 12, ".safetensors") == 0))
            continue;
        char src[PATH_MAX], dst[PATH_MAX];
        struct stat st;
        snprintf(src, sizeof src, "%s/%s", from, n);
        snprintf(dst, sizeof dst, "%s/%s", to, n);
        if (stat(src, &st) != 0 || !S_ISREG(st.st_mode)) continue;
        char *data;
        size_t size;
        if (mt_read_file(src, (size_t)1 << 31, &data, &size) != 0 || mt_write_file_atomic(dst, data, size) != 0)
            rc = -1;
        else
            free(data);
    }
    closedir(d);
    return rc;
}

// config.json with the quantization_config of what was written. transformers replaces every
// Linear that llm_int8_skip_modules does not name (a module's own name, or a dotted prefix of
// its path), so modules left unquantized are named there: "gate" (the router's own name),
// "self_attn", "experts" with "shared_expert", "shared_expert_gate" (Qwen2-MoE's, always dense), and
// lm_head, which an explicit list must include.
// (A dense layer's mlp.*_proj has no name of its own to list: with the experts left out, a
// Qwen checkpoint with dense layers gets them quantized by transformers but stored dense here.)
static int write_config(const mt_model_config *in, const qargs *a, const char *path) {
    mt_model_config cfg = *in;
    cfg.fp8_block[0] = cfg.fp8_block[1] = 0;  // what is written is 4-bit or dense, never FP8
    // int4 is moetrain's own, mxfp4 not bitsandbytes': neither gets a bitsandbytes config
    cfg.quantized = a->type != MT_QUANT_INT4 && a->type != MT_QUANT_MXFP4;
    // gpt-oss's own quantization_config: its fused experts were written MXFP4 (plan_output)
    cfg.mxfp4 = mt_config_family(&cfg)->fused_experts && a->type == MT_QUANT_MXFP4 && (a->targets & MT_QTARGET_EXPERTS);
    if (cfg.quantized) {
        snprintf(cfg.quant_type, sizeof cfg.quant_type, "%s", mt_qformats[a->type].name);
        cfg.double_quant = a->double_quant;
    }
    if (mt_model_config_write(&cfg, path) != 0) return -1;
    // Qwen2-MoE's shared_expert_gate [1, H] is always stored dense: without its name here,
    // transformers makes it a 4-bit Linear whose weight the file does not have (4.57: "Cannot copy
    // out of meta tensor" on load).
    const char *shared_gate = mt_config_family(&cfg)->shared_gate;
    if (!cfg.quantized || ((a->targets & MT_QTARGET_ALL) == MT_QTARGET_ALL && !shared_gate)) return 0;
    char list[200] = "[\"lm_head\"";
    if (!(a->targets & MT_QTARGET_ROUTER)) strcat(list, ", \"gate\"");
    if (!(a->targets & MT_QTARGET_ATTN)) strcat(list, ", \"self_attn\"");
    if (!(a->targets & MT_QTARGET_EXPERTS)) strcat(list, ", \"experts\", \"shared_expert\"");
    if (shared_gate && (a->targets & MT_QTARGET_EXPERTS)) strcat(list, ", \"shared_expert_gate\"");
    strcat(list, "]");
    char *text;
    size_t len;
    if (mt_read_file(path, 1 << 20, &text, &len) != 0) return -1;
    const char *key = "\"llm_int8_skip_modules\": null";
    char *at = strstr(text, key);
    int rc = 0;
    if (at) {
        size_t out_len = len - strlen(key) + strlen("\"llm_int8_skip_modules\": ") + strlen(list);
        char *out = mt_xmalloc(out_len + 1);
        size_t pre = (size_t)(at - text);
        memcpy(out, text, pre);
        int k = sprintf(out + pre, "\"llm_int8_skip_modules\": %s", list);
        strcpy(out + pre + (size_t)k, at + strlen(key));
        rc = mt_write_file_atomic(path, out, strlen(out));
        free(out);
    }
    free(text);
    return rc;
}

// ---------------------------------------------------------------------------------------------

static int same_folder(const char *a, const char *b) {
    char ra[PATH_MAX], rb[PATH_MAX];
    return realpath(a, ra) && realpath(b, rb) && strcmp(ra, rb) == 0;
}

// A block-FP8 weight's scale, read with the weight and written nowhere; one without its weight sets
// *rc (as loading does).
static int fp8_scale_of_a_weight(const mt_st_model *m, const mt_st_tensor *t, int *rc) {
    char base[600];
    if (!mt_fp8_scale_base(t->name, base, sizeof base)) return 0;
    if (mt_st_model_find(m, base)) return 1;
    mt_error_set("%s: tensor '%s': a block-FP8 scale without its weight '%s'", m->files[t->file_index].path, t->name,
                 base);
    *rc = -1;
    return 0;
}

// Pass 1: the output entries, in input file order.
static int plan_output(qctx *c, const qargs *a, const mt_model_config *cfg, mt_st_entry **out_entries,
                       size_t *n_out) {
    const mt_st_model *m = c->m;
    size_t cap = m->n_tensors * 6 + 1, n = 0;
    mt_st_entry *ent = mt_xcalloc(cap, sizeof *ent);
    c->entries = mt_xcalloc(cap, sizeof *c->entries);
    c->groups = mt_xcalloc(m->n_tensors + 1, sizeof *c->groups);
    mt_backend *null_be = mt_backend_null_new();
    int ng = 0, rc = 0;
    // gpt-oss in MXFP4: transformers' layout, the fused experts only (attention and router dense)
    int fused_mxfp4 = mt_config_family(cfg)->fused_experts && a->type == MT_QUANT_MXFP4 &&
                      (a->targets & MT_QTARGET_EXPERTS);
    unsigned targets = a->targets;
    if (fused_mxfp4 && (targets & ~MT_QTARGET_EXPERTS)) {
        mt_info("quantize: %s's MXFP4 checkpoints hold only the experts in MXFP4 (transformers' layout): "
                "attention and the router are written as they are", cfg->model_type);
        targets = MT_QTARGET_EXPERTS;
    }
    c->fused = (mt_fused_write){.st = m, .fam = mt_config_family(cfg), .hidden = cfg->hidden,
                                .inter = cfg->intermediate};
    for (size_t f = 0; f < m->n_files && rc == 0; f++) {
        for (size_t i = 0; i < m->files[f].n_tensors && rc == 0; i++) {
            const mt_st_tensor *t = &m->files[f].tensors[i];
            if (mt_bnb_is_part_name(t->name)) continue;  // written with (or instead of) its weight
            if (cfg->fp8_block[0] && fp8_scale_of_a_weight(m, t, &rc)) continue;  // read with its weight
            if (rc) break;
            mt_bnb_parts parts;
            int pre = mt_bnb_find_parts(m, t->name, &parts);
            if (pre < 0) { rc = -1; break; }
            int want = (mt_quant_target_of(t->name) & targets) != 0;
            out_group *g = &c->groups[ng];
            g->t = t;
            if (pre) {
                mt_qweight q;  // validates the serialised weight (nothing is allocated on null)
                if (mt_qweight_import(&q, null_be, t->name, &parts) != 0) { rc = -1; break; }
                if (want && (q.type != a->type || q.double_quant != a->double_quant)) {
                    mt_error_set("'%s' is stored as %s%s; re-quantizing a 4-bit weight would compound its "
                                 "error: quantize from the original checkpoint, or ask for what is stored",
                                 t->name, mt_qformats[q.type].name, q.double_quant ? " with double quant" : "");
                    mt_qweight_free(&q);
                    rc = -1;
                    break;
                }
                if (want) {  // kept as stored, byte for byte
                    const mt_st_tensor *ps[] = {t, parts.absmax, parts.zero, parts.quant_map, parts.nested_absmax,
                                                parts.nested_quant_map, parts.quant_state};
                    for (size_t k = 0; k < MT_ARRAY_LEN(ps); k++) {
                        if (!ps[k]) continue;
                        ent[n] = (mt_st_entry){.name = ps[k]->name, .dtype = ps[k]->dtype, .ndim = ps[k]->ndim};
                        memcpy(ent[n].shape, ps[k]->shape, sizeof ps[k]->shape);
                        c->entries[n++] = (out_entry){.role = OUT_COPY, .src = ps[k]};
                    }
                    c->n_quant++;
                    c->quant_params += q.out * q.in;
                    c->quant_bytes += mt_q4_weight_bytes(q.type, q.out * q.in, q.blocksize, q.double_quant);
                } else {  // handed back dense, in the model's dtype
                    g->parts = parts;
                    g->dtype = cfg->torch_dtype;
                    ent[n] = (mt_st_entry){.name = t->name, .dtype = mt_st_dtype_of(g->dtype), .ndim = 2,
                                           .shape = {q.out, q.in}};
                    c->entries[n++] = (out_entry){.role = OUT_DEQUANT, .group = ng++};
                    c->n_dense++;
                }
                mt_qweight_free(&q);
                continue;
            }
            mt_dtype dt;
            float *deq = NULL;  // a block-FP8 weight's values: then quantized as a dense f32 weight
            if (strcmp(t->dtype, "F8_E4M3") == 0) {
                if (!(deq = mt_fp8_dequantize_tensor(m, t, cfg->fp8_block))) {  // checks its scale too
                    rc = -1;
                    break;
                }
                mt_quant_drop_pages(t->data, (size_t)t->nbytes);
                g->fp8 = 1, dt = MT_F32;
                if (!want) {  // not a target: written dense in the model's dtype
                    free(deq);
                    g->dtype = cfg->torch_dtype;
                    ent[n] = (mt_st_entry){.name = t->name, .dtype = mt_st_dtype_of(g->dtype), .ndim = 2,
                                           .shape = {t->shape[0], t->shape[1]}};
                    c->entries[n++] = (out_entry){.role = OUT_FP8_DENSE, .group = ng++};
                    c->n_dense++;
                    continue;
                }
            } else if (cfg->mxfp4 && strcmp(t->dtype, "U8") == 0) {
                mt_error_set("%s: '%s': the checkpoint's experts are MXFP4 already (quantization_config mxfp4); "
                             "quantize from a dense checkpoint, or train on this one as it is", m->files[f].path,
                             t->name);
                rc = -1;
                break;
            }
            if (!deq && mt_st_float_dtype(t->dtype, &dt) != 0) {
                mt_error_set("%s: '%s': wrong dtype %s (a dense checkpoint holds F32, BF16 or F16)", m->files[f].path,
                             t->name, t->dtype);
                rc = -1;
                break;
            }
            if (fused_mxfp4 && t->ndim == 3 && mt_fused_tensor_of(t->name, NULL) >= 0) {  // [E, in, rows] → blocks, scales
                g->fused = (mt_weight_desc){.kind = MT_WEIGHT_EXPERTS, .ndim = 3, .layer = -1, .expert = -1,
                                            .shape = {t->shape[0], t->shape[1], t->shape[2]}};
                snprintf(g->fused.name, sizeof g->fused.name, "%s", t->name);
                int k = mt_fused_write_entries(&g->fused, 1, NULL, g->fused_names, &ent[n]);
                if (k < 0 || mt_fused_write_check(&c->fused, &g->fused) != 0) {
                    rc = -1;
                    break;
                }
                for (int p = 0; p < k; p++) c->entries[n++] = (out_entry){.role = OUT_FUSED, .group = ng, .part = p};
                ng++;
                int64_t numel = t->shape[0] * t->shape[1] * t->shape[2];
                c->n_quant++;
                c->quant_params += numel;
                c->quant_bytes += (uint64_t)(numel / 2 + numel / MT_MXFP4_BLOCK);
                continue;
            }
            if (!want || t->ndim != 2) {
                ent[n] = (mt_st_entry){.name = t->name, .dtype = t->dtype, .ndim = t->ndim};
                memcpy(ent[n].shape, t->shape, sizeof t->shape);
                c->entries[n++] = (out_entry){.role = OUT_COPY, .src = t};
                c->n_dense++;
                continue;
            }
            mt_qweight q;  // the layout, on the null backend
            if (mt_qweight_quantize_from(&q, null_be, t->name, NULL, dt, t->shape[0], t->shape[1], a->type,
                                         a->blocksize, a->double_quant, NULL) != 0) {
                free(deq);
                rc = -1;
                break;
            }
            if (q.double_quant)
                q.offset = mt_q4_offset_from(deq ? (const void *)deq : t->data, dt, t->shape[0] * t->shape[1],
                                             q.blocksize, deq ? NULL : mt_quant_drop_pages);
            free(deq);
            g->dtype = dt;
            mt_bnb_export(&g->layout, t->name, &q);
            for (size_t k = 0; k < g->layout.n; k++) {  // all filled in pass 2, which checks that
                ent[n] = g->layout.entries[k];             // the quant_state did not change
                ent[n].data = NULL;
                c->entries[n++] = (out_entry){.role = OUT_QPART, .group = ng, .part = (int)k};
            }
            ng++;
            mt_qweight_free(&q);
        }
    }
    mt_backend_free(null_be);
    *out_entries = ent;
    *n_out = n;
    return rc;
}

int cmd_quantize(int argc, char **argv) {
    if (mt_args_want_help(argc, argv)) {
        quantize_usage(stdout);
        return MT_EXIT_OK;
    }
    qargs a;
    mt_run_opts o;
    if (parse_args(&a, &o, argc, argv) != 0) {
        fprintf(stderr, "moetrain quantize: %s\n", mt_error_get());
        return MT_EXIT_USAGE;
    }
    if (mt_is_dir(a.out) && same_folder(a.model, a.out)) {
        fprintf(stderr, "moetrain quantize: --out is the --model folder; write to another one\n");
        return MT_EXIT_USAGE;
    }
    mt_model_config cfg;
    if (mt_model_config_load(a.model, &cfg) != 0) {
        fprintf(stderr, "moetrain quantize: %s\n", mt_error_get());
        return MT_EXIT_ERROR;
    }
    mt_st_model m;
    if (mt_st_model_open(&m, a.model) != 0) {
        fprintf(stderr, "moetrain quantize: %s\n", mt_error_get());
        return MT_EXIT_ERROR;
    }
    qctx c;
    memset(&c, 0, sizeof c);
    c.m = &m;
    c.type = a.type;
    c.blocksize = a.blocksize;
    c.double_quant = a.double_quant;
    c.fp8_block[0] = cfg.fp8_block[0], c.fp8_block[1] = cfg.fp8_block[1];
    c.cur_group = -1;
    c.be = mt_backend_new(a.backend);
    c.cpu = mt_backend_cpu_new();
    int rc = c.be ? 0 : -1;
    mt_st_entry *entries = NULL;
    size_t n = 0;
    if (rc == 0) rc = plan_output(&c, &a, &cfg, &entries, &n);
    if (rc == 0) rc = mt_st_write_sharded(a.out, entries, n, (uint64_t)a.shard_size, fill, &c);
    cur_release(&c);
    if (rc == 0) rc = copy_other_files(a.model, a.out);
    char cfg_path[PATH_MAX];
    snprintf(cfg_path, sizeof cfg_path, "%s/config.json", a.out);
    if (rc == 0) rc = write_config(&cfg, &a, cfg_path);  // last: its presence marks a whole folder
    if (rc == 0) rc = mt_model_sums_write(a.out);         // then the checksums of what is there
    if (rc != 0) fprintf(stderr, "moetrain quantize: %s\n", mt_error_get());
    else
        printf("moetrain quantize: out=%s quant=%s double_quant=%d blocksize=%d quantized_tensors=%lld "
               "quantized_params=%lld quantized_bytes=%llu bits_per_param=%.4f dense_tensors=%lld\n",
               a.out, mt_qformats[a.type].name, a.double_quant,
               a.blocksize > 0 ? a.blocksize : mt_qformats[a.type].default_blocksize, (long long)c.n_quant,
               (long long)c.quant_params, (unsigned long long)c.quant_bytes,
               c.quant_params ? 8.0 * (double)c.quant_bytes / (double)c.quant_params : 0.0, (long long)c.n_dense);
    for (int g = 0; c.groups && c.groups[g].t; g++) mt_bnb_export_free(&c.groups[g].layout);
    free(c.groups);
    free(c.entries);
    free(entries);
    mt_backend_free(c.cpu);
    mt_backend_free(c.be);
    mt_st_model_close(&m);
    return rc == 0 ? MT_EXIT_OK : MT_EXIT_ERROR;
}
