// test_emu.cu: the CUDA semantics that the kernels rely on and the emulation (cuda/emu/emu.h)
// implements, with answers known from the CUDA Programming Guide's definitions written out here:
// block reductions over shared memory, every shuffle variant and width, votes, atomics under
// contention, dynamic shared memory above 48 KB, graph capture and replay, sm_90's launch limits.
// They run both ways: in emulation they test the emulator, on a GPU (./test_gpu) they test the
// emulator's assumptions against the hardware. The negative cases (a missing __syncthreads, a
// divergent barrier, a spin-wait on another block, a lane outside the mask, a shared-memory
// overflow under ASan) must fail, and exist in emulation only: on a GPU they would hang or race.
#include <cfenv>
#include <cstdlib>
#include <numeric>
#include <string>
#include <vector>

#include "test/gpu/gpu_util.cuh"
#include "test/harness.h"
#include "test/run_binary.h"

using namespace fp8rl;

namespace {

// ---------------------------------------------------------------------------------------------
// Positive cases.

// Tree reduction in shared memory: the sum of in[0 .. n) per block of 256 threads.
__global__ void block_sum_kernel(const int* in, int n, int* out) {
    STATIC_SHARED(int, partial, [256]);
    int t = threadIdx.x, i = blockIdx.x * blockDim.x + t;
    partial[t] = i < n ? in[i] : 0;
    __syncthreads();
    for (int stride = blockDim.x / 2; stride > 0; stride /= 2) {
        if (t < stride) partial[t] += partial[t + stride];
        __syncthreads();
    }
    if (t == 0) out[blockIdx.x] = partial[0];
}

enum Variant { IDX, UP, DOWN, XOR };

// out[lane] = the shuffle of value(lane) by `variant` with `param` and `width`, over two warps.
__global__ void shuffle_kernel(int variant, int param, int width, int* out_int, double* out_double) {
    int lane = threadIdx.x % 32;
    int v = lane * 7 + 3 + 1000 * (threadIdx.x / 32);
    double d = v + 0.25;
    int r = 0;
    double rd = 0;
    unsigned full = 0xFFFFFFFFu;
    switch (variant) {
        case IDX: r = __shfl_sync(full, v, param, width), rd = __shfl_sync(full, d, param, width); break;
        case UP: r = __shfl_up_sync(full, v, param, width), rd = __shfl_up_sync(full, d, param, width); break;
        case DOWN: r = __shfl_down_sync(full, v, param, width), rd = __shfl_down_sync(full, d, param, width); break;
        case XOR: r = __shfl_xor_sync(full, v, param, width), rd = __shfl_xor_sync(full, d, param, width); break;
    }
    out_int[threadIdx.x] = r;
    out_double[threadIdx.x] = rd;
}

// What the CUDA Programming Guide defines for lane `lane` (of a warp whose values are value(l)).
int expected_shuffle(int variant, int param, int width, int lane) {
    int group = lane / width * width, src = lane;
    if (variant == IDX) src = group + param % width;
    if (variant == UP) src = lane - group >= param ? lane - param : lane;
    if (variant == DOWN) src = lane - group + param < width ? lane + param : lane;
    if (variant == XOR) src = (lane ^ param) < group + width ? lane ^ param : lane;  // later groups: own value
    return src * 7 + 3;
}

// Votes of lanes with predicate (lane % 3 == 0) under the full mask, and of the lower half-warp
// alone (only lanes < 16 call, with mask 0x0000FFFF).
__global__ void vote_kernel(unsigned* out) {
    int lane = threadIdx.x;
    int pred = lane % 3 == 0;
    unsigned ballot = __ballot_sync(0xFFFFFFFFu, pred);
    int any = __any_sync(0xFFFFFFFFu, lane == 31), all = __all_sync(0xFFFFFFFFu, lane < 32), none = __any_sync(0xFFFFFFFFu, 0);
    out[lane * 6 + 0] = ballot, out[lane * 6 + 1] = any, out[lane * 6 + 2] = all, out[lane * 6 + 3] = none;
    if (lane < 16) {
        out[lane * 6 + 4] = __ballot_sync(0x0000FFFFu, pred);
        out[lane * 6 + 5] = __all_sync(0x0000FFFFu, lane < 16);
    } else {
        out[lane * 6 + 4] = out[lane * 6 + 5] = 7;
    }
}

// Every thread of every block adds into the same words.
__global__ void contention_kernel(int* counter, unsigned long long* big, float* fsum, int* maximum, int* cas_counter) {
    int id = blockIdx.x * blockDim.x + threadIdx.x;
    atomicAdd(counter, 1);
    atomicAdd(big, (unsigned long long)id);
    atomicAdd(fsum, 1.0f);
    atomicMax(maximum, (id * 37) % 1009);
    int old = *cas_counter, seen;  // an increment by compare-and-swap retried until it wins
    while ((seen = atomicCAS(cas_counter, old, old + 1)) != old) old = seen;
}

// Reverses each block's slice of `n` ints through dynamic shared memory.
__global__ void reverse_kernel(const int* in, int* out, int n) {
    DYNAMIC_SHARED(int, buf);
    for (int i = threadIdx.x; i < n; i += blockDim.x) buf[i] = in[blockIdx.x * n + i];
    __syncthreads();
    for (int i = threadIdx.x; i < n; i += blockDim.x) out[blockIdx.x * n + i] = buf[n - 1 - i];
}

__global__ void axpy_kernel(float* y, const float* x, float a, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] += a * x[i];
}

__global__ void empty_kernel(int* x) {
    if (x && threadIdx.x == 1u << 30) x[0] = 0;
}

}  // namespace

TEST(emu_block_reduction_over_shared_memory) {
    REQUIRE_GPU();
    const int n = 256 * 7 + 13;
    std::vector<int> in(n);
    for (int i = 0; i < n; i++) in[i] = (i * 7919) % 1000 - 500;
    DeviceBuffer<int> d_in(in), d_out(8);
    LAUNCH_KERNEL(block_sum_kernel, 8, 256, 0, 0, d_in.ptr, n, d_out.ptr);
    std::vector<int> out = d_out.download();
    for (int b = 0; b < 8; b++) {
        int want = 0;
        for (int i = b * 256; i < (b + 1) * 256 && i < n; i++) want += in[i];
        CHECK_MSG(out[b] == want, "block %d: sum %d, expected %d", b, out[b], want);
    }
}

TEST(emu_shuffles_every_variant_and_width) {
    REQUIRE_GPU();
    DeviceBuffer<int> d_int(64);
    DeviceBuffer<double> d_double(64);
    int cases = 0;
    for (int variant : {IDX, UP, DOWN, XOR})
        for (int width : {1, 2, 4, 8, 16, 32})
            for (int param : {0, 1, 3, 5, 16, 31, 37}) {
                if (variant != IDX && param > 31) continue;
                if ((variant == UP || variant == DOWN) && param == 37) continue;
                LAUNCH_KERNEL(shuffle_kernel, 1, 64, 0, 0, variant, param, width, d_int.ptr, d_double.ptr);
                std::vector<int> r = d_int.download();
                std::vector<double> rd = d_double.download();
                for (int t = 0; t < 64; t++) {
                    int want = expected_shuffle(variant, param, width, t % 32) + 1000 * (t / 32);
                    CHECK_MSG(r[t] == want && rd[t] == want + 0.25, "variant %d width %d param %d thread %d: %d / %g, expected %d",
                              variant, width, param, t, r[t], rd[t], want);
                }
                cases++;
            }
    CHECK_EQ(cases, 4 * 6 * 6 + 6);
}

TEST(emu_votes_full_and_partial_masks) {
    REQUIRE_GPU();
    DeviceBuffer<unsigned> d_out(32 * 6);
    LAUNCH_KERNEL(vote_kernel, 1, 32, 0, 0, d_out.ptr);
    std::vector<unsigned> out = d_out.download();
    unsigned want_ballot = 0, want_half = 0;
    for (int l = 0; l < 32; l++)
        if (l % 3 == 0) want_ballot |= 1u << l, want_half |= l < 16 ? 1u << l : 0;
    for (int l = 0; l < 32; l++) {
        CHECK_EQ(out[l * 6 + 0], want_ballot);
        CHECK_EQ(out[l * 6 + 1], 1u);
        CHECK_EQ(out[l * 6 + 2], 1u);
        CHECK_EQ(out[l * 6 + 3], 0u);
        CHECK_EQ(out[l * 6 + 4], l < 16 ? want_half : 7u);
        CHECK_EQ(out[l * 6 + 5], l < 16 ? 1u : 7u);
    }
}

TEST(emu_atomics_under_contention) {
    REQUIRE_GPU();
    const int blocks = 24, threads = 256, total = blocks * threads;
    DeviceBuffer<int> counter(1), maximum(1), cas_counter(1);
    DeviceBuffer<unsigned long long> big(1);
    DeviceBuffer<float> fsum(1);
    for (auto* b : {&counter, &maximum, &cas_counter}) CUDA_CHECK(cudaMemset(b->ptr, 0, sizeof(int)));
    CUDA_CHECK(cudaMemset(big.ptr, 0, sizeof(unsigned long long)));
    CUDA_CHECK(cudaMemset(fsum.ptr, 0, sizeof(float)));
    LAUNCH_KERNEL(contention_kernel, blocks, threads, 0, 0, counter.ptr, big.ptr, fsum.ptr, maximum.ptr, cas_counter.ptr);
    int want_max = 0;
    for (int id = 0; id < total; id++) want_max = std::max(want_max, (id * 37) % 1009);
    CHECK_EQ(counter.download()[0], total);
    CHECK_EQ(big.download()[0], (unsigned long long)total * (total - 1) / 2);
    CHECK_EQ(fsum.download()[0], (float)total);  // integers below 2^24 add exactly in any order
    CHECK_EQ(maximum.download()[0], want_max);
    CHECK_EQ(cas_counter.download()[0], total);
}

TEST(emu_dynamic_shared_memory_above_48k) {
    REQUIRE_GPU();
    const int n = 25000, blocks = 3;  // 100,000 bytes per block
    std::vector<int> in(n * blocks);
    std::iota(in.begin(), in.end(), 5);
    DeviceBuffer<int> d_in(in), d_out(in.size());
    CUDA_CHECK(cudaFuncSetAttribute(reverse_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, n * (int)sizeof(int)));
    LAUNCH_KERNEL(reverse_kernel, blocks, 512, n * sizeof(int), 0, d_in.ptr, d_out.ptr, n);
    std::vector<int> out = d_out.download();
    int bad = 0;
    for (int b = 0; b < blocks; b++)
        for (int i = 0; i < n; i++) bad += out[b * n + i] != in[b * n + n - 1 - i];
    CHECK_EQ(bad, 0);
}

TEST(emu_graph_capture_replays_launches_and_copies) {
    REQUIRE_GPU();
    const int n = 1000;
    std::vector<float> x(n), y0(n);
    for (int i = 0; i < n; i++) x[i] = 0.5f * i, y0[i] = 1.0f;
    DeviceBuffer<float> d_x(x), d_y(n), d_y0(y0);
    cudaStream_t stream;
    CUDA_CHECK(cudaStreamCreate(&stream));
    cudaGraph_t graph;
    cudaGraphExec_t exec;
    float a = 2.0f;
    CUDA_CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal));
    CUDA_CHECK(cudaMemcpyAsync(d_y.ptr, d_y0.ptr, n * sizeof(float), cudaMemcpyDeviceToDevice, stream));
    LAUNCH_KERNEL(axpy_kernel, (n + 127) / 128, 128, 0, stream, d_y.ptr, d_x.ptr, a, n);
    LAUNCH_KERNEL(axpy_kernel, (n + 127) / 128, 128, 0, stream, d_y.ptr, d_x.ptr, a, n);
    CUDA_CHECK(cudaStreamEndCapture(stream, &graph));
    a = 100.0f;  // kernel parameters were copied at capture
    std::vector<float> before = d_y.download();
    CHECK_MSG(std::isnan(before[0]) || before[0] != 1.0f + 2 * 2.0f * x[0], "capture ran the work instead of recording it");
    CUDA_CHECK(cudaGraphInstantiate(&exec, graph, 0));
    for (int replay = 0; replay < 3; replay++) {
        CUDA_CHECK(cudaGraphLaunch(exec, stream));
        CUDA_CHECK(cudaStreamSynchronize(stream));
        std::vector<float> y = d_y.download();
        int bad = 0;
        for (int i = 0; i < n; i++) bad += y[i] != 1.0f + 2.0f * x[i] + 2.0f * x[i];
        CHECK_MSG(bad == 0, "replay %d: %d of %d wrong", replay, bad, n);
    }
    CUDA_CHECK(cudaGraphExecDestroy(exec));
    CUDA_CHECK(cudaGraphDestroy(graph));
    CUDA_CHECK(cudaStreamDestroy(stream));
}

TEST(emu_launch_limits_of_sm90) {
    REQUIRE_GPU();
    cudaDeviceProp prop;
    CUDA_CHECK(cudaGetDeviceProperties(&prop, 0));
    if (emulated) {
        CHECK_EQ(prop.major, 9);
        CHECK_EQ(prop.multiProcessorCount, 132);
        CHECK(prop.totalGlobalMem > 140e9);
    }
    CHECK_EQ((long)prop.sharedMemPerBlockOptin, 227L << 10);
    CHECK_THROWS(LAUNCH_KERNEL(empty_kernel, 1, 1025, 0, 0, nullptr), "cudaErrorInvalidConfiguration");
    CHECK_THROWS(LAUNCH_KERNEL(empty_kernel, 1, dim3(1, 1, 65), 0, 0, nullptr), "cudaErrorInvalidConfiguration");
    CHECK_THROWS(LAUNCH_KERNEL(empty_kernel, dim3(1, 65536), 1, 0, 0, nullptr), "cudaErrorInvalidConfiguration");
    CHECK_THROWS(LAUNCH_KERNEL(reverse_kernel, 1, 32, (227 << 10) + 4, 0, nullptr, nullptr, 0), "cudaErrorInvalidValue");
    CHECK(cudaFuncSetAttribute(empty_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (227 << 10) + 1024) != cudaSuccess);
    cudaGetLastError();
    LAUNCH_KERNEL(empty_kernel, dim3(70000), 1, 0, 0, nullptr);  // x (only) may exceed 65535
    CUDA_CHECK(cudaDeviceSynchronize());
}

// ---------------------------------------------------------------------------------------------
// Negative cases: emulation only.

#ifdef FP8RL_EMU
namespace {

// Each thread reads its left neighbour's value: correct only with the barrier.
__global__ void neighbour_kernel(const int* in, int* out, bool with_barrier) {
    STATIC_SHARED(int, tile, [256]);
    int t = threadIdx.x;
    tile[t] = in[t];
    if (with_barrier) __syncthreads();
    out[t] = tile[t == 0 ? 0 : t - 1];
}

__global__ void divergent_barrier_kernel(int* x) {
    if (threadIdx.x < 16) __syncthreads();
    x[threadIdx.x] = 1;
}

// Block 0 waits for a flag that block 1 sets: blocks run in order at seed 0, so it never comes.
__global__ void spin_on_next_block_kernel(int* flag) {
    if (blockIdx.x == 1) atomicExch(flag, 1);
    if (blockIdx.x == 0)
        while (atomicAdd(flag, 0) == 0) {
        }
}

__global__ void outside_mask_kernel(int* x) {
    int lane = threadIdx.x;
    if (lane < 16) x[lane] = __shfl_sync(0x0000FFFFu, lane, 20);  // lane 20 is not in the mask
}

// Launches a kernel that must fault with a message containing `needle` (reported by the launch's
// own check when the kernel ran at issue, else by the synchronization), then clears the sticky error.
#define CHECK_KERNEL_FAULT(needle, kernel, grid, block, ...)                 \
    do {                                                                     \
        CHECK_THROWS([&] {                                                   \
            LAUNCH_KERNEL(kernel, grid, block, 0, 0, __VA_ARGS__);           \
            CUDA_CHECK(cudaDeviceSynchronize());                             \
        }(), needle);                                                        \
        CHECK(cudaDeviceSynchronize() == cudaErrorLaunchFailure);            \
        CHECK(emu::last_fault().find(needle) != std::string::npos);          \
        CUDA_CHECK(cudaDeviceReset());                                       \
    } while (0)

// Wrong results of neighbour_kernel (without its barrier when with_barrier is false) at `seed`.
// A read before the neighbour's write sees the NaN pattern static shared memory starts each block with.
int neighbour_mismatches(uint64_t seed, bool with_barrier) {
    uint64_t saved = emu::seed();
    emu::set_seed(seed);
    std::vector<int> in(256);
    std::iota(in.begin(), in.end(), 1000);
    DeviceBuffer<int> d_in(in), d_out(256);
    LAUNCH_KERNEL(neighbour_kernel, 1, 256, 0, 0, d_in.ptr, d_out.ptr, with_barrier);
    std::vector<int> out = d_out.download();
    emu::set_seed(saved);
    int bad = 0;
    for (int t = 0; t < 256; t++) bad += out[t] != in[t == 0 ? 0 : t - 1];
    return bad;
}

}  // namespace

TEST(emu_missing_syncthreads_fails_under_a_shuffled_seed) {
    int at_seed0 = neighbour_mismatches(0, false), shuffled = 0;
    for (uint64_t s = 1; s <= 4; s++) shuffled += neighbour_mismatches(s, false);
    printf("    without the barrier: %d wrong at seed 0 (threads in order), %d over seeds 1-4\n", at_seed0, shuffled);
    CHECK_MSG(shuffled > 0, "a missing __syncthreads went unseen under seeds 1-4");
    for (uint64_t s = 0; s <= 4; s++) CHECK_EQ(neighbour_mismatches(s, true), 0);
}

TEST(emu_divergent_barrier_is_a_fault_naming_the_kernel) {
    DeviceBuffer<int> x(32);
    CHECK_KERNEL_FAULT("kernel divergent_barrier_kernel block (0,0,0): divergent __syncthreads: 16 threads at the barrier, 16 exited",
                       divergent_barrier_kernel, 1, 32, x.ptr);
}

TEST(emu_spin_wait_on_another_block_is_a_fault) {
    uint64_t saved = emu::seed();
    emu::set_seed(0);
    DeviceBuffer<int> flag(1);
    CUDA_CHECK(cudaMemset(flag.ptr, 0, sizeof(int)));
    CHECK_KERNEL_FAULT("kernel spin_on_next_block_kernel block (0,0,0): spin-wait", spin_on_next_block_kernel, 2, 32, flag.ptr);
    emu::set_seed(saved);
}

TEST(emu_shuffle_outside_the_mask_is_a_fault) {
    DeviceBuffer<int> x(32);
    CHECK_KERNEL_FAULT("reads lane 20, outside the mask 0x0000ffff", outside_mask_kernel, 1, 32, x.ptr);
}

TEST(emu_a_fault_is_sticky_until_reset) {
    DeviceBuffer<int> x(32);
    CHECK_THROWS([&] {
        LAUNCH_KERNEL(divergent_barrier_kernel, 1, 32, 0, 0, x.ptr);
        CUDA_CHECK(cudaDeviceSynchronize());
    }(), "divergent __syncthreads");
    CHECK_THROWS(CUDA_CHECK(cudaDeviceSynchronize()), "divergent __syncthreads");
    CHECK_THROWS(LAUNCH_KERNEL(empty_kernel, 1, 32, 0, 0, x.ptr), "cudaErrorLaunchFailure");
    CUDA_CHECK(cudaDeviceReset());
    LAUNCH_KERNEL(empty_kernel, 1, 32, 0, 0, x.ptr);
    CUDA_CHECK(cudaDeviceSynchronize());
}

// CUDA code has no rounding mode to set; the emulation's fibers share the host thread's MXCSR.
__global__ void set_rounding_mode_kernel(int* x) {
    fesetround(FE_UPWARD);
    x[threadIdx.x] = 1;
}

TEST(emu_a_kernel_that_sets_the_rounding_mode_faults_and_the_host_keeps_its_own) {
    DeviceBuffer<int> x(32);
    CHECK_KERNEL_FAULT("kernel set_rounding_mode_kernel: changed the rounding mode", set_rounding_mode_kernel, 1, 32, x.ptr);
    CHECK_EQ(fegetround(), FE_TONEAREST);
}

TEST(emu_device_memory_starts_as_nan_and_out_of_memory_is_an_error) {
    DeviceBuffer<float> x(100);
    std::vector<float> host = x.download();
    int nan = 0;
    for (float v : host) nan += std::isnan(v);
    CHECK_EQ(nan, 100);
    void* p = nullptr;
    CHECK(cudaMalloc(&p, (size_t)200 << 30) == cudaErrorMemoryAllocation);  // more than the emulated H200 has
    CHECK(cudaGetLastError() == cudaErrorMemoryAllocation);
    std::vector<float> small(10);
    CHECK(cudaMemcpy(x.ptr, small.data(), 1000 * sizeof(float), cudaMemcpyHostToDevice) == cudaErrorInvalidValue);
    cudaGetLastError();
}

// An overflow of a static __shared__ array is caught by the sanitizer build (ASan redzones static
// arrays, spec-gpu.md §2.2; UBSan's bounds check sees this one first). The test runs itself as a
// child process that overflows, and expects the report naming the kernel's line. It exists in the
// sanitizer build only (make test-asan), where the report can happen.
#ifdef FP8RL_SANITIZE
static __global__ void shared_overflow_kernel(int* x, int n) {
    STATIC_SHARED(int, buf, [64]);
    for (int i = threadIdx.x; i < n; i += blockDim.x) buf[i] = i;
    __syncthreads();
    x[threadIdx.x] = buf[threadIdx.x];
}

TEST(emu_shared_memory_overflow_is_caught_by_asan) {
    if (getenv("FP8RL_EMU_OVERFLOW_CHILD")) {
        DeviceBuffer<int> x(64);
        LAUNCH_KERNEL(shared_overflow_kernel, 1, 64, 0, 0, x.ptr, 65);
        CUDA_CHECK(cudaDeviceSynchronize());
        return;
    }
    harness::RunResult r = harness::run_this_test("FP8RL_EMU_OVERFLOW_CHILD=1 ASAN_OPTIONS=detect_leaks=0",
                                                  "emu_shared_memory_overflow_is_caught_by_asan");
    bool reported = r.output.find("AddressSanitizer: global-buffer-overflow") != std::string::npos ||
                    r.output.find("index 64 out of bounds for type 'int [64]'") != std::string::npos;
    CHECK_MSG(r.status != 0 && reported && r.output.find("test_emu.cu") != std::string::npos,
              "the overflow ran without an ASan report (exit %d): %s", r.status, r.output.substr(0, 400).c_str());
}
#endif  // FP8RL_SANITIZE
#endif  // FP8RL_EMU
