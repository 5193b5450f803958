// data/ — datasets (JSONL text/instruction/chat, MTTOK1 token files), packing and masking,
// tokenizers (SentencePiece through a C++ shim, byte-level BPE), chat templates. Uses core/;
// used by trainer/ (train, eval, generate). This is its main header.
//
// data/data.h — training data: JSONL in three forms or pre-tokenized token files, made into
// [B, S] batches of tokens, labels and attention mask, shuffled per epoch from the seed.
//
// JSONL: one JSON object per line, its form found per line (blank lines are skipped):
//   {"text": "..."}                                   every token in the loss
//   {"instruction": "...", "input": "...", "output": "..."}   ("input" may be "" or missing)
//                                                     only the output and its EOS in the loss
//   {"messages": [{"role": "system"|"user"|"assistant", "content": "..."}, ...]}
//                                                     only the assistant turns and their EOS
//                                                     (harmony, gpt-oss: also "developer" first,
//                                                     an assistant's "thinking", empty contents)
//   {"prompt": "...", "completion": "..."}            TRL's prompt-completion rows, as TRL's
//                                                     SFTTrainer reads them by default
//                                                     (completion_only_loss): <s> prompt completion
//                                                     </s>, only the completion and its EOS
//   {"prompt": [messages], "completion": [messages]}  TRL's conversational form: prompt + completion
//                                                     through the chat template, only the
//                                                     completion's assistant turns in the loss
//   {"conversations": [{"from": "system"|"human"|"gpt", "value": "..."}, ...]}
//                                                     ShareGPT (axolotl, FastChat): read as
//                                                     messages (human = user, gpt = assistant),
//                                                     only the gpt turns in the loss
// Other keys ("id", "source", ...) are ignored. A line that is not valid JSON, not an object,
// holds fields of no form or of two forms, misses a field, has an empty or non-string or
// non-UTF-8 field, an unknown role, or a conversation that does not alternate user/assistant
// (after an optional leading system message) or has no assistant turn, is an error naming the
// file and the line: the load fails; nothing is skipped silently.
//
// Token layout of one sample (the data layer adds BOS/EOS; the tokenizer never does):
//   text:         <s> text </s>
//   instruction:  <s> PROMPT output </s>      PROMPT per opts.prompt (--instruction-template);
//                                             Alpaca's by default (chat_template.c):
//       "Below is an instruction that describes a task, paired with an input that provides
//        further context. Write a response that appropriately completes the request.\n\n
//        ### Instruction:\n{instruction}\n\n### Input:\n{input}\n\n### Response:\n"
//     without an input: "Below is an instruction that describes a task. Write a response that
//        appropriately completes the request.\n\n### Instruction:\n{instruction}\n\n### Response:\n"
//     MT_PROMPT_ALPACA_SHORT drops the first paragraph (for byte-level tiny models, where those
//     ~150 bytes would fill the sequence).
//   messages:     the model's chat template (opts.chat; chat_template.c), Mixtral-8x7B-Instruct's
//     by default:
//       <s>[INST] {system}\n\n{user1} [/INST]{assistant1}</s>[INST] {user2} [/INST]{assistant2}</s>
//     ChatML (Qwen): <|im_start|>{role}\n{content}<|im_end|>\n per message, the assistant's
//       content and its <|im_end|> in the loss; Tulu (OLMoE-Instruct): {bos_token}<|user|>\n{user}\n
//       <|assistant|>\n{assistant}{eos_token}\n, the assistant's content and eos_token in the loss.
// BOS is inserted only when the tokenizer has one (tokenizer.h: BPE models have none).
// Each text run is encoded separately (prompt, completion), so the loss boundary falls on a
// token boundary; SentencePiece then gives each run its "▁" prefix, as mistral-common does.
// Labels: the token where it is in the loss, −100 elsewhere. The first token of a sample (BOS)
// is never a target. The model shifts labels by one itself (transformers' convention).
//
// Pre-tokenized token file ("MTTOK1"), little-endian:
//   offset 0   char[6]  "MTTOK1"
//   offset 6   u16      flags: bit 0 = a loss mask follows each sample's ids; other bits 0
//   offset 8   u64      number of samples
//   then per sample:  u32 length L, int32 ids[L], and with bit 0: u8 mask[L] (1 = in the loss,
//                     0 = not); without it every token is in the loss
// and nothing after the last sample. Samples are taken as they are (no BOS/EOS added); the
// first token of each is still never a target. Every length is checked against the file's size
// before it is read; ids must lie in [0, vocab), mask bytes in {0, 1}.
//
// Length: a sample longer than opts.seq is truncated (its first seq tokens kept), dropped, or
// refused (an error naming it), per opts.overlong, and counted. Memory per sample is O(seq), not
// O(line): a JSONL string is kept up to mt_data_string_cap() decoded bytes (more than seq tokens
// of any tokenizer) and only scanned beyond (line_reader.h); a sample with a string cut there is
// overlong whatever its kept text gives. Tokenizing stops once a sample holds seq + 1 tokens
// (plus its template's): the text beyond is only checked (UTF-8, reserved bytes), not encoded. A
// token-file sample is read up to seq + 1 ids; the rest of it is read in fixed pieces to check. A sample with no tokens, or no
// token in the loss (say a prompt truncated away), is dropped and counted. No usable sample
// left → an error.
//
// Batches: tokens, labels, mask, each [B, S] row-major int32. Padding is on the right: token 0
// (pad), label −100, mask 0. Without packing a row holds one sample. With packing a row holds
// as many whole samples as fit, in shuffled order (a sample is never split over two rows; the
// rest of the row is padding). Attention CAN cross document boundaries inside a packed row:
// the attention interface masks only padding, so a token attends causally to the earlier
// documents of its row. No loss crosses a boundary: each document's first token has label −100,
// so the previous document's last token is never trained to predict it.
//
// Order: epoch e visits every sample once, in a permutation drawn from (seed, e) with
// core/rng.h (identity when shuffle is off); a packed row never holds samples of two epochs.
// The cursor {epoch, index} is the whole position: the trainer saves it, and next_batch from a
// restored cursor continues exactly as the uninterrupted run would.
#pragma once
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "data/tokenizer.h"

#ifdef __cplusplus
extern "C" {
#endif

#define MT_LABEL_IGNORE (-100)

typedef enum { MT_OVERLONG_TRUNCATE, MT_OVERLONG_DROP, MT_OVERLONG_REFUSE } mt_overlong;
// How an instruction row becomes a prompt (--instruction-template; chat_template.c):
//   ALPACA        Stanford Alpaca's preamble and "### Instruction/Input/Response" headers (default)
//   ALPACA_SHORT  the same without the first paragraph (tests, byte-level tiny models)
//   NONE          no preamble or headers: "{instruction}\n" or "{instruction}\n\n{input}\n"
//   CHAT          a user turn "{instruction}" or "{instruction}\n\n{input}" and the output as the
//                 assistant's reply, through the model's chat template (opts.chat)
typedef enum { MT_PROMPT_ALPACA, MT_PROMPT_ALPACA_SHORT, MT_PROMPT_NONE, MT_PROMPT_CHAT } mt_prompt_style;

// Chat templates (chat_template.c). NONE: no template known (a BPE model whose
// tokenizer_config.json has none, or one we do not recognise): a chat sample is then an error
// carrying `why`, which suggests --chat-template.
typedef enum {
    MT_CHAT_MIXTRAL, MT_CHAT_CHATML, MT_CHAT_QWEN, MT_CHAT_TULU, MT_CHAT_QWEN2, MT_CHAT_QWEN3, MT_CHAT_OLMO,
    MT_CHAT_HARMONY, MT_CHAT_NONE
} mt_chat_style;
typedef struct mt_chat_template {
    mt_chat_style style;
    char bos_token[128], eos_token[128];  // tokenizer_config.json's strings, for the templates that
                                          // print them (tulu); "" when it has none
    char date[16];                         // harmony's "Current date: " (YYYY-MM-DD; mt_chat_date_set);
                                           // "" renders today's local date, as transformers does
    char why[1024];                        // style NONE: the message a chat sample fails with
    char source[256];                      // where the style came from, for the data line:
                                           // "tokenizer_config.json", "--chat-template", "built-in
                                           // for model_type X (...)"
} mt_chat_template;

typedef struct mt_data_opts {
    int64_t seq;             // longest sample kept (--seq)
    mt_overlong overlong;
    int packing;             // 1: several whole samples per row
    int shuffle;             // 0: file order in every epoch (eval)
    uint64_t seed;
    mt_prompt_style prompt;  // instruction form
    mt_chat_template chat;   // messages form (default: Mixtral's)
    int whole_epochs;        // 1: a batch never spans two epochs; rows past the end of an epoch
                             // are padding (eval: one pass, no sample twice)
    uint64_t max_line_bytes; // --max-line-bytes: a JSONL line keeping more than this (its strings
                             // kept only to mt_data_string_cap) is refused (line_reader.h)
} mt_data_opts;

#define MT_MAX_LINE_BYTES_DEFAULT (64ull << 20)

// seq 512, truncate, no packing, shuffle on, seed 0, Alpaca prompt, Mixtral chat, whole_epochs 0,
// max_line_bytes 64 MiB.
void mt_data_opts_default(mt_data_opts *o);
int mt_overlong_parse(const char *text, mt_overlong *out);  // "truncate" | "drop" | "refuse"
const char *mt_overlong_name(mt_overlong m);

typedef struct mt_data_stats {
    int64_t lines;             // JSONL lines holding a sample, or token-file samples read
    int64_t blank_lines;       // skipped blank JSONL lines
    int64_t text, instruction, chat, pretokenized;  // samples read, by form
    int64_t prompt_completion, sharegpt;            // (chat counts "messages" rows only)
    int64_t samples;           // kept
    int64_t truncated;         // kept, cut to seq (the end of its text or answer lost)
    int64_t dropped_overlong;  // overlong with MT_OVERLONG_DROP
    int64_t dropped_empty;     // no tokens (e.g. whitespace SentencePiece normalises away)
    int64_t dropped_truncated; // cut to seq with nothing left in the loss (the prompt filled seq)
    int64_t dropped_masked;    // nothing in the loss to begin with (a token file's all-0 mask)
    int64_t tokens;            // in kept samples
    int64_t loss_tokens;       // of those, with a label
    int64_t longest;           // longest kept sample
} mt_data_stats;

typedef struct mt_dataset {
    char source[1024];
    mt_data_opts opts;
    mt_data_stats stats;
    int64_t n;          // samples kept
    int64_t *offsets;   // [n + 1]: sample i is tokens[offsets[i] .. offsets[i+1])
    int32_t *tokens;    // all samples, concatenated
    int32_t *labels;    // same layout: token or MT_LABEL_IGNORE
    int64_t *perm;      // the order of epoch perm_epoch (cache)
    int64_t perm_epoch; // -1: none yet
} mt_dataset;

typedef struct mt_data_cursor {
    int64_t epoch;   // epochs completed
    int64_t index;   // position in this epoch's order, [0, n)
} mt_data_cursor;

// Reads `path`: a token file when it starts with "MTTOK1", else JSONL, tokenized with `tok`
// (whose vocab also bounds token-file ids). 0, or -1 with an error naming the file and the line
// (or sample). The dataset is zeroed first, and freed again on -1; mt_dataset_free is safe
// either way.
int mt_dataset_load(mt_dataset *d, const char *path, const mt_tokenizer *tok,
                    const mt_data_opts *opts);
void mt_dataset_free(mt_dataset *d);
// Decoded bytes of a JSONL string kept for a sample of `seq` tokens with this tokenizer: twice
// what seq + 2 of its longest tokens span, plus 4 KiB. The data path's host memory per sample is
// a few times this (plan counts it).
uint64_t mt_data_string_cap(const mt_tokenizer *tok, int64_t seq);
// Host memory the loader works in besides the samples it keeps (8 bytes a kept token, 8 a
// sample): the read buffer; a line as kept; cJSON's tree of it; a string's text, its NFC copy
// and the BPE encoder's scratch (~40 bytes a byte); a sample's ids and labels. *typical: for
// lines whose size is their strings (each kept to the cap, mt_data_string_cap with tokens of
// max_token_bytes); returned: the bound, a line of --max-line-bytes made of one-digit numbers
// (cJSON spends a 64-byte node on every 2 bytes of it).
uint64_t mt_data_work_bytes(int64_t seq, uint64_t max_line_bytes, uint64_t max_token_bytes, uint64_t *typical);

// Sample i: its tokens and labels (pointers into the dataset) and its length.
int64_t mt_dataset_sample(const mt_dataset *d, int64_t i, const int32_t **tokens,
                          const int32_t **labels);

// Fills tokens/labels/mask [B, S] from the cursor on and advances it. S must hold the longest
// sample (stats.longest ≤ S). Returns the number of rows holding data: B, or fewer only with
// opts.whole_epochs at the end of an epoch (the rest are padding); -1 with an error for bad
// arguments or a cursor that does not fit this dataset.
int mt_data_next_batch(mt_dataset *d, mt_data_cursor *c, int B, int S, int32_t *tokens,
                       int32_t *labels, int32_t *mask);
// Rows one epoch makes at row length S: n without packing; with packing, as packed in that
// epoch's order. -1 with an error when a sample is longer than S.
int64_t mt_data_epoch_rows(mt_dataset *d, int64_t epoch, int S);
// A hash of the samples and of what decides their order (seed, shuffle, packing): the trainer
// keeps it with a saved cursor and refuses to resume on different data.
uint64_t mt_dataset_fingerprint(const mt_dataset *d);

// "samples=… tokens=… loss_tokens=… truncated=… dropped_overlong=… dropped_empty=…
//  dropped_truncated=… dropped_masked=… longest=… (text=… instruction=… chat=… prompt_completion=…
//  sharegpt=… pretokenized=…)" for the log: every sample read is kept or dropped for one reason.
void mt_data_stats_format(const mt_data_stats *s, char *buf, size_t n);
// The data line's tail for a dataset loaded with opts: the instruction template (when instruction
// rows were read), the chat template and where it came from, and, when --seq cut samples, a hint
// naming --seq (and the instruction template's preamble when it is the long one). "" when none.
void mt_data_notes_format(const mt_data_stats *s, const mt_data_opts *opts, char *buf, size_t n);
// "alpaca" | "none" | "chat" (and "alpaca-short") → style; -1 with an error listing them.
int mt_prompt_style_parse(const char *name, mt_prompt_style *out);
const char *mt_prompt_style_name(mt_prompt_style s);

// Writes a token file (format above) atomically: n samples, sample i being
// ids[offsets[i] .. offsets[i+1]); mask (same layout, 0/1) may be NULL.
int mt_tokfile_write(const char *path, int64_t n, const int64_t *offsets, const int32_t *ids,
                     const uint8_t *mask);
// Writes the dataset's kept samples, with their loss mask (label ≠ −100), as a token file.
int mt_dataset_save_tokens(const mt_dataset *d, const char *path);

// --- sample templates (chat_template.c), also for `moetrain generate` ---------------------
// A formatted sample is a sequence of segments: a run of text to encode, or BOS/EOS, each in
// the loss or not. Renderers call emit() in order; emit returns 0 or -1 (which stops them).
typedef enum { MT_SEG_TEXT, MT_SEG_BOS, MT_SEG_EOS } mt_seg_kind;
typedef int (*mt_seg_fn)(void *ctx, mt_seg_kind kind, const char *text, size_t len, int in_loss);

typedef struct mt_chat_msg {
    const char *role;     // "system" (first only), "user", "assistant"; harmony: "developer" (first only)
    const char *content;  // non-empty (harmony: may be empty)
    int no_loss;          // an assistant turn kept out of the loss (a TRL prompt's own replies)
    const char *thinking; // an assistant's reasoning (harmony's analysis channel); NULL: none
} mt_chat_msg;

// Mixtral-8x7B-Instruct's template. Roles must be [system] user assistant user assistant ...;
// a conversation may end on a user turn (a generation prompt, ending "[/INST]"). With
// need_assistant set, a conversation without an assistant turn is refused. 0, or -1 with an
// error naming the message (the caller prefixes file and line).
int mt_chat_render(const mt_chat_msg *msgs, int n, int need_assistant, mt_seg_fn emit, void *ctx);
// The same rules, in template t's format; a conversation ending on a user turn gets the
// template's generation prompt (add_generation_prompt=True). Equal, as text, to transformers'
// apply_chat_template on the template strings listed in chat_template.c.
int mt_chat_render_template(const mt_chat_template *t, const mt_chat_msg *msgs, int n,
                            int need_assistant, mt_seg_fn emit, void *ctx);
// The turn order every template checks (chat_template.c): message i (role known, user or
// assistant flags given) after the `first` leading ones alternates user/assistant, user first;
// `lead` names what may lead ("system", "system or developer"). Then, over the whole
// conversation: a user message, and an assistant turn when need_assistant. 0 or -1 with an error.
int mt_chat_check_turn(const mt_chat_msg *msg, int i, int first, int is_user, int is_asst, const char *lead);
int mt_chat_check_turns_end(int n, int first, int assistants, int need_assistant);
// gpt-oss's harmony template (chat_harmony.c), called by mt_chat_render_template.
int mt_chat_render_harmony(const mt_chat_template *t, const mt_chat_msg *msgs, int n, int need_assistant,
                           mt_seg_fn emit, void *ctx);
// --chat-date: "" → today's local date, else YYYY-MM-DD, into t->date. -1 with an error naming the flag.
int mt_chat_date_set(mt_chat_template *t, const char *flag);
// "mixtral" | "chatml" | "qwen" | "qwen2" | "tulu" | "harmony" … → style; -1 with an error listing them.
int mt_chat_style_parse(const char *name, mt_chat_style *out);
const char *mt_chat_style_name(mt_chat_style s);
// Which known template a tokenizer_config.json chat_template string is (compared with Jinja's
// whitespace inside {{ }} and {% %} ignored, the text between them exact). 0, or -1 when none.
int mt_chat_template_recognise(const char *jinja, mt_chat_style *out);
// Fills t for a model folder: `flag` ("" or "auto": from tokenizer_config.json's chat_template;
// else a style name) and tokenizer_config.json's bos_token/eos_token. No chat_template: the
// family's built-in for SentencePiece and byte tokenizers (config.json's model_type: mixtral →
// mixtral, qwen2_moe → qwen, qwen3_moe → qwen3, olmoe → tulu; Mixtral's when none is known), NONE
// for BPE; an unrecognised one: NONE (SentencePiece: Mixtral's, with a warning). t->source says
// which. -1 with an error only for a bad flag or an unreadable tokenizer_config.json.
int mt_chat_template_load(mt_chat_template *t, const char *model_dir, const char *flag,
                          mt_tokenizer_kind kind);
// The instruction prompt in `style` (input may be NULL or ""), then output and EOS in the loss;
// output NULL renders the prompt alone (generation). MT_PROMPT_CHAT renders through `chat`
// (NULL: an error), the others ignore it.
int mt_instruction_render(const char *instruction, const char *input, const char *output,
                          mt_prompt_style style, mt_seg_fn emit, void *ctx);
int mt_instruction_render_chat(const char *instruction, const char *input, const char *output,
                               mt_prompt_style style, const mt_chat_template *chat, mt_seg_fn emit,
                               void *ctx);

#ifdef __cplusplus
}
#endif
