// nccl.cuh: the one communicator of the GPU engine's data parallelism (spec-gpu.md §6): every
// collective on device memory goes through it, so the engine holds no NCCL call of its own.
//   nvcc       NCCL: rank 0's ncclGetUniqueId broadcast over MPI (rl/driver/dist.h), a nonblocking
//              ncclCommInitRankConfig on the device the caller chose (its node-local rank's), waited
//              for at most the timeout; collectives on a stream of their own, ordered after the
//              caller's stream by events, each waited for at most the timeout.
//   emulation  the same collectives over nonblocking MPI (device memory is host memory there), in
//              stream order through emu::stream_op (run at issue), with the same timeout, so
//              data-parallel code paths run in CI under mpirun.
// One process without mpirun is one rank: every collective is then a copy or nothing.
#ifndef FP8RL_NCCL_CUH
#define FP8RL_NCCL_CUH
#include "cuda/common.cuh"
#include "rl/driver/dist.h"
#if !defined(FP8RL_EMU) && defined(FP8RL_MPI)
#include <nccl.h>
#endif

#include <chrono>
#include <cstdint>
#include <thread>
#include <vector>

namespace fp8rl {

#if !defined(FP8RL_EMU) && defined(FP8RL_MPI)
// The communicator is nonblocking (its creation can then time out): a call may answer ncclInProgress,
// which is no error; the caller polls ncclCommGetAsyncError for its end (Communicator::settle).
inline void nccl_check(ncclResult_t status, const char* call, const char* file, int line) {
    if (status != ncclSuccess && status != ncclInProgress) fail("NCCL error at %s:%d in %s: %s", file, line, call, ncclGetErrorString(status));
}
#define NCCL_CHECK(call) ::fp8rl::nccl_check((call), #call, __FILE__, __LINE__)
#endif

class Communicator {
  public:
    // timeout_s: how long the communicator's creation, and then each collective, may wait for the
    // other ranks before it fails (a rank that died, hangs or never arrives must end the job, not
    // leave the others waiting forever).
    Communicator(const Dist& dist, double timeout_s) : rank_(dist.rank()), size_(dist.size()), timeout_s_(timeout_s) {
        if (size_ == 1) return;
        CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
        CUDA_CHECK(cudaEventCreateWithFlags(&ready_, cudaEventDisableTiming));
        CUDA_CHECK(cudaEventCreateWithFlags(&done_, cudaEventDisableTiming));
#if defined(FP8RL_EMU) && defined(FP8RL_MPI)
        // Created as NCCL's is: every rank reports to rank 0 and waits for its go-ahead (NCCL's
        // bootstrap), point to point and at most timeout_s, so a rank that never arrives is an error;
        // then, all ranks there, a duplicate of MPI_COMM_WORLD keeps the collectives apart from the host's.
        static const char hello = 1;  // send buffers outlive an abandoned request
        static char go = 0, heard = 0;
        std::vector<MPI_Request> requests;
        const auto t0 = std::chrono::steady_clock::now();
        if (rank_ == 0) {
            for (int r = 1; r < size_; r++) {
                requests.emplace_back();
                MPI_CHECK(MPI_Irecv(&heard, 1, MPI_CHAR, r, CREATION_TAG, MPI_COMM_WORLD, &requests.back()));
            }
            wait_all(requests, t0, "the communicator's creation (waiting for every rank)");
            for (int r = 1; r < size_; r++) {
                requests.emplace_back();
                MPI_CHECK(MPI_Isend(&hello, 1, MPI_CHAR, r, CREATION_TAG, MPI_COMM_WORLD, &requests.back()));
            }
        } else {
            requests.resize(2);
            MPI_CHECK(MPI_Isend(&hello, 1, MPI_CHAR, 0, CREATION_TAG, MPI_COMM_WORLD, &requests[0]));
            MPI_CHECK(MPI_Irecv(&go, 1, MPI_CHAR, 0, CREATION_TAG, MPI_COMM_WORLD, &requests[1]));
        }
        wait_all(requests, t0, "the communicator's creation (waiting for every rank)");
        MPI_CHECK(MPI_Comm_dup(MPI_COMM_WORLD, &mpi_comm_));
#elif defined(FP8RL_MPI)
        ncclUniqueId id;
        if (dist.is_root()) NCCL_CHECK(ncclGetUniqueId(&id));
        dist.broadcast(reinterpret_cast<char*>(&id), sizeof id);
        // nonblocking, so a rank that never arrives is a timeout (NCCL docs, "Fault Tolerance": create
        // with blocking = 0, poll ncclCommGetAsyncError until it leaves ncclInProgress, abort past a deadline)
        ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
        config.blocking = 0;
        NCCL_CHECK(ncclCommInitRankConfig(&comm_, size_, id, rank_, &config));
        settle("ncclCommInitRankConfig (the communicator's creation)", std::chrono::steady_clock::now());
#endif
    }
    ~Communicator() {
#if defined(FP8RL_EMU) && defined(FP8RL_MPI)
        if (mpi_comm_ != MPI_COMM_NULL) MPI_Comm_free(&mpi_comm_);
#elif defined(FP8RL_MPI)
        if (comm_) ncclCommDestroy(comm_);
#endif
        if (size_ == 1) return;
        cudaEventDestroy(done_);
        cudaEventDestroy(ready_);
        cudaStreamDestroy(stream_);
    }
    Communicator(const Communicator&) = delete;
    Communicator& operator=(const Communicator&) = delete;

    int rank() const { return rank_; }
    int size() const { return size_; }

    // Every collective runs on the communicator's own stream, after the work queued on `stream`
    // and before the work queued there next (events), and the host waits for it at most timeout_s.
    // An overlapped one (reduce_sum's overlap) only starts there: neither `stream` nor the host
    // waits for it, so `stream`'s next work may run meanwhile; what must follow it goes on stream()
    // (kernels, events), and wait(stream) ends the overlap.

    // The collectives' stream (null on one rank, where there are none).
    cudaStream_t stream() const { return stream_; }

    // `stream`'s next work waits for every collective started so far, and the host for them, at
    // most timeout_s.
    void wait(cudaStream_t stream) {
        if (size_ == 1) return;
#if defined(FP8RL_MPI)
        finish(stream, "an overlapped collective");
#else
        (void)stream;
#endif
    }

    // x [n] = the sum of every rank's x (in place); T is float or double.
    template <class T>
    void all_reduce_sum(T* x, size_t n, cudaStream_t stream) {
        if (size_ == 1 || n == 0) return;
#if defined(FP8RL_EMU) && defined(FP8RL_MPI)
        run(stream, "MPI_Iallreduce", [=](MPI_Request* r) {
            MPI_CHECK(MPI_Iallreduce(MPI_IN_PLACE, x, (int)n, mpi_type<T>(), MPI_SUM, mpi_comm_, r));
        });
#elif defined(FP8RL_MPI)
        run(stream, "ncclAllReduce", [=](cudaStream_t s) { NCCL_CHECK(ncclAllReduce(x, x, n, nccl_type<T>(), ncclSum, comm_, s)); });
#else
        (void)x, (void)stream;
#endif
    }

    // x [size][n], in place: x[rank] becomes the sum over ranks of their x[rank]; the other blocks
    // are left undefined (ZeRO-1's gradient shards).
    void reduce_scatter_sum(float* x, size_t n, cudaStream_t stream) {
        if (size_ == 1 || n == 0) return;
#if defined(FP8RL_EMU) && defined(FP8RL_MPI)
        // MPI's in-place form leaves the sum at the front of x: moved to this rank's block after
        run(stream, "MPI_Ireduce_scatter_block", [=](MPI_Request* r) {
            MPI_CHECK(MPI_Ireduce_scatter_block(MPI_IN_PLACE, x, (int)n, MPI_FLOAT, MPI_SUM, mpi_comm_, r));
        });
        if (rank_ > 0) copy(x + (size_t)rank_ * n, x, n * sizeof(float), stream);
#elif defined(FP8RL_MPI)
        run(stream, "ncclReduceScatter", [=](cudaStream_t s) {
            NCCL_CHECK(ncclReduceScatter(x, x + (size_t)rank_ * n, n, ncclFloat32, ncclSum, comm_, s));
        });
#else
        (void)x, (void)stream;
#endif
    }

    // x [n] on root becomes the sum over ranks of their x (in place); the other ranks' x are left as
    // they are (ZeRO-2's gradient buckets, reduced into their owner's shard). overlap: see above.
    void reduce_sum(float* x, size_t n, int root, cudaStream_t stream, bool overlap = false) {
        if (size_ == 1 || n == 0) return;
#if defined(FP8RL_EMU) && defined(FP8RL_MPI)
        const bool is_root = rank_ == root;
        run(stream, "MPI_Ireduce", [=](MPI_Request* r) {
            MPI_CHECK(MPI_Ireduce(is_root ? MPI_IN_PLACE : x, x, (int)n, MPI_FLOAT, MPI_SUM, root, mpi_comm_, r));
        }, overlap);
#elif defined(FP8RL_MPI)
        run(stream, "ncclReduce", [=](cudaStream_t s) { NCCL_CHECK(ncclReduce(x, x, n, ncclFloat32, ncclSum, root, comm_, s)); },
            overlap);
#else
        (void)x, (void)root, (void)stream, (void)overlap;
#endif
    }

    // in [n] on rank r -> out [size][n] on every rank, out[r] = rank r's in (bytes: any element type;
    // in and out must not overlap).
    template <class T>
    void all_gather(const T* in, T* out, size_t n, cudaStream_t stream) {
        size_t bytes = n * sizeof(T);
        if (size_ == 1) return copy(out, in, bytes, stream);
#if defined(FP8RL_EMU) && defined(FP8RL_MPI)
        run(stream, "MPI_Iallgather", [=](MPI_Request* r) {
            MPI_CHECK(MPI_Iallgather(in, (int)bytes, MPI_BYTE, out, (int)bytes, MPI_BYTE, mpi_comm_, r));
        });
#elif defined(FP8RL_MPI)
        run(stream, "ncclAllGather", [=](cudaStream_t s) { NCCL_CHECK(ncclAllGather(in, out, bytes, ncclUint8, comm_, s)); });
#endif
    }

    // x [n] = root's x on every rank.
    template <class T>
    void broadcast(T* x, size_t n, int root, cudaStream_t stream) {
        if (size_ == 1 || n == 0) return;
#if defined(FP8RL_EMU) && defined(FP8RL_MPI)
        run(stream, "MPI_Ibcast", [=](MPI_Request* r) {
            MPI_CHECK(MPI_Ibcast(x, (int)(n * sizeof(T)), MPI_BYTE, root, mpi_comm_, r));
        });
#elif defined(FP8RL_MPI)
        run(stream, "ncclBroadcast", [=](cudaStream_t s) { NCCL_CHECK(ncclBroadcast(x, x, n * sizeof(T), ncclUint8, root, comm_, s)); });
#else
        (void)x, (void)root, (void)stream;
#endif
    }

  private:
    int rank_, size_;
    double timeout_s_;
    cudaStream_t stream_ = nullptr;  // the collectives' own stream
    cudaEvent_t ready_ = nullptr, done_ = nullptr;
#if defined(FP8RL_EMU) && defined(FP8RL_MPI)
    MPI_Comm mpi_comm_ = MPI_COMM_NULL;
#elif defined(FP8RL_MPI)
    ncclComm_t comm_ = nullptr;
#endif

    static void copy(void* dst, const void* src, size_t bytes, cudaStream_t stream) {
        if (dst != src && bytes) CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, stream));
    }

    static double seconds_since(std::chrono::steady_clock::time_point t0) {
        return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    }

    [[noreturn]] void timed_out(const char* call) const {
        fail("%s did not complete within %g s (--collective_timeout): another rank failed or hangs; its own error line, if "
             "any, names the cause",
             call, timeout_s_);
    }

#if defined(FP8RL_EMU) && defined(FP8RL_MPI)
    static constexpr int CREATION_TAG = 0x6e63;  // the creation's messages, apart from any other

    // Waits for every request at most timeout_s from t0; past it, cancels those still pending (no
    // late message may match them) and fails naming `what`.
    void wait_all(std::vector<MPI_Request>& requests, std::chrono::steady_clock::time_point t0, const char* what) const {
        for (int done = 0; !done;) {
            MPI_CHECK(MPI_Testall((int)requests.size(), requests.data(), &done, MPI_STATUSES_IGNORE));
            if (done) break;
            if (seconds_since(t0) > timeout_s_) {
                for (MPI_Request& r : requests)
                    if (r != MPI_REQUEST_NULL) {
                        MPI_CHECK(MPI_Cancel(&r));
                        MPI_CHECK(MPI_Request_free(&r));
                    }
                timed_out(what);
            }
            std::this_thread::sleep_for(std::chrono::microseconds(100));
        }
        requests.clear();
    }

    // The emulated device's memory is host memory: the collective is a nonblocking MPI call,
    // polled until done or timed out, in stream order on the communicator's stream. It runs at
    // issue, with the work it waits for: queued, it could wait forever for a peer blocked in a host
    // MPI call that waits for this rank.
    template <class Start>
    void start(cudaStream_t stream, const char* call, Start start) {
        order_after(stream);
        CUDA_CHECK(emu::stream_op(stream_, [=] {
            MPI_Request request;
            start(&request);
            const auto t0 = std::chrono::steady_clock::now();
            for (int done = 0;;) {
                MPI_CHECK(MPI_Test(&request, &done, MPI_STATUS_IGNORE));
                if (done) return;
                if (seconds_since(t0) > timeout_s_) timed_out(call);
                std::this_thread::sleep_for(std::chrono::microseconds(100));
            }
        }, /*at_issue=*/true));
    }
    // The collectives have run (at issue, timed there): `stream` only waits for them.
    void finish(cudaStream_t stream, const char*) { order_before(stream); }
#elif defined(FP8RL_MPI)
    template <class T> static ncclDataType_t nccl_type();
    // Enqueues the collective on the communicator's stream ...
    template <class Enqueue>
    void start(cudaStream_t stream, const char* call, Enqueue enqueue) {
        order_after(stream);
        enqueue(stream_);
        settle(call, std::chrono::steady_clock::now());
    }
    // A nonblocking communicator's call has returned, maybe ncclInProgress: waits until NCCL has
    // finished it (ncclCommGetAsyncError leaves ncclInProgress; the next call may only come then),
    // at most timeout_s from t0; an error or the deadline aborts the communicator.
    void settle(const char* call, std::chrono::steady_clock::time_point t0) {
        for (;;) {
            ncclResult_t async = ncclSuccess;
            NCCL_CHECK(ncclCommGetAsyncError(comm_, &async));
            if (async == ncclSuccess) return;
            const bool late = seconds_since(t0) > timeout_s_;
            if (async != ncclInProgress || late) abort_with(call, async, late);
            std::this_thread::sleep_for(std::chrono::microseconds(20));
        }
    }
    [[noreturn]] void abort_with(const char* call, ncclResult_t async, bool late) {
        ncclCommAbort(comm_);
        comm_ = nullptr;
        if (late) timed_out(call);
        fail("%s failed: %s", call, ncclGetErrorString(async));
    }
    // ... and waits for what is queued there, at most timeout_s: a failed or silent peer aborts the
    // communicator (which ends its kernels) and becomes an error.
    void finish(cudaStream_t stream, const char* call) {
        order_before(stream);
        const auto t0 = std::chrono::steady_clock::now();
        for (;;) {
            cudaError_t e = cudaEventQuery(done_);
            if (e == cudaSuccess) return;
            if (e != cudaErrorNotReady) CUDA_CHECK(e);
            ncclResult_t async = ncclSuccess;
            NCCL_CHECK(ncclCommGetAsyncError(comm_, &async));
            const bool late = seconds_since(t0) > timeout_s_;
            if ((async != ncclSuccess && async != ncclInProgress) || late) abort_with(call, async, late);
            std::this_thread::sleep_for(std::chrono::microseconds(20));
        }
    }
#endif
#if defined(FP8RL_MPI)
    // A collective on the communicator's stream after `stream`'s work, and unless overlapped, before
    // `stream`'s next work, the host waiting for it.
    template <class Op>
    void run(cudaStream_t stream, const char* call, Op op, bool overlap = false) {
        start(stream, call, op);
        if (!overlap) finish(stream, call);
    }
#endif
    // The communicator's stream waits for `stream`'s work so far ...
    void order_after(cudaStream_t stream) {
        CUDA_CHECK(cudaEventRecord(ready_, stream));
        CUDA_CHECK(cudaStreamWaitEvent(stream_, ready_, 0));
    }
    // ... and `stream`'s next work waits for the collective.
    void order_before(cudaStream_t stream) {
        CUDA_CHECK(cudaEventRecord(done_, stream_));
        CUDA_CHECK(cudaStreamWaitEvent(stream, done_, 0));
    }
};

#if !defined(FP8RL_EMU) && defined(FP8RL_MPI)
template <> inline ncclDataType_t Communicator::nccl_type<float>() { return ncclFloat32; }
template <> inline ncclDataType_t Communicator::nccl_type<double>() { return ncclFloat64; }
#endif

}  // namespace fp8rl

#endif  // FP8RL_NCCL_CUH
