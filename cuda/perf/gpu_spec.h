// gpu_spec.h: the GPU the performance model prices for and every constant the model rests on, each
// with its source (the table in docs/perf-model.md, "The constants", says more): the datasheet, the
// CUDA programming guide, microbenchmark papers, published kernel tables, what was measured on this
// workplace's GPUs, or an estimate, said so. `build/perf_model --json` prints them with every
// prediction (assumptions), and `build/perf_model --calibrate DIR` names those a GPU run contradicts.
#pragma once
#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

namespace fp8rl {

struct GpuSpec {
    const char* name = "H100";
    double hbm = 3.35e12;  // bytes/s, the datasheet's (H100 SXM 3.35 TB/s, H200 4.8)
    int sms = 132;
    // the clock of the datasheet's dense peaks: 989.4 TFLOP/s BF16 = 132 SMs x 4096 FLOP a clock x 1.83 GHz
    double peak_clock = 1.83e9;
    // the SM clock under sustained load (power-capped); estimate (perf-anchors.md's reading: ~1.755 GHz)
    double clock = 1.755e9;
    // streaming kernels reach this fraction of hbm: a device-to-device copy measured 4.3 of 4.8 TB/s on
    // this workplace's H200s (.library/device/KINDS.md)
    double hbm_efficiency = 0.90;
    double launch_s = 3e-6;  // per launch or graph node: the gap between back-to-back kernels (estimate)
    // round trips in SM clocks, under load: an L2 hit, an HBM access (estimates: perf-anchors.md's
    // reading, L2 [250-450])
    double l2_latency = 300, hbm_latency = 1000;
    // L2: what its hits deliver to the SMs, bytes/s (estimate, ~1.6x the H100's HBM; Chips and Cheese,
    // "Nvidia's H100: Funny L2, and Tons of Bandwidth", 2023, measured the L2 of an H100 PCIe at
    // several TB/s); its capacity (the H100/H200 whitepaper: 50 MB), of which a working set counts as
    // resident up to l2_resident_fraction (estimate: the other traffic and the replacement policy
    // take the rest)
    double l2_bandwidth = 5.5e12, l2_capacity = 50 * 1048576.0, l2_resident_fraction = 0.75;
    // a dependent FP32 / integer instruction's latency in clocks (a chain of them issues this far apart)
    double dependent_issue = 4;
    // sustained issue per SM = 4 w / (w + ipc_half), w = warps resident per scheduler (4 schedulers):
    // 2.5 at one warp a scheduler, 3.6 at six (estimate fitted to perf-anchors.md's 2.5-3.6 of 4)
    double ipc_half = 0.6;
    // shared memory: 32 banks x 4 bytes a clock (the CUDA programming guide), ~0.9 of it sustained (estimate)
    double smem_bytes_per_clock = 128 * 0.9;
    int max_threads_per_sm = 2048, max_ctas_per_sm = 32;                // compute capability 9.0
    double smem_per_sm = 228 * 1024.0, smem_reserved_per_cta = 1024;    // ditto (1 KB reserved per CTA)
    int registers_per_sm = 65536, register_unit = 8;  // ditto: 64K 32-bit registers, a thread's in units of 8
    // cuBLASLt at training shapes (m, n, k >= 1024): BF16 ~700 TFLOP/s (FBGEMM PR #2546: 585 on an H100;
    // 769-798 measured here at 8192^3 on an H200), FP8 block-scaled (1x128 / 128x128) ~1.0 PFLOP/s
    // (FBGEMM's blockwise 870 GEMM-only; DeepGEMM up to 1,550 on an H800; cuBLAS 12.9: 1.25-1.75x BF16)
    double gemm_bf16 = 0.70e15, gemm_fp8 = 1.0e15;
    int gemm_tile = 128;  // a cuBLASLt CTA's output tile, 128 x 128 (estimate: Hopper's usual tile), for waves
    // what one GEMM CTA streams from HBM when the weights' bytes bound it (decode): Little's law, ~64 KB of
    // stages in flight over ~0.57 us of HBM latency (estimate)
    double gemm_cta_bandwidth = 112e9;
    // NCCL all-reduce bus bandwidth over NVLink, 8 GPUs (NCCL's maintainer, nccl-tests #212: ~370 GB/s
    // effective per direction for ring algorithms; NVLink SHARP reaches ~480)
    double nccl_bus_bandwidth = 370e9;

    double bf16_peak() const { return sms * peak_clock * 4096.0; }
    double fp8_peak() const { return 2 * bf16_peak(); }
    double bandwidth() const { return hbm * hbm_efficiency; }
    // Sustained warp instructions a clock on one SM with `warps` warps resident.
    double sustained_ipc(double warps) const {
        const double w = std::max(warps, 1.0) / 4;
        return 4 * w / (w + ipc_half);
    }
    // CTAs of `threads` threads, `smem` bytes of shared memory and `registers` registers a thread resident
    // on one SM (registers are not in sass_counts.h: 0, not known, is assumed not to bind).
    int resident_ctas(int threads, double smem, int registers = 0) const {
        const int by_smem = (int)(smem_per_sm / (smem + smem_reserved_per_cta));
        const int by_registers = registers > 0 ? registers_per_sm / (((registers + register_unit - 1) / register_unit) *
                                                                     register_unit * threads)
                                               : max_ctas_per_sm;
        return std::max(1, std::min({max_ctas_per_sm, max_threads_per_sm / threads, by_smem, by_registers}));
    }
};
// DeepGEMM's dense FP8 block-scaled GEMM (1x128 activations, 128x128 weights) on an H800 SXM (the H100's
// SMs and clocks, NVLink cut), M = 4,096 tokens: its README at commit 55ab91f ("Update performance"),
// TFLOP/s. PRs #74 / #81 reach 1,204 (7168 x 2048) to 1,500 (7168 x 16384) with 128 x 160 and 256 x 128
// tiles; ours is 128 x 128, so the README's rows are the ceiling.
struct DeepGemmRate {
    double n, k, tflops;  // n: output features (our m), k: the reduction
};
constexpr DeepGemmRate kDeepGemmRates[] = {{2112, 7168, 1009}, {24576, 1536, 1125}, {32768, 512, 751},
                                           {7168, 16384, 1426}, {4096, 7168, 1265}, {7168, 2048, 1168}};
constexpr double kDeepGemmTokens = 4096;

// FlashAttention-3 on an H100 SXM5, BF16, head dim 128, 16k tokens a batch (the FA3 paper, arXiv
// 2407.08608, its figures "Attention forward speed, head dim 128" with the causal mask and "Attention
// backward speed, head dim 128", which has no causal run), TFLOP/s at 512, 1k, 2k, 4k tokens a sequence:
// forward 292/423/521/579 (perf-anchors.md), backward 316/424/501/542 (FA2 214/260/291/310 in the same
// figure: attention_tflops's ratios). FA3 is warp-specialized with TMA loads and softmax overlapped by a
// second warpgroup; ours has FA2's structure on wgmma, so these rates bound ours from above: a ceiling,
// not a target (a causal backward does no better than the unmasked one: its diagonal tiles waste half).
constexpr double kFa3ForwardTflops[4] = {292, 423, 521, 579}, kFa3BackwardTflops[4] = {316, 424, 501, 542};

inline GpuSpec h100() { return GpuSpec(); }
inline GpuSpec h200() {
    GpuSpec g;
    g.name = "H200", g.hbm = 4.8e12;
    return g;
}

// One constant as --json prints it.
struct Assumption {
    std::string name;
    double value;
    const char* unit;
    const char* source;
};

inline std::vector<Assumption> assumptions(const GpuSpec& g) {
    return {
        {"hbm_bytes_per_s", g.hbm, "B/s", "datasheet (H100 SXM 3.35 TB/s, H200 4.8)"},
        {"hbm_efficiency", g.hbm_efficiency, "", "measured: device-to-device copy 4.3 of 4.8 TB/s on an H200 (.library/device/KINDS.md)"},
        {"peak_clock_hz", g.peak_clock, "Hz", "datasheet: 989.4 TFLOP/s = 132 x 4096 x 1.83 GHz"},
        {"clock_under_load_hz", g.clock, "Hz", "estimate (perf-anchors.md's reading); power-capped clocks: docs/perf-model.md"},
        {"launch_s", g.launch_s, "s", "estimate: gap between back-to-back kernels or graph nodes"},
        {"l2_latency_clocks", g.l2_latency, "clocks", "estimate under load, perf-anchors.md [250-450]; Hopper dissection papers (arXiv 2402.13499, 2501.12084)"},
        {"l2_bytes_per_s", g.l2_bandwidth, "B/s", "estimate: Chips and Cheese's H100 PCIe L2 measurements (2023), ~1.6x HBM"},
        {"l2_capacity_bytes", g.l2_capacity, "B", "H100 whitepaper: 50 MB (H200 the same die)"},
        {"l2_resident_fraction", g.l2_resident_fraction, "", "estimate: share of L2 a reused working set keeps (docs/perf-model.md)"},
        {"hbm_latency_clocks", g.hbm_latency, "clocks", "estimate under load (perf-anchors.md)"},
        {"dependent_issue_clocks", g.dependent_issue, "clocks", "estimate: dependent FP32/INT latency (Hopper dissection papers: ~4)"},
        {"ipc_half_warps", g.ipc_half, "warps/scheduler", "estimate: sustained IPC 4w/(w+0.6): 2.5 at 1 warp a scheduler, 3.6 at 6 (perf-anchors.md)"},
        {"smem_bytes_per_clock", g.smem_bytes_per_clock, "B/clock/SM", "CUDA guide: 32 banks x 4 B; 0.9 sustained (estimate)"},
        {"gemm_bf16_flops", g.gemm_bf16, "FLOP/s", "FBGEMM PR #2546 585 TF (H100); measured 769-798 TF at 8192^3 (H200)"},
        {"gemm_fp8_block_flops", g.gemm_fp8, "FLOP/s", "FBGEMM PR #2546 blockwise 870 TF; DeepGEMM <= 1,550 (H800); cuBLAS 12.9 1.25-1.75x BF16"},
        {"deepgemm_fp8_block_flops", 1426e12, "FLOP/s", "ceiling of the own FP8 block GEMM by shape class (kDeepGemmRates; this is the best): DeepGEMM README at 55ab91f, H800, M=4096: N x K 7168 x 16384 1426, 4096 x 7168 1265, 7168 x 2048 1168, 24576 x 1536 1125, 2112 x 7168 1009, 32768 x 512 751 TF"},
        {"fa3_attention_flops", 579e12, "FLOP/s", "ceiling of the training attention by sequence length (kFa3ForwardTflops, kFa3BackwardTflops; this is the best): FA3 paper (arXiv 2407.08608), H100, head dim 128: forward causal 292/423/521/579, backward 316/424/501/542 TF at 512/1k/2k/4k"},
        {"gemm_tile", (double)g.gemm_tile, "rows", "estimate: cuBLASLt Hopper CTA tile 128 x 128 (waves)"},
        {"gemm_cta_bytes_per_s", g.gemm_cta_bandwidth, "B/s", "estimate: Little's law, 64 KB in flight / HBM latency"},
        {"nccl_bus_bytes_per_s", g.nccl_bus_bandwidth, "B/s", "NCCL maintainer, nccl-tests issue #212: ~370 GB/s (ring, H100 NVLink)"},
    };
}

}  // namespace fp8rl
