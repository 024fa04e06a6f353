// nccl.cuh: the one communicator of the GPU engine's data parallelism (spec-gpu.md §6): every
// collective on device memory goes through it, so the engine holds no NCCL call of its own.
//   nvcc       NCCL: rank 0's ncclGetUniqueId broadcast over MPI (rl/dist.h), ncclCommInitRank on
//              the device the caller chose; collectives in stream order.
//   emulation  the same collectives over MPI (device memory is host memory there), in stream
//              order through emu::stream_op, so data-parallel code paths run in CI under mpirun.
// One process without mpirun is one rank: every collective is then a copy or nothing.
#ifndef FP8RL_NCCL_CUH
#define FP8RL_NCCL_CUH
#include "cuda/common.cuh"
#include "rl/dist.h"
#if !defined(FP8RL_EMU) && defined(FP8RL_MPI)
#include <nccl.h>
#endif

#include <cstdint>

namespace fp8rl {

#if !defined(FP8RL_EMU) && defined(FP8RL_MPI)
inline void nccl_check(ncclResult_t status, const char* call, const char* file, int line) {
    if (status != ncclSuccess) fail("NCCL error at %s:%d in %s: %s", file, line, call, ncclGetErrorString(status));
}
#define NCCL_CHECK(call) ::fp8rl::nccl_check((call), #call, __FILE__, __LINE__)
#endif

class Communicator {
  public:
    explicit Communicator(const Dist& dist) : rank_(dist.rank()), size_(dist.size()) {
#if !defined(FP8RL_EMU) && defined(FP8RL_MPI)
        if (size_ == 1) return;
        ncclUniqueId id;
        if (dist.is_root()) NCCL_CHECK(ncclGetUniqueId(&id));
        dist.broadcast(reinterpret_cast<char*>(&id), sizeof id);
        NCCL_CHECK(ncclCommInitRank(&comm_, size_, id, rank_));
#else
        (void)dist;
#endif
    }
    ~Communicator() {
#if !defined(FP8RL_EMU) && defined(FP8RL_MPI)
        if (comm_) ncclCommDestroy(comm_);
#endif
    }
    Communicator(const Communicator&) = delete;
    Communicator& operator=(const Communicator&) = delete;

    int rank() const { return rank_; }
    int size() const { return size_; }

    // x [n] = the sum of every rank's x (in place).
    void all_reduce_sum(float* x, size_t n, cudaStream_t stream) {
        if (size_ == 1 || n == 0) return;
#if defined(FP8RL_EMU) && defined(FP8RL_MPI)
        on_stream(stream, [=] { MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, x, (int)n, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD)); });
#elif defined(FP8RL_MPI)
        NCCL_CHECK(ncclAllReduce(x, x, n, ncclFloat32, ncclSum, comm_, stream));
#else
        (void)x, (void)stream;
#endif
    }

    // in [size][n] on every rank -> out [n] on rank r = the sum over ranks of in[r] (in and out
    // must not overlap).
    void reduce_scatter_sum(const float* in, float* out, size_t n, cudaStream_t stream) {
        if (size_ == 1) return copy(out, in, n * sizeof(float), stream);
#if defined(FP8RL_EMU) && defined(FP8RL_MPI)
        on_stream(stream, [=] {
            MPI_CHECK(MPI_Reduce_scatter_block(in, out, (int)n, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD));
        });
#elif defined(FP8RL_MPI)
        NCCL_CHECK(ncclReduceScatter(in, out, n, ncclFloat32, ncclSum, comm_, stream));
#endif
    }

    // in [n] on rank r -> out [size][n] on every rank, out[r] = rank r's in (bytes: any element type).
    template <class T>
    void all_gather(const T* in, T* out, size_t n, cudaStream_t stream) {
        size_t bytes = n * sizeof(T);
        if (size_ == 1) return copy(out, in, bytes, stream);
#if defined(FP8RL_EMU) && defined(FP8RL_MPI)
        on_stream(stream, [=] { MPI_CHECK(MPI_Allgather(in, (int)bytes, MPI_BYTE, out, (int)bytes, MPI_BYTE, MPI_COMM_WORLD)); });
#elif defined(FP8RL_MPI)
        NCCL_CHECK(ncclAllGather(in, out, bytes, ncclUint8, comm_, stream));
#endif
    }

    // x [n] = root's x on every rank.
    template <class T>
    void broadcast(T* x, size_t n, int root, cudaStream_t stream) {
        if (size_ == 1 || n == 0) return;
#if defined(FP8RL_EMU) && defined(FP8RL_MPI)
        on_stream(stream, [=] { MPI_CHECK(MPI_Bcast(x, (int)(n * sizeof(T)), MPI_BYTE, root, MPI_COMM_WORLD)); });
#elif defined(FP8RL_MPI)
        NCCL_CHECK(ncclBroadcast(x, x, n * sizeof(T), ncclUint8, root, comm_, stream));
#else
        (void)x, (void)root, (void)stream;
#endif
    }

  private:
    int rank_, size_;
#if !defined(FP8RL_EMU) && defined(FP8RL_MPI)
    ncclComm_t comm_ = nullptr;
#endif

    static void copy(void* dst, const void* src, size_t bytes, cudaStream_t stream) {
        if (dst != src && bytes) CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, stream));
    }
#ifdef FP8RL_EMU
    template <class Op>
    static void on_stream(cudaStream_t stream, Op op) {
        CUDA_CHECK(emu::stream_op(stream, op));
    }
#endif
};

}  // namespace fp8rl

#endif  // FP8RL_NCCL_CUH
