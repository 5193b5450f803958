// tests/test_first_hour.c — what a new user sees first (issue 15): every flag's default in
// --help, one line when a dense checkpoint is quantized on load, a one-line plan in train
// (the full table with --verbose), the planner naming the checkpoint's dtype; and issue 28's
// snags: --resume OUT alone, output folders, the plan on the cpu, generate's template and every
// sub-command's flags, messages with their fix, --seq against max_position_embeddings, early
// stopping, Hugging Face cache names. (The exit codes: test_exit_codes.c; mpirun: tests/mpi/run.sh.)
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "core/fileio.h"

#include "test_util.h"

#define G1 MT_REPO_ROOT "/tests/data/golden/g1_top2_gqa_pad"

Test(first_hour, every_flag_shows_its_default) {
    static char out[65536];
    cr_assert_eq(mt_test_run(out, sizeof out, "train --help"), 0, "%s", out);
    int flags = 0;
    for (char *line = strtok(out, "\n"); line; line = strtok(NULL, "\n")) {
        if (strncmp(line, "  --", 4) != 0) continue;
        flags++;
        cr_expect(strstr(line, "default"), "no default shown: %s", line);
    }
    cr_expect_gt(flags, 50, "the flag table is printed");
}

Test(first_hour, quantize_on_load_is_said_once_with_the_way_out, .timeout = 60) {
    char out[16384], tmp[64], tok[128];
    mt_test_tmpdir(tmp, sizeof tmp);
    snprintf(tok, sizeof tok, "%s/d.tok", tmp);
    FILE *f = fopen(tok, "wb");  // MTTOK1: one sample of 6 ids, no mask
    const char magic[6] = {'M', 'T', 'T', 'O', 'K', '1'};
    unsigned short flags = 0;
    unsigned long long n = 1;
    unsigned len = 6;
    int ids[6] = {1, 5, 9, 11, 3, 2};
    fwrite(magic, 1, 6, f), fwrite(&flags, 2, 1, f), fwrite(&n, 8, 1, f), fwrite(&len, 4, 1, f), fwrite(ids, 4, 6, f);
    fclose(f);
    cr_assert_eq(mt_test_run(out, sizeof out, "eval --model %s --data %s", G1, tok), 0, "%s", out);
    const char *note = strstr(out, "quantized to nf4 on load");
    cr_expect(note && strstr(note, "--quant none"), "%s", out);
    cr_expect(note && !strstr(note + 1, "quantized to nf4 on load"), "said once: %s", out);
    cr_assert_eq(mt_test_run(out, sizeof out, "eval --model %s --data %s --quant none", G1, tok), 0, "%s", out);
    cr_expect_null(strstr(out, "on load"), "nothing to say with --quant none: %s", out);
    mt_test_rmrf(tmp);
}

Test(first_hour, train_prints_a_short_plan_and_the_full_one_with_verbose, .timeout = 120) {
    char out[32768], tmp[64], model[128], data[128];
    mt_test_tmpdir(tmp, sizeof tmp);
    cr_assert_eq(mt_test_tiny_run_inputs(tmp, model, data, 4), 0);
    const char *run = "--mode lora --r 2 --quant none --steps 1 --seq 16";
    cr_assert_eq(mt_test_run(out, sizeof out, "--model %s --data %s %s --out %s/a", model, data, run, tmp), 0, "%s", out);
    // a cpu run: no CUDA context or library workspace in its plan (issue 28)
    cr_expect(strstr(out, "plan: ") && strstr(out, "on the cpu") && strstr(out, "largest:"), "%s", out);
    cr_expect_null(strstr(out, "work "), "no workspace on the cpu: %s", out);
    // --recompute auto, the default: a tiny model keeps everything in the host's memory
    cr_expect(strstr(out, "; recompute: none (auto: fits"), "%s", out);
    cr_expect_null(strstr(out, "moetrain plan:"), "the full table only with --verbose: %s", out);
    cr_assert_eq(mt_test_run(out, sizeof out, "--model %s --data %s %s --out %s/b --verbose", model, data, run, tmp), 0,
                 "%s", out);
    cr_expect(strstr(out, "moetrain plan:"), "%s", out);
    // the planner names the checkpoint's own dtype (the tiny model is f32)
    cr_expect(strstr(out, "f32 in the checkpoint"), "%s", out);
    mt_test_rmrf(tmp);
}

// eval --save-tokens: the rows eval reads (chat template and loss mask applied) as a token file,
// which evaluates to the same loss: what scripts/check_peft.py reads for chat and instruction data.
Test(first_hour, eval_saves_the_rows_it_reads) {
    char out[16384], tmp[64], model[128], data[128], tok[160];
    mt_test_tmpdir(tmp, sizeof tmp);
    cr_assert_eq(mt_test_tiny_run_inputs(tmp, model, data, 0), 0);
    FILE *f = fopen(data, "w");
    for (int i = 0; i < 5; i++)
        fprintf(f, "{\"messages\":[{\"role\":\"user\",\"content\":\"q%d\"},{\"role\":\"assistant\",\"content\":\"a%03d\"}]}\n",
                i, i * 11);
    fprintf(f, "{\"instruction\":\"say\",\"output\":\"hi there\"}\n");
    fclose(f);
    snprintf(tok, sizeof tok, "%s/rows.tok", tmp);
    cr_assert_eq(mt_test_run(out, sizeof out, "eval --model %s --data %s --quant none --save-tokens %s", model, data, tok), 0,
                 "%s", out);
    const char *l1 = strstr(out, "loss=");
    cr_assert_not_null(l1, "%s", out);
    double a = atof(l1 + 5);
    cr_assert_eq(mt_test_run(out, sizeof out, "eval --model %s --data %s --quant none", model, tok), 0, "%s", out);
    const char *l2 = strstr(out, "loss=");
    cr_assert_not_null(l2, "%s", out);
    cr_expect_eq(a, atof(l2 + 5), "the token file gives the JSONL's loss: %.9g vs %.9g", a, atof(l2 + 5));
    cr_expect_eq(mt_test_run(out, sizeof out, "eval --model %s --data %s --save-tokens %s/no/such/dir/x", model, data, tmp),
                 1, "an unwritable --save-tokens fails: %s", out);
    cr_expect(strstr(out, "--save-tokens"), "the error names the flag: %s", out);
    mt_test_rmrf(tmp);
}

// ---------------------------------------------------------------------------------------------
// Issue 28: the first hour, round 2

static int has_file(const char *dir, const char *name) {
    char p[512];
    snprintf(p, sizeof p, "%s/%s", dir, name);
    FILE *f = fopen(p, "r");
    if (f) fclose(f);
    return f != NULL;
}

static int same_file(const char *a, const char *b) {
    char *da, *db;
    size_t la, lb;
    if (mt_read_file(a, 1 << 26, &da, &la) != 0) return 0;
    if (mt_read_file(b, 1 << 26, &db, &lb) != 0) return free(da), 0;
    int same = la == lb && memcmp(da, db, la) == 0;
    free(da), free(db);
    return same;
}

// Snag 1: after a stop, `--resume OUT` alone continues (from another folder), bit for bit; a flag
// that changes the run is refused naming it, or with --resume-override taken and logged.
Test(first_hour, resume_alone_continues_the_run_and_refuses_changes, .timeout = 120) {
    char out[16384], tmp[64], model[128], data[128], a[160], b[160], pa[300], pb[300];
    mt_test_tmpdir(tmp, sizeof tmp);
    cr_assert_eq(mt_test_tiny_run_inputs(tmp, model, data, 16), 0);
    const char *run = "--mode lora --r 2 --quant none --seq 16 --batch 2 --steps 6 --lr 3e-3 --dropout 0.1";
    snprintf(a, sizeof a, "%s/whole", tmp);
    snprintf(b, sizeof b, "%s/split", tmp);
    cr_assert_eq(mt_test_run(out, sizeof out, "--model %s --data %s %s --out %s", model, data, run, a), 0, "%s", out);
    cr_assert_eq(mt_test_run(out, sizeof out, "--model %s --data %s %s --save-every 3 --out %s", model, data, run, b), 0,
                 "%s", out);
    char cmd[1200];
    snprintf(cmd, sizeof cmd, "rm -rf %s/checkpoint-6 %s/adapter && echo checkpoint-3 > %s/latest", b, b, b);
    cr_assert_eq(system(cmd), 0);
    // a flag that changes the run: refused, naming it and the way to take it
    cr_assert_eq(mt_test_run(out, sizeof out, "--resume %s --steps 9", b), 2, "%s", out);
    cr_expect(strstr(out, "--steps 9") && strstr(out, "was 6") && strstr(out, "--resume-override"), "%s", out);
    cr_assert_eq(mt_test_run(out, sizeof out, "--resume %s --lr 1", b), 2, "%s", out);
    cr_expect(strstr(out, "--lr 1"), "%s", out);
    // the same value again is no change; --resume alone, from another folder, continues
    snprintf(cmd, sizeof cmd, "cd / && %s --resume %s --steps 6 --save-total-limit 5 > %s/resume.log 2>&1", MT_TEST_BIN,
             b, tmp);
    int rc = system(cmd);
    snprintf(pa, sizeof pa, "%s/resume.log", tmp);
    char *log;
    size_t len;
    cr_assert_eq(mt_read_file(pa, 1 << 20, &log, &len), 0);
    cr_assert_eq(WEXITSTATUS(rc), 0, "%s", log);
    cr_expect(strstr(log, "resumed from") && strstr(log, "step 3"), "%s", log);
    free(log);
    snprintf(pa, sizeof pa, "%s/adapter/adapter_model.safetensors", a);
    snprintf(pb, sizeof pb, "%s/adapter/adapter_model.safetensors", b);
    cr_expect(same_file(pa, pb), "the resumed adapter differs from the uninterrupted run's");
    // --resume-override takes the change and logs it
    cr_assert_eq(mt_test_run(out, sizeof out, "--resume %s --steps 8 --resume-override", b), 0, "%s", out);
    snprintf(pb, sizeof pb, "%s/metrics.jsonl", b);
    cr_assert_eq(mt_read_file(pb, 1 << 22, &log, &len), 0);
    cr_expect(strstr(log, "\"type\":\"resume_override\"") && strstr(log, "\"key\":\"steps\"") && strstr(log, "6 -> 8"),
              "the override is in metrics.jsonl");
    free(log);
    mt_test_rmrf(tmp);
}

// Snag 2: a non-empty --out is refused naming what is there; --overwrite clears a run's outputs
// (and nothing else).
Test(first_hour, a_non_empty_out_is_refused_unless_overwrite, .timeout = 60) {
    char out[16384], tmp[64], model[128], data[128], dir[160];
    mt_test_tmpdir(tmp, sizeof tmp);
    cr_assert_eq(mt_test_tiny_run_inputs(tmp, model, data, 8), 0);
    snprintf(dir, sizeof dir, "%s/o", tmp);
    const char *run = "--mode lora --r 2 --quant none --seq 16";
    cr_assert_eq(mt_test_run(out, sizeof out, "--model %s --data %s %s --steps 4 --save-every 2 --out %s", model, data,
                             run, dir), 0, "%s", out);
    cr_assert_eq(mt_test_run(out, sizeof out, "--model %s --data %s %s --steps 1 --out %s", model, data, run, dir), 2,
                 "%s", out);
    cr_expect(strstr(out, "not empty") && strstr(out, "metrics.jsonl") && strstr(out, "checkpoint-2") &&
              strstr(out, "--overwrite") && strstr(out, "--resume"), "%s", out);
    cr_expect(has_file(dir, "checkpoint-4/state.json"), "nothing was touched");
    // another mode into the same folder, with --overwrite: no adapter/ beside trained.safetensors
    cr_assert_eq(mt_test_run(out, sizeof out, "--model %s --data %s --mode router --quant none --seq 16 --steps 1 "
                             "--overwrite --out %s", model, data, dir), 0, "%s", out);
    cr_expect(has_file(dir, "trained.safetensors"), "%s", out);
    cr_expect(!has_file(dir, "adapter/adapter_config.json") && !has_file(dir, "checkpoint-4/state.json") &&
              !has_file(dir, "checkpoint-2/state.json"), "the earlier run's outputs are gone");
    // something moetrain did not write: --overwrite refuses too, removing nothing
    char mine[200];
    snprintf(mine, sizeof mine, "%s/notes.txt", dir);
    FILE *f = fopen(mine, "w");
    fputs("mine\n", f);
    fclose(f);
    cr_assert_eq(mt_test_run(out, sizeof out, "--model %s --data %s %s --steps 1 --overwrite --out %s", model, data, run,
                             dir), 2, "%s", out);
    cr_expect(strstr(out, "notes.txt"), "%s", out);
    cr_expect(has_file(dir, "notes.txt") && has_file(dir, "trained.safetensors"), "nothing removed");
    mt_test_rmrf(tmp);
}

// Snag 5: the plan's work follows the device; --mem and --gpu-mem that do not fit exit 3 before training.
Test(first_hour, the_plan_follows_the_device_and_a_misfit_exits_3, .timeout = 60) {
    char out[32768], tmp[64], model[128], data[128];
    mt_test_tmpdir(tmp, sizeof tmp);
    cr_assert_eq(mt_test_tiny_run_inputs(tmp, model, data, 4), 0);
    cr_assert_eq(mt_test_run(out, sizeof out, "plan --model %s --device cpu --json", model), 0, "%s", out);
    cr_expect(strstr(out, "\"work\":\t0") || strstr(out, "\"work\":0"), "no CUDA workspace on the cpu: %s", out);
    cr_assert_eq(mt_test_run(out, sizeof out, "plan --model %s", model), 0, "%s", out);
    cr_expect(strstr(out, "CUDA ctx") && strstr(out, "1.500"), "a GPU plan says what its work is: %s", out);
    const char *run = "--mode lora --r 2 --quant none --seq 16 --steps 1";
    cr_assert_eq(mt_test_run(out, sizeof out, "--model %s --data %s %s --mem 100KB --out %s/a", model, data, run, tmp),
                 3, "%s", out);
    cr_expect(strstr(out, "--mem") && !strstr(out, "step=1"), "%s", out);
    cr_assert_eq(mt_test_run(out, sizeof out, "--model %s --data %s %s --gpu-mem 1MB --out %s/b", model, data, run, tmp),
                 3, "%s", out);
    cr_expect(strstr(out, "DOES NOT FIT") && strstr(out, "--gpu-mem") && !strstr(out, "step=1"), "%s", out);
    cr_assert_eq(mt_test_run(out, sizeof out, "--model %s --data %s %s --mem 1GB --out %s/c", model, data, run, tmp), 0,
                 "a 4 MiB run fits 1 GB: %s", out);
    mt_test_rmrf(tmp);
}

// Snag 6: generate renders the prompt as the adapter was trained, ends a line, and every
// sub-command refuses the flags it does not read.
Test(first_hour, generate_uses_the_trained_template_and_flags_are_scoped, .timeout = 90) {
    char out[16384], tmp[64], model[128], data[128];
    mt_test_tmpdir(tmp, sizeof tmp);
    cr_assert_eq(mt_test_tiny_run_inputs(tmp, model, data, 0), 0);
    FILE *f = fopen(data, "w");
    for (int i = 0; i < 6; i++)
        fprintf(f, "{\"messages\":[{\"role\":\"user\",\"content\":\"q%d\"},{\"role\":\"assistant\",\"content\":\"a%d\"}]}\n",
                i, i);
    fclose(f);
    cr_assert_eq(mt_test_run(out, sizeof out, "--model %s --data %s --r 2 --quant none --seq 48 --steps 1 --out %s/c",
                             model, data, tmp), 0, "%s", out);
    const char *gen = "generate --model %s --adapter %s/c/adapter --prompt hi --max-new-tokens 3 --quant none";
    char fmt[256];
    snprintf(fmt, sizeof fmt, "%s 2>/dev/null | od -An -c | tr -d ' \\n' | tail -c 2; echo", gen);
    cr_assert_eq(mt_test_run(out, sizeof out, fmt, model, tmp), 0, "%s", out);
    cr_expect(strncmp(out, "\\n", 2) == 0, "stdout ends with a newline: %s", out);
    cr_assert_eq(mt_test_run(out, sizeof out, gen, model, tmp), 0, "%s", out);
    cr_expect(strstr(out, "mixtral chat template"), "%s", out);
    const char *p = strstr(out, "prompt_tokens=");
    cr_assert_not_null(p, "%s", out);
    int chat = atoi(p + 14);
    snprintf(fmt, sizeof fmt, "%s --raw", gen);
    cr_assert_eq(mt_test_run(out, sizeof out, fmt, model, tmp), 0, "%s", out);
    p = strstr(out, "prompt_tokens=");
    cr_assert_not_null(p, "%s", out);
    cr_expect_gt(chat, atoi(p + 14), "the template's [INST] ... [/INST] around the prompt: %d vs raw %d", chat, atoi(p + 14));
    // flags a sub-command does not read: exit 2 naming them, on every sub-command
    static const char *const cases[][2] = {
        {"generate --model %s --prompt hi --steps 3", "--steps"}, {"generate --model %s --prompt hi --mode full", "--mode"},
        {"generate --model %s --prompt hi --lr 1", "--lr"},       {"eval --model %s --data x --lr 1", "--lr"},
        {"merge --model %s --adapter x --out y --steps 1", "--steps"}, {"quantize --model %s --out y --data x", "--data"},
        {"train --model %s --data x --prompt hi", "--prompt"},    {"plan --model %s --prompt hi", "--prompt"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        cr_expect_eq(mt_test_run(out, sizeof out, cases[i][0], model), 2, "%s: %s", cases[i][0], out);
        cr_expect(strstr(out, cases[i][1]) && strstr(out, "does not apply"), "%s: %s", cases[i][0], out);
    }
    mt_test_rmrf(tmp);
}

// Snag 9: each message carries its fix.
Test(first_hour, messages_carry_their_fix, .timeout = 90) {
    char out[16384], tmp[64], model[128], data[128], yaml[160];
    mt_test_tmpdir(tmp, sizeof tmp);
    cr_assert_eq(mt_test_tiny_run_inputs(tmp, model, data, 6), 0);
    cr_expect_eq(mt_test_run(out, sizeof out, "--gpu-mem 24"), 2);
    cr_expect(strstr(out, "24GB"), "add a unit: %s", out);
    cr_expect_eq(mt_test_run(out, sizeof out, "--learning_rate 1e-4"), 2);
    cr_expect(strstr(out, "did you mean --lr?"), "%s", out);
    cr_expect_eq(mt_test_run(out, sizeof out, "--stpes 4"), 2);
    cr_expect(strstr(out, "did you mean --steps?"), "%s", out);
    snprintf(yaml, sizeof yaml, "%s/run.yaml", tmp);
    FILE *f = fopen(yaml, "w");
    fputs("lr: 1e-4\nnum_train_epochs: 2\n", f);
    fclose(f);
    cr_expect_eq(mt_test_run(out, sizeof out, "--config %s", yaml), 2);
    cr_expect(strstr(out, "run.yaml:2") && strstr(out, "did you mean epochs?"), "%s", out);
    cr_expect_eq(mt_test_run(out, sizeof out, "--model %s/model.safetensors --data %s --out %s/x", model, data, tmp), 1);
    cr_expect(strstr(out, "weights file") && strstr(out, "checkpoint folder") && !strstr(out, "nesting"), "%s", out);
    // the CPU build names the CUDA one (a CUDA build, the emulator's included, runs or names the device)
    int rc = mt_test_run(out, sizeof out, "--model %s --data %s --device cuda --quant none --seq 16 --steps 1 --out %s/x",
                         model, data, tmp);
#ifndef MT_CUDA
    cr_expect_eq(rc, 2, "%s", out);
    cr_expect(strstr(out, "build-cuda/moetrain"), "%s", out);
#else  // the emulator's device: without --gpu-mem the run plans for the card's own memory
    cr_expect_eq(rc, 0, "%s", out);
    cr_expect(strstr(out, "recompute: none (auto: fits") && strstr(out, "of the card"), "%s", out);
#endif
    cr_expect_eq(mt_test_run(out, sizeof out, "--version"), 0);
    cr_expect(strncmp(out, "moetrain ", 9) == 0, "%s", out);
    // --adapter OUT of a router run names trained.safetensors; a LoRA run's names OUT/adapter
    cr_assert_eq(mt_test_run(out, sizeof out, "--model %s --data %s --mode router --quant none --seq 16 --steps 1 "
                             "--out %s/router", model, data, tmp), 0, "%s", out);
    cr_expect_eq(mt_test_run(out, sizeof out, "eval --model %s --data %s --adapter %s/router", model, data, tmp), 1);
    cr_expect(strstr(out, "router/trained.safetensors"), "%s", out);
    // an adapter of another rank: the --r it needs
    cr_assert_eq(mt_test_run(out, sizeof out, "--model %s --data %s --r 4 --quant none --seq 16 --steps 1 --out %s/r4",
                             model, data, tmp), 0, "%s", out);
    cr_expect_eq(mt_test_run(out, sizeof out, "--model %s --data %s --adapter %s/r4/adapter --quant none --seq 16 "
                             "--steps 1 --out %s/r16", model, data, tmp, tmp), 2, "%s", out);
    cr_expect(strstr(out, "pass --r 4"), "%s", out);
    mt_test_rmrf(tmp);
}

// Snag 10: --seq above max_position_embeddings as plan --max-seq sees it: the default capped
// (saying so), a given one refused with the largest that works.
Test(first_hour, seq_past_max_positions_is_capped_or_refused, .timeout = 60) {
    char out[16384], tmp[64], model[128], data[128];
    mt_test_tmpdir(tmp, sizeof tmp);
    cr_assert_eq(mt_test_tiny_run_inputs(tmp, model, data, 2), 0);
    cr_assert_eq(mt_test_run(out, sizeof out, "--model %s --data %s --seq 4096 --steps 1 --out %s/a", model, data, tmp),
                 2, "%s", out);
    cr_expect(strstr(out, "max_position_embeddings 512") && strstr(out, "--seq 512"), "%s", out);
    cr_assert_eq(mt_test_run(out, sizeof out, "--model %s --data %s --r 2 --quant none --steps 1 --out %s/b", model,
                             data, tmp), 0, "%s", out);
    cr_expect(strstr(out, "capped at the model's max_position_embeddings: 512"), "%s", out);
    cr_assert_eq(mt_test_run(out, sizeof out, "plan --model %s --max-seq --gpu-mem 80GB", model), 0, "%s", out);
    cr_expect(strstr(out, "512 tokens"), "the same limit: %s", out);
    mt_test_rmrf(tmp);
}

// --early-stop-patience: the run stops once the eval loss has not improved for N evaluations,
// and what it writes is the best checkpoint's weights (eval of the adapter = the best eval loss).
Test(first_hour, early_stopping_keeps_the_best, .timeout = 90) {
    char out[16384], tmp[64], model[128], data[128], ev[160], dir[160];
    mt_test_tmpdir(tmp, sizeof tmp);
    cr_assert_eq(mt_test_tiny_run_inputs(tmp, model, data, 20), 0);
    snprintf(ev, sizeof ev, "%s/ev.jsonl", tmp);
    FILE *f = fopen(ev, "w");
    for (int i = 0; i < 6; i++) fprintf(f, "{\"text\":\"held out line %d zzz qqq\"}\n", i);
    fclose(f);
    snprintf(dir, sizeof dir, "%s/es", tmp);
    cr_expect_eq(mt_test_run(out, sizeof out, "--model %s --data %s --early-stop-patience 2 --out %s/x", model, data,
                             tmp), 2, "patience needs eval data: %s", out);
    // lr 0.05 overshoots after ~10 steps on this data: the eval loss turns up
    cr_assert_eq(mt_test_run(out, sizeof out, "--model %s --data %s --r 4 --quant none --seq 16 --steps 60 --lr 0.05 "
                             "--eval-data %s --eval-every 2 --early-stop-patience 2 --out %s", model, data, ev, dir),
                 0, "%s", out);
    const char *e = strstr(out, "early_stop: step=");
    cr_assert_not_null(e, "the run stopped early: %s", out);
    long long stop = atoll(e + 17);
    const char *bl = strstr(e, "best_loss=");
    cr_assert_not_null(bl);
    double best = atof(bl + 10);
    cr_expect_lt(stop, 60, "%s", out);
    cr_assert_eq(mt_test_run(out, sizeof out, "eval --model %s --adapter %s/adapter --data %s --seq 16 --quant none",
                             model, dir, ev), 0, "%s", out);
    const char *l = strstr(out, "loss=");
    cr_assert_not_null(l, "%s", out);
    cr_expect(fabs(atof(l + 5) - best) < 1e-5, "the adapter is the best checkpoint's: eval %.6f, best %.6f",
              atof(l + 5), best);
    mt_test_rmrf(tmp);
}

// --model ORG/NAME: the local Hugging Face cache (refs/main → snapshots/<commit>), never a download.
Test(first_hour, hf_names_resolve_in_the_local_cache, .timeout = 60) {
    char out[16384], tmp[64], model[128], data[128], cmd[1400];
    mt_test_tmpdir(tmp, sizeof tmp);
    cr_assert_eq(mt_test_tiny_run_inputs(tmp, model, data, 2), 0);
    snprintf(cmd, sizeof cmd,
             "mkdir -p %s/hf/hub/models--acme--tiny-moe/refs %s/hf/hub/models--acme--tiny-moe/snapshots && "
             "echo 0123abcd > %s/hf/hub/models--acme--tiny-moe/refs/main && "
             "mv %s %s/hf/hub/models--acme--tiny-moe/snapshots/0123abcd",
             tmp, tmp, tmp, model, tmp);
    cr_assert_eq(system(cmd), 0);
    char want[200];
    snprintf(want, sizeof want, "%s/nohf/hub/models--acme--tiny-moe", tmp);
    cr_assert_eq(mt_test_run(out, sizeof out, "--version >/dev/null; HF_HUB_CACHE= HF_HOME=%s/nohf %s plan --model "
                             "acme/tiny-moe --gpu-mem 80GB", tmp, MT_TEST_BIN), 2, "not in the cache: %s", out);
    cr_expect(strstr(out, want) && strstr(out, "downloads nothing"), "the folder looked in is named: %s", out);
    cr_assert_eq(mt_test_run(out, sizeof out, "--version >/dev/null; HF_HUB_CACHE= HF_HOME=%s/hf %s plan "
                             "--model acme/tiny-moe --gpu-mem 80GB", tmp, MT_TEST_BIN), 0, "%s", out);
    cr_expect(strstr(out, "snapshots/0123abcd"), "%s", out);
    snprintf(cmd, sizeof cmd, "cd %s && HF_HUB_CACHE= HF_HOME=%s/hf %s --model acme/tiny-moe --data %s --r 2 --quant none --seq 16 "
             "--steps 1 --out %s/run > %s/hf.log 2>&1", tmp, tmp, MT_TEST_BIN, data, tmp, tmp);
    cr_expect_eq(system(cmd), 0, "a run on the cached model");
    mt_test_rmrf(tmp);
}
