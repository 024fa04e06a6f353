// gemm.h: FP32 matrix multiply on the CPU, the workhorse of the CPU engine. Row-major, with
// leading dimensions.
//   gemm_nt: C[M,N] (+)= A[M,K] . B[N,K]^T   (linear fprop: Y = X W^T)
//   gemm_nn: C[M,N] (+)= A[M,K] . B[K,N]     (linear dgrad: dX = dY W)
//   gemm_tn: C[M,N] (+)= A[K,M]^T . B[K,N]   (linear wgrad: dW = dY^T X)
//   gemm_nt_packed: gemm_nt with B a weight packed once per update (pack_weight)
//
// Rounding contract: every output element is one chain of fused multiply-adds over k = 0..K-1 in
// order, starting from 0 (or from the old C when `accumulate`). Threads split only the output, and
// every code path below (packed blocks, edge tiles, the small-M path) computes that same chain, so
// results are bitwise identical for any thread count, and a row of C does not depend on the other
// rows of A (a sequence's logits do not depend on what else is in the batch).
//
// Speed (AVX2 + FMA): the BLIS scheme. B is packed in [KC x 16] panels, A in [6 x KC] panels, and a
// 6x16 register-tiled micro-kernel (12 accumulators) multiplies them; threads take (96-row block x
// 64-column slab) tasks. A packed weight is already in B's panel layout, so the micro-kernel reads
// it in place. With few rows (decode, M <= 4) packing all of B costs more than it saves:
// gemm_nn/gemm_tn stream the rows of B into C's rows; gemm_nt packs small L1-resident panels of B
// and keeps 8 accumulator chains in registers; gemm_nt_packed keeps a tile of C in registers over
// all of K and streams each thread's panels contiguously. Without AVX2 scalar code computes the
// same chains.
#pragma once
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>
#ifdef __AVX2__
#include <immintrin.h>
#endif
#include <omp.h>

namespace fp8rl {
namespace gemm_detail {

constexpr int MR = 6;          // micro-tile rows
constexpr int NR = 16;         // micro-tile columns (two AVX vectors)
constexpr int KC = 512;        // k block: one B micro-panel is 32 KB (measured: 512 beats 256 and 384 by 15-30%)
constexpr int MC = 96;         // row block: one packed A block (192 KB) stays in L2
constexpr int NC = 3072;       // column block: the packed B block (6 MB) stays in L3
constexpr int C_PREFETCH_PANELS = 2;  // how far ahead a tile prefetches the C lines it will write
constexpr int SLAB = 4 * NR;   // columns per task, about (rounded to equal shares per thread)
constexpr int DIRECT_ROWS = 4; // M up to this takes a small-M path
constexpr long PARALLEL_MIN_FLOPS = 1L << 18;  // below this a parallel region costs more than it saves

// A strided matrix view: element (r, c) is p[r * rs + c * cs].
struct View {
    const float* p;
    long rs, cs;
    float at(long r, long c) const { return p[r * rs + c * cs]; }
};

#ifdef __AVX2__
// In-place transpose of 8 rows of 8 floats.
inline void transpose8x8(__m256 r[8]) {
    __m256 t[8], u[8];
    for (int i = 0; i < 4; i++) {
        t[2 * i] = _mm256_unpacklo_ps(r[2 * i], r[2 * i + 1]);
        t[2 * i + 1] = _mm256_unpackhi_ps(r[2 * i], r[2 * i + 1]);
    }
    for (int i = 0; i < 2; i++) {
        u[4 * i + 0] = _mm256_shuffle_ps(t[4 * i], t[4 * i + 2], _MM_SHUFFLE(1, 0, 1, 0));
        u[4 * i + 1] = _mm256_shuffle_ps(t[4 * i], t[4 * i + 2], _MM_SHUFFLE(3, 2, 3, 2));
        u[4 * i + 2] = _mm256_shuffle_ps(t[4 * i + 1], t[4 * i + 3], _MM_SHUFFLE(1, 0, 1, 0));
        u[4 * i + 3] = _mm256_shuffle_ps(t[4 * i + 1], t[4 * i + 3], _MM_SHUFFLE(3, 2, 3, 2));
    }
    for (int i = 0; i < 4; i++) {
        r[i] = _mm256_permute2f128_ps(u[i], u[i + 4], 0x20);
        r[i + 4] = _mm256_permute2f128_ps(u[i], u[i + 4], 0x31);
    }
}

// Columns j0..j0+7 of rows k0..k0+7 of a view with rs == 1 (B of gemm_nt), as 8 vectors indexed
// by k: out[kk][c] = b(k0 + kk, j0 + c).
inline void load_transposed8x8(const View& b, long k0, long j0, __m256 out[8]) {
    for (int c = 0; c < 8; c++) out[c] = _mm256_loadu_ps(b.p + (j0 + c) * b.cs + k0);
    transpose8x8(out);
}
#endif

// Packs rows i0..i0+rows-1 (rows <= MR) and k0..k0+kc-1 of A as dst[k][MR], zero-padded. dst
// has 2 floats to spare past dst[kc][0]: the vector path writes 8 floats per k, in increasing k.
inline void pack_a(const View& a, long i0, int rows, long k0, int kc, float* dst) {
    int k = 0;
#ifdef __AVX2__
    if (rows == MR && a.cs == 1)  // A rows: 8 k of each row, transposed in registers
        for (; k + 8 <= kc; k += 8) {
            __m256 t[8];
            for (int r = 0; r < 8; r++)
                t[r] = r < MR ? _mm256_loadu_ps(a.p + (i0 + r) * a.rs + k0 + k) : _mm256_setzero_ps();
            transpose8x8(t);
            for (int kk = 0; kk < 8; kk++) _mm256_storeu_ps(dst + (k + kk) * MR, t[kk]);
        }
    if (rows == MR && a.rs == 1) {  // A columns (a transposed operand): MR consecutive floats per k
        const __m256i first_mr = _mm256_setr_epi32(-1, -1, -1, -1, -1, -1, 0, 0);
        for (; k < kc; k++) _mm256_storeu_ps(dst + k * MR, _mm256_maskload_ps(a.p + (k0 + k) * a.cs + i0, first_mr));
    }
#endif
    for (; k < kc; k++)
        for (int r = 0; r < MR; r++) dst[k * MR + r] = r < rows ? a.at(i0 + r, k0 + k) : 0.0f;
}

// Packs k0..k0+kc-1 and columns j0..j0+cols-1 of B as dst[k][width], zero-padded (cols <= width,
// width a multiple of 8).
inline void pack_b(const View& b, long k0, int kc, long j0, int cols, int width, float* dst) {
    int k = 0;
#ifdef __AVX2__
    if (cols == width && b.cs == 1) {
        for (; k < kc; k++)
            for (int c = 0; c < width; c += 8)
                _mm256_storeu_ps(dst + k * width + c, _mm256_loadu_ps(b.p + (k0 + k) * b.rs + j0 + c));
    } else if (cols == width && b.rs == 1) {
        for (; k + 8 <= kc; k += 8)
            for (int c = 0; c < width; c += 8) {
                __m256 t[8];
                load_transposed8x8(b, k0 + k, j0 + c, t);
                for (int kk = 0; kk < 8; kk++) _mm256_storeu_ps(dst + (k + kk) * width + c, t[kk]);
            }
    }
#endif
    for (; k < kc; k++)
        for (int c = 0; c < width; c++) dst[k * width + c] = c < cols ? b.at(k0 + k, j0 + c) : 0.0f;
}

// c[MR x NR] (row stride ldc) = (load_c ? c : 0) + Ap . Bp, one FMA chain per element in k order.
inline void micro_kernel(int kc, const float* ap, const float* bp, float* c, long ldc, bool load_c) {
#ifdef __AVX2__
    // Twelve named accumulators: an array here is not kept in registers by g++ (it spills each step).
    static_assert(MR == 6 && NR == 16, "the AVX2 micro-kernel is written for 6x16 tiles");
    __m256 c00, c01, c10, c11, c20, c21, c30, c31, c40, c41, c50, c51;
    if (load_c) {
        c00 = _mm256_loadu_ps(c), c01 = _mm256_loadu_ps(c + 8);
        c10 = _mm256_loadu_ps(c + ldc), c11 = _mm256_loadu_ps(c + ldc + 8);
        c20 = _mm256_loadu_ps(c + 2 * ldc), c21 = _mm256_loadu_ps(c + 2 * ldc + 8);
        c30 = _mm256_loadu_ps(c + 3 * ldc), c31 = _mm256_loadu_ps(c + 3 * ldc + 8);
        c40 = _mm256_loadu_ps(c + 4 * ldc), c41 = _mm256_loadu_ps(c + 4 * ldc + 8);
        c50 = _mm256_loadu_ps(c + 5 * ldc), c51 = _mm256_loadu_ps(c + 5 * ldc + 8);
    } else {
        c00 = c01 = c10 = c11 = c20 = c21 = c30 = c31 = c40 = c41 = c50 = c51 = _mm256_setzero_ps();
    }
#pragma GCC unroll 4  // measured: 72 -> 85 GFLOP/s per core on an L1-resident panel (Zen 3, peak 90)
    for (int k = 0; k < kc; k++, ap += MR, bp += NR) {
        const __m256 b0 = _mm256_loadu_ps(bp), b1 = _mm256_loadu_ps(bp + 8);
        __m256 a = _mm256_broadcast_ss(ap);
        c00 = _mm256_fmadd_ps(a, b0, c00), c01 = _mm256_fmadd_ps(a, b1, c01);
        a = _mm256_broadcast_ss(ap + 1);
        c10 = _mm256_fmadd_ps(a, b0, c10), c11 = _mm256_fmadd_ps(a, b1, c11);
        a = _mm256_broadcast_ss(ap + 2);
        c20 = _mm256_fmadd_ps(a, b0, c20), c21 = _mm256_fmadd_ps(a, b1, c21);
        a = _mm256_broadcast_ss(ap + 3);
        c30 = _mm256_fmadd_ps(a, b0, c30), c31 = _mm256_fmadd_ps(a, b1, c31);
        a = _mm256_broadcast_ss(ap + 4);
        c40 = _mm256_fmadd_ps(a, b0, c40), c41 = _mm256_fmadd_ps(a, b1, c41);
        a = _mm256_broadcast_ss(ap + 5);
        c50 = _mm256_fmadd_ps(a, b0, c50), c51 = _mm256_fmadd_ps(a, b1, c51);
    }
    _mm256_storeu_ps(c, c00), _mm256_storeu_ps(c + 8, c01);
    _mm256_storeu_ps(c + ldc, c10), _mm256_storeu_ps(c + ldc + 8, c11);
    _mm256_storeu_ps(c + 2 * ldc, c20), _mm256_storeu_ps(c + 2 * ldc + 8, c21);
    _mm256_storeu_ps(c + 3 * ldc, c30), _mm256_storeu_ps(c + 3 * ldc + 8, c31);
    _mm256_storeu_ps(c + 4 * ldc, c40), _mm256_storeu_ps(c + 4 * ldc + 8, c41);
    _mm256_storeu_ps(c + 5 * ldc, c50), _mm256_storeu_ps(c + 5 * ldc + 8, c51);
#else
    float acc[MR][NR];
    for (int r = 0; r < MR; r++)
        for (int j = 0; j < NR; j++) acc[r][j] = load_c ? c[r * ldc + j] : 0.0f;
    for (int k = 0; k < kc; k++)
        for (int r = 0; r < MR; r++)
            for (int j = 0; j < NR; j++) acc[r][j] = std::fma(ap[k * MR + r], bp[k * NR + j], acc[r][j]);
    for (int r = 0; r < MR; r++)
        for (int j = 0; j < NR; j++) c[r * ldc + j] = acc[r][j];
#endif
}

// One micro-tile of C at (i0, j0) with rows x cols valid entries; edge tiles go through a buffer.
inline void tile(int kc, const float* ap, const float* bp, float* C, long ldc, long i0, long j0, int rows, int cols,
                 bool load_c) {
    float* c = C + i0 * ldc + j0;
    if (rows == MR && cols == NR) {
        micro_kernel(kc, ap, bp, c, ldc, load_c);
        return;
    }
    float buf[MR * NR] = {};
    if (load_c)
        for (int r = 0; r < rows; r++) std::copy(c + r * ldc, c + r * ldc + cols, buf + r * NR);
    micro_kernel(kc, ap, bp, buf, NR, load_c);
    for (int r = 0; r < rows; r++) std::copy(buf + r * NR, buf + r * NR + cols, c + r * ldc);
}

// Part `part` of `parts` of floats p[0..n) fetched into L2, e.g. a packed weight's next panel
// while the tiles of this one run from L1 (a weight read once per call comes from memory).
inline void prefetch_part(const float* p, long n, int part, int parts) {
    const long bytes = n * (long)sizeof(float);
    for (long o = bytes * part / parts / 64 * 64; o < bytes * (part + 1) / parts; o += 64)
        __builtin_prefetch((const char*)p + o, 0, 2);
}

// The C lines a tile C_PREFETCH_PANELS panels to the right will write, fetched for writing: a
// tile's rows are ldc apart, too many streams for the hardware prefetcher, and a wide C (the
// logits of a batch over the vocabulary) otherwise waits on memory at every store (measured on
// the 64 x 32000 x 288 head: ~106 -> 121-127 GFLOP/s; distances 1, 4 and 8 did no better).
inline void prefetch_c_rows(const float* c, long ldc, int rows) {
    for (int r = 0; r < rows; r++) __builtin_prefetch(c + r * ldc, 1, 3);
}

// 64 bytes past p, rounded up to 64-byte alignment (a buffer allocated with 16 floats to spare):
// no 32-byte load of a B micro-panel row then straddles two cache lines.
template <class Float>
inline Float* align64(Float* p) {
    return p + (16 - ((uintptr_t)p / sizeof(float)) % 16) % 16;
}

// The packed path: C[M,N] (+)= a(i,k) . b(k,j). With `prepacked` (B already in pack_weight's
// layout, panels of NR columns over all of K) the micro-kernel reads it in place.
inline void gemm_packed(int M, int N, int K, const View& a, const View& b, float* C, long ldc, bool accumulate,
                        const float* prepacked = nullptr) {
    thread_local std::vector<float> bpack;  // the caller's packed B block, shared with its workers
    if (!prepacked) bpack.resize((size_t)KC * NC + 16);
    float* const bp = prepacked ? nullptr : align64(bpack.data());
    [[maybe_unused]] const bool parallel = (long)M * N * K * 2 >= PARALLEL_MIN_FLOPS;  // read by OpenMP if() clauses only
    // Column blocks keep a block of B in L3 while every row block passes over it; a prepacked B
    // under a single row block (decode of a batch) is read once anyway, and one block means one
    // parallel region and one contiguous run of panels per thread.
    const int block_cols = prepacked && M <= MC ? N : NC;
    for (int jc = 0; jc < N; jc += block_cols) {
        const int nc = std::min(block_cols, N - jc), panels = (nc + NR - 1) / NR;
        const int mblocks = (M + MC - 1) / MC;
        for (int pc = 0; pc < K; pc += KC) {
            const int kc = std::min(KC, K - pc);
            const bool load_c = accumulate || pc > 0;
            // micro-panel p of this block: [kc x NR], rows NR floats apart either way
            auto panel = [&](int p) {
                return prepacked ? prepacked + ((long)jc / NR + p) * K * NR + (long)pc * NR : bp + (long)p * kc * NR;
            };
#pragma omp parallel if (parallel)
            {
                if (!prepacked) {
#pragma omp for schedule(static)
                    for (int p = 0; p < panels; p++)
                        pack_b(b, pc, kc, jc + (long)p * NR, std::min(NR, nc - p * NR), NR, bp + (long)p * kc * NR);
                }
                thread_local std::vector<float> apack;
                apack.resize((size_t)MC * KC + 2);  // + pack_a's spare
                int packed_block = -1;  // the row block this thread's apack holds
                // a multiple of the thread count, so threads get equal shares when there are few row
                // blocks (decode of a batch: one); slab s covers panels [panels s / slabs, panels (s + 1) / slabs)
                const int threads = omp_get_num_threads();
                const int slabs = ((nc + SLAB - 1) / SLAB + threads - 1) / threads * threads;
#pragma omp for schedule(static)
                for (int task = 0; task < mblocks * slabs; task++) {
                    const int ib = task / slabs, slab = task % slabs;
                    const int i0 = ib * MC, mc = std::min(MC, M - i0);
                    if (ib != packed_block) {
                        for (int ir = 0; ir < mc; ir += MR)
                            pack_a(a, i0 + ir, std::min(MR, mc - ir), pc, kc, apack.data() + (long)ir * kc);
                        packed_block = ib;
                    }
                    const int j_end = panels * (slab + 1) / slabs * NR;
                    for (int jr = panels * slab / slabs * NR; jr < j_end; jr += NR)
                        for (int ir = 0; ir < mc; ir += MR) {
                            if (prepacked && jr + NR < nc)
                                prefetch_part(panel(jr / NR + 1), (long)kc * NR, ir / MR, (mc + MR - 1) / MR);
                            if (jr + C_PREFETCH_PANELS * NR < j_end)
                                prefetch_c_rows(C + (i0 + ir) * ldc + jc + jr + C_PREFETCH_PANELS * NR, ldc,
                                                std::min(MR, mc - ir));
                            tile(kc, apack.data() + (long)ir * kc, panel(jr / NR), C, ldc, i0 + ir, jc + jr,
                                 std::min(MR, mc - ir), std::min(NR, nc - jr), load_c);
                        }
                }
            }
        }
    }
}

#ifdef __AVX2__
// ROWS x (8 VECS) accumulators of the small-M paths from C at column j0 (cols valid; the rest and
// all of it without `accumulate` start at 0), and back into C's valid columns.
template <int ROWS, int VECS>
inline void load_acc(__m256 (&acc)[ROWS][VECS], const float* C, long ldc, long j0, int cols, bool accumulate) {
    for (int r = 0; r < ROWS; r++)
        for (int v = 0; v < VECS; v++) {
            float init[8] = {};
            for (int c = 0; c < 8 && 8 * v + c < cols; c++) init[c] = accumulate ? C[r * ldc + j0 + 8 * v + c] : 0.0f;
            acc[r][v] = _mm256_loadu_ps(init);
        }
}

template <int ROWS, int VECS>
inline void store_acc(const __m256 (&acc)[ROWS][VECS], float* C, long ldc, long j0, int cols) {
    for (int r = 0; r < ROWS; r++) {
        float out[8 * VECS];
        for (int v = 0; v < VECS; v++) _mm256_storeu_ps(out + 8 * v, acc[r][v]);
        std::copy(out, out + cols, C + r * ldc + j0);
    }
}

// The small-M path of gemm_nt (M = ROWS <= DIRECT_ROWS), one block of 8 * VECS columns at j0 (cols
// valid): ROWS * VECS independent accumulator chains, enough to hide the FMA latency, fed from
// DIRECT_KB rows of B at a time packed into `buf` [DIRECT_KB x 8 * VECS], which stays in L1.
constexpr int DIRECT_KB = 64;
template <int ROWS, int VECS>
inline void direct_block(int K, const View& a, const View& b, float* C, long ldc, long j0, int cols, bool accumulate,
                         float* buf) {
    constexpr int W = 8 * VECS;
    __m256 acc[ROWS][VECS];
    load_acc(acc, C, ldc, j0, cols, accumulate);
    for (long k0 = 0; k0 < K; k0 += DIRECT_KB) {
        const int kb = (int)std::min<long>(DIRECT_KB, K - k0);
        pack_b(b, k0, kb, j0, cols, W, buf);
        for (int k = 0; k < kb; k++)
            for (int r = 0; r < ROWS; r++) {
                const __m256 x = _mm256_set1_ps(a.at(r, k0 + k));
                for (int v = 0; v < VECS; v++)
                    acc[r][v] = _mm256_fmadd_ps(x, _mm256_loadu_ps(buf + k * W + 8 * v), acc[r][v]);
            }
    }
    store_acc(acc, C, ldc, j0, cols);
}

template <int ROWS>
inline void gemm_direct(int N, int K, const View& a, const View& b, float* C, long ldc, bool accumulate) {
    constexpr int VECS = ROWS == 1 ? 8 : ROWS == 2 ? 4 : 2, W = 8 * VECS;
    const int blocks = (N + W - 1) / W;
#pragma omp parallel if ((long)ROWS * N * K * 2 >= PARALLEL_MIN_FLOPS)
    {
        alignas(32) float buf[DIRECT_KB * W];
#pragma omp for schedule(static)
        for (int jb = 0; jb < blocks; jb++)
            direct_block<ROWS, VECS>(K, a, b, C, ldc, (long)jb * W, std::min(W, N - jb * W), accumulate, buf);
    }
}
#endif

// The small-M path of gemm_nn and gemm_tn (rows of B contiguous): C's rows are the accumulators,
// updated by one pass over the rows of B per chunk of columns, C[r, j] = fma(a(r, k), B[k, j],
// C[r, j]) for k in order, four rows of B at a time so that C is loaded and stored once per four
// FMAs. B streams in long contiguous runs (the bandwidth a GEMV needs; short runs restart the
// prefetcher at every page) and the chunk of C (STREAM_FLOATS) stays in L2.
constexpr int STREAM_FLOATS = 32768;
constexpr int STREAM_ROWS = 4;
inline void stream_columns(int M, int K, const View& a, const View& b, float* C, long ldc, long j0, int cols,
                           bool accumulate) {
    if (!accumulate)
        for (int r = 0; r < M; r++) std::fill(C + r * ldc + j0, C + r * ldc + j0 + cols, 0.0f);
    for (long k0 = 0; k0 < K; k0 += STREAM_ROWS) {
        const int rows = (int)std::min<long>(STREAM_ROWS, K - k0);
        const float* brow[STREAM_ROWS];
        for (int i = 0; i < rows; i++) brow[i] = b.p + (k0 + i) * b.rs + j0;
        for (int r = 0; r < M; r++) {
            float x[STREAM_ROWS];
            for (int i = 0; i < rows; i++) x[i] = a.at(r, k0 + i);
            float* c = C + r * ldc + j0;
            int j = 0;
#ifdef __AVX2__
            if (rows == STREAM_ROWS) {
                const __m256 x0 = _mm256_set1_ps(x[0]), x1 = _mm256_set1_ps(x[1]), x2 = _mm256_set1_ps(x[2]),
                             x3 = _mm256_set1_ps(x[3]);
                for (; j + 8 <= cols; j += 8) {
                    __m256 v = _mm256_loadu_ps(c + j);
                    v = _mm256_fmadd_ps(x0, _mm256_loadu_ps(brow[0] + j), v);
                    v = _mm256_fmadd_ps(x1, _mm256_loadu_ps(brow[1] + j), v);
                    v = _mm256_fmadd_ps(x2, _mm256_loadu_ps(brow[2] + j), v);
                    v = _mm256_fmadd_ps(x3, _mm256_loadu_ps(brow[3] + j), v);
                    _mm256_storeu_ps(c + j, v);
                }
            }
#endif
            for (; j < cols; j++) {
                float v = c[j];
                for (int i = 0; i < rows; i++) v = std::fma(x[i], brow[i][j], v);
                c[j] = v;
            }
        }
    }
}

inline void gemm_stream(int M, int N, int K, const View& a, const View& b, float* C, long ldc, bool accumulate) {
    [[maybe_unused]] const bool parallel = (long)M * N * K * 2 >= PARALLEL_MIN_FLOPS;  // read by OpenMP if() clauses only
    // chunks of whole cache lines, at least one per thread when worth threading
    const int per_thread = parallel ? (N + omp_get_max_threads() - 1) / omp_get_max_threads() : N;
    const int chunk = std::min(STREAM_FLOATS / M, std::max(16, (per_thread + 15) / 16 * 16));
    const int chunks = (N + chunk - 1) / chunk;
#pragma omp parallel for schedule(static) if (parallel)
    for (int cb = 0; cb < chunks; cb++)
        stream_columns(M, K, a, b, C, ldc, (long)cb * chunk, std::min(chunk, N - cb * chunk), accumulate);
}

// The small-M path of gemm_nt on a packed weight: C's tile of ROWS rows x G panels (8 * 2G
// columns at j0, cols valid) stays in registers over all of K, fed by G contiguous streams of
// panel rows. Used for decode, where the weight comes from memory once per step: each thread reads
// one contiguous run of panels.
template <int ROWS, int G>
inline void panel_block(int K, const View& a, const float* wp, float* C, long ldc, long j0, int cols,
                        bool accumulate) {
    const long panel = (long)K * NR;
#ifdef __AVX2__
    __m256 acc[ROWS][2 * G];
    load_acc(acc, C, ldc, j0, cols, accumulate);
    for (int k = 0; k < K; k++)
        for (int r = 0; r < ROWS; r++) {
            const __m256 x = _mm256_set1_ps(a.at(r, k));
            for (int g = 0; g < G; g++) {
                const float* w = wp + g * panel + (long)k * NR;
                acc[r][2 * g] = _mm256_fmadd_ps(x, _mm256_loadu_ps(w), acc[r][2 * g]);
                acc[r][2 * g + 1] = _mm256_fmadd_ps(x, _mm256_loadu_ps(w + 8), acc[r][2 * g + 1]);
            }
        }
    store_acc(acc, C, ldc, j0, cols);
#else
    for (int r = 0; r < ROWS; r++)
        for (int j = 0; j < cols; j++) {
            float acc = accumulate ? C[r * ldc + j0 + j] : 0.0f;
            const float* w = wp + j / NR * panel + j % NR;
            for (int k = 0; k < K; k++) acc = std::fma(a.at(r, k), w[(long)k * NR], acc);
            C[r * ldc + j0 + j] = acc;
        }
#endif
}

// C[ROWS, N] (+)= a . W^T from W packed: each thread takes a contiguous run of panels (so every
// column's chain is the same for any thread count), G panels at a time.
template <int ROWS>
inline void gemm_panels(int N, int K, const View& a, const float* wp, float* C, long ldc, bool accumulate) {
    constexpr int G = ROWS == 1 ? 4 : ROWS <= 3 ? 2 : 1;  // 8-12 accumulators: enough chains to hide FMA latency
    const int panels = (N + NR - 1) / NR;
#pragma omp parallel if ((long)ROWS * N * K * 2 >= PARALLEL_MIN_FLOPS)
    {
        const int threads = omp_get_num_threads(), t = omp_get_thread_num();
        const int begin = (int)((long)panels * t / threads), end = (int)((long)panels * (t + 1) / threads);
        int p = begin;
        for (; p + G <= end; p += G)
            panel_block<ROWS, G>(K, a, wp + (long)p * K * NR, C, ldc, (long)p * NR, std::min(G * NR, N - p * NR),
                                 accumulate);
        for (; p < end; p++)
            panel_block<ROWS, 1>(K, a, wp + (long)p * K * NR, C, ldc, (long)p * NR, std::min(NR, N - p * NR),
                                 accumulate);
    }
}

inline void gemm(int M, int N, int K, const View& a, const View& b, float* C, long ldc, bool accumulate) {
    if (M <= 0 || N <= 0) return;
    if (K <= 0) {
        if (!accumulate)
            for (int i = 0; i < M; i++) std::fill(C + i * ldc, C + i * ldc + N, 0.0f);
        return;
    }
    if (M <= DIRECT_ROWS && b.cs == 1) return gemm_stream(M, N, K, a, b, C, ldc, accumulate);
#ifdef __AVX2__
    switch (M) {
        case 1: return gemm_direct<1>(N, K, a, b, C, ldc, accumulate);
        case 2: return gemm_direct<2>(N, K, a, b, C, ldc, accumulate);
        case 3: return gemm_direct<3>(N, K, a, b, C, ldc, accumulate);
        case 4: return gemm_direct<4>(N, K, a, b, C, ldc, accumulate);
    }
    static_assert(DIRECT_ROWS == 4, "the switch above covers 1..DIRECT_ROWS");
#endif
    gemm_packed(M, N, K, a, b, C, ldc, accumulate);
}

}  // namespace gemm_detail

inline void gemm_nt(int M, int N, int K, const float* A, int lda, const float* B, int ldb, float* C, int ldc,
                    bool accumulate) {
    gemm_detail::gemm(M, N, K, {A, lda, 1}, {B, 1, ldb}, C, ldc, accumulate);
}

// A weight W [N, K] packed for gemm_nt_packed: panels of NR rows of W, each stored k-major, as
// wp[panel][k][c] = W[panel * NR + c][k], the last panel zero-padded: the layout the packed path
// packs B into, made once per weight update instead of once per call.
inline long packed_weight_floats(int N, int K) {
    using gemm_detail::NR;
    return (long)(N + NR - 1) / NR * NR * K;
}

inline void pack_weight(const float* W, int N, int K, float* wp) {
    using namespace gemm_detail;
    const int panels = (N + NR - 1) / NR;
#pragma omp parallel for schedule(static)
    for (int p = 0; p < panels; p++)
        pack_b({W, 1, K}, 0, K, (long)p * NR, std::min(NR, N - p * NR), NR, wp + (long)p * K * NR);
}

// The packed weight's rows row0.. (row0 a multiple of NR: panels start there), e.g. one vocabulary
// chunk of the head.
inline const float* packed_weight_rows(const float* wp, int K, long row0) { return wp + row0 * K; }

// C[M,N] (+)= A[M,K] . W^T with W packed (pack_weight): the same bits as gemm_nt on W.
inline void gemm_nt_packed(int M, int N, int K, const float* A, int lda, const float* wp, float* C, int ldc,
                           bool accumulate) {
    using namespace gemm_detail;
    if (M <= 0 || N <= 0) return;
    const View a{A, lda, 1};
    if (K <= 0) return gemm(M, N, K, a, {wp, 1, 1}, C, ldc, accumulate);
    switch (M) {
        case 1: return gemm_panels<1>(N, K, a, wp, C, ldc, accumulate);
        case 2: return gemm_panels<2>(N, K, a, wp, C, ldc, accumulate);
        case 3: return gemm_panels<3>(N, K, a, wp, C, ldc, accumulate);
        case 4: return gemm_panels<4>(N, K, a, wp, C, ldc, accumulate);
    }
    gemm_packed(M, N, K, a, {wp, 1, 1}, C, ldc, accumulate, wp);
}

inline void gemm_nn(int M, int N, int K, const float* A, int lda, const float* B, int ldb, float* C, int ldc,
                    bool accumulate) {
    gemm_detail::gemm(M, N, K, {A, lda, 1}, {B, ldb, 1}, C, ldc, accumulate);
}

inline void gemm_tn(int M, int N, int K, const float* A, int lda, const float* B, int ldb, float* C, int ldc,
                    bool accumulate) {
    gemm_detail::gemm(M, N, K, {A, 1, lda}, {B, ldb, 1}, C, ldc, accumulate);
}

// C[M,N] += A . B with the product summed from 0 and then added to C, as cuBLASLt computes beta = 1
// (its epilogue adds C to the finished product), where accumulate = true continues C's chain (as a
// tensor-core mma does: cpu/attention.h relies on that). The product goes through a per-thread
// buffer of M x N floats.
inline void add_product(int M, int N, float* C, int ldc, const std::vector<float>& product) {
#pragma omp parallel for schedule(static)
    for (int i = 0; i < M; i++)
        for (int j = 0; j < N; j++) C[(long)i * ldc + j] += product[(size_t)i * N + j];
}
inline std::vector<float>& product_buffer(int M, int N) {
    static thread_local std::vector<float> buffer;
    if (buffer.size() < (size_t)M * N) buffer.resize((size_t)M * N);
    return buffer;
}
inline void gemm_nn_then_add(int M, int N, int K, const float* A, int lda, const float* B, int ldb, float* C, int ldc) {
    std::vector<float>& product = product_buffer(M, N);
    gemm_nn(M, N, K, A, lda, B, ldb, product.data(), N, false);
    add_product(M, N, C, ldc, product);
}
inline void gemm_tn_then_add(int M, int N, int K, const float* A, int lda, const float* B, int ldb, float* C, int ldc) {
    std::vector<float>& product = product_buffer(M, N);
    gemm_tn(M, N, K, A, lda, B, ldb, product.data(), N, false);
    add_product(M, N, C, ldc, product);
}

}  // namespace fp8rl
