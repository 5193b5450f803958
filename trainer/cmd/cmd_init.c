// trainer/cmd/cmd_init.c — `moetrain init`: a random-initialised checkpoint in Hugging Face layout
// (config.json + safetensors, sharded with an index above --shard-size), for tests and demos.
#include <string.h>

#include "core/common.h"
#include "core/fileio.h"
#include "core/safetensors.h"
#include "model/config.h"
#include "model/weights.h"
#include "trainer/cmd/commands.h"
#include "trainer/options.h"

static void init_usage(FILE *out) {
    fprintf(out,
            "usage: moetrain init --config CONFIG.json --out DIR [--seed N] [--dtype bf16|f32|f16]\n"
            "                     [--shard-size SIZE] [--allow-unknown-config]\n\n"
            "Writes DIR/config.json and the weights (norms 1, everything else N(0, initializer_range))\n"
            "as model.safetensors, or as model-0000i-of-0000N.safetensors shards with\n"
            "model.safetensors.index.json when larger than --shard-size (default 5GB, as\n"
            "transformers' save_pretrained). The same seed gives the same bytes whatever the sharding.\n"
            "Defaults: --seed 42, --dtype config.json's torch_dtype (bf16 when it names none).\n"
            "--allow-unknown-config: config fields moetrain does not know are warned and ignored, not refused.\n");
}

typedef struct {
    const mt_model_config *cfg;
    const mt_weight_desc *weights;
    uint64_t seed;
    mt_dtype dtype;
} init_ctx;

static int fill_weight(void *ctx, size_t index, void *dst, size_t nbytes) {
    init_ctx *c = ctx;
    (void)nbytes;
    mt_weights_init_fill(c->cfg, &c->weights[index], c->seed, c->dtype, dst);
    return 0;
}

int cmd_init(int argc, char **argv) {
    const char *config = NULL, *out = NULL, *dtype_name = NULL;
    uint64_t seed = 42;
    double shard_size = 5e9;
    static const char *known[] = {"--config", "--out", "--dtype", "--seed", "--shard-size"};
    for (int i = 0; i < argc; i++) {
        const char *a = argv[i];
        if (strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0) { init_usage(stdout); return MT_EXIT_OK; }
        if (strcmp(a, "--allow-unknown-config") == 0) {  // the one flag without a value
            mt_config_allow_unknown(1);
            continue;
        }
        size_t k = 0;
        while (k < MT_ARRAY_LEN(known) && strcmp(a, known[k]) != 0) k++;
        if (k == MT_ARRAY_LEN(known)) {
            fprintf(stderr, "moetrain init: unknown argument '%s' (see moetrain init --help)\n", a);
            return MT_EXIT_USAGE;
        }
        if (i + 1 >= argc) {
            fprintf(stderr, "moetrain init: %s needs a value\n", a);
            return MT_EXIT_USAGE;
        }
        const char *v = argv[++i];
        int ok = 1;
        if (k == 0) config = v;
        else if (k == 1) out = v;
        else if (k == 2) dtype_name = v;
        else if (k == 3) {
            char *end;
            seed = strtoull(v, &end, 10);
            ok = *v >= '0' && *v <= '9' && !*end;
        } else ok = mt_parse_bytes(v, &shard_size) == 0 && shard_size >= 1;
        if (!ok) {
            fprintf(stderr, "moetrain init: bad value '%s' for %s\n", v, a);
            return MT_EXIT_USAGE;
        }
    }
    if (!config || !out) {
        fprintf(stderr, "moetrain init: --config and --out are required\n");
        init_usage(stderr);
        return MT_EXIT_USAGE;
    }
    mt_model_config cfg;
    if (mt_model_config_load(config, &cfg) != 0) {
        fprintf(stderr, "moetrain init: %s\n", mt_error_get());
        return MT_EXIT_ERROR;
    }
    if (dtype_name) {
        mt_dtype t;
        if (mt_dtype_parse(dtype_name, &t) != 0) {
            fprintf(stderr, "moetrain init: --dtype: %s\n", mt_error_get());
            return MT_EXIT_USAGE;
        }
        cfg.torch_dtype = t;
    }
    // init writes unquantized weights; `moetrain quantize` makes 4-bit ones
    cfg.quantized = 0, cfg.mxfp4 = 0, cfg.fp8_block[0] = cfg.fp8_block[1] = 0;

    mt_weight_desc *weights;
    size_t n = mt_weights_list(&cfg, &weights);
    mt_st_entry *entries = mt_xcalloc(n, sizeof *entries);
    for (size_t i = 0; i < n; i++) {
        entries[i].name = weights[i].name;
        entries[i].dtype = mt_st_dtype_of(cfg.torch_dtype);
        entries[i].ndim = weights[i].ndim;
        for (int d = 0; d < weights[i].ndim; d++) entries[i].shape[d] = weights[i].shape[d];
    }
    init_ctx ctx = {&cfg, weights, seed, cfg.torch_dtype};
    char path[4200];
    snprintf(path, sizeof path, "%s/config.json", out);
    int rc = MT_EXIT_OK;
    if (mt_mkdir_p(out) != 0 || mt_st_write_sharded(out, entries, n, (uint64_t)shard_size, fill_weight, &ctx) != 0 ||
        mt_model_config_write(&cfg, path) != 0 || mt_model_sums_write(out) != 0) {
        fprintf(stderr, "moetrain init: %s\n", mt_error_get());
        rc = MT_EXIT_ERROR;
    } else {
        mt_info("init: wrote %s: %zu tensors, %lld params, dtype=%s seed=%llu", out, n,
                (long long)mt_config_total_params(&cfg), mt_dtype_name(cfg.torch_dtype),
                (unsigned long long)seed);
    }
    free(entries);
    free(weights);
    return rc;
}
