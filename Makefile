# tern — build. `make` builds build/tern and build/libtern.a; `make test` runs the suite.
# Sources are picked up by wildcard: adding a file needs no edit here.
#   src/**/*_avx2.c    compiled with AVX2/FMA/F16C flags   (chosen at run time by cpuid)
#   src/**/*_avx512.c  compiled with AVX-512 (F/BW/VL/BF16/VNNI) flags
#   src/backend/cuda/  only when nvcc is found (TERN_CUDA=1); .cu for sm_90 + PTX
#   tests/unit/test_*.c  one binary each, linked with libtern.a
CC      ?= cc
NVCC    ?= $(shell command -v nvcc 2>/dev/null || (test -x /usr/local/cuda/bin/nvcc && echo /usr/local/cuda/bin/nvcc))
OPT     ?= -O2
CFLAGS  ?= $(OPT) -g
CFLAGS  += -std=c11 -Wall -Wextra -Wno-unused-parameter -Wno-missing-field-initializers \
           -D_GNU_SOURCE -Iinclude -Isrc -fno-strict-aliasing -MMD -MP
LDLIBS  := -lcjson -lpcre2-8 -lmicrohttpd -lutf8proc -lpthread -lm
AVX2    := -mavx2 -mfma -mf16c
AVX512  := $(AVX2) -mavx512f -mavx512bw -mavx512vl -mavx512dq -mavx512bf16 -mavx512vnni

ifeq ($(strip $(NVCC)),)
TERN_CUDA ?= 0
else
TERN_CUDA ?= 1
endif
CUDA_HOME ?= $(patsubst %/bin/nvcc,%,$(NVCC))
NVFLAGS ?= -O3 -std=c++17 -gencode arch=compute_90,code=sm_90 -gencode arch=compute_90,code=compute_90 \
           -Iinclude -Isrc -Xcompiler -fPIC,-Wall -lineinfo

C_SRC   := $(filter-out src/backend/cuda/%,$(wildcard src/*/*.c src/*/*/*.c))
CU_SRC  :=
ifeq ($(TERN_CUDA),1)
C_SRC   += $(wildcard src/backend/cuda/*.c)
CU_SRC  := $(wildcard src/backend/cuda/*.cu)
CFLAGS  += -DTERN_HAVE_CUDA=1 -I$(CUDA_HOME)/include
LDLIBS  += -L$(CUDA_HOME)/lib64 -Wl,-rpath,$(CUDA_HOME)/lib64 -lcublasLt -lcublas -lcudart -lnccl -lstdc++
endif

OBJ     := $(C_SRC:%.c=build/obj/%.o) $(CU_SRC:%.cu=build/obj/%.o)
TESTS   := $(patsubst tests/unit/%.c,build/tests/%,$(wildcard tests/unit/test_*.c))
TOOLS   := build/tern build/load   # build/load: the HTTP load generator (bench/load.c; tests/cli/glm5_serve_script.sh)

all: build/libtern.a $(TOOLS) $(TESTS)

build/obj/%_avx2.o: %_avx2.c
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) $(AVX2) -c $< -o $@

build/obj/%_avx512.o: %_avx512.c
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) $(AVX512) -c $< -o $@

build/obj/%.o: %.c
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -c $< -o $@

build/obj/%.o: %.cu
	@mkdir -p $(dir $@)
	$(NVCC) $(NVFLAGS) -MMD -MP -c $< -o $@

# qgemm_q4_wg.cu and wgemm.cu use wgmma, which exists only in the arch-specific sm_90a target: built for it alone
# (no PTX); their launchers find out whether the image loads on the GPU (elsewhere the older kernels run)
comma := ,
NVFLAGS_90A = $(subst arch=compute_90$(comma)code=sm_90,arch=compute_90a$(comma)code=sm_90a,$(subst -gencode arch=compute_90$(comma)code=compute_90,,$(NVFLAGS)))
build/obj/src/backend/cuda/qgemm_q4_wg.o build/obj/src/backend/cuda/wgemm.o: build/obj/%.o: %.cu
	@mkdir -p $(dir $@)
	$(NVCC) $(NVFLAGS_90A) -MMD -MP -c $< -o $@

build/libtern.a: $(OBJ)
	@mkdir -p build
	rm -f $@ && ar rcs $@ $^

TOOL_SRC := $(wildcard tools/*.c)
build/tern: $(TOOL_SRC) tools/cli.h build/libtern.a
	$(CC) $(CFLAGS) -Itools $(TOOL_SRC) build/libtern.a -o $@ $(LDLIBS)

build/tests/%: tests/unit/%.c tests/test.h build/libtern.a
	@mkdir -p build/tests
	$(CC) $(CFLAGS) -Itests $< build/libtern.a -o $@ $(LDLIBS)

# `make bench`: kernel benchmarks (bench/*.c, one binary each), not part of `all`.
BENCHES := $(patsubst bench/%.c,build/%,$(wildcard bench/*.c))
bench: $(BENCHES)
build/bench_%: bench/bench_%.c build/libtern.a
	$(CC) $(CFLAGS) $< build/libtern.a -o $@ $(LDLIBS)
build/concurrency: bench/concurrency.c build/libtern.a
	$(CC) $(CFLAGS) $< build/libtern.a -o $@ $(LDLIBS)
build/load: bench/load.c build/libtern.a
	$(CC) $(CFLAGS) $< build/libtern.a -o $@ $(LDLIBS)

# tests/fuzz/regress.sh: a fuzz target that spans the whole engine (fuzz_model) replays its kept inputs against the
# project's library (its harness alone under ASan / UBSan) instead of recompiling every source with sanitizers.
FUZZ_SAN := -fsanitize=address,undefined -fno-sanitize=alignment -fno-sanitize-recover=undefined
build/fuzz/replay_lib_%: tests/fuzz/%.c tests/fuzz/replay.c build/libtern.a
	@mkdir -p build/fuzz
	$(CC) $(CFLAGS) $(FUZZ_SAN) tests/fuzz/$*.c tests/fuzz/replay.c build/libtern.a -o $@ $(LDLIBS) || \
	$(CC) $(CFLAGS) tests/fuzz/$*.c tests/fuzz/replay.c build/libtern.a -o $@ $(LDLIBS)

# the SIMD flag sets, for tests/fuzz/targets.inc (its per-file builds of *_avx2.c / *_avx512.c)
simd-flags:
	@echo "$(AVX2)|$(AVX512)"

test: all
	@bash tests/run.sh

clean:
	rm -rf build

.PHONY: all test clean bench simd-flags
-include $(OBJ:.o=.d) $(TESTS:=.d)

# GPU machine only (scripts/gpu_check.sh): the CUDA op tests and benchmarks. They link a small
# archive of just base + tensor + backends, so the GPU image needs no cJSON/PCRE2/microhttpd.
GPU_SRC  := src/base/base.c src/base/pool.c $(wildcard src/ops/*.c src/sample/*.c) src/backend/backend.c \
            $(wildcard src/backend/cpu/*.c) $(wildcard src/backend/cuda/*.c)
GPU_OBJ  := $(GPU_SRC:%.c=build/obj/%.o) $(CU_SRC:%.cu=build/obj/%.o)
GPU_PROG := build/test_cuda_ops build/bench_cuda
GPU_LIBS := -lpthread -lm -L$(CUDA_HOME)/lib64 -Wl,-rpath,$(CUDA_HOME)/lib64 -lcublasLt -lcublas -lcudart -lnccl -lstdc++
build/libtern_gpu.a: $(GPU_OBJ)
	rm -f $@ && ar rcs $@ $^
$(GPU_PROG): build/%: tests/gpu/%.c $(wildcard tests/gpu/*.h) tests/test.h build/libtern_gpu.a
	$(CC) $(CFLAGS) -Itests $< build/libtern_gpu.a -o $@ $(GPU_LIBS)
gpu-test: $(GPU_PROG)
.PHONY: gpu-test

# `make core`: build/tern-core (logits, generate --ids, info, bench) and build/tests/test_parity_core
# from everything that needs only cJSON (no PCRE2/microhttpd/utf8proc) — what the GPU machine can
# build with a carried libcjson (scripts/gpu_check.sh). CORE_CFLAGS/CORE_LDFLAGS point at it there.
CORE_SRC := $(wildcard src/base/*.c src/io/*.c src/ops/*.c src/model/*.c src/sample/*.c) src/backend/backend.c \
            $(wildcard src/backend/cpu/*.c) src/runtime/kv.c src/runtime/kvfile.c src/runtime/fit.c src/runtime/generate.c \
            $(wildcard src/runtime/experts.c)
ifeq ($(TERN_CUDA),1)
CORE_SRC += $(wildcard src/backend/cuda/*.c)
endif
CORE_OBJ := $(CORE_SRC:%.c=build/obj/%.o) $(CU_SRC:%.cu=build/obj/%.o)
CORE_LIBS := -lcjson $(filter-out -lcjson -lpcre2-8 -lmicrohttpd -lutf8proc,$(LDLIBS))
CORE_TOOLS := tools/tern.c tools/cli_util.c tools/cmd_logits.c tools/cmd_generate.c tools/cmd_info.c tools/cmd_bench.c
build/libtern_core.a: $(CORE_OBJ)
	rm -f $@ && ar rcs $@ $^
build/tern-core: $(CORE_TOOLS) build/libtern_core.a
	$(CC) $(CFLAGS) $(CORE_CFLAGS) -DTERN_CORE_ONLY -Itools $(CORE_TOOLS) build/libtern_core.a -o $@ $(CORE_LDFLAGS) $(CORE_LIBS)
build/tests/test_parity_core: tests/unit/test_parity.c build/libtern_core.a
	@mkdir -p build/tests
	$(CC) $(CFLAGS) $(CORE_CFLAGS) -Itests $< build/libtern_core.a -o $@ $(CORE_LDFLAGS) $(CORE_LIBS)
# the multi-GPU / offload tests against the core library (test_model_tp*, test_runtime_experts)
build/tests/test_%_core: tests/unit/test_%.c build/libtern_core.a
	@mkdir -p build/tests
	$(CC) $(CFLAGS) $(CORE_CFLAGS) -DTERN_CORE_ONLY -Itests $< build/libtern_core.a -o $@ $(CORE_LDFLAGS) $(CORE_LIBS)
core: build/tern-core build/tests/test_parity_core build/tests/test_model_tp_core build/tests/test_model_tp_vocab_core \
      build/tests/test_model_tp_offload_core build/tests/test_runtime_experts_core build/tests/test_model_g4_batch_core
.PHONY: core

# `make bench-glm`: build/bench_glm_gpu (GLM-5 per layer + latent attention, cpu or cuda) from the
# core archive, so the GPU machine builds it with the carried libcjson like `make core`.
build/bench_glm_gpu: bench/bench_glm_gpu.c build/libtern_core.a
	$(CC) $(CFLAGS) $(CORE_CFLAGS) $< build/libtern_core.a -o $@ $(CORE_LDFLAGS) $(CORE_LIBS)
bench-glm: build/bench_glm_gpu
.PHONY: bench-glm
