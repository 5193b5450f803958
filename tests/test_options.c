// Run options: flags, index sets, sizes, errors that name the flag.
#include <criterion/criterion.h>
#include <string.h>

#include "core/common.h"
#include "trainer/options.h"

static int parse(mt_run_opts *o, const char *line) {
    char buf[1024], *argv[64];
    int argc = 0;
    strcpy(buf, line);
    for (char *s, *t = strtok_r(buf, " ", &s); t; t = strtok_r(NULL, " ", &s)) argv[argc++] = t;
    mt_run_opts_default(o);
    return mt_run_opts_parse(o, argc, argv);
}

Test(options, main_job_flags) {
    mt_run_opts o;
    cr_assert_eq(parse(&o, "--mode lora --r 16 --experts all"), 0, "%s", mt_error_get());
    cr_assert_eq(o.mode, MT_MODE_LORA);
    cr_assert_eq(o.lora_r, 16);
    cr_assert(o.experts.all);
    cr_assert_eq(parse(&o, "--mode=unfreeze --layers 0-5 --experts 0,1 --gpu-mem 40GiB --no-master-weights"), 0);
    cr_assert_eq(o.mode, MT_MODE_UNFREEZE);
    cr_assert_eq(o.layers.count, 6);
    cr_assert_eq(mt_index_set_count(&o.experts, 8), 2);
    cr_assert(mt_index_set_contains(&o.experts, 1) && !mt_index_set_contains(&o.experts, 2));
    cr_assert_float_eq(o.gpu_mem_bytes, 40.0 * 1073741824.0, 1.0);
    cr_assert_eq(o.master_weights, 0);
}

Test(options, errors_name_the_flag) {
    mt_run_opts o;
    cr_assert_neq(parse(&o, "--bogus 3"), 0);
    cr_assert(strstr(mt_error_get(), "--bogus"), "got: %s", mt_error_get());
    cr_assert_neq(parse(&o, "--r sixteen"), 0);
    cr_assert(strstr(mt_error_get(), "--r"), "got: %s", mt_error_get());
    cr_assert_neq(parse(&o, "--mode lorax"), 0);
    cr_assert(strstr(mt_error_get(), "--mode") && strstr(mt_error_get(), "lorax"), "got: %s", mt_error_get());
    cr_assert_neq(parse(&o, "--layers 5-2"), 0);
    cr_assert(strstr(mt_error_get(), "--layers"), "got: %s", mt_error_get());
    cr_assert_neq(parse(&o, "--gpu-mem 44XB"), 0);
    cr_assert_neq(parse(&o, "--seq"), 0);
    cr_assert(strstr(mt_error_get(), "needs a value"), "got: %s", mt_error_get());
    cr_assert_neq(parse(&o, "--no-r"), 0);
    cr_assert_neq(parse(&o, "stray"), 0);
    cr_assert_neq(parse(&o, "--targets w1,w9"), 0);
    cr_assert(strstr(mt_error_get(), "w9"), "got: %s", mt_error_get());
}

Test(options, sizes) {
    double b;
    cr_assert_eq(mt_parse_bytes("44GB", &b), 0);
    cr_assert_float_eq(b, 44e9, 1);
    cr_assert_eq(mt_parse_bytes("44GiB", &b), 0);
    cr_assert_float_eq(b, 44.0 * 1073741824.0, 1);
    cr_assert_eq(mt_parse_bytes("512MiB", &b), 0);
    cr_assert_float_eq(b, 512.0 * 1048576.0, 1);
    cr_assert_eq(mt_parse_bytes("1e9", &b), 0);
    cr_assert_neq(mt_parse_bytes("-1GB", &b), 0);
    cr_assert_neq(mt_parse_bytes("GB", &b), 0);
}

Test(options, index_sets) {
    mt_index_set s;
    cr_assert_eq(mt_index_set_parse(&s, "0,2,4-6,2"), 0);
    cr_assert_eq(s.count, 5, "duplicates merge");
    cr_assert_eq(s.items[4], 6);
    cr_assert_neq(mt_index_set_parse(&s, "1,"), 0);
    cr_assert_neq(mt_index_set_parse(&s, "-1"), 0);
    cr_assert_neq(mt_index_set_parse(&s, "99999"), 0);
    cr_assert_neq(mt_index_set_parse(&s, ""), 0);
}

Test(options, targets) {
    mt_run_opts o;
    cr_assert_eq(parse(&o, "--targets w1,w2,w3,gate"), 0);
    cr_assert_eq(o.targets, MT_TARGET_EXPERTS | MT_TARGET_GATE);
    cr_assert_eq(parse(&o, "--targets attn"), 0);
    cr_assert_eq(o.targets, MT_TARGET_ATTN);
}

// --chat-template is kept as written (checked against the known names when the model's folder
// is read, data/chat_template.c); "auto" by default.
Test(options, chat_template) {
    mt_run_opts o;
    cr_assert_eq(parse(&o, "--mode lora"), 0, "%s", mt_error_get());
    cr_assert_str_eq(o.chat_template, "auto");
    cr_assert_eq(parse(&o, "--chat-template tulu"), 0, "%s", mt_error_get());
    cr_assert_str_eq(o.chat_template, "tulu");
    cr_assert_neq(parse(&o, "--chat-template a-template-name-longer-than-the-field"), 0);
    cr_assert(strstr(mt_error_get(), "chat-template"), "got: %s", mt_error_get());
}
