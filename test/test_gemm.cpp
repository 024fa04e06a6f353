// Tests of cpu/gemm.h: all three transposes and gemm_nt on a packed weight, on odd shapes (edges
// of every tile, panel and block size)
// against a double-precision reference, the documented rounding contract (one FMA chain per
// element in k order), padding left untouched, and bitwise independence of thread count and of
// the other rows of the batch.
#include <omp.h>

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "rl/common.h"
#include "cpu/gemm.h"
#include "test/harness.h"

using namespace fp8rl;

namespace {

enum Op { NT, NN, TN, NT_PACKED };  // NT_PACKED: gemm_nt_packed on B packed by pack_weight
const Op kOps[] = {NT, NN, TN, NT_PACKED};
const char* op_name(Op op) { return op == NT ? "nt" : op == NN ? "nn" : op == TN ? "tn" : "nt_packed"; }
bool b_is_nk(Op op) { return op == NT || op == NT_PACKED; }

// Operands stored with leading dimensions padded by a few columns, as the model's views are.
struct Problem {
    Op op;
    int M, N, K, lda, ldb, ldc;
    std::vector<float> A, B, C;
    Problem(Op op_, int M_, int N_, int K_, uint32_t seed) : op(op_), M(M_), N(N_), K(K_) {
        std::mt19937 gen(seed);
        std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
        const int a_rows = op == TN ? K : M, a_cols = op == TN ? M : K;
        const int b_rows = b_is_nk(op) ? N : K, b_cols = b_is_nk(op) ? K : N;
        lda = a_cols + 3;
        ldb = b_cols + 5;
        ldc = N + 2;
        A.assign((size_t)a_rows * lda, 0.0f);
        B.assign((size_t)b_rows * ldb, 0.0f);
        C.assign((size_t)M * ldc, 7.0f);  // 7 in the padding must survive
        for (int r = 0; r < a_rows; r++)
            for (int c = 0; c < a_cols; c++) A[(size_t)r * lda + c] = dist(gen);
        for (int r = 0; r < b_rows; r++)
            for (int c = 0; c < b_cols; c++) B[(size_t)r * ldb + c] = dist(gen);
        for (int i = 0; i < M; i++)
            for (int j = 0; j < N; j++) C[(size_t)i * ldc + j] = dist(gen);
    }
    float a(int i, int k) const { return op == TN ? A[(size_t)k * lda + i] : A[(size_t)i * lda + k]; }
    float b(int k, int j) const { return b_is_nk(op) ? B[(size_t)j * ldb + k] : B[(size_t)k * ldb + j]; }
    // B [N, K] without its padding, packed (NT_PACKED).
    std::vector<float> packed_b() const {
        std::vector<float> w((size_t)N * K), wp((size_t)packed_weight_floats(N, K));
        for (int j = 0; j < N; j++)
            for (int k = 0; k < K; k++) w[(size_t)j * K + k] = B[(size_t)j * ldb + k];
        pack_weight(w.data(), N, K, wp.data());
        return wp;
    }
    std::vector<float> run(bool accumulate) const {
        std::vector<float> out = C;
        if (op == NT) gemm_nt(M, N, K, A.data(), lda, B.data(), ldb, out.data(), ldc, accumulate);
        if (op == NN) gemm_nn(M, N, K, A.data(), lda, B.data(), ldb, out.data(), ldc, accumulate);
        if (op == TN) gemm_tn(M, N, K, A.data(), lda, B.data(), ldb, out.data(), ldc, accumulate);
        if (op == NT_PACKED) gemm_nt_packed(M, N, K, A.data(), lda, packed_b().data(), out.data(), ldc, accumulate);
        return out;
    }
};

struct Shape {
    int M, N, K;
};
// Edges of the 6x16 micro-tile, the 4-row small-M path, KC = 256, MC = 96, the 64-column slab,
// NC = 3072.
const Shape kShapes[] = {{1, 1, 1},   {1, 3, 17},    {2, 17, 129}, {3, 16, 8},   {4, 33, 300},  {5, 16, 16},
                         {6, 16, 256}, {7, 17, 257}, {17, 129, 3}, {13, 70, 513}, {97, 65, 31}, {129, 1, 40},
                         {200, 19, 5}, {8, 3100, 9}, {1, 3100, 70}};

}  // namespace

TEST(gemm_matches_double_reference) {
    for (Op op : kOps)
        for (const Shape& s : kShapes)
            for (bool accumulate : {false, true}) {
                Problem p(op, s.M, s.N, s.K, 1000u * s.M + s.N + 7u * s.K);
                std::vector<float> c = p.run(accumulate);
                int bad = 0;
                for (int i = 0; i < p.M; i++) {
                    for (int j = 0; j < p.N; j++) {
                        double ref = accumulate ? p.C[(size_t)i * p.ldc + j] : 0.0, mag = std::fabs(ref);
                        for (int k = 0; k < p.K; k++) {
                            ref += (double)p.a(i, k) * p.b(k, j);
                            mag += std::fabs((double)p.a(i, k) * p.b(k, j));
                        }
                        // an FMA chain of K steps is within K unit roundoffs of the magnitude
                        if (std::fabs(c[(size_t)i * p.ldc + j] - ref) > (p.K + 1) * 6e-8 * mag + 1e-30) bad++;
                    }
                    for (int j = p.N; j < p.ldc; j++) bad += c[(size_t)i * p.ldc + j] != 7.0f;
                }
                CHECK_MSG(bad == 0, "gemm_%s M=%d N=%d K=%d accumulate=%d: %d wrong elements", op_name(op), s.M, s.N,
                          s.K, accumulate, bad);
            }
}

// The rounding contract of gemm.h: each element is fma(a_k, b_k, ...) chained over k in order.
TEST(gemm_is_one_fma_chain_per_element) {
    for (Op op : kOps)
        for (const Shape& s : kShapes)
            for (bool accumulate : {false, true}) {
                Problem p(op, s.M, s.N, s.K, 77u + s.M * 31u + s.N);
                std::vector<float> c = p.run(accumulate);
                int differ = 0;
                for (int i = 0; i < p.M; i++)
                    for (int j = 0; j < p.N; j++) {
                        float acc = accumulate ? p.C[(size_t)i * p.ldc + j] : 0.0f;
                        for (int k = 0; k < p.K; k++) acc = std::fma(p.a(i, k), p.b(k, j), acc);
                        differ += acc != c[(size_t)i * p.ldc + j];
                    }
                CHECK_MSG(differ == 0, "gemm_%s M=%d N=%d K=%d accumulate=%d: %d elements differ", op_name(op), s.M,
                          s.N, s.K, accumulate, differ);
            }
}

TEST(gemm_bitwise_across_thread_counts) {
    const int max_threads = omp_get_max_threads();
    const Shape shapes[] = {{2, 1000, 300}, {150, 200, 300}, {64, 288, 288}, {1, 330, 40}};
    for (Op op : kOps)
        for (const Shape& s : shapes) {
            Problem p(op, s.M, s.N, s.K, 5u);
            omp_set_num_threads(1);
            std::vector<float> one = p.run(true);
            for (int threads : {2, 3}) {
                omp_set_num_threads(threads);
                std::vector<float> many = p.run(true);
                CHECK_MSG(std::memcmp(one.data(), many.data(), one.size() * sizeof(float)) == 0,
                          "gemm_%s M=%d N=%d K=%d: %d threads differ from 1", op_name(op), s.M, s.N, s.K, threads);
            }
        }
    omp_set_num_threads(max_threads);
}

// A row of C depends only on its row of A: computing one row alone (the small-M path) gives the
// same bits as computing it inside a batch (the packed path).
TEST(gemm_rows_independent_of_batch) {
    for (Op op : {NT, NN, NT_PACKED})
        for (int M : {5, 37, 100}) {
            Problem p(op, M, 301, 290, 11u + M);
            std::vector<float> batch = p.run(false), wp = op == NT_PACKED ? p.packed_b() : std::vector<float>();
            for (int i = 0; i < M; i += 3) {
                std::vector<float> row(p.N);
                const float* a = &p.A[(size_t)i * p.lda];
                if (op == NT) gemm_nt(1, p.N, p.K, a, p.lda, p.B.data(), p.ldb, row.data(), p.N, false);
                if (op == NN) gemm_nn(1, p.N, p.K, a, p.lda, p.B.data(), p.ldb, row.data(), p.N, false);
                if (op == NT_PACKED) gemm_nt_packed(1, p.N, p.K, a, p.lda, wp.data(), row.data(), p.N, false);
                CHECK_MSG(std::memcmp(row.data(), &batch[(size_t)i * p.ldc], p.N * sizeof(float)) == 0,
                          "gemm_%s row %d of %d differs when computed alone", op_name(op), i, M);
            }
        }
}

TEST(gemm_empty_k_and_empty_output) {
    std::vector<float> c = {1, 2, 3, 4};
    gemm_nt(2, 2, 0, nullptr, 1, nullptr, 1, c.data(), 2, true);
    CHECK(c == std::vector<float>({1, 2, 3, 4}));
    gemm_nn(2, 2, 0, nullptr, 1, nullptr, 2, c.data(), 2, false);
    CHECK(c == std::vector<float>({0, 0, 0, 0}));
    gemm_tn(0, 2, 5, nullptr, 1, nullptr, 2, c.data(), 2, false);  // nothing to write
}
