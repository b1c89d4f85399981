// A torch.save file through `kvscope import`'s reader: libtorch's zip and pickle readers,
// then the conversion to plain values. Bad input may only ever be a BundleError.

#include "format/bundle_error.h"
#include "dumps/pt_value.h"
#include "fuzz_input_file.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size)
{
    using namespace kvscope;
    const std::string path = fuzz::writeInput(data, size, ".pt");
    try {
        loadPtFile(path);
    } catch (const BundleError&) {
    }
    return 0;
}
