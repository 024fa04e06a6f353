// test_emu_rules.cu: what a GPU refuses, refused by the emulation too (docs/gpu-emulation.md):
// each rule has a small wrong program that must trip it with a message naming the rule. A host
// dereference of device memory stops the program, so that one runs in a forked child. Also the
// device selection of cuda/device.cuh (both builds) and the once-only cudaFuncSetAttribute.
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <string>
#include <vector>

#include "cuda/attention.cuh"
#include "cuda/device.cuh"
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

#ifdef FP8RL_EMU

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
