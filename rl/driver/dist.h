// dist.h: data parallelism over MPI for the CPU engine (and the host side of the GPU engine).
// Every reduction gathers to rank 0, sums in rank order and broadcasts the result, so a sum over
// N ranks is the same sequence of additions whatever the network does: runs are reproducible and
// N ranks with the same global batch match one rank up to the order the per-rank partial sums
// are formed in. Every collective waits at most --collective_timeout for the other ranks. Without
// FP8RL_MPI (set by the Makefile when mpicxx exists) the same calls run one process and do nothing.
#pragma once
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <thread>
#include <vector>

#include "rl/common.h"

#ifdef FP8RL_MPI
// Only MPI's C API: the deprecated C++ bindings do not compile warning-free.
#define OMPI_SKIP_MPICXX 1
#define MPICH_SKIP_MPICXX 1
#include <mpi.h>
// Every MPI call goes through this check: a failure becomes an Error naming the call.
#define MPI_CHECK(call)                                                                        \
    do {                                                                                       \
        int mpi_rc_ = (call);                                                                  \
        if (mpi_rc_ != MPI_SUCCESS) {                                                          \
            char mpi_msg_[MPI_MAX_ERROR_STRING];                                               \
            int mpi_len_ = 0;                                                                  \
            MPI_Error_string(mpi_rc_, mpi_msg_, &mpi_len_);                                    \
            fp8rl::fail("MPI: %s failed at %s:%d: %s", #call, __FILE__, __LINE__, mpi_msg_);   \
        }                                                                                      \
    } while (0)
#endif

namespace fp8rl {

#ifdef FP8RL_MPI
template <typename T> inline MPI_Datatype mpi_type();
template <> inline MPI_Datatype mpi_type<double>() { return MPI_DOUBLE; }
template <> inline MPI_Datatype mpi_type<float>() { return MPI_FLOAT; }
template <> inline MPI_Datatype mpi_type<int64_t>() { return MPI_INT64_T; }
template <> inline MPI_Datatype mpi_type<char>() { return MPI_CHAR; }
#endif

// This process's index among the ranks on its node (MPI_COMM_TYPE_SHARED), which picks its GPU;
// 0 when MPI is not running. Collective over all ranks the first time (every rank builds its
// engine at the same point), remembered after.
inline int node_local_rank() {
#ifdef FP8RL_MPI
    static const int local = [] {
        int inited = 0, finalized = 0;
        MPI_CHECK(MPI_Initialized(&inited));
        MPI_CHECK(MPI_Finalized(&finalized));
        if (!inited || finalized) return 0;
        MPI_Comm node;
        MPI_CHECK(MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &node));
        int r = 0;
        MPI_CHECK(MPI_Comm_rank(node, &r));
        MPI_CHECK(MPI_Comm_free(&node));
        return r;
    }();
    return local;
#else
    return 0;
#endif
}

class Dist {
public:
    // Initializes MPI when built with it and started by mpirun; a plain `./train_rl_cpu` runs one
    // process without starting the MPI runtime (no singleton daemon, nothing left to clean up).
    Dist() {
#ifdef FP8RL_MPI
        if (!launched_by_mpi()) return;
        int inited = 0;
        MPI_CHECK(MPI_Initialized(&inited));
        if (!inited) {
            MPI_CHECK(MPI_Init(nullptr, nullptr));
            owns_mpi_ = true;
        }
        MPI_CHECK(MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN));
        MPI_CHECK(MPI_Comm_rank(MPI_COMM_WORLD, &rank_));
        MPI_CHECK(MPI_Comm_size(MPI_COMM_WORLD, &size_));
#endif
    }
    ~Dist() {
#ifdef FP8RL_MPI
        if (owns_mpi_) MPI_Finalize();
#endif
    }
    Dist(const Dist&) = delete;
    Dist& operator=(const Dist&) = delete;

    int rank() const { return rank_; }
    int size() const { return size_; }
    bool is_root() const { return rank_ == 0; }

    // How long one collective may wait for the other ranks (--collective_timeout): past it, a rank
    // that failed without aborting or hangs becomes an error naming the call, not an endless wait.
    void set_timeout(double seconds) { timeout_s_ = seconds; }

    // In place: x[i] = sum over ranks, added in rank order 0, 1, ..., N-1 on rank 0.
    template <typename T> void all_reduce_sum(T* x, size_t n) const {
        all_reduce(x, n, [](T a, T b) { return a + b; });
    }
    // In place: x[i] = min (max) over ranks.
    template <typename T> void all_reduce_min(T* x, size_t n) const {
        all_reduce(x, n, [](T a, T b) { return b < a ? b : a; });
    }
    template <typename T> void all_reduce_max(T* x, size_t n) const {
        all_reduce(x, n, [](T a, T b) { return b > a ? b : a; });
    }
    template <typename T> void all_reduce_sum(std::vector<T>& x) const { all_reduce_sum(x.data(), x.size()); }
    template <typename T> void all_reduce_min(std::vector<T>& x) const { all_reduce_min(x.data(), x.size()); }
    template <typename T> void all_reduce_max(std::vector<T>& x) const { all_reduce_max(x.data(), x.size()); }
    template <typename T> T sum(T x) const {
        all_reduce_sum(&x, 1);
        return x;
    }

    // Concatenation over ranks in rank order, on every rank (used for metrics over all tokens).
    template <typename T> std::vector<T> all_gather(const std::vector<T>& x) const {
        if (size_ == 1) return x;
        std::vector<T> out;
#ifdef FP8RL_MPI
        std::vector<int64_t> counts((size_t)size_);
        int64_t mine = (int64_t)x.size();
        MPI_Request req;
        MPI_CHECK(MPI_Iallgather(&mine, 1, MPI_INT64_T, counts.data(), 1, MPI_INT64_T, MPI_COMM_WORLD, &req));
        wait(&req, "MPI_Iallgather");
        std::vector<int> cnt((size_t)size_), disp((size_t)size_);
        int64_t total = 0;
        for (int r = 0; r < size_; r++) {
            cnt[(size_t)r] = (int)counts[(size_t)r];
            disp[(size_t)r] = (int)total;
            total += counts[(size_t)r];
        }
        out.resize((size_t)total);
        MPI_CHECK(MPI_Iallgatherv(x.data(), (int)mine, mpi_type<T>(), out.data(), cnt.data(), disp.data(),
                                  mpi_type<T>(), MPI_COMM_WORLD, &req));
        wait(&req, "MPI_Iallgatherv");
#endif
        return out;
    }

    // Rank 0's values to every rank.
    template <typename T> void broadcast(T* x, size_t n) const {
        if (size_ == 1 || n == 0) return;
#ifdef FP8RL_MPI
        MPI_Request r;
        MPI_CHECK(MPI_Ibcast(x, (int)n, mpi_type<T>(), 0, MPI_COMM_WORLD, &r));
        wait(&r, "MPI_Ibcast");
#else
        (void)x;
#endif
    }

    void barrier() const {
#ifdef FP8RL_MPI
        if (size_ == 1) return;
        MPI_Request r;
        MPI_CHECK(MPI_Ibarrier(MPI_COMM_WORLD, &r));
        wait(&r, "MPI_Ibarrier");
#endif
    }

    // An error on one rank must stop all of them instead of leaving the others waiting forever.
    void abort_all(int code) const {
#ifdef FP8RL_MPI
        if (size_ > 1) MPI_Abort(MPI_COMM_WORLD, code);
#else
        (void)code;
#endif
    }

private:
    int rank_ = 0;
    double timeout_s_ = 600;

#ifdef FP8RL_MPI
    // Polls a nonblocking collective until it completes or timeout_s_ passes.
    void wait(MPI_Request* request, const char* call) const {
        const auto t0 = std::chrono::steady_clock::now();
        for (int done = 0;;) {
            MPI_CHECK(MPI_Test(request, &done, MPI_STATUS_IGNORE));
            if (done) return;
            if (std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() > timeout_s_)
                fail("%s did not complete within %g s (--collective_timeout): another rank failed or hangs; its own error "
                     "line, if any, names the cause",
                     call, timeout_s_);
            std::this_thread::sleep_for(std::chrono::microseconds(20));
        }
    }
#endif

#ifdef FP8RL_MPI
    // mpirun / mpiexec (Open MPI, MPICH, PMIx launchers) set one of these in every rank.
    static bool launched_by_mpi() {
        for (const char* v : {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_RANK", "PMI_RANK"})
            if (getenv(v)) return true;
        return false;
    }
#endif

    // Gathers every rank's x to rank 0, folds them in rank order with op, broadcasts the result.
    template <typename T, typename Op> void all_reduce(T* x, size_t n, Op op) const {
        if (size_ == 1 || n == 0) return;
#ifdef FP8RL_MPI
        std::vector<T> all(rank_ == 0 ? n * (size_t)size_ : 0);  // [ranks, n] on rank 0
        MPI_Request r;
        MPI_CHECK(MPI_Igather(x, (int)n, mpi_type<T>(), all.data(), (int)n, mpi_type<T>(), 0, MPI_COMM_WORLD, &r));
        wait(&r, "MPI_Igather");
        if (rank_ == 0)
            for (size_t i = 0; i < n; i++) {
                T acc = all[i];
                for (int r = 1; r < size_; r++) acc = op(acc, all[(size_t)r * n + i]);
                x[i] = acc;
            }
        broadcast(x, n);
#else
        (void)x;
        (void)op;
#endif
    }
    int size_ = 1;
#ifdef FP8RL_MPI
    bool owns_mpi_ = false;
#endif
};

}  // namespace fp8rl
