// wgmma.cuh: Hopper's warpgroup MMA for the kernels, wgmma.mma_async.sync.aligned.m64nNk16.f32.bf16.bf16
// (D[64xN] += A[64x16] B[16xN], BF16 operands, FP32 accumulate, SASS HGMMA) and .m64nNk32.f32.e4m3.e4m3
// (A[64x32] B[32xN], E4M3 operands, SASS QGMMA); PTX ISA "Asynchronous
// Warpgroup Level Matrix Multiply-Accumulate Instructions"), sm_90a only. The 128 threads of a
// warpgroup (4 contiguous warps, the first's index a multiple of 4) issue each instruction together:
//   wgmma_fence();                               wgmma.fence: after any other access of D or A's registers
//   acc.mma(a_desc, b_desc, accumulate);         wgmma.mma_async, A and B in shared memory, or
//   acc.mma(a_fragment, b_desc, accumulate);     ... A in registers (the layout of mma.cuh's A fragment), or
//   acc.mma_e4m3(a_desc, b_desc, accumulate);    ... m64nNk32.f32.e4m3.e4m3: FP8 A and B in shared memory,
//                                                both K-major (the PTX ISA has no transpose for FP8)
//   wgmma_commit();                              wgmma.commit_group
//   wgmma_wait<0>(acc);                          wgmma.wait_group 0: acc holds the product from here on
// The product is asynchronous: D and a register A may not be touched between the mma and the wait
// that completes it, and the shared-memory operands not changed. Warp w % 4 of the warpgroup holds
// rows 16 (w % 4) + {g, g + 8} of D, register v of a lane (g = lane / 4, t = lane % 4) the element
// D[16 (w % 4) + g + 8 ((v >> 1) & 1)][8 (v >> 2) + 2t + (v & 1)]: per 8 columns, mma.cuh's C fragment.
// Shared-memory operands are described by wgmma_descriptor (layouts: cuda/emu/emu_wgmma.cpp's header).
//
// The emulation (FP8RL_EMU) runs the same calls through cuda/emu/emu_wgmma.cpp, which computes the
// product at the wait and refuses misuse: an access of D or A's registers while a wgmma using them is
// in flight, a missing wgmma.fence, warps of a warpgroup that disagree, descriptors it cannot place.
// In the nvcc build each register set also passes through an empty asm after the wait, so the compiler
// cannot move a read of D above the wgmma.wait_group (CUTLASS's warpgroup_fence_operand).
#ifndef FP8RL_CUDA_WGMMA_CUH
#define FP8RL_CUDA_WGMMA_CUH
#include <cstdint>

#include "cuda/common.cuh"

#if defined(__CUDA_ARCH__) && !defined(__CUDA_ARCH_FEAT_SM90_ALL)
#error "cuda/kernels/wgmma.cuh: wgmma needs sm_90a (nvcc -gencode arch=compute_90a,code=sm_90a; the Makefile's NVCCFLAGS)"
#endif

namespace fp8rl {

// The swizzle field of a matrix descriptor (bits 62-63).
enum class WgmmaSwizzle : uint32_t { None = 0, B128 = 1, B64 = 2, B32 = 3 };

// The shared-window address of a pointer into shared memory (cvta.to.shared).
__device__ __forceinline__ uint32_t shared_window_address(const void* p) {
#ifdef FP8RL_EMU
    return ::emu::shared_address(p);
#else
    return (uint32_t)__cvta_generic_to_shared(p);
#endif
}

// The matrix descriptor of an operand at `tile` (shared memory, 16-byte aligned) with leading and
// stride byte offsets lbo, sbo (multiples of 16, below 256 KiB) and the swizzle its bytes follow.
__device__ __forceinline__ uint64_t wgmma_descriptor(const void* tile, uint32_t lbo, uint32_t sbo, WgmmaSwizzle swizzle) {
    const uint32_t address = shared_window_address(tile);
    return (uint64_t)((address & 0x3FFFF) >> 4) | (uint64_t)((lbo & 0x3FFFF) >> 4) << 16 |
           (uint64_t)((sbo & 0x3FFFF) >> 4) << 32 | (uint64_t)swizzle << 62;
}

// p advanced to the next 1024-byte boundary of the shared window, where a 128-byte swizzle pattern
// starts (a kernel that places swizzled tiles from there allocates 1024 bytes more).
__device__ __forceinline__ unsigned char* align_shared_1024(unsigned char* p) {
    return p + (1024 - shared_window_address(p) % 1024) % 1024;
}

__device__ __forceinline__ void wgmma_fence() {
#ifdef FP8RL_EMU
    ::emu::wgmma_fence();
#else
    asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
#endif
}

__device__ __forceinline__ void wgmma_commit() {
#ifdef FP8RL_EMU
    ::emu::wgmma_commit();
#else
    asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
#endif
}

// fence.proxy.async.shared::cta: orders this thread's generic-proxy writes of shared memory (st.shared,
// cp.async) before later reads by the async proxy (wgmma's operands); the writers run it, then a
// barrier. The emulation does not check it (cuda/emu/emu_wgmma.cpp).
__device__ __forceinline__ void fence_proxy_async_shared() {
#ifndef FP8RL_EMU
    asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
#endif
}

template <int N>
class WgmmaAccumulator;

// A register A operand: the warp's 16 rows of A[64][16] in mma.cuh's A fragment layout (a[r] holds
// A[16 (w % 4) + g + 8 (r & 1)][8 (r >> 1) + 2t + {0, 1}], BF16 pairs, low half first).
class WgmmaFragmentA {
  public:
    __device__ WgmmaFragmentA() {}
    WgmmaFragmentA(const WgmmaFragmentA&) = delete;
    WgmmaFragmentA& operator=(const WgmmaFragmentA&) = delete;
    __device__ __forceinline__ uint32_t& operator[](int i) {
#ifdef FP8RL_EMU
        ::emu::wgmma_touch(guard_, "wgmma A fragment registers");
#endif
        return r_[i];
    }

  private:
    template <int>
    friend class WgmmaAccumulator;
    uint32_t r_[4];
#ifdef FP8RL_EMU
    ::emu::WgmmaGuard guard_;
#endif
};

#ifndef FP8RL_EMU
// One instruction per N: inline PTX names its registers one by one.
#define FP8RL_WGMMA_F8(i) "+f"(r_[i]), "+f"(r_[i + 1]), "+f"(r_[i + 2]), "+f"(r_[i + 3]), "+f"(r_[i + 4]), \
    "+f"(r_[i + 5]), "+f"(r_[i + 6]), "+f"(r_[i + 7])
#define FP8RL_WGMMA_SS(N, DREGS, A, B, S, TA, TB, OUT)                                                      \
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, " S ", 0;\nwgmma.mma_async.sync.aligned.m64n" #N          \
                 "k16.f32.bf16.bf16 " DREGS ", " A ", " B ", p, 1, 1, " TA ", " TB ";\n}\n"                 \
                 : OUT                                                                                      \
                 : "l"(a_desc), "l"(b_desc), "r"((int)accumulate), "n"((int)TransA), "n"((int)TransB))
// The FP8 form has no imm-trans-a / imm-trans-b operands (PTX ISA: only .f16 / .bf16 transpose).
#define FP8RL_WGMMA_SS_E4M3(N, DREGS, A, B, S, OUT)                                                         \
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, " S ", 0;\nwgmma.mma_async.sync.aligned.m64n" #N          \
                 "k32.f32.e4m3.e4m3 " DREGS ", " A ", " B ", p, 1, 1;\n}\n"                                   \
                 : OUT                                                                                      \
                 : "l"(a_desc), "l"(b_desc), "r"((int)accumulate))
#define FP8RL_WGMMA_RS(N, DREGS, A, B, S, TB, OUT)                                                          \
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, " S ", 0;\nwgmma.mma_async.sync.aligned.m64n" #N          \
                 "k16.f32.bf16.bf16 " DREGS ", " A ", " B ", p, 1, 1, " TB ";\n}\n"                         \
                 : OUT                                                                                      \
                 : "r"(a.r_[0]), "r"(a.r_[1]), "r"(a.r_[2]), "r"(a.r_[3]), "l"(b_desc), "r"((int)accumulate), \
                   "n"((int)TransB))
#define FP8RL_WGMMA_D16 "{" "%0, %1, %2, %3, %4, %5, %6, %7" "}"
#define FP8RL_WGMMA_OUT16 FP8RL_WGMMA_F8(0)
#define FP8RL_WGMMA_SS16 FP8RL_WGMMA_SS(16, FP8RL_WGMMA_D16, "%8", "%9", "%10", "%11", "%12", FP8RL_WGMMA_OUT16)
#define FP8RL_WGMMA_RS16 FP8RL_WGMMA_RS(16, FP8RL_WGMMA_D16, "{%8, %9, %10, %11}", "%12", "%13", "%14", FP8RL_WGMMA_OUT16)
#define FP8RL_WGMMA_E4M3_16 FP8RL_WGMMA_SS_E4M3(16, FP8RL_WGMMA_D16, "%8", "%9", "%10", FP8RL_WGMMA_OUT16)
#define FP8RL_WGMMA_D32 "{" "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15" "}"
#define FP8RL_WGMMA_OUT32 FP8RL_WGMMA_F8(0), FP8RL_WGMMA_F8(8)
#define FP8RL_WGMMA_SS32 FP8RL_WGMMA_SS(32, FP8RL_WGMMA_D32, "%16", "%17", "%18", "%19", "%20", FP8RL_WGMMA_OUT32)
#define FP8RL_WGMMA_RS32 FP8RL_WGMMA_RS(32, FP8RL_WGMMA_D32, "{%16, %17, %18, %19}", "%20", "%21", "%22", FP8RL_WGMMA_OUT32)
#define FP8RL_WGMMA_E4M3_32 FP8RL_WGMMA_SS_E4M3(32, FP8RL_WGMMA_D32, "%16", "%17", "%18", FP8RL_WGMMA_OUT32)
#define FP8RL_WGMMA_D64 "{" "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15" ", " "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31" "}"
#define FP8RL_WGMMA_OUT64 FP8RL_WGMMA_F8(0), FP8RL_WGMMA_F8(8), FP8RL_WGMMA_F8(16), FP8RL_WGMMA_F8(24)
#define FP8RL_WGMMA_SS64 FP8RL_WGMMA_SS(64, FP8RL_WGMMA_D64, "%32", "%33", "%34", "%35", "%36", FP8RL_WGMMA_OUT64)
#define FP8RL_WGMMA_RS64 FP8RL_WGMMA_RS(64, FP8RL_WGMMA_D64, "{%32, %33, %34, %35}", "%36", "%37", "%38", FP8RL_WGMMA_OUT64)
#define FP8RL_WGMMA_E4M3_64 FP8RL_WGMMA_SS_E4M3(64, FP8RL_WGMMA_D64, "%32", "%33", "%34", FP8RL_WGMMA_OUT64)
#define FP8RL_WGMMA_D128 "{" "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15" ", " "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31" ", " "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47" ", " "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63" "}"
#define FP8RL_WGMMA_OUT128 FP8RL_WGMMA_F8(0), FP8RL_WGMMA_F8(8), FP8RL_WGMMA_F8(16), FP8RL_WGMMA_F8(24), FP8RL_WGMMA_F8(32), FP8RL_WGMMA_F8(40), FP8RL_WGMMA_F8(48), FP8RL_WGMMA_F8(56)
#define FP8RL_WGMMA_SS128 FP8RL_WGMMA_SS(128, FP8RL_WGMMA_D128, "%64", "%65", "%66", "%67", "%68", FP8RL_WGMMA_OUT128)
#define FP8RL_WGMMA_RS128 FP8RL_WGMMA_RS(128, FP8RL_WGMMA_D128, "{%64, %65, %66, %67}", "%68", "%69", "%70", FP8RL_WGMMA_OUT128)
#define FP8RL_WGMMA_E4M3_128 FP8RL_WGMMA_SS_E4M3(128, FP8RL_WGMMA_D128, "%64", "%65", "%66", FP8RL_WGMMA_OUT128)
#endif

// The accumulator D of a m64nNk16 (BF16) or m64nNk32 (E4M3) wgmma: N / 2 FP32 registers per thread
// (layout above).
template <int N>
class WgmmaAccumulator {
    static_assert(N == 16 || N == 32 || N == 64 || N == 128, "wgmma.cuh issues m64nNk16 / k32 for N = 16, 32, 64, 128");

  public:
    static constexpr int regs = N / 2;
    __device__ WgmmaAccumulator() {}
    WgmmaAccumulator(const WgmmaAccumulator&) = delete;
    WgmmaAccumulator& operator=(const WgmmaAccumulator&) = delete;
    __device__ __forceinline__ float& operator[](int i) {
#ifdef FP8RL_EMU
        ::emu::wgmma_touch(guard_, "wgmma accumulator registers");
#endif
        return r_[i];
    }

    // D = A B (+ D when accumulate), A and B from shared memory; TransA / TransB: the operand is
    // MN-major (else K-major).
    template <bool TransA, bool TransB>
    __device__ __forceinline__ void mma(uint64_t a_desc, uint64_t b_desc, bool accumulate) {
#ifdef FP8RL_EMU
        ::emu::wgmma_issue(::emu::WgmmaType::BF16, N, r_, guard_, nullptr, nullptr, a_desc, b_desc, accumulate, TransA,
                           TransB);
#else
        if constexpr (N == 16) FP8RL_WGMMA_SS16;
        else if constexpr (N == 32) FP8RL_WGMMA_SS32;
        else if constexpr (N == 64) FP8RL_WGMMA_SS64;
        else FP8RL_WGMMA_SS128;
#endif
    }

    // D = A B (+ D when accumulate), A from registers, B from shared memory (TransB: MN-major).
    template <bool TransB>
    __device__ __forceinline__ void mma(const WgmmaFragmentA& a, uint64_t b_desc, bool accumulate) {
#ifdef FP8RL_EMU
        ::emu::wgmma_issue(::emu::WgmmaType::BF16, N, r_, guard_, a.r_, const_cast<::emu::WgmmaGuard*>(&a.guard_), 0, b_desc, accumulate, false,
                           TransB);
#else
        if constexpr (N == 16) FP8RL_WGMMA_RS16;
        else if constexpr (N == 32) FP8RL_WGMMA_RS32;
        else if constexpr (N == 64) FP8RL_WGMMA_RS64;
        else FP8RL_WGMMA_RS128;
#endif
    }

    // D = A B (+ D when accumulate) for E4M3 A[64][32] and B[32][N], both K-major in shared memory
    // (a 16-byte core-matrix row holds 16 FP8 values; with the 128-byte swizzle a 128-byte row is a
    // 128-wide K block, walked as four k32 steps by advancing the descriptors' start address 32 bytes).
    // The emulation sums each element's 32 products one by one in k order (cuda/emu/emu_wgmma.cpp).
    __device__ __forceinline__ void mma_e4m3(uint64_t a_desc, uint64_t b_desc, bool accumulate) {
#ifdef FP8RL_EMU
        ::emu::wgmma_issue(::emu::WgmmaType::E4M3, N, r_, guard_, nullptr, nullptr, a_desc, b_desc, accumulate, false,
                           false);
#else
        if constexpr (N == 16) FP8RL_WGMMA_E4M3_16;
        else if constexpr (N == 32) FP8RL_WGMMA_E4M3_32;
        else if constexpr (N == 64) FP8RL_WGMMA_E4M3_64;
        else FP8RL_WGMMA_E4M3_128;
#endif
    }

    // After the wait: keeps the compiler from reading the registers before it.
    __device__ __forceinline__ void fence_operands() {
#ifndef FP8RL_EMU
        for (int i = 0; i < regs; i++) asm volatile("" : "+f"(r_[i])::"memory");
#endif
    }

  private:
    float r_[N / 2];
#ifdef FP8RL_EMU
    ::emu::WgmmaGuard guard_;
#endif
};

// wgmma.wait_group Pending: all but the Pending newest committed groups have completed; the
// accumulators named are readable if their wgmmas are among those.
template <int Pending, class... Acc>
__device__ __forceinline__ void wgmma_wait(Acc&... acc) {
#ifdef FP8RL_EMU
    ::emu::wgmma_wait(Pending);
#else
    asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(Pending) : "memory");
#endif
    (acc.fence_operands(), ...);
}

}  // namespace fp8rl

#endif  // FP8RL_CUDA_WGMMA_CUH
