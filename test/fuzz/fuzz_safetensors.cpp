// libFuzzer target over the safetensors reader: any bytes, opened as a file (an in-memory memfd,
// mapped like a real file), must either load or throw fp8rl::Error. Loaded tensors are read in
// full and converted to FP32, so a validation gap shows up as an out-of-bounds read under ASan.
// Seeds in safetensors_seeds/ were written by python safetensors (see dev/make_fuzz_seeds.py).
#include <sys/mman.h>
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <vector>

#include "rl/io/safetensors.h"
#include "rl/model/weights.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    int fd = memfd_create("fuzz.safetensors", 0);
    if (fd < 0) return 0;
    if (size == 0 || write(fd, data, size) == (ssize_t)size) {
        try {
            fp8rl::SafetensorsFile f("/proc/self/fd/" + std::to_string(fd));
            for (const fp8rl::TensorView& t : f.tensors()) {
                if (t.dtype == fp8rl::DType::F8_E4M3 || t.dtype == fp8rl::DType::F8_E5M2 || t.numel > (1 << 20)) continue;
                std::vector<float> out((size_t)t.numel);
                fp8rl::tensor_to_float(t, out.data());
            }
        } catch (const fp8rl::Error&) {
        }
    }
    close(fd);
    return 0;
}
