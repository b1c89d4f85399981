#include "commands/commands.h"

#include "results/synthetic_results.h"
#include "synth/model_capture.h"
#include "synth/synthetic_capture.h"

#include <charconv>
#include <iostream>
#include <optional>
#include <sstream>

namespace kvscope::cli {

namespace {

std::vector<int> parseList(const std::string& text)
{
    std::vector<int> values;
    std::stringstream in(text);
    for (std::string item; std::getline(in, item, ',');) {
        int value = 0;
        const auto [end, ec] = std::from_chars(item.data(), item.data() + item.size(), value);
        if (ec != std::errc() || end != item.data() + item.size() || item.empty())
            throw std::invalid_argument("--prompts takes lengths like 100,180, not '" + text + "'");
        values.push_back(value);
    }
    return values;
}

}  // namespace

int synth(const Args& args, std::ostream& out, std::ostream& err)
{
    synth::ModelCaptureOptions o;
    std::string path;
    OptionParser parser("synth");
    parser.operand("OUT.h5", path);
    bool demo = false;
    parser.flag("--demo", [&o, &demo] {
        o = synth::demoModelCaptureOptions();
        demo = true;
    });
    // After --demo: the MLA demo; otherwise the model so far as an MLA model.
    parser.flag("--mla", [&o, &demo] { o = demo ? synth::demoMlaCaptureOptions() : synth::withMla(o); });
    parser.integer("--kv-lora-rank", o.shape.kvLoraRank);
    parser.integer("--rope-head-dim", o.shape.ropeHeadDim);
    parser.integer("--layers", o.shape.layers);
    parser.integer("--hidden", o.shape.hidden);
    parser.integer("--query-heads", o.shape.queryHeads);
    parser.integer("--kv-heads", o.shape.kvHeads);
    parser.integer("--head-dim", o.shape.headDim);
    parser.integer("--ffn", o.shape.ffn);
    parser.integer("--vocab", o.shape.vocab);
    parser.integer("--window", o.shape.window);
    parser.custom("--rope-scaling", [&o](const std::string& type) {
        if (type != "llama3" && type != "none")
            throw std::invalid_argument("--rope-scaling takes llama3 or none");
        o.shape.llama3Rope = type == "llama3";
    });
    parser.custom("--spec", [&o](const std::string& spec) {
        if (spec != "sliding" && spec != "full" && spec != "chunked")
            throw std::invalid_argument("--spec takes sliding, full or chunked");
        o.slidingWindowSpec = spec == "sliding";
        o.shape.chunked = spec == "chunked";
    });
    parser.custom("--state-space-layers", [&o](const std::string& list) { o.stateSpaceLayers = parseList(list); });
    // After --demo: the hybrid demo; otherwise the model so far as a hybrid model.
    parser.flag("--hybrid", [&o, &demo] {
        if (demo)
            o = synth::demoHybridCaptureOptions();
        o.hybrid = true;
    });
    parser.integer("--mamba-heads", o.shape.mamba.heads);
    parser.integer("--mamba-head-dim", o.shape.mamba.headDim);
    parser.integer("--mamba-state", o.shape.mamba.stateSize);
    parser.integer("--mamba-groups", o.shape.mamba.groups);
    parser.integer("--mamba-conv", o.shape.mamba.convWidth);
    parser.custom("--mamba-ssm-cache-dtype", [&o](const std::string& dtype) {
        if (dtype != "float32" && dtype != "bfloat16")
            throw std::invalid_argument("--mamba-ssm-cache-dtype takes float32 or bfloat16");
        o.shape.mamba.engineStateBf16 = dtype == "bfloat16";
    });
    parser.integer("--tp", o.tpSize);
    parser.integer("--dcp", o.dcpSize);
    parser.integer("--cp-interleave", o.cpInterleave);
    parser.integer("--block-size", o.fullBlockSize);
    parser.integer("--sliding-block-size", o.slidingBlockSize);
    parser.integer("--threads", o.threads);
    parser.custom("--kv-dtype", [&o](const std::string& name) {
        const std::optional<DType> dtype = parseDType(name);
        if (!dtype || (*dtype != DType::BFloat16 && !isQuantised(*dtype)))
            throw std::invalid_argument("--kv-dtype takes bfloat16, fp8_e4m3, fp8_e5m2, fp8_e4m3fnuz, int8, nvfp4, "
                                        "int4_per_token_head, fp8_per_token_head or int8_per_token_head");
        o.kvDtype = *dtype;
        // vLLM's per-token-head modes are fp8 / int8 with a scale per token and head.
        if (name == "fp8_per_token_head" || name == "int8_per_token_head")
            o.kvScale = ScaleGranularity::TokenHead;
    });
    parser.custom("--kv-scale", [&o](const std::string& name) {
        for (ScaleGranularity g : {ScaleGranularity::Tensor, ScaleGranularity::Head, ScaleGranularity::TokenHead})
            if (name == granularityName(g)) {
                o.kvScale = g;
                return;
            }
        throw std::invalid_argument("--kv-scale takes tensor, head or token_head");
    });
    parser.custom("--prompts", [&o](const std::string& list) { o.promptLens = parseList(list); });
    parser.integer("--decode", o.decodeTokens);
    parser.flag("--two-way", [&o] { o.baseline = false; });
    parser.flag("--engine-only", [&o] { o.engineOnly = true; });
    parser.flag("--no-impact", [&o] { o.impact = false; });
    parser.integer("--seed", o.seed);
    parser.custom("--fault", [&o](const std::string& name) {
        if (!synth::parseFault(name, o.fault))
            throw std::invalid_argument("unknown fault '" + name + "'");
    });
    parser.integer("--fault-layer", o.faultLayer);
    parser.integer("--fault-head", o.faultHead);
    parser.integer("--fault-rank", o.faultRank);
    parser.integer("--fault-step", o.faultStep);
    parser.text({"--provenance"}, o.provenance);
    bool modelFreeCapture = false;
    parser.flag("--model-free", modelFreeCapture);
    std::optional<SyntheticResultsOptions> results;  // a results file, no capture
    parser.custom("--results", [&results](const std::string& shape) {
        SyntheticResultsOptions r;
        const std::size_t x = shape.find('x');
        long long tokens = 0;
        const char* end = shape.data() + shape.size();
        if (x == std::string::npos || std::from_chars(shape.data(), shape.data() + x, r.layers).ptr != shape.data() + x ||
            std::from_chars(shape.data() + x + 1, end, tokens).ptr != end || r.layers < 1 || tokens < 2)
            throw std::invalid_argument("--results takes LAYERSxTOKENS, like 80x131072, not '" + shape + "'");
        r.tokens = tokens;
        results = r;
    });
    if (!parser.parse(args, err))
        return 2;
    if (results) {
        results->threeWay = o.baseline;
        results->seed = std::uint64_t(o.seed);
        try {
            writeSyntheticResults(path, *results);
        } catch (const std::exception& e) {
            err << "kvscope synth: " << e.what() << "\n";
            return 2;
        }
        out << "wrote " << path << " (results of " << results->layers << " layers x " << results->tokens
            << " tokens, made without a capture)\n";
        return 0;
    }
    if (modelFreeCapture && o.engineOnly) {
        err << "kvscope synth: --engine-only is for the model-based capture, not --model-free\n";
        return 2;
    }
    try {
        if (modelFreeCapture)
            writeSyntheticCapture(path, modelFreeOf(o));
        else
            synth::writeModelCapture(path, o);
    } catch (const std::exception& e) {
        err << "kvscope synth: " << e.what() << "\n";
        return 2;
    }
    out << "wrote " << path << " (fault: " << synth::faultName(o.fault) << ")\n";
    return 0;
}

}  // namespace kvscope::cli
