// trainer/main.c — `moetrain [SUB-COMMAND] [FLAGS]`: dispatch to the sub-commands.
#include <stdio.h>
#include <string.h>

#include "core/common.h"
#include "core/hostmem.h"
#include "core/threads.h"
#include "trainer/cmd/commands.h"
#include "trainer/options.h"

// The program's version; `moetrain --version` prints it with what this build includes.
#define MT_VERSION "0.28.0"

typedef struct {
    const char *name;
    const char *summary;
    int (*run)(int argc, char **argv);
} subcommand;

static const subcommand subcommands[] = {
    {"train", "fine-tune a model (the default sub-command)", cmd_train},
    {"plan", "print the per-GPU memory budget of a run and whether it fits", cmd_plan},
    {"init", "write a random-initialised checkpoint of a config", cmd_init},
    {"demo", "the whole tool on a tiny model in a few minutes (no downloads)", cmd_demo},
    {"eval", "loss and perplexity on a data file", cmd_eval},
    {"generate", "sample text, with or without an adapter", cmd_generate},
    {"merge", "fold an adapter into a bf16 checkpoint", cmd_merge},
    {"quantize", "write a 4-bit checkpoint once, load it fast later", cmd_quantize},
    {"verify", "check a checkpoint, output folder, adapter or model against its checksums", cmd_verify},
};

static void print_usage(FILE *out) {
    fprintf(out,
            "moetrain — fine-tune Mixture-of-Experts models on GPUs too small for them\n\n"
            "usage: moetrain [SUB-COMMAND] [FLAGS]      (train is the default)\n"
            "       moetrain SUB-COMMAND --help\n\nsub-commands:\n");
    for (size_t i = 0; i < MT_ARRAY_LEN(subcommands); i++)
        fprintf(out, "  %-10s %s\n", subcommands[i].name, subcommands[i].summary);
    fprintf(out, "\nexamples:\n"
                 "  moetrain plan --case C\n"
                 "  moetrain init --config configs/tiny.json --out /tmp/tiny\n"
                 "  moetrain plan --model /tmp/tiny --mode lora --r 16 --experts all\n"
                 "  moetrain --model DIR --data FILE --mode lora --r 16 --experts all\n"
                 "  moetrain --resume OUT          (continue a stopped run)\n\n");
    mt_exit_codes_print(out);
}

static void print_version(void) {
    printf("moetrain %s (%s build", MT_VERSION,
#ifdef MT_CUDA
           "CUDA"
#else
           "CPU"
#endif
    );
#ifdef MT_MPI
    printf(", MPI");
#endif
#ifdef MT_SENTENCEPIECE
    printf(", SentencePiece");
#endif
    printf(")\n");
}

int cmd_not_built(const char *name, const char *issue) {
    fprintf(stderr, "moetrain %s: not built yet (planned in %s); nothing was run.\n", name, issue);
    return MT_EXIT_NOT_BUILT;
}

int main(int argc, char **argv) {
    mt_threads_init(argv);  // OMP_WAIT_POLICY=passive unless the user chose (core/threads.h)
    mt_hostmem_reserve();   // a ulimit -v that cannot fit OpenBLAS: exit 4 now (core/hostmem.h)
    if (argc >= 2 && (strcmp(argv[1], "--help") == 0 || strcmp(argv[1], "-h") == 0 ||
                      strcmp(argv[1], "help") == 0)) {
        print_usage(stdout);
        return MT_EXIT_OK;
    }
    if (argc >= 2 && (strcmp(argv[1], "--version") == 0 || strcmp(argv[1], "version") == 0)) {
        print_version();
        return MT_EXIT_OK;
    }
    // The first argument names a sub-command unless it is a flag: then it is `train`.
    if (argc >= 2 && argv[1][0] != '-') {
        for (size_t i = 0; i < MT_ARRAY_LEN(subcommands); i++)
            if (strcmp(argv[1], subcommands[i].name) == 0) return subcommands[i].run(argc - 2, argv + 2);
        fprintf(stderr, "moetrain: unknown sub-command '%s' (see moetrain --help)\n", argv[1]);
        return MT_EXIT_USAGE;
    }
    return cmd_train(argc - 1, argv + 1);
}
