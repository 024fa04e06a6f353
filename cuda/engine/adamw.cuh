// adamw.cuh: AdamW over the FP32 master weights on the device (llm.c's adamw.cuh in spirit): one
// pass updates w, m and v and writes the BF16 copy of w that the GEMMs read, and for the projection
// weights the FP8 128x128-block copy and its transpose (spec-gpu.md §3.1) from the updated master in
// the same pass (issue 28): a block per 128x128 tile of every projection updates the tile's
// parameters, stages them in shared memory and quantizes them; a flat grid-stride pass updates the
// rest. Two launches per update for the whole model. Bit-exact with rl/objective/adamw.h's AdamW::step given the same
// gradients: the same float operations in the same order, every product unfused (mul_rn), IEEE
// division and square root; the BF16 copy is rl/numerics/bf16.h's rounding, as the CPU engine's.
#ifndef FP8RL_CUDA_ADAMW_CUH
#define FP8RL_CUDA_ADAMW_CUH
#include <cmath>
#include <cstdint>
#include <vector>

#include "fp8_gemm.cuh"
#include "rl/objective/adamw.h"
#include "rl/numerics/bf16.h"

namespace fp8rl {

constexpr int ADAMW_THREADS = 256;
constexpr int ADAMW_MAX_BLOCKS = 4 * 132;  // grid-stride beyond: four blocks per SM of an H200

// The per-step scalars of AdamW::step (rl/objective/adamw.h), computed from the same doubles.
struct AdamWStepScalars {
    float b1, b2, decay, step_size, sqrt_bc2, eps;
};

// t: the step number (1 for the first update), as AdamW::step counts after its increment.
inline AdamWStepScalars adamw_step_scalars(const AdamWConfig& cfg, int64_t t, double lr) {
    const double bc1 = 1.0 - std::pow(cfg.beta1, (double)t);
    const double bc2 = 1.0 - std::pow(cfg.beta2, (double)t);
    return {(float)cfg.beta1, (float)cfg.beta2, (float)(1.0 - lr * cfg.weight_decay), (float)(lr / bc1),
            (float)std::sqrt(bc2), (float)cfg.eps};
}

// Parameter i of w, m, v, g updated, its BF16 copy written; returns the updated w[i].
__device__ __forceinline__ float adamw_element(float* w, float* m, float* v, __nv_bfloat16* w_bf16, const float* g, size_t i,
                                               const AdamWStepScalars& s) {
    const float gi = g[i];
    float wi = mul_rn(w[i], s.decay);
    const float mi = mul_rn(s.b1, m[i]) + mul_rn(1.0f - s.b1, gi);
    const float vi = mul_rn(s.b2, v[i]) + mul_rn(mul_rn(1.0f - s.b2, gi), gi);
    wi = wi - __fdiv_rn(mul_rn(s.step_size, mi), __fdiv_rn(__fsqrt_rn(vi), s.sqrt_bc2) + s.eps);
    w[i] = wi;
    m[i] = mi;
    v[i] = vi;
    if (w_bf16) {  // null: no BF16 copy of these parameters (the engine's one FP8 weight copy)
        __nv_bfloat16_raw rounded;
        rounded.x = float_to_bf16(wi);
        w_bf16[i] = rounded;
    }
    return wi;
}

// Parameters per bit of a projection table's skip mask: every projection starts on a multiple of
// 64 floats (rl/model/weights.h), and the floats after its end up to the next multiple are padding.
constexpr size_t kMaskChunk = 64;

// w, m, v, g [n] FP32; w_bf16 [n] the BF16 copy of the updated w. skip (or null): bit j set when the
// chunk of kMaskChunk parameters from j * kMaskChunk belongs to a projection, which the tile pass updates.
static __global__ void __launch_bounds__(ADAMW_THREADS)
    adamw_kernel(float* w, float* m, float* v, __nv_bfloat16* w_bf16, const float* g, size_t n, AdamWStepScalars s,
                 const uint32_t* skip) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        const size_t chunk = i / kMaskChunk;
        if (skip && (skip[chunk / 32] >> (chunk % 32) & 1u)) continue;
        adamw_element(w, m, v, w_bf16, g, i, s);
    }
}

// One projection weight [rows][cols] at `offset` in the parameter buffer, its FP8 copies, and the
// index of its first tile among all projections' (tiles in row-major order within a projection).
struct ProjectionTiles {
    size_t offset;
    int rows, cols, first_tile;
    Fp8WeightCopy fp8;
};

// Block b: tile b of the projections (table [count], by first_tile). update: AdamW on the tile's
// parameters (as adamw_kernel) before quantizing; else the copies of w as it is.
static __global__ void __launch_bounds__(QUANT_THREADS)
    adamw_projection_tiles_kernel(float* w, float* m, float* v, __nv_bfloat16* w_bf16, const float* g,
                                  const ProjectionTiles* table, int count, AdamWStepScalars s, bool update) {
    DYNAMIC_SHARED(float, tile);  // [128][128], swizzled (fp8_gemm.cuh's tile_chunk)
    STATIC_SHARED(float, warp_max, [QUANT_THREADS / 32]);
    int lo = 0, hi = count - 1;  // the last projection whose first tile is at or before this block
    while (lo < hi) {
        const int mid = (lo + hi + 1) / 2;
        if (table[mid].first_tile <= (int)blockIdx.x) lo = mid;
        else hi = mid - 1;
    }
    const ProjectionTiles p = table[lo];
    const int t = (int)blockIdx.x - p.first_tile, col_tiles = fp8_num_blocks(p.cols);
    const int tile_r = t / col_tiles, tile_c = t % col_tiles, r0 = tile_r * FP8_BLOCK, c0 = tile_c * FP8_BLOCK;
    const int n_rows = min(FP8_BLOCK, p.rows - r0), n_cols = min(FP8_BLOCK, p.cols - c0);
    float amax = 0.0f;
    for (int e = threadIdx.x; e < FP8_BLOCK * FP8_BLOCK; e += blockDim.x) {
        const int r = e / FP8_BLOCK, c = e % FP8_BLOCK;  // consecutive threads: consecutive columns of w
        float x = 0.0f;  // outside the weight: 0, which changes no amax
        if (r < n_rows && c < n_cols) {
            const size_t i = p.offset + (size_t)(r0 + r) * p.cols + c0 + c;
            x = update ? adamw_element(w, m, v, w_bf16, g, i, s) : w[i];
        }
        reinterpret_cast<float*>(tile_chunk(tile, r, c / 4))[c % 4] = x;
        amax = amax_update(amax, x);
    }
    __syncthreads();
    quantize_weight_tile(tile, amax, warp_max, tile_r, tile_c, p.rows, p.cols, p.fp8.pow2_scales, p.fp8.codes,
                         p.fp8.scale_inv, p.fp8.codes_t, p.fp8.scale_inv_t);
}

// The projections of a parameter buffer of n floats, for the tile pass: the table on the device and
// the skip mask of the flat pass. Built once per engine.
class ProjectionTable {
  public:
    ProjectionTable(std::vector<ProjectionTiles> projections, size_t n) : count_((int)projections.size()) {
        std::vector<uint32_t> mask((n / kMaskChunk + 32) / 32, 0u);
        for (ProjectionTiles& p : projections) {
            check_fp8_shape("ProjectionTable", p.rows, p.cols);
            const size_t end = p.offset + (size_t)p.rows * p.cols;
            if (p.offset % kMaskChunk || end > n)
                fail("ProjectionTable: a projection at %zu of %d x %d floats in a buffer of %zu (it must start on %zu)",
                     p.offset, p.rows, p.cols, n, kMaskChunk);
            p.first_tile = tiles_;
            tiles_ += fp8_num_blocks(p.rows) * fp8_num_blocks(p.cols);
            for (size_t c = p.offset / kMaskChunk; c * kMaskChunk < end; c++) mask[c / 32] |= 1u << (c % 32);
        }
        table_.resize(projections.size(), "projection tiles");
        table_.upload(projections);
        mask_.resize(mask.size(), "projection mask");
        mask_.upload(mask);
    }
    const ProjectionTiles* table() const { return table_.get(); }
    const uint32_t* mask() const { return mask_.get(); }
    int count() const { return count_; }
    int tiles() const { return tiles_; }

  private:
    DeviceArray<ProjectionTiles> table_;
    DeviceArray<uint32_t> mask_;
    int count_ = 0, tiles_ = 0;
};

inline void check_adamw(size_t n, int64_t t) {
    if (n == 0) fail("adamw_update_gpu: the tensor has no elements");
    if (t < 1) fail("adamw_update_gpu: step number %lld must be >= 1", (long long)t);
}

inline void launch_adamw_flat(float* w, float* m, float* v, __nv_bfloat16* w_bf16, const float* g, size_t n,
                              const AdamWStepScalars& s, const uint32_t* skip, cudaStream_t stream) {
    const size_t blocks = (n + ADAMW_THREADS - 1) / ADAMW_THREADS;
    const int grid = blocks < (size_t)ADAMW_MAX_BLOCKS ? (int)blocks : ADAMW_MAX_BLOCKS;
    LAUNCH_KERNEL(adamw_kernel, grid, ADAMW_THREADS, 0, stream, w, m, v, w_bf16, g, n, s, skip);
}

inline void launch_projection_tiles(float* w, float* m, float* v, __nv_bfloat16* w_bf16, const float* g,
                                    const ProjectionTable& p, const AdamWStepScalars& s, bool update, cudaStream_t stream) {
    if (p.count() == 0) return;
    allow_tile_smem(adamw_projection_tiles_kernel);
    LAUNCH_KERNEL(adamw_projection_tiles_kernel, (unsigned)p.tiles(), QUANT_THREADS, TILE_BYTES, stream, w, m, v, w_bf16, g,
                  p.table(), p.count(), s, update);
}

// One AdamW update of w [n] (device pointers; m, v the moments, w_bf16 the BF16 copy) with
// gradient g at learning rate lr; t is the step number, 1 for the first update.
inline void adamw_update_gpu(float* w, float* m, float* v, __nv_bfloat16* w_bf16, const float* g, size_t n,
                             const AdamWConfig& cfg, int64_t t, double lr, cudaStream_t stream) {
    check_adamw(n, t);
    launch_adamw_flat(w, m, v, w_bf16, g, n, adamw_step_scalars(cfg, t, lr), nullptr, stream);
}

// The same update of a whole parameter buffer w [n] with the FP8 copies of its projections (p)
// written from the updated master in the same pass, as the CPU engine's fp8_quantize_weight does
// from its master.
inline void adamw_update_with_fp8_gpu(float* w, float* m, float* v, __nv_bfloat16* w_bf16, const float* g, size_t n,
                                      const ProjectionTable& p, const AdamWConfig& cfg, int64_t t, double lr,
                                      cudaStream_t stream) {
    check_adamw(n, t);
    const AdamWStepScalars s = adamw_step_scalars(cfg, t, lr);
    launch_adamw_flat(w, m, v, w_bf16, g, n, s, p.mask(), stream);
    launch_projection_tiles(w, m, v, w_bf16, g, p, s, true, stream);
}

// The FP8 copies of the projections of w (FP32 master, device) without an update: after a load or a
// ZeRO-1 gather.
inline void requantize_projections_gpu(const float* w, const ProjectionTable& p, cudaStream_t stream) {
    launch_projection_tiles(const_cast<float*>(w), nullptr, nullptr, nullptr, nullptr, p, AdamWStepScalars{}, false, stream);
}

}  // namespace fp8rl

#endif  // FP8RL_CUDA_ADAMW_CUH
