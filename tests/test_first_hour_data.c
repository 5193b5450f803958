// tests/test_first_hour_data.c — issue 28's data and config snags as a new user meets them
// (snags 3 and 4): instruction rows at a short --seq, every shipped tiny config trained for a
// step on JSONL, and the data line naming the chat template and where it came from.
#include <criterion/criterion.h>
#include <stdio.h>
#include <string.h>

#include "test_util.h"

// 64 instruction rows whose answers are ~60 bytes: Alpaca's ~170-byte prompt leaves them no room
// at --seq 200 with the byte-level tokenizer (snag 3, as written).
static void instruction_rows(const char *path, int rows) {
    FILE *f = fopen(path, "w");
    cr_assert_not_null(f);
    for (int i = 0; i < rows; i++)
        fprintf(f, "{\"instruction\": \"Write the sentence about item %d.\", \"input\": \"\", \"output\": \"Item %d is a "
                "small grey stone found near the river bank today.\"}\n", i, i);
    fclose(f);
}

Test(first_hour_data, instruction_rows_at_a_short_seq_say_what_was_cut_and_how_to_fix_it, .timeout = 120) {
    static char out[32768];
    char tmp[64], model[128], data[128];
    mt_test_tmpdir(tmp, sizeof tmp);
    cr_assert_eq(mt_test_tiny_run_inputs(tmp, model, data, 0), 0);
    instruction_rows(data, 64);
    const char *run = "--quant none --steps 1 --r 2";
    // Alpaca's preamble fills --seq 160: every answer is cut away; the error names --seq and the template.
    cr_assert_eq(mt_test_run(out, sizeof out, "--model %s --data %s %s --seq 160 --out %s/a", model, data, run, tmp), 1,
                 "%s", out);
    cr_expect(strstr(out, "64 cut to --seq 160 with nothing left in the loss") && strstr(out, "raise --seq") &&
                  strstr(out, "--instruction-template none"), "%s", out);
    // At --seq 200 the answers are cut short and counted, the line says which template and why.
    cr_assert_eq(mt_test_run(out, sizeof out, "--model %s --data %s %s --seq 200 --out %s/b", model, data, run, tmp), 0,
                 "%s", out);
    cr_expect(strstr(out, "samples=64 ") && strstr(out, "truncated=64 "), "%s", out);
    cr_expect(strstr(out, "instruction template alpaca") && strstr(out, "--seq 200 cut 64 samples"), "%s", out);
    // Without the preamble they fit whole.
    cr_assert_eq(mt_test_run(out, sizeof out, "--model %s --data %s %s --seq 200 --instruction-template none --out %s/c",
                             model, data, run, tmp), 0, "%s", out);
    cr_expect(strstr(out, "samples=64 ") && strstr(out, "truncated=0 ") && !strstr(out, "cut 64"), "%s", out);
    cr_expect(strstr(out, "instruction template none"), "%s", out);
    // chat: through the model's template (tiny Mixtral: [INST]); a bad name is a usage error.
    cr_assert_eq(mt_test_run(out, sizeof out, "--model %s --data %s %s --seq 200 --instruction-template chat --out %s/d",
                             model, data, run, tmp), 0, "%s", out);
    cr_expect(strstr(out, "instruction template chat; chat template mixtral"), "%s", out);
    cr_assert_eq(mt_test_run(out, sizeof out, "--model %s --data %s %s --instruction-template vicuna --out %s/e", model,
                             data, run, tmp), 2, "%s", out);
    mt_test_rmrf(tmp);
}

// Every tiny config in configs/ trains a step on JSONL of every form, out of the box; without a
// tokenizer_config.json each gets its family's chat template, and the data line says so (snag 4).
Test(first_hour_data, every_shipped_tiny_config_trains_on_jsonl, .timeout = 240) {
    static const struct { const char *config, *line; } configs[] = {
        {"tiny.json", "chat template mixtral (built-in for model_type mixtral: no tokenizer_config.json)"},
        {"tiny-qwen2-moe.json", "chat template qwen (built-in for model_type qwen2_moe: no tokenizer_config.json)"},
        {"tiny-qwen3-moe.json", "chat template qwen3 (built-in for model_type qwen3_moe: no tokenizer_config.json)"},
        {"tiny-olmoe.json", "chat template tulu (built-in for model_type olmoe: no tokenizer_config.json)"},
    };
    static char out[32768];
    char tmp[64], model[160], data[160];
    mt_test_tmpdir(tmp, sizeof tmp);
    snprintf(data, sizeof data, "%s/all.jsonl", tmp);
    FILE *f = fopen(data, "w");
    fputs("{\"text\": \"plain text\"}\n"
          "{\"instruction\": \"do\", \"output\": \"done\"}\n"
          "{\"messages\": [{\"role\": \"user\", \"content\": \"hi\"}, {\"role\": \"assistant\", \"content\": \"yo\"}]}\n"
          "{\"prompt\": \"2+2=\", \"completion\": \" 4\"}\n"
          "{\"conversations\": [{\"from\": \"human\", \"value\": \"hey\"}, {\"from\": \"gpt\", \"value\": \"hello\"}]}\n",
          f);
    fclose(f);
    for (size_t i = 0; i < sizeof configs / sizeof *configs; i++) {
        snprintf(model, sizeof model, "%s/m%zu", tmp, i);
        cr_assert_eq(mt_test_run(out, sizeof out, "init --config %s/configs/%s --out %s", MT_REPO_ROOT, configs[i].config,
                                 model), 0, "%s: %s", configs[i].config, out);
        // (Alpaca's preamble alone would fill the tiny configs' 128 positions: no preamble.)
        int rc = mt_test_run(out, sizeof out, "--model %s --data %s --steps 1 --seq 128 --r 2 --instruction-template none "
                             "--out %s/o%zu", model, data, tmp, i);
        cr_assert_eq(rc, 0, "%s: %s", configs[i].config, out);
        cr_expect(strstr(out, "samples=5 "), "%s: every row kept: %s", configs[i].config, out);
        cr_expect(strstr(out, configs[i].line), "%s: %s", configs[i].config, out);
        cr_expect(strstr(out, "step=1/1 loss="), "%s: %s", configs[i].config, out);
    }
    // The flag and tokenizer_config.json name themselves.
    cr_assert_eq(mt_test_run(out, sizeof out, "--model %s/m2 --data %s --steps 1 --seq 128 --r 2 --chat-template chatml --instruction-template none --out "
                             "%s/flag", tmp, data, tmp), 0, "%s", out);
    cr_expect(strstr(out, "chat template chatml (--chat-template)"), "%s", out);
    char tc[200];
    snprintf(tc, sizeof tc, "%s/m2/tokenizer_config.json", tmp);
    f = fopen(tc, "w");
    fputs("{\"chat_template\": \"{% for message in messages %}{{'<|im_start|>' + message['role'] + '\\\\n' + "
          "message['content'] + '<|im_end|>' + '\\\\n'}}{% endfor %}{% if add_generation_prompt %}"
          "{{ '<|im_start|>assistant\\\\n' }}{% endif %}\"}", f);
    fclose(f);
    cr_assert_eq(mt_test_run(out, sizeof out, "--model %s/m2 --data %s --steps 1 --seq 128 --r 2 --instruction-template none --out %s/tc", tmp, data,
                             tmp), 0, "%s", out);
    cr_expect(strstr(out, "chat template chatml (tokenizer_config.json)"), "%s", out);
    mt_test_rmrf(tmp);
}
