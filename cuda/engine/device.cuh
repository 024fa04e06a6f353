// device.cuh: which GPU a rank runs on (spec-gpu.md §6), the same code in both builds. A rank
// takes its node-local rank modulo the GPUs it sees: launchers that give each rank its own
// CUDA_VISIBLE_DEVICES (SLURM --gpus-per-task, Kubernetes) show every rank one GPU, its own, and
// ranks that see the same GPUs spread over them. Two ranks that would run on the same GPU are an
// error, found by comparing the PCI bus ids the ranks of a node chose.
#ifndef FP8RL_CUDA_DEVICE_CUH
#define FP8RL_CUDA_DEVICE_CUH
#include <cstdlib>
#include <string>
#include <vector>

#include "cuda/common.cuh"
#include "rl/driver/dist.h"

namespace fp8rl {

// The node-local rank the launcher announces (Open MPI, MPICH/Intel MPI, SLURM), or -1: readable
// before MPI_Init, so the device is chosen before MPI (and NCCL, or a CUDA-aware MPI) touches one.
inline int launcher_local_rank() {
    for (const char* v : {"OMPI_COMM_WORLD_LOCAL_RANK", "MPI_LOCALRANKID", "SLURM_LOCALID"}) {
        const char* s = getenv(v);
        if (s && *s) return atoi(s);
    }
    return -1;
}

// The device of node-local rank `local_rank` among `visible` GPUs.
inline int device_for_rank(int local_rank, int visible) { return local_rank % visible; }

// "" when no two ranks of a node chose the same GPU, else one line naming them; bus_ids[r] is the
// PCI bus id of the GPU of node-local rank r.
inline std::string shared_gpu_error(const std::vector<std::string>& bus_ids) {
    for (size_t a = 0; a < bus_ids.size(); a++)
        for (size_t b = a + 1; b < bus_ids.size(); b++)
            if (bus_ids[a] == bus_ids[b])
                return strfmt("ranks %zu and %zu of this node would share the GPU at PCI %s: start at most one rank per "
                              "visible GPU (mpirun -npernode N), or give each rank its own CUDA_VISIBLE_DEVICES",
                              a, b, bus_ids[a].c_str());
    return "";
}

// Sets the device of this process from the launcher's local rank; does nothing without one or
// without a GPU (select_device reports that). Call it before MPI_Init.
inline void select_device_before_mpi() {
    const int local = launcher_local_rank();
    int n = 0;
    if (local < 0 || cudaGetDeviceCount(&n) != cudaSuccess || n == 0) {
        cudaGetLastError();  // no device is select_device's error, not this one's
        return;
    }
    CUDA_CHECK(cudaSetDevice(device_for_rank(local, n)));
}

// The PCI bus id of every node-local rank's GPU, gathered over the node (collective when MPI runs).
inline std::vector<std::string> node_bus_ids(int device) {
    char id[32] = {};
    CUDA_CHECK(cudaDeviceGetPCIBusId(id, (int)sizeof id, device));
    std::vector<std::string> ids{id};
#ifdef FP8RL_MPI
    int inited = 0, finalized = 0;
    MPI_CHECK(MPI_Initialized(&inited));
    MPI_CHECK(MPI_Finalized(&finalized));
    if (!inited || finalized) return ids;
    MPI_Comm node;
    MPI_CHECK(MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &node));
    int size = 1;
    MPI_CHECK(MPI_Comm_size(node, &size));
    std::vector<char> all((size_t)size * sizeof id);
    MPI_CHECK(MPI_Allgather(id, (int)sizeof id, MPI_CHAR, all.data(), (int)sizeof id, MPI_CHAR, node));
    MPI_CHECK(MPI_Comm_free(&node));
    ids.clear();
    for (int r = 0; r < size; r++) ids.emplace_back(all.data() + (size_t)r * sizeof id);
#endif
    return ids;
}

// Picks this rank's GPU (its node-local rank modulo the visible GPUs), sets it and checks that no
// other rank of the node chose the same one; returns the device.
inline int select_device() {
    int n = 0;
    cudaError_t e = cudaGetDeviceCount(&n);
    if (e != cudaSuccess || n == 0)
        fail("no CUDA device (%s): train_rl needs an NVIDIA GPU; on a machine without one, train_rl_emu runs the same "
             "engine on the CPU",
             e != cudaSuccess ? cudaGetErrorString(e) : "none found");
    const int device = device_for_rank(node_local_rank(), n);
    CUDA_CHECK(cudaSetDevice(device));
    std::string why = shared_gpu_error(node_bus_ids(device));
    if (!why.empty()) fail("%s", why.c_str());
    return device;
}

}  // namespace fp8rl

#endif  // FP8RL_CUDA_DEVICE_CUH
