// test_emu_rules.cu: what a GPU refuses, refused by the emulation too (docs/gpu-emulation.md):
// each rule has a small wrong program that must trip it with a message naming the rule. A host
// dereference of device memory stops the program, so that one runs in a forked child, as do the
// programs whose messages are checked. The launch rules (__launch_bounds__, static + dynamic
// shared memory) run in both builds, so ./test_gpu checks the errors they expect on a GPU. Also
// the device selection of cuda/engine/device.cuh (both builds), the once-only cudaFuncSetAttribute, and
// stream ordering: programs ordered by events and the legacy stream are right under every seed
// (and on a GPU), unordered ones are wrong under some seed.
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <string>
#include <vector>

#include "cuda/kernels/attention.cuh"
#include "cuda/engine/device.cuh"
#include "fp8_gemm.cuh"
#include "test/gpu/gpu_util.cuh"
#include "test/harness.h"

using namespace fp8rl;

namespace {

// Device selection: local rank modulo the visible GPUs; only two ranks on one GPU are an error.
TEST(device_selection_takes_local_rank_modulo_visible_gpus) {
    CHECK_EQ(device_for_rank(0, 8), 0);
    CHECK_EQ(device_for_rank(5, 8), 5);
    CHECK_EQ(device_for_rank(5, 1), 0);  // SLURM --gpus-per-task: every rank sees its own GPU as device 0
    CHECK_EQ(device_for_rank(3, 2), 1);
    CHECK(shared_gpu_error({"0000:18:00.0", "0000:19:00.0"}).empty());
    CHECK(shared_gpu_error({"0000:18:00.0"}).empty());
    std::string e = shared_gpu_error({"0000:18:00.0", "0000:19:00.0", "0000:18:00.0"});
    CHECK_MSG(e.find("ranks 0 and 2 of this node would share the GPU at PCI 0000:18:00.0") != std::string::npos, "%s",
              e.c_str());
}

// A bound by a constexpr name, as the product's kernels have theirs.
constexpr int kBoundedThreads = 64;
__global__ void __launch_bounds__(kBoundedThreads) bounded_kernel(int* out) {
    out[blockIdx.x * blockDim.x + threadIdx.x] = (int)threadIdx.x;
}
__global__ void unbounded_kernel(int* out) { out[threadIdx.x] = 1; }

// 40 KB of static shared memory, each block's own. One instantiation per test, so each starts with
// a kernel the runtime has not seen (a forked child inherits what the parent's launches taught it).
constexpr int kStaticInts = 10240;
template <int Test>
__global__ void static_tile_kernel(int* out) {
    STATIC_SHARED(int, tile, [kStaticInts]);
    for (int i = threadIdx.x; i < kStaticInts; i += blockDim.x) tile[i] = i + (int)blockIdx.x;
    __syncthreads();
    if (threadIdx.x == 0) out[blockIdx.x] = tile[kStaticInts - 1];
}

// CUDA Programming Guide: a launch with more threads per block than the kernel's
// __launch_bounds__ fails, and cudaFuncAttributes::maxThreadsPerBlock is that limit. The error,
// driver_types.h's for "too many threads for the kernel's register count", is inferred; on a GPU
// this test checks it.
TEST(emu_rule_a_launch_above_launch_bounds_fails) {
    REQUIRE_GPU();
    DeviceBuffer<int> out(256);
    LAUNCH_KERNEL(bounded_kernel, 2, kBoundedThreads, 0, 0, out.ptr);
    CHECK_EQ(out.download()[kBoundedThreads + 5], 5);
    CHECK_THROWS(LAUNCH_KERNEL(bounded_kernel, 1, kBoundedThreads + 1, 0, 0, out.ptr), "cudaErrorLaunchOutOfResources");
    CHECK_THROWS(LAUNCH_KERNEL(bounded_kernel, 1, dim3(16, 8), 0, 0, out.ptr), "cudaErrorLaunchOutOfResources");
    LAUNCH_KERNEL(unbounded_kernel, 1, 256, 0, 0, out.ptr);
    cudaFuncAttributes attr;
    CUDA_CHECK(cudaFuncGetAttributes(&attr, bounded_kernel));
    CHECK_EQ(attr.maxThreadsPerBlock, kBoundedThreads);
    CUDA_CHECK(cudaFuncGetAttributes(&attr, unbounded_kernel));
    CHECK_EQ(attr.maxThreadsPerBlock, 1024);
    CUDA_CHECK(cudaDeviceSynchronize());
}

// cudaFuncSetAttribute: the opt-in plus the kernel's static shared memory (sharedSizeBytes) is at
// most sharedMemPerBlockOptin (227 KB on sm_90); without it a block has 48 KB, static included.
TEST(emu_rule_static_and_dynamic_shared_memory_count_together) {
    REQUIRE_GPU();
    const int static_bytes = kStaticInts * (int)sizeof(int), optin = 64 << 10;
    DeviceBuffer<int> out(2);
    LAUNCH_KERNEL(static_tile_kernel<0>, 2, 128, 4 << 10, 0, out.ptr);  // 44 KB of 48
    CHECK_EQ(out.download()[1], kStaticInts);
    cudaFuncAttributes attr;
    CUDA_CHECK(cudaFuncGetAttributes(&attr, static_tile_kernel<0>));
    CHECK_EQ(attr.sharedSizeBytes, (size_t)static_bytes);
    CHECK_THROWS(LAUNCH_KERNEL(static_tile_kernel<0>, 1, 128, 16 << 10, 0, out.ptr), "cudaErrorInvalidValue");  // 56 KB
    CHECK_EQ(cudaFuncSetAttribute(static_tile_kernel<0>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                  (227 << 10) - static_bytes + 1024), cudaErrorInvalidValue);
    cudaGetLastError();
    CUDA_CHECK(cudaFuncSetAttribute(static_tile_kernel<0>, cudaFuncAttributeMaxDynamicSharedMemorySize, optin));
    LAUNCH_KERNEL(static_tile_kernel<0>, 2, 128, optin, 0, out.ptr);
    CHECK_EQ(out.download()[0], kStaticInts - 1);
    CHECK_THROWS(LAUNCH_KERNEL(static_tile_kernel<0>, 1, 128, optin + 1024, 0, out.ptr), "cudaErrorInvalidValue");
    CUDA_CHECK(cudaDeviceSynchronize());
}

__global__ void fill_kernel(int* x, int n, int base) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) x[i] = base + i;
}
__global__ void copy_kernel(int* out, const int* in, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = in[i];
}

// Stream `a` writes x, then stream `b` copies x to y (after an event recorded on `a` when `event`):
// how many elements of y missed a's write.
int stale_copies(cudaStream_t a, cudaStream_t b, bool event) {
    const int n = 64;
    DeviceBuffer<int> x(std::vector<int>(n, -1)), y(n);
    cudaEvent_t written;
    CUDA_CHECK(cudaEventCreateWithFlags(&written, cudaEventDisableTiming));
    LAUNCH_KERNEL(fill_kernel, 1, n, 0, a, x.ptr, n, 1000);
    if (event) {
        CUDA_CHECK(cudaEventRecord(written, a));
        CUDA_CHECK(cudaStreamWaitEvent(b, written, 0));
    }
    LAUNCH_KERNEL(copy_kernel, 1, n, 0, b, y.ptr, x.ptr, n);
    std::vector<int> out = y.download();
    CUDA_CHECK(cudaEventDestroy(written));
    int stale = 0;
    for (int i = 0; i < n; i++) stale += out[i] != 1000 + i;
    return stale;
}

#ifdef FP8RL_EMU
// Runs fn(seed) under scheduling seeds 0-8 (each another interleaving of the streams' work).
template <class Fn>
void for_each_schedule(Fn fn) {
    struct Restore {
        uint64_t saved = emu::seed();
        ~Restore() { emu::set_seed(saved); }
    } restore;
    for (uint64_t s = 0; s <= 8; s++) {
        emu::set_seed(s);
        fn(s);
    }
}
#else
template <class Fn>
void for_each_schedule(Fn fn) {
    fn(0);
}
#endif

// Events order two non-blocking streams; the legacy stream and a blocking stream order each other.
TEST(streams_ordered_by_events_and_the_legacy_stream_see_each_others_writes) {
    cudaStream_t a, b, blocking;
    CUDA_CHECK(cudaStreamCreateWithFlags(&a, cudaStreamNonBlocking));
    CUDA_CHECK(cudaStreamCreateWithFlags(&b, cudaStreamNonBlocking));
    CUDA_CHECK(cudaStreamCreate(&blocking));
    for_each_schedule([&](uint64_t seed) {
        CHECK_MSG(stale_copies(a, b, true) == 0, "seed %llu: an event did not order two streams", (unsigned long long)seed);
        CHECK_MSG(stale_copies(0, blocking, false) == 0, "seed %llu: a blocking stream ran before legacy-stream work",
                  (unsigned long long)seed);
        CHECK_MSG(stale_copies(blocking, 0, false) == 0, "seed %llu: the legacy stream ran before a blocking stream's work",
                  (unsigned long long)seed);
    });
    CUDA_CHECK(cudaStreamDestroy(blocking));
    CUDA_CHECK(cudaStreamDestroy(b));
    CUDA_CHECK(cudaStreamDestroy(a));
}

#ifdef FP8RL_EMU

// Without an event, two non-blocking streams (or a non-blocking stream after the legacy stream)
// race: some seed runs the copy first.
TEST(emu_rule_unordered_streams_race_under_some_seed) {
    cudaStream_t a, b;
    CUDA_CHECK(cudaStreamCreateWithFlags(&a, cudaStreamNonBlocking));
    CUDA_CHECK(cudaStreamCreateWithFlags(&b, cudaStreamNonBlocking));
    int two_streams = 0, after_legacy = 0;
    for_each_schedule([&](uint64_t seed) {
        if (seed == 0) return;  // in order: no race shows
        two_streams += stale_copies(a, b, false) > 0;
        after_legacy += stale_copies(0, b, false) > 0;
    });
    printf("    stale copies under %d of seeds 1-8 (two streams), %d (non-blocking after legacy)\n", two_streams, after_legacy);
    CHECK_MSG(two_streams > 0, "two unordered non-blocking streams were right under seeds 1-8 (the rule: streams run as a GPU runs them)");
    CHECK_MSG(after_legacy > 0, "a non-blocking stream was ordered after the legacy stream under seeds 1-8 (the rule: "
              "cudaStreamNonBlocking streams do not synchronize with the legacy stream)");
    CUDA_CHECK(cudaStreamDestroy(b));
    CUDA_CHECK(cudaStreamDestroy(a));
}

// cudaMemcpyAsync to the host happens when its stream reaches it: a host read before
// cudaStreamSynchronize sees the old contents under some seed, pinned or pageable.
TEST(emu_rule_async_copy_lands_when_its_stream_reaches_it) {
    const int n = 64;
    cudaStream_t s;
    CUDA_CHECK(cudaStreamCreate(&s));
    DeviceBuffer<int> d(n);
    int* pinned = nullptr;
    CUDA_CHECK(cudaMallocHost((void**)&pinned, n * sizeof(int)));
    int old_pinned = 0, old_pageable = 0;
    for_each_schedule([&](uint64_t seed) {
        std::vector<int> pageable(n, -1);
        for (int i = 0; i < n; i++) pinned[i] = -1;
        LAUNCH_KERNEL(fill_kernel, 1, n, 0, s, d.ptr, n, 1000 * (int)seed);
        CUDA_CHECK(cudaMemcpyAsync(pinned, d.ptr, n * sizeof(int), cudaMemcpyDeviceToHost, s));
        CUDA_CHECK(cudaMemcpyAsync(pageable.data(), d.ptr, n * sizeof(int), cudaMemcpyDeviceToHost, s));
        old_pinned += pinned[n - 1] == -1;  // read before synchronizing: wrong on a GPU
        old_pageable += pageable[n - 1] == -1;
        CUDA_CHECK(cudaStreamSynchronize(s));
        CHECK_EQ(pinned[n - 1], 1000 * (int)seed + n - 1);
        CHECK_EQ(pageable[n - 1], 1000 * (int)seed + n - 1);
    });
    printf("    old contents read under %d (pinned), %d (pageable) of seeds 0-8\n", old_pinned, old_pageable);
    CHECK_MSG(old_pinned > 0 && old_pageable > 0, "a host read before cudaStreamSynchronize saw the copy done under every "
              "seed (the rule: an async copy happens when its stream reaches it)");
    CUDA_CHECK(cudaFreeHost(pinned));
    CUDA_CHECK(cudaStreamDestroy(s));
}

__global__ void write_kernel(int* out, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = i;
}

// Sets environment variables for one scope (restoring what was there).
struct ScopedEnv {
    std::vector<std::pair<std::string, std::string>> saved;
    std::vector<std::string> unset_after;
    void set(const char* name, const char* value) {
        const char* old = getenv(name);
        if (old) saved.emplace_back(name, old);
        else unset_after.push_back(name);
        if (value) setenv(name, value, 1);
        else unsetenv(name);
    }
    ~ScopedEnv() {
        for (auto& kv : saved) setenv(kv.first.c_str(), kv.second.c_str(), 1);
        for (auto& n : unset_after) unsetenv(n.c_str());
        cudaSetDevice(0);
        cudaGetLastError();
    }
};

struct ChildResult {
    int signal = 0, status = -1;
    std::string err;
};

// Runs `body` in a forked child with its stderr captured.
template <class Body>
ChildResult run_child(Body body) {
    int fds[2];
    if (pipe(fds) != 0) fail("pipe failed");
    fflush(stdout);
    fflush(stderr);
    pid_t pid = fork();
    if (pid < 0) fail("fork failed");
    if (pid == 0) {
        close(fds[0]);
        dup2(fds[1], 2);
        body();
        _exit(0);
    }
    close(fds[1]);
    ChildResult r;
    char buf[4096];
    for (ssize_t n; (n = read(fds[0], buf, sizeof buf)) > 0;) r.err.append(buf, (size_t)n);
    close(fds[0]);
    int st = 0;
    waitpid(pid, &st, 0);
    if (WIFSIGNALED(st)) r.signal = WTERMSIG(st);
    if (WIFEXITED(st)) r.status = WEXITSTATUS(st);
    return r;
}

// Runs `body` in a child and returns its stderr, with the message of the Error it threw.
template <class Body>
std::string child_stderr(Body body) {
    return run_child([&] {
        try {
            body();
        } catch (const Error& e) {
            fprintf(stderr, "%s\n", e.what());
        }
    }).err;
}

TEST(emu_rule_launch_messages_name_the_rule_and_kernel) {
    std::string err = child_stderr([] {
        DeviceBuffer<int> out(128);
        LAUNCH_KERNEL(bounded_kernel, 1, 128, 0, 0, out.ptr);
    });
    CHECK_MSG(err.find("launch of bounded_kernel with 128 threads per block, above its __launch_bounds__ maximum of 64 "
                       "(the rule: a launch above the kernel's bound fails): cudaErrorLaunchOutOfResources") != std::string::npos,
              "%s", err.c_str());
    // The static part is known from the first block that reached it, so the second launch is refused before it runs.
    err = child_stderr([] {
        DeviceBuffer<int> out(1);
        LAUNCH_KERNEL(static_tile_kernel<1>, 1, 128, 0, 0, out.ptr);
        LAUNCH_KERNEL(static_tile_kernel<1>, 1, 128, 16 << 10, 0, out.ptr);
    });
    CHECK_MSG(err.find("launch of static_tile_kernel<1> refused: 40960 bytes of static + 16384 of dynamic shared memory, above "
                       "the 48 KB a block has without the opt-in (the rule: static + dynamic shared memory at most 48 KB") !=
                  std::string::npos, "%s", err.c_str());
}

// A kernel whose static shared memory nobody has reached yet: its first block finds it over the limit
// and the launch is refused there, with the error a GPU returns, not a sticky fault.
TEST(emu_rule_static_shared_memory_over_the_limit_refuses_its_first_launch) {
    std::string err = child_stderr([] {
        DeviceBuffer<int> out(1);
        LAUNCH_KERNEL(static_tile_kernel<2>, 1, 128, 16 << 10, 0, out.ptr);
    });
    CHECK_MSG(err.find("launch of static_tile_kernel<2> refused: 40960 bytes of static + 16384 of dynamic shared memory") !=
                  std::string::npos && err.find("found as block (0,0,0) reached STATIC_SHARED tile (40960 bytes): "
                                                "cudaErrorInvalidValue, as a GPU refuses the launch") != std::string::npos,
              "%s", err.c_str());
    DeviceBuffer<int> out(1);
    CHECK_THROWS([&] {
        LAUNCH_KERNEL(static_tile_kernel<3>, 1, 128, 16 << 10, 0, out.ptr);
        CUDA_CHECK(cudaDeviceSynchronize());
        CUDA_CHECK(cudaGetLastError());
    }(), "cudaErrorInvalidValue");
    CUDA_CHECK(cudaDeviceSynchronize());  // not sticky: the device goes on
    CHECK_THROWS(LAUNCH_KERNEL(static_tile_kernel<3>, 1, 128, 16 << 10, 0, out.ptr), "cudaErrorInvalidValue");
    LAUNCH_KERNEL(static_tile_kernel<3>, 1, 128, 0, 0, out.ptr);
    CHECK_EQ(out.download()[0], kStaticInts - 1);
}

// Static shared memory starts each block as the NaN pattern, as dynamic shared memory does: a block
// does not see what another one left, whichever order they run in.
__global__ void leftover_kernel(int* out) {
    STATIC_SHARED(int, slot, [1]);
    if (blockIdx.x == 0) slot[0] = 7;
    out[blockIdx.x] = slot[0];
}

TEST(emu_static_shared_memory_starts_each_block_as_nan) {
    DeviceBuffer<int> out(2);
    for (int launch = 0; launch < 2; launch++) {
        LAUNCH_KERNEL(leftover_kernel, 2, 1, 0, 0, out.ptr);
        CHECK(out.download() == std::vector<int>({7, -1}));
    }
}

TEST(emu_rule_host_code_cannot_touch_device_memory) {
    ChildResult r = run_child([] {
        DeviceBuffer<float> a(64), b(1000);
        volatile float* p = b.ptr;
        p[10] = 1.0f;  // a host write into cudaMalloc'ed memory: a GPU program cannot do this
    });
    CHECK_EQ(r.signal, SIGABRT);
    CHECK_MSG(r.err.find("the rule: device memory is not host memory") != std::string::npos, "%s", r.err.c_str());
    CHECK_MSG(r.err.find("byte 40 of the ") != std::string::npos && r.err.find("-byte buffer of cudaMalloc #") != std::string::npos, "%s", r.err.c_str());
    // Host code that goes through the runtime is fine: the same buffer, copied.
    DeviceBuffer<float> ok(std::vector<float>(8, 2.0f));
    CHECK(ok.download() == std::vector<float>(8, 2.0f));
}

TEST(emu_rule_kernel_arguments_are_device_or_pinned_memory) {
    std::vector<int> host(64, -1);
    LAUNCH_KERNEL(write_kernel, 1, 64, 0, 0, host.data(), 64);  // the launch itself succeeds, as on a GPU
    CHECK_EQ(cudaDeviceSynchronize(), cudaErrorIllegalAddress);
    CHECK(host == std::vector<int>(64, -1));
    CHECK_EQ(cudaDeviceReset(), cudaSuccess);
    int on_stack[4] = {};
    LAUNCH_KERNEL(write_kernel, 1, 4, 0, 0, &on_stack[0], 4);
    CHECK_EQ(cudaDeviceSynchronize(), cudaErrorIllegalAddress);
    CHECK_EQ(cudaDeviceReset(), cudaSuccess);
    // Pinned host memory, device memory and null are what a kernel may be given.
    int* pinned = nullptr;
    CUDA_CHECK(cudaMallocHost((void**)&pinned, 64 * sizeof(int)));
    LAUNCH_KERNEL(write_kernel, 1, 64, 0, 0, pinned, 64);
    CUDA_CHECK(cudaDeviceSynchronize());
    CHECK_EQ(pinned[63], 63);
    CUDA_CHECK(cudaFreeHost(pinned));
    DeviceBuffer<int> dev(64);
    LAUNCH_KERNEL(write_kernel, 1, 64, 0, 0, dev.ptr, 64);
    LAUNCH_KERNEL(write_kernel, 1, 1, 0, 0, (int*)nullptr, 0);
    CHECK_EQ(dev.download()[5], 5);
}

// A GPU faults on a vector access at an address that is not a multiple of its size (16 bytes for
// ld.global.v4): cudaErrorMisalignedAddress, sticky. cuda/element.cuh's load_vector and store_vector
// fault so in emulation, so a kernel's fallback to narrower accesses is exercised by its tests.
__global__ void vector_copy_kernel(const uint8_t* in, uint8_t* out) {
    store_vector<uint4>(out, load_vector<uint4>(in));
}

TEST(emu_rule_vector_accesses_are_aligned_to_their_size) {
    DeviceBuffer<uint8_t> in(64), out(64);
    CUDA_CHECK(cudaMemset(in.ptr, 7, 64));
    LAUNCH_KERNEL(vector_copy_kernel, 1, 1, 0, 0, in.ptr + 16, out.ptr + 32);  // aligned: fine
    CHECK_EQ(out.download()[40], 7);
    for (int misaligned : {0, 1}) {  // the load, then the store
        std::string err;
        try {
            LAUNCH_KERNEL(vector_copy_kernel, 1, 1, 0, 0, in.ptr + (misaligned == 0 ? 8 : 0), out.ptr + (misaligned == 1 ? 4 : 0));
            CUDA_CHECK(cudaDeviceSynchronize());
        } catch (const Error& e) {
            err = e.what();
        }
        CHECK_MSG(err.find("cudaErrorMisalignedAddress") != std::string::npos &&
                      err.find(misaligned == 0 ? "16-byte vector load" : "16-byte vector store") != std::string::npos &&
                      err.find("(the rule: a vector access must be aligned to its size)") != std::string::npos,
                  "%s", err.c_str());
        CHECK_EQ(cudaDeviceSynchronize(), cudaErrorMisalignedAddress);  // sticky
        CHECK_EQ(cudaDeviceReset(), cudaSuccess);
    }
}

// cp.async (cuda_pipeline_primitives.h): a copy lands when its thread waits for its group, so a
// read of the destination before __pipeline_wait_prior sees what was there (shared memory starts
// as NaN bytes); the header's rules (global source, shared destination, both aligned to the size)
// are kernel faults. mode 0: copy 16 bytes in[0..3] and read before and after the wait; 1: a source
// 4 bytes off; 2: a global destination; 3: 16 zero-filled bytes (zfill 16: PTX's src-size 0, nothing
// read) from past the end of `in`, which lands as zeros and is no fault.
__global__ void async_copy_kernel(const int* in, int* out, int mode) {
    STATIC_SHARED(uint4, tile, [1]);
    void* dst = mode == 2 ? (void*)out : (void*)tile;
    __pipeline_memcpy_async(dst, mode == 1 ? in + 1 : mode == 3 ? in + 64 : in, 16, mode == 3 ? 16 : 0);
    __pipeline_commit();
    int before, after;
    memcpy(&before, tile, sizeof before);
    __pipeline_wait_prior(0);
    memcpy(&after, tile, sizeof after);
    out[4] = before, out[5] = after;
}

TEST(emu_rule_async_copies_land_at_the_wait_and_keep_the_header_rules) {
    DeviceBuffer<int> in(std::vector<int>{11, 12, 13, 14, 15}), out(8);
    LAUNCH_KERNEL(async_copy_kernel, 1, 1, 0, 0, (const int*)in.ptr, out.ptr, 0);
    const std::vector<int> got = out.download();
    CHECK_EQ(got[4], -1);  // 0xFFFFFFFF: the copy has not landed
    CHECK_EQ(got[5], 11);
    LAUNCH_KERNEL(async_copy_kernel, 1, 1, 0, 0, (const int*)in.ptr, out.ptr, 3);
    CHECK_EQ(out.download()[5], 0);
    const char* rules[] = {"", "cudaErrorMisalignedAddress", "outside the block's shared memory"};
    check_refusals(rules, 1, 2,
                   [&](int mode) { LAUNCH_KERNEL(async_copy_kernel, 1, 1, 0, 0, (const int*)in.ptr, out.ptr, mode); });
}

#ifdef FP8RL_EMU
// ldmatrix (PTX ISA): .sync.aligned, all 32 lanes of the warp with the same .num and .trans, each
// row address 16-byte aligned in shared memory. mode 0: right; 1: rows 8 bytes off; 2: rows in
// global memory; 3: half the lanes .trans; 4: lane 31 leaves first. (On a GPU these are undefined
// behaviour, so the test is the emulation's.)
__global__ void ldmatrix_rule_kernel(uint32_t* out, const __nv_bfloat16* in, int mode) {
    DYNAMIC_SHARED(__nv_bfloat16, tile);  // 8 rows of 8, twice
    for (int i = threadIdx.x; i < 128; i += blockDim.x) tile[i] = in[i];
    __syncthreads();
    if (mode == 4 && threadIdx.x == 31) return;
    const __nv_bfloat16* base = mode == 1 ? tile + 4 : mode == 2 ? in : tile;
    uint32_t r[4];
    if (mode == 3 && threadIdx.x < 16)
        ldmatrix_x4<true>(r, base + 8 * (threadIdx.x % 16));
    else
        ldmatrix_x4<false>(r, base + 8 * (threadIdx.x % 16));
    for (int i = 0; i < 4; i++) out[threadIdx.x * 4 + i] = r[i];
}

TEST(emu_rule_ldmatrix_is_warp_wide_aligned_and_shared) {
    std::vector<__nv_bfloat16> values(128);
    for (int i = 0; i < 128; i++) values[i] = __float2bfloat16((float)i);
    DeviceBuffer<__nv_bfloat16> in(values);
    DeviceBuffer<uint32_t> out(128);
    LAUNCH_KERNEL(ldmatrix_rule_kernel, 1, 32, 128 * sizeof(__nv_bfloat16), 0, out.ptr, (const __nv_bfloat16*)in.ptr, 0);
    const std::vector<uint32_t> got = out.download();
    // lane 5, register 2: matrix 2 (rows of lanes 16-23, elements 0-63 again), row 1, elements 2 and 3
    CHECK_EQ(got[5 * 4 + 2], (uint32_t)bf16_bits(values[8 + 2]) | (uint32_t)bf16_bits(values[8 + 3]) << 16);
    const char* rules[] = {"", "is not 16-byte aligned", "outside the block's shared memory",
                           "every lane runs the same instruction", "wait at ldmatrix, but lane 31 is exited"};
    check_refusals(rules, 1, 4, [&](int mode) {
        LAUNCH_KERNEL(ldmatrix_rule_kernel, 1, 32, 128 * sizeof(__nv_bfloat16), 0, out.ptr, (const __nv_bfloat16*)in.ptr,
                      mode);
    });
}
#endif

TEST(emu_rule_copy_host_side_is_not_device_memory) {
    DeviceBuffer<int> a(16), b(16);
    CHECK_EQ(cudaMemcpy(a.ptr, b.ptr, 16 * sizeof(int), cudaMemcpyHostToDevice), cudaErrorInvalidValue);
    CHECK_EQ(cudaMemcpy(a.ptr, b.ptr, 16 * sizeof(int), cudaMemcpyDeviceToHost), cudaErrorInvalidValue);
    CHECK_EQ(cudaGetLastError(), cudaErrorInvalidValue);
    CUDA_CHECK(cudaMemcpy(a.ptr, b.ptr, 16 * sizeof(int), cudaMemcpyDeviceToDevice));
}

// Each call CUDA calls unsafe during a global capture is refused and invalidates the capture.
TEST(emu_rule_unsafe_calls_invalidate_a_global_capture) {
    cudaStream_t s, other;
    CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    CUDA_CHECK(cudaStreamCreateWithFlags(&other, cudaStreamNonBlocking));
    DeviceBuffer<int> a(16);
    std::vector<int> host(16);
    const char* names[] = {"cudaMalloc", "cudaFree", "cudaMemcpy", "cudaStreamSynchronize", "cudaDeviceSynchronize"};
    for (int call = 0; call < 5; call++) {
        CUDA_CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
        LAUNCH_KERNEL(write_kernel, 1, 16, 0, s, a.ptr, 16);
        void* p = nullptr;
        cudaError_t e = call == 0   ? cudaMalloc(&p, 64)
                        : call == 1 ? cudaFree(a.ptr)
                        : call == 2 ? cudaMemcpy(host.data(), a.ptr, 64, cudaMemcpyDeviceToHost)
                        : call == 3 ? cudaStreamSynchronize(other)
                                    : cudaDeviceSynchronize();
        CHECK_MSG(e == cudaErrorStreamCaptureUnsupported, "%s: %s", names[call], cudaGetErrorName(e));
        cudaStreamCaptureStatus status;
        CUDA_CHECK(cudaStreamIsCapturing(s, &status));
        CHECK_EQ(status, cudaStreamCaptureStatusInvalidated);
        cudaGraph_t graph = nullptr;
        CHECK_EQ(cudaStreamEndCapture(s, &graph), cudaErrorStreamCaptureInvalidated);
        CHECK(graph == nullptr);
        cudaGetLastError();
    }
    // A relaxed capture allows them.
    CUDA_CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeRelaxed));
    void* p = nullptr;
    CUDA_CHECK(cudaMalloc(&p, 64));
    CUDA_CHECK(cudaFree(p));
    cudaGraph_t graph = nullptr;
    CUDA_CHECK(cudaStreamEndCapture(s, &graph));
    CUDA_CHECK(cudaGraphDestroy(graph));
    CUDA_CHECK(cudaStreamDestroy(other));
    CUDA_CHECK(cudaStreamDestroy(s));
}

TEST(emu_rule_devices_are_filtered_by_cuda_visible_devices) {
    ScopedEnv env;
    env.set("FP8RL_EMU_DEVICES", "4");
    env.set("CUDA_VISIBLE_DEVICES", "2,3");
    int n = 0;
    CUDA_CHECK(cudaGetDeviceCount(&n));
    CHECK_EQ(n, 2);
    CUDA_CHECK(cudaSetDevice(1));
    CHECK_EQ(cudaSetDevice(2), cudaErrorInvalidDevice);  // past the last visible one
    cudaGetLastError();
    char id0[32], id1[32];
    CUDA_CHECK(cudaDeviceGetPCIBusId(id0, 32, 0));
    CUDA_CHECK(cudaDeviceGetPCIBusId(id1, 32, 1));
    CHECK(std::string(id0) != std::string(id1));
    env.set("CUDA_VISIBLE_DEVICES", "1,7,2");  // the runtime stops at the first entry naming no device
    CUDA_CHECK(cudaGetDeviceCount(&n));
    CHECK_EQ(n, 1);
    env.set("CUDA_VISIBLE_DEVICES", "");
    CHECK_EQ(cudaGetDeviceCount(&n), cudaErrorNoDevice);
    cudaGetLastError();
}

// A rank of a launcher that gives each rank its own CUDA_VISIBLE_DEVICES sees one GPU, whatever its
// local rank; before MPI_Init its device comes from the launcher's variable.
TEST(device_selection_with_a_gpu_per_rank) {
    ScopedEnv env;
    env.set("FP8RL_EMU_DEVICES", "8");
    env.set("CUDA_VISIBLE_DEVICES", "5");
    env.set("OMPI_COMM_WORLD_LOCAL_RANK", "5");
    select_device_before_mpi();
    int d = -1;
    CUDA_CHECK(cudaGetDevice(&d));
    CHECK_EQ(d, 0);
    env.set("CUDA_VISIBLE_DEVICES", nullptr);
    env.set("OMPI_COMM_WORLD_LOCAL_RANK", nullptr);
    env.set("SLURM_LOCALID", "3");
    select_device_before_mpi();
    CUDA_CHECK(cudaGetDevice(&d));
    CHECK_EQ(d, 3);
}

// Defect 6: the attention launchers set the shared-memory attribute once, not per launch.
TEST(attention_sets_its_shared_memory_attribute_once) {
    PackedAttentionShape s{8, 2, 1, 64, 1, 8};
    DeviceBuffer<__nv_bfloat16> q((size_t)8 * 2 * 64), k((size_t)8 * 64), v((size_t)8 * 64), out((size_t)8 * 2 * 64);
    DeviceBuffer<float> lse(8 * 2);
    DeviceBuffer<int> cu(std::vector<int>{0, 8});
    q.poison(), k.poison(), v.poison();
    attention_forward(out.ptr, lse.ptr, q.ptr, k.ptr, v.ptr, cu.ptr, s, 0);
    const uint64_t before = emu::func_attribute_calls();
    for (int i = 0; i < 3; i++) attention_forward(out.ptr, lse.ptr, q.ptr, k.ptr, v.ptr, cu.ptr, s, 0);
    CUDA_CHECK(cudaDeviceSynchronize());
    CHECK_MSG(emu::func_attribute_calls() == before, "%llu cudaFuncSetAttribute calls in 3 launches",
              (unsigned long long)(emu::func_attribute_calls() - before));
}

// Defect 6: the quantize launchers set the shared-memory attribute once, not per launch.
TEST(quantize_sets_its_shared_memory_attribute_once) {
    const int rows = 128, cols = 128;
    DeviceBuffer<__nv_bfloat16> x((size_t)rows * cols);
    DeviceBuffer<uint8_t> codes((size_t)rows * cols), codes_t((size_t)rows * cols);
    DeviceBuffer<float> scale(1024), scale_t(1024);  // more than either layout's scale count at 128 x 128
    x.poison();
    auto quantize_both = [&] {
        fp8_quantize_rowwise_gpu(x.ptr, rows, cols, false, codes.ptr, scale.ptr, codes_t.ptr, scale_t.ptr, 0);
        fp8_quantize_blockwise_gpu(x.ptr, rows, cols, false, codes.ptr, scale.ptr, codes_t.ptr, scale_t.ptr, 0);
    };
    quantize_both();
    const uint64_t before = emu::func_attribute_calls();
    for (int i = 0; i < 3; i++) quantize_both();
    CUDA_CHECK(cudaDeviceSynchronize());
    CHECK_MSG(emu::func_attribute_calls() == before, "%llu cudaFuncSetAttribute calls in 6 launches",
              (unsigned long long)(emu::func_attribute_calls() - before));
}

#endif  // FP8RL_EMU

}  // namespace
