// test_profile.cu: the emulation's profile (cuda/perf/profile_range.h's PROFILE_RANGE, cuda/emu/emu_stats.cpp):
// a known sequence of launches, GEMMs, copies, sets, synchronizations and graph replays in nested
// ranges counts as written out here; FP8RL_EMU_STATS writes them as JSON at exit; and one decoder
// layer's forward in launches + GEMM calls (issue 28's bound: at most 10 in fp8, 9 in bf16), from two
// random models that differ only in depth. The counters exist in emulation only; on a GPU, Nsight
// Systems shows the same ranges (NVTX).
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <string>
#include <vector>

#include "cuda/engine/engine_gpu.cuh"
#include "cuda/perf/profile_range.h"
#include "rl/io/json.h"
#include "rl/model/init_model.h"
#include "test/gpu/bench_model.h"
#include "test/gpu/gpu_util.cuh"
#include "test/harness.h"
#include "test/run_binary.h"

#ifdef FP8RL_EMU
using namespace fp8rl;

namespace {

__global__ void profile_fill_kernel(float* x, int n, float v) {
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) x[i] = v;
}
template <class T>
__global__ void profile_scale_kernel(T* x, int n, T a) {
    for (int i = threadIdx.x; i < n; i += blockDim.x) x[i] *= a;
}

void check_stats(const char* range, const emu::RangeStats& s, const emu::RangeStats& want) {
    CHECK_MSG(s.calls == want.calls && s.kernel_launches == want.kernel_launches && s.gemm_calls == want.gemm_calls &&
                  s.host_syncs == want.host_syncs && s.h2d_copies == want.h2d_copies && s.d2h_copies == want.d2h_copies &&
                  s.memset_bytes == want.memset_bytes && s.graph_launches == want.graph_launches,
              "%s: calls %llu kernels %llu gemms %llu syncs %llu h2d %llu d2h %llu memset %llu graphs %llu, want %llu %llu %llu "
              "%llu %llu %llu %llu %llu", range, (unsigned long long)s.calls, (unsigned long long)s.kernel_launches,
              (unsigned long long)s.gemm_calls, (unsigned long long)s.host_syncs, (unsigned long long)s.h2d_copies,
              (unsigned long long)s.d2h_copies, (unsigned long long)s.memset_bytes, (unsigned long long)s.graph_launches,
              (unsigned long long)want.calls, (unsigned long long)want.kernel_launches, (unsigned long long)want.gemm_calls,
              (unsigned long long)want.host_syncs, (unsigned long long)want.h2d_copies, (unsigned long long)want.d2h_copies,
              (unsigned long long)want.memset_bytes, (unsigned long long)want.graph_launches);
    CHECK_MSG(s.kernels == want.kernels, "%s: the launches per kernel differ", range);
    CHECK_MSG(s.ctas == want.ctas, "%s: the CTAs per kernel differ", range);
}

}  // namespace

// outer { sync H2D copy; inner { 2 fills, a set, outer again { a scale }, an async D2H copy, a
// stream sync }; replay { 3 launches of a graph of a scale, a GEMM, a set and a D2H copy; a device
// sync } }, a range entered during a capture, then inner again, empty; one fill before the ranges and
// one after counting stops.
TEST(emu_stats_count_nested_ranges_and_graph_replays) {
    const int n = 256;
    DeviceBuffer<float> x(n), d(n);
    DeviceBuffer<__nv_bfloat16> a(n), b(n);
    std::vector<float> host(n, 1.0f);
    cudaStream_t stream;
    CUDA_CHECK(cudaStreamCreate(&stream));
    GemmRunner gemm;
    fill_uniform(a.ptr, n, 1, 1.0f), fill_uniform(b.ptr, n, 2, 1.0f);
    gemm.bf16("profile", 16, 16, 16, a.ptr, b.ptr, d.ptr, GemmOut::F32, stream);  // its plan, before the capture
    cudaGraph_t graph;
    cudaGraphExec_t exec;
    CUDA_CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal));
    LAUNCH_KERNEL(profile_scale_kernel<float>, 1, 64, 0, stream, x.ptr, n, 0.5f);
    gemm.bf16("profile", 16, 16, 16, a.ptr, b.ptr, d.ptr, GemmOut::F32, stream);
    CUDA_CHECK(cudaMemsetAsync(d.ptr, 0, 64, stream));
    CUDA_CHECK(cudaMemcpyAsync(host.data(), x.ptr, n * sizeof(float), cudaMemcpyDeviceToHost, stream));
    CUDA_CHECK(cudaStreamEndCapture(stream, &graph));
    CUDA_CHECK(cudaGraphInstantiate(&exec, graph, 0));
    CUDA_CHECK(cudaDeviceSynchronize());

    emu::start_stats();
    LAUNCH_KERNEL(profile_fill_kernel, 1, 64, 0, stream, x.ptr, n, 2.0f);
    {
        PROFILE_RANGE("outer");
        CUDA_CHECK(cudaMemcpy(x.ptr, host.data(), n * sizeof(float), cudaMemcpyHostToDevice));
        {
            PROFILE_RANGE("inner");
            LAUNCH_KERNEL(profile_fill_kernel, 1, 64, 0, stream, x.ptr, n, 3.0f);
            LAUNCH_KERNEL(profile_fill_kernel, 3, 64, 0, stream, x.ptr, n, 4.0f);  // 3 CTAs
            CUDA_CHECK(cudaMemsetAsync(x.ptr, 0, 100, stream));
            {
                PROFILE_RANGE("outer");  // entered again while open: counts once, one call
                LAUNCH_KERNEL(profile_scale_kernel<float>, 1, 64, 0, stream, x.ptr, n, 2.0f);
            }
            CUDA_CHECK(cudaMemcpyAsync(host.data(), x.ptr, n * sizeof(float), cudaMemcpyDeviceToHost, stream));
            CUDA_CHECK(cudaStreamSynchronize(stream));
        }
        {
            PROFILE_RANGE("replay");
            for (int i = 0; i < 3; i++) CUDA_CHECK(cudaGraphLaunch(exec, stream));
            CUDA_CHECK(cudaDeviceSynchronize());
        }
    }
    CUDA_CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal));
    {
        PROFILE_RANGE("captured");  // entered while a capture records: nothing runs, not even a call
        LAUNCH_KERNEL(profile_fill_kernel, 1, 64, 0, stream, x.ptr, n, 6.0f);
    }
    cudaGraph_t unused;
    CUDA_CHECK(cudaStreamEndCapture(stream, &unused));
    CUDA_CHECK(cudaGraphDestroy(unused));
    { PROFILE_RANGE("inner"); }
    emu::stop_stats();
    LAUNCH_KERNEL(profile_fill_kernel, 1, 64, 0, stream, x.ptr, n, 5.0f);
    CUDA_CHECK(cudaStreamSynchronize(stream));

    //                  calls kernels gemms syncs h2d d2h memset graphs  kernels by name, then their CTAs
    check_stats("inner", emu::range_stats("inner"),
                {2, 3, 0, 1, 0, 1, 100, 0, {{"profile_fill_kernel", 2}, {"profile_scale_kernel", 1}},
                 {{"profile_fill_kernel", 4}, {"profile_scale_kernel", 1}}});
    check_stats("replay", emu::range_stats("replay"),
                {1, 3, 3, 1, 0, 3, 3 * 64, 3, {{"profile_scale_kernel", 3}}, {{"profile_scale_kernel", 3}}});
    check_stats("outer", emu::range_stats("outer"),
                {1, 6, 3, 3, 1, 4, 100 + 3 * 64, 3, {{"profile_fill_kernel", 2}, {"profile_scale_kernel", 4}},
                 {{"profile_fill_kernel", 4}, {"profile_scale_kernel", 4}}});
    check_stats("total", emu::total_stats(),
                {1, 7, 3, 3, 1, 4, 100 + 3 * 64, 3, {{"profile_fill_kernel", 3}, {"profile_scale_kernel", 4}},
                 {{"profile_fill_kernel", 5}, {"profile_scale_kernel", 4}}});
    check_stats("captured", emu::range_stats("captured"), {});
    check_stats("never entered", emu::range_stats("never"), {});
    CUDA_CHECK(cudaGraphExecDestroy(exec));
    CUDA_CHECK(cudaGraphDestroy(graph));
    CUDA_CHECK(cudaStreamDestroy(stream));
}

// The test runs itself as a child under FP8RL_EMU_STATS, which launches one kernel in a range.
TEST(emu_stats_file_is_written_at_exit) {
    if (getenv("FP8RL_EMU_STATS_CHILD")) {
        DeviceBuffer<float> x(64);
        PROFILE_RANGE("child");
        LAUNCH_KERNEL(profile_fill_kernel, 2, 64, 0, 0, x.ptr, 64, 1.0f);
        return;
    }
    const std::string file = harness::scratch_dir() + "/emu_stats.json";
    std::remove(file.c_str());
    harness::RunResult r = harness::run_this_test("FP8RL_EMU_STATS_CHILD=1 FP8RL_EMU_STATS=" + file,
                                                  "emu_stats_file_is_written_at_exit");
    CHECK_MSG(r.status == 0, "the child failed (exit %d): %s", r.status, r.output.c_str());
    const Json j = json_parse(read_file(file), file);
    const Json* child = j.find("ranges") ? j.find("ranges")->find("child") : nullptr;
    const Json* total = j.find("total");
    CHECK(child && total);
    if (!child || !total) return;
    for (const char* field : {"calls", "kernel_launches", "gemm_calls", "host_syncs", "h2d_copies", "d2h_copies",
                              "memset_bytes", "graph_launches", "kernels", "ctas"})
        CHECK_MSG(child->find(field) && total->find(field), "no \"%s\" in %s", field, file.c_str());
    CHECK_EQ(child->find("calls")->integer, 1);
    CHECK_EQ(child->find("kernel_launches")->integer, 1);
    CHECK_EQ(child->find("kernels")->find("profile_fill_kernel")->integer, 1);
    CHECK_EQ(child->find("ctas")->find("profile_fill_kernel")->integer, 2);
    CHECK_EQ(total->find("kernel_launches")->integer, 1);
}

namespace {

// A random Qwen3 of `layers` layers whose every linear dimension is a multiple of 128 (hidden 128,
// 2 heads and 2 KV heads of 64, intermediate 256), so the FP8 path needs no padding of its own.
std::string depth_model(int layers) {
    const BenchModel m = {"depth", 128, 256, layers, 2, 2, 64, 512};
    const std::string dir = harness::scratch_dir() + "/profile_depth_" + std::to_string(layers);
    write_random_model(dir, bench_model_config(m), {}, 1);
    return dir;
}

// What the `forward` range counted in one log-prob pass (after one unmeasured pass: lazy set-up).
emu::RangeStats forward_stats(GpuEngine& engine, const std::vector<Sequence>& seqs, Precision p) {
    TokenValues lp;
    engine.logprobs(seqs, p, 1.0f, &lp, nullptr);
    emu::start_stats();
    engine.logprobs(seqs, p, 1.0f, &lp, nullptr);
    emu::stop_stats();
    return emu::range_stats("forward");
}

}  // namespace

// One decoder layer's forward in kernel launches + GEMM calls: the `forward` range of a 2-layer
// model less that of the same model with 1 layer (embedding, final norm and head cancel), with the
// per-kernel difference printed. Issue 28's bound, for when quantization is fused into the kernels
// that produce the operands and q/k/v and gate/up are one GEMM each; unfused it is 17 and 24.
TEST(forward_launches_per_layer) {
    GpuEngine shallow(depth_model(1)), deep(depth_model(2));
    std::vector<Sequence> seqs(2);
    for (int s = 0; s < 2; s++) {
        for (int i = 0; i < 40 - 15 * s; i++) seqs[s].ids.push_back((int32_t)((i * 37 + s * 11) % 512));
        seqs[s].prompt_len = 5;
    }
    const long bound[] = {9, 10};  // bf16, fp8
    int k = 0;
    for (Precision p : {Precision::BF16, Precision::FP8}) {
        const emu::RangeStats one = forward_stats(shallow, seqs, p), two = forward_stats(deep, seqs, p);
        const long per_layer = (long)(two.kernel_launches + two.gemm_calls) - (long)(one.kernel_launches + one.gemm_calls);
        std::string kernels;
        for (const auto& kv : two.kernels) {
            const auto it = one.kernels.find(kv.first);
            const long d = (long)kv.second - (long)(it == one.kernels.end() ? 0 : it->second);
            if (d) kernels += strfmt(", %s %ld", kv.first.c_str(), d);
        }
        printf("    %s: %ld launches + GEMM calls per layer (bound %ld): GEMMs %ld%s; memset bytes %lld\n", precision_name(p),
               per_layer, bound[k], (long)two.gemm_calls - (long)one.gemm_calls, kernels.c_str(),
               (long long)two.memset_bytes - (long long)one.memset_bytes);
        CHECK_MSG(per_layer <= bound[k], "%s: one decoder layer's forward is %ld kernel launches + GEMM calls, above %ld",
                  precision_name(p), per_layer, bound[k]);
        k++;
    }
}

namespace {

// What the `decode_step` range counted in a teacher-forced rollout whose every step replays a graph
// captured by the same rollout before it: graph nodes (kernels, GEMM calls, copies, memsets) per
// replay. Two prompts of 33 tokens (a whole 32-key tile shared: cascade attention), two samples each.
double decode_nodes_per_step(GpuEngine& engine, Precision p, int64_t* replays, emu::RangeStats* stats) {
    std::vector<GenRequest> requests;
    std::vector<std::vector<int32_t>> forced;
    for (int i = 0; i < 4; i++) {
        std::vector<int32_t> prompt;
        for (int k = 0; k < 33; k++) prompt.push_back((int32_t)((k * 37 + (i / 2) * 11) % 512));
        requests.push_back({prompt, (uint32_t)i});
        forced.push_back({(int32_t)(7 + i), 9, 11});
    }
    engine.teacher_forced(requests, forced, p, p);  // captures the bucket's graph
    emu::start_stats();
    engine.teacher_forced(requests, forced, p, p);
    emu::stop_stats();
    const emu::RangeStats st = *stats = emu::range_stats("decode_step");
    *replays = (int64_t)st.graph_launches;
    CHECK_EQ(engine.rollout_stats().graphs_captured, (int64_t)0);
    CHECK_EQ((int64_t)st.graph_launches, engine.rollout_stats().decode_steps);
    return st.graph_launches ? (double)(st.kernel_launches + st.gemm_calls + st.h2d_copies + st.d2h_copies) / st.graph_launches : 0;
}

}  // namespace

// The nodes of one decoder layer in the captured decode-step graph, a 2-layer model's nodes per
// replayed step less a 1-layer model's, with the per-kernel difference printed. Issue 47: 12 in fp8
// before (the attention output's FP8 operand was a pass of its own), then 11 (a merge kernel wrote
// it), then 10 (the split kernel's last CTA a row merged it, a serial tail: issue 58), now 11 in
// both: the RMSNorms, the q/k-norm + RoPE + append, decode attention's per-row and cascade split
// launches and its combine (which writes the FP8 operand), SwiGLU, the four GEMMs. The step's
// attention plan is one node per step, not per layer.
TEST(decode_graph_nodes_per_layer) {
    EngineOptions o;
    o.rollout_slots = 4;
    GpuEngine shallow(depth_model(1), o), deep(depth_model(2), o);
    const double bound[] = {11, 11};  // bf16, fp8
    int k = 0;
    for (Precision p : {Precision::BF16, Precision::FP8}) {
        int64_t replays_one = 0, replays_two = 0;
        emu::RangeStats st_one, st_two;
        const double one = decode_nodes_per_step(shallow, p, &replays_one, &st_one),
                     two = decode_nodes_per_step(deep, p, &replays_two, &st_two);
        std::string kernels;
        for (const auto& kv : st_two.kernels) {
            const auto it = st_one.kernels.find(kv.first);
            const double d = ((double)kv.second - (double)(it == st_one.kernels.end() ? 0 : it->second)) / std::max<int64_t>(replays_two, 1);
            if (d != 0) kernels += strfmt(", %s %.2f", kv.first.c_str(), d);
        }
        printf("    %s: %.2f graph nodes per layer (bound %.0f), %.2f per step at 2 layers, %lld replays%s\n", precision_name(p),
               two - one, bound[k], two, (long long)replays_two, kernels.c_str());
        CHECK(replays_one > 0 && replays_two == replays_one);
        CHECK_MSG(two - one <= bound[k], "%s: a decode layer is %.2f graph nodes, above %.0f", precision_name(p), two - one, bound[k]);
        k++;
    }
}
#endif  // FP8RL_EMU
