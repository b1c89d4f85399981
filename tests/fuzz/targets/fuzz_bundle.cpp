// A capture bundle through everything the app does with one: open, validate (what
// `kvscope inspect` prints), every layer's engine and reference KV, logits, and a full
// analysis. Bad input may only ever be a BundleError.

#include "analysis/analyzer.h"
#include "format/bundle_error.h"
#include "format/bundle_reader.h"
#include "kv/capture_loader.h"
#include "fuzz_input_file.h"

#include <memory>

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size)
{
    using namespace kvscope;
    const std::string path = fuzz::writeInput(data, size, ".h5");
    try {
        auto reader = std::make_shared<BundleReader>(path);
        reader->validate();
        const CaptureLoader loader(reader);
        for (const PromptInfo& prompt : reader->prompts()) {
            if (!prompt.problems.empty())
                continue;
            for (const std::string& layer : reader->config().layerNames()) {
                try {
                    loader.engineLayer(prompt.id, layer);
                    loader.referenceLayer(prompt.id, ReferenceRole::Expected, layer);
                } catch (const BundleError&) {
                }
            }
            for (LogitsRole role : prompt.logits) {
                try {
                    reader->readLogits(prompt.id, role);
                } catch (const BundleError&) {
                }
            }
        }
        AnalysisOptions options;
        options.threads = 2;  // the team, its posted reads and its chunks
        analyzeBundle(reader, options);
    } catch (const BundleError&) {
    }
    return 0;
}
