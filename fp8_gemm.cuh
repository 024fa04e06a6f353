// fp8_gemm.cuh: FP8 quantization kernels and cuBLASLt GEMM wrappers for the GPU engine (Hopper,
// sm_90). The kernels call the shared scalar code of rl/numerics/fp8.h and rl/numerics/fp8_block.h (encoder, scale
// rule, index formulas), so their bytes equal the CPU quantizers' bit for bit; the block-scaled GEMMs
// are the ones cpu/fp8_gemm_ref.h emulates. Layouts and the fprop/dgrad/wgrad mapping: spec-fp8.md §6-§7.
//
// Every tensor is row-major. In cuBLAS's column-major terms all GEMMs here are "TN":
//   D [n][m] = B [n][k] . A [m][k]^T      (row-major view; D is m x n column-major)
// so both operands are K-contiguous. For a linear layer (T tokens, K in, N out):
//   fprop  Y  [T][N] = X [T][K] . W^T     A = W  [N][K] BLK128x128, B = X  [T][K] VEC128   (m=N, n=T, k=K)
//   dgrad  dX [T][K] = dY [T][N] . W      A = Wt [K][N] BLK128x128, B = dY [T][N] VEC128   (m=K, n=T, k=N)
//   wgrad  dW [N][K] = dY^T . X           A = Xt [K][T] VEC128,     B = dYt [N][T] VEC128  (m=K, n=N, k=T)
// Block-scaled GEMMs need m and n multiples of 4 and k a multiple of 16 (fp8rl pads the token
// count to a multiple of 128); violations are errors naming the GEMM and its shape.
// (an include guard, not #pragma once: make cuda-check compiles this header as a main file)
#ifndef FP8RL_FP8_GEMM_CUH
#define FP8RL_FP8_GEMM_CUH
#include "cuda/common.cuh"
#include "cuda/device_array.cuh"
#include "cuda/element.cuh"
#include <cublasLt.h>  // in emulation: the same declarations, implemented by cuda/emu/emu_cublaslt.cpp

#include <algorithm>
#include <cstdint>
#include <map>
#include <tuple>

#include "rl/common.h"
#include "rl/numerics/fp8_block.h"

namespace fp8rl {

inline void cublas_check(cublasStatus_t status, const std::string& what) {
#ifdef FP8RL_EMU
    const std::string rule = status != CUBLAS_STATUS_SUCCESS ? ": " + emu::cublaslt_last_error() : "";  // the rule it broke
#else
    const std::string rule;
#endif
    if (status != CUBLAS_STATUS_SUCCESS)
        fail("cuBLASLt error in %s: %s (%d)%s", what.c_str(), cublasLtGetStatusString(status), (int)status, rule.c_str());
}

// ---------------------------------------------------------------------------------------------
// Quantization kernels. One thread block quantizes one 128x128 tile, staged in shared memory as
// FP32 (exact for BF16 and FP32 inputs; 66 KB, so dynamic shared memory above the 48 KB default);
// 256 threads = 8 warps, one warp per row or column.

constexpr int QUANT_THREADS = 256;
inline constexpr int TILE_PITCH = FP8_BLOCK + 1;  // padded row: column reads hit distinct banks
inline constexpr size_t TILE_BYTES = sizeof(float) * FP8_BLOCK * TILE_PITCH;

// Loads tile (tile_r, tile_c) of x [rows][cols] into smem [128][TILE_PITCH]; elements outside x
// are stored as 0, which never changes an amax.
template <class In>
__device__ inline void load_tile(const In* x, int rows, int cols, int tile_r, int tile_c, float* tile) {
    for (int i = threadIdx.x; i < FP8_BLOCK * FP8_BLOCK; i += blockDim.x) {
        int r = tile_r * FP8_BLOCK + i / FP8_BLOCK, c = tile_c * FP8_BLOCK + i % FP8_BLOCK;
        tile[(i / FP8_BLOCK) * TILE_PITCH + i % FP8_BLOCK] =
            (r < rows && c < cols) ? as_float(x[(size_t)r * cols + c]) : 0.0f;
    }
    __syncthreads();
}

__device__ __forceinline__ float warp_amax(float amax) {
    for (int offset = 16; offset > 0; offset /= 2) {
        float other = __shfl_xor_sync(0xFFFFFFFFu, amax, offset);
        amax = other > amax ? other : amax;  // operands are never NaN here (amax_update drops NaN)
    }
    return amax;
}

// Quantizes 128 values of the tile, element e at tile[first + e * stride], as one 1x128 group:
// codes go to out[e] (e < count, the elements inside the tensor); returns scale_inv.
__device__ inline float quantize_group(const float* tile, int first, int stride, int count, bool pow2, uint8_t* out) {
    int lane = threadIdx.x % 32;
    float amax = 0.0f;
    for (int e = lane; e < FP8_BLOCK; e += 32) amax = amax_update(amax, tile[first + e * stride]);
    float scale = fp8_scale_from_amax(warp_amax(amax), pow2);
    for (int e = lane; e < count; e += 32) out[e] = float_to_e4m3(tile[first + e * stride] * scale);
    return 1.0f / scale;
}

// x [rows][cols] -> codes [rows][cols] + scale_inv VEC128 [ceil(cols/128)][rows] (1x128 along cols);
// when codes_t is given, also x^T [cols][rows] quantized 1x128 along rows (the wgrad copy) with
// scale_inv_t VEC128 [ceil(rows/128)][cols], from the same tile in the same pass.
template <class In>
__global__ void __launch_bounds__(QUANT_THREADS)
    quantize_rowwise_kernel(const In* x, int rows, int cols, bool pow2, uint8_t* codes, float* scale_inv,
                            uint8_t* codes_t, float* scale_inv_t) {
    DYNAMIC_SHARED(float, tile);  // [128][TILE_PITCH]
    int tile_c = blockIdx.x, tile_r = blockIdx.y, warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    load_tile(x, rows, cols, tile_r, tile_c, tile);
    int r0 = tile_r * FP8_BLOCK, c0 = tile_c * FP8_BLOCK;
    int n_rows = min(FP8_BLOCK, rows - r0), n_cols = min(FP8_BLOCK, cols - c0);
    for (int i = warp; i < n_rows; i += QUANT_THREADS / 32) {  // row r0 + i, columns c0 ..
        float s = quantize_group(tile, i * TILE_PITCH, 1, n_cols, pow2, codes + (size_t)(r0 + i) * cols + c0);
        if (lane == 0) scale_inv[vec128_scale_index(r0 + i, tile_c, rows)] = s;
    }
    if (codes_t == nullptr) return;
    for (int j = warp; j < n_cols; j += QUANT_THREADS / 32) {  // column c0 + j = row of x^T, rows r0 ..
        float s = quantize_group(tile, j, TILE_PITCH, n_rows, pow2, codes_t + (size_t)(c0 + j) * rows + r0);
        if (lane == 0) scale_inv_t[vec128_scale_index(c0 + j, tile_r, cols)] = s;
    }
}

// w [rows][cols] -> 128x128-block codes [rows][cols] + scale_inv BLK128x128, and the transposed copy
// codes_t [cols][rows] + its transposed grid (the dgrad operand), from the same tile.
template <class In>
__global__ void __launch_bounds__(QUANT_THREADS)
    quantize_blockwise_kernel(const In* w, int rows, int cols, bool pow2, uint8_t* codes, float* scale_inv,
                              uint8_t* codes_t, float* scale_inv_t) {
    DYNAMIC_SHARED(float, tile);  // [128][TILE_PITCH]
    STATIC_SHARED(float, warp_max, [QUANT_THREADS / 32]);
    int tile_c = blockIdx.x, tile_r = blockIdx.y, warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    load_tile(w, rows, cols, tile_r, tile_c, tile);
    float amax = 0.0f;
    for (int i = threadIdx.x; i < FP8_BLOCK * FP8_BLOCK; i += blockDim.x)
        amax = amax_update(amax, tile[(i / FP8_BLOCK) * TILE_PITCH + i % FP8_BLOCK]);
    amax = warp_amax(amax);
    if (lane == 0) warp_max[warp] = amax;
    __syncthreads();
    amax = 0.0f;
    for (int i = 0; i < QUANT_THREADS / 32; i++) amax = amax_update(amax, warp_max[i]);
    float scale = fp8_scale_from_amax(amax, pow2);
    int r0 = tile_r * FP8_BLOCK, c0 = tile_c * FP8_BLOCK;
    int n_rows = min(FP8_BLOCK, rows - r0), n_cols = min(FP8_BLOCK, cols - c0);
    for (int i = threadIdx.x; i < FP8_BLOCK * FP8_BLOCK; i += blockDim.x) {
        int r = i / FP8_BLOCK, c = i % FP8_BLOCK;  // consecutive threads: consecutive columns of w
        if (r < n_rows && c < n_cols) codes[(size_t)(r0 + r) * cols + c0 + c] = float_to_e4m3(tile[r * TILE_PITCH + c] * scale);
        int rt = i % FP8_BLOCK, ct = i / FP8_BLOCK;  // consecutive threads: consecutive columns of w^T
        if (rt < n_rows && ct < n_cols)
            codes_t[(size_t)(c0 + ct) * rows + r0 + rt] = float_to_e4m3(tile[rt * TILE_PITCH + ct] * scale);
    }
    if (threadIdx.x == 0) {
        scale_inv[blk128_scale_index(tile_r, tile_c, cols)] = 1.0f / scale;
        scale_inv_t[blk128_scale_index(tile_c, tile_r, rows)] = 1.0f / scale;
    }
}

// Allows a kernel the dynamic shared memory of one tile (set once per kernel and device).
template <class Kernel>
void allow_tile_smem(Kernel kernel) {
    allow_dynamic_smem(kernel, TILE_BYTES);
}

// Host launchers. Device pointers; sizes as in the kernels' comments (vec128_scale_count,
// blk128_scale_count). codes_t / scale_inv_t may be null for the rowwise quantizer.
template <class In>
void fp8_quantize_rowwise_gpu(const In* x, int rows, int cols, bool pow2, uint8_t* codes, float* scale_inv,
                              uint8_t* codes_t, float* scale_inv_t, cudaStream_t stream) {
    check_fp8_shape("fp8_quantize_rowwise_gpu", rows, cols);
    allow_tile_smem(quantize_rowwise_kernel<In>);
    dim3 grid(fp8_num_blocks(cols), fp8_num_blocks(rows));
    LAUNCH_KERNEL(quantize_rowwise_kernel<In>, grid, QUANT_THREADS, TILE_BYTES, stream, x, rows, cols, pow2, codes, scale_inv,
                  codes_t, scale_inv_t);
}

template <class In>
void fp8_quantize_blockwise_gpu(const In* w, int rows, int cols, bool pow2, uint8_t* codes, float* scale_inv,
                                uint8_t* codes_t, float* scale_inv_t, cudaStream_t stream) {
    check_fp8_shape("fp8_quantize_blockwise_gpu", rows, cols);
    // the grids' padding entries (each row padded to a multiple of 4) are never written by the kernel
    CUDA_CHECK(cudaMemsetAsync(scale_inv, 0, blk128_scale_count(rows, cols) * sizeof(float), stream));
    CUDA_CHECK(cudaMemsetAsync(scale_inv_t, 0, blk128_scale_count(cols, rows) * sizeof(float), stream));
    allow_tile_smem(quantize_blockwise_kernel<In>);
    dim3 grid(fp8_num_blocks(cols), fp8_num_blocks(rows));
    LAUNCH_KERNEL(quantize_blockwise_kernel<In>, grid, QUANT_THREADS, TILE_BYTES, stream, w, rows, cols, pow2, codes,
                  scale_inv, codes_t, scale_inv_t);
}

// The FP8 copy of a projection weight W [rows][cols] (device memory): 128x128-block codes and
// BLK128x128 scale grid for fprop, the transposed codes [cols][rows] and grid for dgrad
// (sizes: blk128_scale_count(rows, cols) and (cols, rows) floats).
struct Fp8WeightCopy {
    uint8_t* codes;
    float* scale_inv;
    uint8_t* codes_t;
    float* scale_inv_t;
    bool pow2_scales;
};

// The FP8 copy of w [rows][cols] (FP32 master, device) quantized again, after an update.
inline void fp8_requantize_weight_gpu(const float* w, int rows, int cols, const Fp8WeightCopy& fp8, cudaStream_t stream) {
    fp8_quantize_blockwise_gpu(w, rows, cols, fp8.pow2_scales, fp8.codes, fp8.scale_inv, fp8.codes_t, fp8.scale_inv_t,
                               stream);
}

// ---------------------------------------------------------------------------------------------
// cuBLASLt GEMMs.

enum class Fp8ScaleMode { VEC128, BLK128x128 };
enum class GemmOut { BF16, F32 };

inline const char* scale_mode_name(Fp8ScaleMode m) { return m == Fp8ScaleMode::VEC128 ? "VEC128" : "BLK128x128"; }

// Operand layouts of a GEMM, row-major, D [n][m] in every case:
//   TN  D = B [n][k] . A [m][k]^T     (cuBLAS TRANSA=T, TRANSB=N; the only one FP8 block scaling allows)
//   NN  D = B [n][k] . A [k][m]       (TRANSA=N, TRANSB=N: a linear layer's BF16 dgrad, dX = dY W)
//   NT  D = B [k][n]^T . A [k][m]     (TRANSA=N, TRANSB=T: a linear layer's BF16 wgrad, dW = dY^T X)
enum class GemmOps { TN, NN, NT };

// The arguments of one cublasLtMatmul in cuBLAS's column-major terms (spec-fp8.md §6.4): D (m x n,
// ldd = m) = op(A) . op(B) (+ D when accumulate: beta = 1), FP32 compute, alpha = 1. With fp8, A and
// B are E4M3 with FP32 dequantization scale tensors in the given modes (layouts: spec-fp8.md §6.5)
// and ops is TN; else they are BF16.
struct GemmCall {
    int m, n, k;
    bool fp8;
    const void *a, *b;
    const float *a_scale, *b_scale;
    Fp8ScaleMode a_mode, b_mode;
    void* d;
    GemmOut out;
    GemmOps ops;
    bool accumulate;
};

// Block-scaled FP8 GEMMs need cuBLASLt >= 12.9 and compute capability 9.x (spec-fp8.md §6.1).
// Returns "" when supported, else the reason.
inline std::string fp8_block_gemm_unsupported_reason(int device) {
    cudaDeviceProp prop;
    CUDA_CHECK(cudaGetDeviceProperties(&prop, device));
    size_t version = cublasLtGetVersion();
    if (version < 120900) return strfmt("cuBLASLt %zu is older than 12.9 (no VEC128/BLK128x128 scaling)", version);
    if (prop.major != 9)
        return strfmt("%s is compute capability %d.%d; cuBLASLt's 128-block FP8 scaling runs only on 9.x (Hopper)",
                      prop.name, prop.major, prop.minor);
    return "";
}

// Owns the cuBLASLt handle, the workspace and one cached plan (descriptors + chosen algorithm) per
// GEMM configuration (shape, modes, types and the operands' pointer alignments), so the heuristic
// query runs once per configuration. The same code runs in emulation (cuda/emu/emu_cublaslt.cpp).
// Batch invariance: a row of D must not depend on how many rows (n, the tokens) are computed with
// it, so a completion decodes the same whatever it is batched with. Two things would break it: a
// split-K algorithm (its parts and their sums follow the shape), excluded by the preference's
// reduction scheme mask; and a different kernel per n, so the first algorithm chosen for a weight
// (m, k and its modes) is pinned for every n (cublasLtMatmulAlgoCheck), the heuristic's own choice
// for n taking over only where cuBLASLt refuses the pinned one.
// One per device; not thread-safe.
class GemmRunner {
  public:
    static constexpr size_t WORKSPACE_BYTES = 32u << 20;  // what cuBLAS and TE use on Hopper

    GemmRunner() {
        cublas_check(cublasLtCreate(&handle_), "cublasLtCreate");
        workspace_.resize(WORKSPACE_BYTES, "cuBLASLt workspace");
    }
    ~GemmRunner() {
        for (auto& kv : plans_) destroy(kv.second);
        cublasLtDestroy(handle_);
    }
    GemmRunner(const GemmRunner&) = delete;
    GemmRunner& operator=(const GemmRunner&) = delete;

    // D [n][m] (+)= B [n][k] . A [m][k]^T with E4M3 operands and FP32 dequantization scales (device
    // pointers, 16-byte aligned) in the given modes; `name` labels error messages. accumulate adds
    // into D (FP32 output only).
    void fp8(const char* name, int m, int n, int k, const uint8_t* a, const float* a_scale, Fp8ScaleMode a_mode,
             const uint8_t* b, const float* b_scale, Fp8ScaleMode b_mode, void* d, GemmOut out, cudaStream_t stream,
             bool accumulate = false) {
        std::string what = strfmt("FP8 GEMM %s (m=%d n=%d k=%d, A %s, B %s)", name, m, n, k, scale_mode_name(a_mode),
                                  scale_mode_name(b_mode));
        if (m % 4 || n % 4 || k % 16)
            fail("%s: block-scaled FP8 GEMMs need m and n multiples of 4 and k a multiple of 16; pad the token count "
                 "to a multiple of 128",
                 what.c_str());
        if (a_mode == Fp8ScaleMode::BLK128x128 && b_mode == Fp8ScaleMode::BLK128x128)
            fail("%s: cuBLASLt has no BLK128x128 x BLK128x128 mode", what.c_str());
        if ((uintptr_t)a_scale % 16 || (uintptr_t)b_scale % 16)
            fail("%s: scale tensors must start on a 16-byte boundary", what.c_str());
        if ((uintptr_t)a % 16 || (uintptr_t)b % 16 || (uintptr_t)d % 16)
            fail("%s: FP8 GEMMs need A, B and D on 16-byte boundaries (A %p, B %p, D %p)", what.c_str(), (const void*)a,
                 (const void*)b, d);
        // D's rows (m elements) must be 16-byte multiples: 8 BF16 values (spec-fp8.md §6.4)
        if (out == GemmOut::BF16 && m % 8)
            fail("%s: an FP8 GEMM with BF16 output needs m a multiple of 8 (16-byte rows of D)", what.c_str());
        check_accumulate(what, out, accumulate);
        run(what, GemmCall{m, n, k, true, a, b, a_scale, b_scale, a_mode, b_mode, d, out, GemmOps::TN, accumulate}, stream);
    }

    // D [n][m] (+)= the product of BF16 operands in the layout `ops` (see GemmOps), FP32 accumulation.
    void bf16(const char* name, int m, int n, int k, const __nv_bfloat16* a, const __nv_bfloat16* b, void* d,
              GemmOut out, cudaStream_t stream, GemmOps ops = GemmOps::TN, bool accumulate = false) {
        const char* op_names[] = {"TN", "NN", "NT"};
        std::string what = strfmt("BF16 GEMM %s (%s, m=%d n=%d k=%d)", name, op_names[(int)ops], m, n, k);
        // every leading dimension a multiple of 8 elements (16-byte rows): lda = k (TN) or m; ldb = k or n (NT)
        if (m % 8 || k % 8 || (ops == GemmOps::NT && n % 8))
            fail("%s: m, k%s must be multiples of 8 (16-byte rows)", what.c_str(), ops == GemmOps::NT ? " and n" : "");
        check_accumulate(what, out, accumulate);
        run(what,
            GemmCall{m, n, k, false, a, b, nullptr, nullptr, Fp8ScaleMode::VEC128, Fp8ScaleMode::VEC128, d, out, ops,
                     accumulate},
            stream);
    }

  private:
    DeviceArray<uint8_t> workspace_;

    static void check_accumulate(const std::string& what, GemmOut out, bool accumulate) {
        if (accumulate && out != GemmOut::F32) fail("%s: accumulating into D needs an FP32 output", what.c_str());
    }

    // m, n, k, fp8, a mode, b mode, out, ops, and the alignments of A, B, D the algorithms were chosen for
    using Key = std::tuple<int, int, int, bool, int, int, int, int, uint32_t, uint32_t, uint32_t>;
    static constexpr int MAX_ALGOS = 4;  // the heuristic's best few, tried in order when one is refused
    struct Plan {
        cublasLtMatmulDesc_t desc = nullptr;
        cublasLtMatrixLayout_t a = nullptr, b = nullptr, d = nullptr;
        cublasLtMatmulHeuristicResult_t algos[MAX_ALGOS];
        int num_algos = 0;
    };

    // The largest power of two (up to 256, cuBLASLt's default assumption) that divides p.
    static uint32_t alignment_of(const void* p) {
        uint32_t a = 256;
        while (a > 1 && (uintptr_t)p % a) a /= 2;
        return a;
    }

    cublasLtHandle_t handle_ = nullptr;
    std::map<Key, Plan> plans_;
    // m, k, fp8, a mode, b mode, out, ops, A's alignment: a weight, whatever n
    using PinKey = std::tuple<int, int, bool, int, int, int, int, uint32_t>;
    std::map<PinKey, cublasLtMatmulAlgo_t> pinned_;

    static void destroy(Plan& p) {
        if (p.d) cublasLtMatrixLayoutDestroy(p.d);
        if (p.b) cublasLtMatrixLayoutDestroy(p.b);
        if (p.a) cublasLtMatrixLayoutDestroy(p.a);
        if (p.desc) cublasLtMatmulDescDestroy(p.desc);
    }

    static void set_desc(cublasLtMatmulDesc_t desc, cublasLtMatmulDescAttributes_t attr, int32_t value,
                         const std::string& what) {
        cublas_check(cublasLtMatmulDescSetAttribute(desc, attr, &value, sizeof(value)), what);
    }

    Plan& get_plan(const std::string& what, const GemmCall& c) {
        const uint32_t align[3] = {alignment_of(c.a), alignment_of(c.b), alignment_of(c.d)};  // A, B, C = D
        Key key{c.m, c.n, c.k, c.fp8, (int)c.a_mode, (int)c.b_mode, (int)c.out, (int)c.ops, align[0], align[1], align[2]};
        auto it = plans_.find(key);
        if (it != plans_.end()) return it->second;
        cudaDataType_t in_type = c.fp8 ? CUDA_R_8F_E4M3 : CUDA_R_16BF;
        cudaDataType_t out_type = c.out == GemmOut::BF16 ? CUDA_R_16BF : CUDA_R_32F;
        Plan p;
        try {
            cublas_check(cublasLtMatmulDescCreate(&p.desc, CUBLAS_COMPUTE_32F, CUDA_R_32F), what + ": descriptor");
            const bool a_t = c.ops == GemmOps::TN, b_t = c.ops == GemmOps::NT;
            set_desc(p.desc, CUBLASLT_MATMUL_DESC_TRANSA, a_t ? CUBLAS_OP_T : CUBLAS_OP_N, what + ": TRANSA");
            set_desc(p.desc, CUBLASLT_MATMUL_DESC_TRANSB, b_t ? CUBLAS_OP_T : CUBLAS_OP_N, what + ": TRANSB");
            if (c.fp8) {
                auto mode = [](Fp8ScaleMode m) {
                    return (int32_t)(m == Fp8ScaleMode::VEC128 ? CUBLASLT_MATMUL_MATRIX_SCALE_VEC128_32F
                                                               : CUBLASLT_MATMUL_MATRIX_SCALE_BLK128x128_32F);
                };
                set_desc(p.desc, CUBLASLT_MATMUL_DESC_A_SCALE_MODE, mode(c.a_mode), what + ": A scale mode");
                set_desc(p.desc, CUBLASLT_MATMUL_DESC_B_SCALE_MODE, mode(c.b_mode), what + ": B scale mode");
                int8_t fast_accum = 0;  // keep tensor-core partial sums promoted to FP32 (spec-fp8.md §6.7)
                cublas_check(cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_FAST_ACCUM, &fast_accum,
                                                            sizeof(fast_accum)),
                             what + ": FAST_ACCUM");
                // the heuristic refuses block modes without scale pointers (NVIDIA's LtBlk128x128Fp8Matmul
                // sets them first); these are the call's own, and run() sets each call's again
                set_scale_pointers(what, p, c);
            }
            // the stored matrices, column-major: A k x m (T) or m x k (N); B k x n (N) or n x k (T)
            if (a_t)
                cublas_check(cublasLtMatrixLayoutCreate(&p.a, in_type, c.k, c.m, c.k), what + ": A layout");
            else
                cublas_check(cublasLtMatrixLayoutCreate(&p.a, in_type, c.m, c.k, c.m), what + ": A layout");
            if (b_t)
                cublas_check(cublasLtMatrixLayoutCreate(&p.b, in_type, c.n, c.k, c.n), what + ": B layout");
            else
                cublas_check(cublasLtMatrixLayoutCreate(&p.b, in_type, c.k, c.n, c.k), what + ": B layout");
            cublas_check(cublasLtMatrixLayoutCreate(&p.d, out_type, c.m, c.n, c.m), what + ": D layout");
            cublasLtMatmulPreference_t pref;
            cublas_check(cublasLtMatmulPreferenceCreate(&pref), what + ": preference");
            size_t ws = WORKSPACE_BYTES;
            cublasStatus_t st = cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                                                     &ws, sizeof(ws));
            // the heuristic assumes 256-byte-aligned operands unless told otherwise; BF16 weight slices are less
            const cublasLtMatmulPreferenceAttributes_t align_attr[4] = {
                CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
                CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES};
            for (int i = 0; i < 4 && st == CUBLAS_STATUS_SUCCESS; i++)
                st = cublasLtMatmulPreferenceSetAttribute(pref, align_attr[i], &align[i < 3 ? i : 2], sizeof(uint32_t));
            const uint32_t no_split_k = CUBLASLT_REDUCTION_SCHEME_NONE;  // batch invariance (above)
            if (st == CUBLAS_STATUS_SUCCESS)
                st = cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_REDUCTION_SCHEME_MASK, &no_split_k,
                                                          sizeof(no_split_k));
            if (st == CUBLAS_STATUS_SUCCESS)
                st = cublasLtMatmulAlgoGetHeuristic(handle_, p.desc, p.a, p.b, p.d, p.d, pref, MAX_ALGOS, p.algos,
                                                    &p.num_algos);
            cublasLtMatmulPreferenceDestroy(pref);
            cublas_check(st, what + ": algorithm heuristic");
            if (p.num_algos == 0) fail("%s: cuBLASLt found no algorithm for this configuration", what.c_str());
            pin_algorithm(PinKey{c.m, c.k, c.fp8, (int)c.a_mode, (int)c.b_mode, (int)c.out, (int)c.ops, align[0]}, p);
        } catch (...) {
            destroy(p);
            throw;
        }
        return plans_.emplace(key, p).first->second;
    }

    // The weight's pinned algorithm goes first in the plan where cuBLASLt accepts it for this shape;
    // a weight's first plan pins its best algorithm.
    void pin_algorithm(const PinKey& key, Plan& p) {
        auto it = pinned_.find(key);
        if (it == pinned_.end()) {
            pinned_.emplace(key, p.algos[0].algo);
            return;
        }
        cublasLtMatmulHeuristicResult_t checked;
        if (cublasLtMatmulAlgoCheck(handle_, p.desc, p.a, p.b, p.d, p.d, &it->second, &checked) != CUBLAS_STATUS_SUCCESS ||
            checked.workspaceSize > WORKSPACE_BYTES)
            return;
        for (int i = std::min(p.num_algos, MAX_ALGOS - 1); i > 0; i--) p.algos[i] = p.algos[i - 1];
        p.algos[0] = checked;
        p.num_algos = std::min(p.num_algos + 1, MAX_ALGOS);
    }

    static void set_scale_pointers(const std::string& what, Plan& p, const GemmCall& c) {
        cublas_check(cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &c.a_scale,
                                                    sizeof(c.a_scale)),
                     what + ": A scale pointer");
        cublas_check(cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &c.b_scale,
                                                    sizeof(c.b_scale)),
                     what + ": B scale pointer");
    }

    // Runs the plan's first algorithm the library accepts for these pointers; an algorithm refused
    // (CUBLAS_STATUS_NOT_SUPPORTED) gives way to the next, and the plan keeps the survivor first.
    void run(const std::string& what, const GemmCall& c, cudaStream_t stream) {
        Plan& p = get_plan(what, c);
        if (c.fp8) set_scale_pointers(what, p, c);
        const float alpha = 1.0f, beta = c.accumulate ? 1.0f : 0.0f;
        cublasStatus_t st = CUBLAS_STATUS_NOT_SUPPORTED;
        int i = 0;
        for (; i < p.num_algos && st == CUBLAS_STATUS_NOT_SUPPORTED; i++)
            st = cublasLtMatmul(handle_, p.desc, &alpha, c.a, p.a, c.b, p.b, &beta, c.d, p.d, c.d, p.d, &p.algos[i].algo,
                                workspace_.get(), WORKSPACE_BYTES, stream);
        cublas_check(st, strfmt("%s: cublasLtMatmul (%d of %d algorithms tried)", what.c_str(), i, p.num_algos));
        if (i > 1) std::swap(p.algos[0], p.algos[i - 1]);
    }
};

}  // namespace fp8rl

#endif  // FP8RL_FP8_GEMM_CUH
