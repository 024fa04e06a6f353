// emu_threads.cpp: the thread scheduler of the CUDA emulation (cuda/emu/emu.h): one fiber per CUDA
// thread of a block, one or (under a seed) several blocks resident at once and interleaved,
// barriers and warp collectives resolved when no fiber of the block can run any further. Facts
// behind the choices: spec-gpu.md §2.2; memory ordering between the blocks: emu_memory_order.cpp.
#include <sanitizer/asan_interface.h>
#include <sanitizer/common_interface_defs.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <memory>
#include <numeric>
#include <random>
#include <vector>

#include "cuda/emu/emu.h"
#include "cuda/emu/emu_internal.h"

#if defined(__SANITIZE_ADDRESS__)
#define EMU_ASAN 1
#else
#define EMU_ASAN 0
#endif

#if !defined(__x86_64__)
#error "the CUDA emulation's fiber switch (emu_switch below) is written for x86-64"
#endif

// emu_switch(&from_sp, to_sp): saves the callee-saved general registers on the running stack,
// stores its stack pointer in *from_sp, and continues on to_sp where another emu_switch saved its
// state (or where start_frame laid out a first one). No system call: glibc's swapcontext makes one
// per switch to save the signal mask, which dominated emulated kernels' time. MXCSR and the x87
// control word (callee-saved too) stay as they are: CUDA code has no floating-point environment
// to set (rounding is per instruction), so every fiber runs with the host thread's, and run_grid
// checks once per launch that no kernel changed them. Saving them per switch (ldmxcsr and fldcw
// stall the pipeline) was 13% of an emulated rollout's time.
extern "C" void emu_switch(void** from_sp, void* to_sp);
asm(R"(
    .text
    .globl emu_switch
    .type emu_switch, @function
emu_switch:
    pushq %rbp
    pushq %rbx
    pushq %r12
    pushq %r13
    pushq %r14
    pushq %r15
    movq %rsp, (%rdi)
    movq %rsi, %rsp
    popq %r15
    popq %r14
    popq %r13
    popq %r12
    popq %rbx
    popq %rbp
    ret
    .size emu_switch, .-emu_switch
    .section .note.GNU-stack,"",@progbits
    .text
)");

namespace emu {

const ThreadCoords* current_coords = nullptr;

namespace {

constexpr size_t STACK_BYTES = 256u << 10;  // per fiber, reserved; untouched pages cost nothing
constexpr int MAX_BLOCK_THREADS = 1024;
constexpr long SPIN_ROUNDS = 1L << 12;  // rounds of atomics that change nothing, without any other progress
constexpr int ATOMICS_PER_YIELD = 16;

enum class State : uint8_t { Runnable, AtBarrier, AtWarp, Exited };

// A fiber's stack: mmap'ed with a guard page below it, so an overflow is a segfault, not silent
// corruption of the neighbouring stack.
struct Stack {
    char* base = nullptr;  // guard page, then the usable stack
    Stack() {
        long page = sysconf(_SC_PAGESIZE);
        void* p = mmap(nullptr, STACK_BYTES + page, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
        if (p == MAP_FAILED) {
            fprintf(stderr, "CUDA emulation: cannot map a %zu KiB fiber stack\n", STACK_BYTES >> 10);
            abort();
        }
        mprotect(p, page, PROT_NONE);
        base = (char*)p + page;
    }
};

struct Thread {
    ThreadCoords coords;
    int linear = 0, lane = 0, warp = 0;
    bool yielded = false;  // returned to the scheduler from an atomic, not a wait
    // barrier
    const char* site_file = nullptr;
    int site_line = 0, predicate = 0, barrier_result = 0;
    // warp collective
    WarpOp op = WarpOp::Sync;
    unsigned mask = 0;
    uint64_t value = 0, result = 0;
    int arg = 0, width = 32;
    uint32_t matrix_regs[4] = {};  // what ldmatrix delivered to this lane
    int atomics = 0;
    void* sp = nullptr;  // saved stack pointer while the fiber is not running
    Stack* stack = nullptr;
    // cp.async: the copies issued and not yet waited for, and where each committed group ends in them
    struct AsyncCopy {
        void* dst;
        const void* src;
        size_t bytes, zfill;
    };
    std::vector<AsyncCopy> async_copies;
    std::vector<size_t> async_groups;
    WgmmaState wgmma;
};

struct Block {
    const char* kernel = "";
    KernelInfo* info = nullptr;
    uint3 index;
    std::function<void()>* body = nullptr;
    std::vector<Thread> threads;
    // per thread (Thread::linear), apart from the threads: a round scans them all, in shuffled
    // order, about three times per resume, and a thread's own cache line often missed
    std::vector<State> states;
    int runnable[2] = {0, 0};  // runnable threads outside the straggler warp, in it: a pass with none skips its scan
    std::vector<char> smem;
    int barrier_kind = 0;
    int straggler_warp = -1;  // runs only when no other thread can (seeded schedules)
    std::vector<int> at_warp;  // per warp: its threads waiting at a warp collective
    std::vector<uint64_t> wgmma_issued;               // per warp: its wgmma.mma_async so far
    std::vector<std::vector<WgmmaSignature>> wgmma_log;  // per warpgroup: what its first warp issued
    std::string fault;
    cudaError_t fault_error = cudaErrorLaunchFailure;  // the sticky error the fault leaves
    cudaError_t refused = cudaSuccess;  // the launch is refused instead of faulting (static shared memory)
    // The round in progress (step): the shuffled order, the next position in it, the pass (1: the
    // straggler's), whether a thread ran and whether every one that ran only yielded.
    std::vector<int> order;
    size_t pos = 0;
    int pass = 0;
    bool ran = false, all_yielded = true;
    long idle_rounds = 0;
    uint64_t progress_seen = 0;  // progress_events at its last round's end
    std::vector<std::vector<char>> static_save;  // its static shared variables while another CTA's are in place
    std::vector<std::vector<char>> warp_scratch;  // per warp (warp_scratch)
    bool active = false;
};

// Every state change goes through set_state, which keeps Block::runnable.
void set_state(Block& b, int thread, State s) {
    State& now = b.states[thread];
    const int straggler = thread / 32 == b.straggler_warp;
    b.runnable[straggler] += (s == State::Runnable) - (now == State::Runnable);
    now = s;
}
void count_runnable(Block& b) {
    b.runnable[0] = b.runnable[1] = 0;
    for (size_t i = 0; i < b.states.size(); i++)
        if (b.states[i] == State::Runnable) b.runnable[(int)i / 32 == b.straggler_warp]++;
}

std::vector<std::unique_ptr<Stack>> stack_pool;
void* scheduler_sp = nullptr;
Block* current_block = nullptr;
Block* statics_owner = nullptr;  // whose static shared variables are in place (CTAs share the host statics)
uint64_t progress_events = 0;    // waits resolved, threads exited, memory changed by an atomic: any CTA's
bool concurrent_grid = false;    // the running launch keeps several CTAs resident
Thread* current_thread = nullptr;
uint64_t scheduling_seed = 0;
bool seed_read = false;
uint64_t launch_counter = 0;
std::string last_fault_message;

#if EMU_ASAN
void* scheduler_fake_stack = nullptr;
const void* scheduler_stack_bottom = nullptr;
size_t scheduler_stack_size = 0;
#endif

const char* op_name(WarpOp op) {
    switch (op) {
        case WarpOp::Sync: return "__syncwarp";
        case WarpOp::ShflIdx: return "__shfl_sync";
        case WarpOp::ShflUp: return "__shfl_up_sync";
        case WarpOp::ShflDown: return "__shfl_down_sync";
        case WarpOp::ShflXor: return "__shfl_xor_sync";
        case WarpOp::Ballot: return "__ballot_sync";
        case WarpOp::Any: return "__any_sync";
        case WarpOp::All: return "__all_sync";
        case WarpOp::Ldmatrix: return "ldmatrix";
        case WarpOp::Wgmma: return "wgmma.mma_async";
    }
    return "?";
}

std::string where(const Block& b) {
    return strformat("kernel %s block (%u,%u,%u)", b.kernel, b.index.x, b.index.y, b.index.z);
}

// Switches from the running fiber back to the scheduler; returns when the scheduler resumes it.
void yield_to_scheduler() {
    Thread* t = current_thread;
#if EMU_ASAN
    void* fake = nullptr;
    __sanitizer_start_switch_fiber(&fake, scheduler_stack_bottom, scheduler_stack_size);
#endif
    emu_switch(&t->sp, scheduler_sp);
#if EMU_ASAN
    __sanitizer_finish_switch_fiber(fake, nullptr, nullptr);
#endif
    current_coords = &t->coords;
}

[[noreturn]] void fiber_main() {
#if EMU_ASAN
    __sanitizer_finish_switch_fiber(nullptr, &scheduler_stack_bottom, &scheduler_stack_size);
#endif
    Block* b = current_block;
    Thread* t = current_thread;
    current_coords = &t->coords;
    try {
        (*b->body)();
    } catch (const KernelAbort&) {
    } catch (const std::exception& e) {
        if (b->fault.empty()) b->fault = strformat("%s thread %d: exception in device code: %s", where(*b).c_str(), t->linear, e.what());
    }
    set_state(*b, t->linear, State::Exited);
    progress_events++;
#if EMU_ASAN
    __sanitizer_start_switch_fiber(nullptr, scheduler_stack_bottom, scheduler_stack_size);  // this fiber ends
#endif
    void* unused;
    emu_switch(&unused, scheduler_sp);
    __builtin_unreachable();
}

// A first frame on an empty stack, as emu_switch would have left it: zero registers and
// fiber_main as the return address, placed so that
// fiber_main starts with the stack alignment of a called function (rsp = 8 mod 16).
// Under ASan the top of a reused stack still carries the redzones of the last fiber_main frame,
// which never returns; a faulted kernel's fibers leave their whole stacks so (unpoison_stacks).
constexpr size_t TOP_OF_STACK_BYTES = 16u << 10;
void* start_frame(char* base, size_t bytes) {
    ASAN_UNPOISON_MEMORY_REGION(base + bytes - TOP_OF_STACK_BYTES, TOP_OF_STACK_BYTES);
    uintptr_t top = ((uintptr_t)base + bytes) & ~(uintptr_t)15;
    uint64_t* frame = (uint64_t*)(top - 64);
    memset(frame, 0, 64);
    frame[6] = (uint64_t)(uintptr_t)&fiber_main;  // the slot emu_switch's ret pops
    return frame;
}

// Resident CTAs share the host statics that hold static shared memory (one per kernel): the CTA
// about to run gets its own copy back, NaN bytes for variables it has not reached.
void load_statics(Block& b) {
    const auto& vars = b.info->static_vars;
    if (statics_owner) {
        statics_owner->static_save.resize(vars.size());
        for (size_t i = 0; i < vars.size(); i++)
            statics_owner->static_save[i].assign((const char*)vars[i].first, (const char*)vars[i].first + vars[i].second);
    }
    for (size_t i = 0; i < vars.size(); i++) {
        if (i < b.static_save.size() && b.static_save[i].size() == vars[i].second) memcpy(vars[i].first, b.static_save[i].data(), vars[i].second);
        else memset(vars[i].first, 0xFF, vars[i].second);
    }
    statics_owner = &b;
}

void resume(Block& b, Thread& t) {
    if (statics_owner != &b) load_statics(b);
    current_thread = &t;
    current_block = &b;
    t.yielded = false;
#if EMU_ASAN
    __sanitizer_start_switch_fiber(&scheduler_fake_stack, t.stack->base, STACK_BYTES);
#endif
    emu_switch(&scheduler_sp, t.sp);
#if EMU_ASAN
    __sanitizer_finish_switch_fiber(scheduler_fake_stack, nullptr, nullptr);
#endif
    current_thread = nullptr;
}

// Lanes of t's warp that exist in this block, as a mask.
unsigned existing_lanes(const Block& b, int warp) {
    int n = (int)b.threads.size() - warp * 32;
    return n >= 32 ? 0xFFFFFFFFu : (1u << n) - 1;
}

std::string describe(const Block& b, const Thread& t) {
    switch (b.states[t.linear]) {
        case State::Runnable: return "runnable";
        case State::Exited: return "exited";
        case State::AtBarrier: return strformat("at __syncthreads (%s:%d)", t.site_file, t.site_line);
        case State::AtWarp: return strformat("at %s(mask 0x%08x)", op_name(t.op), t.mask);
    }
    return "?";
}

// Counts of what the threads of a block wait for, for a deadlock report.
std::string census(const Block& b) {
    std::map<std::string, int> counts;
    for (const Thread& t : b.threads) counts[describe(b, t)]++;
    std::string out;
    for (auto& kv : counts) out += strformat("%s%d %s", out.empty() ? "" : ", ", kv.second, kv.first.c_str());
    return out;
}

bool in_block_shared(const Block& b, const void* p, size_t bytes) {
    const char* c = (const char*)p;
    if (c >= b.smem.data() && c + bytes <= b.smem.data() + b.smem.size()) return true;
    for (const auto& v : b.info->static_vars)
        if (c >= (const char*)v.first && c + bytes <= (const char*)v.first + v.second) return true;
    return false;
}

// ldmatrix (PTX ISA, "Warp-level matrix load instruction: ldmatrix"): .sync.aligned, so every lane
// of the warp takes part with the same .num and .trans; lanes 0 .. 8 num - 1 each give one row
// address (16 bytes in .shared, 16-byte aligned), the other lanes' addresses are not read. The
// mask is the full warp (emu::ldmatrix), so resolve_group has checked that all 32 lanes wait here.
std::string resolve_ldmatrix(Block& b, int w, Thread* const lanes[32]) {
    const int arg = lanes[0]->arg, num = arg & 7;
    const bool trans = arg >> 3;
    for (int l = 1; l < 32; l++)
        if (lanes[l]->arg != arg)
            return strformat("warp %d: ldmatrix lane 0 has .x%d%s, lane %d .x%d%s (the rule: .aligned, every lane runs the "
                             "same instruction)", w, num, trans ? ".trans" : "", l, lanes[l]->arg & 7,
                             lanes[l]->arg >> 3 ? ".trans" : "");
    uint16_t rows[4][8][8];  // [matrix][row][element]
    for (int l = 0; l < 8 * num; l++) {
        const void* p = (const void*)(uintptr_t)lanes[l]->value;
        if ((uintptr_t)p % 16)
            return strformat("warp %d lane %d: ldmatrix row address %p is not 16-byte aligned (the rule: each row of 8 "
                             "b16 elements starts on a 16-byte boundary)", w, l, p);
        if (!in_block_shared(b, p, 16))
            return strformat("warp %d lane %d: ldmatrix row address %p is outside the block's shared memory (the rule: "
                             ".shared state space)", w, l, p);
        memcpy(rows[l / 8][l % 8], p, 16);
    }
    for (int l = 0; l < 32; l++)
        for (int i = 0; i < num; i++) {
            const int r = l / 4, c = 2 * (l % 4);
            const uint16_t lo = trans ? rows[i][c][r] : rows[i][r][c], hi = trans ? rows[i][c + 1][r] : rows[i][r][c + 1];
            lanes[l]->matrix_regs[i] = (uint32_t)lo | (uint32_t)hi << 16;
        }
    return "";
}

// Computes every lane's result of the collective that the lanes of `mask` in warp `w` wait at.
// Returns "" or what is wrong.
std::string resolve_group(Block& b, int w, unsigned mask) {
    Thread* lanes[32] = {};
    unsigned existing = existing_lanes(b, w);
    const Thread* first = nullptr;
    for (int l = 0; l < 32; l++) {
        if (!(mask & (1u << l))) continue;
        if (!(existing & (1u << l)))
            return strformat("warp %d: mask 0x%08x names lane %d, which does not exist (block of %zu threads)", w, mask, l,
                             b.threads.size());
        Thread& t = b.threads[w * 32 + l];
        if (b.states[t.linear] != State::AtWarp || t.mask != mask || (first && t.op != first->op))
            return strformat("warp %d: lanes of mask 0x%08x wait at %s, but lane %d is %s", w, mask,
                             op_name(first ? first->op : t.op), l, describe(b, t).c_str());
        lanes[l] = &t;
        if (!first) first = &t;
    }
    if (first && first->op == WarpOp::Ldmatrix) {
        std::string err = resolve_ldmatrix(b, w, lanes);
        if (!err.empty()) return err;
    }
    if (first && first->op == WarpOp::Wgmma) {
        WgmmaIssue* deposits[32];
        for (int l = 0; l < 32; l++) deposits[l] = (WgmmaIssue*)(uintptr_t)lanes[l]->value;
        std::string err = resolve_wgmma(w, (int)b.threads.size(), deposits, b.wgmma_issued[w], b.wgmma_log[w / 4]);
        if (!err.empty()) return err;
    }
    for (int l = 0; l < 32; l++) {
        Thread* t = lanes[l];
        if (!t) continue;
        int width = t->width;
        if (width < 1 || width > 32 || (width & (width - 1)))
            return strformat("warp %d lane %d: %s width %d is not a power of 2 in 1..32", w, l, op_name(t->op), width);
        int seg = l & ~(width - 1), src = l;
        switch (t->op) {
            case WarpOp::Sync: break;
            case WarpOp::Ldmatrix: continue;  // resolve_ldmatrix delivered the registers
            case WarpOp::Wgmma: continue;     // resolve_wgmma filled the deposits
            case WarpOp::ShflIdx: src = seg + (t->arg & (width - 1)); break;
            case WarpOp::ShflUp: src = l - seg >= t->arg ? l - t->arg : l; break;
            case WarpOp::ShflDown: src = l - seg + t->arg < width ? l + t->arg : l; break;
            case WarpOp::ShflXor: src = (l ^ t->arg) < seg + width ? (l ^ t->arg) : l; break;
            case WarpOp::Ballot:
            case WarpOp::Any:
            case WarpOp::All: {
                unsigned bits = 0;
                for (int k = 0; k < 32; k++)
                    if (lanes[k] && lanes[k]->value) bits |= 1u << k;
                t->result = t->op == WarpOp::Ballot ? bits : t->op == WarpOp::Any ? bits != 0 : bits == mask;
                continue;
            }
        }
        if (t->op == WarpOp::Sync) continue;
        if (src < 0 || src > 31 || !lanes[src])
            return strformat("warp %d lane %d: %s reads lane %d, outside the mask 0x%08x", w, l, op_name(t->op), src, mask);
        t->result = lanes[src]->value;
    }
    for (int l = 0; l < 32; l++)
        if (lanes[l]) {
            set_state(b, lanes[l]->linear, State::Runnable);
            b.at_warp[w]--;
        }
    return "";
}

// True when every lane of `mask` in warp w exists and waits at the same collective with that mask.
bool group_complete(const Block& b, int w, unsigned mask) {
    if (mask & ~existing_lanes(b, w)) return false;
    const Thread* first = nullptr;
    for (int l = 0; l < 32; l++) {
        if (!(mask & (1u << l))) continue;
        const Thread& t = b.threads[w * 32 + l];
        if (b.states[t.linear] != State::AtWarp || t.mask != mask || (first && t.op != first->op)) return false;
        first = &t;
    }
    return true;
}

// Resolves every complete warp collective; "" or a fault.
std::string resolve_warps(Block& b, bool& any) {
    int warps = ((int)b.threads.size() + 31) / 32;
    for (int w = 0; w < warps; w++)
        for (int l = 0; l < 32 && w * 32 + l < (int)b.threads.size(); l++) {
            Thread& t = b.threads[w * 32 + l];
            if (b.states[t.linear] != State::AtWarp) continue;
            if (!(t.mask & (1u << l)))
                return strformat("warp %d lane %d: %s with mask 0x%08x, which lacks the calling lane", w, l, op_name(t.op), t.mask);
            std::string err = resolve_group(b, w, t.mask);
            if (!err.empty()) return err;
            any = true;
        }
    return "";
}

// Releases the barrier when every thread that has not exited waits at it; "" or a fault.
std::string resolve_barrier(Block& b, bool& any) {
    int waiting = 0, exited = 0;
    const Thread* first = nullptr;
    for (const Thread& t : b.threads) {
        if (b.states[t.linear] == State::Exited) exited++;
        if (b.states[t.linear] == State::AtBarrier) {
            waiting++;
            if (!first) first = &t;
            else if (t.site_line != first->site_line || strcmp(t.site_file, first->site_file) != 0)
                return strformat("threads wait at different __syncthreads: %s:%d and %s:%d", first->site_file,
                                 first->site_line, t.site_file, t.site_line);
        }
    }
    if (waiting == 0 || waiting + exited != (int)b.threads.size()) return "";
    if (exited > 0) return strformat("divergent __syncthreads: %d threads at the barrier, %d exited", waiting, exited);
    int count = 0;
    for (const Thread& t : b.threads) count += t.predicate;
    int result = b.barrier_kind == 1 ? count : b.barrier_kind == 2 ? count == waiting : b.barrier_kind == 3 ? count > 0 : 0;
    std::fill(b.states.begin(), b.states.end(), State::Runnable);
    count_runnable(b);
    for (Thread& t : b.threads) t.barrier_result = result;
    any = true;
    return "";
}

std::mt19937_64 make_rng(uint64_t a, uint64_t b) {
    std::seed_seq s{(uint32_t)a, (uint32_t)(a >> 32), (uint32_t)b, (uint32_t)(b >> 32)};
    return std::mt19937_64(s);
}

// Makes b a fresh CTA at grid index `index` whose threads run on stacks [first_stack, + n).
void start_block(Block& b, uint3 index, const dim3& grid, const dim3& block, size_t first_stack, std::mt19937_64& rng) {
    int n = (int)(block.x * block.y * block.z);
    b.index = index;
    b.fault.clear();
    b.fault_error = cudaErrorLaunchFailure;
    b.threads.assign(n, Thread());
    b.states.assign(n, State::Runnable);
    while (stack_pool.size() < first_stack + n) stack_pool.emplace_back(new Stack());
    for (int i = 0; i < n; i++) {
        Thread& t = b.threads[i];
        t.linear = i, t.lane = i % 32, t.warp = i / 32;
        t.coords.thread_idx = make_uint3(i % block.x, (i / block.x) % block.y, i / (block.x * block.y));
        t.coords.block_idx = b.index;
        t.coords.block_dim = block;
        t.coords.grid_dim = grid;
        t.stack = stack_pool[first_stack + i].get();
        t.sp = start_frame(t.stack->base, STACK_BYTES);
    }
    std::fill(b.smem.begin(), b.smem.end(), (char)0xFF);
    b.static_save.clear();  // NaN bytes when it first runs
    if (statics_owner == &b) statics_owner = nullptr;
    const int warps = (n + 31) / 32;
    b.at_warp.assign(warps, 0);
    b.wgmma_issued.assign(warps, 0);
    b.wgmma_log.assign((warps + 3) / 4, {});
    b.straggler_warp = scheduling_seed != 0 && warps > 1 ? (int)(rng() % warps) : -1;
    count_runnable(b);
    b.order.resize(n);
    std::iota(b.order.begin(), b.order.end(), 0);
    b.pos = 0, b.pass = 0, b.idle_rounds = 0, b.progress_seen = progress_events;
    b.active = true;
}

enum class Step { Ran, Ended, Fault };

// Runs b's next thread of the round in progress (one resume), passing round ends: barriers and
// warp collectives resolved, the next round shuffled. Ended: every thread exited; Fault: b.fault.
// Under a seed one warp of the block is a straggler until the next barrier: it runs only when no
// other thread can, so the others run ahead of it through their shuffles and writes, and a read
// that a barrier should order before another warp's write sees the write.
Step step(Block& b, std::mt19937_64& rng) {
    const int n = (int)b.threads.size();
    for (;;) {
        if (b.pos == 0 && b.pass == 0) {
            if (scheduling_seed != 0) std::shuffle(b.order.begin(), b.order.end(), rng);
            b.ran = false, b.all_yielded = true;
        }
        if (b.runnable[b.pass] == 0) b.pos = n;  // nothing to find
        while (b.pos < (size_t)n) {
            const int i = b.order[b.pos++];
            if (b.states[i] != State::Runnable || (i / 32 == b.straggler_warp) != (b.pass == 1)) continue;
            Thread& t = b.threads[i];
            if (b.pos < (size_t)n) __builtin_prefetch(&b.threads[b.order[b.pos]]);  // likely the next to run
            b.ran = true;
            resume(b, t);
            if (!b.fault.empty()) return Step::Fault;
            b.all_yielded = b.all_yielded && t.yielded;
            // its lanes go on at once (checked once enough of them wait: a check per arrival was
            // a quarter of the emulation's time)
            if (b.states[i] == State::AtWarp && b.at_warp[t.warp] >= __builtin_popcount(t.mask) && group_complete(b, t.warp, t.mask)) {
                b.fault = resolve_group(b, t.warp, t.mask);
                if (!b.fault.empty()) return Step::Fault;
            }
            return Step::Ran;
        }
        if (b.pass == 0 && !b.ran) {  // nothing but the straggler can run
            b.pass = 1, b.pos = 0;
            continue;
        }
        b.pos = 0, b.pass = 0;
        if (b.ran) {
            // progress anywhere since its last round (other CTAs' included) ends a spin
            b.idle_rounds = b.all_yielded && progress_events == b.progress_seen ? b.idle_rounds + 1 : 0;
            b.progress_seen = progress_events;
            if (b.idle_rounds > SPIN_ROUNDS) {
                b.fault = strformat("spin-wait: every running thread loops on atomics or fences that change nothing (%s); "
                                    "a wait on a CTA that is not resident (or on a plain load) never ends",
                                    census(b).c_str());
                return Step::Fault;
            }
            continue;
        }
        bool any = false;
        b.fault = resolve_warps(b, any);
        if (b.fault.empty() && !any) {
            b.fault = resolve_barrier(b, any);
            if (any && scheduling_seed != 0 && n > 32) {
                b.straggler_warp = (int)(rng() % ((n + 31) / 32));
                count_runnable(b);
            }
        }
        if (!b.fault.empty()) return Step::Fault;
        if (any) continue;
        if (std::all_of(b.states.begin(), b.states.end(), [](State s) { return s == State::Exited; })) {
            b.active = false;
            if (statics_owner == &b) statics_owner = nullptr;
            return Step::Ended;
        }
        b.fault = "deadlock: no thread can run (" + census(b) + ")";
        return Step::Fault;
    }
}

// A permutation of 0..n-1 from the seed: i -> (a i + c) mod n with gcd(a, n) = 1 (lazy, for any grid).
struct BlockOrder {
    uint64_t n, a = 1, c = 0;
    BlockOrder(uint64_t n_, std::mt19937_64* rng) : n(n_) {
        if (!rng || n < 2) return;
        c = (*rng)() % n;
        do a = 1 + (*rng)() % (n - 1); while (std::gcd(a, n) != 1);
    }
    uint64_t operator()(uint64_t i) const { return (uint64_t)(((unsigned __int128)a * i + c) % n); }
};

}  // namespace

uint64_t seed() {
    if (!seed_read) {
        const char* s = getenv("FP8RL_EMU_SEED");
        scheduling_seed = s && *s ? strtoull(s, nullptr, 0) : 0;
        seed_read = true;
    }
    return scheduling_seed;
}

void set_seed(uint64_t s) {
    scheduling_seed = s;
    seed_read = true;
    reset_stream_order();
}

std::string last_fault() { return last_fault_message; }
void clear_fault() { last_fault_message.clear(); }

WgmmaState& current_wgmma() {
    if (!current_thread) kernel_fault("wgmma outside a kernel");
    return current_thread->wgmma;
}
int current_warp() { return current_thread ? current_thread->warp : -1; }
long current_cta() {
    const Block* b = current_block;
    if (!b) return -1;
    const dim3& g = b->threads[0].coords.grid_dim;
    return (long)b->index.x + (long)g.x * ((long)b->index.y + (long)g.y * b->index.z);
}
const char* current_kernel_name() { return current_block ? current_block->kernel : "?"; }
int current_lane() { return current_thread ? current_thread->lane : -1; }

const char* shared_window(uint32_t address, size_t bytes) {
    const Block* b = current_block;
    if (!b || (uint64_t)address + bytes > b->smem.size()) return nullptr;
    return b->smem.data() + address;
}

uint32_t shared_address(const void* p) {
    const Block* b = current_block;
    if (!b || !current_thread) kernel_fault("shared_address outside a kernel");
    const char* c = (const char*)p;
    if (c < b->smem.data() || c >= b->smem.data() + b->smem.size())
        kernel_fault(strformat("shared address of %p, not in the block's dynamic shared memory (the emulation places "
                               "dynamic shared memory at shared address 0 and maps only it for wgmma descriptors)", p));
    return (uint32_t)(c - b->smem.data());
}

void* warp_scratch(size_t bytes) {
    constexpr size_t SCRATCH_BYTES = 4096;
    Block* b = current_block;
    if (!b || !current_thread) kernel_fault("warp scratch used outside a kernel");
    if (bytes > SCRATCH_BYTES) kernel_fault(strformat("warp scratch of %zu bytes, above %zu", bytes, SCRATCH_BYTES));
    if (b->warp_scratch.size() <= (size_t)current_thread->warp) b->warp_scratch.resize((size_t)current_thread->warp + 1);
    std::vector<char>& s = b->warp_scratch[current_thread->warp];
    if (s.empty()) s.resize(SCRATCH_BYTES);
    return s.data();
}

void* dynamic_shared() {
    if (!current_block) kernel_fault("dynamic shared memory used outside a kernel");
    return current_block->smem.data();
}

void static_shared(void* p, size_t bytes, const char* name) {
    Block* b = current_block;
    if (!b || !current_thread) kernel_fault(strformat("static shared memory %s used outside a kernel", name));
    for (const auto& v : b->info->static_vars)
        if (v.first == p) return;
    // The first thread of the kernel's blocks to reach it: no thread has written it yet.
    b->info->static_vars.emplace_back(p, bytes);
    b->info->static_smem += bytes;
    memset(p, 0xFF, bytes);
    std::string err = shared_memory_error(*b->info, b->smem.size());
    if (err.empty()) return;
    b->fault = strformat("%s, found as block (%u,%u,%u) reached STATIC_SHARED %s (%zu bytes): cudaErrorInvalidValue, as a "
                         "GPU refuses the launch", err.c_str(), b->index.x, b->index.y, b->index.z, name, bytes);
    b->refused = cudaErrorInvalidValue;
    throw KernelAbort();
}

[[noreturn]] void kernel_fault(const std::string& what) {
    Block* b = current_block;
    if (!b || !current_thread) {
        fprintf(stderr, "CUDA emulation: %s (outside a kernel)\n", what.c_str());
        abort();
    }
    if (b->fault.empty()) b->fault = strformat("thread %d: %s", current_thread->linear, what.c_str());
    throw KernelAbort();
}

void fault_at_next_wait(const std::string& what) {
    Block* b = current_block;
    if (b && current_thread && b->fault.empty()) b->fault = strformat("thread %d: %s", current_thread->linear, what.c_str());
}

[[noreturn]] void misaligned_access(const void* p, size_t bytes, const char* what) {
    if (current_block && current_thread) current_block->fault_error = cudaErrorMisalignedAddress;
    kernel_fault(strformat("a %zu-byte %s at %p, not a multiple of %zu (the rule: a vector access must be aligned to its "
                           "size): cudaErrorMisalignedAddress",
                           bytes, what, p, bytes));
}

static std::atomic<uint64_t> async_bytes{0};  // blocks may run on several host threads
uint64_t async_copy_bytes() { return async_bytes.load(); }

// cp.async (cuda_pipeline_primitives.h): the rules its header asserts, refused as kernel faults;
// the copy itself happens when the thread waits for its group, so a read of the destination before
// __pipeline_wait_prior sees the old bytes (NaN-filled shared memory), as a GPU may show it.
void async_copy(void* dst, const void* src, size_t bytes, size_t zfill) {
    Thread* t = current_thread;
    Block* b = current_block;
    if (!t || !b) kernel_fault("__pipeline_memcpy_async outside a kernel");
    if (bytes != 4 && bytes != 8 && bytes != 16)
        kernel_fault(strformat("__pipeline_memcpy_async of %zu bytes (the rule: 4, 8 or 16)", bytes));
    if (zfill > bytes) kernel_fault(strformat("__pipeline_memcpy_async: zfill %zu > %zu bytes", zfill, bytes));
    if ((uintptr_t)dst % bytes) misaligned_access(dst, bytes, "cp.async destination");
    if ((uintptr_t)src % bytes) misaligned_access(src, bytes, "cp.async source");
    const char* d = (const char*)dst;
    if (!in_block_shared(*b, d, bytes))
        kernel_fault(strformat("__pipeline_memcpy_async to %p, outside the block's shared memory (the rule: shared "
                               "destination, global source)", dst));
    // a copy of 0 source bytes (zfill = bytes: PTX's src-size 0, or ignore-src) reads nothing, so its
    // address is not checked: a kernel may zero-fill from past its tensor's end
    if (bytes > zfill && !is_device_memory(src, bytes - zfill))
        kernel_fault(strformat("__pipeline_memcpy_async from %p, not device memory (the rule: global source)", src));
    t->async_copies.push_back({dst, src, bytes, zfill});
    async_bytes += bytes - zfill;
}
void async_commit() {
    Thread* t = current_thread;
    if (!t) kernel_fault("__pipeline_commit outside a kernel");
    t->async_groups.push_back(t->async_copies.size());
}
void async_wait_prior(size_t prior) {
    Thread* t = current_thread;
    if (!t) kernel_fault("__pipeline_wait_prior outside a kernel");
    if (t->async_groups.size() <= prior) return;
    const size_t done = t->async_groups[t->async_groups.size() - 1 - prior];  // copies of the older groups
    for (size_t i = 0; i < done; i++) {
        const Thread::AsyncCopy& c = t->async_copies[i];
        memcpy(c.dst, c.src, c.bytes - c.zfill);
        memset((char*)c.dst + c.bytes - c.zfill, 0, c.zfill);
    }
    t->async_copies.erase(t->async_copies.begin(), t->async_copies.begin() + (long)done);
    t->async_groups.erase(t->async_groups.begin(), t->async_groups.end() - (long)prior);
    for (size_t& g : t->async_groups) g -= done;
    progress_events++;  // memory changed
}

int block_barrier(const char* file, int line, const char* func, int predicate, int kind) {
    Thread* t = current_thread;
    if (!t) kernel_fault("__syncthreads outside a kernel");
    if (kind == 0 && mutated(Site::Barrier, func, line)) return 0;
    set_state(*current_block, t->linear, State::AtBarrier);
    t->site_file = file, t->site_line = line, t->predicate = predicate;
    current_block->barrier_kind = kind;
    yield_to_scheduler();
    progress_events++;
    return t->barrier_result;
}

uint64_t warp_collective(WarpOp op, unsigned mask, uint64_t value, int arg, int width) {
    Thread* t = current_thread;
    if (!t) kernel_fault(strformat("%s outside a kernel", op_name(op)));
    set_state(*current_block, t->linear, State::AtWarp);
    current_block->at_warp[t->warp]++;
    t->op = op, t->mask = mask, t->value = value, t->arg = arg, t->width = width;
    yield_to_scheduler();
    progress_events++;
    return t->result;
}

void ldmatrix(uint32_t* regs, int num, bool trans, const void* row_address) {
    if (num != 1 && num != 2 && num != 4) kernel_fault(strformat("ldmatrix .x%d (the rule: .x1, .x2 or .x4)", num));
    warp_collective(WarpOp::Ldmatrix, 0xFFFFFFFFu, (uint64_t)(uintptr_t)row_address, num | (trans ? 8 : 0), 32);
    memcpy(regs, current_thread->matrix_regs, sizeof(uint32_t) * (size_t)num);
}

void note_sync_across_ctas() {
    if (current_block) current_block->info->syncs_across_ctas = true;
}

void atomic_point(void* address, size_t bytes, bool changed) {
    Thread* t = current_thread;
    if (!t) return;  // host code calling an atomic helper
    current_block->info->syncs_across_ctas = true;
    if (changed) progress_events++;
    memory_order_atomic(address, bytes);
    if (++t->atomics % ATOMICS_PER_YIELD != 0 && !concurrent_grid) return;
    t->yielded = true;
    yield_to_scheduler();  // state stays Runnable: the scheduler picks it again in the next round
}

void fence_point() {
    Thread* t = current_thread;
    if (!t) return;
    current_block->info->syncs_across_ctas = true;
    if (!concurrent_grid) return;
    t->yielded = true;
    yield_to_scheduler();
}

// How many CTAs of a launch are resident at once: 1 in order (seed 0), else 2 to 4 as the seed
// draws (sm_90 holds up to 32 per SM and 132 SMs: any number may be resident together), with
// bursts of 1 to ~1,000 resumes of one CTA before the seed picks the next, so one CTA can run a
// long way while another stands between two of its threads' steps. A kernel none of whose seeded
// launches reached an atomic, a fence or an __ldcg runs its CTAs one at a time, in the seeded
// order, from its second launch on: its CTAs have no legal way to pass data within a launch, and
// a load of another CTA's store is reported whatever the order (emu_memory_order.cpp); CTAs
// at once cost it a third of its time (docs/gpu-emulation.md, "Costs").
constexpr int MAX_RESIDENT = 4;
constexpr int BURSTS[] = {1, 8, 64, 512};

// The control bits of MXCSR (rounding, flush to zero, exception masks; not the sticky status flags)
// and the x87 control word, which the fibers share with the host thread (emu_switch).
uint64_t fp_control() {
    uint32_t csr;
    uint16_t fpcw;
    asm volatile("stmxcsr %0" : "=m"(csr));
    asm volatile("fnstcw %0" : "=m"(fpcw));
    return (uint64_t)(csr & ~0x3Fu) << 16 | fpcw;
}
void set_fp_control(uint64_t control) {
    uint32_t csr;
    const uint16_t fpcw = (uint16_t)control;
    asm volatile("stmxcsr %0" : "=m"(csr));
    csr = (csr & 0x3Fu) | (uint32_t)(control >> 16);
    asm volatile("ldmxcsr %0" : : "m"(csr));
    asm volatile("fldcw %0" : : "m"(fpcw));
}

// Runs the grid now (the stream is synchronous); a fault ends the kernel and is kept as the
// sticky error, a refusal is the launch's error.
void run_grid(const char* name, KernelInfo* kernel, dim3 grid, dim3 block, size_t smem, const std::function<void()>& body) {
    uint64_t launch = launch_counter++;
    const uint64_t host_fp_control = fp_control();
    std::mt19937_64 rng = make_rng(seed(), launch);
    const uint64_t blocks = (uint64_t)grid.x * grid.y * grid.z;
    const int n = (int)(block.x * block.y * block.z);
    BlockOrder order(blocks, seed() ? &rng : nullptr);
    const bool interleaved = seed() != 0 && (kernel->syncs_across_ctas || !kernel->launched_seeded);
    const int resident = !interleaved ? 1 : (int)std::min<uint64_t>(blocks, 2 + rng() % (MAX_RESIDENT - 1));
    const int burst_mean = !interleaved ? 1 : BURSTS[rng() % 4];
    if (seed() != 0) kernel->launched_seeded = true;
    concurrent_grid = resident > 1;
    // Blocks (their threads, shared memory) are kept from launch to launch: allocating them anew
    // made every launch fault in fresh pages, most of the emulated tests' system time.
    static std::vector<Block> slots(MAX_RESIDENT);
    for (int s = 0; s < resident; s++) {
        Block& b = slots[s];
        b.active = false;
        b.refused = cudaSuccess;
        b.kernel = name;
        b.info = kernel;
        b.body = const_cast<std::function<void()>*>(&body);
        b.smem.resize(smem);  // NaN-filled as each block starts
    }
    memory_order_begin(kernel, seed() == 0 ? 0 : resident);
    uint64_t started = 0;
    int running = 0, current = 0;
    long burst = 0, cta = 0, switched_to = -1;
    bool slot_free = true;  // a block ended since the last look (the slots are not read at every step)
    Block* faulted = nullptr;
    for (;;) {
        for (int s = 0; slot_free && s < resident && started < blocks; s++)
            if (!slots[s].active) {
                uint64_t id = order(started++);
                uint3 index = make_uint3((unsigned)(id % grid.x), (unsigned)(id / grid.x % grid.y),
                                         (unsigned)(id / ((uint64_t)grid.x * grid.y)));
                start_block(slots[s], index, grid, block, (size_t)s * n, rng);
                running++;
            }
        slot_free = false;
        if (running == 0) break;
        if (burst <= 0) {  // also when the current block ended
            do current = resident == 1 ? 0 : (int)(rng() % resident); while (!slots[current].active);
            burst = resident == 1 ? 1L << 62 : 1 + (long)(rng() % (2 * burst_mean));
            const uint3 at = slots[current].index;
            cta = (long)at.x + (long)grid.x * ((long)at.y + (long)grid.y * at.z);
        }
        burst--;
        if (cta != switched_to) memory_order_switch(switched_to = cta);
        Step r = step(slots[current], rng);
        if (r == Step::Ended) running--, burst = 0, slot_free = true;
        if (r == Step::Fault) {
            faulted = &slots[current];
            break;
        }
    }
    if (faulted) {
        Block& b = *faulted;
        for (auto& stack : stack_pool) ASAN_UNPOISON_MEMORY_REGION(stack->base, STACK_BYTES);  // abandoned fibers
        if (b.refused != cudaSuccess) {
            fprintf(stderr, "CUDA emulation: launch of %s refused: %s\n", name, b.fault.c_str());
            set_launch_error(b.refused);
        } else {
            last_fault_message = where(b) + ": " + b.fault;
            fprintf(stderr, "CUDA emulation: %s\n", last_fault_message.c_str());
            set_sticky_error(b.fault_error);
        }
    }
    if (fp_control() != host_fp_control) {
        set_fp_control(host_fp_control);
        if (!faulted) {
            last_fault_message = strformat("kernel %s: changed the rounding mode or another control bit of MXCSR or the "
                                           "x87 control word (the rule: CUDA code has no floating-point environment to "
                                           "set; rounding is chosen per instruction, e.g. __fadd_rd)", name);
            fprintf(stderr, "CUDA emulation: %s\n", last_fault_message.c_str());
            set_sticky_error(cudaErrorLaunchFailure);
        }
    }
    memory_order_end();
    statics_owner = nullptr;
    concurrent_grid = false;
    current_block = nullptr;
    current_coords = nullptr;
}

}  // namespace emu
