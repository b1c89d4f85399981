#include "transfer/transfer_pairing.h"

#include "format/bundle_error.h"
#include "kv/capture_loader.h"
#include "kv/prompt_match.h"

#include <algorithm>

namespace kvscope {

namespace {

// A prompt whose only problem is the reference an engine-only capture does not hold: transfer
// needs none.
bool readable(const PromptInfo& p)
{
    return p.problems.empty() || (p.referenceMissing && p.problems.size() == 1);
}

void requireReadable(const CaptureLoader& loader, const PromptInfo& p)
{
    if (!readable(p))
        throw BundleError(loader.path(), bundle_path::prompt(p.id), "cannot be compared: " + p.problems.front());
}

std::string both(const CaptureLoader& producer, const CaptureLoader& consumer)
{
    return "the producer " + producer.path() + " and the consumer " + consumer.path();
}

TransferLayer pairLayer(const std::string& name, const CaptureLoader& producer, const CaptureLoader& consumer)
{
    const KvCacheGroup& p = producer.config().groups[std::size_t(producer.config().groupOf(name))];
    const KvCacheGroup& c = consumer.config().groups[std::size_t(consumer.config().groupOf(name))];
    const std::string where = "layer " + name + " of " + both(producer, consumer);
    if (p.totalKvHeads != c.totalKvHeads)
        throw TransferMismatch(where + " differ in KV heads (" + std::to_string(p.totalKvHeads) + " and " +
                               std::to_string(c.totalKvHeads) + ")");
    for (KvPart part : {KvPart::K, KvPart::V})
        if (p.partWidth(part) != c.partWidth(part))
            throw TransferMismatch(where + " differ in " + partWidthName(c, part) + " (" +
                                   std::to_string(p.partWidth(part)) + " and " + std::to_string(c.partWidth(part)) + ")");
    if (p.blockSize != c.blockSize)
        throw TransferMismatch(where + " differ in block_size (" + std::to_string(p.blockSize) + " and " +
                               std::to_string(c.blockSize) + "): blocks are compared position by position within a block");
    TransferLayer layer;
    layer.name = name;
    layer.heads = c.totalKvHeads;
    layer.dims = HeadDims(c.partWidth(KvPart::K), c.partWidth(KvPart::V));
    layer.blockSize = c.blockSize;
    layer.consumerHeadsPerRank = consumer.config().layout(c).headsPerRank();
    for (KvPart part : {KvPart::K, KvPart::V}) {
        const std::size_t i = std::size_t(part);
        layer.producerDType[i] = p.partDType(part);
        layer.consumerDType[i] = c.partDType(part);
        if (layer.producerDType[i] != layer.consumerDType[i])
            layer.judgedIn[i] = unitRoundoff(layer.producerDType[i]) >= unitRoundoff(layer.consumerDType[i])
                                    ? layer.producerDType[i]
                                    : layer.consumerDType[i];
    }
    return layer;
}

}  // namespace

TransferPairing pairCaptures(const CaptureLoader& producer, const CaptureLoader& consumer)
{
    const BundleMetadata& pm = producer.metadata();
    const BundleMetadata& cm = consumer.metadata();
    if (!pm.model.empty() && !cm.model.empty() && pm.model != cm.model)
        throw TransferMismatch(both(producer, consumer) + " are captures of different models (" + printable(pm.model) +
                               " and " + printable(cm.model) + ")");
    for (const CaptureLoader* side : {&producer, &consumer})
        if (side->config().dcpSize > 1)
            throw TransferMismatch(side->path() + ": kv_cache_config: decode context parallelism (dcp_size " +
                                   std::to_string(side->config().dcpSize) +
                                   ") spreads a block's positions over ranks; kvscope transfer compares captures without it");
    TransferPairing pairing;
    const std::vector<std::string> producerLayers = producer.config().layerNames();
    for (const std::string& name : consumer.config().layerNames()) {
        if (std::find(producerLayers.begin(), producerLayers.end(), name) == producerLayers.end())
            throw TransferMismatch("layer " + name + " of the consumer " + consumer.path() +
                                   " is not a layer of the producer " + producer.path());
        pairing.layers.push_back(pairLayer(name, producer, consumer));
    }
    if (pairing.layers.size() != producerLayers.size())
        throw TransferMismatch(both(producer, consumer) + " differ in layers (" + std::to_string(producerLayers.size()) +
                               " and " + std::to_string(pairing.layers.size()) + " compared layers)");

    std::vector<const std::vector<std::int64_t>*> tokensP, tokensC;
    for (const PromptInfo& p : producer.prompts())
        tokensP.push_back(&p.inputIds);
    for (const PromptInfo& p : consumer.prompts())
        tokensC.push_back(&p.inputIds);
    const PromptMatch match = matchPromptsByTokens(tokensP, tokensC);
    for (const auto& [ip, ic] : match.pairs) {
        const PromptInfo& p = producer.prompts()[ip];
        const PromptInfo& c = consumer.prompts()[ic];
        requireReadable(producer, p);
        requireReadable(consumer, c);
        pairing.prompts.emplace_back(p.id, c.id);
    }
    for (std::size_t i : match.onlyA)
        pairing.onlyProducer.push_back(producer.prompts()[i].id);
    for (std::size_t i : match.onlyB)
        pairing.onlyConsumer.push_back(consumer.prompts()[i].id);
    if (pairing.prompts.empty()) {
        std::string what = "no prompt of the consumer " + consumer.path() + " has the tokens of a prompt of the producer " +
                           producer.path();
        if (!consumer.prompts().empty() && !producer.prompts().empty())
            what += " (the consumer's " + consumer.prompts().front().id + ": " +
                    describeTokenIds(consumer.prompts().front().inputIds) + "; the producer's " +
                    producer.prompts().front().id + ": " + describeTokenIds(producer.prompts().front().inputIds) + ")";
        throw TransferMismatch(what + ": they are captures of different requests");
    }
    return pairing;
}

}  // namespace kvscope
