// A .safetensors file (kvscope import reads past_key_values and logits from them): the
// header, then every tensor. Bad input may only ever be a BundleError.

#include "format/bundle_error.h"
#include "format/safetensors_reader.h"
#include "fuzz_input_file.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size)
{
    using namespace kvscope;
    const std::string path = fuzz::writeInput(data, size, ".safetensors");
    try {
        const SafetensorsFile file(path);
        for (const auto& [name, entry] : file.entries()) {
            try {
                const RawTensor t = file.tensor(name);
                if (t.bytes.size() != std::size_t(t.numel()) * dtypeSize(t.dtype))
                    __builtin_trap();  // a tensor whose bytes disagree with its shape
            } catch (const BundleError&) {
            }
        }
    } catch (const BundleError&) {
    }
    return 0;
}
