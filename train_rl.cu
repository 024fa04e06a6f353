// train_rl.cu: main() of the GPU binary, the product: the command line of rl/driver/cli.h (the flags of
// train_rl_cpu, one table) on the GPU engine (cuda/engine/engine_gpu.cuh): training, --logprobs and
// --prompt / --prompts all run on the device. Built by nvcc for sm_90 as ./train_rl, and by g++ in
// emulation as ./train_rl_emu (docs/gpu-emulation.md).
#include "cuda/engine/engine_gpu.cuh"
#include "rl/driver/cli.h"

int main(int argc, char** argv) {
    try {
        fp8rl::select_device_before_mpi();  // the launcher's local rank; the engine checks it after MPI_Init
    } catch (const fp8rl::Error& e) {
        fprintf(stderr, "error: %s\n", e.what());
        return 1;
    }
    return fp8rl::cli_main<fp8rl::GpuEngine>(argc, argv, "train_rl", fp8rl::FlagEngine::Gpu);
}
