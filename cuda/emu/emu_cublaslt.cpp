// emu_cublaslt.cpp: cuBLASLt in emulation, implemented against cublasLt.h's own declarations, so
// GemmRunner (fp8_gemm.cuh) and any CUDA program call the same functions in both builds. What is
// implemented is what fp8rl uses: D = alpha op(A) op(B) + beta C with FP32 compute, E4M3 x E4M3
// (scalar, outer-vector, VEC128 or BLK128x128 scales) or BF16 x BF16, FP32 or BF16 D (C = D's type).
// A call the library documents as unsupported returns its status and prints the rule it broke
// (emu::cublaslt_last_error keeps it), as CUBLASLT_LOG_LEVEL=1 would.
// Sources of the rules:
//   [LT]  cuBLAS docs, cublasLtMatmul(): "To use FP8 kernels ... A must be transposed and B non-
//         transposed (The TN format)"; "pointers and leading dimensions must allow 16-byte
//         alignment"; the 1D/2D block scaling section: scale tensors 16-byte aligned, M and N
//         multiples of 4, no BLK128x128 x BLK128x128; FP8 output excluded for block modes.
//   [PREF] cublasLtMatmulPreferenceAttributes_t: MIN_ALIGNMENT_{A,B,C,D}_BYTES, "default 256";
//         algorithms the heuristic returns assume those alignments.
//   [BLK] NVIDIA CUDALibrarySamples LtBlk128x128Fp8Matmul and PyTorch's scaled_gemm set
//         CUBLASLT_MATMUL_DESC_{A,B}_SCALE_POINTER before cublasLtMatmulAlgoGetHeuristic; the
//         heuristic refuses block modes without them ("requires a custom pointer for A scale", 7).
//   [OUT] cuBLAS docs, outer vector scaling: "both CUBLASLT_MATMUL_DESC_A_SCALE_MODE and
//         CUBLASLT_MATMUL_DESC_B_SCALE_MODE must be set to CUBLASLT_MATMUL_MATRIX_SCALE_OUTER_VEC_32F";
//         scale_A is a vector of M floats and scale_B of N, D[i][j] = alpha sA[i] sB[j] sum_l a_il b_lj
//         (the scales apply to the FP32 sum over all of k, as the scalar mode's single pair does).
//   [RED] cublasLtMatmulPreferenceAttributes_t: REDUCTION_SCHEME_MASK "filters heuristic result to
//         only include algo configs that use one of the required modes"; a split-K configuration
//         (CUBLASLT_ALGO_CONFIG_SPLITK_NUM > 1) reduces its parts by a scheme other than NONE.
//   spec-fp8.md §6.3-§6.5 summarizes them with the scale layouts.
// Rounding depends on the algorithm as a library's does: algorithm 0 sums each 128-wide k block
// in FP32 and adds the scaled block sums in k order, each with one FMA (DeepGEMM's promotion; shape-
// independent, as the CPU oracle cpu/fp8_gemm_ref.h), and a BF16 GEMM's k as one FP32 chain
// (cpu/gemm.h's order: the accumulator
// is never rescaled); algorithms 1 and 2 split k into 2-4 parts chosen from (m, n, k, index),
// each summed so, then added last part first, so their last bits depend on the shape; algorithm 3,
// a narrow tile for skinny outputs, does not split k and rounds as algorithm 0 (a tile's shape does
// not change the order of an element's sum: what the GPU check of gemm_runner_rows_do_not_depend_on_n
// holds cuBLASLt to). Which algorithm the heuristic ranks first depends on the shape too: where the
// output's 128 x 128 tiles do not fill the device's 132 SMs, a split-K one if k has several blocks
// (as libraries split skinny GEMMs), then the narrow tile. So a program that takes the heuristic's
// first answer runs other kernels, and rounds differently, as n (a batch size) changes.
#include "cuda/emu/emu.h"
#include <cublasLt.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <new>
#include <string>
#include <vector>

#include "cuda/emu/emu_internal.h"

struct cublasLtContext {
    int live;
};

namespace {

thread_local std::string last_error;
thread_local int last_algorithm = -1;  // the algorithm of the last cublasLtMatmul this thread issued

// FP8RL_EMU_CUBLASLT_REFUSAL=N (N > 0): every refusal answers with another status the documentation
// allows for a refused configuration than the one its rule names here (cublasLtMatmul's "parameters
// ... in conflict or in an impossible configuration" is INVALID_VALUE, "the current implementation
// ... doesn't support the configured operation" NOT_SUPPORTED; NVIDIA's own samples see either for
// the same FP8 rule), and the heuristic, picked by a hash of N and the refusal's count, sometimes
// with success and zero results instead. Code that depends on one exact status fails in CI
// (make test-gpu-emu runs the cuBLASLt tests so); 0 or unset: the status the rule names.
uint64_t refusal_seed() {
    static const uint64_t seed = [] {
        const char* s = getenv("FP8RL_EMU_CUBLASLT_REFUSAL");
        return s ? strtoull(s, nullptr, 10) : 0ull;
    }();
    return seed;
}

bool is_refusal(cublasStatus_t status) {
    return status == CUBLAS_STATUS_INVALID_VALUE || status == CUBLAS_STATUS_NOT_SUPPORTED;
}

cublasStatus_t refuse(cublasStatus_t status, const std::string& why) {
    last_error = why;
    const bool swap = refusal_seed() != 0 && is_refusal(status);
    fprintf(stderr, "cuBLASLt (emulated): %s%s\n", why.c_str(),
            swap ? " (answered with the other refusal status: FP8RL_EMU_CUBLASLT_REFUSAL)" : "");
    if (!swap) return status;
    return status == CUBLAS_STATUS_INVALID_VALUE ? CUBLAS_STATUS_NOT_SUPPORTED : CUBLAS_STATUS_INVALID_VALUE;
}

// In the seeded mode, whether this heuristic refusal answers success with zero results instead.
bool refuse_with_zero_results() {
    static std::atomic<uint64_t> count{0};
    if (refusal_seed() == 0) return false;
    uint64_t z = (refusal_seed() + count++) * 0x9E3779B97F4A7C15ull;
    return ((z ^ (z >> 31)) >> 17) & 1;
}

// The state behind each opaque descriptor, placed in its data array.
struct Desc {
    cublasComputeType_t compute;
    cudaDataType_t scale_type;
    int32_t transa, transb;
    int32_t a_mode, b_mode;
    const void *a_scale, *b_scale;
    int8_t fast_accum;
};
struct Layout {
    cudaDataType_t type;
    uint64_t rows, cols;
    int64_t ld;
};
struct Pref {
    uint64_t max_workspace;
    uint32_t align[4];  // A, B, C, D
    uint32_t reduction_mask;  // [RED] the reduction schemes a returned algorithm may use
};
struct Algo {
    int32_t index, splits;
    uint32_t align[4];  // what the algorithm assumes of A, B, C, D
    uint64_t workspace;
};
static_assert(sizeof(Desc) <= sizeof(cublasLtMatmulDescOpaque_t), "Desc fits its opaque struct");
static_assert(sizeof(Layout) <= sizeof(cublasLtMatrixLayoutOpaque_t), "Layout fits its opaque struct");
static_assert(sizeof(Pref) <= sizeof(cublasLtMatmulPreferenceOpaque_t), "Pref fits its opaque struct");
static_assert(sizeof(Algo) <= sizeof(cublasLtMatmulAlgo_t), "Algo fits cublasLtMatmulAlgo_t");

Desc* desc_of(cublasLtMatmulDesc_t d) { return reinterpret_cast<Desc*>(d->data); }
Layout* layout_of(cublasLtMatrixLayout_t l) { return reinterpret_cast<Layout*>(l->data); }
Pref* pref_of(cublasLtMatmulPreference_t p) { return reinterpret_cast<Pref*>(p->data); }
const Algo* algo_of(const cublasLtMatmulAlgo_t* a) { return reinterpret_cast<const Algo*>(a->data); }

template <class T>
cublasStatus_t set_value(T& field, const void* buf, size_t size, const char* name) {
    if (buf == nullptr || size != sizeof(T))
        return refuse(CUBLAS_STATUS_INVALID_VALUE,
                                    emu::strformat("%s: buffer null or %zu bytes, not %zu", name, size, sizeof(T)));
    memcpy(&field, buf, sizeof(T));
    return CUBLAS_STATUS_SUCCESS;
}

size_t type_bytes(cudaDataType_t t) { return t == CUDA_R_8F_E4M3 || t == CUDA_R_8F_E5M2 ? 1 : t == CUDA_R_32F ? 4 : 2; }
bool is_block(int32_t mode) {
    return mode == CUBLASLT_MATMUL_MATRIX_SCALE_VEC128_32F || mode == CUBLASLT_MATMUL_MATRIX_SCALE_BLK128x128_32F;
}
bool is_outer(int32_t mode) { return mode == CUBLASLT_MATMUL_MATRIX_SCALE_OUTER_VEC_32F; }
uint32_t alignment_of(const void* p) {
    uintptr_t u = (uintptr_t)p;
    return u == 0 ? 256u : (uint32_t)std::min<uintptr_t>(u & (~u + 1), 256);
}

// The problem one matmul describes, after the checks every call shares.
struct Problem {
    int m, n, k;
    bool fp8, a_t, b_t;
    Desc desc;
    Layout a, b, c, d;
    int blocks;  // ceil(k / 128)
};

size_t scale_floats(int32_t mode, int rows, int blocks) {
    if (mode == CUBLASLT_MATMUL_MATRIX_SCALE_VEC128_32F) return (size_t)blocks * rows;
    if (mode == CUBLASLT_MATMUL_MATRIX_SCALE_BLK128x128_32F) return (size_t)(blocks + 3) / 4 * 4 * ((rows + 127) / 128);
    if (is_outer(mode)) return (size_t)rows;  // [OUT]
    return 1;
}

// The shape, type and layout rules of [LT]; the scale pointers only where the heuristic needs them [BLK].
cublasStatus_t check_problem(cublasLtMatmulDesc_t dp, cublasLtMatrixLayout_t al, cublasLtMatrixLayout_t bl,
                             cublasLtMatrixLayout_t cl, cublasLtMatrixLayout_t dl, Problem& p) {
    if (!dp || !al || !bl || !cl || !dl) return refuse(CUBLAS_STATUS_INVALID_VALUE, "a descriptor or layout is null");
    p.desc = *desc_of(dp), p.a = *layout_of(al), p.b = *layout_of(bl), p.c = *layout_of(cl), p.d = *layout_of(dl);
    const Desc& d = p.desc;
    if (d.compute != CUBLAS_COMPUTE_32F || d.scale_type != CUDA_R_32F)
        return refuse(CUBLAS_STATUS_NOT_SUPPORTED, "only CUBLAS_COMPUTE_32F with CUDA_R_32F alpha/beta is emulated");
    p.a_t = d.transa == CUBLAS_OP_T, p.b_t = d.transb == CUBLAS_OP_T;
    // op(A) is m x k, op(B) k x n, C and D m x n (column-major stored matrices, transposed by op)
    p.m = (int)(p.a_t ? p.a.cols : p.a.rows), p.k = (int)(p.a_t ? p.a.rows : p.a.cols);
    p.n = (int)(p.b_t ? p.b.rows : p.b.cols);
    int kb = (int)(p.b_t ? p.b.cols : p.b.rows);
    if (kb != p.k || p.c.rows != (uint64_t)p.m || p.c.cols != (uint64_t)p.n || p.d.rows != (uint64_t)p.m ||
        p.d.cols != (uint64_t)p.n)
        return refuse(CUBLAS_STATUS_INVALID_VALUE,
                                    emu::strformat("layouts disagree: op(A) %d x %d, op(B) %d x %d, C %llu x %llu, D %llu x %llu",
                                                   p.m, p.k, kb, p.n, (unsigned long long)p.c.rows, (unsigned long long)p.c.cols,
                                                   (unsigned long long)p.d.rows, (unsigned long long)p.d.cols));
    for (const Layout* l : {&p.a, &p.b, &p.c, &p.d})
        if (l->ld < (int64_t)l->rows || l->rows == 0 || l->cols == 0)
            return refuse(CUBLAS_STATUS_INVALID_VALUE, "a leading dimension is below its row count, or a dimension is 0");
    if (p.c.type != p.d.type || (p.c.ld != p.d.ld))
        return refuse(CUBLAS_STATUS_NOT_SUPPORTED, "C and D differ in type or leading dimension (not emulated)");
    if (p.d.type != CUDA_R_32F && p.d.type != CUDA_R_16BF)
        return refuse(CUBLAS_STATUS_NOT_SUPPORTED, "D must be CUDA_R_32F or CUDA_R_16BF (emulated types)");
    p.fp8 = p.a.type == CUDA_R_8F_E4M3;
    p.blocks = (p.k + 127) / 128;
    if (!p.fp8) {
        if (p.a.type != CUDA_R_16BF || p.b.type != CUDA_R_16BF)
            return refuse(CUBLAS_STATUS_NOT_SUPPORTED, "inputs must be E4M3 x E4M3 or BF16 x BF16 (emulated types)");
        if (is_block(d.a_mode) || is_block(d.b_mode) || is_outer(d.a_mode) || is_outer(d.b_mode))
            return refuse(CUBLAS_STATUS_NOT_SUPPORTED, "block and outer-vector scale modes need FP8 inputs");
        return CUBLAS_STATUS_SUCCESS;
    }
    if (p.b.type != CUDA_R_8F_E4M3)
        return refuse(CUBLAS_STATUS_NOT_SUPPORTED, "inputs must be E4M3 x E4M3 or BF16 x BF16 (emulated types)");
    if (!p.a_t || p.b_t)
        return refuse(CUBLAS_STATUS_NOT_SUPPORTED, "FP8 GEMMs are TN only on Hopper (TRANSA = T, TRANSB = N)");
    if (p.a.ld % 16 || p.b.ld % 16 || p.k % 16)
        return refuse(CUBLAS_STATUS_NOT_SUPPORTED,
                                    emu::strformat("FP8 lda, ldb and k must be multiples of 16 (16-byte rows): lda=%lld ldb=%lld k=%d",
                                                   (long long)p.a.ld, (long long)p.b.ld, p.k));
    if (p.d.type == CUDA_R_16BF && p.d.ld % 8)
        return refuse(CUBLAS_STATUS_NOT_SUPPORTED,
                                    emu::strformat("FP8 GEMM with BF16 D needs ldd (= m) a multiple of 8 (16-byte rows): ldd=%lld",
                                                   (long long)p.d.ld));
    bool block = is_block(d.a_mode) || is_block(d.b_mode);
    if (block && !(is_block(d.a_mode) && is_block(d.b_mode)))
        return refuse(CUBLAS_STATUS_NOT_SUPPORTED, "a block scale mode cannot pair with a scalar or outer-vector one");
    if (d.a_mode == CUBLASLT_MATMUL_MATRIX_SCALE_BLK128x128_32F && d.b_mode == CUBLASLT_MATMUL_MATRIX_SCALE_BLK128x128_32F)
        return refuse(CUBLAS_STATUS_NOT_SUPPORTED, "BLK128x128 x BLK128x128 is not a cuBLASLt mode");
    const bool outer = is_outer(d.a_mode) || is_outer(d.b_mode);
    if (outer && !(is_outer(d.a_mode) && is_outer(d.b_mode)))
        return refuse(CUBLAS_STATUS_NOT_SUPPORTED, "OUTER_VEC_32F scaling needs both A_SCALE_MODE and B_SCALE_MODE set to it [OUT]");
    if (!block && !outer &&
        (d.a_mode != CUBLASLT_MATMUL_MATRIX_SCALE_SCALAR_32F || d.b_mode != CUBLASLT_MATMUL_MATRIX_SCALE_SCALAR_32F))
        return refuse(CUBLAS_STATUS_NOT_SUPPORTED, "only scalar, outer-vector, VEC128 and BLK128x128 scale modes are emulated");
    if (outer && (!d.a_scale || !d.b_scale))
        return refuse(CUBLAS_STATUS_INVALID_VALUE, "OUTER_VEC_32F scaling needs both scale pointers (vectors of m and n floats)");
    if (block) {
        if (p.m % 4 || p.n % 4)
            return refuse(CUBLAS_STATUS_NOT_SUPPORTED,
                                        emu::strformat("block-scaled FP8 GEMMs need m and n multiples of 4: m=%d n=%d", p.m, p.n));
        if (!d.a_scale || !d.b_scale)
            return refuse(CUBLAS_STATUS_INVALID_VALUE,
                                        emu::strformat("block scale mode requires a custom pointer for %s scale "
                                                       "(set CUBLASLT_MATMUL_DESC_%s_SCALE_POINTER before the heuristic)",
                                                       d.a_scale ? "B" : "A", d.a_scale ? "B" : "A"));
        if ((uintptr_t)d.a_scale % 16 || (uintptr_t)d.b_scale % 16)
            return refuse(CUBLAS_STATUS_NOT_SUPPORTED, "block scale tensors must start on a 16-byte boundary");
    }
    return CUBLAS_STATUS_SUCCESS;
}

// The FP32 partial sums a split algorithm keeps in the workspace.
uint64_t split_workspace(const Problem& p, int splits) { return splits > 1 ? (uint64_t)p.m * p.n * sizeof(float) * splits : 0; }

// What the heuristic (or the algorithm check) answers for an algorithm.
cublasLtMatmulHeuristicResult_t result_of(const Algo& algo) {
    cublasLtMatmulHeuristicResult_t r{};
    memcpy(r.algo.data, &algo, sizeof(algo));
    r.workspaceSize = algo.workspace;
    r.state = CUBLAS_STATUS_SUCCESS;
    r.wavesCount = 1.0f;
    return r;
}

// Algorithm `index`: its k split from the shape, as a library's tile choice: 1 part for algorithms
// 0 and 3, 2 to 4 for 1 and 2 where k has 2 blocks or more.
Algo make_algo(const Problem& p, const Pref& pref, int index) {
    Algo a{};
    a.index = index;
    uint64_t h = ((uint64_t)p.m * 0x9E3779B97F4A7C15ull) ^ ((uint64_t)p.n * 0xC2B2AE3D27D4EB4Full) ^
                 ((uint64_t)p.k * 0x165667B19E3779F9ull) ^ ((uint64_t)index * 0x27D4EB2F165667C5ull);
    h ^= h >> 29;
    const int most = std::min(p.blocks, 4);
    a.splits = index == 0 || index == 3 || most < 2 ? 1 : 2 + (int)(h % (uint64_t)(most - 1));
    for (int i = 0; i < 4; i++) a.align[i] = pref.align[i];
    a.workspace = split_workspace(p, a.splits);
    return a;
}

constexpr int NUM_ALGOS = 4;

}  // namespace

namespace emu {
std::string cublaslt_last_error() { return last_error; }
int cublaslt_last_algorithm() { return last_algorithm; }
}  // namespace emu

extern "C" {

cublasStatus_t cublasLtCreate(cublasLtHandle_t* handle) {
    if (!handle) return refuse(CUBLAS_STATUS_INVALID_VALUE, "cublasLtCreate: null handle pointer");
    *handle = new cublasLtContext{1};
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtDestroy(cublasLtHandle_t handle) {
    if (!handle) return refuse(CUBLAS_STATUS_NOT_INITIALIZED, "cublasLtDestroy: null handle");
    delete handle;
    return CUBLAS_STATUS_SUCCESS;
}

const char* cublasLtGetStatusName(cublasStatus_t status) {
    switch (status) {
        case CUBLAS_STATUS_SUCCESS: return "CUBLAS_STATUS_SUCCESS";
        case CUBLAS_STATUS_NOT_INITIALIZED: return "CUBLAS_STATUS_NOT_INITIALIZED";
        case CUBLAS_STATUS_INVALID_VALUE: return "CUBLAS_STATUS_INVALID_VALUE";
        case CUBLAS_STATUS_NOT_SUPPORTED: return "CUBLAS_STATUS_NOT_SUPPORTED";
        default: return "CUBLAS_STATUS_UNKNOWN";
    }
}

const char* cublasLtGetStatusString(cublasStatus_t status) {
    switch (status) {
        case CUBLAS_STATUS_SUCCESS: return "success";
        case CUBLAS_STATUS_NOT_INITIALIZED: return "the library was not initialized";
        case CUBLAS_STATUS_INVALID_VALUE: return "an invalid numeric value was used as an argument";
        case CUBLAS_STATUS_NOT_SUPPORTED: return "the functionality requested is not supported";
        default: return "unknown error";
    }
}

size_t cublasLtGetVersion(void) { return CUBLAS_VERSION; }

cublasStatus_t cublasLtMatmulDescCreate(cublasLtMatmulDesc_t* desc, cublasComputeType_t compute, cudaDataType_t scale_type) {
    if (!desc) return refuse(CUBLAS_STATUS_INVALID_VALUE, "cublasLtMatmulDescCreate: null pointer");
    *desc = new cublasLtMatmulDescOpaque_t{};
    new (desc_of(*desc)) Desc{compute, scale_type, CUBLAS_OP_N, CUBLAS_OP_N, CUBLASLT_MATMUL_MATRIX_SCALE_SCALAR_32F,
                              CUBLASLT_MATMUL_MATRIX_SCALE_SCALAR_32F, nullptr, nullptr, 0};
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmulDescDestroy(cublasLtMatmulDesc_t desc) {
    delete desc;
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmulDescSetAttribute(cublasLtMatmulDesc_t desc, cublasLtMatmulDescAttributes_t attr,
                                              const void* buf, size_t size) {
    if (!desc) return refuse(CUBLAS_STATUS_INVALID_VALUE, "cublasLtMatmulDescSetAttribute: null descriptor");
    Desc& d = *desc_of(desc);
    switch (attr) {
        case CUBLASLT_MATMUL_DESC_TRANSA: return set_value(d.transa, buf, size, "TRANSA");
        case CUBLASLT_MATMUL_DESC_TRANSB: return set_value(d.transb, buf, size, "TRANSB");
        case CUBLASLT_MATMUL_DESC_A_SCALE_MODE: return set_value(d.a_mode, buf, size, "A_SCALE_MODE");
        case CUBLASLT_MATMUL_DESC_B_SCALE_MODE: return set_value(d.b_mode, buf, size, "B_SCALE_MODE");
        case CUBLASLT_MATMUL_DESC_A_SCALE_POINTER: return set_value(d.a_scale, buf, size, "A_SCALE_POINTER");
        case CUBLASLT_MATMUL_DESC_B_SCALE_POINTER: return set_value(d.b_scale, buf, size, "B_SCALE_POINTER");
        case CUBLASLT_MATMUL_DESC_FAST_ACCUM: return set_value(d.fast_accum, buf, size, "FAST_ACCUM");
        default: return refuse(CUBLAS_STATUS_NOT_SUPPORTED, emu::strformat("matmul attribute %d is not emulated", (int)attr));
    }
}

cublasStatus_t cublasLtMatrixLayoutCreate(cublasLtMatrixLayout_t* layout, cudaDataType type, uint64_t rows, uint64_t cols,
                                          int64_t ld) {
    if (!layout) return refuse(CUBLAS_STATUS_INVALID_VALUE, "cublasLtMatrixLayoutCreate: null pointer");
    *layout = new cublasLtMatrixLayoutOpaque_t{};
    new (layout_of(*layout)) Layout{type, rows, cols, ld};
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatrixLayoutDestroy(cublasLtMatrixLayout_t layout) {
    delete layout;
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmulPreferenceCreate(cublasLtMatmulPreference_t* pref) {
    if (!pref) return refuse(CUBLAS_STATUS_INVALID_VALUE, "cublasLtMatmulPreferenceCreate: null pointer");
    *pref = new cublasLtMatmulPreferenceOpaque_t{};
    // [PREF], [RED]: workspace 0, 256-byte alignment and every reduction scheme by default
    new (pref_of(*pref)) Pref{0, {256, 256, 256, 256}, CUBLASLT_REDUCTION_SCHEME_MASK};
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmulPreferenceDestroy(cublasLtMatmulPreference_t pref) {
    delete pref;
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmulPreferenceSetAttribute(cublasLtMatmulPreference_t pref, cublasLtMatmulPreferenceAttributes_t attr,
                                                    const void* buf, size_t size) {
    if (!pref) return refuse(CUBLAS_STATUS_INVALID_VALUE, "cublasLtMatmulPreferenceSetAttribute: null preference");
    Pref& p = *pref_of(pref);
    switch (attr) {
        case CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES: return set_value(p.max_workspace, buf, size, "MAX_WORKSPACE_BYTES");
        case CUBLASLT_MATMUL_PREF_REDUCTION_SCHEME_MASK: return set_value(p.reduction_mask, buf, size, "REDUCTION_SCHEME_MASK");
        case CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES: return set_value(p.align[0], buf, size, "MIN_ALIGNMENT_A_BYTES");
        case CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES: return set_value(p.align[1], buf, size, "MIN_ALIGNMENT_B_BYTES");
        case CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES: return set_value(p.align[2], buf, size, "MIN_ALIGNMENT_C_BYTES");
        case CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES: return set_value(p.align[3], buf, size, "MIN_ALIGNMENT_D_BYTES");
        default: return refuse(CUBLAS_STATUS_NOT_SUPPORTED, emu::strformat("preference attribute %d is not emulated", (int)attr));
    }
}

cublasStatus_t cublasLtMatmulAlgoGetHeuristic(cublasLtHandle_t handle, cublasLtMatmulDesc_t desc, cublasLtMatrixLayout_t a,
                                              cublasLtMatrixLayout_t b, cublasLtMatrixLayout_t c, cublasLtMatrixLayout_t d,
                                              cublasLtMatmulPreference_t pref, int requested,
                                              cublasLtMatmulHeuristicResult_t results[], int* returned) {
    if (!handle) return refuse(CUBLAS_STATUS_NOT_INITIALIZED, "heuristic: null handle");
    if (!pref || !results || !returned || requested <= 0)
        return refuse(CUBLAS_STATUS_INVALID_VALUE, "heuristic: null preference or results, or requestedAlgoCount <= 0");
    *returned = 0;
    Problem p;
    cublasStatus_t st = check_problem(desc, a, b, c, d, p);
    const Pref& pr = *pref_of(pref);
    for (int i = 0; i < 4 && st == CUBLAS_STATUS_SUCCESS; i++) {
        // [LT]: FP8 kernels read 16-byte vectors, so no algorithm exists for less aligned FP8 or FP8-GEMM outputs
        if (p.fp8 && pr.align[i] < 16)
            st = refuse(CUBLAS_STATUS_NOT_SUPPORTED,
                        emu::strformat("FP8 GEMMs need 16-byte-aligned A, B, C and D; the preference allows %u "
                                       "bytes for %c", pr.align[i], "ABCD"[i]));
    }
    if (is_refusal(st) && refuse_with_zero_results()) return CUBLAS_STATUS_SUCCESS;  // *returned = 0
    if (st != CUBLAS_STATUS_SUCCESS) return st;
    // skinny outputs rank split-K first (algorithms 1, 2) where k has blocks to split, then the
    // narrow tile (3); others the plain one (0)
    const uint64_t tiles = ((p.m + 127) / 128) * (uint64_t)((p.n + 127) / 128);
    static const int ranked[3][NUM_ALGOS] = {{0, 3, 1, 2}, {3, 0, 1, 2}, {1, 2, 3, 0}};
    const int* order = ranked[tiles >= 132 ? 0 : p.blocks < 2 ? 1 : 2];
    for (int rank = 0; rank < NUM_ALGOS && *returned < requested; rank++) {
        Algo algo = make_algo(p, pr, order[rank]);
        if (algo.workspace > pr.max_workspace) continue;
        if (algo.splits > 1 && !(pr.reduction_mask & CUBLASLT_REDUCTION_SCHEME_COMPUTE_TYPE)) continue;  // [RED]
        results[(*returned)++] = result_of(algo);
    }
    return CUBLAS_STATUS_SUCCESS;
}

// An algorithm (from a heuristic query of another shape) checked for this problem: the same
// configuration, its workspace for this shape.
cublasStatus_t cublasLtMatmulAlgoCheck(cublasLtHandle_t handle, cublasLtMatmulDesc_t desc, cublasLtMatrixLayout_t a,
                                       cublasLtMatrixLayout_t b, cublasLtMatrixLayout_t c, cublasLtMatrixLayout_t d,
                                       const cublasLtMatmulAlgo_t* algo_p, cublasLtMatmulHeuristicResult_t* result) {
    if (!handle) return refuse(CUBLAS_STATUS_NOT_INITIALIZED, "algorithm check: null handle");
    if (!algo_p || !result) return refuse(CUBLAS_STATUS_INVALID_VALUE, "algorithm check: null algorithm or result");
    Problem p;
    cublasStatus_t st = check_problem(desc, a, b, c, d, p);
    if (st != CUBLAS_STATUS_SUCCESS) return st;
    Algo algo = *algo_of(algo_p);
    if (algo.splits > p.blocks)
        return refuse(CUBLAS_STATUS_NOT_SUPPORTED, emu::strformat("algorithm %d splits k into %d parts; k has %d blocks",
                                                                  algo.index, algo.splits, p.blocks));
    algo.workspace = split_workspace(p, algo.splits);
    *result = result_of(algo);
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmul(cublasLtHandle_t handle, cublasLtMatmulDesc_t desc, const void* alpha_p, const void* A,
                              cublasLtMatrixLayout_t al, const void* B, cublasLtMatrixLayout_t bl, const void* beta_p,
                              const void* C, cublasLtMatrixLayout_t cl, void* D, cublasLtMatrixLayout_t dl,
                              const cublasLtMatmulAlgo_t* algo_p, void* workspace, size_t workspace_bytes, cudaStream_t stream) {
    if (!handle) return refuse(CUBLAS_STATUS_NOT_INITIALIZED, "matmul: null handle");
    if (!alpha_p || !beta_p || !A || !B || !D) return refuse(CUBLAS_STATUS_INVALID_VALUE, "matmul: alpha, beta, A, B or D is null");
    Problem p;
    cublasStatus_t st = check_problem(desc, al, bl, cl, dl, p);
    if (st != CUBLAS_STATUS_SUCCESS) return st;
    const float alpha = *(const float*)alpha_p, beta = *(const float*)beta_p;  // host pointer mode
    if (beta != 0 && !C) return refuse(CUBLAS_STATUS_INVALID_VALUE, "matmul: beta != 0 with a null C");
    Pref defaults{0, {256, 256, 256, 256}, CUBLASLT_REDUCTION_SCHEME_MASK};
    // [LT]: a null algo runs an implicit heuristic query with default preferences
    Algo algo = algo_p ? *algo_of(algo_p) : make_algo(p, defaults, 0);
    if (p.fp8 && (A == nullptr || B == nullptr)) return refuse(CUBLAS_STATUS_INVALID_VALUE, "matmul: null FP8 operand");
    const void* ptrs[4] = {A, B, beta != 0 ? C : D, D};
    for (int i = 0; i < 4; i++)
        if (alignment_of(ptrs[i]) < algo.align[i])  // [PREF]: the algorithm was chosen for this alignment
            return refuse(CUBLAS_STATUS_NOT_SUPPORTED,
                                        emu::strformat("%c is %u-byte aligned, less than the %u bytes the algorithm assumes "
                                                       "(CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_%c_BYTES)",
                                                       "ABCD"[i], alignment_of(ptrs[i]), algo.align[i], "ABCD"[i]));
    if (algo.workspace > workspace_bytes || (algo.workspace && !workspace))
        return refuse(CUBLAS_STATUS_INVALID_VALUE,
                                    emu::strformat("algorithm %d needs %llu workspace bytes, %zu given", algo.index,
                                                   (unsigned long long)algo.workspace, workspace_bytes));
    auto extent = [](const Layout& l) { return ((l.cols - 1) * (uint64_t)l.ld + l.rows) * type_bytes(l.type); };
    bool ok = emu::is_device_memory(A, extent(p.a)) && emu::is_device_memory(B, extent(p.b)) &&
              emu::is_device_memory(D, extent(p.d)) && (beta == 0 || emu::is_device_memory(C, extent(p.c)));
    const float* sa = (const float*)p.desc.a_scale;
    const float* sb = (const float*)p.desc.b_scale;
    if (p.fp8) {
        ok = ok && (!sa || emu::is_device_memory(sa, scale_floats(p.desc.a_mode, p.m, p.blocks) * sizeof(float))) &&
             (!sb || emu::is_device_memory(sb, scale_floats(p.desc.b_mode, p.n, p.blocks) * sizeof(float)));
        if ((is_block(p.desc.a_mode) || is_outer(p.desc.a_mode)) && (!sa || !sb))
            return refuse(CUBLAS_STATUS_INVALID_VALUE, "matmul: a block or outer-vector scale mode without its scale pointer");
    }
    if (!ok) return refuse(CUBLAS_STATUS_INVALID_VALUE, "matmul: an operand, scale tensor, C or D is not (wholly) in device memory");
    auto compute = [p, A, B, C, D, sa, sb, alpha, beta, algo] {
        const int L = p.blocks, L4 = (L + 3) / 4 * 4;
        // dequantization multiplier of (row, k block) of an operand with `rows` rows, as spec-fp8.md §6.5 writes it
        auto scale = [&](const float* s, int32_t mode, int row, int kb, int rows) -> float {
            if (!s) return 1.0f;
            if (mode == CUBLASLT_MATMUL_MATRIX_SCALE_VEC128_32F) return s[(size_t)kb * rows + row];
            if (mode == CUBLASLT_MATMUL_MATRIX_SCALE_BLK128x128_32F) return s[(size_t)(row / 128) * L4 + kb];
            if (is_outer(mode)) return s[row];
            return s[0];
        };
        // block modes scale each 128-block's sum; scalar and outer-vector ones the sum over all of k [OUT]
        const bool block_scaled = p.fp8 && is_block(p.desc.a_mode);
        // The operands decoded to float once (A as [m][k], B as [k][n]): decoding FP8 per product was
        // most of the emulated GEMM's time. Each output's sums keep the order below.
        auto element = [&](const void* x, size_t i) {
            return p.fp8 ? __half2float(__half(__nv_cvt_fp8_to_halfraw(((const uint8_t*)x)[i], __NV_E4M3)))
                         : __bfloat162float(((const __nv_bfloat16*)x)[i]);
        };
        std::vector<float> a((size_t)p.m * p.k), b((size_t)p.k * p.n);
#pragma omp parallel for schedule(static)
        for (int l = 0; l < p.k; l++) {
            for (int i = 0; i < p.m; i++) a[(size_t)i * p.k + l] = element(A, p.a_t ? (size_t)i * p.a.ld + l : (size_t)l * p.a.ld + i);
            for (int j = 0; j < p.n; j++) b[(size_t)l * p.n + j] = element(B, p.b_t ? (size_t)l * p.b.ld + j : (size_t)j * p.b.ld + l);
        }
        const int per_split = (L + algo.splits - 1) / algo.splits;
#pragma omp parallel for schedule(static)
        for (int i = 0; i < p.m; i++) {
            // row i of D, its n outputs side by side (the inner loops run over j, so they vectorize)
            std::vector<float> total(p.n, 0.0f), part(p.n), block(p.n);
            // a split algorithm's reduction adds the parts last first (one part: algorithm 0's k order)
            for (int s0 = (L - 1) / per_split * per_split; s0 >= 0; s0 -= per_split) {
                std::fill(part.begin(), part.end(), 0.0f);  // one split's FP32 sum of scaled 128-block sums, in k order
                // block-scaled FP8: each 128-block's sum is scaled before it joins the part; BF16 and the
                // other FP8 modes have no per-block scales, and the tensor cores' one FP32 accumulator
                // takes the whole part as one chain in k order
                std::fill(block.begin(), block.end(), 0.0f);
                for (int kb = s0; kb < std::min(L, s0 + per_split); kb++) {
                    if (block_scaled) std::fill(block.begin(), block.end(), 0.0f);
                    for (int l = kb * 128; l < p.k && l < (kb + 1) * 128; l++) {
                        const float x = a[(size_t)i * p.k + l];
                        const float* y = &b[(size_t)l * p.n];
                        for (int j = 0; j < p.n; j++) block[j] += x * y[j];  // exact products; FP32 sums
                    }
                    // promoted with one fused multiply-add, as DeepGEMM's kernel does (cpu/fp8_gemm_ref.h)
                    if (block_scaled)
                        for (int j = 0; j < p.n; j++)
                            part[j] = std::fma(block[j], scale(sa, p.desc.a_mode, i, kb, p.m) * scale(sb, p.desc.b_mode, j, kb, p.n),
                                               part[j]);
                }
                if (!block_scaled) part = block;
                for (int j = 0; j < p.n; j++) total[j] += part[j];
            }
            if (p.fp8 && !block_scaled)
                for (int j = 0; j < p.n; j++)
                    total[j] = (scale(sa, p.desc.a_mode, i, 0, p.m) * scale(sb, p.desc.b_mode, j, 0, p.n)) * total[j];
            for (int j = 0; j < p.n; j++) {
                size_t di = (size_t)j * p.d.ld + i;
                float out = alpha * total[j];
                if (p.d.type == CUDA_R_32F) {
                    if (beta != 0) out += beta * ((const float*)C)[di];
                    ((float*)D)[di] = out;
                } else {
                    if (beta != 0) out += beta * __bfloat162float(((const __nv_bfloat16*)C)[di]);
                    ((__nv_bfloat16*)D)[di] = __float2bfloat16_rn(out);
                }
            }
        }
    };
    if (emu::stream_op(stream, compute, emu::Counted{emu::Counted::Gemm}) != cudaSuccess)
        return refuse(CUBLAS_STATUS_EXECUTION_FAILED, "matmul: the stream refused the operation");
    last_algorithm = algo.index;
    return CUBLAS_STATUS_SUCCESS;
}

}  // extern "C"
