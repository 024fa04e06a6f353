// train_rl_cpu.cpp: main() of the CPU reference binary: the command line of rl/driver/cli.h on the CPU
// engine (cpu/engine_cpu.h).
#include "cpu/engine_cpu.h"
#include "rl/driver/cli.h"

int main(int argc, char** argv) { return fp8rl::cli_main<fp8rl::CpuEngine>(argc, argv, "train_rl_cpu", fp8rl::FlagEngine::Cpu); }
