// emu.h: CUDA emulation mode (FP8RL_EMU). g++ compiles the project's .cu/.cuh sources unchanged
// against this header and runs every kernel on the CPU (spec-gpu.md §2):
//   - the threads of a block are fibers (cuda/emu/emu_threads.cpp); a fiber runs until it waits
//     (barrier, warp collective, and while CTAs run at once an atomic or fence) or exits, and
//     FP8RL_EMU_SEED != 0 shuffles the order of runnable fibers at every round and the order of
//     blocks, and keeps 2-4 blocks resident at once, interleaved, so a missing __syncthreads or a
//     missing fence between blocks shows up as wrong results under some seed;
//   - __syncthreads, __syncwarp, the __shfl*_sync family with width, votes and atomics are
//     computed here from what every participating lane deposited; a divergent barrier, a warp
//     collective whose lanes disagree, a lane outside the mask, or nothing left that can run is a
//     kernel fault that names the kernel, the block and what each thread waits for;
//   - the runtime API the engine calls (memory, streams, events, graphs, device query) is
//     implemented in cuda/emu/emu_runtime.cpp against the real declarations of cuda_runtime.h, so the
//     types are CUDA's own. Device memory is an arena that host code cannot touch (PROT_NONE but
//     while kernels, copies, sets and library calls run), filled with a NaN pattern. Under a
//     nonzero seed stream work is queued and runs in a seeded order that events, the legacy
//     stream and host synchronization allow, so a missing event or an early host read shows.
// The real CUDA headers are included first: they use gridDim/blockDim/warpSize as names, and
// host_defines.h defines __shared__ and friends, which are redefined below.
#pragma once
#ifndef FP8RL_EMU
#error "cuda/emu/emu.h is the emulation runtime: build with -DFP8RL_EMU (include cuda/common.cuh instead)"
#endif
#include <cuda_bf16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <map>
#include <string>
#include <type_traits>
#include <vector>

// Static shared memory is declared with cuda/common.cuh's STATIC_SHARED, which tells the runtime
// each variable's size as a block reaches it (so it counts against the launch limits); a plain
// __shared__ declaration is an error here, as it would go uncounted.
#undef __shared__
#define __shared__ static_assert(false, "in emulation, declare static shared memory with STATIC_SHARED(type, name, [dims]) (cuda/common.cuh)");
// __launch_bounds__(max_threads, ...): max_threads one-byte NOPs right before the kernel's entry
// (never executed), the pad starting on a 2048-byte boundary, so the runtime reads the bound as
// the kernel's address mod 2048 where that many NOPs precede it (emu::launch_bound). GCC's
// patchable_function_entry is the only attribute that takes an integer constant expression (the
// bounds are constexpr names; "+ 0" makes g++ 12 fold a bare one, it crashes on that) and leaves
// a trace found from the function's address; no_icf keeps two kernels from being merged. GCC also
// lists each pad in the section __patchable_function_entries, filed wrongly by g++ 12 for template
// kernels, so a program of several translation units drops that list at link time (cuda/emu/emu.ld).
#undef __launch_bounds__
#define __launch_bounds__(...) FP8RL_EMU_LAUNCH_BOUNDS(__VA_ARGS__, 0)
#define FP8RL_EMU_LAUNCH_BOUNDS(max_threads, ...) \
    __attribute__((patchable_function_entry((max_threads) + 0, (max_threads) + 0), aligned(2048), no_icf))
#undef __forceinline__
#define __forceinline__ inline

namespace emu {

// ---------------------------------------------------------------------------------------------
// Threads and blocks (cuda/emu/emu_threads.cpp).

struct ThreadCoords {
    uint3 thread_idx, block_idx;
    dim3 block_dim, grid_dim;
};
extern const ThreadCoords* current_coords;  // of the fiber that runs now

// What a lane brings to a warp collective; the scheduler computes every lane's result when all
// lanes of the mask wait at the same collective.
enum class WarpOp { Sync, ShflIdx, ShflUp, ShflDown, ShflXor, Ballot, Any, All, Ldmatrix, Wgmma };
uint64_t warp_collective(WarpOp op, unsigned mask, uint64_t value, int arg, int width);
int block_barrier(const char* file, int line, const char* func, int predicate, int kind);  // kind: 0 plain, 1 count, 2 and, 3 or
// Every atomic on `bytes` at address, after it ran: a chance to yield, spin-wait detection, and
// the release and acquire bookkeeping of cuda/emu/emu_memory_order.cpp.
void atomic_point(void* address, size_t bytes, bool changed);
// Memory ordering across CTAs (cuda/emu/emu_memory_order.cpp; docs/gpu-emulation.md, "Memory
// ordering"): __threadfence (fence.sc.gpu) at `line` of `func`; a load through L2 (__ldcg,
// ld.global.cg) of `bytes` at p into out, or, when a test's mutation made the site plain, a
// load that may be served from a stale L1 line.
void thread_fence(const char* func, int line);
void load_global(void* out, const void* p, size_t bytes, bool through_l2, const char* func, int line);
// Test-only mutations of a program's synchronization (FP8RL_EMU_MUTATION=FUNCTION:KIND:N[,...],
// or add_mutation): the N-th site (from 0, in the order threads first reach them) of KIND in the
// function named FUNCTION behaves as if deleted: `barrier` a __syncthreads, `fence` a
// __threadfence, `ldcg` an __ldcg that becomes a plain load.
enum class Site { Barrier, Fence, LoadCg };
// Whether this program's kernels were compiled with the plain-access instrumentation (the Makefile's
// EMU_PLAIN_ACCESS_FLAGS), so that a plain or volatile load of another CTA's unreleased store is
// reported (cuda/emu/emu_memory_order.cpp).
bool plain_accesses_checked();
void add_mutation(const std::string& function, Site kind, int ordinal);
void clear_mutations();
bool mutated(Site kind, const char* func, int line);  // and numbers the site when the mutation names its function
[[noreturn]] void kernel_fault(const std::string& what);
// A vector access (ld/st.v2, .v4) of `bytes` at p, which is not a multiple of `bytes`: the kernel
// faults with cudaErrorMisalignedAddress (sticky, reported at the next synchronization), as on a GPU.
[[noreturn]] void misaligned_access(const void* p, size_t bytes, const char* what);
// cp.async of the calling thread (cuda_pipeline_primitives.h's __pipeline_* below): a copy queued,
// its group closed, the groups but the `prior` newest completed.
void async_copy(void* dst, const void* src, size_t bytes, size_t zfill);
void async_commit();
void async_wait_prior(size_t prior);
// ldmatrix.sync.aligned.m8n8.{x1,x2,x4}[.trans].shared.b16 (cuda/kernels/mma.cuh's ldmatrix_x4 and
// friends): a warp collective of all 32 lanes; lane 8i + r gives the address of row r of matrix i
// (16 bytes of shared memory, 16-byte aligned), regs[i] of lane l receives row l / 4, elements
// 2 (l % 4) and 2 (l % 4) + 1 of matrix i (low half first), or with trans the transposed matrix's.
void ldmatrix(uint32_t* regs, int num, bool trans, const void* row_address);
// wgmma (PTX ISA "Asynchronous Warpgroup Level Matrix Multiply-Accumulate", cuda/kernels/wgmma.cuh
// is the kernels' side; cuda/emu/emu_wgmma.cpp documents the semantics kept and refused). A guard
// rides with each register set a wgmma reads or writes (the accumulator D, a register A fragment):
// every access by other code passes wgmma_touch, which refuses it while a wgmma that uses the
// registers is in flight; wgmma_issue refuses registers touched since the thread's last
// wgmma_fence. The product lands in d at the wgmma_wait that covers its group, not before.
struct WgmmaGuard {
    uint64_t touched_at_fence = 0;  // the thread's fence count when other code last accessed the registers
    uint64_t in_flight_until = 0;   // the thread's wgmma sequence number that must complete first
};
void wgmma_touch(WgmmaGuard& g, const char* what);
void wgmma_fence();
// The operand type of a wgmma.mma_async: .bf16 (m64nNk16) or .e4m3 (m64nNk32, K-major only).
enum class WgmmaType { BF16, E4M3 };
// wgmma.mma_async.sync.aligned.m64nNkK.f32.T.T: d (N/2 floats) += A B (A 64xK, B KxN; K = 16 for
// BF16, 32 for E4M3); A from a_regs (4 registers, BF16 pairs; a_guard) when a_regs is non-null,
// else from a_desc.
void wgmma_issue(WgmmaType type, int n, float* d, WgmmaGuard& d_guard, const uint32_t* a_regs, WgmmaGuard* a_guard,
                 uint64_t a_desc, uint64_t b_desc, bool scale_d, bool trans_a, bool trans_b);
void wgmma_commit();
void wgmma_wait(int pending);
// The shared-window address of p (cvta.to.shared): dynamic shared memory starts at 0. Faults when p
// is not in the block's dynamic shared memory (wgmma descriptors address only that here).
uint32_t shared_address(const void* p);
void* dynamic_shared();  // the launch's dynamic shared memory (NaN-filled at each block start)
// Scratch of `bytes` (at most 4 KiB) for the calling thread's warp in its CTA, for the twins of
// warp-wide instructions (cuda/kernels/mma.cuh's mma_m16n8k16): CTAs run at once, so a host
// static would be shared between them.
void* warp_scratch(size_t bytes);
// A block reached the static shared variable `p` of `bytes` (cuda/common.cuh's STATIC_SHARED): the
// first time for its kernel, the bytes count against the kernel's limits from then on, and the
// variable is NaN-filled at each of its blocks' starts, as dynamic shared memory is.
void static_shared(void* p, size_t bytes, const char* name);

// Runs `body` as a kernel of `name` (a string literal: the profile keeps the pointer) on grid x block threads with `smem` bytes of dynamic shared
// memory, on `stream` (recorded instead when the stream is capturing a graph). Checks the launch
// configuration against sm_90's limits and the kernel's own (its __launch_bounds__, its static and
// dynamic shared memory) first; errors are returned by cudaGetLastError.
// `pointers` holds each argument that is a pointer (null for the others): each must be null, device
// memory or cudaMallocHost'ed memory, else the kernel faults with cudaErrorIllegalAddress, reported
// at the next synchronization as on a GPU.
void launch(const char* name, const void* kernel, dim3 grid, dim3 block, size_t smem, cudaStream_t stream,
            std::vector<const void*> pointers, std::function<void()> body);
template <class T>
const void* pointer_arg(const T& arg) {
    if constexpr (std::is_pointer<T>::value) return (const void*)arg;
    return nullptr;
}

// Runs a host operation in stream order (queued, or recorded when the stream captures a graph): how
// library calls such as the emulated cuBLASLt GEMM take part in streams and graphs. `at_issue`
// runs it, and the work it waits for, before returning: collectives, which every rank must start
// in program order (one left queued while its rank waits in a host MPI call would deadlock).
cudaError_t stream_op(cudaStream_t stream, std::function<void()> op, bool at_issue = false);
// The rule the last refused cuBLASLt call broke (cuda/emu/emu_cublaslt.cpp), "" if none.
std::string cublaslt_last_error();
// The emulated algorithm (0-3, emu_cublaslt.cpp) of the last cublasLtMatmul this thread issued; -1 if none.
int cublaslt_last_algorithm();
// True when [p, p + bytes) lies inside one cudaMalloc'ed buffer.
bool is_device_memory(const void* p, size_t bytes);

// How many times cudaFuncSetAttribute was called (tests check that launchers set it once).
uint64_t func_attribute_calls();
// Bytes __pipeline_memcpy_async has read from device memory since start-up, zero-filled bytes not
// counted (tests check what a kernel reads, e.g. a shared prefix read once).
uint64_t async_copy_bytes();

// The profile's statistics (cuda/emu/emu_stats.cpp), the emulation's side of cuda/perf/profile_range.h's
// PROFILE_RANGE. A range counts the work the host issues while it is open, nested ranges' included:
// each event counts once in every open range (a range entered again while open, recursion, counts
// it once, and its calls only the outermost entry). Work counts when issued, not when a seeded
// schedule runs it; a graph launch counts every operation of its graph again, in the ranges open at
// cudaGraphLaunch, as Nsight projects NVTX ranges (a capture runs nothing and counts nothing, not
// even the calls of ranges entered while it records). With FP8RL_EMU_STATS=FILE counting is
// on from start-up and FILE gets the JSON at exit (docs/gpu-emulation.md); otherwise it is off, and
// an event costs one test of a flag.
struct RangeStats {
    uint64_t calls = 0, kernel_launches = 0, gemm_calls = 0, host_syncs = 0, h2d_copies = 0, d2h_copies = 0,
             memset_bytes = 0, graph_launches = 0;
    std::map<std::string, uint64_t> kernels;  // launches per kernel, named as LAUNCH_KERNEL names it without template arguments
    std::map<std::string, uint64_t> ctas;     // CTAs per kernel (its launches' grids), named alike
};
void range_push(const char* name);
void range_pop();
// Tests: start_stats zeroes every counter (ranges open now count on) and turns counting on;
// stop_stats turns it off, the counters stay readable.
void start_stats();
void stop_stats();
RangeStats range_stats(const std::string& name);  // zero for a range never entered
RangeStats total_stats();                         // everything counted, in a range or not (calls: 1)

// The scheduling seed (FP8RL_EMU_SEED at start-up; tests may change it).
uint64_t seed();
void set_seed(uint64_t s);
// The message of the last kernel fault ("" if none), kept until cudaDeviceReset.
std::string last_fault();

template <class T>
uint64_t to_bits(T v) {
    static_assert(sizeof(T) <= 8 && std::is_trivially_copyable<T>::value, "warp collectives take values of 8 bytes at most");
    uint64_t u = 0;
    memcpy(&u, &v, sizeof(T));
    return u;
}
template <class T>
T from_bits(uint64_t u) {
    T v;
    memcpy(&v, &u, sizeof(T));
    return v;
}

}  // namespace emu

// cuda_runtime.h's overloads taking the kernel itself exist only for nvcc.
template <class T>
cudaError_t cudaFuncSetAttribute(T* kernel, cudaFuncAttribute attr, int value) {
    return cudaFuncSetAttribute(reinterpret_cast<const void*>(kernel), attr, value);
}
template <class T>
cudaError_t cudaFuncGetAttributes(cudaFuncAttributes* attr, T* kernel) {
    return cudaFuncGetAttributes(attr, reinterpret_cast<const void*>(kernel));
}

// ---------------------------------------------------------------------------------------------
// Built-in variables and intrinsics.

#define threadIdx (::emu::current_coords->thread_idx)
#define blockIdx (::emu::current_coords->block_idx)
#define blockDim (::emu::current_coords->block_dim)
#define gridDim (::emu::current_coords->grid_dim)
#define warpSize 32

#define __syncthreads() ::emu::block_barrier(__FILE__, __LINE__, __func__, 1, 0)
#define __syncthreads_count(p) ::emu::block_barrier(__FILE__, __LINE__, __func__, (p) != 0, 1)
#define __syncthreads_and(p) ::emu::block_barrier(__FILE__, __LINE__, __func__, (p) != 0, 2)
#define __syncthreads_or(p) ::emu::block_barrier(__FILE__, __LINE__, __func__, (p) != 0, 3)

// cp.async, as cuda_pipeline_primitives.h declares it (sm_80+): 4, 8 or 16 bytes from global to
// shared memory, both aligned to the size, the last zfill bytes zeroed; groups closed by
// __pipeline_commit; __pipeline_wait_prior(n) waits for all but the n newest groups.
inline void __pipeline_memcpy_async(void* dst_shared, const void* src_global, size_t size_and_align, size_t zfill = 0) {
    ::emu::async_copy(dst_shared, src_global, size_and_align, zfill);
}
inline void __pipeline_commit() { ::emu::async_commit(); }
inline void __pipeline_wait_prior(size_t prior) { ::emu::async_wait_prior(prior); }

inline void __syncwarp(unsigned mask = 0xFFFFFFFFu) { ::emu::warp_collective(::emu::WarpOp::Sync, mask, 0, 0, 32); }
template <class T>
T __shfl_sync(unsigned mask, T var, int src_lane, int width = warpSize) {
    return ::emu::from_bits<T>(::emu::warp_collective(::emu::WarpOp::ShflIdx, mask, ::emu::to_bits(var), src_lane, width));
}
template <class T>
T __shfl_up_sync(unsigned mask, T var, unsigned delta, int width = warpSize) {
    return ::emu::from_bits<T>(::emu::warp_collective(::emu::WarpOp::ShflUp, mask, ::emu::to_bits(var), (int)delta, width));
}
template <class T>
T __shfl_down_sync(unsigned mask, T var, unsigned delta, int width = warpSize) {
    return ::emu::from_bits<T>(::emu::warp_collective(::emu::WarpOp::ShflDown, mask, ::emu::to_bits(var), (int)delta, width));
}
template <class T>
T __shfl_xor_sync(unsigned mask, T var, int lane_mask, int width = warpSize) {
    return ::emu::from_bits<T>(::emu::warp_collective(::emu::WarpOp::ShflXor, mask, ::emu::to_bits(var), lane_mask, width));
}
inline unsigned __ballot_sync(unsigned mask, int pred) {
    return (unsigned)::emu::warp_collective(::emu::WarpOp::Ballot, mask, pred != 0, 0, 32);
}
inline int __any_sync(unsigned mask, int pred) { return (int)::emu::warp_collective(::emu::WarpOp::Any, mask, pred != 0, 0, 32); }
inline int __all_sync(unsigned mask, int pred) { return (int)::emu::warp_collective(::emu::WarpOp::All, mask, pred != 0, 0, 32); }

// Atomics: a fiber is never preempted between its waits, so a read-modify-write is atomic here;
// each one is also a point where the scheduler may switch fibers (every one while CTAs run at once).
// Not instrumented for plain accesses (cuda/emu/emu_memory_order.cpp): an atomic is strong.
template <class T, class F>
__attribute__((no_sanitize_thread)) T emu_atomic_rmw(T* address, F op) {
    T old = *address, next = op(old);
    *address = next;
    ::emu::atomic_point(address, sizeof(T), memcmp(&old, &next, sizeof(T)) != 0);
    return old;
}
template <class T>
T atomicAdd(T* a, T v) { return emu_atomic_rmw(a, [&](T o) { return (T)(o + v); }); }
template <class T>
T atomicSub(T* a, T v) { return emu_atomic_rmw(a, [&](T o) { return (T)(o - v); }); }
template <class T>
T atomicMax(T* a, T v) { return emu_atomic_rmw(a, [&](T o) { return o < v ? v : o; }); }
template <class T>
T atomicMin(T* a, T v) { return emu_atomic_rmw(a, [&](T o) { return v < o ? v : o; }); }
template <class T>
T atomicExch(T* a, T v) { return emu_atomic_rmw(a, [&](T) { return v; }); }
template <class T>
T atomicCAS(T* a, T compare, T v) { return emu_atomic_rmw(a, [&](T o) { return o == compare ? v : o; }); }
template <class T>
T atomicAnd(T* a, T v) { return emu_atomic_rmw(a, [&](T o) { return (T)(o & v); }); }
template <class T>
T atomicOr(T* a, T v) { return emu_atomic_rmw(a, [&](T o) { return (T)(o | v); }); }
inline unsigned atomicInc(unsigned* a, unsigned limit) {
    return emu_atomic_rmw(a, [&](unsigned o) { return o >= limit ? 0u : o + 1; });
}

#define __threadfence() ::emu::thread_fence(__func__, __LINE__)
inline void __threadfence_block() {}  // CTA scope: the CTA's threads see one memory here
[[noreturn]] inline void __trap() { ::emu::kernel_fault("__trap() called"); }

// min/max as CUDA's overloads (device code calls them unqualified on ints and floats).
template <class A, class B>
inline typename std::common_type<A, B>::type min(A a, B b) {
    typedef typename std::common_type<A, B>::type T;
    return (T)b < (T)a ? (T)b : (T)a;
}
template <class A, class B>
inline typename std::common_type<A, B>::type max(A a, B b) {
    typedef typename std::common_type<A, B>::type T;
    return (T)a < (T)b ? (T)b : (T)a;
}
inline float min(float a, float b) { return fminf(a, b); }
inline float max(float a, float b) { return fmaxf(a, b); }

// Math intrinsics: the correctly rounded operation where CUDA's is (_rn), the libm function where
// CUDA's is an approximation (results may differ in the last bits; tests compare with tolerances).
inline float __fmul_rn(float a, float b) { return a * b; }
inline float __fadd_rn(float a, float b) { return a + b; }
inline float __fsub_rn(float a, float b) { return a - b; }
inline float __fdiv_rn(float a, float b) { return a / b; }
inline float __fmaf_rn(float a, float b, float c) { return fmaf(a, b, c); }
inline float __frcp_rn(float a) { return 1.0f / a; }
inline float __fsqrt_rn(float a) { return sqrtf(a); }
inline double __dmul_rn(double a, double b) { return a * b; }
inline double __dadd_rn(double a, double b) { return a + b; }
inline float __fdividef(float a, float b) { return a / b; }
inline float __expf(float a) { return expf(a); }
inline float __logf(float a) { return logf(a); }
inline float __powf(float a, float b) { return powf(a, b); }
inline float rsqrtf(float a) { return 1.0f / sqrtf(a); }
inline float __saturatef(float a) { return a != a ? 0.0f : fminf(fmaxf(a, 0.0f), 1.0f); }
inline unsigned __float_as_uint(float f) { return ::emu::from_bits<unsigned>(::emu::to_bits(f)); }
inline float __uint_as_float(unsigned u) { return ::emu::from_bits<float>(::emu::to_bits(u)); }
inline int __float_as_int(float f) { return ::emu::from_bits<int>(::emu::to_bits(f)); }
inline float __int_as_float(int i) { return ::emu::from_bits<float>(::emu::to_bits(i)); }
inline int __popc(unsigned x) { return __builtin_popcount(x); }
inline int __popcll(unsigned long long x) { return __builtin_popcountll(x); }
inline int __clz(int x) { return x == 0 ? 32 : __builtin_clz((unsigned)x); }
inline int __ffs(int x) { return __builtin_ffs(x); }
template <class T>
T __ldg(const T* p) { return *p; }
// ld.global.cg: cached in L2 only, so never a stale L1 line. The caller's function and line name
// the site for mutations (GCC's __builtin_FUNCTION in a default argument is the caller's).
template <class T>
T __ldcg(const T* p, const char* func = __builtin_FUNCTION(), int line = __builtin_LINE()) {
    T v;
    ::emu::load_global(&v, p, sizeof(T), true, func, line);
    return v;
}

// Dynamic shared memory: nvcc's `extern __shared__` has no host equivalent (cuda/common.cuh's
// DYNAMIC_SHARED picks this in emulation).
#define FP8RL_EMU_DYNAMIC_SHARED(type, name) type* name = reinterpret_cast<type*>(::emu::dynamic_shared())
// Static shared memory: one static per (template instantiation of a) function, block-local
// because the scheduler swaps in the running CTA's copy when it switches CTAs; ASan redzones static
// arrays, so an overflow is caught. Each thread that passes the declaration reports it
// (cuda/common.cuh's STATIC_SHARED).
#define FP8RL_EMU_STATIC_SHARED(type, name, ...) \
    static type name __VA_ARGS__;                 \
    ::emu::static_shared(&name, sizeof(name), #name)
