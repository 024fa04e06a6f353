// test_emu_memory_order.cu: memory ordering across CTAs (docs/gpu-emulation.md, "Memory
// ordering"). The last-block pattern of the CUDA Programming Guide's memory-fence example, with
// every thread's partial in global memory: each thread writes its partial and fences, the CTA
// passes a barrier, thread 0 counts the CTA, and the CTA that completes the count sums every
// partial through L2. Complete, it gives the exact sum under every seed (and on a GPU); with the
// barrier before the count, the writers' fence, or the L2 reads deleted (the emulation's test-only
// mutations, emu::add_mutation), it gives a wrong sum or an emulation fault under some seed of a
// small set. A second program, written for these tests, reads the partials with the Programming
// Guide's volatile loads, or with plain loads after a __threadfence (PTX's acquire pattern): exact
// under every seed; with plain loads and no fence, without the writers' fence, or without the
// barrier before the count, the emulation reports the data race (a plain or volatile load of
// another CTA's write that was not released and acquired) under some seed. (Decode attention used
// the pattern until issue 58; its plan, split and combine kernels now pass their data from one
// launch to the next.)
#include <cstdlib>
#include <stdexcept>
#include <string>
#include <vector>

#include "test/gpu/gpu_util.cuh"
#include "test/harness.h"

using namespace fp8rl;

namespace {

constexpr int kSumThreads = 64;

// sum over array[n] (n = gridDim.x * kSumThreads): partials[i] = array[i], the last CTA to count
// adds them in index order into *total and resets the count for the next launch.
__global__ void last_block_sum_kernel(const float* array, float* partials, unsigned* count, float* total) {
    STATIC_SHARED(unsigned, is_last, [1]);
    const int i = blockIdx.x * kSumThreads + threadIdx.x;
    partials[i] = array[i] * 2.0f;  // the CTA's work: anything that writes each thread's partial
    __threadfence();                // the partial is visible to every CTA before the count is
    __syncthreads();                // every thread's partial is written and fenced
    if (threadIdx.x == 0) {
        const unsigned value = atomicInc(count, gridDim.x);
        is_last[0] = value == gridDim.x - 1;
    }
    __syncthreads();  // is_last is written
    if (is_last[0] && threadIdx.x == 0) {
        float sum = 0.0f;
        for (unsigned j = 0; j < gridDim.x * kSumThreads; j++) sum += __ldcg(partials + j);
        *total = sum;
        *count = 0;
    }
}

// How the second program's last CTA reads the partials, and what its writers skip.
enum FinalReads { kVolatileReads, kFenceThenPlainReads, kPlainReads };
struct SumProgram {
    FinalReads reads = kVolatileReads;
    bool writers_fence = true, barrier_before_count = true;
};

// The same sum as last_block_sum_kernel, its ordering chosen by `program`, its reads by kReads (a
// template argument: g++ folds `c ? strong[j] : partials[j]` into one volatile load).
template <FinalReads kReads>
__global__ void last_block_variant_sum_kernel(const float* array, float* partials, unsigned* count, float* total,
                                              SumProgram program) {
    STATIC_SHARED(unsigned, is_last, [1]);
    const int i = blockIdx.x * kSumThreads + threadIdx.x;
    partials[i] = array[i] * 2.0f;
    if (program.writers_fence) __threadfence();
    if (program.barrier_before_count) __syncthreads();
    if (threadIdx.x == 0) {
        const unsigned value = atomicInc(count, gridDim.x);
        is_last[0] = value == gridDim.x - 1;
    }
    __syncthreads();
    if (is_last[0] && threadIdx.x == 0) {
        if (kReads == kFenceThenPlainReads) __threadfence();  // acquire: the count, then the fence
        const volatile float* strong = partials;
        float sum = 0.0f;
        for (unsigned j = 0; j < gridDim.x * kSumThreads; j++) {
            if constexpr (kReads == kVolatileReads) sum += strong[j];
            else sum += partials[j];
        }
        *total = sum;
        *count = 0;
    }
}

// Runs a last-block sum `launches` times on new data each time (a partial left from the launch
// before is wrong) and returns how many launches summed wrong; a kernel fault counts as wrong and is
// cleared (its message, in emulation, goes to *fault). A null program runs last_block_sum_kernel.
int wrong_sums(int blocks, int launches, const SumProgram* program = nullptr, [[maybe_unused]] std::string* fault = nullptr) {
    const int n = blocks * kSumThreads;
    float *array = nullptr, *partials = nullptr, *total = nullptr;
    unsigned* count = nullptr;
    CUDA_CHECK(cudaMalloc(&array, sizeof(float) * n));
    CUDA_CHECK(cudaMalloc(&partials, sizeof(float) * n));
    CUDA_CHECK(cudaMalloc(&total, sizeof(float)));
    CUDA_CHECK(cudaMalloc(&count, sizeof(unsigned)));
    CUDA_CHECK(cudaMemset(count, 0, sizeof(unsigned)));
    int wrong = 0;
    for (int launch = 0; launch < launches; launch++) {
        std::vector<float> host(n);
        double want = 0;  // small integers: every order of the FP32 sum is exact
        for (int i = 0; i < n; i++) host[i] = (float)((i * 7 + launch * 3) % 11), want += 2.0 * host[i];
        CUDA_CHECK(cudaMemcpy(array, host.data(), sizeof(float) * n, cudaMemcpyHostToDevice));
        bool launched = true;  // under a seed, launches are queued: this one may run the last one's fault
        try {
            if (!program) LAUNCH_KERNEL(last_block_sum_kernel, blocks, kSumThreads, 0, 0, array, partials, count, total);
            else if (program->reads == kVolatileReads)
                LAUNCH_KERNEL(last_block_variant_sum_kernel<kVolatileReads>, blocks, kSumThreads, 0, 0, array, partials, count, total, *program);
            else if (program->reads == kFenceThenPlainReads)
                LAUNCH_KERNEL(last_block_variant_sum_kernel<kFenceThenPlainReads>, blocks, kSumThreads, 0, 0, array, partials, count, total, *program);
            else LAUNCH_KERNEL(last_block_variant_sum_kernel<kPlainReads>, blocks, kSumThreads, 0, 0, array, partials, count, total, *program);
        } catch (const std::exception&) {
            launched = false;
        }
        float got = 0;
        if (!launched || cudaDeviceSynchronize() != cudaSuccess ||
            cudaMemcpy(&got, total, sizeof(float), cudaMemcpyDeviceToHost) != cudaSuccess) {
#ifdef FP8RL_EMU
            if (fault) *fault = emu::last_fault();
#endif
            CUDA_CHECK(cudaDeviceReset());  // the fault is sticky until a reset
            wrong += launches - launch;
            break;
        }
        wrong += (double)got != want;
    }
    CUDA_CHECK(cudaFree(array));
    CUDA_CHECK(cudaFree(partials));
    CUDA_CHECK(cudaFree(total));
    CUDA_CHECK(cudaFree(count));
    return wrong;
}

}  // namespace

TEST(emu_last_block_sum_is_exact_under_every_seed) {
    REQUIRE_GPU();
#ifdef FP8RL_EMU
    const uint64_t saved = emu::seed();
    for (uint64_t s = 0; s < 12; s++) {
        emu::set_seed(s);
        const int wrong = wrong_sums(6, 4);
        CHECK_MSG(wrong == 0, "seed %llu: %d of 4 sums wrong", (unsigned long long)s, wrong);
    }
    emu::set_seed(saved);
#else
    CHECK_EQ(wrong_sums(6, 4), 0);
#endif
}

TEST(emu_last_block_sum_with_volatile_or_fenced_plain_reads_is_exact_under_every_seed) {
    REQUIRE_GPU();
    for (FinalReads reads : {kVolatileReads, kFenceThenPlainReads}) {
        SumProgram program;
        program.reads = reads;
#ifdef FP8RL_EMU
        const uint64_t saved = emu::seed();
        for (uint64_t s = 0; s < 12; s++) {
            emu::set_seed(s);
            std::string fault;
            const int wrong = wrong_sums(6, 4, &program, &fault);
            CHECK_MSG(wrong == 0, "reads %d, seed %llu: %d of 4 sums wrong %s", (int)reads, (unsigned long long)s, wrong,
                      fault.c_str());
        }
        emu::set_seed(saved);
#else
        CHECK_EQ(wrong_sums(6, 4, &program), 0);
#endif
    }
}

#ifdef FP8RL_EMU
namespace {

// Seeds 1..8 of a program missing an acquire, a release or a barrier: how many reported the data
// race (a fault naming the kernel), and that none gave a wrong sum without the report.
int seeds_reported(const SumProgram& program) {
    if (!emu::plain_accesses_checked()) SKIP("this build's kernels are not instrumented for plain accesses (EMU_PLAIN_ACCESS_FLAGS)");
    const uint64_t saved = emu::seed();
    int seeds = 0;
    for (uint64_t s = 1; s <= 8; s++) {
        emu::set_seed(s);
        std::string fault;
        const int wrong = wrong_sums(6, 4, &program, &fault);
        const bool reported = fault.find("kernel last_block_variant_sum_kernel") != std::string::npos &&
                              fault.find("a data race") != std::string::npos;
        CHECK_MSG(wrong == 0 || reported, "seed %llu: %d sums wrong, fault \"%s\"", (unsigned long long)s, wrong, fault.c_str());
        seeds += reported;
    }
    emu::set_seed(saved);
    printf("    reported under %d of seeds 1-8\n", seeds);
    return seeds;
}

}  // namespace

TEST(emu_last_block_sum_with_plain_reads_and_no_acquire_fence_is_reported) {
    SumProgram program;
    program.reads = kPlainReads;
    CHECK(seeds_reported(program) > 0);
}

TEST(emu_last_block_sum_with_volatile_reads_without_the_writers_fence_is_reported) {
    SumProgram program;
    program.writers_fence = false;
    CHECK(seeds_reported(program) > 0);
}

TEST(emu_last_block_sum_with_volatile_reads_without_the_barrier_before_the_count_is_reported) {
    SumProgram program;
    program.barrier_before_count = false;
    CHECK(seeds_reported(program) > 0);
}

namespace {

// Seeds 1..8 of the mutated program: how many gave a wrong sum (or a fault) in some launch.
int seeds_wrong(emu::Site site, int ordinal) {
    const uint64_t saved = emu::seed();
    emu::add_mutation("last_block_sum_kernel", site, ordinal);
    int seeds = 0;
    for (uint64_t s = 1; s <= 8; s++) {
        emu::set_seed(s);
        seeds += wrong_sums(6, 4) > 0;
    }
    emu::clear_mutations();
    emu::set_seed(saved);
    printf("    wrong under %d of seeds 1-8\n", seeds);
    return seeds;
}

}  // namespace

// Block 0 waits for a flag that block 1 sets. At seed 0 blocks run one at a time, in order, and the
// wait is reported as a spin-wait (test_emu.cu); under a seed both are resident and it ends.
__global__ void wait_for_block_one_kernel(int* flag, int* seen) {
    if (blockIdx.x == 1 && threadIdx.x == 0) atomicExch(flag, 1);
    if (blockIdx.x == 0 && threadIdx.x == 0) {
        while (atomicAdd(flag, 0) == 0) {
        }
        *seen = 1;
    }
}

TEST(emu_a_wait_on_another_resident_block_ends_under_a_seed) {
    const uint64_t saved = emu::seed();
    int *flag = nullptr, *seen = nullptr;
    CUDA_CHECK(cudaMalloc(&flag, sizeof(int)));
    CUDA_CHECK(cudaMalloc(&seen, sizeof(int)));
    for (uint64_t s = 1; s <= 4; s++) {
        emu::set_seed(s);
        CUDA_CHECK(cudaMemset(flag, 0, sizeof(int)));
        CUDA_CHECK(cudaMemset(seen, 0, sizeof(int)));
        LAUNCH_KERNEL(wait_for_block_one_kernel, 2, 32, 0, 0, flag, seen);
        int got = 0;
        CUDA_CHECK(cudaMemcpy(&got, seen, sizeof(int), cudaMemcpyDeviceToHost));
        CHECK_MSG(got == 1, "seed %llu: block 0 did not see block 1's flag", (unsigned long long)s);
    }
    CUDA_CHECK(cudaFree(flag));
    CUDA_CHECK(cudaFree(seen));
    emu::set_seed(saved);
}

TEST(emu_last_block_sum_without_the_barrier_before_the_count_is_wrong) {
    CHECK(seeds_wrong(emu::Site::Barrier, 0) > 0);
}

TEST(emu_last_block_sum_without_the_writers_fence_is_wrong) {
    CHECK(seeds_wrong(emu::Site::Fence, 0) > 0);
}

TEST(emu_last_block_sum_with_plain_final_loads_is_wrong) {
    CHECK(seeds_wrong(emu::Site::LoadCg, 0) > 0);
}

#endif
