// test_nccl.cu: the communicator of cuda/nccl.cuh. Run as one process it checks the one-rank
// path (copies); `make test-gpu-emu` also runs it under `mpirun -np 2` in emulation, where the
// collectives go over MPI, and on a node with several GPUs `mpirun -np N ./test_gpu nccl_` runs it
// over NCCL. Every value is a small integer, so sums are exact in any order.
#include <vector>

#include "cuda/nccl.cuh"
#include "test/gpu/gpu_util.cuh"
#include "test/harness.h"

using namespace fp8rl;

TEST(nccl_collectives_match_their_definition_on_every_rank) {
    REQUIRE_GPU();
    static Dist dist;  // MPI lives as long as the process: it cannot be initialized twice
    Communicator comm(dist);
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

    std::vector<float> blocks((size_t)R * n);  // in [R][n]: block s goes to rank s
    for (int s = 0; s < R; s++)
        for (size_t i = 0; i < n; i++) blocks[(size_t)s * n + i] = (float)(r * 1000 + s * 10 + (int)(i % 7));
    DeviceBuffer<float> d_in(blocks), d_out(n);
    comm.reduce_scatter_sum(d_in.ptr, d_out.ptr, n, 0);
    std::vector<float> mine = d_out.download();
    bad = 0;
    for (size_t i = 0; i < n; i++) {
        float want = 0;
        for (int q = 0; q < R; q++) want += (float)(q * 1000 + r * 10 + (int)(i % 7));
        bad += mine[i] != want;
    }
    CHECK_MSG(bad == 0, "reduce_scatter_sum: %d of %zu wrong on rank %d", bad, n, r);

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
