# fp8rl Makefile. CPU targets need only g++; CUDA targets appear when nvcc is found; MPI is used
# when mpicxx is found. Everything found (or not) is printed, and nothing is auto-detected
# silently: the GPU architecture is explicit (sm_90a, Hopper: H100/H200).

SHELL       := /bin/bash
.SHELLFLAGS := -o pipefail -c
CXX       ?= g++
CXXSTD    := -std=c++17
# make WERROR=0: warnings stay warnings (still printed), for a host compiler this project was never
# built with (the GPU machine's: nvcc passes -Wall to its gcc, and a newer gcc warns of more)
WERROR    ?= 1
WARN      := -Wall -Wextra $(if $(filter 1,$(WERROR)),-Werror)
OPT       := -O3 -march=native
# a * b + c stays two roundings, as written (g++ would fuse it into an FMA where it sees fit): code
# shared with the GPU rounds as its device build does (rl/numerics/hostdevice.h)
FPFLAGS   := -ffp-contract=off
CXXFLAGS  := $(CXXSTD) $(OPT) $(FPFLAGS) $(WARN) -fopenmp -I. -MMD -MP
LDLIBS    := -lm
# -g1: line tables, what a sanitizer report needs to name file:line; full -g costs 40% more compile time.
# -mfma: std::fma (the scalar fallbacks' FMA chains, which the sanitizer builds run: no -march, so no
# __AVX2__) is one instruction, not a call into libm; the same bits (an FMA rounds once either way).
SANFLAGS  := $(CXXSTD) $(FPFLAGS) -O1 -g1 -mfma -fno-omit-frame-pointer -fsanitize=address,undefined \
             -fno-sanitize-recover=all -DFP8RL_SANITIZE $(WARN) -fopenmp -I. -MMD -MP

CUDA_HOME ?= /usr/local/cuda
NVCC      := $(shell command -v nvcc 2>/dev/null || { test -x $(CUDA_HOME)/bin/nvcc && echo $(CUDA_HOME)/bin/nvcc; })
MPICXX    := $(shell command -v mpicxx 2>/dev/null)
MPIRUN    := $(shell command -v mpirun 2>/dev/null)
CLANGXX   := $(shell command -v clang++ 2>/dev/null)
CUBLASLT  := $(wildcard $(CUDA_HOME)/lib64/libcublasLt.so)
NCCL      := $(firstword $(wildcard $(CUDA_HOME)/lib64/libnccl.so /usr/lib/x86_64-linux-gnu/libnccl.so))
CUDA_FP8_H := $(wildcard $(CUDA_HOME)/include/cuda_fp8.h)

# The CPU binary links MPI when available (data parallel); without it, one process. The GPU
# builds take mpicxx's include and link flags (nvcc does not go through mpicxx): Open MPI's
# --showme:compile/--showme:link, else the compile line of MPICH's (and Intel MPI's) -show.
ifneq ($(MPICXX),)
  CPU_LINK_CXX := OMPI_CXX=$(CXX) MPICH_CXX=$(CXX) $(MPICXX)
  MPI_FLAGS    := -DFP8RL_MPI
  MPI_OPENMPI  := $(shell $(MPICXX) --showme:incdirs >/dev/null 2>&1 && echo yes)
  ifeq ($(MPI_OPENMPI),yes)
    MPI_INCLUDE := $(filter -I%,$(shell $(MPICXX) --showme:compile 2>/dev/null))
    MPI_LIBS    := $(filter -L% -l%,$(shell $(MPICXX) --showme:link 2>/dev/null))
  else
    MPI_SHOW    := $(shell $(MPICXX) -show 2>/dev/null)
    MPI_INCLUDE := $(filter -I%,$(MPI_SHOW))
    MPI_LIBS    := $(filter -L% -l%,$(MPI_SHOW))
  endif
else
  CPU_LINK_CXX := $(CXX)
  MPI_FLAGS    :=
endif

# cuda_fp8.h compiles in plain g++; where it exists, the exhaustive FP8 oracle test is built.
ifneq ($(CUDA_FP8_H),)
  ORACLE_FLAGS := -DFP8RL_HAVE_CUDA_FP8_H -isystem $(CUDA_HOME)/include
endif

# The GPU binary is data parallel over NCCL: without NCCL it builds single-process (no FP8RL_MPI),
# since cuda/dist/nccl.cuh's collectives need it. The host pass contracts no a*b+c either: the bit-exact
# CPU oracles rely on it (FPFLAGS).
NV_MPI    := $(if $(and $(MPI_FLAGS),$(NCCL)),$(MPI_FLAGS) $(MPI_INCLUDE))
# sm_90a, not sm_90: the warpgroup MMA (wgmma, cuda/kernels/wgmma.cuh) exists only in the
# architecture-specific target, whose cubin runs on compute capability 9.0 alone (H100, H200), the
# machines this program is for; no PTX is embedded for a JIT on other GPUs, as before.
NVCCFLAGS := -std=c++17 -O3 -gencode arch=compute_90a,code=sm_90a $(if $(filter 1,$(WERROR)),-Werror all-warnings) -I. \
             -Xcompiler -Wall,-Wextra,-fopenmp,$(FPFLAGS) $(NV_MPI)
CUDA_SRCS := $(wildcard *.cu *.cuh rl/*/*.cuh cuda/*.cuh cuda/*/*.cuh)
CUDA_EXAMPLES := $(wildcard docs/examples/*.cu)
GPU_TEST_SRCS := $(wildcard test/gpu/*.cu)
GPU_TESTS     := $(wildcard test/gpu/test_*.cu)
GPU_BENCHES   := $(wildcard test/gpu/bench_*.cu)

$(info fp8rl build: g++=$(shell command -v $(CXX)) nvcc=$(or $(NVCC),not found) cuBLASLt=$(or $(CUBLASLT),not found) NCCL=$(or $(NCCL),not found) MPI=$(or $(MPICXX),not found) clang++=$(or $(CLANGXX),not found))

BUILD := build

# Each test binary compiles its test files as one translation unit (build/unity/*: one #include per
# file, rewritten only when the list changes). The files share the engine's headers and templates,
# which per-file objects compiled again in every file: 83 s of g++ -O3 for the CPU tests' 28 files,
# 32 s as one unit (docs/test-time.md). So a binary's test files share one namespace: what two of
# them need lives in test/harness.h or test/gpu/gpu_util.cuh.
UNITY := $(BUILD)/unity
# $(call unity_source,FILE,SOURCES): FILE includes each of SOURCES.
define unity_source
$(shell mkdir -p $(UNITY) && printf '#include "%s"\n' $(2) > $(1).new && \
        { cmp -s $(1).new $(1) && rm $(1).new || mv $(1).new $(1); })
endef
CPU_UNITY := $(UNITY)/test_cpu.cpp
GPU_UNITY := $(UNITY)/test_gpu.cu
$(call unity_source,$(CPU_UNITY),$(wildcard test/test_*.cpp))
$(call unity_source,$(GPU_UNITY),$(GPU_TESTS))

# CUDA emulation (spec-gpu.md §2): g++ builds the GPU sources against cuda/emu/emu.h and runs every
# kernel on the CPU. It needs the CUDA headers (cuda_runtime.h, cuda_bf16.h, cuda_fp8.h), not a GPU.
ifneq ($(CUDA_FP8_H),)
  EMU_FLAGS     := -DFP8RL_EMU -isystem $(CUDA_HOME)/include $(MPI_FLAGS)
  EMU_RUNTIME   := cuda/emu/emu_threads.cpp cuda/emu/emu_memory.cpp cuda/emu/emu_runtime.cpp cuda/emu/emu_cublaslt.cpp \
                 cuda/emu/emu_stats.cpp cuda/emu/emu_wgmma.cpp cuda/emu/emu_memory_order.cpp
  GPU_TEST_OBJS := $(patsubst %,$(BUILD)/emu/%.o,test/run_tests.cpp $(GPU_UNITY))
  GPU_ASAN_OBJS := $(patsubst %,$(BUILD)/emu-asan/%.o,test/run_tests.cpp $(EMU_RUNTIME) $(GPU_UNITY))
  EMU_SEEDS     ?= 1
  EMU_ASAN_SEED ?= 3
  # The emulated GPU tests' kernels call cuda/emu/emu_memory_order.cpp before every load and store
  # (g++'s thread-sanitizer instrumentation, without its runtime): plain accesses across CTAs are checked.
  EMU_PLAIN_ACCESS_FLAGS := -fsanitize=thread --param tsan-instrument-func-entry-exit=0 --param tsan-distinguish-volatile=1
endif
TEST_OBJS  := $(BUILD)/test/run_tests.o $(BUILD)/test/unity.o
ASAN_OBJS  := $(BUILD)/asan/test/run_tests.o $(BUILD)/asan/test/unity.o
BENCH_SRCS := $(wildcard bench/bench_*.cpp)
BENCH_BINS := $(patsubst bench/%.cpp,$(BUILD)/%,$(BENCH_SRCS))
FUZZ_SECONDS ?= 10
FUZZ_TARGETS := json safetensors

.PHONY: all demo-sft test test-runs test-unit test-asan test-cpu test-cpu-asan test-gpu-emu test-gpu-emu-asan test-bench-emu \
        $(EMU_SHARD_RUNS) $(ASAN_SHARD_RUNS) test_gpu_emu emu-lib cuda-check gpu-bundle bench bench_gpu fuzz $(FUZZ_TARGETS:%=fuzz-%) clean demo
# make (all): every binary this machine can build, then each one it skipped and why. A target joins
# ALL_BINS where its tools are found, else ALL_SKIPPED gets "name: reason".
ALL_BINS := train_rl_cpu
ALL_SKIPPED :=
ifneq ($(NVCC),)
  ALL_BINS += train_rl test_gpu
else
  ALL_SKIPPED += "train_rl, test_gpu: nvcc not found (install the CUDA toolkit)"
endif
ifneq ($(EMU_FLAGS),)
  ALL_BINS += train_rl_emu
else
  ALL_SKIPPED += "train_rl_emu: the CUDA headers were not found under $(CUDA_HOME)/include"
endif
all: $(ALL_BINS)
	@echo "make: built $(ALL_BINS)"
	@for s in $(ALL_SKIPPED); do echo "make: skipped $$s"; done

# The binary sits outside build/ but its header dependencies inside: without its .d file (build/
# removed by hand) it is rebuilt rather than trusted (the empty rule makes a missing .d "new").
train_rl_cpu $(BUILD)/bin/train_rl_cpu: train_rl_cpu.cpp $(BUILD)/train_rl_cpu.d
	@mkdir -p $(BUILD) $(@D)
	$(CPU_LINK_CXX) $(CXXFLAGS) $(MPI_FLAGS) -MF $(BUILD)/train_rl_cpu.d -o $@ $< $(LDLIBS)

$(BUILD)/train_rl_cpu_asan: train_rl_cpu.cpp
	@mkdir -p $(@D)
	$(CPU_LINK_CXX) $(SANFLAGS) $(MPI_FLAGS) -MF $(BUILD)/train_rl_cpu_asan.d -o $@ $< $(LDLIBS)

$(BUILD)/train_rl_cpu.d: ;

$(BUILD)/%.o: %.cpp
	@mkdir -p $(@D)
	$(CXX) $(CXXFLAGS) $(ORACLE_FLAGS) -c -o $@ $<

$(BUILD)/asan/%.o: %.cpp
	@mkdir -p $(@D)
	$(CXX) $(SANFLAGS) $(ORACLE_FLAGS) -c -o $@ $<

$(BUILD)/test/unity.o: $(CPU_UNITY)
	@mkdir -p $(@D)
	$(CXX) $(CXXFLAGS) $(ORACLE_FLAGS) -c -o $@ $<

$(BUILD)/asan/test/unity.o: $(CPU_UNITY)
	@mkdir -p $(@D)
	$(CXX) $(SANFLAGS) $(ORACLE_FLAGS) -c -o $@ $<

$(BUILD)/test_cpu: $(TEST_OBJS)
	$(CXX) $(CXXFLAGS) -o $@ $^ $(LDLIBS)

$(BUILD)/test_cpu_asan: $(ASAN_OBJS)
	$(CXX) $(SANFLAGS) -o $@ $^ $(LDLIBS)

# The emulated GPU tests: test/gpu/*.cu (also ./test_gpu with nvcc) with the shared runner.
$(BUILD)/emu/%.o: %
	@mkdir -p $(@D)
	$(CPU_LINK_CXX) $(CXXFLAGS) $(EMU_FLAGS) -x c++ -c -o $@ $<

$(BUILD)/emu/$(GPU_UNITY).o: CXXFLAGS += $(EMU_PLAIN_ACCESS_FLAGS)

$(BUILD)/emu-asan/%.o: %
	@mkdir -p $(@D)
	$(CPU_LINK_CXX) $(SANFLAGS) $(EMU_FLAGS) -x c++ -c -o $@ $<
# The emulation runtime under ASan at -O2 (ASan checks it as fully): its scheduler is most of an
# emulated kernel's time there; a sample of GPU tests runs 10% faster, for 7 CPU s more of compile.
$(patsubst %,$(BUILD)/emu-asan/%.o,$(EMU_RUNTIME)): SANFLAGS += -O2

# The emulation runtime as one library, what the emulated binaries link and any CUDA source written
# on cuda/common.cuh can link (docs/gpu-emulation.md); the example is built by the command given there.
EMU_LIB := $(BUILD)/libcudaemu.a
$(EMU_LIB): $(patsubst %,$(BUILD)/emu/%.o,$(EMU_RUNTIME))
	rm -f $@ && ar rcs $@ $^
emu-lib: $(EMU_LIB)
$(BUILD)/emu_block_sum: docs/examples/block_sum.cu $(EMU_LIB) cuda/common.cuh cuda/emu/emu.h rl/common.h
	$(CXX) -std=c++17 -DFP8RL_EMU -I. -isystem $(CUDA_HOME)/include -x c++ $< -x none $(EMU_LIB) -fopenmp -lpthread $(WARN) -o $@

# Several translation units drop the list of __launch_bounds__' pads, which g++ 12 files wrongly (cuda/emu/emu.ld).
$(BUILD)/test_gpu_emu: $(GPU_TEST_OBJS) $(EMU_LIB)
	$(CPU_LINK_CXX) $(CXXFLAGS) -o $@ $^ -Wl,-T,cuda/emu/emu.ld $(LDLIBS)

$(BUILD)/test_gpu_emu_asan: $(GPU_ASAN_OBJS)
	$(CPU_LINK_CXX) $(SANFLAGS) -o $@ $^ -Wl,-T,cuda/emu/emu.ld $(LDLIBS)

test_gpu_emu: $(BUILD)/test_gpu_emu

# ./train_rl_emu: the GPU binary's main (train_rl.cu) on the emulated GPU engine.
train_rl_emu: $(BUILD)/emu/train_rl.cu.o $(EMU_LIB)
	$(CPU_LINK_CXX) $(CXXFLAGS) -o $@ $^ $(LDLIBS)

# The GPU benchmarks (test/gpu/bench_*.cu) in emulation, each run once at tiny shapes by
# test-bench-emu: a smoke test (it runs, prints its table, exits 0), never a timing.
EMU_BENCH_BINS := $(patsubst test/gpu/bench_%.cu,$(BUILD)/emu_bench_%,$(wildcard test/gpu/bench_*.cu))
# Their objects are kept (make would delete them as intermediates and recompile them every run), and
# built at -O1: in emulation they only run once at tiny shapes, and -O3 doubles their compile time.
EMU_BENCH_OBJS := $(patsubst %,$(BUILD)/emu/%.o,$(wildcard test/gpu/bench_*.cu))
.SECONDARY: $(EMU_BENCH_OBJS)
$(EMU_BENCH_OBJS): CXXFLAGS := $(CXXSTD) -O1 $(FPFLAGS) $(WARN) -fopenmp -I. -MMD -MP
$(BUILD)/emu_bench_%: $(BUILD)/emu/test/gpu/bench_%.cu.o $(EMU_LIB)
	$(CPU_LINK_CXX) $(CXXFLAGS) -o $@ $^ $(LDLIBS)

# make test: every test run, side by side under make -j (a run starts as soon as its binaries are
# built, so runs and compiles keep every core busy). Each run's output is printed whole when it ends
# (--output-sync) and kept in build/logs/RUN.log; the last line sums the runs' closing lines.
# The runs: the unit and integration tests, the GPU tests in emulation (plain and under ASan), the
# GPU check's parts in emulation, the CUDA compile check, the CPU tests under ASan + UBSan, and
# bounded fuzz runs of the JSON parser and the safetensors reader. Slowest first, so they start first.
# The emulated GPU tests run single-threaded, ~5 min in each build, so they run as shards (every
# Nth test; test/run_tests.cpp): two under ASan, which start first, and three plain ones, short
# enough that the last minutes of make test keep both cores busy.
EMU_SHARDS      := 1of3 2of3 3of3
ASAN_SHARDS     := 1of2 2of2
EMU_SHARD_RUNS  := $(EMU_SHARDS:%=test-gpu-emu-%)
ASAN_SHARD_RUNS := $(ASAN_SHARDS:%=test-gpu-emu-asan-%)
TEST_RUNS := $(if $(EMU_FLAGS),test-gpu-emu-asan) test-cpu $(if $(EMU_FLAGS),test-gpu-emu) test-cpu-asan cuda-check \
             $(if $(EMU_FLAGS),test-bench-emu) $(FUZZ_TARGETS:%=fuzz-%)
LOGS := $(BUILD)/logs
# The runs share two cores with each other and with compiles. OpenMP's threads wait passively: by
# default a thread spins at each barrier until its partner, descheduled by another run, comes back
# (trainer_micro_batches_match_whole_minibatches under ASan: 44 s spinning, 5 s passive).
TEST_ENV := OMP_NUM_THREADS=2 OMP_WAIT_POLICY=passive
test:
	@rm -rf $(LOGS) && mkdir -p $(LOGS)
	@$(MAKE) --no-print-directory --output-sync=target test-runs; rc=$$?; test/summarize_runs.sh $(LOGS) $$rc; exit $$rc
test-runs: $(TEST_RUNS)

# Each run alone, or a group: test-unit (the plain runs), test-asan (the sanitizer runs).
test-unit: test-cpu $(if $(EMU_FLAGS),test-gpu-emu test-bench-emu)
test-asan: test-cpu-asan $(if $(EMU_FLAGS),test-gpu-emu-asan)

test-cpu: $(BUILD)/test_cpu train_rl_cpu $(if $(EMU_FLAGS),train_rl_emu) $(BUILD)/perf_model
	@mkdir -p $(LOGS)
	FP8RL_BIN=./train_rl_cpu FP8RL_EMU_BIN=./train_rl_emu $(TEST_ENV) ./$(BUILD)/test_cpu 2>&1 | tee $(LOGS)/$@.log

test-cpu-asan: $(BUILD)/test_cpu_asan $(BUILD)/train_rl_cpu_asan
	@mkdir -p $(LOGS)
	FP8RL_BIN=./$(BUILD)/train_rl_cpu_asan $(TEST_ENV) ASAN_OPTIONS=detect_leaks=1 ./$(BUILD)/test_cpu_asan 2>&1 | tee $(LOGS)/$@.log

# The GPU tests in emulation, once per scheduling seed (seed 0: threads and blocks in order; others
# shuffle them), then under ASan with one more seed.
ifneq ($(EMU_FLAGS),)
test-gpu-emu: $(EMU_SHARD_RUNS) $(BUILD)/emu_block_sum
	@mkdir -p $(LOGS)
	@echo "== the cuBLASLt tests with the other documented refusal statuses (FP8RL_EMU_CUBLASLT_REFUSAL=1)"
	FP8RL_EMU_CUBLASLT_REFUSAL=1 $(TEST_ENV) ./$(BUILD)/test_gpu_emu cublaslt_ gemm_runner_ 2>&1 | tee -a $(LOGS)/$@.log
	@echo "== a program of one's own on build/libcudaemu.a (docs/examples/block_sum.cu)"
	./$(BUILD)/emu_block_sum 2>&1 | tee -a $(LOGS)/$@.log
ifneq ($(and $(MPICXX),$(MPIRUN)),)
	@echo "== the communicator over 2 ranks in emulation (mpirun -np 2)"
	$(TEST_ENV) OMPI_MCA_btl=self,vader $(MPIRUN) --allow-run-as-root --oversubscribe -np 2 ./$(BUILD)/test_gpu_emu nccl_ 2>&1 | tee -a $(LOGS)/$@.log
else
	@echo "communicator over 2 ranks: SKIPPED (needs mpicxx and mpirun: apt-get install libopenmpi-dev openmpi-bin)"
endif

# test-gpu-emu-KofN: shard K of N (EMU_SHARDS) of the GPU tests, once per scheduling seed.
$(EMU_SHARD_RUNS): test-gpu-emu-%: $(BUILD)/test_gpu_emu
	@mkdir -p $(LOGS)
	@for s in $(EMU_SEEDS); do echo "== GPU tests in emulation, FP8RL_EMU_SEED=$$s, shard $(subst of,/,$*)"; \
	  FP8RL_TEST_SHARD=$(subst of,/,$*) FP8RL_EMU_SEED=$$s $(TEST_ENV) ./$(BUILD)/test_gpu_emu 2>&1 | tee -a $(LOGS)/$@.log || exit 1; done

test-gpu-emu-asan: $(ASAN_SHARD_RUNS)
$(ASAN_SHARD_RUNS): test-gpu-emu-asan-%: $(BUILD)/test_gpu_emu_asan
	@echo "== GPU tests in emulation under ASan + UBSan, FP8RL_EMU_SEED=$(EMU_ASAN_SEED), shard $(subst of,/,$*)"
	@mkdir -p $(LOGS)
	FP8RL_TEST_SHARD=$(subst of,/,$*) FP8RL_EMU_SEED=$(EMU_ASAN_SEED) $(TEST_ENV) ASAN_OPTIONS=detect_leaks=1 \
	  ./$(BUILD)/test_gpu_emu_asan 2>&1 | tee $(LOGS)/$@.log

# dev/gpu_check.sh's parts in emulation: the device checks, the engine against train_rl_cpu, and
# every GPU benchmark once at tiny shapes (smoke tests: each runs, prints its table, exits 0).
test-bench-emu: $(BUILD)/test_gpu_emu $(EMU_BENCH_BINS) train_rl_emu train_rl_cpu
	@echo "== dev/gpu_check.sh --emu: its parts at tiny shapes in emulation (times are not GPU figures)"
	@mkdir -p $(LOGS)
	$(TEST_ENV) dev/gpu_check.sh --emu 2>&1 | tee $(LOGS)/$@.log
else
test-gpu-emu test-gpu-emu-asan test-bench-emu:
	@echo "$@: SKIPPED (the CUDA headers were not found under $(CUDA_HOME)/include; the emulation needs them, not a GPU)"
endif

ifneq ($(NVCC),)

# ./test_gpu: the GPU tests (test/gpu/test_*.cu) with the shared test runner; make bench_gpu builds
# and runs each GPU benchmark (test/gpu/bench_*.cu). Both need a GPU to run; dev/gpu_check.sh runs all.
GPU_LDLIBS := -lcublasLt -lgomp $(if $(NV_MPI),-lnccl $(MPI_LIBS))
ifeq ($(and $(MPI_FLAGS),$(if $(NCCL),,no)),no)
  $(info fp8rl build: NCCL not found, so ./train_rl and ./test_gpu build single-process (no MPI data parallelism))
endif
# rollout.cu is included by cuda/engine/engine_gpu.cuh: a header to its users
GPU_HEADERS := $(wildcard *.cuh rl/*.h rl/*/*.h rl/*/*.cuh cpu/*.h cuda/*.cuh cuda/*/*.cuh cuda/*/*.h test/gpu/*.cuh test/gpu/*.h test/harness.h) rollout.cu

# Every CUDA source compiled for sm_90a with warnings as errors, in parallel under make -j; a stamp
# records each success, so a rerun compiles only what changed:
#   - the headers and the test files as one unit (build/unity/nvcheck.cu), as ./test_gpu compiles
#     its tests: nvcc's fixed cost per unit (its headers, cicc and ptxas start-up) was 2-3 s of each
#     header's 3 s alone;
#   - each benchmark and example alone (each is a program of its own);
#   - train_rl.cu by ./train_rl's own build; it includes cuda/engine/engine_gpu.cuh first, which includes
#     rollout.cu, so those two compile alone there.
# That each header also compiles by itself is checked by g++ on the emulation build (-fsyntax-only,
# 1 s a header), where the same text is compiled.
# The device code compiles as the product's does (cicc and ptxas optimize it for sm_90a whatever -O
# says); the host side at -O0, since its object goes to /dev/null and the emulation's g++ -O3 build
# compiles the same host code with the same warnings as errors (-O3 there would double the time).
NVCHECK_FLAGS   := $(filter-out -O3,$(NVCCFLAGS)) -O0
NVCHECK_HEADERS := $(filter-out train_rl.cu cuda/engine/engine_gpu.cuh rollout.cu,$(CUDA_SRCS))
NVCHECK_UNITY   := $(UNITY)/nvcheck.cu
$(call unity_source,$(NVCHECK_UNITY),$(NVCHECK_HEADERS) $(GPU_TESTS))
NVCHECK_STAMPS  := $(patsubst %,$(BUILD)/nvcheck/%.ok,$(NVCHECK_UNITY) $(GPU_BENCHES) $(CUDA_EXAMPLES))
$(BUILD)/nvcheck/%.ok: % $(GPU_HEADERS) $(GPU_TESTS)
	@mkdir -p $(@D)
	@echo "nvcc compile check: $<$(if $(NVCHECK_OUTPUT),, (to PTX: no kernel of its own))"
	@$(NVCC) $(NVCHECK_FLAGS) -x cu $(or $(NVCHECK_OUTPUT),-ptx) -o /dev/null $< && touch $@
# A benchmark that defines no kernel runs the engine's, which ./train_rl and the unit above assemble
# for sm_90a: it stops at PTX (the front end's diagnostics, warnings as errors, then cicc), so ptxas
# does not assemble the whole engine again for each (~25 s of CPU each); g++ compiles its host code
# with the same warnings as errors in the emulation build (build/emu_bench_*).
NVCHECK_KERNEL_FILES := $(NVCHECK_UNITY) $(CUDA_EXAMPLES) $(shell grep -l __global__ $(GPU_BENCHES))
$(patsubst %,$(BUILD)/nvcheck/%.ok,$(NVCHECK_KERNEL_FILES)): NVCHECK_OUTPUT := -c
ifneq ($(EMU_FLAGS),)
SELF_CONTAINED_STAMPS := $(patsubst %,$(BUILD)/selfcontained/%.ok,$(NVCHECK_HEADERS))
$(BUILD)/selfcontained/%.ok: % $(GPU_HEADERS)
	@mkdir -p $(@D)
	@$(CPU_LINK_CXX) $(CXXSTD) $(FPFLAGS) $(WARN) -fopenmp -I. $(EMU_FLAGS) -fsyntax-only -x c++ $< && touch $@
endif
cuda-check: $(NVCHECK_STAMPS) $(SELF_CONTAINED_STAMPS) train_rl
	@echo "nvcc compile check: $(words $(CUDA_SRCS) $(GPU_TEST_SRCS) $(CUDA_EXAMPLES)) CUDA sources compiled for sm_90a (train_rl.cu, cuda/engine/engine_gpu.cuh and rollout.cu by ./train_rl)$(if $(SELF_CONTAINED_STAMPS),; $(words $(SELF_CONTAINED_STAMPS)) headers compile alone (g++, emulation))"
	@echo "nvcc build: ./train_rl (sm_90a) linked"

GPU_BENCH_BINS := $(patsubst test/gpu/bench_%.cu,$(BUILD)/gpu_bench_%,$(wildcard test/gpu/bench_*.cu))
# The test files as one unit, as in emulation.
GPU_TEST_NV_OBJS := $(patsubst %,$(BUILD)/nv/%.o,test/run_tests.cpp $(GPU_UNITY))
$(BUILD)/nv/%.o: % $(GPU_HEADERS) $(GPU_TESTS)
	@mkdir -p $(@D)
	$(NVCC) $(NVCCFLAGS) -c -o $@ $<

test_gpu $(BUILD)/bin/test_gpu: $(GPU_TEST_NV_OBJS)
	@mkdir -p $(@D)
	$(NVCC) $(NVCCFLAGS) -o $@ $^ $(GPU_LDLIBS)

# ./train_rl: the product, the GPU binary (sm_90, cuBLASLt, NCCL and MPI when found).
train_rl $(BUILD)/bin/train_rl: train_rl.cu $(GPU_HEADERS)
	@mkdir -p $(@D)
	$(NVCC) $(NVCCFLAGS) -o $@ train_rl.cu $(GPU_LDLIBS)

$(BUILD)/gpu_bench_%: test/gpu/bench_%.cu $(GPU_HEADERS)
	@mkdir -p $(@D)
	$(NVCC) $(NVCCFLAGS) -o $@ $< $(GPU_LDLIBS)

# build/gpu_probe: dev/gpu_check.sh's part 0 (a usable Hopper GPU, a trivial kernel, cuBLASLt >= 12.9)
$(BUILD)/gpu_probe: dev/gpu_probe.cu
	@mkdir -p $(@D)
	$(NVCC) $(NVCCFLAGS) -o $@ $< -lcublasLt

bench_gpu: $(GPU_BENCH_BINS)
	@for b in $(GPU_BENCH_BINS); do echo "== $$b"; ./$$b || exit 1; done

# make gpu-bundle: every binary dev/gpu_check.sh runs, built here for a lent GPU machine, so its
# short session spends no minutes compiling (docs/gpu-engine.md, "When a GPU is lent"): a build of its
# own under $(BUNDLE_BUILD) with portable host code (x86-64-v3, not this CPU's -march=native) and no
# MPI or NCCL (that machine has neither; the check runs one process), stripped into $(BUNDLE), with
# STAMP naming the commit and a hash of the sources it was built from (dev/gpu_check.sh --prebuilt
# refuses a bundle of other sources). The bundle travels to the GPU machine beside the working tree,
# whose limit (64 MiB together) sets BUNDLE_MAX_MIB.
BUNDLE         := $(BUILD)/gpu-bundle
BUNDLE_BUILD   := $(BUILD)/gpu-bundle-build
BUNDLE_MAX_MIB := 60
BUNDLE_BINS    := gpu_probe bin/train_rl bin/train_rl_cpu bin/test_gpu perf_model $(patsubst test/gpu/bench_%.cu,gpu_bench_%,$(GPU_BENCHES))
gpu-bundle:
	$(MAKE) --no-print-directory BUILD=$(BUNDLE_BUILD) OPT="-O3 -march=x86-64-v3" MPICXX= $(addprefix $(BUNDLE_BUILD)/,$(BUNDLE_BINS))
	rm -rf $(BUNDLE) && mkdir -p $(BUNDLE)
	cp $(addprefix $(BUNDLE_BUILD)/,$(BUNDLE_BINS)) $(BUNDLE)/
	strip $(BUNDLE)/*
	dev/gpu_bundle_stamp.sh > $(BUNDLE)/STAMP
	@mib=$$(du -sm $(BUNDLE) | cut -f1); cat $(BUNDLE)/STAMP; echo "gpu-bundle: $(BUNDLE), $$mib MiB"; \
	  if [ $$mib -gt $(BUNDLE_MAX_MIB) ]; then echo "gpu-bundle: $$mib MiB is over $(BUNDLE_MAX_MIB) MiB"; exit 1; fi
else
cuda-check:
	@echo "nvcc compile check: SKIPPED (nvcc not found; GPU sources not compiled)"
gpu-bundle:
	@echo "$@: nvcc not found; the bundle holds the GPU binaries, which need the CUDA toolkit"; exit 1
test_gpu bench_gpu train_rl:
	@echo "$@: nvcc not found; the GPU binary, tests and benchmarks need the CUDA toolkit"; exit 1
endif

ifneq ($(CLANGXX),)
# Each fuzz target test/fuzz/fuzz_NAME.cpp starts from test/fuzz/NAME_seeds and runs FUZZ_SECONDS;
# new inputs go to build/, never into the committed seeds.
$(BUILD)/fuzz_%: test/fuzz/fuzz_%.cpp
	@mkdir -p $(@D)
	$(CLANGXX) $(CXXSTD) -g -O1 -fsanitize=fuzzer,address,undefined -I. -MMD -MP -o $@ $<
fuzz: $(FUZZ_TARGETS:%=fuzz-%)
$(FUZZ_TARGETS:%=fuzz-%): fuzz-%: $(BUILD)/fuzz_%
	@mkdir -p $(BUILD)/fuzz_corpus_$* $(LOGS)
	@./$(BUILD)/fuzz_$* -max_total_time=$(FUZZ_SECONDS) -max_len=4096 -print_final_stats=0 \
	    $(BUILD)/fuzz_corpus_$* test/fuzz/$*_seeds 2>&1 | tail -n 3
	@echo "fuzz: $* ran $(FUZZ_SECONDS)s without a crash" | tee $(LOGS)/$@.log
else
fuzz $(FUZZ_TARGETS:%=fuzz-%):
	@echo "$@: SKIPPED (clang++ not found)"
endif

$(BUILD)/bench_%: bench/bench_%.cpp
	@mkdir -p $(@D)
	$(CXX) $(CXXFLAGS) $(ORACLE_FLAGS) -o $@ $< $(LDLIBS)

bench: $(BENCH_BINS)
	@for b in $(BENCH_BINS); do echo "== $$b"; ./$$b || exit 1; done

# build/perf_model: cuda/perf/perf_model.h's predicted training step on an H200, bf16 against fp8, before
# and after issue 28's fusion; --json: the GRPO step priced from the kernels' SASS (cuda/perf/sass_counts.h,
# regenerated by dev/sass_counts.sh; docs/perf-model.md); make test builds it, so it cannot rot unseen.
$(BUILD)/perf_model: dev/perf_model.cpp
	@mkdir -p $(@D)
	$(CXX) $(CXXFLAGS) -o $@ $< $(LDLIBS)

# The README's first command: a tiny model learns 1-digit addition from scratch with GRPO on the
# CPU through the FP8 pipeline (fp8 rollout, fp8 training, fp8 KV cache, Calibrated Clipping; two
# minibatches, so the second update's ratios leave 1 and the clip bounds matter). The trainer
# writes the dashboard and the TensorBoard event file itself.
DEMO_DIR ?= runs/demo
DEMO_FLAGS ?= --init tiny --task add --task_size 1 --max_new_tokens 3 --group_size 16 --batch_prompts 32 --minibatches 2 \
  --lr 3e-4 --temperature 1.5 --entropy_coef 0.01 --steps 700 --eval_every 100 --eval_prompts 100 --eval_k 4 \
  --rollout_precision fp8 --train_precision fp8 --kv_cache fp8 --calibrated_clip 1 --tensorboard 1 --threads 2
demo: train_rl_cpu
	rm -f $(DEMO_DIR)/events.out.tfevents.*  # one event file per run: a rerun starts the charts afresh
	./train_rl_cpu $(DEMO_FLAGS) --out_dir $(DEMO_DIR)

# CPT -> SFT -> RL in miniature (docs/sft.md): a fresh byte-level tiny model reads 3000 sums as plain
# text (CPT, WSD schedule), is fine-tuned on 1000 prompt/completion rows of the add task (SFT, cosine),
# then trained by GRPO on the add task from the SFT run's latest checkpoint; all in fp8. The data are
# written by awk. About 30 s on 2 cores.
DEMO_SFT_DIR ?= runs/demo-sft
demo-sft: train_rl_cpu
	@mkdir -p $(DEMO_SFT_DIR)
	awk 'BEGIN{srand(1); for(i=0;i<3000;i++){a=int(rand()*10);b=int(rand()*10); printf "{\"text\": \"%d+%d=%02d\"}\n",a,b,a+b}}' > $(DEMO_SFT_DIR)/cpt.jsonl
	awk 'BEGIN{srand(2); for(i=0;i<1000;i++){a=int(rand()*10);b=int(rand()*10); printf "{\"prompt\": \"%d+%d=\", \"completion\": \"%02d\"}\n",a,b,a+b}}' > $(DEMO_SFT_DIR)/sft.jsonl
	./train_rl_cpu --mode cpt --init tiny --data $(DEMO_SFT_DIR)/cpt.jsonl --seq_len 64 --batch_seqs 16 --steps 150 --lr 3e-3 \
	  --lr_schedule wsd --warmup_steps 10 --decay_steps 30 --train_precision fp8 --threads 2 --out_dir $(DEMO_SFT_DIR)/cpt
	./train_rl_cpu --mode sft --model $(DEMO_SFT_DIR)/cpt --data $(DEMO_SFT_DIR)/sft.jsonl --batch_seqs 32 --steps 100 --lr 1e-3 \
	  --lr_schedule cosine --warmup_steps 5 --train_precision fp8 --threads 2 --out_dir $(DEMO_SFT_DIR)/sft
	./train_rl_cpu --model $(DEMO_SFT_DIR)/sft --task add --task_size 1 --max_new_tokens 3 --group_size 8 --batch_prompts 16 \
	  --lr 3e-4 --steps 60 --eval_every 20 --eval_prompts 100 --eval_k 0 --rollout_precision fp8 --train_precision fp8 \
	  --kv_cache fp8 --threads 2 --out_dir $(DEMO_SFT_DIR)/rl

clean:
	rm -rf $(BUILD) train_rl_cpu train_rl train_rl_emu test_gpu

-include $(shell find $(BUILD) -name '*.d' 2>/dev/null)
