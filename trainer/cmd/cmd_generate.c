// trainer/cmd/cmd_generate.c — `moetrain generate`: greedy decoding or temperature + nucleus
// sampling from a prompt, with or without an adapter.
//
// Known cost: there is no KV cache. Every new token re-runs the whole forward over the prompt
// and everything generated so far (O(n²) attention, n forwards), which is what a tiny demo model
// can afford and a Mixtral-size one cannot; a cache is the fix when generation must be fast.
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "core/common.h"
#include "core/rng.h"
#include "core/threads.h"
#include "trainer/cmd/commands.h"

static void generate_usage(FILE *out) {
    fprintf(out,
            "usage: moetrain generate --model DIR --prompt TEXT [--adapter DIR|FILE.safetensors]\n"
            "                         [--max-new-tokens N] [--temperature T] [--top-p P] [--seed S]\n"
            "                         [--quant nf4|fp4|int4|none] [--chat-template NAME | --raw]\n\n"
            "Encodes the prompt, then appends up to N tokens (default 64), stopping at EOS, and prints\n"
            "the continuation and a newline. The prompt is rendered as the adapter was trained: an\n"
            "adapter trained on \"messages\" rows gets TEXT as a user turn in the chat template it was\n"
            "trained with (and the template's generation prompt), one trained on instruction rows the\n"
            "Alpaca prompt; --chat-template NAME renders TEXT through that template whatever the\n"
            "adapter; --raw (and a model without an adapter) encodes BOS + TEXT as given. --temperature 0 (default) is greedy; above 0, tokens are sampled from\n"
            "softmax(logits / T) restricted to the most likely ones whose probability reaches --top-p\n"
            "(default 1: all), reproducibly for a --seed.\n");
}

typedef struct {
    int32_t id;
    double p;
} cand;

static int cand_desc(const void *a, const void *b) {
    const cand *x = a, *y = b;
    if (x->p != y->p) return x->p > y->p ? -1 : 1;
    return x->id < y->id ? -1 : x->id > y->id;
}

// The next id from one row of logits [V].
static int32_t pick(const float *logits, int V, const mt_gen_opts *g, mt_rng *rng, cand *c) {
    int32_t best = 0;
    for (int i = 1; i < V; i++)
        if (logits[i] > logits[best]) best = i;  // ties: the lowest id
    if (g->temperature <= 0) return best;
    double sum = 0, mx = logits[best];
    for (int i = 0; i < V; i++) {
        c[i].id = i;
        c[i].p = exp(((double)logits[i] - mx) / g->temperature);
        sum += c[i].p;
    }
    qsort(c, (size_t)V, sizeof *c, cand_desc);
    // nucleus: the fewest candidates whose probability reaches top_p (at least one)
    int keep = 0;
    double mass = 0;
    while (keep < V && (keep == 0 || mass < g->top_p * sum)) mass += c[keep++].p;
    double u = (double)mt_rng_uniform(rng) * mass, acc = 0;
    for (int i = 0; i < keep; i++) {
        acc += c[i].p;
        if (u < acc) return c[i].id;
    }
    return c[keep - 1].id;
}

int mt_generate(mt_model *m, const int32_t *prompt, int n, const mt_gen_opts *g, mt_ids *out, int *hit_eos) {
    if (hit_eos) *hit_eos = 0;
    if (n < 1) {
        mt_error_set("generate: the prompt is empty (it holds BOS at least)");
        return -1;
    }
    if (g->max_new_tokens < 0 || !(g->temperature >= 0) || !(g->top_p > 0 && g->top_p <= 1)) {
        mt_error_set("generate: needs --max-new-tokens >= 0, --temperature >= 0 and 0 < --top-p <= 1");
        return -1;
    }
    int V = (int)m->cfg.vocab, cap = n + g->max_new_tokens, rc = 0;
    int32_t *seq = mt_xmalloc((size_t)cap * sizeof(int32_t)), *labels = mt_xmalloc((size_t)cap * sizeof(int32_t));
    memcpy(seq, prompt, (size_t)n * sizeof(int32_t));
    for (int i = 0; i < cap; i++) labels[i] = -100;
    cand *c = g->temperature > 0 ? mt_xmalloc((size_t)V * sizeof(cand)) : NULL;
    float *row = mt_xmalloc((size_t)V * sizeof(float));  // the last position's logits
    mt_rng rng;
    mt_rng_seed(&rng, g->seed, mt_hash_string("generate"));
    for (int len = n; len < cap; len++) {
        if (len >= m->cfg.max_positions) {
            mt_warn("generate: stopped at max_position_embeddings (%lld tokens)", (long long)m->cfg.max_positions);
            break;
        }
        mt_threads_adapt();  // the cores others leave free (core/threads.h)
        mt_batch b = {1, len, seq, labels, NULL};
        mt_loss loss;
        if (mt_model_forward(m, &b, &loss) != 0) {
            rc = -1;
            break;
        }
        if (mt_model_logits(m, len - 1, 1, row) != 0) {
            rc = -1;
            break;
        }
        int32_t id = pick(row, V, g, &rng, c);
        if (id == g->eos) {
            if (hit_eos) *hit_eos = 1;
            break;
        }
        seq[len] = id;
        mt_ids_push(out, id);
    }
    free(c), free(row), free(seq), free(labels);
    return rc;
}

// A rendered prompt's segments as ids: BOS where the tokenizer adds one, EOS, encoded text.
typedef struct {
    const mt_tokenizer *tok;
    mt_ids *ids;
} gen_prompt;

static int gen_emit(void *ctx, mt_seg_kind kind, const char *text, size_t len, int in_loss) {
    (void)in_loss;
    gen_prompt *g = ctx;
    if (kind == MT_SEG_BOS) {
        if (g->tok->add_bos) mt_ids_push(g->ids, g->tok->bos);
        return 0;
    }
    if (kind == MT_SEG_EOS) {
        mt_ids_push(g->ids, g->tok->eos);
        return 0;
    }
    return mt_tokenizer_encode(g->tok, text, len, g->ids);
}

int cmd_generate(int argc, char **argv) {
    if (mt_args_want_help(argc, argv)) {
        generate_usage(stdout);
        return MT_EXIT_OK;
    }
    mt_run_opts o;
    mt_run_opts_default(&o);
    mt_opt_pairs given = {0};
    int bad = mt_run_opts_parse_cmd(&o, argc, argv, "generate", &given);
    int template_given = mt_opt_pairs_get(&given, "chat-template") != NULL;
    mt_opt_pairs_free(&given);
    if (bad) {
        fprintf(stderr, "moetrain generate: %s\n", mt_error_get());
        return MT_EXIT_USAGE;
    }
    if (o.raw && template_given) {
        fprintf(stderr, "moetrain generate: --raw and --chat-template exclude each other\n");
        return MT_EXIT_USAGE;
    }
    if (!o.model[0]) {
        fprintf(stderr, "moetrain generate: --model is required\n");
        generate_usage(stderr);
        return MT_EXIT_USAGE;
    }
    if (strcmp(o.backend, "cpu") != 0) {
        fprintf(stderr, "moetrain generate: --device %s: generate runs on the cpu backend\n", o.backend);
        return MT_EXIT_USAGE;
    }
    mt_gen_opts g = {o.max_new_tokens, o.temperature, o.top_p, o.seed, -1};
    if (!(g.top_p > 0 && g.top_p <= 1)) {
        fprintf(stderr, "moetrain generate: --top-p must be in (0, 1]\n");
        return MT_EXIT_USAGE;
    }
    mt_model_config cfg;
    mt_tokenizer tok;
    if (mt_model_config_load(o.model, &cfg) != 0 ||
        mt_tokenizer_open(&tok, o.model, cfg.vocab, (int32_t)cfg.bos_token_id, (int32_t)cfg.eos_token_id) != 0) {
        fprintf(stderr, "moetrain generate: %s\n", mt_error_get());
        return MT_EXIT_ERROR;
    }
    g.eos = tok.eos;
    mt_ids prompt = {0}, out = {0};
    // How the adapter was trained (train writes it): its rows' forms and chat template.
    mt_train_template rec = {0};
    if (!o.raw && o.adapter[0] && mt_train_template_read(o.adapter, &rec) != 0) {
        fprintf(stderr, "moetrain generate: %s\n", mt_error_get());
        mt_tokenizer_free(&tok);
        return MT_EXIT_ERROR;
    }
    const char *chat = o.raw ? NULL : template_given ? o.chat_template : rec.chat > 0 && rec.chat >= rec.instruction
                                                                          ? rec.chat_template : NULL;
    int alpaca = !o.raw && !chat && rec.instruction > 0;
    int rc = MT_EXIT_ERROR, hit_eos = 0;
    mt_backend *be = mt_backend_cpu_new();
    mt_model m;
    int loaded = 0;
    char *text = NULL;
    size_t text_len;
    gen_prompt gp = {&tok, &prompt};
    if (chat) {
        mt_chat_template ct;
        mt_chat_msg msg = {.role = "user", .content = o.prompt};
        if (mt_chat_template_load(&ct, o.model, chat, tok.kind) != 0 || mt_chat_date_set(&ct, o.chat_date) != 0 ||
            mt_chat_render_template(&ct, &msg, 1, 0, gen_emit, &gp) != 0)
            goto done;
        fprintf(stderr, "generate: the prompt as a user turn in the %s chat template%s (--raw: as given)\n",
                chat, template_given ? "" : ", as the adapter was trained");
    } else if (alpaca) {
        if (mt_instruction_render(o.prompt, NULL, NULL, MT_PROMPT_ALPACA, gen_emit, &gp) != 0) goto done;
        fprintf(stderr, "generate: the prompt as the instruction of the Alpaca template, as the adapter was trained "
                        "(--raw: as given)\n");
    } else {
        if (tok.add_bos) mt_ids_push(&prompt, tok.bos);  // BPE models have none unless their config adds it
        if (mt_tokenizer_encode(&tok, o.prompt, strlen(o.prompt), &prompt) != 0) goto done;
    }
    if (mt_model_load_for_inference(&m, be, &o) != 0) goto done;
    loaded = 1;
    if (mt_generate(&m, prompt.v, (int)prompt.n, &g, &out, &hit_eos) != 0) goto done;
    if (mt_tokenizer_decode(&tok, out.v, out.n, &text, &text_len) != 0) goto done;
    fwrite(text, 1, text_len, stdout);
    if (!text_len || text[text_len - 1] != '\n') printf("\n");  // the output ends a line, once
    fflush(stdout);
    fprintf(stderr, "generate: prompt_tokens=%zu new_tokens=%zu stop=%s mode=%s quant=%s\n", prompt.n, out.n,
            hit_eos ? "eos" : "max_new_tokens", mt_mode_name(o.mode), mt_quant_name(o.quant));
    rc = MT_EXIT_OK;
done:
    if (rc != MT_EXIT_OK) fprintf(stderr, "moetrain generate: %s\n", mt_error_get());
    free(text);
    if (loaded) mt_model_free(&m);
    mt_backend_free(be);
    mt_ids_free(&prompt), mt_ids_free(&out);
    mt_tokenizer_free(&tok);
    return rc;
}
