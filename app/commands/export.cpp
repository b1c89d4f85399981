#include "commands/commands.h"

#include "analysis/layer_selection.h"
#include "format/hdf5_file.h"
#include "format/output_path.h"
#include "kv/capture_loader.h"

#include <algorithm>
#include <iostream>

namespace kvscope::cli {

namespace {

// [seq, heads, dim] (kvscope's layout) to [heads, seq, dim] (HF's), NaN where absent.
std::vector<float> headMajor(const LayerKv& kv, KvPart part)
{
    const FloatBuffer& values = kv.values(part);
    const std::size_t dim = std::size_t(kv.headDim(part));
    std::vector<float> out(values.size());
    for (int h = 0; h < kv.heads; ++h)
        for (std::int64_t p = 0; p < kv.seq; ++p)
            std::copy_n(values.data() + kv.index(part, h, p), dim,
                        out.data() + (std::size_t(h) * std::size_t(kv.seq) + std::size_t(p)) * dim);
    return out;
}

void writeLayer(Hdf5File& out, const std::string& group, const LayerKv& kv)
{
    for (KvPart part : {KvPart::K, KvPart::V})
        out.writeRaw(group + "/" + kvPartName(part), H5T_IEEE_F32LE, {kv.heads, kv.seq, kv.headDim(part)},
                     headMajor(kv, part).data());
    out.writeRaw(group + "/present", H5T_STD_U8LE, {kv.seq}, kv.present.data());
}

}  // namespace

int exportKv(const Args& args, std::ostream& out, std::ostream& err)
{
    std::string bundle, outPath, layerSpec;
    std::vector<std::string> prompts;
    OptionParser parser("export");
    parser.operand("BUNDLE", bundle);
    parser.operand("OUT.h5", outPath);
    parser.repeated("--prompt", prompts);
    parser.text({"--layers"}, layerSpec);
    if (!parser.parse(args, err))
        return 2;
    try {
        requireWritableOutput(outPath, {bundle});
        auto reader = std::make_shared<BundleReader>(bundle);
        const CaptureLoader loader(reader);
        const std::vector<std::string> layers = layerSpec.empty() ? reader->config().layerNames()
                                                                  : parseLayerSelection(layerSpec, reader->config().layerNames());
        if (prompts.empty())
            for (const PromptInfo& p : reader->prompts())
                prompts.push_back(p.id);
        Hdf5File file = Hdf5File::create(outPath);
        file.writeStringAttribute("/", "format", "kvscope-export");
        file.writeStringAttribute("/", "layout", "k, v (an MLA latent: c_kv, k_pe): float32 [heads, seq, width], NaN where absent; "
                                                "present: uint8 [seq]");
        for (const std::string& id : prompts) {
            const PromptInfo& p = reader->prompt(id);
            for (const std::string& layer : layers) {
                writeLayer(file, "/prompts/" + id + "/engine/" + layer, loader.engineLayer(id, layer));
                writeLayer(file, "/prompts/" + id + "/expected/" + layer,
                           loader.referenceLayer(id, ReferenceRole::Expected, layer));
                if (p.hasBaseline)
                    writeLayer(file, "/prompts/" + id + "/baseline/" + layer,
                               loader.referenceLayer(id, ReferenceRole::Baseline, layer));
            }
        }
    } catch (const std::exception& e) {
        err << "kvscope: " << e.what() << "\n";
        return 2;
    }
    out << "wrote " << outPath << "\n";
    return 0;
}

}  // namespace kvscope::cli
