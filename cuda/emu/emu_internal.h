// emu_internal.h: what the two halves of the CUDA emulation share (cuda/emu/emu_threads.cpp runs
// kernels, cuda/emu/emu_runtime.cpp is the runtime API around them). Not for kernels or engine code.
#pragma once
#include <cstdarg>
#include <cstdio>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "cuda/emu/emu.h"

namespace emu {

// Thrown inside a fiber to end its kernel after a fault; caught where the fiber starts.
struct KernelAbort {};

inline std::string strformat(const char* fmt, ...) __attribute__((format(printf, 1, 2)));
inline std::string strformat(const char* fmt, ...) {
    va_list ap, ap2;
    va_start(ap, fmt);
    va_copy(ap2, ap);
    int n = vsnprintf(nullptr, 0, fmt, ap);
    std::string out(n > 0 ? (size_t)n : 0, '\0');
    if (n > 0) vsnprintf(&out[0], (size_t)n + 1, fmt, ap2);
    va_end(ap2);
    va_end(ap);
    return out;
}

// What the profile counts of one stream operation (cuda/emu/emu_stats.cpp). A graph keeps it with
// each operation it records and counts it again at every launch.
struct Counted {
    enum Kind { Nothing, Kernel, Gemm, HostToDevice, DeviceToHost, Memset } kind = Nothing;
    const char* kernel = nullptr;  // Kernel: LAUNCH_KERNEL's name
    size_t bytes = 0;              // Memset
    uint64_t ctas = 0;             // Kernel: its grid's CTAs
};
void count(const Counted& what);  // into the total and every open range, when counting
void count_host_sync();
void count_graph_launch();
bool capturing();  // some stream is capturing a graph
// As stream_op, the operation counted as `what`: a library call (the emulated cuBLASLt GEMM).
cudaError_t stream_op(cudaStream_t stream, std::function<void()> op, const Counted& what);

// What the runtime knows of one kernel (found by its address): its __launch_bounds__ maximum, its
// cudaFuncAttributeMaxDynamicSharedMemorySize, and the static shared variables its blocks have
// reached so far (each counted once; a variable of a __device__ function counts for every kernel
// that reaches it, as nvcc allocates it in each).
struct KernelInfo {
    int max_threads = 1024;     // the bound, else the device's limit
    int max_dynamic_smem = -1;  // the opt-in, -1 while unset
    size_t static_smem = 0;
    std::vector<std::pair<void*, size_t>> static_vars;
    // Under a seed: whether a launch has run, and whether one reached an atomic, a __threadfence or
    // an __ldcg (then its CTAs run at once, interleaved; until then, and for its first launch too).
    bool launched_seeded = false, syncs_across_ctas = false;
};
KernelInfo& kernel_info(const void* kernel);
// The shared-memory rule a launch of `k` with `dynamic` bytes breaks, "" if none.
std::string shared_memory_error(const KernelInfo& k, size_t dynamic);

// Runs every block of a grid now; a fault stops the grid, is printed and becomes the sticky error.
// A block that reaches static shared memory beyond the limits ends the grid as a refused launch
// (cudaErrorInvalidValue from cudaGetLastError, not sticky), as a GPU refuses it before it runs.
void run_grid(const char* name, KernelInfo* kernel, dim3 grid, dim3 block, size_t smem, const std::function<void()>& body);
void set_sticky_error(cudaError_t e);
// The scheduler's side of memory ordering (cuda/emu/emu_memory_order.cpp): a launch of `kernel`
// (its KernelInfo) with `resident` CTAs at once (0: seed 0, nothing is tracked) begins and ends; the CTA of grid-linear index
// `cta` is about to run (its writes since are its own until the next switch); an atomic ran.
// fence_point lets other threads (of any resident CTA) run when CTAs run at once.
void memory_order_begin(const void* kernel, int resident);
void note_sync_across_ctas();  // the running kernel reached an atomic, a fence or an __ldcg
void memory_order_end();
void memory_order_switch(long cta);
void memory_order_atomic(void* address, size_t bytes);
void fence_point();
long current_cta();  // the running CTA's grid-linear index, -1 outside a kernel
// Ends the running kernel with a fault at the running thread's next wait, without unwinding (for
// code that cannot throw: the plain-access callbacks of emu_memory_order.cpp).
void fault_at_next_wait(const std::string& what);
const char* current_kernel_name();
void set_launch_error(cudaError_t e);
void clear_fault();
// Restarts the seeded choice of which stream's work runs next (set_seed: a test's seeds repeat).
void reset_stream_order();

// The device's capacity in bytes (FP8RL_EMU_DEVICE_MEMORY, else an H200's).
size_t capacity();

// wgmma (cuda/emu/emu_wgmma.cpp). One issued wgmma.mma_async as its thread keeps it until the wait
// that completes it computes the thread's share of D.
struct WgmmaIssue {
    WgmmaType type = WgmmaType::BF16;
    int n = 0;
    bool scale_d = false, trans_a = false, trans_b = false, a_in_regs = false;
    uint64_t a_desc = 0, b_desc = 0;
    uint32_t a_regs[4] = {};  // this lane's A fragment, read at issue
    float a[16][16] = {};     // register A: the warp's 16 rows, gathered from its lanes at issue
    float* d = nullptr;
    WgmmaGuard* d_guard = nullptr;
};
// A thread's wgmma state: its fences, its issued and completed wgmmas (sequence numbers from 1),
// those in flight and where each committed group ends among them. (What a lane brings to its
// warp's collective lives on its fiber's stack while it waits there: a scheduler scans its
// threads' states, and a kilobyte more per thread made that scan miss the cache.)
struct WgmmaState {
    uint64_t fences = 0, issued = 0, completed = 0;
    std::vector<WgmmaIssue> in_flight;
    std::vector<size_t> groups;
};
// What one warp of a warpgroup issued, for the check that the warpgroup's warps agree (.aligned).
struct WgmmaSignature {
    WgmmaType type;
    int n;
    bool scale_d, trans_a, trans_b, a_in_regs;
    uint64_t a_desc, b_desc;
};
// Scheduler hooks (cuda/emu/emu_threads.cpp): the running thread's state, warp (in the block) and
// lane; the host pointer of `bytes` at shared-window address `address`, null when outside the
// block's dynamic shared memory; the warpgroup log of the running block.
WgmmaState& current_wgmma();
int current_warp();
int current_lane();
const char* shared_window(uint32_t address, size_t bytes);
// The resolution of a warp's wgmma collective (all 32 lanes wait at it): checks that the lanes and
// the warpgroup's other warps issue the same instruction and gathers the warp's register A rows
// into every lane's deposit. `issued` counts the warp's wgmmas so far, `log` the warpgroup's.
std::string resolve_wgmma(int warp, int block_threads, WgmmaIssue* const lanes[32], uint64_t& issued,
                          std::vector<WgmmaSignature>& log);

// Device memory (cuda/emu/emu_memory.cpp). While an ArenaOpen lives, host code may touch the arena
// (the runtime opens it around kernels, copies, sets and stream operations); else it is PROT_NONE.
// A stream operation's ArenaOpen(until_sync) leaves it open until the host next synchronizes
// (close_arena_at_sync): mprotect costs ~0.4 ms per call over a resident arena, and closing after
// every launch made the GPU tests 4x slower.
struct ArenaOpen {
    explicit ArenaOpen(bool until_sync = false);
    ~ArenaOpen();
    ArenaOpen(const ArenaOpen&) = delete;
    ArenaOpen& operator=(const ArenaOpen&) = delete;
    bool until_sync;
};
void close_arena_at_sync();
// After a stream operation failed midway (a collective that timed out), work it started may still
// write device memory at any time (its MPI request completes when the peer arrives): from then
// on the arena stays open, as no access can be told apart any more.
void keep_arena_open();
void* device_alloc(size_t bytes);  // nullptr when out of memory
bool device_free(void* p);         // false when p is no allocation's base
size_t device_allocated();
bool on_device(const void* p, size_t bytes);  // [p, p + bytes) inside one live allocation
bool in_device_arena(const void* p);          // anywhere in the arena, live or not
char* device_arena(size_t* bytes);            // the arena's base (reserved on first use) and its size
void pinned_add(void* p, size_t bytes);       // cudaMallocHost'ed memory, which kernels may use
bool pinned_remove(void* p);
bool kernel_may_use(const void* p);  // null, device memory (or one past a buffer's end), pinned memory

}  // namespace emu
