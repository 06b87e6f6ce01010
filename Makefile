# k25dec build. Knobs:
#   CUDA=0|1       CUDA backend (default: 1 when nvcc is found under CUDA_HOME)
#   CUDA_HOME      CUDA toolkit (default /usr/local/cuda)
#   SM=90          GPU architecture (H100/H200)
#   SAN=1          AddressSanitizer + UndefinedBehaviorSanitizer (CPU code)
#   PHASES=1       in-kernel phase stamps (kernels/phase_stamps.cuh, k25bench --phases)
#   DEBUG=1        -O0 -g, NaN/Inf checks on by default
#   BUILD=build    object directory (binaries land at the repository root)
# Targets: all (k25dec, k25bench, k25-mkckpt, k25-mkeagle, tests, micro benchmarks), test,
#          test-gpu, run, fuzz, clean.

CUDA_HOME ?= /usr/local/cuda
SM        ?= 90
BUILD     ?= build
MPICC     ?= mpicc
NVCC      := $(CUDA_HOME)/bin/nvcc

ifeq ($(wildcard $(NVCC)),)
  CUDA ?= 0
else
  CUDA ?= 1
endif

PKGS := inih libcjson libpcre2-8 zlib
ifneq ($(shell pkg-config --exists $(PKGS) && echo yes),yes)
  $(error missing libraries: install libinih-dev libcjson-dev libpcre2-dev zlib1g-dev pkg-config)
endif
ifeq ($(shell command -v $(MPICC)),)
  $(error $(MPICC) not found: install libopenmpi-dev openmpi-bin)
endif

CFLAGS  := -std=c11 -D_GNU_SOURCE -Wall -Wextra -Wno-unused-parameter -fopenmp \
           -Isrc -Ikernels $(shell pkg-config --cflags $(PKGS)) -MMD -MP
LDLIBS  := $(shell pkg-config --libs $(PKGS)) -lm -fopenmp
ifeq ($(DEBUG),1)
  CFLAGS += -O0 -g -DK25_DEBUG=1
else
  CFLAGS += -O2 -g -march=x86-64-v2
endif
ifeq ($(SAN),1)
  # gcc leaves float-to-integer overflow out of "undefined"; a config value cast to int needs it
  CFLAGS += -O1 -fsanitize=address,undefined,float-cast-overflow -fno-omit-frame-pointer \
            -fno-sanitize-recover=undefined,float-cast-overflow
  LDLIBS += -fsanitize=address,undefined,float-cast-overflow
  override BUILD := $(BUILD)-san
endif
ifeq ($(PHASES),1)
  override BUILD := $(BUILD)-phases
endif

$(info ✓ MPI: $(shell $(MPICC) --showme:version 2>/dev/null | head -1))
ifeq ($(CUDA),1)
  NCCL_OK := $(wildcard $(CUDA_HOME)/include/nccl.h /usr/include/nccl.h)
  ifeq ($(NCCL_OK),)
    $(error CUDA=1 but nccl.h not found under $(CUDA_HOME)/include or /usr/include)
  endif
  $(info ✓ CUDA: $(shell $(NVCC) --version | tail -2 | head -1) (sm_$(SM)))
  $(info ✓ NCCL: $(firstword $(NCCL_OK)))
  MPI_CFLAGS := $(shell $(MPICC) --showme:compile)
  NVCC_ARCH  := -gencode=arch=compute_$(SM),code=sm_$(SM)
  NVCCFLAGS  := -O3 -std=c++17 -lineinfo \
                -Isrc -Ikernels $(MPI_CFLAGS) -Xcompiler -fopenmp -MMD -MP \
                $(if $(filter 1,$(PHASES)),-DK25_PHASES)
  CFLAGS     += -DK25_CUDA=1 -I$(CUDA_HOME)/include
  LDLIBS     += -L$(CUDA_HOME)/lib64 -L$(CUDA_HOME)/lib -lcudart -lcublasLt -lcublas -lnccl \
                -Wl,-rpath,$(CUDA_HOME)/lib64 -lstdc++
  CU_SRCS    := $(wildcard kernels/*.cu)
  # CUPTI, for k25bench --trace only (src/kernel_trace.h)
  TRACE_LIBS := -L$(CUDA_HOME)/extras/CUPTI/lib64 -lcupti -Wl,-rpath,$(CUDA_HOME)/lib \
                -Wl,-rpath,$(CUDA_HOME)/extras/CUPTI/lib64
else
  $(info ✗ CUDA: not built (CUDA=0 or no nvcc at $(NVCC)); CPU backend only)
  CU_SRCS    :=
endif

# Library sources: everything in src/ except entry points; entry points are *_main.c / main.c.
MAIN_SRCS := src/main.c bench/k25bench.c
LIB_SRCS  := $(filter-out $(MAIN_SRCS) src/backend_cuda_none.c src/kernel_trace_%.c,\
                          $(wildcard src/*.c))
ifneq ($(CUDA),1)
  LIB_SRCS += src/backend_cuda_none.c src/kernel_trace_none.c
else
  LIB_SRCS += src/kernel_trace_cupti.c
endif
LIB_OBJS  := $(LIB_SRCS:%.c=$(BUILD)/%.o) $(CU_SRCS:%.cu=$(BUILD)/%.o)
TOOLS     := $(patsubst tools/%.c,%,$(wildcard tools/*.c))
TESTS     := $(patsubst tests/%.c,$(BUILD)/tests/%,$(wildcard tests/test_*.c))
# GPU tests and micro benchmarks (tests/gpu_*.cu, bench/micro_*.cu): compiled by nvcc, linked
# like every other program; built by `all` when CUDA=1 so that CI keeps compiling them.
ifeq ($(CUDA),1)
  GPU_TESTS  := $(patsubst tests/%.cu,$(BUILD)/tests/%,$(wildcard tests/gpu_*.cu))
  GPU_BENCHES := $(patsubst bench/%.cu,$(BUILD)/bench/%,$(wildcard bench/micro_*.cu))
else
  GPU_TESTS  :=
  GPU_BENCHES :=
endif
BENCHES   := $(patsubst bench/%.c,$(BUILD)/bench/%,$(filter-out bench/k25bench.c,$(wildcard bench/*.c)))

BINS := k25dec $(TOOLS) $(if $(wildcard bench/k25bench.c),k25bench)

.PHONY: all test test-gpu clean run
all: $(BINS) $(TESTS) $(BENCHES) $(GPU_TESTS) $(GPU_BENCHES)

# Objects of one flavor (CUDA or not, DEBUG, ...) must not be linked into another: in a build
# directory every object depends on a stamp of the compile flags, rewritten when they change.
FLAGS_STAMP := $(BUILD)/.compile-flags
FLAGS_NOW   := CUDA=$(CUDA) $(CFLAGS) $(NVCCFLAGS) $(NVCC_ARCH)
$(shell mkdir -p $(BUILD) && [ "$$(cat $(FLAGS_STAMP) 2>/dev/null)" = '$(FLAGS_NOW)' ] || \
        printf '%s\n' '$(FLAGS_NOW)' >$(FLAGS_STAMP))

$(BUILD)/%.o: %.c $(FLAGS_STAMP)
	@mkdir -p $(dir $@)
	$(MPICC) $(CFLAGS) -c $< -o $@

$(BUILD)/%.o: %.cu $(FLAGS_STAMP)
	@mkdir -p $(dir $@)
	$(NVCC) $(NVCC_ARCH) $(NVCCFLAGS) -c $< -o $@

# Hopper's warpgroup MMA exists only in the architecture-specific target (sm_90a); the kernel
# there is compiled empty for any other SM and never launched off sm_90
ifeq ($(SM),90)
$(BUILD)/kernels/matmul_wgmma.o: NVCC_ARCH := -gencode=arch=compute_90a,code=sm_90a
endif

$(BUILD)/libk25.a: $(LIB_OBJS)
	@rm -f $@
	ar rcs $@ $^

# The binaries at the root are shared by every build flavor (plain, SAN=1, CUDA=0): a stamp that
# changes with the flavor makes them relink when the flavor changes.
FLAVOR := $(BUILD) CUDA=$(CUDA)
$(shell [ "$$(cat .build-flavor 2>/dev/null)" = "$(FLAVOR)" ] || echo "$(FLAVOR)" > .build-flavor)

k25dec: $(BUILD)/src/main.o $(BUILD)/libk25.a .build-flavor
	$(MPICC) -o $@ $(filter-out .build-flavor,$^) $(LDLIBS)

k25bench: $(BUILD)/bench/k25bench.o $(BUILD)/libk25.a .build-flavor
	$(MPICC) -o $@ $(filter-out .build-flavor,$^) $(LDLIBS) $(TRACE_LIBS)

$(TOOLS): %: $(BUILD)/tools/%.o $(BUILD)/libk25.a .build-flavor
	$(MPICC) -o $@ $(filter-out .build-flavor,$^) $(LDLIBS)

$(BUILD)/tests/%: $(BUILD)/tests/%.o $(BUILD)/libk25.a
	$(MPICC) -o $@ $^ $(LDLIBS)

# GPU tests link like the CPU tests (the object comes from the %.cu rule above).
$(BUILD)/tests/gpu_%: $(BUILD)/tests/gpu_%.o $(BUILD)/libk25.a
	$(MPICC) -o $@ $^ $(LDLIBS)

$(BUILD)/bench/%: $(BUILD)/bench/%.o $(BUILD)/libk25.a
	$(MPICC) -o $@ $^ $(LDLIBS)

# The CPU test suite (what CI runs). Prints "N passed, N failed".
test: $(BINS) $(TESTS)
	@BUILD=$(BUILD) tests/run.sh

# Everything on GPUs: kernel checks against the CPU reference, golden model, 2-rank NCCL.
test-gpu: $(BINS) $(TESTS) $(GPU_TESTS) $(GPU_BENCHES)
	@BUILD=$(BUILD) tests/run_gpu.sh

# The README's first command: the embedded tiny model on 2 ranks.
MPIRUN_ROOT := $(if $(filter 0,$(shell id -u)),--allow-run-as-root)
# --oversubscribe: Open MPI counts cores, not hardware threads, and a small machine may have one
run: k25dec
	mpirun $(MPIRUN_ROOT) --oversubscribe -np 2 ./k25dec -p "Hello, world" -n 32

clean:
	rm -rf build build-* $(BINS)

-include $(shell find $(BUILD) -name '*.d' 2>/dev/null)

# ==========================================================================================
# Fuzzing (libFuzzer): `make fuzz` builds $(BUILD)/fuzz/fuzz_<name> from each
# tests/fuzz/fuzz_<name>.c; tests/fuzz/run.sh runs them, tests/t_fuzz_smoke.sh is the CI smoke.
# Built with clang (FUZZ_CC), ASan + UBSan, without MPI: the parsers do not use it, and
# tests/fuzz/include/mpi.h + tests/fuzz/mpi_stub.c stand in for the calls in src/common.c.
# The parser sources go into one archive, so each target links only what it calls.
# ==========================================================================================
FUZZ_CC       ?= clang
FUZZ_DIR      := $(BUILD)/fuzz
FUZZ_SAN      := -fsanitize=address,undefined -fno-sanitize-recover=all -fno-omit-frame-pointer
FUZZ_CFLAGS   := -std=c11 -D_GNU_SOURCE -O1 -g -Wall -Wextra -Wno-unused-parameter \
                 -Itests/fuzz/include -Isrc $(shell pkg-config --cflags $(PKGS)) -MMD -MP
FUZZ_LIB_SRCS := $(wildcard $(addprefix src/,common.c config.c cli.c safetensors.c checkpoint.c \
                   weights.c bpe.c pretokenize.c tokenizer.c detok.c spec_eagle3_config.c \
                   json_object.c)) tests/fuzz/mpi_stub.c
FUZZ_LIB_OBJS := $(FUZZ_LIB_SRCS:%.c=$(FUZZ_DIR)/%.o)
FUZZ_SRCS     := $(wildcard tests/fuzz/fuzz_*.c)
FUZZ_OBJS     := $(FUZZ_SRCS:%.c=$(FUZZ_DIR)/%.o)
FUZZ_TARGETS  := $(patsubst tests/fuzz/%.c,$(FUZZ_DIR)/%,$(FUZZ_SRCS))

.PHONY: fuzz
fuzz: $(FUZZ_TARGETS)

$(FUZZ_LIB_OBJS) $(FUZZ_OBJS): $(FUZZ_DIR)/%.o: %.c
	@mkdir -p $(dir $@)
	$(FUZZ_CC) $(FUZZ_CFLAGS) $(FUZZ_SAN) -fsanitize=fuzzer-no-link -c $< -o $@

$(FUZZ_DIR)/libk25fuzz.a: $(FUZZ_LIB_OBJS)
	@rm -f $@
	ar rcs $@ $^

$(FUZZ_TARGETS): $(FUZZ_DIR)/%: $(FUZZ_DIR)/tests/fuzz/%.o $(FUZZ_DIR)/libk25fuzz.a
	$(FUZZ_CC) $(FUZZ_SAN) -fsanitize=fuzzer -o $@ $^ $(shell pkg-config --libs $(PKGS)) -lm
