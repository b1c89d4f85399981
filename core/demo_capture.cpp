#include "demo_capture.h"

#include "bundle_writer.h"
#include "paged_layout.h"

#include <cmath>
#include <random>

namespace kvscope {

namespace {

std::string layerName(int i)
{
    return "model.layers." + std::to_string(i) + ".self_attn";
}

KvCacheConfig demoConfig(const DemoCaptureOptions& o, std::int64_t longest)
{
    std::string sliding, full;
    for (int i = 0; i < o.layers; ++i)
        (i % 2 ? full : sliding) += (((i % 2 ? full : sliding).empty()) ? "\"" : ", \"") + layerName(i) + "\"";
    const int perRank = std::max(1, o.kvHeads / o.tpSize);
    auto group = [&](const std::string& names, const char* spec, int blockSize) {
        return "{\"layer_names\": [" + names + "], \"spec_type\": \"" + spec + "\", \"block_size\": " +
               std::to_string(blockSize) + ", \"sliding_window\": " + std::to_string(o.slidingWindow) +
               ", \"dtype\": \"torch.bfloat16\", \"num_kv_heads\": " + std::to_string(perRank) +
               ", \"head_size\": " + std::to_string(o.headDim) + "}";
    };
    // Enough blocks for both groups of the longest sequence, plus the null block and slack.
    const std::int64_t blocks = 2 + longest / o.fullBlockSize + longest / o.slidingBlockSize + 8;
    std::string json = "{\"num_blocks\": " + std::to_string(blocks) + ", \"tp_size\": " + std::to_string(o.tpSize) +
                       ", \"total_num_kv_heads\": " + std::to_string(o.kvHeads) +
                       ", \"dcp_size\": 1, \"pcp_size\": 1, \"groups\": [" +
                       group(sliding, "SlidingWindowSpec", o.slidingBlockSize) + ", " +
                       group(full, "FullAttentionSpec", o.fullBlockSize) + "]}";
    return KvCacheConfig::fromJson(json, {}, "demo config");
}

// [heads, seq, dim] with every position present.
LayerKv fullLayer(int heads, std::int64_t seq, int dim)
{
    LayerKv kv = LayerKv::absent(heads, seq, dim);
    std::fill(kv.present.begin(), kv.present.end(), 1);
    return kv;
}

float bf16(float x)
{
    return bf16ToFloat(floatToBf16(x));
}

}  // namespace

void writeDemoCapture(const std::string& path, const DemoCaptureOptions& o)
{
    std::int64_t longest = 0;
    for (int len : o.promptLens)
        longest = std::max<std::int64_t>(longest, len + o.decodeTokens);
    const KvCacheConfig config = demoConfig(o, longest);
    BundleMetadata meta;
    meta.model = "kvscope-demo (synthetic, " + std::to_string(o.layers) + " layers)";
    meta.engine = "synthetic paged engine";
    meta.notes = "Synthetic demo capture: bf16 engine and reference over an fp32 baseline.";
    meta.extra["synthetic_fault"] = o.faultLayer < 0 ? "none"
        : "rope_offset layer=" + layerName(o.faultLayer) + " head=" + std::to_string(o.faultHead) +
              " from_decode_step=" + std::to_string(o.faultPosition);
    BundleWriter writer(path, meta, config);

    std::mt19937_64 rng(o.seed);
    for (std::size_t p = 0; p < o.promptLens.size(); ++p) {
        const std::string id = "prompt_" + std::to_string(p);
        const std::int64_t promptLen = o.promptLens[p];
        const std::int64_t seqLen = promptLen + o.decodeTokens;
        const std::int64_t divergence = promptLen + o.divergence;
        PromptRecord record;
        record.id = id;
        std::uniform_int_distribution<std::int64_t> tokens(3, 32000);
        for (std::int64_t i = 0; i < promptLen; ++i)
            record.inputIds.push_back(tokens(rng));
        for (int i = 0; i < o.decodeTokens; ++i)
            record.teacherTokens.push_back(tokens(rng));
        record.divergencePositions = std::vector<std::int64_t>{divergence};
        for (std::int64_t t : record.inputIds)
            record.tokenStrings.push_back("t" + std::to_string(t));
        for (std::int64_t t : record.teacherTokens)
            record.tokenStrings.push_back("t" + std::to_string(t));
        writer.addPrompt(record);

        // Baseline (fp32), expected (bf16 of it), engine (bf16 of a perturbed copy).
        std::map<std::string, LayerKv> baseline, engine;
        std::normal_distribution<float> n01(0.0f, 1.0f);
        for (int l = 0; l < o.layers; ++l) {
            LayerKv base = fullLayer(o.kvHeads, seqLen, o.headDim);
            LayerKv eng = fullLayer(o.kvHeads, seqLen, o.headDim);
            for (std::size_t i = 0; i < base.k.size(); ++i) {
                const int channel = int(i % std::size_t(o.headDim));
                const float outlier = channel % 11 == 3 ? 8.0f : 1.0f;
                base.k[i] = n01(rng) * outlier;
                base.v[i] = n01(rng);
                // A perturbation well below bf16's resolution changes some roundings only.
                eng.k[i] = bf16(base.k[i] * (1.0f + 1e-3f * n01(rng)));
                eng.v[i] = bf16(base.v[i] * (1.0f + 1e-3f * n01(rng)));
            }
            if (l == o.faultLayer)
                for (std::int64_t pos = promptLen + o.faultPosition; pos < seqLen; ++pos)
                    for (int d = 0; d + 1 < o.headDim; d += 2) {
                        float* k = eng.k.data() + eng.index(o.faultHead, pos) + d;
                        // RoPE rotated by one position too many: pair i turns by 10000^(-2i/dim).
                        const float angle = std::pow(10000.0f, -float(d) / float(o.headDim));
                        const float a = k[0], b = k[1];
                        k[0] = bf16(a * std::cos(angle) - b * std::sin(angle));
                        k[1] = bf16(a * std::sin(angle) + b * std::cos(angle));
                    }
            baseline[layerName(l)] = std::move(base);
            engine[layerName(l)] = std::move(eng);
        }

        // Snapshot 0 ran up to the divergence and one token past it: its KV at the divergence
        // is the engine's own (wrong) token. Snapshot 1 re-prefilled the teacher token there.
        const std::int64_t firstSeqLen = divergence + 2;
        for (int s = 0; s < 2; ++s) {
            const std::int64_t snapSeqLen = s == 0 ? firstSeqLen : seqLen;
            PagedLayout layout(config, snapSeqLen, o.seed * 31 + p * 7 + std::uint64_t(s));
            EngineSnapshot snap = layout.snapshot(
                [&](const std::string& layer) {
                    LayerKv kv = engine.at(layer);
                    if (s == 0)
                        for (int h = 0; h < kv.heads; ++h)
                            for (int d = 0; d < kv.headDim; ++d) {
                                kv.k[kv.index(h, divergence) + std::size_t(d)] = bf16(n01(rng) * 3.0f);
                                kv.v[kv.index(h, divergence) + std::size_t(d)] = bf16(n01(rng) * 3.0f);
                            }
                    return kv;
                },
                true);
            snap.validatedUntil = s == 0 ? divergence : seqLen - 1;
            writer.addSnapshot(id, snap);
        }

        for (int l = 0; l < o.layers; ++l) {
            const LayerKv& base = baseline.at(layerName(l));
            // HF keeps only window - 1 positions of sliding-window layers.
            const std::int64_t keep = l % 2 ? seqLen : std::min<std::int64_t>(seqLen, o.slidingWindow - 1);
            std::vector<float> k, v, ek, ev;
            for (int h = 0; h < o.kvHeads; ++h)
                for (std::int64_t pos = seqLen - keep; pos < seqLen; ++pos)
                    for (int d = 0; d < o.headDim; ++d) {
                        k.push_back(base.kAt(h, pos)[d]);
                        v.push_back(base.vAt(h, pos)[d]);
                    }
            const std::vector<std::int64_t> shape{1, o.kvHeads, keep, o.headDim};
            writer.addReference(id, ReferenceRole::Baseline, layerName(l), RawTensor::fromFloat(DType::Float32, shape, k),
                                RawTensor::fromFloat(DType::Float32, shape, v));
            writer.addReference(id, ReferenceRole::Expected, layerName(l), RawTensor::fromFloat(DType::BFloat16, shape, k),
                                RawTensor::fromFloat(DType::BFloat16, shape, v));
        }
    }
    writer.finish();
}

}  // namespace kvscope
