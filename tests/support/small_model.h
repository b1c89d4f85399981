#pragma once
// The small model capture the tests share: 6 layers, 4 KV heads of 32 over TP 2, two prompts;
// a couple of seconds to make, big enough that dtype noise and faults are told apart.

#include "analysis/analyzer.h"
#include "format/bundle_reader.h"
#include "synth/model_capture.h"

#include <nlohmann/json.hpp>

#include <memory>
#include <string>

namespace kvtest {

inline kvscope::synth::ModelCaptureOptions smallModel(kvscope::synth::FaultKind fault = kvscope::synth::FaultKind::None)
{
    kvscope::synth::ModelCaptureOptions o;
    o.shape.layers = 6;
    o.shape.hidden = 64;
    o.shape.queryHeads = 8;
    o.shape.kvHeads = 4;
    o.shape.headDim = 32;
    o.shape.ffn = 128;
    o.shape.window = 12;
    o.tpSize = 2;
    o.promptLens = {24, 32};
    o.decodeTokens = 16;
    o.fault = fault;
    return o;
}

// A 6-layer model whose KV head 0 of layers 1 and 4 is 2^-16 of the others (made up exactly by its
// queries and output projection): what one fp8 scale per tensor crushes, and the what-if by output
// keeps in bf16.
inline kvscope::synth::ModelCaptureOptions quietHeadModel()
{
    kvscope::synth::ModelCaptureOptions o;
    o.shape.layers = 6;
    o.shape.quietHeadLayers = {1, 4};
    o.shape.quietHeadOctaves = 16;
    o.promptLens = {40, 56};
    o.decodeTokens = 16;
    return o;
}

// Writes the model capture `o` to `path` and analyses it; `truth` (optional) gets the ground
// truth the capture records (its synthetic_fault).
inline kvscope::AnalysisResult analyseModelCapture(const std::string& path, const kvscope::synth::ModelCaptureOptions& o,
                                                   nlohmann::json* truth = nullptr)
{
    kvscope::synth::writeModelCapture(path, o);
    auto reader = std::make_shared<kvscope::BundleReader>(path);
    if (truth)
        *truth = nlohmann::json::parse(reader->metadata().extra.at("synthetic_fault"));
    return kvscope::analyzeBundle(reader);
}

}  // namespace kvtest
