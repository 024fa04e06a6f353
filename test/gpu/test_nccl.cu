// test_nccl.cu: the communicator of cuda/dist/nccl.cuh. Run as one process it checks the one-rank
// path (copies); `make test-gpu-emu` also runs it under `mpirun -np 2` in emulation, where the
// collectives go over MPI, and on a node with several GPUs `mpirun -np N ./test_gpu nccl_` runs it
// over NCCL. Every value is a small integer, so sums are exact in any order.
#include <chrono>
#include <string>
#include <thread>
#include <vector>

#include "cuda/dist/nccl.cuh"
#include "test/gpu/gpu_util.cuh"
#include "test/harness.h"

using namespace fp8rl;

// MPI lives as long as the process: it cannot be initialized twice.
static Dist& the_dist() {
    static Dist dist;
    return dist;
}

TEST(nccl_collectives_match_their_definition_on_every_rank) {
    REQUIRE_GPU();
    const Dist& dist = the_dist();
    Communicator comm(dist, 60);
    const int R = comm.size(), r = comm.rank();
    const size_t n = 1000 + 3;  // not a multiple of anything
    printf("    rank %d of %d\n", r, R);

    std::vector<float> x(n);
    for (size_t i = 0; i < n; i++) x[i] = (float)((r + 1) * (int)(i % 97)) + 0.5f;
    DeviceBuffer<float> d_x(x);
    comm.all_reduce_sum(d_x.ptr, n, 0);
    std::vector<float> sum = d_x.download();
    int bad = 0;
    for (size_t i = 0; i < n; i++) bad += sum[i] != (float)(R * (R + 1) / 2 * (int)(i % 97)) + 0.5f * R;
    CHECK_MSG(bad == 0, "all_reduce_sum: %d of %zu wrong", bad, n);

    std::vector<double> xd(n);
    for (size_t i = 0; i < n; i++) xd[i] = (double)((r + 1) * (int)(i % 89)) + 0.25;
    DeviceBuffer<double> d_xd(xd);
    comm.all_reduce_sum(d_xd.ptr, n, 0);
    std::vector<double> sumd = d_xd.download();
    bad = 0;
    for (size_t i = 0; i < n; i++) bad += sumd[i] != (double)(R * (R + 1) / 2 * (int)(i % 89)) + 0.25 * R;
    CHECK_MSG(bad == 0, "all_reduce_sum (double): %d of %zu wrong", bad, n);

    std::vector<float> blocks((size_t)R * n);  // x [R][n]: block s is summed into rank s's block
    for (int s = 0; s < R; s++)
        for (size_t i = 0; i < n; i++) blocks[(size_t)s * n + i] = (float)(r * 1000 + s * 10 + (int)(i % 7));
    DeviceBuffer<float> d_blocks(blocks);
    comm.reduce_scatter_sum(d_blocks.ptr, n, 0);
    std::vector<float> after = d_blocks.download();
    bad = 0;
    for (size_t i = 0; i < n; i++) {
        float want = 0;
        for (int q = 0; q < R; q++) want += (float)(q * 1000 + r * 10 + (int)(i % 7));
        bad += after[(size_t)r * n + i] != want;
    }
    CHECK_MSG(bad == 0, "reduce_scatter_sum: %d of %zu wrong in rank %d's block", bad, n, r);

    // reduce_sum to the last rank: the sum there, every other rank's x as it was
    std::vector<float> y(n);
    for (size_t i = 0; i < n; i++) y[i] = (float)(r * 100 + (int)(i % 13));
    DeviceBuffer<float> d_y(y);
    comm.reduce_sum(d_y.ptr, n, R - 1, 0);
    std::vector<float> reduced = d_y.download();
    bad = 0;
    for (size_t i = 0; i < n; i++) {
        float want = y[i];
        if (r == R - 1) {
            want = 0;
            for (int q = 0; q < R; q++) want += (float)(q * 100 + (int)(i % 13));
        }
        bad += reduced[i] != want;
    }
    CHECK_MSG(bad == 0, "reduce_sum to rank %d: %d of %zu wrong on rank %d", R - 1, bad, n, r);

    std::vector<__nv_bfloat16> part(n);
    for (size_t i = 0; i < n; i++) part[i] = __float2bfloat16((float)(r * 64 + (int)(i % 64)));
    DeviceBuffer<__nv_bfloat16> d_part(part), d_all((size_t)R * n);
    comm.all_gather(d_part.ptr, d_all.ptr, n, 0);
    std::vector<__nv_bfloat16> all = d_all.download();
    bad = 0;
    for (int s = 0; s < R; s++)
        for (size_t i = 0; i < n; i++) bad += __bfloat162float(all[(size_t)s * n + i]) != (float)(s * 64 + (int)(i % 64));
    CHECK_MSG(bad == 0, "all_gather: %d of %zu wrong", bad, (size_t)R * n);

    std::vector<int> b(n, r == R - 1 ? 7 : -1);
    DeviceBuffer<int> d_b(b);
    comm.broadcast(d_b.ptr, n, R - 1, 0);
    std::vector<int> got = d_b.download();
    bad = 0;
    for (int v : got) bad += v != 7;
    CHECK_MSG(bad == 0, "broadcast from rank %d: %d of %zu wrong", R - 1, bad, n);
}

// A rank that does not arrive: the collective fails after its timeout with an error naming the
// call, instead of waiting forever. Rank 1 joins 2 s late, with a patient timeout, and gets the sum
// (rank 0's part was posted); rank 0's 0.5 s run out first. Emulation only: over NCCL rank 0 aborts
// its communicator, so a late rank 1 could only time out too.
TEST(nccl_collective_times_out_naming_the_call) {
    REQUIRE_GPU();
#ifndef FP8RL_EMU
    SKIP("emulation only (over NCCL the timed-out rank aborts the communicator)");
#endif
    const Dist& dist = the_dist();
    if (dist.size() < 2) SKIP("needs 2 ranks (mpirun -np 2)");
    const int r = dist.rank();
    Communicator comm(dist, r == 0 ? 0.5 : 60);
    const size_t n = 257;
    // kept: rank 0's abandoned collective completes into it when rank 1 arrives
    float* x = nullptr;
    CUDA_CHECK(cudaMalloc(&x, n * sizeof(float)));
    std::vector<float> ones(n, 1.0f);
    CUDA_CHECK(cudaMemcpy(x, ones.data(), n * sizeof(float), cudaMemcpyHostToDevice));
    if (r == 0) {
        const auto t0 = std::chrono::steady_clock::now();
        std::string message;
        try {
            comm.all_reduce_sum(x, n, 0);
        } catch (const Error& e) {
            message = e.what();
        }
        const double waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        CHECK_MSG(message.find("MPI_Iallreduce did not complete within 0.5 s") != std::string::npos, "error: \"%s\"",
                  message.c_str());
        CHECK_MSG(waited >= 0.5 && waited < 1.9, "waited %.2f s", waited);
    } else {
        std::this_thread::sleep_for(std::chrono::seconds(2));
        comm.all_reduce_sum(x, n, 0);
        std::vector<float> sum(n);
        CUDA_CHECK(cudaMemcpy(sum.data(), x, n * sizeof(float), cudaMemcpyDeviceToHost));
        int bad = 0;
        for (float v : sum) bad += v != (float)dist.size();
        CHECK_MSG(bad == 0, "the late rank's sum: %d of %zu wrong", bad, n);
    }
    dist.barrier();
}

// A rank that never arrives at the communicator's creation (ncclCommInitRankConfig over NCCL, the
// same rendezvous at rank 0 in emulation): rank 0 gives up after its 0.5 s with an error naming the
// creation, and rank 1, which never creates one, meets it again at the barrier. Emulation only, as
// above (over NCCL, ./test_gpu on several GPUs, the aborted creation would end the run).
TEST(nccl_communicator_creation_times_out_when_a_rank_never_arrives) {
    REQUIRE_GPU();
#ifndef FP8RL_EMU
    SKIP("emulation only (over NCCL the timed-out rank aborts the communicator)");
#endif
    const Dist& dist = the_dist();
    if (dist.size() < 2) SKIP("needs 2 ranks (mpirun -np 2)");
    if (dist.rank() == 0) {
        const auto t0 = std::chrono::steady_clock::now();
        std::string message;
        try {
            Communicator comm(dist, 0.5);
        } catch (const Error& e) {
            message = e.what();
        }
        const double waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        CHECK_MSG(message.find("creation (waiting for every rank) did not complete within 0.5 s (--collective_timeout)") !=
                      std::string::npos,
                  "error: \"%s\"", message.c_str());
        CHECK_MSG(waited >= 0.5 && waited < 1.9, "waited %.2f s", waited);
    }
    dist.barrier();
}

// The host's collectives (rl/driver/dist.h) are bounded the same way: rank 1 reaches a barrier 2 s late,
// rank 0 gives up after 0.5 s with an error naming the call; rank 1's late barrier then completes
// against rank 0's abandoned one.
TEST(nccl_dist_host_collective_times_out_naming_the_call) {
    Dist& dist = the_dist();
    if (dist.size() < 2) SKIP("needs 2 ranks (mpirun -np 2)");
    if (dist.rank() == 0) {
        dist.set_timeout(0.5);
        const auto t0 = std::chrono::steady_clock::now();
        std::string message;
        try {
            dist.barrier();
        } catch (const Error& e) {
            message = e.what();
        }
        const double waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        CHECK_MSG(message.find("MPI_Ibarrier did not complete within 0.5 s") != std::string::npos, "error: \"%s\"", message.c_str());
        CHECK_MSG(waited >= 0.5 && waited < 1.9, "waited %.2f s", waited);
        dist.set_timeout(600);
    } else {
        std::this_thread::sleep_for(std::chrono::seconds(2));
        dist.barrier();
    }
    dist.barrier();
}
