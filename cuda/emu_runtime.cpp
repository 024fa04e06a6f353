// emu_runtime.cpp: the CUDA runtime API of the emulation (cuda/emu.h), implemented against the
// real declarations of cuda_runtime_api.h (so the program links without libcudart):
//   - one device, reported as an H200 (sm_90, 132 SMs, 143,771 MiB; FP8RL_EMU_DEVICE_MEMORY=bytes
//     lowers the capacity, so out-of-memory paths can be tested);
//   - device memory from the host heap, exactly the size asked (ASan sees an overflow), filled
//     with 0xFF bytes (NaN as FP32, BF16 and E4M3) so a read of memory nobody wrote shows;
//     copies check that their device side lies inside one allocation;
//   - streams and events in issue order (everything runs synchronously), event times from the
//     host clock; graph capture records launches, copies and sets, and a graph launch replays them;
//   - launch configurations checked against sm_90's limits; launch errors returned once by
//     cudaGetLastError, kernel faults sticky until cudaDeviceReset.
#include <chrono>
#include <cstdlib>
#include <map>
#include <memory>
#include <set>
#include <vector>

#include "cuda/emu.h"
#include "cuda/emu_internal.h"

#undef warpSize  // the field of cudaDeviceProp, not the built-in variable

struct CUstream_st {
    bool capturing = false;
    cudaGraph_t graph = nullptr;
};
struct CUevent_st {
    double ms = 0;
    bool recorded = false;
};
struct CUgraph_st {
    std::vector<std::function<void()>> ops;
};
struct CUgraphExec_st {
    std::vector<std::function<void()>> ops;
};

namespace emu {
namespace {

constexpr size_t H200_BYTES = 143771ull << 20;
constexpr int MAX_THREADS = 1024, MAX_DIM_XY = 1024, MAX_DIM_Z = 64;
constexpr unsigned MAX_GRID_X = 0x7FFFFFFFu, MAX_GRID_YZ = 65535;
constexpr int DEFAULT_SMEM = 48 << 10, MAX_OPTIN_SMEM = 227 << 10;

cudaError_t last_error = cudaSuccess, sticky_error = cudaSuccess;
std::map<uintptr_t, size_t> allocations;  // base -> bytes
size_t allocated = 0;
std::map<const void*, int> max_dynamic_smem;  // kernel -> cudaFuncAttributeMaxDynamicSharedMemorySize
std::set<cudaStream_t> streams;
int capturing_streams = 0;
const auto clock_start = std::chrono::steady_clock::now();

size_t capacity() {
    static size_t bytes = [] {
        const char* s = getenv("FP8RL_EMU_DEVICE_MEMORY");
        return s && *s ? (size_t)strtoull(s, nullptr, 0) : H200_BYTES;
    }();
    return bytes;
}

cudaError_t set_error(cudaError_t e) {
    if (e != cudaSuccess) last_error = e;
    return e;
}

// The stream a call names, or null for the default stream; *bad when the handle is unknown.
CUstream_st* stream_of(cudaStream_t s, bool* bad) {
    *bad = false;
    if (s == nullptr || s == cudaStreamLegacy || s == cudaStreamPerThread) return nullptr;
    if (!streams.count(s)) *bad = true;
    return s;
}

// True when [p, p + bytes) lies inside one device allocation.
bool on_device(const void* p, size_t bytes) {
    uintptr_t u = (uintptr_t)p;
    auto it = allocations.upper_bound(u);
    if (it == allocations.begin()) return false;
    --it;
    return u >= it->first && u + bytes <= it->first + it->second;
}

cudaError_t check_copy(void* dst, const void* src, size_t bytes, cudaMemcpyKind kind) {
    bool dst_dev = kind == cudaMemcpyHostToDevice || kind == cudaMemcpyDeviceToDevice;
    bool src_dev = kind == cudaMemcpyDeviceToHost || kind == cudaMemcpyDeviceToDevice;
    if ((dst_dev && !on_device(dst, bytes)) || (src_dev && !on_device(src, bytes))) {
        fprintf(stderr, "CUDA emulation: cudaMemcpy of %zu bytes (kind %d): the device side is not inside one cudaMalloc'ed buffer\n",
                bytes, (int)kind);
        return set_error(cudaErrorInvalidValue);
    }
    return cudaSuccess;
}

// Runs `op` now, or records it when the stream captures a graph.
cudaError_t enqueue(cudaStream_t s, std::function<void()> op) {
    bool bad;
    CUstream_st* st = stream_of(s, &bad);
    if (bad) return set_error(cudaErrorInvalidResourceHandle);
    if (sticky_error != cudaSuccess) return sticky_error;
    if (st && st->capturing) {
        st->graph->ops.push_back(std::move(op));
        return cudaSuccess;
    }
    if (!st && capturing_streams > 0) return set_error(cudaErrorStreamCaptureImplicit);
    op();
    return cudaSuccess;
}

}  // namespace

void set_sticky_error(cudaError_t e) { sticky_error = e; }
cudaError_t stream_op(cudaStream_t stream, std::function<void()> op) { return enqueue(stream, std::move(op)); }
bool is_device_memory(const void* p, size_t bytes) { return on_device(p, bytes); }

void launch(const char* name, const void* kernel, dim3 grid, dim3 block, size_t smem, cudaStream_t stream,
            std::function<void()> body) {
    long threads = (long)block.x * block.y * block.z;
    if (block.x == 0 || block.y == 0 || block.z == 0 || block.x > MAX_DIM_XY || block.y > MAX_DIM_XY || block.z > MAX_DIM_Z ||
        threads > MAX_THREADS || grid.x == 0 || grid.y == 0 || grid.z == 0 || grid.x > MAX_GRID_X || grid.y > MAX_GRID_YZ ||
        grid.z > MAX_GRID_YZ) {
        fprintf(stderr, "CUDA emulation: launch of %s with grid (%u,%u,%u) block (%u,%u,%u) exceeds sm_90's limits\n", name,
                grid.x, grid.y, grid.z, block.x, block.y, block.z);
        set_error(cudaErrorInvalidConfiguration);
        return;
    }
    auto it = max_dynamic_smem.find(kernel);
    size_t allowed = it != max_dynamic_smem.end() ? (size_t)it->second : DEFAULT_SMEM;
    if (smem > allowed) {
        fprintf(stderr, "CUDA emulation: launch of %s asks %zu bytes of dynamic shared memory, %zu allowed (raise it with "
                "cudaFuncSetAttribute(MaxDynamicSharedMemorySize), at most %d)\n", name, smem, allowed, MAX_OPTIN_SMEM);
        set_error(cudaErrorInvalidValue);
        return;
    }
    std::string kernel_name = name;
    enqueue(stream, [=] { run_grid(kernel_name.c_str(), grid, block, smem, body); });
}

}  // namespace emu

using namespace emu;

// ---------------------------------------------------------------------------------------------
// Errors and the device.

cudaError_t cudaGetLastError() {
    cudaError_t e = sticky_error != cudaSuccess ? sticky_error : last_error;
    last_error = cudaSuccess;
    return e;
}
cudaError_t cudaPeekAtLastError() { return sticky_error != cudaSuccess ? sticky_error : last_error; }

const char* cudaGetErrorName(cudaError_t e) {
    switch (e) {
        case cudaSuccess: return "cudaSuccess";
        case cudaErrorInvalidValue: return "cudaErrorInvalidValue";
        case cudaErrorMemoryAllocation: return "cudaErrorMemoryAllocation";
        case cudaErrorInvalidConfiguration: return "cudaErrorInvalidConfiguration";
        case cudaErrorInvalidDevice: return "cudaErrorInvalidDevice";
        case cudaErrorInvalidResourceHandle: return "cudaErrorInvalidResourceHandle";
        case cudaErrorLaunchFailure: return "cudaErrorLaunchFailure";
        case cudaErrorStreamCaptureUnsupported: return "cudaErrorStreamCaptureUnsupported";
        case cudaErrorStreamCaptureImplicit: return "cudaErrorStreamCaptureImplicit";
        case cudaErrorIllegalState: return "cudaErrorIllegalState";
        default: return "cudaErrorUnknown";
    }
}

const char* cudaGetErrorString(cudaError_t e) {
    static std::string message;
    switch (e) {
        case cudaSuccess: return "no error";
        case cudaErrorInvalidValue: return "invalid argument";
        case cudaErrorMemoryAllocation: return "out of memory";
        case cudaErrorInvalidConfiguration: return "invalid configuration argument";
        case cudaErrorInvalidDevice: return "invalid device ordinal";
        case cudaErrorInvalidResourceHandle: return "invalid resource handle";
        case cudaErrorLaunchFailure:
            message = "unspecified launch failure (emulation: " + last_fault() + ")";
            return message.c_str();
        case cudaErrorStreamCaptureUnsupported: return "operation not permitted when stream is capturing";
        case cudaErrorStreamCaptureImplicit: return "operation would make the legacy stream depend on a capturing blocking stream";
        case cudaErrorIllegalState: return "the operation is not permitted in the current state";
        default: return "unknown error";
    }
}

cudaError_t cudaGetDeviceCount(int* count) {
    *count = 1;
    return cudaSuccess;
}
cudaError_t cudaGetDevice(int* device) {
    *device = 0;
    return cudaSuccess;
}
cudaError_t cudaSetDevice(int device) { return device == 0 ? cudaSuccess : set_error(cudaErrorInvalidDevice); }

cudaError_t cudaGetDeviceProperties(cudaDeviceProp* p, int device) {
    if (device != 0) return set_error(cudaErrorInvalidDevice);
    *p = cudaDeviceProp();
    snprintf(p->name, sizeof p->name, "NVIDIA H200 (fp8rl CUDA emulation)");
    p->major = 9, p->minor = 0;
    p->multiProcessorCount = 132;
    p->totalGlobalMem = capacity();
    p->sharedMemPerBlock = DEFAULT_SMEM;
    p->sharedMemPerBlockOptin = MAX_OPTIN_SMEM;
    p->sharedMemPerMultiprocessor = 228 << 10;
    p->regsPerBlock = 65536, p->regsPerMultiprocessor = 65536;
    p->warpSize = 32;
    p->maxThreadsPerBlock = MAX_THREADS, p->maxThreadsPerMultiProcessor = 2048;
    p->maxThreadsDim[0] = MAX_DIM_XY, p->maxThreadsDim[1] = MAX_DIM_XY, p->maxThreadsDim[2] = MAX_DIM_Z;
    p->maxGridSize[0] = (int)MAX_GRID_X, p->maxGridSize[1] = MAX_GRID_YZ, p->maxGridSize[2] = MAX_GRID_YZ;
    p->l2CacheSize = 50 << 20;
    p->memoryBusWidth = 6144;
    p->totalConstMem = 64 << 10;
    return cudaSuccess;
}

cudaError_t cudaDeviceGetAttribute(int* value, cudaDeviceAttr attr, int device) {
    cudaDeviceProp p;
    cudaError_t e = cudaGetDeviceProperties(&p, device);
    if (e != cudaSuccess) return e;
    switch (attr) {
        case cudaDevAttrComputeCapabilityMajor: *value = p.major; break;
        case cudaDevAttrComputeCapabilityMinor: *value = p.minor; break;
        case cudaDevAttrMultiProcessorCount: *value = p.multiProcessorCount; break;
        case cudaDevAttrMaxSharedMemoryPerBlockOptin: *value = (int)p.sharedMemPerBlockOptin; break;
        case cudaDevAttrMaxThreadsPerBlock: *value = p.maxThreadsPerBlock; break;
        case cudaDevAttrWarpSize: *value = p.warpSize; break;
        default: return set_error(cudaErrorInvalidValue);
    }
    return cudaSuccess;
}

cudaError_t cudaDriverGetVersion(int* v) {
    *v = CUDART_VERSION;
    return cudaSuccess;
}
cudaError_t cudaRuntimeGetVersion(int* v) {
    *v = CUDART_VERSION;
    return cudaSuccess;
}

cudaError_t cudaDeviceSynchronize() { return sticky_error; }

// Clears the sticky error (a real reset also frees every allocation; here they stay valid, so
// a test can go on with its buffers).
cudaError_t cudaDeviceReset() {
    sticky_error = last_error = cudaSuccess;
    clear_fault();
    return cudaSuccess;
}

cudaError_t cudaFuncSetAttribute(const void* func, cudaFuncAttribute attr, int value) {
    if (attr == cudaFuncAttributeMaxDynamicSharedMemorySize) {
        if (value < 0 || value > MAX_OPTIN_SMEM) return set_error(cudaErrorInvalidValue);
        max_dynamic_smem[func] = value;
    }
    return cudaSuccess;
}

// ---------------------------------------------------------------------------------------------
// Memory.

cudaError_t cudaMalloc(void** ptr, size_t bytes) {
    *ptr = nullptr;
    if (sticky_error != cudaSuccess) return sticky_error;
    if (bytes == 0) return cudaSuccess;
    if (bytes > capacity() - allocated) return set_error(cudaErrorMemoryAllocation);
    void* p = nullptr;
    if (posix_memalign(&p, 256, bytes) != 0) return set_error(cudaErrorMemoryAllocation);
    memset(p, 0xFF, bytes);
    allocations[(uintptr_t)p] = bytes;
    allocated += bytes;
    *ptr = p;
    return cudaSuccess;
}

cudaError_t cudaFree(void* ptr) {
    if (ptr == nullptr) return cudaSuccess;
    auto it = allocations.find((uintptr_t)ptr);
    if (it == allocations.end()) return set_error(cudaErrorInvalidValue);
    allocated -= it->second;
    allocations.erase(it);
    free(ptr);
    return cudaSuccess;
}

cudaError_t cudaMallocHost(void** ptr, size_t bytes) {
    *ptr = malloc(bytes ? bytes : 1);
    return *ptr ? cudaSuccess : set_error(cudaErrorMemoryAllocation);
}
cudaError_t cudaFreeHost(void* ptr) {
    free(ptr);
    return cudaSuccess;
}

cudaError_t cudaMemGetInfo(size_t* free_bytes, size_t* total) {
    *free_bytes = capacity() - allocated;
    *total = capacity();
    return cudaSuccess;
}

cudaError_t cudaMemcpyAsync(void* dst, const void* src, size_t bytes, cudaMemcpyKind kind, cudaStream_t stream) {
    cudaError_t e = check_copy(dst, src, bytes, kind);
    if (e != cudaSuccess) return e;
    return enqueue(stream, [=] { memmove(dst, src, bytes); });
}
cudaError_t cudaMemcpy(void* dst, const void* src, size_t bytes, cudaMemcpyKind kind) {
    if (capturing_streams > 0) return set_error(cudaErrorStreamCaptureImplicit);
    return cudaMemcpyAsync(dst, src, bytes, kind, nullptr);
}

cudaError_t cudaMemsetAsync(void* dst, int value, size_t bytes, cudaStream_t stream) {
    if (!on_device(dst, bytes)) {
        fprintf(stderr, "CUDA emulation: cudaMemset of %zu bytes outside any cudaMalloc'ed buffer\n", bytes);
        return set_error(cudaErrorInvalidValue);
    }
    return enqueue(stream, [=] { memset(dst, value, bytes); });
}
cudaError_t cudaMemset(void* dst, int value, size_t bytes) {
    if (capturing_streams > 0) return set_error(cudaErrorStreamCaptureImplicit);
    return cudaMemsetAsync(dst, value, bytes, nullptr);
}

// ---------------------------------------------------------------------------------------------
// Streams, events, graphs.

cudaError_t cudaStreamCreate(cudaStream_t* s) {
    *s = new CUstream_st();
    streams.insert(*s);
    return cudaSuccess;
}
cudaError_t cudaStreamCreateWithFlags(cudaStream_t* s, unsigned int) { return cudaStreamCreate(s); }
cudaError_t cudaStreamDestroy(cudaStream_t s) {
    if (!streams.erase(s)) return set_error(cudaErrorInvalidResourceHandle);
    if (s->capturing) capturing_streams--;
    delete s->graph;
    delete s;
    return cudaSuccess;
}
cudaError_t cudaStreamSynchronize(cudaStream_t s) {
    bool bad;
    CUstream_st* st = stream_of(s, &bad);
    if (bad) return set_error(cudaErrorInvalidResourceHandle);
    if (st && st->capturing) return set_error(cudaErrorStreamCaptureUnsupported);
    return sticky_error;
}
cudaError_t cudaStreamWaitEvent(cudaStream_t s, cudaEvent_t, unsigned int) {
    bool bad;
    stream_of(s, &bad);
    return bad ? set_error(cudaErrorInvalidResourceHandle) : cudaSuccess;
}

cudaError_t cudaStreamBeginCapture(cudaStream_t s, cudaStreamCaptureMode) {
    bool bad;
    CUstream_st* st = stream_of(s, &bad);
    if (bad) return set_error(cudaErrorInvalidResourceHandle);
    if (!st) return set_error(cudaErrorStreamCaptureUnsupported);  // the legacy stream cannot capture
    if (st->capturing) return set_error(cudaErrorIllegalState);
    st->capturing = true;
    st->graph = new CUgraph_st();
    capturing_streams++;
    return cudaSuccess;
}
cudaError_t cudaStreamEndCapture(cudaStream_t s, cudaGraph_t* graph) {
    bool bad;
    CUstream_st* st = stream_of(s, &bad);
    if (bad || !st || !st->capturing) return set_error(bad ? cudaErrorInvalidResourceHandle : cudaErrorIllegalState);
    st->capturing = false;
    capturing_streams--;
    *graph = st->graph;
    st->graph = nullptr;
    return cudaSuccess;
}
cudaError_t cudaStreamIsCapturing(cudaStream_t s, cudaStreamCaptureStatus* status) {
    bool bad;
    CUstream_st* st = stream_of(s, &bad);
    if (bad) return set_error(cudaErrorInvalidResourceHandle);
    *status = st && st->capturing ? cudaStreamCaptureStatusActive : cudaStreamCaptureStatusNone;
    return cudaSuccess;
}

cudaError_t cudaGraphInstantiate(cudaGraphExec_t* exec, cudaGraph_t graph, unsigned long long) {
    if (!graph) return set_error(cudaErrorInvalidValue);
    *exec = new CUgraphExec_st();
    (*exec)->ops = graph->ops;
    return cudaSuccess;
}
cudaError_t cudaGraphLaunch(cudaGraphExec_t exec, cudaStream_t stream) {
    if (!exec) return set_error(cudaErrorInvalidValue);
    for (const auto& op : exec->ops) {
        cudaError_t e = enqueue(stream, op);
        if (e != cudaSuccess) return e;
    }
    return cudaSuccess;
}
cudaError_t cudaGraphExecDestroy(cudaGraphExec_t exec) {
    delete exec;
    return cudaSuccess;
}
cudaError_t cudaGraphDestroy(cudaGraph_t graph) {
    delete graph;
    return cudaSuccess;
}

cudaError_t cudaEventCreate(cudaEvent_t* e) {
    *e = new CUevent_st();
    return cudaSuccess;
}
cudaError_t cudaEventCreateWithFlags(cudaEvent_t* e, unsigned int) { return cudaEventCreate(e); }
cudaError_t cudaEventDestroy(cudaEvent_t e) {
    delete e;
    return cudaSuccess;
}
cudaError_t cudaEventRecord(cudaEvent_t e, cudaStream_t stream) {
    return enqueue(stream, [e] {
        e->ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - clock_start).count();
        e->recorded = true;
    });
}
cudaError_t cudaEventSynchronize(cudaEvent_t) { return sticky_error; }
cudaError_t cudaEventQuery(cudaEvent_t) { return sticky_error; }
cudaError_t cudaEventElapsedTime(float* ms, cudaEvent_t start, cudaEvent_t end) {
    if (!start->recorded || !end->recorded) return set_error(cudaErrorInvalidResourceHandle);
    *ms = (float)(end->ms - start->ms);
    return cudaSuccess;
}
