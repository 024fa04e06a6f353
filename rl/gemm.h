// gemm.h: FP32 matrix multiply on the CPU, the workhorse of the CPU engine. Row-major, with
// leading dimensions. Every output element is reduced over K in one fixed order by one thread,
// so results are bitwise identical for any OpenMP thread count.
//   gemm_nt: C[M,N] (+)= A[M,K] . B[N,K]^T   (linear fprop: Y = X W^T)
//   gemm_nn: C[M,N] (+)= A[M,K] . B[K,N]     (linear dgrad: dX = dY W)
//   gemm_tn: C[M,N] (+)= A[K,M]^T . B[K,N]   (linear wgrad: dW = dY^T X)
#pragma once

namespace fp8rl {

inline void gemm_nt(int M, int N, int K, const float* A, int lda, const float* B, int ldb, float* C, int ldc,
                    bool accumulate) {
#pragma omp parallel for schedule(static)
    for (int i = 0; i < M; i++)
        for (int j = 0; j < N; j++) {
            float acc = 0.0f;
            for (int k = 0; k < K; k++) acc += A[(long)i * lda + k] * B[(long)j * ldb + k];
            C[(long)i * ldc + j] = accumulate ? C[(long)i * ldc + j] + acc : acc;
        }
}

inline void gemm_nn(int M, int N, int K, const float* A, int lda, const float* B, int ldb, float* C, int ldc,
                    bool accumulate) {
#pragma omp parallel for schedule(static)
    for (int i = 0; i < M; i++)
        for (int j = 0; j < N; j++) {
            float acc = 0.0f;
            for (int k = 0; k < K; k++) acc += A[(long)i * lda + k] * B[(long)k * ldb + j];
            C[(long)i * ldc + j] = accumulate ? C[(long)i * ldc + j] + acc : acc;
        }
}

inline void gemm_tn(int M, int N, int K, const float* A, int lda, const float* B, int ldb, float* C, int ldc,
                    bool accumulate) {
#pragma omp parallel for schedule(static)
    for (int i = 0; i < M; i++)
        for (int j = 0; j < N; j++) {
            float acc = 0.0f;
            for (int k = 0; k < K; k++) acc += A[(long)k * lda + i] * B[(long)k * ldb + j];
            C[(long)i * ldc + j] = accumulate ? C[(long)i * ldc + j] + acc : acc;
        }
}

}  // namespace fp8rl
