// emu_gemm.h: the emulation backend of GemmRunner (fp8_gemm.cuh). It takes the GemmCall that
// the GPU build hands to cublasLtMatmul and computes what cuBLASLt documents for it
// (spec-fp8.md §6.3, §6.5), on the CPU:
//   D[i,j] (+)= sum_b sA(i,b) sB(j,b) sum_{l in block b} A[i,l] B[l,j]   (FP8, L = ceil(k/128) blocks)
//   D[i,j] (+)= sum_l A[i,l] B[l,j]                                      (BF16)
// with A = op(A) (m x k) and B = op(B) (k x n) read from the stored matrices as GemmOps says.
// Sums are exact in double and rounded once to FP32 (then to BF16 for a BF16 output); the GPU's
// tensor cores accumulate with less precision, so tests compare with tolerances. The scale
// tensors are read with the index formulas of the spec written out here, not with rl/numerics/fp8_block.h,
// so a layout bug there fails a test against this backend. Operands must be device memory.
#pragma once
#include <cmath>
#include <string>
#include <vector>

#include "cuda/emu.h"
#include "rl/common.h"

namespace fp8rl {

inline float emulated_e4m3_value(uint8_t code) {
    static const std::vector<float> table = [] {
        std::vector<float> t(256);
        for (int c = 0; c < 256; c++) t[c] = __half2float(__half(__nv_cvt_fp8_to_halfraw((__nv_fp8_storage_t)c, __NV_E4M3)));
        return t;
    }();
    return table[code];
}

// Dequantization multiplier of (row, k-block kb) of an operand with `rows` rows (m for A, n for B).
inline double emulated_scale(const float* s, Fp8ScaleMode mode, int row, int kb, int rows, int k_blocks) {
    if (mode == Fp8ScaleMode::VEC128) return s[(size_t)kb * rows + row];  // [L][rows], rows contiguous
    int l4 = (k_blocks + 3) / 4 * 4;                                       // BLK128x128: [ceil(rows/128)][L4]
    return s[(size_t)(row / 128) * l4 + kb];
}

inline void emulated_gemm(const std::string& what, const GemmCall c, cudaStream_t stream) {
    size_t in_bytes = c.fp8 ? 1 : 2, out_bytes = c.out == GemmOut::F32 ? 4 : 2;
    int L = (c.k + 127) / 128, L4 = (L + 3) / 4 * 4;
    auto scale_floats = [&](Fp8ScaleMode mode, int rows) {
        return mode == Fp8ScaleMode::VEC128 ? (size_t)L * rows : (size_t)L4 * ((rows + 127) / 128);
    };
    if (c.fp8 && c.ops != GemmOps::TN) fail("%s: block-scaled FP8 GEMMs are TN only", what.c_str());
    bool ok = emu::is_device_memory(c.a, (size_t)c.m * c.k * in_bytes) && emu::is_device_memory(c.b, (size_t)c.n * c.k * in_bytes) &&
              emu::is_device_memory(c.d, (size_t)c.m * c.n * out_bytes);
    if (c.fp8)
        ok = ok && emu::is_device_memory(c.a_scale, scale_floats(c.a_mode, c.m) * sizeof(float)) &&
             emu::is_device_memory(c.b_scale, scale_floats(c.b_mode, c.n) * sizeof(float));
    if (!ok) fail("%s: an operand, scale tensor or D is not (wholly) inside device memory", what.c_str());
    auto compute = [c, L] {
        const uint8_t* a8 = (const uint8_t*)c.a;
        const uint8_t* b8 = (const uint8_t*)c.b;
        const __nv_bfloat16* a16 = (const __nv_bfloat16*)c.a;
        const __nv_bfloat16* b16 = (const __nv_bfloat16*)c.b;
#pragma omp parallel for schedule(static)
        for (int j = 0; j < c.n; j++)
            for (int i = 0; i < c.m; i++) {
                double total = 0;
                for (int kb = 0; kb < L; kb++) {
                    double block = 0;
                    for (int l = kb * 128; l < c.k && l < (kb + 1) * 128; l++) {
                        // column-major stored A: k x m (T: element (l, i)) or m x k (N: (i, l));
                        // B: k x n (N: (l, j)) or n x k (T: (j, l))
                        size_t ai = c.ops == GemmOps::TN ? (size_t)i * c.k + l : (size_t)l * c.m + i;
                        size_t bi = c.ops == GemmOps::NT ? (size_t)l * c.n + j : (size_t)j * c.k + l;
                        block += c.fp8 ? (double)emulated_e4m3_value(a8[ai]) * emulated_e4m3_value(b8[bi])
                                       : (double)__bfloat162float(a16[ai]) * __bfloat162float(b16[bi]);
                    }
                    if (c.fp8)
                        block *= emulated_scale(c.a_scale, c.a_mode, i, kb, c.m, L) * emulated_scale(c.b_scale, c.b_mode, j, kb, c.n, L);
                    total += block;
                }
                size_t di = (size_t)j * c.m + i;
                if (c.out == GemmOut::F32)
                    ((float*)c.d)[di] = c.accumulate ? ((float*)c.d)[di] + (float)total : (float)total;
                else
                    ((__nv_bfloat16*)c.d)[di] = __float2bfloat16_rn((float)total);
            }
    };
    CUDA_CHECK(emu::stream_op(stream, compute));
}

}  // namespace fp8rl
