// Checkpoints prove their integrity: a flipped byte anywhere in a checkpoint (tensor data, a
// header, state.json's step or digest) is caught before --resume loads anything, which then falls
// back to the newest earlier checkpoint that verifies, or stops; `moetrain verify` says the same.
#include <criterion/criterion.h>
#include <cjson/cJSON.h>
#include <math.h>
#include <stdint.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/common.h"
#include "core/fileio.h"
#include "trainer/checkpoint.h"
#include "tests/test_util.h"

static char tmp[64], model_dir[128], data[128], out_dir[160];
static const char *flags = "--mode lora --r 4 --quant none --seq 24 --batch 2 --schedule constant --seed 5";

static void setup(void) {
    char out[8192];
    mt_test_tmpdir(tmp, sizeof tmp);
    snprintf(out_dir, sizeof out_dir, "%s/out", tmp);
    cr_assert_eq(mt_test_tiny_run_inputs(tmp, model_dir, data, 48), 0);
    // checkpoints at steps 2 and 4
    cr_assert_eq(mt_test_run(out, sizeof out, "--model %s --data %s %s --steps 4 --save-every 2 --out %s", model_dir,
                             data, flags, out_dir), 0, "%s", out);
}
static void teardown(void) { mt_test_rmrf(tmp); }

static uint64_t rng_state = 0x2545F4914F6CDD1Dull;
static uint64_t next_rand(void) {  // xorshift64*: a fixed sequence
    rng_state ^= rng_state >> 12, rng_state ^= rng_state << 25, rng_state ^= rng_state >> 27;
    return rng_state * 0x2545F4914F6CDD1Dull;
}

static void xor_byte(const char *path, long pos, unsigned char mask) {
    FILE *f = fopen(path, "r+b");
    cr_assert(f, "%s", path);
    fseek(f, pos, SEEK_SET);
    int c = fgetc(f);
    fseek(f, pos, SEEK_SET);
    fputc(c ^ mask, f);
    fclose(f);
}

static long file_size(const char *path) {
    struct stat st;
    cr_assert_eq(stat(path, &st), 0, "%s", path);
    return (long)st.st_size;
}

Test(checkpoint_integrity, fifty_random_flips_are_each_caught_and_fall_back, .init = setup, .fini = teardown) {
    const char *files[] = {"state.json", "trainables.safetensors", "optimizer.safetensors"};
    char dir[4096], want[300], path[400];
    snprintf(want, sizeof want, "%s/checkpoint-2", out_dir);
    mt_log_set_level(MT_LOG_ERROR);  // 50 fallback warnings
    cr_assert_eq(mt_checkpoint_find_verified(out_dir, dir), 0, "%s", mt_error_get());
    cr_assert(strstr(dir, "checkpoint-4"), "the intact latest is used: %s", dir);
    for (int trial = 0; trial < 50; trial++) {
        // a file of checkpoint-4 (each alike, so that state.json gets its share), a byte of it,
        // and a non-zero mask: low bits, exponent bits, the last byte all come up
        const char *name = files[next_rand() % 3];
        snprintf(path, sizeof path, "%s/checkpoint-4/%s", out_dir, name);
        long size = file_size(path), pos = trial % 10 == 9 ? size - 1 : (long)(next_rand() % (uint64_t)size);
        unsigned char mask = (unsigned char)(1u << (next_rand() % 8));
        if (trial % 5 == 4) mask = (unsigned char)(next_rand() % 255 + 1);
        xor_byte(path, pos, mask);
        int rc = mt_checkpoint_find_verified(out_dir, dir);
        cr_assert_eq(rc, 0, "trial %d: %s", trial, mt_error_get());
        cr_assert_str_eq(dir, want, "trial %d: byte %ld of %s ^ 0x%02x was not caught", trial, pos, name, mask);
        char ck[300];
        snprintf(ck, sizeof ck, "%s/checkpoint-4", out_dir);
        cr_assert_neq(mt_checkpoint_verify(ck, 0), 0, "trial %d", trial);
        cr_assert(strstr(mt_error_get(), name), "trial %d: the error names %s: %s", trial, name, mt_error_get());
        xor_byte(path, pos, mask);  // restored for the next trial
    }
    cr_assert_eq(mt_checkpoint_find_verified(out_dir, dir), 0);
    cr_assert(strstr(dir, "checkpoint-4"), "restored: %s", dir);
}

Test(checkpoint_integrity, resume_falls_back_or_stops, .init = setup, .fini = teardown) {
    char out[16384], path[400];
    // an edited step in state.json: the run falls back to checkpoint-2, saying which file failed
    snprintf(path, sizeof path, "%s/checkpoint-4/state.json", out_dir);
    char *text;
    size_t len;
    cr_assert_eq(mt_read_file(path, 1 << 20, &text, &len), 0);
    char *s = strstr(text, "\"step\":\t4");
    cr_assert(s);
    s[8] = '9';
    cr_assert_eq(mt_write_file_atomic(path, text, len), 0);
    free(text);
    cr_assert_eq(mt_test_run(out, sizeof out, "--model %s --data %s %s --steps 5 --resume-override --resume %s --out %s", model_dir, data,
                             flags, out_dir, out_dir), 0, "%s", out);
    cr_assert(strstr(out, "checkpoint-4/state.json: checksum mismatch"), "%s", out);
    cr_assert(strstr(out, "falling back to") && strstr(out, "resumed from") && strstr(out, "checkpoint-2 at step 2"),
              "%s", out);
    // both damaged: no resume at all, a non-zero exit
    snprintf(path, sizeof path, "%s/checkpoint-2/trainables.safetensors", out_dir);
    xor_byte(path, file_size(path) / 2, 0x10);
    snprintf(path, sizeof path, "%s/checkpoint-4/optimizer.safetensors", out_dir);
    xor_byte(path, file_size(path) - 1, 0x01);
    snprintf(path, sizeof path, "%s/checkpoint-5/optimizer.safetensors", out_dir);
    xor_byte(path, 100, 0x80);
    cr_assert_eq(mt_test_run(out, sizeof out, "--model %s --data %s %s --steps 6 --resume-override --resume %s --out %s", model_dir,
                             data, flags, out_dir, out_dir), 1, "%s", out);
    cr_assert(strstr(out, "no checkpoint verifies"), "%s", out);
    cr_assert(!strstr(out, "resumed from"), "%s", out);
    // a checkpoint named itself must verify: no fallback
    cr_assert_eq(mt_test_run(out, sizeof out, "--model %s --data %s %s --steps 6 --resume-override --resume %s/checkpoint-2 --out %s",
                             model_dir, data, flags, out_dir, out_dir), 1, "%s", out);
    cr_assert(strstr(out, "trainables.safetensors: SHA-256 mismatch"), "%s", out);
}

Test(checkpoint_integrity, verify_command_checks_checkpoints_adapters_and_trained_tensors, .init = setup,
     .fini = teardown) {
    char out[16384], path[400];
    cr_assert_eq(mt_test_run(out, sizeof out, "verify %s", out_dir), 0, "%s", out);
    cr_assert(strstr(out, "checkpoint-4: verified") && strstr(out, "checksums hold"), "%s", out);
    cr_assert_eq(mt_test_run(out, sizeof out, "verify %s/checkpoint-2", out_dir), 0, "%s", out);
    cr_assert_eq(mt_test_run(out, sizeof out, "verify %s", model_dir), 0, "%s", out);
    cr_assert(strstr(out, "checksums hold"), "init writes SHA256SUMS: %s", out);
    // a copied adapter carries its checksums (sha256sum -c can read them too)
    char cmd[1024];
    snprintf(cmd, sizeof cmd, "cp -r %s/adapter %s/copy && cd %s/copy && sha256sum -c --quiet SHA256SUMS", out_dir,
             tmp, tmp);
    cr_assert_eq(system(cmd), 0);
    snprintf(path, sizeof path, "%s/copy/adapter_model.safetensors", tmp);
    xor_byte(path, file_size(path) - 3, 0x04);
    snprintf(path, sizeof path, "%s/copy", tmp);
    cr_assert_eq(mt_test_run(out, sizeof out, "verify %s", path), 1, "%s", out);
    cr_assert(strstr(out, "adapter_model.safetensors: SHA-256 mismatch"), "%s", out);
    // router mode: trained.safetensors with trained.safetensors.sha256 beside it
    cr_assert_eq(mt_test_run(out, sizeof out, "--model %s --data %s --mode router --quant none --seq 24 --batch 2 "
                             "--steps 1 --out %s/r", model_dir, data, tmp), 0, "%s", out);
    snprintf(path, sizeof path, "%s/r/trained.safetensors", tmp);
    cr_assert_eq(mt_test_run(out, sizeof out, "verify %s", path), 0, "%s", out);
    cr_assert(strstr(out, "checksum holds"), "%s", out);
    xor_byte(path, file_size(path) - 1, 0x40);
    cr_assert_eq(mt_test_run(out, sizeof out, "verify %s", path), 1, "%s", out);
    cr_assert_eq(mt_test_run(out, sizeof out, "verify %s/r", tmp), 1, "%s", out);
    cr_assert(strstr(out, "trained.safetensors: SHA-256 mismatch"), "%s", out);
    // a damaged checkpoint, named with the file and what failed
    snprintf(path, sizeof path, "%s/checkpoint-2/optimizer.safetensors", out_dir);
    cr_assert_eq(truncate(path, file_size(path) - 8), 0);
    cr_assert_eq(mt_test_run(out, sizeof out, "verify %s", out_dir), 1, "%s", out);
    cr_assert(strstr(out, "checkpoint-2/optimizer.safetensors: size"), "%s", out);
    cr_assert_eq(mt_test_run(out, sizeof out, "verify %s/nothing", tmp), 1, "%s", out);
}

// A version-1 state.json (written before checksums) still loads, with a warning; but a sealed
// state whose seal was damaged never passes for one, whatever it claims (found by fuzz_state).
Test(checkpoint_integrity, legacy_states_only_as_version_1_wrote_them) {
    char tmp[64], path[128];
    mt_test_tmpdir(tmp, sizeof tmp);
    snprintf(path, sizeof path, "%s/state.json", tmp);
    const char *v1 = "{\n\t\"format\":\t\"moetrain-checkpoint\",\n\t\"version\":\t1,\n\t\"step\":\t4,\n\t\"epoch\":\t0,\n"
                     "\t\"index\":\t8,\n\t\"skips\":\t0,\n\t\"data_fingerprint\":\t\"00ff\",\n\t\"run\":\t\"x\"\n}";
    cr_assert_eq(mt_write_file_atomic(path, v1, strlen(v1)), 0);
    cJSON *j;
    cr_assert_eq(mt_ckpt_state_read(path, &j), 0, "%s", mt_error_get());
    cJSON_Delete(j);
    // the same object sealed, then the seal's own key damaged: refused
    j = cJSON_Parse(v1);
    char *text = mt_ckpt_state_seal(j);
    cJSON_Delete(j);
    char *key = strstr(text, "\"sha256\"");
    cr_assert(key);
    key[6] ^= 0x01;  // "sha256" -> "sha257"
    cr_assert_eq(mt_write_file_atomic(path, text, strlen(text)), 0);
    free(text);
    cr_assert_neq(mt_ckpt_state_read(path, &j), 0);
    cr_assert(strstr(mt_error_get(), "no valid checksum"), "%s", mt_error_get());
    mt_test_rmrf(tmp);
}

// Any object seals into valid JSON that reads back, the empty one too (found by fuzz_state).
Test(checkpoint_integrity, any_object_seals_and_reads_back) {
    char tmp[64], path[128];
    mt_test_tmpdir(tmp, sizeof tmp);
    snprintf(path, sizeof path, "%s/state.json", tmp);
    const char *objects[] = {"{}", "{\"a\":1}", "{\"a\":{},\"b\":[1,2,\"x\"]}"};
    for (size_t i = 0; i < MT_ARRAY_LEN(objects); i++) {
        cJSON *j = cJSON_Parse(objects[i]), *back;
        char *text = mt_ckpt_state_seal(j);
        cr_assert_eq(mt_write_file_atomic(path, text, strlen(text)), 0);
        cr_assert_eq(mt_ckpt_state_read(path, &back), 0, "%s: %s", objects[i], mt_error_get());
        cr_assert_eq(cJSON_GetArraySize(back), cJSON_GetArraySize(j) + 1, "%s", objects[i]);
        cJSON_Delete(back), cJSON_Delete(j), free(text);
    }
    mt_test_rmrf(tmp);
}

// docs/design.md "Reliability": a resume with another configuration (or other data) is refused, saying why.
Test(checkpoint_integrity, resume_with_other_options_or_data_is_refused, .init = setup, .fini = teardown) {
    char out[16384], other[200];
    // a flag that changes the run is refused naming it (exit 2) before anything is loaded ...
    cr_assert_eq(mt_test_run(out, sizeof out, "--model %s --data %s %s --r 8 --steps 6 --resume %s --out %s", model_dir,
                             data, flags, out_dir, out_dir), 2, "%s", out);
    cr_assert(strstr(out, "--r 8 changes the run") && strstr(out, "--resume-override"), "%s", out);
    // ... and with --resume-override it is taken, then refused by the checkpoint itself
    cr_assert_eq(mt_test_run(out, sizeof out, "--model %s --data %s %s --r 8 --steps 6 --resume %s --out %s "
                             "--resume-override", model_dir, data, flags, out_dir, out_dir), 1, "%s", out);
    cr_assert(strstr(out, "different run") && strstr(out, "r=4") && strstr(out, "r=8"), "%s", out);
    snprintf(other, sizeof other, "%s/other.jsonl", tmp);
    FILE *f = fopen(other, "w");
    fprintf(f, "{\"text\":\"something else entirely\"}\n");
    fclose(f);
    cr_assert_eq(mt_test_run(out, sizeof out, "--model %s --data %s %s --steps 6 --resume %s --out %s", model_dir,
                             other, flags, out_dir, out_dir), 2, "%s", out);
    cr_assert(strstr(out, "--data") && strstr(out, "changes the run"), "%s", out);
    cr_assert_eq(mt_test_run(out, sizeof out, "--model %s --data %s %s --steps 6 --resume %s --out %s --resume-override",
                             model_dir, other, flags, out_dir, out_dir), 1, "%s", out);
    cr_assert(strstr(out, "different data"), "%s", out);
}
