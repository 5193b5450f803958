# moetrain — one flat Makefile.
#   make            CPU build: build/moetrain
#   make CUDA=1     also the CUDA backend (sm_80, sm_90): build-cuda/moetrain
#   make test       builds and runs the Criterion suite (CUDA tests skip, saying so, without a GPU)
#   make asan       the suite under AddressSanitizer + UBSan (build-asan/)
#   make bench      benchmarks
#   make layers     checks that no #include points up a layer (scripts/check_layers.sh)
#   make check-docs checks that README and docs/ name only files a clone has (scripts/check_docs.sh)
#   make bench-torch  moetrain beside PyTorch+PEFT (needs torch from PyPI; not CI)
#   make SIM=1      the CUDA build with every .cu run on the CPU by tests/cudasim: build-sim/
#   make test-sim   the whole suite on that build (CPU-emulated CUDA); its CUDA tests in two thread orders
SHELL := /bin/bash
.SHELLFLAGS := -o pipefail -c
CUDA ?= 0
SAN ?= 0
SIM ?= 0
ifeq ($(SAN),1)
BUILD ?= build-asan
else ifeq ($(SIM),1)
BUILD ?= build-sim
else ifeq ($(CUDA),1)
BUILD ?= build-cuda
else
BUILD ?= build
endif

CC ?= gcc
CUDA_HOME ?= /usr/local/cuda
NVCC ?= $(CUDA_HOME)/bin/nvcc

# Flags come from $(BUILD)/config.mk, which scripts/configure.sh writes after scripts/deps.sh has
# installed what was missing: nothing is probed before the packages exist. make reads it, builds
# it when absent or older than the scripts, and restarts with it.
.DEFAULT_GOAL := all
CONFIG_MK := $(BUILD)/config.mk
NO_CONFIG_GOALS := clean layers check-docs
ifneq ($(filter-out $(NO_CONFIG_GOALS),$(or $(MAKECMDGOALS),all)),)
include $(CONFIG_MK)
endif
$(CONFIG_MK): scripts/deps.sh scripts/configure.sh
	@mkdir -p $(BUILD)
	@bash scripts/deps.sh
	@bash scripts/configure.sh > $@.tmp
	@mv $@.tmp $@
deps: $(CONFIG_MK)

# -fno-trapping-math -fno-math-errno: no code reads the FP exception flags, nor errno after a math
# call; without them GCC keeps a float select followed by arithmetic as a branch and sqrtf as a
# call, and either stops the vectorizer (core/vmath.h's exp, AdamW). Results are unchanged.
CFLAGS := -std=c11 -O2 -g -Wall -Wextra -fopenmp -fno-trapping-math -fno-math-errno -D_GNU_SOURCE -I. $(PKG_CFLAGS) $(BLAS_CFLAGS) -MMD -MP
LDLIBS := $(BLAS_LIBS) -lcjson -lyaml -lm -fopenmp
# Byte-level BPE (data/bpe.c): PCRE2 for the pre-tokenizer regexes, utf8proc for NFC.
LDLIBS += -lpcre2-8 -lutf8proc
# SentencePiece (Mixtral's tokenizer.model) through the C++ shim data/sentencepiece_shim.cc.
CFLAGS += -DMT_SENTENCEPIECE
CXXFLAGS := -std=c++17 -O2 -g -Wall -Wextra -I. -MMD -MP
LDLIBS += -lsentencepiece -lsentencepiece_train -lstdc++
ifeq ($(SAN),1)
SANFLAGS := -fsanitize=address,undefined -fno-omit-frame-pointer -fno-sanitize-recover=undefined
CFLAGS += $(SANFLAGS) -O1
CXXFLAGS += $(SANFLAGS) -O1
LDLIBS += $(SANFLAGS)
endif

# One folder per job, bottom-up by layer: core < quant, lora, moe < model < data, optim, plan <
# trainer (README "Layout"; `make layers` checks that no include points up). The sub-commands
# (eval, generate, init, merge, plan, quantize, demo) live in trainer/cmd/, beside the
# program's loop, checkpoints, metrics and options in trainer/.
DIRS := core quant lora moe model data optim plan trainer trainer/cmd
MAIN_SRC := trainer/main.c
LIB_SRC := $(filter-out $(MAIN_SRC),$(foreach d,$(DIRS),$(wildcard $(d)/*.c)))
TEST_SRC := $(wildcard tests/*.c)
CU_SRC :=
CC_SRC := $(foreach d,$(DIRS),$(wildcard $(d)/*.cc))

ifeq ($(CUDA),1)
CU_SRC := $(foreach d,$(DIRS),$(wildcard $(d)/*.cu))
CFLAGS += -DMT_CUDA -I$(CUDA_HOME)/include
# NVCC_ARCH: the GPU targets. The GPU check's bundle (scripts/gpu_bundle.sh) builds sm_90a alone:
# a third of the compile time, and Hopper's own instructions.
NVCC_ARCH ?= -gencode arch=compute_80,code=sm_80 -gencode arch=compute_90,code=sm_90 \
             -gencode arch=compute_90,code=compute_90
NVCCFLAGS := -O2 -g -std=c++20 -I. -DMT_CUDA -MMD -MP $(NVCC_ARCH) -Xcompiler -Wall,-Wextra
LDLIBS += -L$(CUDA_HOME)/lib64 -L$(CUDA_HOME)/lib -Wl,-rpath,$(CUDA_HOME)/lib64 \
          -Wl,-rpath,$(CUDA_HOME)/lib -lcublasLt -lcublas -lcudart -lnccl -lstdc++
endif

# MPI (Open MPI): core/comm_mpi.c and the NCCL bootstrap. Without mpicc (config.mk's MPI_LIBS is
# empty), comm is single-process only (core/comm_mpi.c compiles to a stub that says so) and
# `make test-mpi` refuses.
ifneq ($(MPI_LIBS),)
CFLAGS += -DMT_MPI $(MPI_CFLAGS)
LDLIBS += $(MPI_LIBS)
ifeq ($(CUDA),1)
NVCCFLAGS += -DMT_MPI $(MPI_CFLAGS)
endif
endif

# ---------------------------------------------------------------------------------------------
# SIM=1: the CUDA backend built for the CPU. Every .cu is rewritten by tests/cudasim/cu2cpp.py
# (launches and __shared__) and compiled as C++ by the host compiler with tests/cudasim/cudasim.h
# force-included; the C files see -DMT_CUDA as in CUDA=1; libcudart, libcublasLt and libnccl are
# replaced by the emulator's runtime and stand-ins (tests/cudasim/*.cc). Test-only: nothing
# outside tests/ includes or links tests/cudasim unless SIM=1.
ifeq ($(SIM),1)
CU_SRC := $(foreach d,$(DIRS),$(wildcard $(d)/*.cu))
SIM_SRC := $(wildcard tests/cudasim/*.cc)
CC_SRC += $(SIM_SRC)
CFLAGS += -DMT_CUDA -I$(CUDA_HOME)/include
SIMFLAGS := -std=c++20 -O2 -g -I. -Itests/cudasim -I$(CUDA_HOME)/include -DMT_CUDA -MMD -MP -fno-strict-aliasing
ifneq ($(MPI_LIBS),)
SIMFLAGS += -DMT_MPI -DOMPI_SKIP_MPICXX -DMPICH_SKIP_MPICXX $(MPI_CFLAGS)
endif
LDLIBS += -lstdc++ -lpthread
$(SIM_SRC:%.cc=$(BUILD)/%.cc.o): CXXFLAGS := $(SIMFLAGS) -Wall -Wextra
SIM_CU_OBJ := $(CU_SRC:%.cu=$(BUILD)/%.cu.o)
# nvcc-only spellings in the .cu files (attributes g++ does not know) are not warnings here.
$(SIM_CU_OBJ): $(BUILD)/%.cu.o: %.cu tests/cudasim/cu2cpp.py $(BUILD)/flags.stamp | $(BUILD)/config.mk
	@mkdir -p $(dir $@)
	python3 tests/cudasim/cu2cpp.py $< $(@:.o=.cpp)
	$(CXX) $(SIMFLAGS) -w -include tests/cudasim/cudasim.h -c $(@:.o=.cpp) -o $@
# The emulator's own checks: programs with planted bugs it must report (tests/cudasim/selftest.cu).
SIM_SELFTEST := $(BUILD)/tests/cudasim/selftest
$(SIM_SELFTEST).cu.o: tests/cudasim/selftest.cu tests/cudasim/cu2cpp.py $(BUILD)/flags.stamp | $(BUILD)/config.mk
	@mkdir -p $(dir $@)
	python3 tests/cudasim/cu2cpp.py $< $(@:.o=.cpp)
	$(CXX) $(SIMFLAGS) -Wall -Wextra -include tests/cudasim/cudasim.h -c $(@:.o=.cpp) -o $@
$(SIM_SELFTEST): $(SIM_SELFTEST).cu.o $(SIM_SRC:%.cc=$(BUILD)/%.cc.o)
	$(CXX) $^ -o $@ $(LDLIBS)
all: $(SIM_SELFTEST)
-include $(SIM_SELFTEST).cu.d
# tests/mpi's programs link core/, whose CUDA half needs the emulator's runtime.
$(patsubst %.c,$(BUILD)/%,$(wildcard tests/mpi/*.c)): $(SIM_SRC:%.cc=$(BUILD)/%.cc.o)
endif

# Objects depend on a stamp of the flags they were built with: a changed flag (MPI found later,
# a sanitizer, a define) rebuilds them instead of linking stale objects.
FLAGS_STAMP := $(BUILD)/flags.stamp
FLAGS_NOW := $(CC) $(CFLAGS) | $(CXX) $(CXXFLAGS) | $(NVCC) $(NVCCFLAGS) | $(SIMFLAGS)
ifneq ($(wildcard $(CONFIG_MK)),)
ifneq ($(file <$(FLAGS_STAMP)),$(FLAGS_NOW))
$(file >$(FLAGS_STAMP),$(FLAGS_NOW))
endif
endif
$(FLAGS_STAMP):

LIB_OBJ := $(LIB_SRC:%.c=$(BUILD)/%.o) $(CU_SRC:%.cu=$(BUILD)/%.cu.o) $(CC_SRC:%.cc=$(BUILD)/%.cc.o)
MAIN_OBJ := $(MAIN_SRC:%.c=$(BUILD)/%.o)
TEST_OBJ := $(TEST_SRC:%.c=$(BUILD)/%.o)
BIN := $(BUILD)/moetrain
TEST_BIN := $(BUILD)/moetrain_tests

.PHONY: all test asan interop interop-tensorboard bench bench-torch bench-gpu fuzz clean deps test-mpi layers check-docs test-sim gpu-bundle
all: $(BIN)

$(BUILD)/%.o: %.c $(FLAGS_STAMP) | $(CONFIG_MK)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -c $< -o $@

$(BUILD)/%.cu.o: %.cu $(FLAGS_STAMP) | $(CONFIG_MK)
	@mkdir -p $(dir $@)
	$(NVCC) $(NVCCFLAGS) -c $< -o $@

$(BUILD)/%.cc.o: %.cc $(FLAGS_STAMP) | $(CONFIG_MK)
	@mkdir -p $(dir $@)
	$(CXX) $(CXXFLAGS) -c $< -o $@

$(BIN): $(MAIN_OBJ) $(LIB_OBJ)
	$(CC) $(CFLAGS) $^ -o $@ $(LDLIBS)

# Tests find the binary and the repository through these (CLI tests run the real program). The
# GPU bundle, which runs on another machine, sets both relative to the repository root.
TEST_BIN_PATH ?= $(abspath $(BIN))
TEST_REPO_ROOT ?= $(CURDIR)
$(BUILD)/tests/%.o: CFLAGS += -DMT_TEST_BIN='"$(TEST_BIN_PATH)"' -DMT_REPO_ROOT='"$(TEST_REPO_ROOT)"'
$(TEST_BIN): $(TEST_OBJ) $(LIB_OBJ)
	$(CC) $(CFLAGS) $^ -o $@ $(LDLIBS) -lcriterion

# The data path with one allocation made to fail (tests/failalloc/; run by tests/test_failalloc.c).
FAILALLOC_BIN := $(BUILD)/failalloc_data
$(FAILALLOC_BIN): $(BUILD)/tests/failalloc/failalloc_data.o $(LIB_OBJ)
	$(CC) $(CFLAGS) $^ -o $@ $(LDLIBS)
$(BUILD)/tests/%.o: CFLAGS += -DMT_FAILALLOC_BIN='"$(abspath $(FAILALLOC_BIN))"'

# Skipped tests are listed with their reason; passing ones are not, to keep the output short.
TEST_JOBS ?= 2
test: $(BIN) $(TEST_BIN) $(FAILALLOC_BIN)
	$(TEST_BIN) --jobs $(TEST_JOBS) --verbose=1 2>&1 | grep -vE '^\[(RUN |PASS)\]|: Test is disabled$$'


# One job: with several, Criterion 2.4.1's runner leaks a 48-byte timeout request (its own calloc)
# per .timeout test that ends beside another, which LeakSanitizer reports; one job is also faster
# under ASan on two cores (2 min against 3).
asan:
	$(MAKE) SAN=1 TEST_JOBS=1 test

# moetrain's adapters against the Hugging Face stacks (scripts/interop.sh): needs torch, so it is
# run by hand, not in CI. T5PY / T4PY: the pythons of a transformers 5 + PEFT + bitsandbytes venv
# and a transformers 4.57 + PEFT 0.17 one; FIXTURES=1 rewrites tests/data/peft_v5/.
interop: $(BIN)
	bash scripts/interop.sh
	bash scripts/tensorboard_interop.sh

# --report-to tensorboard read back by TensorBoard's own reader (TBPY: a python with tensorboard).
interop-tensorboard: $(BIN)
	bash scripts/tensorboard_interop.sh

# No #include points up a layer (scripts/check_layers.sh says which may include which).
layers:
	@bash scripts/check_layers.sh

# README and docs/ point only at files a clone has, and cited doc sections exist (scripts/check_docs.sh).
check-docs:
	@bash scripts/check_docs.sh

# The CUDA suite executed on the CPU (tests/cudasim/run.sh: two thread orders, the planted-bug
# self-tests, the CLI run against the CPU, the 2-rank NCCL run). Results are CPU-emulated.
test-sim:
	$(MAKE) SIM=1 all build-sim/moetrain_tests build-sim/tests/mpi/compare_runs build-sim/moetrain_roofline \
	  build-sim/failalloc_data
	bash tests/cudasim/run.sh build-sim

# Multi-rank checks of core/comm and of parallel training: plain programs (Criterion forks, which
# MPI does not survive) and moetrain itself, run under mpirun -np 2 and -np 4 --oversubscribe by
# tests/mpi/run.sh; the programs use core/ objects only.
MPI_TEST_SRC := $(wildcard tests/mpi/*.c)
MPI_TEST_OBJ := $(MPI_TEST_SRC:%.c=$(BUILD)/%.o)
MPI_TEST_BIN := $(MPI_TEST_SRC:%.c=$(BUILD)/%)
$(MPI_TEST_BIN): $(BUILD)/tests/mpi/%: $(BUILD)/tests/mpi/%.o $(filter $(BUILD)/core/%,$(LIB_OBJ))
	$(CC) $(CFLAGS) $^ -o $@ $(LDLIBS)
test-mpi: $(MPI_TEST_BIN) $(BUILD)/moetrain
	@test -n "$(MPI_LIBS)" || { echo "test-mpi: no MPI (mpicc not found)"; exit 1; }
	bash tests/mpi/run.sh $(BUILD)

$(BUILD)/moetrain_bench: $(BUILD)/scripts/bench.o $(LIB_OBJ)
	$(CC) $(CFLAGS) $^ -o $@ $(LDLIBS)

bench: $(BUILD)/moetrain_bench
	$(BUILD)/moetrain_bench

# moetrain beside PyTorch+transformers+PEFT (scripts/bench_torch/; not CI: installs torch from PyPI
# into $$BENCH_TORCH_VENV on first use). BENCH_TORCH_ARGS passes flags, e.g. --seqs 128 --rounds 3.
bench-torch: $(BIN)
	bash scripts/bench_torch/run.sh $(BIN) $(BENCH_TORCH_ARGS)

# The roofline PROJECTION of the QLoRA step on an H100 (scripts/roofline.c, any machine, no GPU),
# then, in a CUDA build, the CUDA training step at Mixtral-8x7B's size measured (scripts/bench_gpu.c);
# BENCH_GPU_ARGS passes flags to the latter.
$(BUILD)/moetrain_roofline: $(BUILD)/scripts/roofline.o $(LIB_OBJ)
	$(CC) $(CFLAGS) $^ -o $@ $(LDLIBS)
-include $(BUILD)/scripts/roofline.d
# Built in SIM=1 too: the GPU check's programs run CPU-emulated (tests/cudasim/run.sh) before a GPU
# ever sees them.
ifneq ($(CUDA)$(SIM),00)
all: $(BUILD)/moetrain_bench_gpu $(BUILD)/moetrain_gpu_probe $(BUILD)/cuda_parity
$(BUILD)/moetrain_bench_gpu: $(BUILD)/scripts/bench_gpu.o $(LIB_OBJ)
	$(CC) $(CFLAGS) $^ -o $@ $(LDLIBS)
# The GPU check's first steps: the device, the libraries' versions, a 1-rank NCCL all-reduce;
# then every CUDA op against its CPU twin without Criterion.
$(BUILD)/moetrain_gpu_probe: $(BUILD)/scripts/gpu_probe.o $(LIB_OBJ)
	$(CC) $(CFLAGS) $^ -o $@ $(LDLIBS)
$(BUILD)/cuda_parity: $(BUILD)/scripts/cuda_parity.o $(LIB_OBJ)
	$(CC) $(CFLAGS) $^ -o $@ $(LDLIBS)
-include $(BUILD)/scripts/gpu_probe.d $(BUILD)/scripts/cuda_parity.d
bench-gpu: $(BUILD)/moetrain_roofline $(BUILD)/moetrain_bench_gpu
	@n=$$(bash scripts/sass_count.sh --both) || n=; $(BUILD)/moetrain_roofline $${n:+--dequant-instr $$n}
	$(BUILD)/moetrain_bench_gpu $(BENCH_GPU_ARGS)
-include $(BUILD)/scripts/bench_gpu.d
else
bench-gpu: $(BUILD)/moetrain_roofline
	@n=$$(bash scripts/sass_count.sh --both) || n=; $(BUILD)/moetrain_roofline $${n:+--dequant-instr $$n}
	@echo "bench-gpu: the measured step needs a CUDA build and a GPU: make CUDA=1 bench-gpu"
endif

# What the GPU check runs, prebuilt for a bare H100 machine (sm_90a, the libraries it needs that
# are not the C library or CUDA's own): .gpubundle/, carried there beside the tree
# (scripts/gpu_bundle.sh; scripts/gpu_check.sh --rehearse tries it in a clean root).
gpu-bundle:
	bash scripts/gpu_bundle.sh

# Parsers under libFuzzer with ASan/UBSan (clang), seeded from real files (tests/fuzz/seeds/<target>/
# for the newer targets); FUZZ_SECONDS each.
FUZZ_SECONDS ?= 20
FUZZ_DIR := build-fuzz
FUZZ_SRC := $(LIB_SRC)
# The library is compiled once for every target (instrumented, not linked with the fuzzer's main).
FUZZ_CFLAGS = -std=c11 -g -O1 -D_GNU_SOURCE -I. $(PKG_CFLAGS) $(BLAS_CFLAGS) -fno-sanitize-recover=undefined
FUZZ_OBJ := $(FUZZ_SRC:%.c=$(FUZZ_DIR)/%.o)
$(FUZZ_DIR)/%.o: %.c | $(CONFIG_MK)
	@mkdir -p $(dir $@)
	clang $(FUZZ_CFLAGS) -fsanitize=fuzzer-no-link,address,undefined -MMD -MP -c $< -o $@
-include $(FUZZ_OBJ:.o=.d)
FUZZ_SEEDS_config := configs/*.json
FUZZ_SEEDS_yaml := configs/*.yaml
FUZZ_SEEDS_safetensors := tests/fuzz/seeds/*.safetensors
fuzz: $(CONFIG_MK) $(FUZZ_OBJ)
	@mkdir -p $(FUZZ_DIR)
	@set -e; for t in $(patsubst tests/fuzz/fuzz_%.c,%,$(wildcard tests/fuzz/fuzz_*.c)); do \
	  clang $(FUZZ_CFLAGS) -fsanitize=fuzzer,address,undefined tests/fuzz/fuzz_$$t.c $(FUZZ_OBJ) -o $(FUZZ_DIR)/fuzz_$$t \
	    $(BLAS_LIBS) -lcjson -lyaml -lpcre2-8 -lutf8proc -lm; \
	  mkdir -p $(FUZZ_DIR)/corpus_$$t; \
	  case $$t in config) cp $(FUZZ_SEEDS_config) $(FUZZ_DIR)/corpus_$$t/;; \
	    yaml) cp $(FUZZ_SEEDS_yaml) $(FUZZ_DIR)/corpus_$$t/;; \
	    safetensors) cp $(FUZZ_SEEDS_safetensors) $(FUZZ_DIR)/corpus_$$t/ 2>/dev/null || true;; \
	    *) cp tests/fuzz/seeds/$$t/* $(FUZZ_DIR)/corpus_$$t/ 2>/dev/null || true;; esac; \
	  echo "fuzz: $$t for $(FUZZ_SECONDS) s"; \
	  $(FUZZ_DIR)/fuzz_$$t -max_total_time=$(FUZZ_SECONDS) -max_len=65536 -rss_limit_mb=2048 \
	    -artifact_prefix=$(FUZZ_DIR)/$$t- -print_final_stats=1 $(FUZZ_DIR)/corpus_$$t \
	    > $(FUZZ_DIR)/$$t.log 2>&1 || { tail -40 $(FUZZ_DIR)/$$t.log; echo "fuzz: $$t FAILED"; exit 1; }; \
	  grep -h "stat::number_of_executed_units" $(FUZZ_DIR)/$$t.log; \
	done

clean:
	rm -rf build build-cuda build-asan build-fuzz build-sim build-gpu .gpubundle

-include $(LIB_OBJ:.o=.d) $(MAIN_OBJ:.o=.d) $(TEST_OBJ:.o=.d) $(MPI_TEST_OBJ:.o=.d) $(BUILD)/tests/failalloc/failalloc_data.d
