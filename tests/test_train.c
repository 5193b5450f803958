// moetrain train: each mode changes only what it trains; a resumed run equals the uninterrupted
// one bit for bit; LoRA on every expert (case C's shape) lowers the loss of the tiny model.
#include <criterion/criterion.h>
#include <math.h>
#include <omp.h>
#include <string.h>

#include "core/common.h"
#include "core/fileio.h"
#include "core/safetensors.h"
#include "core/threads.h"
#include "model/mixtral.h"
#include "optim/optim.h"
#include "optim/params.h"
#include "tests/test_util.h"
#include "trainer/options.h"

#include <sys/resource.h>
#include <unistd.h>

static char tmp[64], model_dir[128], data[128];

// A tiny checkpoint and a small chat dataset, once per test.
static void setup(void) {
    char out[4096];
    mt_test_tmpdir(tmp, sizeof tmp);
    snprintf(model_dir, sizeof model_dir, "%s/tiny", tmp);
    snprintf(data, sizeof data, "%s/data.jsonl", tmp);
    cr_assert_eq(mt_test_run(out, sizeof out, "init --config %s/configs/tiny.json --out %s --seed 3", MT_REPO_ROOT,
                             model_dir), 0, "%s", out);
    FILE *f = fopen(data, "w");
    for (int i = 0; i < 64; i++)
        fprintf(f, "{\"messages\":[{\"role\":\"user\",\"content\":\"w%03d\"},{\"role\":\"assistant\",\"content\":\"%03d\"}]}\n",
                i, (i * 7) % 1000);
    fclose(f);
}
static void teardown(void) { mt_test_rmrf(tmp); }

// Trains `steps` steps in-process and checks every checkpoint tensor: trainables must have
// changed (at least one), everything else must equal the checkpoint bit for bit.
static void steps_then_compare(mt_mode mode, const char *layers, const char *experts, int *changed_out) {
    mt_backend *be = mt_backend_cpu_new();
    mt_run_opts o;
    mt_run_opts_default(&o);
    o.mode = mode;
    o.quant = MT_QUANT_NONE;
    o.lora_r = 4;
    o.targets = MT_TARGET_EXPERTS | MT_TARGET_GATE;
    cr_assert_eq(mt_index_set_parse(&o.layers, layers), 0);
    cr_assert_eq(mt_index_set_parse(&o.experts, experts), 0);
    mt_model m;
    cr_assert_eq(mt_model_load(&m, be, model_dir, MT_MODEL_SPEC_OF(&o)), 0, "%s", mt_error_get());
    mt_param *p;
    int n = mt_model_params(&m, &p);
    if (mode == MT_MODE_LORA)  // B = 0 at init: give A's path something to do from step 1
        for (int i = 0; i < n; i++) if (strstr(p[i].name, "lora_B")) {
            float *b = p[i].w->data;
            for (int64_t j = 0; j < mt_tensor_numel(p[i].w); j++) b[j] = 0.01f;
        }
    mt_adamw opt;
    cr_assert_eq(mt_adamw_init(&opt, be, p, n, NULL), 0);
    enum { B = 2, S = 16 };
    int32_t tokens[B * S], labels[B * S];
    for (int i = 0; i < B * S; i++) tokens[i] = labels[i] = 32 + (i * 11) % 90;
    mt_batch b = {B, S, tokens, labels, NULL};
    for (int step = 0; step < 3; step++) {
        mt_loss l;
        mt_model_zero_grad(&m);
        cr_assert_eq(mt_model_forward(&m, &b, &l), 0);
        mt_model_backward(&m);
        double gn;
        cr_assert_eq(mt_adamw_step(&opt, p, n, 1e-2, 1.0, &gn), 0);
    }
    // compare with the checkpoint
    mt_st_model st;
    cr_assert_eq(mt_st_model_open(&st, model_dir), 0);
    int changed = 0;
    for (size_t i = 0; i < st.n_tensors; i++) {
        const mt_st_tensor *t = st.tensors[i];
        char module[256];
        size_t len = strlen(t->name) - strlen(".weight");
        memcpy(module, t->name, len);
        module[len] = 0;
        const void *now = NULL;
        mt_linear *l = mt_model_find_linear(&m, module);
        if (l) now = l->w->data;
        else if (!strcmp(t->name, "model.embed_tokens.weight")) now = m.embed->data;
        else if (!strcmp(t->name, "model.norm.weight")) now = m.norm->data;
        else {
            int L;
            cr_assert(sscanf(t->name, "model.layers.%d.", &L) == 1, "%s", t->name);
            now = strstr(t->name, "input_layernorm") ? m.layers[L].ln1->data : m.layers[L].ln2->data;
        }
        int trains = l && l->dw;
        int same = memcmp(now, t->data, t->nbytes) == 0;
        if (trains) changed += !same;
        else cr_expect(same, "%s changed but does not train in this mode", t->name);
    }
    *changed_out = changed;
    mt_st_model_close(&st);
    mt_adamw_free(&opt);
    mt_params_free(p, n);
    mt_model_free(&m);
    mt_backend_free(be);
}

Test(train, router_mode_changes_only_the_gates, .init = setup, .fini = teardown) {
    int changed;
    steps_then_compare(MT_MODE_ROUTER, "all", "all", &changed);
    cr_assert_eq(changed, 2, "both layers' gates trained");
}

Test(train, unfreeze_changes_only_chosen_experts_and_their_routers, .init = setup, .fini = teardown) {
    int changed;
    steps_then_compare(MT_MODE_UNFREEZE, "1", "0,3", &changed);
    cr_assert_gt(changed, 0);
    cr_assert_leq(changed, 7, "at most 2 experts x 3 weights + 1 gate");
}

Test(train, lora_leaves_the_base_untouched, .init = setup, .fini = teardown) {
    int changed;
    steps_then_compare(MT_MODE_LORA, "all", "all", &changed);
    cr_assert_eq(changed, 0, "no base weight trains in lora mode");
}

static double last_loss(const char *metrics, int64_t *step) {
    char *text;
    size_t len;
    cr_assert_eq(mt_read_file(metrics, 1 << 24, &text, &len), 0);
    double loss = NAN;
    for (char *line = strtok(text, "\n"); line; line = strtok(NULL, "\n")) {
        char *s = strstr(line, "\"step\":"), *l = strstr(line, "\"loss\":");
        if (s && l && strstr(line, "\"type\":\"step\"")) *step = atoll(s + 7), loss = atof(l + 7);
    }
    free(text);
    return loss;
}

// A few LoRA steps (experts and attention, dropout on) of the tiny model at `threads` threads,
// with 512 tokens a step so that the lm head's and attention projections' GEMMs are cut into
// blocks (core/gemm.h): each step's loss, then every trainable's weight and gradient bytes.
enum { TS_STEPS = 3 };
typedef struct {
    double loss[TS_STEPS];
    unsigned char *bytes;
    size_t n;
} step_bits;

static step_bits lora_steps_at(int threads, mt_quant quant) {
    omp_set_num_threads(threads);
    mt_backend *be = mt_backend_cpu_new();
    mt_run_opts o;
    mt_run_opts_default(&o);
    o.mode = MT_MODE_LORA;
    o.quant = quant;
    o.lora_r = 8;
    o.lora_dropout = 0.1;
    o.targets = MT_TARGET_EXPERTS | MT_TARGET_ATTN;
    cr_assert_eq(mt_index_set_parse(&o.layers, "all"), 0);
    cr_assert_eq(mt_index_set_parse(&o.experts, "all"), 0);
    mt_model m;
    cr_assert_eq(mt_model_load(&m, be, model_dir, MT_MODEL_SPEC_OF(&o)), 0, "%s", mt_error_get());
    mt_model_set_lora_dropout(&m, 0.1f);
    mt_param *p;
    int n = mt_model_params(&m, &p);
    for (int i = 0; i < n; i++)  // B = 0 at init: give A's path a gradient from step 1
        if (strstr(p[i].name, "lora_B"))
            for (int64_t j = 0; j < mt_tensor_numel(p[i].w); j++) ((float *)p[i].w->data)[j] = 0.01f * (float)(j % 7 - 3);
    mt_adamw opt;
    cr_assert_eq(mt_adamw_init(&opt, be, p, n, NULL), 0);
    enum { B = 4, S = 128 };
    static int32_t tokens[B * S], labels[B * S];
    uint32_t x = 12345;
    for (int i = 0; i < B * S; i++) x = x * 1664525u + 1013904223u, tokens[i] = labels[i] = 3 + (int32_t)((x >> 8) % 250);
    mt_batch b = {B, S, tokens, labels, NULL};
    step_bits r = {0};
    for (int step = 0; step < TS_STEPS; step++) {
        mt_loss l;
        mt_model_zero_grad(&m);
        mt_model_set_dropout_seed(&m, 5, step, 0);
        cr_assert_eq(mt_model_forward_train(&m, &b, &l), 0, "%s", mt_error_get());
        mt_model_backward(&m);
        r.loss[step] = l.loss;
        if (step == TS_STEPS - 1) break;  // the last step's gradients are compared as they are
        double gn;
        cr_assert_eq(mt_adamw_step(&opt, p, n, 1e-2, 1.0, &gn), 0);
    }
    for (int i = 0; i < n; i++) r.n += p[i].w->nbytes + p[i].g->nbytes;
    r.bytes = mt_xmalloc(r.n);
    size_t at = 0;
    for (int i = 0; i < n; i++) {
        memcpy(r.bytes + at, p[i].w->data, p[i].w->nbytes), at += p[i].w->nbytes;
        memcpy(r.bytes + at, p[i].g->data, p[i].g->nbytes), at += p[i].g->nbytes;
    }
    mt_adamw_free(&opt);
    mt_params_free(p, n);
    mt_model_free(&m);
    mt_backend_free(be);
    return r;
}

// core/threads.c changes the thread count from step to step with the machine's load: a step must
// give the same bits at any count (core/gemm.h; the OpenMP loops sum in a fixed order).
static void same_bits_at_1_2_3_threads(mt_quant quant) {
    int saved = omp_get_max_threads();
    step_bits r[3];
    for (int t = 0; t < 3; t++) r[t] = lora_steps_at(t + 1, quant);
    omp_set_num_threads(saved);
    for (int t = 1; t < 3; t++) {
        for (int s = 0; s < TS_STEPS; s++)
            cr_assert(memcmp(&r[0].loss[s], &r[t].loss[s], sizeof(double)) == 0, "%s: step %d loss %.17g at 1 thread, %.17g at %d",
                      mt_quant_name(quant), s + 1, r[0].loss[s], r[t].loss[s], t + 1);
        cr_assert_eq(r[0].n, r[t].n);
        cr_assert(memcmp(r[0].bytes, r[t].bytes, r[0].n) == 0, "%s: adapter or gradient bytes differ at %d threads",
                  mt_quant_name(quant), t + 1);
    }
    cr_assert(isfinite(r[0].loss[0]) && r[0].loss[TS_STEPS - 1] != r[0].loss[0], "the steps trained");
    for (int t = 0; t < 3; t++) free(r[t].bytes);
}

Test(train, a_step_gives_the_same_bits_at_1_2_3_threads, .init = setup, .fini = teardown) {
    same_bits_at_1_2_3_threads(MT_QUANT_NONE);
}

Test(train, a_step_on_an_nf4_base_gives_the_same_bits_at_1_2_3_threads, .init = setup, .fini = teardown) {
    same_bits_at_1_2_3_threads(MT_QUANT_NF4);
}

Test(train, resume_is_bit_exact_and_lora_lowers_the_loss, .init = setup, .fini = teardown) {
    char out[16384], a[256], b[256];
    const char *common = "--mode lora --r 16 --experts all --targets w1,w2,w3,gate --quant nf4 --seq 24 --batch 4 "
                         "--lr 5e-3 --warmup 2 --dropout 0.1 --seed 9";
    snprintf(a, sizeof a, "%s/full", tmp);
    snprintf(b, sizeof b, "%s/split", tmp);
    cr_assert_eq(mt_test_run(out, sizeof out, "--model %s --data %s %s --steps 8 --out %s", model_dir, data, common, a),
                 0, "%s", out);
    // the same run stopped after 4 steps, then resumed
    cr_assert_eq(mt_test_run(out, sizeof out, "--model %s --data %s %s --steps 8 --save-every 4 --out %s", model_dir,
                             data, common, b), 0, "%s", out);
    char cmd[1024];
    snprintf(cmd, sizeof cmd, "rm -rf %s/checkpoint-8 %s/adapter && echo checkpoint-4 > %s/latest", b, b, b);
    cr_assert_eq(system(cmd), 0);
    cr_assert_eq(mt_test_run(out, sizeof out, "--model %s --data %s %s --steps 8 --resume %s --out %s", model_dir, data,
                             common, b, b), 0, "%s", out);
    cr_assert(strstr(out, "resumed from") && strstr(out, "step 4"), "%s", out);
    char pa[300], pb[300];
    snprintf(pa, sizeof pa, "%s/adapter/adapter_model.safetensors", a);
    snprintf(pb, sizeof pb, "%s/adapter/adapter_model.safetensors", b);
    char *da, *db;
    size_t la, lb;
    cr_assert_eq(mt_read_file(pa, 1 << 26, &da, &la), 0);
    cr_assert_eq(mt_read_file(pb, 1 << 26, &db, &lb), 0);
    cr_assert(la == lb && memcmp(da, db, la) == 0, "the resumed adapter differs from the uninterrupted one");
    free(da), free(db);
    snprintf(pa, sizeof pa, "%s/metrics.jsonl", a);
    snprintf(pb, sizeof pb, "%s/metrics.jsonl", b);
    int64_t sa = 0, sb = 0;
    double la8 = last_loss(pa, &sa), lb8 = last_loss(pb, &sb);
    cr_assert_eq(sa, 8);
    cr_assert_eq(sb, 8);
    cr_assert_eq(la8, lb8, "step 8 loss %.9g vs resumed %.9g", la8, lb8);
    // and training lowered the loss (first step vs the last)
    char *text;
    size_t len;
    cr_assert_eq(mt_read_file(pa, 1 << 24, &text, &len), 0);
    double first = atof(strstr(text, "\"loss\":") + 7);
    free(text);
    cr_assert_lt(la8, first, "loss %.4f at step 1, %.4f at step 8", first, la8);
}

Test(train, bad_input_is_named, .init = setup, .fini = teardown) {
    char out[8192], bad[256];
    snprintf(bad, sizeof bad, "%s/bad.jsonl", tmp);
    FILE *f = fopen(bad, "w");
    fprintf(f, "{\"text\":\"fine\"}\n{\"text\": 3}\n");
    fclose(f);
    cr_assert_eq(mt_test_run(out, sizeof out, "--model %s --data %s --steps 1 --out %s/o", model_dir, bad, tmp), 1);
    cr_assert(strstr(out, "bad.jsonl:2"), "%s", out);
    // a flag the model cannot take is a bad flag (README: exit 2); a plan over --mem does not fit (3)
    cr_assert_eq(mt_test_run(out, sizeof out, "--model %s --data %s --layers 7 --steps 1 --out %s/o", model_dir, data,
                             tmp), 2);
    cr_assert(strstr(out, "--layers"), "%s", out);
    cr_assert_eq(mt_test_run(out, sizeof out, "--model %s --data %s --mem 1MB --steps 1 --out %s/o", model_dir, data,
                             tmp), 3);
    cr_assert(strstr(out, "--mem"), "%s", out);
    // Parallel flags without the ranks to carry them, and what is planned but not built
    cr_assert_eq(mt_test_run(out, sizeof out, "--model %s --data %s --ep 2 --steps 1 --out %s/o", model_dir, data, tmp),
                 1);
    cr_assert(strstr(out, "--ep 2") && strstr(out, "mpirun"), "%s", out);
    cr_assert_eq(mt_test_run(out, sizeof out, "--model %s --data %s --gpus 2 --steps 1 --out %s/o", model_dir, data,
                             tmp), 1);
    cr_assert(strstr(out, "--gpus 2"), "%s", out);
    cr_assert_eq(mt_test_run(out, sizeof out, "--model %s --data %s --zero 2 --steps 1 --out %s/o", model_dir, data,
                             tmp), 1);
    cr_assert(strstr(out, "--zero 2") && strstr(out, "not implemented"), "%s", out);
}

// A constant schedule: the learning rate does not depend on --steps, so the interrupted run and an
// uninterrupted one of any length take the same steps.
static const char *sigint_flags = "--mode lora --r 4 --quant none --seq 24 --batch 2 --schedule constant --dropout 0.1";

// A long run in `dir`, sent SIG<sig> after 1.5 s; `out` gets the shell's "rc=<exit code>".
static void interrupted_run(const char *sig, const char *dir, char *out, size_t cap) {
    char cmd[2048];
    snprintf(cmd, sizeof cmd,
             "sh -c '%s --model %s --data %s %s --steps 100000 --out %s > %s.log 2>&1 & pid=$!; sleep 1.5; "
             "kill -%s $pid; wait $pid; echo rc=$?'", MT_TEST_BIN, model_dir, data, sigint_flags, dir, dir, sig);
    FILE *p = popen(cmd, "r");
    size_t n = fread(out, 1, cap - 1, p);
    out[n] = 0;
    pclose(p);
}

Test(train, sigint_saves_exits_130_and_resumes_bit_for_bit, .init = setup, .fini = teardown) {
    char out[16384], dir[256];
    snprintf(dir, sizeof dir, "%s/int", tmp);
    interrupted_run("INT", dir, out, sizeof out);
    cr_assert(strstr(out, "rc=130"), "interrupted run exits 130 (128 + SIGINT) after saving: %s", out);
    char latest[300], *text;
    size_t len;
    snprintf(latest, sizeof latest, "%s/latest", dir);
    cr_assert_eq(mt_read_file(latest, 4096, &text, &len), 0, "a checkpoint was saved");
    cr_assert(strncmp(text, "checkpoint-", 11) == 0, "%s", text);
    free(text);
    snprintf(latest, sizeof latest, "%s.log", dir);
    cr_assert_eq(mt_read_file(latest, 1 << 20, &text, &len), 0);
    cr_assert(strstr(text, "stopped by signal"), "%s", text);
    free(text);
    // the resumed run continues bit for bit: two more steps equal an uninterrupted run of S + 2
    snprintf(latest, sizeof latest, "%s/latest", dir);
    cr_assert_eq(mt_read_file(latest, 4096, &text, &len), 0);
    long long stopped = atoll(text + 11);
    free(text);
    char whole[300];
    snprintf(whole, sizeof whole, "%s/whole", tmp);
    cr_assert_eq(mt_test_run(out, sizeof out, "--model %s --data %s %s --steps %lld --resume %s --out %s "
                             "--resume-override", model_dir, data, sigint_flags, stopped + 2, dir, dir), 0, "%s", out);
    cr_assert_eq(mt_test_run(out, sizeof out, "--model %s --data %s %s --steps %lld --out %s", model_dir, data,
                             sigint_flags, stopped + 2, whole), 0, "%s", out);
    char pa[400], pb[400], *da, *db;
    size_t la, lb;
    snprintf(pa, sizeof pa, "%s/adapter/adapter_model.safetensors", dir);
    snprintf(pb, sizeof pb, "%s/adapter/adapter_model.safetensors", whole);
    cr_assert_eq(mt_read_file(pa, 1 << 26, &da, &la), 0);
    cr_assert_eq(mt_read_file(pb, 1 << 26, &db, &lb), 0);
    cr_assert(la == lb && memcmp(da, db, la) == 0, "resumed after SIGINT at step %lld differs from the whole run",
              stopped);
    free(da), free(db);
}

Test(train, sigterm_saves_and_exits_143, .init = setup, .fini = teardown) {
    char out[4096], dir[256], latest[300];
    snprintf(dir, sizeof dir, "%s/term", tmp);
    interrupted_run("TERM", dir, out, sizeof out);
    cr_assert(strstr(out, "rc=143"), "SIGTERM exits 143 (128 + 15) after saving: %s", out);
    snprintf(latest, sizeof latest, "%s/latest", dir);
    cr_assert(access(latest, F_OK) == 0, "a checkpoint was saved");
}

// core/threads.h: without OMP_WAIT_POLICY or GOMP_SPINCOUNT the program re-executes itself with
// OMP_WAIT_POLICY=passive, so libgomp sleeps at once instead of spinning 300,000 times. libgomp's
// verbose display (printed at each start) shows the spin count in force: the last one printed
// is '0' by default, and a user's own setting is kept.
static long long last_spincount_of(const char *env, const char *bin, const char *args) {
    char cmd[4096], line[512];
    snprintf(cmd, sizeof cmd, "env -u OMP_WAIT_POLICY -u GOMP_SPINCOUNT %s OMP_DISPLAY_ENV=verbose %s %s 2>&1", env, bin,
             args);
    FILE *p = popen(cmd, "r");
    cr_assert_not_null(p);
    long long spin = -1;
    while (fgets(line, sizeof line, p)) sscanf(line, " GOMP_SPINCOUNT = '%lld'", &spin);
    cr_assert_eq(pclose(p), 0);
    return spin;
}

static long long last_spincount(const char *env) { return last_spincount_of(env, MT_TEST_BIN, "--help"); }

Test(train, omp_wait_policy_defaults_to_passive_unless_set) {
    cr_assert_eq(last_spincount(""), 0, "default: passive (spin count 0)");
    cr_assert_eq(last_spincount("GOMP_SPINCOUNT=1234"), 1234, "the user's spin count is kept");
    cr_assert_gt(last_spincount("OMP_WAIT_POLICY=active"), 0, "the user's active policy is kept");
}

// The test binary itself (tests/omp_passive.c): two test jobs on two cores spin against each
// other otherwise (the suite took 5x as long).
Test(train, the_test_binary_sleeps_idle_threads_too) {
    char self[4096];
    ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
    cr_assert_gt(n, 0);
    self[n] = '\0';
    // -i: a clean environment (the runner's own variables would make the nested binary a worker),
    // but for where its libraries are found (the GPU bundle's come through LD_LIBRARY_PATH)
    char clean[2048], active[2100];
    const char *lib = getenv("LD_LIBRARY_PATH");
    snprintf(clean, sizeof clean, "-i LD_LIBRARY_PATH='%s'", lib ? lib : "");
    snprintf(active, sizeof active, "%s OMP_WAIT_POLICY=active", clean);
    cr_assert_eq(last_spincount_of(clean, self, "--list"), 0, "the test binary re-executes itself passive");
    cr_assert_gt(last_spincount_of(active, self, "--list"), 0, "the caller's policy is kept");
}

// core/backend_cpu.c keeps freed work memory in the heap: a step's buffers reuse the pages the
// step before faulted in. Minor page faults of the whole run, 2 steps against 8 (model loading
// and the first steps' growth are the same in both): the 6 extra steps add next to none. (Before,
// each step on this model faulted in ~900 fresh pages.)
static long run_minflt(const char *args) {
    char cmd[2048];
    snprintf(cmd, sizeof cmd, "exec %s %s > /dev/null 2>&1", MT_TEST_BIN, args);
    pid_t pid = fork();
    if (pid == 0) {
        execl("/bin/sh", "sh", "-c", cmd, (char *)NULL);
        _exit(127);
    }
    int status;
    struct rusage ru;
    cr_assert_eq(wait4(pid, &status, 0, &ru), pid);
    cr_assert(WIFEXITED(status) && WEXITSTATUS(status) == 0, "%s", cmd);
    return ru.ru_minflt;
}

Test(train, later_steps_fault_in_no_fresh_memory, .init = setup, .fini = teardown) {
#if defined(__SANITIZE_ADDRESS__)
    // ASan's allocator quarantines freed blocks, so every step gets fresh pages by design; what this
    // checks is glibc malloc's reuse (core/backend_cpu.c's mallopt), which `make test` runs.
    cr_skip_test("ASan's allocator never reuses freed memory at once; checked by make test");
#endif
    char args[1024];
    long f[2];
    for (int r = 0; r < 2; r++) {
        snprintf(args, sizeof args, "--model %s --data %s --mode lora --r 8 --experts all --targets w1,w2,w3 "
                 "--quant nf4 --seq 64 --batch 4 --steps %d --out %s/pf%d", model_dir, data, r ? 8 : 2, tmp, r);
        f[r] = run_minflt(args);
    }
    cr_assert_lt(f[1] - f[0], 6 * 50, "6 more steps faulted in %ld more pages (%ld against %ld)", f[1] - f[0], f[1], f[0]);
}

// core/threads.h: the thread count a step takes, from the CPUs, /proc/loadavg's running count
// (the caller among them) and the count the program started with.
Test(train, thread_count_takes_the_cores_others_leave) {
    cr_assert_eq(mt_threads_choose(2, 1, 2), 2, "alone on 2 CPUs: both");
    cr_assert_eq(mt_threads_choose(2, 2, 2), 1, "one other task: 1");
    cr_assert_eq(mt_threads_choose(2, 9, 2), 1, "never below 1");
    cr_assert_eq(mt_threads_choose(2, 0, 2), 2, "a count below 1 counts as the caller alone");
    cr_assert_eq(mt_threads_choose(16, 3, 4), 4, "never above the starting count");
    cr_assert_eq(mt_threads_choose(16, 14, 8), 3);
    cr_assert_eq(mt_threads_choose(1, 1, 4), 1);
}

Test(train, loadavg_running_count_is_parsed_or_refused) {
    cr_assert_eq(mt_loadavg_running("0.52 0.58 0.59 3/467 12345\n"), 3);
    cr_assert_eq(mt_loadavg_running("12.00 8.50 4.25 17/1024 99"), 17);
    cr_assert_eq(mt_loadavg_running("0.00 0.00 0.00 0/80 1"), 0);
    const char *bad[] = {"", "garbage", "0.52 0.58 0.59", "0.52 0.58 0.59 3", "0.52 0.58 0.59 x/467 1",
                         "0.52 0.58 0.59 -2/467 1", "0.52 0.58 0.59 500/467 1", "0.52 0.58 3/467 1"};
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++)
        cr_assert_eq(mt_loadavg_running(bad[i]), -1, "'%s' is not a loadavg line", bad[i]);
    // and the count in force follows: the user's OMP_NUM_THREADS is kept as it is
    int n = mt_threads_adapt();
    cr_assert(n >= 1 && n <= omp_get_num_procs(), "%d threads", n);
    cr_assert_eq(omp_get_max_threads(), n);
}
