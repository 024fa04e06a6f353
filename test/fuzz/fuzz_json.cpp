// libFuzzer target over the JSON parser: any input must either parse or throw fp8rl::Error.
#include <cstddef>
#include <cstdint>

#include "rl/io/json.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    try {
        fp8rl::Json v = fp8rl::json_parse(std::string((const char*)data, size), "fuzz");
        std::string out = fp8rl::json_quote(v.is_string() ? v.str : std::string((const char*)data, size));
        (void)out;
    } catch (const fp8rl::Error&) {
    }
    return 0;
}
