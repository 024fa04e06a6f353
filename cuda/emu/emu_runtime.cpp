// emu_runtime.cpp: the CUDA runtime API of the emulation (cuda/emu/emu.h), implemented against the
// real declarations of cuda_runtime_api.h (so the program links without libcudart):
//   - FP8RL_EMU_DEVICES=N devices (default 1, a node of its own per process), filtered by
//     CUDA_VISIBLE_DEVICES as the real runtime filters them, each reported as an H200 (sm_90,
//     132 SMs, 143,771 MiB; FP8RL_EMU_DEVICE_MEMORY=bytes lowers the capacity, so out-of-memory
//     paths can be tested); the devices share one memory arena;
//   - device memory in an arena host code cannot touch (cuda/emu/emu_memory.cpp), filled with 0xFF
//     bytes (NaN as FP32, BF16 and E4M3) so a read of memory nobody wrote shows; copies check that
//     their device side lies inside one allocation and their host side outside device memory;
//     kernel pointer arguments must be null, device memory or cudaMallocHost'ed memory, else the
//     kernel faults with cudaErrorIllegalAddress at the next synchronization;
//   - during a global or thread-local capture, the calls CUDA calls unsafe (cudaMalloc, cudaFree,
//     synchronous copies and sets, synchronizations) fail with cudaErrorStreamCaptureUnsupported
//     and invalidate the capture (cudaStreamEndCapture: cudaErrorStreamCaptureInvalidated);
//   - streams run as a GPU runs them: under FP8RL_EMU_SEED != 0 each operation is queued on its
//     stream and runs when a synchronization needs it (or earlier, by the seed), in an order the
//     seed picks among those that stream order, events, the legacy stream's synchronization with
//     blocking streams and host synchronization allow; an async copy happens when its stream
//     reaches it. Seed 0 runs each at issue. Collectives run at issue with what they wait for.
//     Event times come from the host clock; graph capture records launches, copies and sets, and a
//     graph launch queues them on its stream;
//   - launch configurations checked against sm_90's limits and the kernel's own: its
//     __launch_bounds__ (read at its address, cuda/emu/emu.h) and its static + dynamic shared memory;
//     launch errors returned once by cudaGetLastError, kernel faults sticky until cudaDeviceReset;
//   - launches, copies, sets, host synchronizations and graph launches counted, as issued, for the
//     profile (cuda/emu/emu_stats.cpp).
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <deque>
#include <map>
#include <memory>
#include <random>
#include <set>
#include <thread>
#include <unordered_set>
#include <vector>

#include "cuda/emu/emu.h"
#include "cuda/emu/emu_internal.h"

#undef warpSize  // the field of cudaDeviceProp, not the built-in variable

// One operation in stream order: it runs after the operations before it on its stream and after
// `after`, operations of other streams (an event waited for, the legacy stream's rules).
struct StreamOp {
    uint64_t serial;
    std::vector<uint64_t> after;
    std::function<void()> fn;
};
struct CUstream_st {
    bool capturing = false, invalidated = false;
    cudaStreamCaptureMode mode = cudaStreamCaptureModeGlobal;
    std::thread::id capturer;
    cudaGraph_t graph = nullptr;
    bool blocking = true;    // synchronizes with the legacy stream (created without cudaStreamNonBlocking)
    bool retired = false;    // destroyed with work queued: deleted when that work has run
    std::deque<StreamOp> ops;  // issued, not yet run
    uint64_t last = 0;       // the serial of the latest operation issued
};
struct CUevent_st {
    std::shared_ptr<double> ms = std::make_shared<double>(-1);  // the host clock when it completed; -1: never
    uint64_t serial = 0;  // the operation it waits for: its record, or 0
};
// A recorded operation, with what the profile counts of it at each launch.
struct GraphOp {
    std::function<void()> fn;
    emu::Counted what;
};
struct CUgraph_st {
    std::vector<GraphOp> ops;
};
struct CUgraphExec_st {
    std::vector<GraphOp> ops;
};

namespace emu {
namespace {

constexpr size_t H200_BYTES = 143771ull << 20;
constexpr int MAX_THREADS = 1024, MAX_DIM_XY = 1024, MAX_DIM_Z = 64;
constexpr unsigned MAX_GRID_X = 0x7FFFFFFFu, MAX_GRID_YZ = 65535;
constexpr int DEFAULT_SMEM = 48 << 10, MAX_OPTIN_SMEM = 227 << 10;

cudaError_t last_error = cudaSuccess, sticky_error = cudaSuccess;
cudaError_t pending_error = cudaSuccess;  // a kernel's fault, sticky from the next synchronization on
std::map<const void*, KernelInfo> kernels;
std::set<cudaStream_t> streams;
int capturing_streams = 0;
const auto clock_start = std::chrono::steady_clock::now();
uint64_t attribute_calls = 0;
int current_device = 0;

// The devices this process sees: the physical ordinals of FP8RL_EMU_DEVICES (default 1) that
// CUDA_VISIBLE_DEVICES lists, in its order, up to its first entry that names no device (as the
// runtime filters them). Read at each call, so tests can change them.
std::vector<int> visible_devices() {
    const char* n = getenv("FP8RL_EMU_DEVICES");
    const int physical = n && *n ? atoi(n) : 1;
    std::vector<int> out;
    const char* v = getenv("CUDA_VISIBLE_DEVICES");
    if (!v) {
        for (int d = 0; d < physical; d++) out.push_back(d);
        return out;
    }
    for (const char* p = v; *p;) {
        char* end = nullptr;
        long d = strtol(p, &end, 10);
        if (end == p || d < 0 || d >= physical) break;
        bool seen = false;
        for (int e : out) seen = seen || e == (int)d;
        if (seen) break;
        out.push_back((int)d);
        p = end;
        while (*p == ' ') p++;
        if (*p != ',') break;
        p++;
    }
    return out;
}

cudaError_t check_device(int device) {
    return device >= 0 && device < (int)visible_devices().size() ? cudaSuccess : cudaErrorInvalidDevice;
}

cudaError_t set_error(cudaError_t e) {
    if (e != cudaSuccess) last_error = e;
    return e;
}

// The kernel's __launch_bounds__ maximum, else the device's limit. cuda/emu/emu.h puts a bounded
// kernel's n NOPs from a 2048-byte boundary up to its entry; any other function is preceded by
// code within 16 bytes (its neighbour's end), never by NOPs alone.
int launch_bound(const void* kernel) {
    const unsigned char* entry = (const unsigned char*)kernel;
    const uintptr_t n = (uintptr_t)kernel % 2048;
    if (n == 0 || n > (uintptr_t)MAX_THREADS || !std::all_of(entry - n, entry, [](unsigned char c) { return c == 0x90; }))
        return MAX_THREADS;
    return (int)n;
}

// The stream a call names, or null for the default stream; *bad when the handle is unknown.
CUstream_st* stream_of(cudaStream_t s, bool* bad) {
    *bad = false;
    if (s == nullptr || s == cudaStreamLegacy || s == cudaStreamPerThread) return nullptr;
    if (!streams.count(s)) *bad = true;
    return s;
}

// A call that CUDA calls potentially unsafe during capture: refused while this thread is in a
// global or thread-local capture, or another thread is in a global one; the capture that forbids
// it is invalidated (spec: cudaThreadExchangeStreamCaptureMode).
cudaError_t unsafe_during_capture(const char* call) {
    bool refused = false;
    for (cudaStream_t s : streams) {
        if (!s->capturing || s->mode == cudaStreamCaptureModeRelaxed) continue;
        if (s->mode == cudaStreamCaptureModeThreadLocal && s->capturer != std::this_thread::get_id()) continue;
        s->invalidated = refused = true;
    }
    if (!refused) return cudaSuccess;
    fprintf(stderr, "CUDA emulation: %s during a stream capture (the rule: unsafe calls during a global or "
            "thread-local capture): refused, and the capture is invalidated\n", call);
    return set_error(cudaErrorStreamCaptureUnsupported);
}

// A synchronization point: a kernel fault that happened since becomes the sticky error here.
cudaError_t synchronize() {
    close_arena_at_sync();  // host code runs on from here: it must not touch device memory
    if (pending_error != cudaSuccess) {
        sticky_error = pending_error;
        pending_error = cudaSuccess;
    }
    return sticky_error;
}

cudaError_t check_copy(void* dst, const void* src, size_t bytes, cudaMemcpyKind kind) {
    bool dst_dev = kind == cudaMemcpyHostToDevice || kind == cudaMemcpyDeviceToDevice;
    bool src_dev = kind == cudaMemcpyDeviceToHost || kind == cudaMemcpyDeviceToDevice;
    if ((dst_dev && !on_device(dst, bytes)) || (src_dev && !on_device(src, bytes))) {
        fprintf(stderr, "CUDA emulation: cudaMemcpy of %zu bytes (kind %d): the device side is not inside one cudaMalloc'ed buffer\n",
                bytes, (int)kind);
        return set_error(cudaErrorInvalidValue);
    }
    const bool host_dst = kind == cudaMemcpyDeviceToHost || kind == cudaMemcpyHostToHost;
    const bool host_src = kind == cudaMemcpyHostToDevice || kind == cudaMemcpyHostToHost;
    if ((host_dst && bytes && in_device_arena(dst)) || (host_src && bytes && in_device_arena(src))) {
        fprintf(stderr, "CUDA emulation: cudaMemcpy of %zu bytes (kind %d): the host side %p lies in device memory (the "
                "rule: device memory is not host memory; a device-to-device copy is cudaMemcpyDeviceToDevice)\n",
                bytes, (int)kind, host_dst ? dst : src);
        return set_error(cudaErrorInvalidValue);
    }
    return cudaSuccess;
}

// The device's queues. An operation issued on a stream is queued (FP8RL_EMU_SEED != 0) and runs
// when a synchronization needs it, or earlier when the seeded schedule lets the device get ahead of
// the host; of the operations that stream order, events and the legacy stream allow, the seed
// picks which runs next. Seed 0 runs each at issue, in order.
CUstream_st legacy_stream;                   // stream 0: synchronizes with every blocking stream
std::vector<CUstream_st*> busy;              // the streams with queued work
std::unordered_set<uint64_t> pending;        // the serials of queued operations
uint64_t serials = 0;
std::mt19937_64 order_rng;
bool order_rng_seeded = false;

uint64_t draw() {  // the schedule's next random number
    if (!order_rng_seeded) order_rng.seed(seed() * 0x9E3779B97F4A7C15ull + 1);
    order_rng_seeded = true;
    return order_rng();
}

CUstream_st* queue_of(CUstream_st* st) { return st ? st : &legacy_stream; }

void run_op(const std::function<void()>& fn) {
    if (sticky_error != cudaSuccess || pending_error != cudaSuccess) return;  // the context faulted: nothing more runs
    ArenaOpen open(/*until_sync=*/true);  // what runs in stream order may touch device memory
    try {
        fn();
    } catch (...) {
        keep_arena_open();
        throw;
    }
}

bool ready(const StreamOp& op) {
    for (uint64_t s : op.after)
        if (pending.count(s)) return false;
    return true;
}

// Runs one queued operation that may run now: the oldest at seed 0, else one the seed picks. One
// always may: the oldest queued operation waits only for older ones, which have run.
void run_one() {
    static std::vector<CUstream_st*> may_run;
    may_run.clear();
    for (CUstream_st* q : busy)
        if (ready(q->ops.front())) may_run.push_back(q);
    CUstream_st* pick = may_run[0];
    if (seed())
        pick = may_run[draw() % may_run.size()];
    else
        for (CUstream_st* q : may_run)
            if (q->ops.front().serial < pick->ops.front().serial) pick = q;
    StreamOp op = std::move(pick->ops.front());
    pick->ops.pop_front();
    pending.erase(op.serial);
    if (pick->ops.empty()) {
        busy.erase(std::find(busy.begin(), busy.end(), pick));
        if (pick->retired) delete pick;
    }
    run_op(op.fn);
}

void run_until(uint64_t serial) {
    while (pending.count(serial)) run_one();
}
void run_all() {
    while (!pending.empty()) run_one();
}

// Issues `op` on stream s: recorded when s captures a graph, else counted as `what` by the profile
// and queued in stream order (or run at once, see above), after operation `wait_for` too.
// `at_issue` runs it, and what it waits for, before returning.
cudaError_t enqueue(cudaStream_t s, std::function<void()> op, bool at_issue = false, uint64_t wait_for = 0,
                    const Counted& what = {}) {
    bool bad;
    CUstream_st* st = stream_of(s, &bad);
    if (bad) return set_error(cudaErrorInvalidResourceHandle);
    if (sticky_error != cudaSuccess) return sticky_error;
    if (st && st->capturing) {
        if (st->invalidated) return set_error(cudaErrorStreamCaptureInvalidated);
        st->graph->ops.push_back({std::move(op), what});
        return cudaSuccess;
    }
    if (!st && capturing_streams > 0) return set_error(cudaErrorStreamCaptureImplicit);
    if (pending_error != cudaSuccess) return cudaSuccess;  // the context faulted: nothing more runs
    count(what);
    CUstream_st* q = queue_of(st);
    const uint64_t serial = q->last = ++serials;
    if (!seed() && pending.empty()) {
        run_op(op);
        return cudaSuccess;
    }
    // The legacy stream waits for every blocking stream's work so far, and a blocking stream's
    // work waits for the legacy stream's (CUDA's "stream synchronization behavior").
    std::vector<uint64_t> after;
    for (CUstream_st* b : busy)
        if (q == &legacy_stream ? b != q && b->blocking : q->blocking && b == &legacy_stream) after.push_back(b->last);
    if (pending.count(wait_for)) after.push_back(wait_for);
    if (q->ops.empty()) busy.push_back(q);
    q->ops.push_back({serial, std::move(after), std::move(op)});
    pending.insert(serial);
    if (at_issue || !seed())
        run_until(serial);
    else if (draw() % 4 == 0)
        run_one();  // the device got ahead of the host
    return cudaSuccess;
}

}  // namespace

void set_sticky_error(cudaError_t e) { sticky_error = e; }
void set_launch_error(cudaError_t e) { set_error(e); }
cudaError_t stream_op(cudaStream_t stream, std::function<void()> op, bool at_issue) {
    return enqueue(stream, std::move(op), at_issue);
}
cudaError_t stream_op(cudaStream_t stream, std::function<void()> op, const Counted& what) {
    return enqueue(stream, std::move(op), false, 0, what);
}
void reset_stream_order() { order_rng_seeded = false; }
bool capturing() { return capturing_streams > 0; }
uint64_t func_attribute_calls() { return attribute_calls; }

size_t capacity() {
    static size_t bytes = [] {
        const char* s = getenv("FP8RL_EMU_DEVICE_MEMORY");
        return s && *s ? (size_t)strtoull(s, nullptr, 0) : H200_BYTES;
    }();
    return bytes;
}

KernelInfo& kernel_info(const void* kernel) {
    auto it = kernels.find(kernel);
    if (it == kernels.end()) {
        it = kernels.emplace(kernel, KernelInfo()).first;
        it->second.max_threads = launch_bound(kernel);
    }
    return it->second;
}

// sm_90: static shared memory at most 48 KB (nvcc's limit); static + dynamic at most 48 KB, or with
// the MaxDynamicSharedMemorySize opt-in, dynamic at most the opt-in and static + opt-in at most 227 KB.
std::string shared_memory_error(const KernelInfo& k, size_t dynamic) {
    const char* rule = "(the rule: static + dynamic shared memory at most 48 KB per block, or up to 227 KB with "
                       "cudaFuncSetAttribute(MaxDynamicSharedMemorySize) at least the dynamic part)";
    if (k.static_smem > (size_t)DEFAULT_SMEM)
        return strformat("%zu bytes of static shared memory, above the 48 KB a kernel may declare (nvcc refuses to "
                         "compile it: ptxas, too much shared data)", k.static_smem);
    if (k.max_dynamic_smem < 0 && k.static_smem + dynamic > (size_t)DEFAULT_SMEM)
        return strformat("%zu bytes of static + %zu of dynamic shared memory, above the 48 KB a block has without the "
                         "opt-in %s", k.static_smem, dynamic, rule);
    if (k.max_dynamic_smem >= 0 && dynamic > (size_t)k.max_dynamic_smem)
        return strformat("%zu bytes of dynamic shared memory, above the kernel's opt-in of %d %s", dynamic,
                         k.max_dynamic_smem, rule);
    if (k.max_dynamic_smem >= 0 && k.static_smem + (size_t)k.max_dynamic_smem > (size_t)MAX_OPTIN_SMEM)
        return strformat("%zu bytes of static shared memory + the kernel's opt-in of %d bytes of dynamic, above 227 KB "
                         "(cudaFuncSetAttribute refuses that opt-in) %s", k.static_smem, k.max_dynamic_smem, rule);
    return "";
}

bool refuse_shared_memory(const char* name, const KernelInfo& k, size_t dynamic) {
    std::string error = shared_memory_error(k, dynamic);
    if (error.empty()) return false;
    fprintf(stderr, "CUDA emulation: launch of %s refused: %s: cudaErrorInvalidValue\n", name, error.c_str());
    set_error(cudaErrorInvalidValue);
    return true;
}

void launch(const char* name, const void* kernel, dim3 grid, dim3 block, size_t smem, cudaStream_t stream,
            std::vector<const void*> pointers, std::function<void()> body) {
    long threads = (long)block.x * block.y * block.z;
    if (block.x == 0 || block.y == 0 || block.z == 0 || block.x > MAX_DIM_XY || block.y > MAX_DIM_XY || block.z > MAX_DIM_Z ||
        threads > MAX_THREADS || grid.x == 0 || grid.y == 0 || grid.z == 0 || grid.x > MAX_GRID_X || grid.y > MAX_GRID_YZ ||
        grid.z > MAX_GRID_YZ) {
        fprintf(stderr, "CUDA emulation: launch of %s with grid (%u,%u,%u) block (%u,%u,%u) exceeds sm_90's limits\n", name,
                grid.x, grid.y, grid.z, block.x, block.y, block.z);
        set_error(cudaErrorInvalidConfiguration);
        return;
    }
    KernelInfo* info = &kernel_info(kernel);
    if (threads > info->max_threads) {
        fprintf(stderr, "CUDA emulation: launch of %s with %ld threads per block, above its __launch_bounds__ maximum of %d "
                "(the rule: a launch above the kernel's bound fails): cudaErrorLaunchOutOfResources\n", name, threads,
                info->max_threads);
        set_error(cudaErrorLaunchOutOfResources);
        return;
    }
    if (refuse_shared_memory(name, *info, smem)) return;
    std::string kernel_name = name;
    for (size_t i = 0; i < pointers.size(); i++) {
        if (kernel_may_use(pointers[i])) continue;
        // A GPU launches it, and the kernel's first access faults; the error shows at the next synchronization.
        const void* p = pointers[i];
        enqueue(stream, [=] {
            fprintf(stderr, "CUDA emulation: kernel %s: argument %zu (%p) is neither device memory nor cudaMallocHost'ed "
                    "memory (the rule: kernels reach only device and pinned memory; a std::vector's data or a stack "
                    "address is an illegal address on a GPU): cudaErrorIllegalAddress at the next synchronization\n",
                    kernel_name.c_str(), i, p);
            pending_error = cudaErrorIllegalAddress;
        });
        return;
    }
    enqueue(stream, [=] {
        // Queued, it may run after another launch's block made the static part known: refused then.
        if (!refuse_shared_memory(kernel_name.c_str(), *info, smem)) run_grid(kernel_name.c_str(), info, grid, block, smem, body);
    }, false, 0, {Counted::Kernel, name, 0, (uint64_t)grid.x * grid.y * grid.z});
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
        case cudaErrorLaunchOutOfResources: return "cudaErrorLaunchOutOfResources";
        case cudaErrorInvalidDeviceFunction: return "cudaErrorInvalidDeviceFunction";
        case cudaErrorStreamCaptureUnsupported: return "cudaErrorStreamCaptureUnsupported";
        case cudaErrorStreamCaptureImplicit: return "cudaErrorStreamCaptureImplicit";
        case cudaErrorIllegalState: return "cudaErrorIllegalState";
        case cudaErrorIllegalAddress: return "cudaErrorIllegalAddress";
        case cudaErrorMisalignedAddress: return "cudaErrorMisalignedAddress";
        case cudaErrorStreamCaptureInvalidated: return "cudaErrorStreamCaptureInvalidated";
        case cudaErrorNoDevice: return "cudaErrorNoDevice";
        case cudaErrorNotReady: return "cudaErrorNotReady";
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
        case cudaErrorLaunchOutOfResources: return "too many resources requested for launch";
        case cudaErrorInvalidDeviceFunction: return "invalid device function";
        case cudaErrorStreamCaptureUnsupported: return "operation not permitted when stream is capturing";
        case cudaErrorStreamCaptureImplicit: return "operation would make the legacy stream depend on a capturing blocking stream";
        case cudaErrorIllegalState: return "the operation is not permitted in the current state";
        case cudaErrorIllegalAddress: return "an illegal memory access was encountered";
        case cudaErrorMisalignedAddress:
            message = "misaligned address (emulation: " + last_fault() + ")";
            return message.c_str();
        case cudaErrorStreamCaptureInvalidated: return "operation failed due to a previous error during capture";
        case cudaErrorNoDevice: return "no CUDA-capable device is detected";
        case cudaErrorNotReady: return "device not ready";
        default: return "unknown error";
    }
}

cudaError_t cudaGetDeviceCount(int* count) {
    *count = (int)visible_devices().size();
    return *count ? cudaSuccess : set_error(cudaErrorNoDevice);
}
cudaError_t cudaGetDevice(int* device) {
    *device = current_device;
    return cudaSuccess;
}
cudaError_t cudaSetDevice(int device) {
    if (check_device(device) != cudaSuccess) return set_error(cudaErrorInvalidDevice);
    current_device = device;
    return cudaSuccess;
}

// Unique per physical device; without FP8RL_EMU_DEVICES every process is a node of its own, so
// its one device's id is unique to the process (ranks under mpirun never share it).
cudaError_t cudaDeviceGetPCIBusId(char* id, int len, int device) {
    if (check_device(device) != cudaSuccess) return set_error(cudaErrorInvalidDevice);
    const char* n = getenv("FP8RL_EMU_DEVICES");
    if (n && *n)
        snprintf(id, (size_t)len, "0000:%02x:00.0", 0x18 + visible_devices()[(size_t)device]);
    else
        snprintf(id, (size_t)len, "emu-pid%d:00.0", (int)getpid());
    return cudaSuccess;
}

cudaError_t cudaGetDeviceProperties(cudaDeviceProp* p, int device) {
    if (check_device(device) != cudaSuccess) return set_error(cudaErrorInvalidDevice);
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

cudaError_t cudaDeviceSynchronize() {
    cudaError_t e = unsafe_during_capture("cudaDeviceSynchronize");
    if (e != cudaSuccess) return e;
    count_host_sync();
    run_all();
    return synchronize();
}

// Clears the sticky error (a real reset also frees every allocation; here they stay valid, so
// a test can go on with its buffers).
cudaError_t cudaDeviceReset() {
    for (CUstream_st* q : busy) {  // queued work is dropped with the context
        q->ops.clear();
        if (q->retired) delete q;
    }
    busy.clear();
    pending.clear();
    sticky_error = last_error = pending_error = cudaSuccess;
    clear_fault();
    return cudaSuccess;
}

// The opt-in is refused when it and the kernel's static shared memory (as far as its blocks have
// reached it) exceed 227 KB, as cudaFuncSetAttribute documents.
cudaError_t cudaFuncSetAttribute(const void* func, cudaFuncAttribute attr, int value) {
    attribute_calls++;
    if (!func) return set_error(cudaErrorInvalidDeviceFunction);
    if (attr == cudaFuncAttributeMaxDynamicSharedMemorySize) {
        KernelInfo& k = kernel_info(func);
        if (value < 0 || (size_t)value + k.static_smem > (size_t)MAX_OPTIN_SMEM) return set_error(cudaErrorInvalidValue);
        k.max_dynamic_smem = value;
    }
    return cudaSuccess;
}

// What a GPU reports of a kernel, but sharedSizeBytes: the static shared memory its blocks have
// reached so far, not all it declares.
cudaError_t cudaFuncGetAttributes(cudaFuncAttributes* attr, const void* func) {
    if (!func) return set_error(cudaErrorInvalidDeviceFunction);
    const KernelInfo& k = kernel_info(func);
    *attr = cudaFuncAttributes();
    attr->sharedSizeBytes = k.static_smem;
    attr->maxThreadsPerBlock = k.max_threads;
    attr->maxDynamicSharedSizeBytes = k.max_dynamic_smem >= 0 ? k.max_dynamic_smem : DEFAULT_SMEM - (int)k.static_smem;
    attr->ptxVersion = attr->binaryVersion = 90;
    return cudaSuccess;
}

// ---------------------------------------------------------------------------------------------
// Memory.

cudaError_t cudaMalloc(void** ptr, size_t bytes) {
    *ptr = nullptr;
    if (sticky_error != cudaSuccess) return sticky_error;
    cudaError_t e = unsafe_during_capture("cudaMalloc");
    if (e != cudaSuccess) return e;
    if (bytes == 0) return cudaSuccess;
    *ptr = device_alloc(bytes);
    return *ptr ? cudaSuccess : set_error(cudaErrorMemoryAllocation);
}

cudaError_t cudaFree(void* ptr) {
    cudaError_t e = unsafe_during_capture("cudaFree");
    if (e != cudaSuccess) return e;
    if (ptr == nullptr) return cudaSuccess;
    count_host_sync();
    run_all();  // cudaFree synchronizes the device: no queued work may use the buffer after
    return device_free(ptr) ? cudaSuccess : set_error(cudaErrorInvalidValue);
}

cudaError_t cudaMallocHost(void** ptr, size_t bytes) {
    *ptr = malloc(bytes ? bytes : 1);
    if (!*ptr) return set_error(cudaErrorMemoryAllocation);
    pinned_add(*ptr, bytes);
    return cudaSuccess;
}
cudaError_t cudaFreeHost(void* ptr) {
    if (ptr && !pinned_remove(ptr)) return set_error(cudaErrorInvalidValue);
    if (ptr) count_host_sync();
    run_all();  // as cudaFree: queued copies and kernels may still use the memory
    free(ptr);
    return cudaSuccess;
}

cudaError_t cudaMemGetInfo(size_t* free_bytes, size_t* total) {
    const size_t allocated = device_allocated();
    *free_bytes = capacity() - allocated;
    *total = capacity();
    return cudaSuccess;
}

cudaError_t cudaMemcpyAsync(void* dst, const void* src, size_t bytes, cudaMemcpyKind kind, cudaStream_t stream) {
    cudaError_t e = check_copy(dst, src, bytes, kind);
    if (e != cudaSuccess) return e;
    const Counted what{kind == cudaMemcpyHostToDevice ? Counted::HostToDevice
                       : kind == cudaMemcpyDeviceToHost ? Counted::DeviceToHost
                                                        : Counted::Nothing};
    return enqueue(stream, [=] { memmove(dst, src, bytes); }, false, 0, what);
}
cudaError_t cudaMemcpy(void* dst, const void* src, size_t bytes, cudaMemcpyKind kind) {
    cudaError_t e = unsafe_during_capture("cudaMemcpy (synchronous, on the legacy stream)");
    if (e != cudaSuccess) return e;
    if (capturing_streams > 0) return set_error(cudaErrorStreamCaptureImplicit);
    // On the legacy stream; it returns when the copy is done, except from device to device
    // (the runtime's "API synchronization behavior").
    e = cudaMemcpyAsync(dst, src, bytes, kind, nullptr);
    if (e != cudaSuccess || kind == cudaMemcpyDeviceToDevice) return e;
    if (kind != cudaMemcpyHostToHost) count_host_sync();
    run_until(legacy_stream.last);
    return synchronize();
}

cudaError_t cudaMemsetAsync(void* dst, int value, size_t bytes, cudaStream_t stream) {
    if (!on_device(dst, bytes)) {
        fprintf(stderr, "CUDA emulation: cudaMemset of %zu bytes outside any cudaMalloc'ed buffer\n", bytes);
        return set_error(cudaErrorInvalidValue);
    }
    return enqueue(stream, [=] { memset(dst, value, bytes); }, false, 0, {Counted::Memset, nullptr, bytes});
}
cudaError_t cudaMemset(void* dst, int value, size_t bytes) {
    cudaError_t e = unsafe_during_capture("cudaMemset (on the legacy stream)");
    if (e != cudaSuccess) return e;
    if (capturing_streams > 0) return set_error(cudaErrorStreamCaptureImplicit);
    return cudaMemsetAsync(dst, value, bytes, nullptr);
}

// ---------------------------------------------------------------------------------------------
// Streams, events, graphs.

cudaError_t cudaStreamCreateWithFlags(cudaStream_t* s, unsigned int flags) {
    *s = new CUstream_st();
    (*s)->blocking = !(flags & cudaStreamNonBlocking);
    streams.insert(*s);
    return cudaSuccess;
}
cudaError_t cudaStreamCreate(cudaStream_t* s) { return cudaStreamCreateWithFlags(s, cudaStreamDefault); }
// Work still queued runs, as on a GPU; the stream is deleted when it has.
cudaError_t cudaStreamDestroy(cudaStream_t s) {
    if (!streams.erase(s)) return set_error(cudaErrorInvalidResourceHandle);
    if (s->capturing) capturing_streams--;
    delete s->graph;
    s->graph = nullptr;
    if (s->ops.empty())
        delete s;
    else
        s->retired = true;
    return cudaSuccess;
}
cudaError_t cudaStreamSynchronize(cudaStream_t s) {
    bool bad;
    CUstream_st* st = stream_of(s, &bad);
    if (bad) return set_error(cudaErrorInvalidResourceHandle);
    if (st && st->capturing) {
        st->invalidated = true;
        fprintf(stderr, "CUDA emulation: cudaStreamSynchronize of a capturing stream: refused, and the capture is invalidated\n");
        return set_error(cudaErrorStreamCaptureUnsupported);
    }
    cudaError_t e = unsafe_during_capture("cudaStreamSynchronize");
    if (e != cudaSuccess) return e;
    count_host_sync();
    run_until(queue_of(st)->last);
    return synchronize();
}
// The stream's next work waits for what the event's latest record waits for (in a capture the
// stream's own order already holds).
cudaError_t cudaStreamWaitEvent(cudaStream_t s, cudaEvent_t event, unsigned int) {
    bool bad;
    CUstream_st* st = stream_of(s, &bad);
    if (bad) return set_error(cudaErrorInvalidResourceHandle);
    if (st && st->capturing) return cudaSuccess;
    return enqueue(s, [] {}, false, event->serial);
}

cudaError_t cudaStreamBeginCapture(cudaStream_t s, cudaStreamCaptureMode mode) {
    bool bad;
    CUstream_st* st = stream_of(s, &bad);
    if (bad) return set_error(cudaErrorInvalidResourceHandle);
    if (!st) return set_error(cudaErrorStreamCaptureUnsupported);  // the legacy stream cannot capture
    if (st->capturing) return set_error(cudaErrorIllegalState);
    st->capturing = true;
    st->invalidated = false;
    st->mode = mode;
    st->capturer = std::this_thread::get_id();
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
    if (st->invalidated) {
        delete *graph;
        *graph = nullptr;
        return set_error(cudaErrorStreamCaptureInvalidated);
    }
    return cudaSuccess;
}
cudaError_t cudaStreamIsCapturing(cudaStream_t s, cudaStreamCaptureStatus* status) {
    bool bad;
    CUstream_st* st = stream_of(s, &bad);
    if (bad) return set_error(cudaErrorInvalidResourceHandle);
    *status = !st || !st->capturing ? cudaStreamCaptureStatusNone
              : st->invalidated        ? cudaStreamCaptureStatusInvalidated
                                       : cudaStreamCaptureStatusActive;
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
    count_graph_launch();
    for (const GraphOp& op : exec->ops) {
        cudaError_t e = enqueue(stream, op.fn, false, 0, op.what);
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
// The event completes when its record, queued on the stream, runs. The record holds the event's
// time, not the event, which may be destroyed before it runs, as CUDA allows.
cudaError_t cudaEventRecord(cudaEvent_t event, cudaStream_t stream) {
    bool bad;
    CUstream_st* st = stream_of(stream, &bad);
    std::shared_ptr<double> ms = event->ms;
    cudaError_t e = enqueue(stream, [ms] {
        *ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - clock_start).count();
    });
    if (e == cudaSuccess && !(st && st->capturing)) event->serial = queue_of(st)->last;
    return e;
}
cudaError_t cudaEventSynchronize(cudaEvent_t event) {
    cudaError_t e = unsafe_during_capture("cudaEventSynchronize");
    if (e != cudaSuccess) return e;
    count_host_sync();
    run_until(event->serial);
    return synchronize();
}
// Under a seed the device may not have reached the event yet: a caller must poll or synchronize.
cudaError_t cudaEventQuery(cudaEvent_t event) {
    if (pending.count(event->serial) && seed() && draw() % 2) return cudaErrorNotReady;
    run_until(event->serial);
    return synchronize();
}
cudaError_t cudaEventElapsedTime(float* ms, cudaEvent_t start, cudaEvent_t end) {
    if (pending.count(start->serial) || pending.count(end->serial)) return cudaErrorNotReady;
    if (*start->ms < 0 || *end->ms < 0) return set_error(cudaErrorInvalidResourceHandle);
    *ms = (float)(*end->ms - *start->ms);
    return cudaSuccess;
}
