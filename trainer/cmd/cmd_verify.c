// trainer/cmd/cmd_verify.c — `moetrain verify PATH`: checks what moetrain wrote, or a model folder.
//
//   a checkpoint (state.json)      its own checksum, then size + SHA-256 of every file it lists
//   an output folder (--out)       every checkpoint-N, adapter/ and trained.safetensors in it
//   an adapter (adapter_config)    SHA256SUMS, then the PEFT config and tensors as a loader reads them
//   a .safetensors file            FILE.sha256 beside it, then its header and offsets
//   a model folder (config.json)   SHA256SUMS when present, then every shard's header and index
// Exit 0 when everything checked holds, 1 (naming the file and what failed) otherwise.
#include <dirent.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "core/common.h"
#include "core/fileio.h"
#include "core/safetensors.h"
#include "core/sha256.h"
#include "lora/peft.h"
#include "trainer/checkpoint.h"
#include "trainer/cmd/commands.h"

static int exists(const char *dir, const char *name) {
    char p[4400];
    snprintf(p, sizeof p, "%s/%s", dir, name);
    return access(p, F_OK) == 0;
}

// Sums in `list` when it exists: 1 checked, 0 absent, -1 failed.
static int sums(const char *list, const char *dir) {
    if (access(list, F_OK) != 0) return 0;
    return mt_sha256sums_check(list, dir, 1) < 0 ? -1 : 1;
}

static int count_pair(void *ctx, const char *module, const mt_st_tensor *a, const mt_st_tensor *b) {
    (void)module, (void)a, (void)b;
    ++*(int *)ctx;
    return 0;
}

static int verify_adapter(const char *dir) {
    char list[4400];
    snprintf(list, sizeof list, "%s/SHA256SUMS", dir);
    int s = sums(list, dir);
    if (s < 0) return -1;
    mt_peft_config cfg;
    int pairs = 0;
    // Without the base, the fused gate_up_proj's row order (gpt-oss interleaves gate and up) is
    // unknown: either order that reads is the adapter's structure.
    if (mt_peft_read(dir, &cfg, count_pair, &pairs) != 0) {
        mt_peft_layout gpt_oss = {.gate_up_interleaved = 1};
        pairs = 0;
        if (mt_peft_read_as(dir, &gpt_oss, &cfg, count_pair, &pairs) != 0) return -1;
        mt_error_clear();
    }
    printf("adapter %s: r=%d alpha=%g, %d adapted modules%s\n", dir, cfg.r, cfg.lora_alpha, pairs,
           s ? ", checksums hold" : "; no SHA256SUMS: structure checked, bytes unverifiable");
    return 0;
}

static int verify_safetensors(const char *path) {
    char list[4200], dir[4096];
    snprintf(list, sizeof list, "%s.sha256", path);
    snprintf(dir, sizeof dir, "%s", path);
    char *slash = strrchr(dir, '/');
    if (slash) *slash = 0;
    else strcpy(dir, ".");
    int s = sums(list, dir);
    if (s < 0) return -1;
    mt_st_file f;
    if (mt_st_file_open(&f, path) != 0) return -1;
    printf("%s: %zu tensors%s\n", path, f.n_tensors,
           s ? ", checksum holds" : "; no .sha256 beside it: structure checked, bytes unverifiable");
    mt_st_file_close(&f);
    return 0;
}

static int verify_checkpoint(const char *dir) {
    if (mt_checkpoint_verify(dir, 1) != 0) return -1;
    printf("checkpoint %s: verified\n", dir);
    return 0;
}

static int verify_out(const char *dir) {
    DIR *d = opendir(dir);
    if (!d) {
        mt_error_set("%s: cannot list", dir);
        return -1;
    }
    int bad = 0, seen = 0;
    struct dirent *e;
    char p[4400];
    while ((e = readdir(d))) {
        long long step;
        char tail;
        if (sscanf(e->d_name, "checkpoint-%lld%c", &step, &tail) != 1) continue;
        snprintf(p, sizeof p, "%s/%s", dir, e->d_name);
        seen++;
        if (verify_checkpoint(p) != 0) bad++, fprintf(stderr, "FAILED: %s\n", mt_error_get());
    }
    closedir(d);
    snprintf(p, sizeof p, "%s/adapter", dir);
    if (exists(dir, "adapter/adapter_config.json") && (seen++, verify_adapter(p) != 0))
        bad++, fprintf(stderr, "FAILED: %s\n", mt_error_get());
    snprintf(p, sizeof p, "%s/trained.safetensors", dir);
    if (exists(dir, "trained.safetensors") && (seen++, verify_safetensors(p) != 0))
        bad++, fprintf(stderr, "FAILED: %s\n", mt_error_get());
    if (!seen) {
        mt_error_set("%s: no checkpoint, adapter, model or moetrain output to verify", dir);
        return -1;
    }
    if (bad) mt_error_set("%s: %d of %d item%s failed verification", dir, bad, seen, seen == 1 ? "" : "s");
    return bad ? -1 : 0;
}

static int verify_model(const char *dir) {
    char list[4400];
    snprintf(list, sizeof list, "%s/SHA256SUMS", dir);
    int s = sums(list, dir);
    if (s < 0) return -1;
    mt_st_model m;
    if (mt_st_model_open(&m, dir) != 0) return -1;
    printf("model %s: %zu tensors%s\n", dir, m.n_tensors,
           s ? ", checksums hold" : "; no SHA256SUMS: structure checked, bytes unverifiable");
    mt_st_model_close(&m);
    return 0;
}

int cmd_verify(int argc, char **argv) {
    if (mt_args_want_help(argc, argv) || argc != 1) {
        printf("usage: moetrain verify PATH\n\n"
               "PATH: a checkpoint folder, an output folder (--out), an adapter folder, a model folder or a\n"
               ".safetensors file. Checks the checksums recorded beside them, then their structure.\n"
               "exit codes: 0 everything holds; 1 something failed (named); 2 bad usage\n");
        return argc == 1 || mt_args_want_help(argc, argv) ? MT_EXIT_OK : MT_EXIT_USAGE;
    }
    const char *path = argv[0];
    int rc;
    size_t n = strlen(path);
    if (!mt_is_dir(path)) {
        if (n > 12 && strcmp(path + n - 12, ".safetensors") == 0) rc = verify_safetensors(path);
        else mt_error_set("%s: not a folder or a .safetensors file", path), rc = -1;
    } else if (exists(path, "state.json")) rc = verify_checkpoint(path);
    else if (exists(path, "adapter_config.json")) rc = verify_adapter(path);
    else if (exists(path, "config.json")) rc = verify_model(path);
    else rc = verify_out(path);
    if (rc != 0) {
        fprintf(stderr, "moetrain verify: %s\n", mt_error_get());
        return MT_EXIT_ERROR;
    }
    return MT_EXIT_OK;
}
