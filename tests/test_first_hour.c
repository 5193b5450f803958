// tests/test_first_hour.c — what a new user sees first (issue 15): every flag's default in
// --help, one line when a dense checkpoint is quantized on load, a one-line plan in train
// (the full table with --verbose), the planner naming the checkpoint's dtype.
#include <criterion/criterion.h>
#include <stdio.h>
#include <string.h>

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
