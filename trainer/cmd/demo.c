// trainer/cmd/demo.c — `moetrain demo`: the whole tool on a CPU in a few minutes, nothing downloaded.
//
//  1. init a tiny Mixtral (configs/tiny.json's shape, built in) and pretrain it in full mode to
//     copy 3-letter words in Mixtral's chat format: "[INST] abc [/INST]abc</s>";
//  2. LoRA-fine-tune it (r=16, all experts, NF4 base) to capitalise the vowels of lower-case
//     words: "[INST] abe [/INST]AbE</s>";
//  3. score exact match on held-out words, and the loss, before and after; leave the adapter,
//     the metrics and the plots in one folder.
#include <math.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "core/common.h"
#include "core/fileio.h"
#include "core/rng.h"
#include "model/mixtral.h"
#include "trainer/cmd/commands.h"
#include "data/tokenizer.h"

enum { WORD = 3, TEST_WORDS = 100 };

static const char TINY_CONFIG[] =
    "{\"architectures\":[\"MixtralForCausalLM\"],\"model_type\":\"mixtral\",\"hidden_size\":64,"
    "\"intermediate_size\":128,\"num_hidden_layers\":2,\"num_attention_heads\":4,\"num_key_value_heads\":2,"
    "\"num_local_experts\":8,\"num_experts_per_tok\":2,\"vocab_size\":256,\"max_position_embeddings\":512,"
    "\"rope_theta\":10000.0,\"rms_norm_eps\":1e-05,\"router_aux_loss_coef\":0.02,\"tie_word_embeddings\":false,"
    "\"torch_dtype\":\"float32\",\"bos_token_id\":1,\"eos_token_id\":2,\"initializer_range\":0.02}";

static void word(mt_rng *r, char *w) {
    for (int i = 0; i < WORD; i++) w[i] = (char)('a' + mt_rng_next(r) % 26);
    w[WORD] = 0;
}

// A task word holds at least one vowel, so copying alone never scores.
static void task_word(mt_rng *r, char *w) {
    do word(r, w);
    while (!strpbrk(w, "aeiou"));
}

// The fine-tuning task: vowels capitalised, consonants kept.
static void capitalise_vowels(const char *w, char *u) {
    for (int i = 0; i <= WORD; i++) u[i] = (char)(w[i] && strchr("aeiou", w[i]) ? w[i] - 32 : w[i]);
}

// n chat samples: the assistant copies the word (pretraining), or capitalises its vowels (the
// task: five output tokens the base never produced, reached through the experts' LoRA).
static int write_task(const char *path, uint64_t seed, int n, int task) {
    mt_atomic_file f;
    if (mt_atomic_open(&f, path) != 0) return -1;
    mt_rng r;
    mt_rng_seed(&r, seed, 0);
    char w[WORD + 1], a[WORD + 1];
    for (int i = 0; i < n; i++) {
        if (task) task_word(&r, w);
        else word(&r, w);
        if (task) capitalise_vowels(w, a);
        else memcpy(a, w, sizeof a);
        fprintf(f.f, "{\"messages\":[{\"role\":\"user\",\"content\":\"%s\"},{\"role\":\"assistant\",\"content\":\"%s\"}]}\n",
                w, a);
    }
    return mt_atomic_commit(&f);
}

static int run(int argc, char **argv) {
    int rc = cmd_train(argc, argv);
    if (rc) mt_error_set("the training run above failed (exit %d)", rc);
    return rc;
}

static int copy_file(const char *from, const char *to) {
    char *buf;
    size_t len;
    if (mt_read_file(from, (size_t)1 << 32, &buf, &len) != 0) return -1;
    int rc = mt_write_file_atomic(to, buf, len);
    free(buf);
    return rc;
}

// Exact-match accuracy and mean loss on the held-out words, with or without the adapter.
static int score(const char *model_dir, const char *adapter, const char *test_jsonl, double *acc, double *loss) {
    mt_run_opts o;
    mt_run_opts_default(&o);
    o.mode = MT_MODE_LORA, o.lora_r = 16, o.targets = MT_TARGET_EXPERTS, o.quant = MT_QUANT_NF4;
    mt_backend *be = mt_backend_cpu_new();
    mt_model m;
    mt_tokenizer tok;
    mt_dataset data;
    memset(&data, 0, sizeof data);
    int rc = -1;
    mt_model_spec spec = mt_run_opts_model_spec(&o);
    if (mt_model_load(&m, be, model_dir, &spec) != 0) goto out_be;
    if (adapter && mt_model_load_adapter(&m, adapter) != 0) goto out_model;
    if (mt_tokenizer_open(&tok, model_dir, m.cfg.vocab, (int32_t)m.cfg.bos_token_id, (int32_t)m.cfg.eos_token_id))
        goto out_model;
    mt_data_opts d;
    mt_data_opts_default(&d);
    d.seq = 32, d.shuffle = 0, d.whole_epochs = 1;
    if (mt_dataset_load(&data, test_jsonl, &tok, &d) != 0) goto out_tok;
    mt_eval_result er;
    if (mt_eval_dataset(&m, &data, 16, 32, &er) != 0) goto out_data;
    *loss = er.loss;
    mt_rng r;
    mt_rng_seed(&r, 777, 0);  // the held-out words: the stream write_task used for the test set
    int right = 0;
    for (int i = 0; i < TEST_WORDS; i++) {
        char w[WORD + 1], want[WORD + 1], text[64];
        task_word(&r, w);
        capitalise_vowels(w, want);
        snprintf(text, sizeof text, "[INST] %s [/INST]", w);
        mt_ids ids = {0};
        mt_ids_push(&ids, (int32_t)m.cfg.bos_token_id);
        if (mt_tokenizer_encode(&tok, text, strlen(text), &ids) != 0) goto out_data;
        mt_gen_opts g = {.max_new_tokens = WORD + 1, .temperature = 0, .top_p = 1, .eos = (int32_t)m.cfg.eos_token_id};
        mt_ids got = {0};
        int hit_eos = 0;
        int rc_gen = mt_generate(&m, ids.v, (int)ids.n, &g, &got, &hit_eos);
        mt_ids_free(&ids);
        char *text_out = NULL;
        size_t glen;
        if (rc_gen != 0 || mt_tokenizer_decode(&tok, got.v, got.n, &text_out, &glen) != 0) {
            mt_ids_free(&got);
            goto out_data;
        }
        right += hit_eos && strcmp(text_out, want) == 0;  // the word, then EOS: nothing more
        free(text_out);
        mt_ids_free(&got);
    }
    *acc = right / (double)TEST_WORDS;
    rc = 0;
out_data:
    mt_dataset_free(&data);
out_tok:
    mt_tokenizer_free(&tok);
out_model:
    mt_model_free(&m);
out_be:
    mt_backend_free(be);
    return rc;
}

int cmd_demo(int argc, char **argv) {
    const char *out = "moetrain-demo";
    int pre_steps = 800, lora_steps = 1000;
    for (int i = 0; i < argc; i++) {
        if (strcmp(argv[i], "--help") == 0 || strcmp(argv[i], "-h") == 0) {
            printf("usage: moetrain demo [--out DIR] [--pretrain-steps N] [--lora-steps N]\n\n"
                   "Builds a tiny Mixtral, pretrains it to copy words, LoRA-fine-tunes it on an NF4 base to\n"
                   "capitalise their vowels, and prints the loss and exact-match accuracy before and after.\n"
                   "Defaults: --out ./moetrain-demo, --pretrain-steps 800, --lora-steps 1000.\n");
            return MT_EXIT_OK;
        }
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (v && strcmp(argv[i], "--out") == 0) out = v, i++;
        else if (v && strcmp(argv[i], "--pretrain-steps") == 0) pre_steps = atoi(v), i++;
        else if (v && strcmp(argv[i], "--lora-steps") == 0) lora_steps = atoi(v), i++;
        else {
            fprintf(stderr, "moetrain demo: unknown or incomplete argument '%s'\n", argv[i]);
            return MT_EXIT_USAGE;
        }
    }
    if (pre_steps < 1 || lora_steps < 1) {
        fprintf(stderr, "moetrain demo: step counts must be positive\n");
        return MT_EXIT_USAGE;
    }
    char p[8][4200], steps_pre[16], steps_lora[16];
    snprintf(p[0], sizeof p[0], "%s/tiny.json", out);
    snprintf(p[1], sizeof p[1], "%s/base", out);
    snprintf(p[2], sizeof p[2], "%s/copy.jsonl", out);
    snprintf(p[3], sizeof p[3], "%s/task.jsonl", out);
    snprintf(p[4], sizeof p[4], "%s/task-test.jsonl", out);
    snprintf(p[5], sizeof p[5], "%s/pretrain", out);
    snprintf(p[6], sizeof p[6], "%s/pretrained", out);
    snprintf(p[7], sizeof p[7], "%s/lora", out);
    snprintf(steps_pre, sizeof steps_pre, "%d", pre_steps);
    snprintf(steps_lora, sizeof steps_lora, "%d", lora_steps);
    char from[4300], to[4300], adapter[4300];
    double acc0, loss0, acc1, loss1;
    if (mt_mkdir_p(out) != 0 || mt_write_file_atomic(p[0], TINY_CONFIG, strlen(TINY_CONFIG)) != 0 ||
        write_task(p[2], 1, 3000, 0) != 0 || write_task(p[3], 2, 2000, 1) != 0 ||
        write_task(p[4], 777, TEST_WORDS, 1) != 0)
        goto fail;
    mt_info("demo 1/4: a tiny Mixtral (2 layers, 8 experts, top-2, byte vocabulary) in %s", p[1]);
    char *init_argv[] = {"--config", p[0], "--out", p[1], "--seed", "1"};
    if (cmd_init(6, init_argv) != 0) goto fail;
    mt_info("demo 2/4: full-mode pretraining to copy words (%d steps)", pre_steps);
    char *pre_argv[] = {"--model", p[1], "--data", p[2], "--out", p[5], "--mode", "full", "--quant", "none",
                        "--seq", "32", "--batch", "16", "--steps", steps_pre, "--lr", "5e-3", "--warmup", "20",
                        "--overwrite"};  // a demo run again replaces its own outputs
    if (run(21, pre_argv) != 0) goto fail;
    // The pretrained weights become a checkpoint of their own: full mode saved every tensor.
    snprintf(from, sizeof from, "%s/trained.safetensors", p[5]);
    snprintf(to, sizeof to, "%s/model.safetensors", p[6]);
    if (mt_mkdir_p(p[6]) != 0 || copy_file(from, to) != 0) goto fail;
    snprintf(to, sizeof to, "%s/config.json", p[6]);
    snprintf(from, sizeof from, "%s/config.json", p[1]);
    if (copy_file(from, to) != 0) goto fail;
    if (score(p[6], NULL, p[4], &acc0, &loss0) != 0) goto fail;
    mt_info("demo 3/4: before fine-tuning: vowel-capitalising exact match %.0f%%, loss %.3f", 100 * acc0, loss0);
    mt_info("demo 3/4: LoRA r=16 on every expert, NF4 base, %d steps", lora_steps);
    char *lora_argv[] = {"--model", p[6], "--data", p[3], "--out", p[7], "--mode", "lora", "--r", "16",
                         "--experts", "all", "--quant", "nf4", "--seq", "32", "--batch", "16",
                         "--steps", steps_lora, "--lr", "5e-3", "--warmup", "10", "--overwrite"};
    if (run(25, lora_argv) != 0) goto fail;
    snprintf(adapter, sizeof adapter, "%s/adapter", p[7]);
    if (score(p[6], adapter, p[4], &acc1, &loss1) != 0) goto fail;
    mt_info("demo 4/4: after fine-tuning:  vowel-capitalising exact match %.0f%%, loss %.3f", 100 * acc1, loss1);
    printf("\ndemo result: exact match %.0f%% -> %.0f%%, loss %.3f -> %.3f on %d held-out words\n", 100 * acc0,
           100 * acc1, loss0, loss1, TEST_WORDS);
    printf("demo outputs: %s (PEFT adapter), %s/metrics.jsonl\n", adapter, p[7]);
    // Plots need matplotlib; the demo says how to make them rather than failing without it.
    char cmd[9000];
    snprintf(cmd, sizeof cmd, "/usr/bin/python3 scripts/plot_metrics.py %s/metrics.jsonl >/dev/null 2>&1", p[7]);
    if (access("scripts/plot_metrics.py", R_OK) == 0 && system(cmd) == 0)
        printf("demo plots: %s/loss.png, %s/expert_load.png\n", p[7], p[7]);
    else
        printf("demo plots: run `python3 scripts/plot_metrics.py %s/metrics.jsonl` (needs matplotlib)\n", p[7]);
    return MT_EXIT_OK;
fail:
    fprintf(stderr, "moetrain demo: %s\n", mt_error_get());
    return MT_EXIT_ERROR;
}
