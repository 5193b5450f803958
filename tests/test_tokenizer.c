// Tokenizers: the byte-level vocabulary, the selection rule, and SentencePiece through the shim
// on a tiny model trained here at test time (no model file is shipped or downloaded).
#include <criterion/criterion.h>
#include <string.h>
#include <unistd.h>

#include "core/common.h"
#include "tests/test_util.h"
#include "data/data.h"
#include "data/tokenizer.h"
#ifdef MT_SENTENCEPIECE
#include "data/sentencepiece_shim.h"
#endif

static void write_text(const char *path, const char *text) {
    FILE *f = fopen(path, "wb");
    cr_assert(f, "cannot write %s", path);
    fputs(text, f);
    fclose(f);
}

Test(tokenizer, bytes_round_trip_utf8) {
    mt_tokenizer t;
    cr_assert_eq(mt_tokenizer_init_bytes(&t, 256, 1, 2), 0, "%s", mt_error_get());
    const char *text = "h\xc3\xa9llo w\xc3\xb6rld \xe6\x97\xa5\xe6\x9c\xac \xf0\x9f\x99\x82 \t\n~";
    size_t len = strlen(text);
    mt_ids ids = {0};
    cr_assert_eq(mt_tokenizer_encode(&t, text, len, &ids), 0, "%s", mt_error_get());
    cr_assert_eq(ids.n, len, "one id per byte");
    for (size_t i = 0; i < len; i++) cr_assert_eq(ids.v[i], (uint8_t)text[i], "id %zu", i);
    char *out;
    size_t olen;
    cr_assert_eq(mt_tokenizer_decode(&t, ids.v, ids.n, &out, &olen), 0);
    cr_assert_eq(olen, len);
    cr_assert_str_eq(out, text);
    free(out);
    // BOS/EOS and unused ids decode to nothing; out-of-vocab ids are an error.
    mt_tokenizer t2;
    cr_assert_eq(mt_tokenizer_init_bytes(&t2, 300, 256, 257), 0, "%s", mt_error_get());
    int32_t mixed[] = {256, 'o', 299, 'k', 257};
    cr_assert_eq(mt_tokenizer_decode(&t2, mixed, 5, &out, &olen), 0);
    cr_assert_str_eq(out, "ok");
    free(out);
    int32_t bad[] = {'a', 300};
    cr_assert_neq(mt_tokenizer_decode(&t2, bad, 2, &out, &olen), 0);
    cr_assert(strstr(mt_error_get(), "300"), "got: %s", mt_error_get());
    mt_ids_free(&ids);
    mt_tokenizer_free(&t);
    mt_tokenizer_free(&t2);
}

Test(tokenizer, bytes_reserved_control_bytes_refused) {
    mt_tokenizer t;
    cr_assert_eq(mt_tokenizer_init_bytes(&t, 256, 1, 2), 0);
    mt_ids ids = {0};
    cr_assert_neq(mt_tokenizer_encode(&t, "ab\x02" "c", 4, &ids), 0, "0x02 is EOS here");
    cr_assert(strstr(mt_error_get(), "0x02") && strstr(mt_error_get(), "offset 2"), "got: %s",
              mt_error_get());
    cr_assert_neq(mt_tokenizer_encode(&t, "\x01", 1, &ids), 0, "0x01 is BOS here");
    // With BOS/EOS above the bytes, only the pad byte (NUL) stays reserved.
    mt_tokenizer t2;
    cr_assert_eq(mt_tokenizer_init_bytes(&t2, 258, 256, 257), 0);
    cr_assert_eq(mt_tokenizer_encode(&t2, "\x01\x02", 2, &ids), 0, "%s", mt_error_get());
    cr_assert_eq(ids.n, 2);
    cr_assert_neq(mt_tokenizer_encode(&t2, "a\0b", 3, &ids), 0);
    mt_ids_free(&ids);
}

Test(tokenizer, bytes_bad_vocab) {
    mt_tokenizer t;
    cr_assert_neq(mt_tokenizer_init_bytes(&t, 255, 1, 2), 0);
    cr_assert(strstr(mt_error_get(), "256"), "got: %s", mt_error_get());
    cr_assert_neq(mt_tokenizer_init_bytes(&t, 256, 2, 2), 0, "BOS == EOS");
    cr_assert_neq(mt_tokenizer_init_bytes(&t, 256, 1, 256), 0, "EOS outside the vocab");
    // No bos_token_id (OLMoE's null): no BOS, and EOS still a token.
    cr_assert_eq(mt_tokenizer_init_bytes(&t, 256, -1, 2), 0, "%s", mt_error_get());
    cr_assert_eq(t.add_bos, 0);
    cr_assert_eq(t.bos, -1);
    cr_assert_neq(mt_tokenizer_init_bytes(&t, 256, -1, -1), 0, "EOS is needed");
}

Test(tokenizer, pieces) {
    mt_tokenizer t;
    cr_assert_eq(mt_tokenizer_init_bytes(&t, 260, 1, 2), 0);
    char p[32];
    cr_assert_eq(mt_tokenizer_piece(&t, 'A', p, sizeof p), 0);
    cr_assert_str_eq(p, "A");
    mt_tokenizer_piece(&t, '\n', p, sizeof p);
    cr_assert_str_eq(p, "<0x0A>");
    mt_tokenizer_piece(&t, 0xC3, p, sizeof p);
    cr_assert_str_eq(p, "<0xC3>");
    mt_tokenizer_piece(&t, 1, p, sizeof p);
    cr_assert_str_eq(p, "<s>");
    mt_tokenizer_piece(&t, 2, p, sizeof p);
    cr_assert_str_eq(p, "</s>");
    mt_tokenizer_piece(&t, 258, p, sizeof p);
    cr_assert_str_eq(p, "<unused>");
    cr_assert_neq(mt_tokenizer_piece(&t, 260, p, sizeof p), 0);
}

Test(tokenizer, selection) {
    char dir[64];
    mt_test_tmpdir(dir, sizeof dir);
    mt_tokenizer t;
    cr_assert_eq(mt_tokenizer_open(&t, dir, 256, 1, 2), 0, "%s", mt_error_get());
    cr_assert_eq(t.kind, MT_TOKENIZER_BYTE);
    mt_tokenizer_free(&t);
    cr_assert_neq(mt_tokenizer_open(&t, dir, 128, 1, 2), 0);
    cr_assert(strstr(mt_error_get(), "tokenizer.model") && strstr(mt_error_get(), "128"),
              "got: %s", mt_error_get());
    // --model may name config.json itself.
    char cfg[128];
    snprintf(cfg, sizeof cfg, "%s/config.json", dir);
    write_text(cfg, "{}");
    cr_assert_eq(mt_tokenizer_open(&t, cfg, 256, 1, 2), 0, "%s", mt_error_get());
    cr_assert_eq(t.kind, MT_TOKENIZER_BYTE);
    // A tokenizer.json that is not byte-level BPE (here: no model) is refused, not bytes.
    char tj[128];
    snprintf(tj, sizeof tj, "%s/tokenizer.json", dir);
    write_text(tj, "{}");
    cr_assert_neq(mt_tokenizer_open(&t, dir, 32000, 1, 2), 0);
    cr_assert(strstr(mt_error_get(), "tokenizer.json"), "got: %s", mt_error_get());
    unlink(tj);
    // A tokenizer.model present is used (and must be one): never a silent fallback to bytes.
    char path[128];
    snprintf(path, sizeof path, "%s/tokenizer.model", dir);
    write_text(path, "not a protobuf at all");
    cr_assert_neq(mt_tokenizer_open(&t, dir, 256, 1, 2), 0);
    cr_assert(strstr(mt_error_get(), "tokenizer.model"), "got: %s", mt_error_get());
    mt_test_rmrf(dir);
}

#ifdef MT_SENTENCEPIECE
// Trains a tiny BPE model with byte fallback (as Mixtral's) into dir/tokenizer.model.
static void train_tiny_spm(const char *dir) {
    char corpus[128], args[512];
    snprintf(corpus, sizeof corpus, "%s/corpus.txt", dir);
    FILE *f = fopen(corpus, "w");
    cr_assert(f);
    for (int i = 0; i < 150; i++)
        fprintf(f, "the quick brown fox %d jumps over the lazy dog. h\xc3\xa9llo w\xc3\xb6rld, "
                   "caf\xc3\xa9 and tea at %d o'clock\n", i, i % 12);
    fclose(f);
    snprintf(args, sizeof args,
             "--input=%s --model_prefix=%s/tokenizer --vocab_size=320 --model_type=bpe "
             "--byte_fallback=true --character_coverage=1.0 --bos_id=1 --eos_id=2 --unk_id=0",
             corpus, dir);
    cr_assert_eq(mt_spm_train(args), 0, "%s", mt_error_get());
}
#endif

Test(tokenizer, sentencepiece_round_trip) {
#ifndef MT_SENTENCEPIECE
    cr_skip_test("built without the SentencePiece shim (MT_SENTENCEPIECE; needs the Makefile's "
                 "*.cc rule and -lsentencepiece)");
#else
    char dir[64];
    mt_test_tmpdir(dir, sizeof dir);
    train_tiny_spm(dir);
    mt_tokenizer t;
    cr_assert_eq(mt_tokenizer_open(&t, dir, 320, 1, 2), 0, "%s", mt_error_get());
    cr_assert_eq(t.kind, MT_TOKENIZER_SPM);
    const char *text = "the lazy fox said h\xc3\xa9llo to \xe6\x97\xa5\xe6\x9c\xac \xf0\x9f\x99\x82";
    mt_ids ids = {0};
    cr_assert_eq(mt_tokenizer_encode(&t, text, strlen(text), &ids), 0, "%s", mt_error_get());
    cr_assert(ids.n > 0 && ids.n < strlen(text), "merges happened: %zu ids", ids.n);
    cr_assert_neq(ids.v[0], t.bos, "the shim adds no BOS");
    cr_assert_neq(ids.v[ids.n - 1], t.eos, "nor EOS");
    char p[64];
    cr_assert_eq(mt_tokenizer_piece(&t, ids.v[0], p, sizeof p), 0);
    cr_assert_str_eq(p, "\xe2\x96\x81the", "first piece is '\u2581the', got '%s'", p);
    cr_assert_eq(mt_spm_piece_to_id(t.spm, "\xe2\x96\x81the"), ids.v[0]);
    // Characters never seen in training come back through byte fallback.
    int bytes = 0;
    for (size_t i = 0; i < ids.n; i++) {
        mt_tokenizer_piece(&t, ids.v[i], p, sizeof p);
        bytes += strncmp(p, "<0x", 3) == 0;
    }
    cr_assert_geq(bytes, 10, "CJK and emoji as byte pieces (%d)", bytes);
    char *out;
    size_t olen;
    cr_assert_eq(mt_tokenizer_decode(&t, ids.v, ids.n, &out, &olen), 0, "%s", mt_error_get());
    cr_assert_str_eq(out, text);
    free(out);
    // BOS/EOS around it decode to nothing.
    int32_t wrapped[3] = {t.bos, ids.v[0], t.eos};
    cr_assert_eq(mt_tokenizer_decode(&t, wrapped, 3, &out, &olen), 0);
    cr_assert_str_eq(out, "the");
    free(out);
    mt_ids_free(&ids);
    mt_tokenizer_free(&t);
    mt_test_rmrf(dir);
#endif
}

Test(tokenizer, sentencepiece_checked_against_config) {
#ifndef MT_SENTENCEPIECE
    cr_skip_test("built without the SentencePiece shim (MT_SENTENCEPIECE)");
#else
    char dir[64], path[128];
    mt_test_tmpdir(dir, sizeof dir);
    train_tiny_spm(dir);
    snprintf(path, sizeof path, "%s/tokenizer.model", dir);
    mt_tokenizer t;
    cr_assert_neq(mt_tokenizer_load_spm(&t, path, 300, 1, 2), 0, "320 pieces > vocab 300");
    cr_assert(strstr(mt_error_get(), "320") && strstr(mt_error_get(), "300"), "got: %s",
              mt_error_get());
    cr_assert_neq(mt_tokenizer_load_spm(&t, path, 320, 3, 2), 0, "BOS disagrees with config");
    cr_assert(strstr(mt_error_get(), "BOS"), "got: %s", mt_error_get());
    // A padded embedding (vocab above the piece count) is fine; the extra ids decode to nothing.
    cr_assert_eq(mt_tokenizer_load_spm(&t, path, 328, 1, 2), 0, "%s", mt_error_get());
    int32_t ids[] = {325, mt_spm_piece_to_id(t.spm, "\xe2\x96\x81the")};
    char *out;
    size_t olen;
    cr_assert_eq(mt_tokenizer_decode(&t, ids, 2, &out, &olen), 0, "%s", mt_error_get());
    cr_assert_str_eq(out, "the");
    free(out);
    mt_tokenizer_free(&t);
    mt_test_rmrf(dir);
#endif
}

// A chat sample through SentencePiece: runs are encoded separately, so the reply starts on its
// own "▁" piece and exactly the reply and </s> carry labels.
Test(tokenizer, sentencepiece_chat_sample_masks) {
#ifndef MT_SENTENCEPIECE
    cr_skip_test("built without the SentencePiece shim (MT_SENTENCEPIECE)");
#else
    char dir[64], data[128];
    mt_test_tmpdir(dir, sizeof dir);
    train_tiny_spm(dir);
    snprintf(data, sizeof data, "%s/chat.jsonl", dir);
    write_text(data, "{\"messages\":[{\"role\":\"user\",\"content\":\"the fox\"},"
                     "{\"role\":\"assistant\",\"content\":\"the dog\"}]}\n");
    mt_tokenizer t;
    cr_assert_eq(mt_tokenizer_open(&t, dir, 320, 1, 2), 0, "%s", mt_error_get());
    mt_data_opts o;
    mt_data_opts_default(&o);
    mt_dataset d;
    cr_assert_eq(mt_dataset_load(&d, data, &t, &o), 0, "%s", mt_error_get());
    const int32_t *tok, *lab;
    int64_t n = mt_dataset_sample(&d, 0, &tok, &lab);
    mt_ids prompt = {0}, reply = {0};
    mt_tokenizer_encode(&t, "[INST] the fox [/INST]", 22, &prompt);
    mt_tokenizer_encode(&t, "the dog", 7, &reply);
    cr_assert_eq(n, (int64_t)(1 + prompt.n + reply.n + 1));
    cr_assert_eq(tok[0], 1);
    cr_assert_eq(tok[n - 1], 2);
    for (size_t i = 0; i < prompt.n; i++) {
        cr_assert_eq(tok[1 + i], prompt.v[i]);
        cr_assert_eq(lab[1 + i], MT_LABEL_IGNORE, "prompt token %zu out of the loss", i);
    }
    for (size_t i = 0; i < reply.n; i++) {
        cr_assert_eq(tok[1 + prompt.n + i], reply.v[i]);
        cr_assert_eq(lab[1 + prompt.n + i], reply.v[i], "reply token %zu in the loss", i);
    }
    cr_assert_eq(lab[n - 1], 2, "EOS in the loss");
    char p[64];
    mt_tokenizer_piece(&t, reply.v[0], p, sizeof p);
    cr_assert(strncmp(p, "\xe2\x96\x81", 3) == 0, "reply starts on a \u2581 piece, got '%s'", p);
    mt_ids_free(&prompt);
    mt_ids_free(&reply);
    mt_dataset_free(&d);
    mt_tokenizer_free(&t);
    mt_test_rmrf(dir);
#endif
}
