// profile_range.h: PROFILE_RANGE("forward"); names the rest of the enclosing scope a range of the
// profile, in engine and driver code alike (the ranges the engine marks: docs/gpu-emulation.md):
//   nvcc        an NVTX range (nvtx3, header-only in the CUDA toolkit), which Nsight Systems shows;
//   FP8RL_EMU   a statistics range of the emulation, counting what the host issues inside it
//               (cuda/emu/emu.h; FP8RL_EMU_STATS=FILE writes the counts as JSON at exit);
//   otherwise   nothing: the CPU-only build compiles rl/driver/driver.h too.
#pragma once
#if defined(FP8RL_EMU) || defined(__CUDACC__)
#ifdef FP8RL_EMU
#include "cuda/emu/emu.h"
#else
#include <nvtx3/nvToolsExt.h>
#endif

namespace fp8rl {

class ProfileRange {
  public:
    explicit ProfileRange(const char* name) {
#ifdef FP8RL_EMU
        emu::range_push(name);
#else
        nvtxRangePushA(name);
#endif
    }
    ~ProfileRange() {
#ifdef FP8RL_EMU
        emu::range_pop();
#else
        nvtxRangePop();
#endif
    }
    ProfileRange(const ProfileRange&) = delete;
    ProfileRange& operator=(const ProfileRange&) = delete;
};

}  // namespace fp8rl

#define PROFILE_RANGE_CONCAT2(a, b) a##b
#define PROFILE_RANGE_CONCAT(a, b) PROFILE_RANGE_CONCAT2(a, b)
#define PROFILE_RANGE(name) ::fp8rl::ProfileRange PROFILE_RANGE_CONCAT(profile_range_, __LINE__)(name)
#else
#define PROFILE_RANGE(name) ((void)0)
#endif
