// trainer/cmd/commands.h — the sub-commands of `moetrain`. Each takes the arguments after its
// name and returns the process exit code (core/common.h).
#pragma once

int cmd_train(int argc, char **argv);
int cmd_plan(int argc, char **argv);
int cmd_init(int argc, char **argv);
int cmd_demo(int argc, char **argv);
int cmd_quantize(int argc, char **argv);  // trainer/cmd/cmd_quantize.c
int cmd_verify(int argc, char **argv);    // trainer/cmd/cmd_verify.c
int cmd_not_built(const char *name, const char *issue);

// ---------------------------------------------------------------------------------------------
// eval, generate, merge (trainer/cmd/cmd_eval.c, cmd_generate.c, cmd_merge.c)
#include <stdint.h>

#include "model/mixtral.h"
#include "data/data.h"
#include "data/tokenizer.h"
#include "trainer/options.h"

int cmd_eval(int argc, char **argv);
int cmd_generate(int argc, char **argv);
int cmd_merge(int argc, char **argv);

// Builds the model of o->model on `be` with o->adapter (when set) applied, for inference:
//   * a PEFT adapter folder: lora mode with the adapter's r, alpha and rsLoRA, and the targets,
//     layers and experts its modules span; a LoRA of that span which the adapter lacks keeps
//     B = 0 and adds exactly nothing;
//   * a .safetensors of trained tensors (mt_model_save_trained): the mode its tensors imply
//     (full when it holds embeddings, norms or lm_head; unfreeze when expert weights; else
//     router), with the layers and experts it names.
// LoRA dropout is off. o's mode, targets, layers, experts and LoRA fields are set to what was
// built. 0, or -1 with an error.
int mt_model_load_for_inference(mt_model *m, mt_backend *be, mt_run_opts *o);

typedef struct mt_eval_result {
    double loss;        // mean cross-entropy over the loss tokens; the router aux loss is not in it
    double perplexity;  // exp(loss)
    int64_t tokens;     // loss tokens counted
    int64_t samples, batches;
    double aux;         // the router load-balancing (aux) loss, transformers' definition, mean over batches
} mt_eval_result;
// One pass over `d` (loaded with shuffle 0 and whole_epochs 1) in batches of B rows of S tokens.
// One line on stderr when `cmd` (train, eval) quantizes a dense checkpoint on load (--quant),
// saying how to keep it as stored.
void mt_note_quant_on_load(const mt_model_config *cfg, const mt_run_opts *o, const char *cmd);
int mt_eval_dataset(mt_model *m, mt_dataset *d, int B, int S, mt_eval_result *r);
// `moetrain eval` without its printing: the model (with o->adapter), the tokenizer, o->data with
// o->seq / o->batch / o->packing / o->overlong. 0, or -1 with an error.
int mt_eval_run(mt_run_opts *o, mt_eval_result *r);

typedef struct mt_gen_opts {
    int max_new_tokens;
    double temperature;  // 0: greedy (ties to the lowest id)
    double top_p;        // nucleus: the fewest most likely tokens whose probability reaches top_p
    uint64_t seed;       // sampling stream
    int32_t eos;         // stop after this id (not kept in out); -1: never
} mt_gen_opts;
// Appends up to max_new_tokens ids after prompt[0..n) to `out`; *hit_eos (may be NULL) says
// whether EOS ended it. 0, or -1 with an error (bad options, a token outside the vocabulary).
int mt_generate(mt_model *m, const int32_t *prompt, int n, const mt_gen_opts *g, mt_ids *out, int *hit_eos);

// What an adapter was trained on, for `generate` to render its prompt alike: the rows' forms and
// the chat template ("messages" rows). train writes it as training_template.json beside the
// adapter's files (OUT/adapter/) or beside trained.safetensors (OUT/); trainer/train_template.c.
typedef struct mt_train_template {
    char chat_template[32];  // mt_chat_style_name of the template used ("" when none)
    int64_t text, instruction, chat, pretokenized;
} mt_train_template;
#define MT_TRAIN_TEMPLATE_FILE "training_template.json"
int mt_train_template_write(const char *dir, const mt_train_template *t);
// From an --adapter (a folder, or a .safetensors file: its folder). 0 with *t zeroed when there is
// none (an adapter from elsewhere), -1 with an error when it is unreadable.
int mt_train_template_read(const char *adapter, mt_train_template *t);

// ---------------------------------------------------------------------------------------------
// What written models and adapters carry beside their tensors (trainer/cmd/model_record.c)

// DIR/SHA256SUMS (sha256sum -c format) over a model folder as a reader finds it: config.json, the
// tokenizer and generation files present, model.safetensors or the index and every shard it
// names. init, merge and quantize write it last; `moetrain verify DIR` checks it.
int mt_model_sums_write(const char *dir);

// The frozen base a training run used, recorded as DIR/moetrain_base.json beside its adapter (in
// its SHA256SUMS) or its trained.safetensors: the quantization applied on load (quant "none" when
// the base was used as stored: dense with --quant none, or a bnb-4bit checkpoint).
#define MT_BASE_RECORD "moetrain_base.json"
typedef struct mt_base_record {
    mt_quant quant;
    int blocksize, double_quant;
    unsigned quant_targets;
    char targets[64];   // as written: "experts,attn"
    char path[4400];    // the record's path (also when absent)
} mt_base_record;
int mt_base_record_write(const char *dir, const mt_model_config *cfg, const mt_run_opts *o);
// The record for --adapter (a folder, or a trained-tensor file: the folder holding it): 1 read,
// 0 none there, -1 with an error (unreadable or not ours).
int mt_base_record_read(const char *adapter, mt_base_record *r);
