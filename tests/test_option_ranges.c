// Every numeric flag has a documented range, checked when it is parsed, and the error names the
// flag; --batch × --seq is checked against memory before anything is allocated; the adapter
// config reader bounds r, checks lora_alpha and refuses an empty target_modules.
#include <criterion/criterion.h>
#include <string.h>

#include "core/common.h"
#include "core/fileio.h"
#include "lora/peft.h"
#include "trainer/options.h"
#include "tests/test_util.h"

static void expect_flag_refused(const char *flag, const char *value) {
    mt_run_opts o;
    mt_run_opts_default(&o);
    char *argv[] = {(char *)flag, (char *)value};
    cr_assert_neq(mt_run_opts_parse(&o, 2, argv), 0, "%s %s accepted", flag, value);
    char want[64];
    snprintf(want, sizeof want, "%s: '%s' is outside its range", flag, value);
    cr_assert(strstr(mt_error_get(), want), "%s", mt_error_get());
}

Test(option_ranges, the_issue_cases_and_every_bound) {
    expect_flag_refused("--dropout", "2");
    expect_flag_refused("--dropout", "-1");
    expect_flag_refused("--dropout", "1");
    expect_flag_refused("--lr", "-0.1");
    expect_flag_refused("--lr", "0");
    expect_flag_refused("--batch", "0");
    expect_flag_refused("--batch", "99999999");
    expect_flag_refused("--seq", "1");
    expect_flag_refused("--r", "0");
    expect_flag_refused("--r", "100000");
    expect_flag_refused("--alpha", "0");
    expect_flag_refused("--accum", "0");
    expect_flag_refused("--zero", "3");
    expect_flag_refused("--epochs", "0");
    expect_flag_refused("--top-p", "1.5");
    expect_flag_refused("--temperature", "-1");
    expect_flag_refused("--weight-decay", "-0.01");
    expect_flag_refused("--gpu-mem", "1KB");
    // at the bounds, accepted
    mt_run_opts o;
    mt_run_opts_default(&o);
    char *ok[] = {"--dropout", "0", "--lr", "10", "--batch", "65536", "--seq", "2", "--r", "65536", "--top-p", "1",
                  "--save-total-limit", "0"};
    cr_assert_eq(mt_run_opts_parse(&o, (int)MT_ARRAY_LEN(ok), ok), 0, "%s", mt_error_get());
    // an integer beyond what parses at all still names the flag
    char *huge[] = {"--batch", "99999999999999999999"};
    cr_assert_neq(mt_run_opts_parse(&o, 2, huge), 0);
    cr_assert(strstr(mt_error_get(), "--batch"), "%s", mt_error_get());
}

Test(option_ranges, yaml_keys_are_checked_alike_with_line_and_column) {
    char tmp[64], path[128];
    mt_test_tmpdir(tmp, sizeof tmp);
    snprintf(path, sizeof path, "%s/run.yaml", tmp);
    FILE *f = fopen(path, "w");
    fprintf(f, "r: 8\ndropout: 2\n");
    fclose(f);
    mt_run_opts o;
    mt_run_opts_default(&o);
    char *argv[] = {"--config", path};
    cr_assert_neq(mt_run_opts_parse(&o, 2, argv), 0);
    cr_assert(strstr(mt_error_get(), "run.yaml:2:") && strstr(mt_error_get(), "--dropout: '2' is outside"), "%s",
              mt_error_get());
    mt_test_rmrf(tmp);
}

Test(option_ranges, cli_exits_2_before_loading_and_help_shows_ranges) {
    char out[16384];
    const char *cases[][2] = {{"--dropout 2", "--dropout"}, {"--lr -0.1", "--lr"},
                              {"--batch 99999999999", "--batch"}, {"--dropout -1", "--dropout"}};
    for (size_t i = 0; i < MT_ARRAY_LEN(cases); i++) {
        // the model does not exist: the flag is refused before anything is read
        cr_assert_eq(mt_test_run(out, sizeof out, "--model /nonexistent --data /nonexistent %s", cases[i][0]), 2,
                     "%s", out);
        cr_assert(strstr(out, cases[i][1]) && strstr(out, "outside its range"), "%s", out);
    }
    cr_assert_eq(mt_test_run(out, sizeof out, "train --help"), 0);
    cr_assert(strstr(out, "--dropout") && strstr(out, "range [0, 1)") && strstr(out, "range (0, 10]"), "%s", out);
    cr_assert(strstr(out, "130") && strstr(out, "143"), "exit codes in --help: %s", out);
}

Test(option_ranges, batch_times_seq_is_checked_against_memory_before_allocating) {
    char tmp[64], out[32768], model[128], data[128];
    mt_test_tmpdir(tmp, sizeof tmp);
    snprintf(model, sizeof model, "%s/tiny", tmp);
    snprintf(data, sizeof data, "%s/d.jsonl", tmp);
    cr_assert_eq(mt_test_run(out, sizeof out, "init --config %s/configs/tiny.json --out %s", MT_REPO_ROOT, model), 0);
    // positions up to 2^20, so that --seq 1048576 is one the model takes (train refuses a --seq past them)
    char cmd[400];
    snprintf(cmd, sizeof cmd, "sed -i 's/\"max_position_embeddings\": 512/\"max_position_embeddings\": 1048576/' %s/config.json",
             model);
    cr_assert_eq(system(cmd), 0);
    FILE *f = fopen(data, "w");
    fprintf(f, "{\"text\":\"a\"}\n");
    fclose(f);
    cr_assert_eq(mt_test_run(out, sizeof out, "--model %s --data %s --batch 65536 --seq 1048576 --out %s/o", model,
                             data, tmp), 1, "%s", out);
    cr_assert(strstr(out, "--batch 65536 × --seq 1048576") && strstr(out, "host memory"), "%s", out);
    cr_assert(!strstr(out, "out of host memory"), "%s", out);
    char o[200];
    snprintf(o, sizeof o, "%s/o", tmp);
    cr_assert(!mt_is_dir(o), "nothing written");
    mt_test_rmrf(tmp);
}

static void expect_config_refused(const char *json, const char *key) {
    mt_peft_config c;
    cr_assert_neq(mt_peft_config_parse(json, strlen(json), "x/adapter_config.json", &c), 0, "accepted: %s", json);
    cr_assert(strstr(mt_error_get(), "x/adapter_config.json") && strstr(mt_error_get(), key), "%s", mt_error_get());
}

Test(option_ranges, adapter_config_bounds_r_alpha_dropout_and_targets) {
    expect_config_refused("{\"peft_type\":\"LORA\",\"r\":2147483648}", "\"r\"");
    expect_config_refused("{\"peft_type\":\"LORA\",\"r\":1e300}", "\"r\"");
    expect_config_refused("{\"peft_type\":\"LORA\",\"r\":-3}", "\"r\"");
    expect_config_refused("{\"peft_type\":\"LORA\",\"r\":4.5}", "\"r\"");
    expect_config_refused("{\"peft_type\":\"LORA\",\"r\":8,\"lora_alpha\":-1}", "\"lora_alpha\"");
    expect_config_refused("{\"peft_type\":\"LORA\",\"r\":8,\"lora_alpha\":0}", "\"lora_alpha\"");
    expect_config_refused("{\"peft_type\":\"LORA\",\"r\":8,\"lora_alpha\":\"16\"}", "\"lora_alpha\"");
    expect_config_refused("{\"peft_type\":\"LORA\",\"r\":8,\"lora_dropout\":1.5}", "\"lora_dropout\"");
    expect_config_refused("{\"peft_type\":\"LORA\",\"r\":8,\"target_modules\":[]}", "\"target_modules\"");
    expect_config_refused("{\"peft_type\":\"LORA\",\"r\":8,\"target_modules\":\"\"}", "\"target_modules\"");
    mt_peft_config c;
    const char *good = "{\"peft_type\":\"LORA\",\"r\":65536,\"lora_alpha\":16,\"lora_dropout\":null,"
                       "\"target_modules\":[\"w1\"]}";
    cr_assert_eq(mt_peft_config_parse(good, strlen(good), "ok.json", &c), 0, "%s", mt_error_get());
    cr_assert_eq(c.r, 65536);
}

// adapter_config.json fields that change what the adapter computes: refused by name when set,
// accepted when off (the values PEFT writes for unused features); bookkeeping ignored.
Test(option_ranges, adapter_config_fields_that_change_the_math) {
    const char *set[][2] = {
        {"\"fan_in_fan_out\":true", "fan_in_fan_out = true"},
        {"\"lora_bias\":true", "lora_bias = true"},
        {"\"modules_to_save\":[\"lm_head\"]", "modules_to_save = [\"lm_head\"]"},
        {"\"use_dora\":true", "use_dora"},
        {"\"bias\":\"all\"", "bias \"all\""},
        {"\"layer_replication\":[[0,2],[1,2]]", "layer_replication"},
        {"\"trainable_token_indices\":[5]", "trainable_token_indices"},
        {"\"use_qalora\":true", "use_qalora"},
        {"\"some_future_feature\":{\"on\":1}", "some_future_feature"},
    };
    for (size_t i = 0; i < MT_ARRAY_LEN(set); i++) {
        char json[256];
        snprintf(json, sizeof json, "{\"peft_type\":\"LORA\",\"r\":8,%s}", set[i][0]);
        expect_config_refused(json, set[i][1]);
    }
    mt_peft_config c;
    const char *off = "{\"peft_type\":\"LORA\",\"r\":8,\"fan_in_fan_out\":false,\"lora_bias\":false,\"modules_to_save\":"
                      "null,\"layer_replication\":null,\"use_qalora\":false,\"some_future_feature\":null,"
                      "\"megatron_config\":null,\"megatron_core\":\"megatron.core\",\"layers_to_transform\":[0,1],"
                      "\"layers_pattern\":\"layers\",\"init_lora_weights\":\"gaussian\",\"task_type\":\"CAUSAL_LM\","
                      "\"use_rslora\":true}";
    cr_assert_eq(mt_peft_config_parse(off, strlen(off), "ok.json", &c), 0, "%s", mt_error_get());
    cr_assert(c.use_rslora, "use_rslora is honoured");
}
