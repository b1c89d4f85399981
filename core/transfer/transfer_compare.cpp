#include "transfer/transfer_compare.h"

#include "format/bundle_reader.h"
#include "kv/capture_loader.h"
#include "transfer/producer_rows.h"

#include <algorithm>

namespace kvscope {

namespace {

// The layer positions are classified by: the first of full attention (or MLA), else the first.
std::size_t classifyingLayer(const CaptureLoader& consumer, const std::vector<TransferLayer>& layers)
{
    for (std::size_t l = 0; l < layers.size(); ++l) {
        const SpecType spec = consumer.config().groups[std::size_t(consumer.config().groupOf(layers[l].name))].specType;
        if (spec == SpecType::FullAttention || spec == SpecType::Mla)
            return l;
    }
    return 0;
}

std::size_t promptIndex(const CaptureLoader& loader, const std::string& id)
{
    const std::vector<PromptInfo>& prompts = loader.prompts();
    return std::size_t(std::find_if(prompts.begin(), prompts.end(), [&](const PromptInfo& p) { return p.id == id; }) -
                       prompts.begin());
}

// A changed block waiting for the search of its rows' origin.
struct Pending {
    std::size_t finding;  // index into the layer's findings
    ChangedRows rows;
    std::uint32_t producerPrompt;
};

}  // namespace

TransferResult compareTransfer(const CaptureLoader& producer, const CaptureLoader& consumer, const TransferOptions& options)
{
    const TransferPairing pairing = pairCaptures(producer, consumer);
    TransferResult result;
    result.producerPath = producer.path();
    result.consumerPath = consumer.path();
    result.layers = pairing.layers;
    result.onlyProducer = pairing.onlyProducer;
    result.onlyConsumer = pairing.onlyConsumer;
    std::vector<std::string> producerIds;
    for (const PromptInfo& p : producer.prompts())
        producerIds.push_back(p.id);

    const std::size_t classifying = classifyingLayer(consumer, pairing.layers);
    for (const auto& [p, c] : pairing.prompts)
        result.prompts.push_back({p, c, pairing.layers[classifying].name, {}, 0});
    const std::size_t total = pairing.layers.size() * pairing.prompts.size();
    std::size_t done = 0;
    // Layers first, in model order: the first change found is in the lowest layer, and a layer's
    // producer rows are indexed once for all its prompts.
    std::vector<std::size_t> order(pairing.layers.size());
    for (std::size_t l = 0; l < order.size(); ++l)
        order[l] = l;
    std::stable_partition(order.begin(), order.end(), [&](std::size_t l) { return l == classifying; });
    std::sort(order.begin() + 1, order.end());
    std::vector<std::vector<BlockFinding>> perLayer(pairing.layers.size());
    for (std::size_t l : order) {
        const TransferLayer& layer = pairing.layers[l];
        std::vector<BlockFinding>& findings = perLayer[l];
        std::vector<Pending> pending;
        std::array<ValueJudge, 2> judges{ValueJudge{layer.judgedIn[0]}, ValueJudge{layer.judgedIn[1]}};
        for (std::size_t i = 0; i < pairing.prompts.size(); ++i) {
            if (options.cancel && options.cancel->load())
                throw TransferCancelled();
            const auto& [pid, cid] = pairing.prompts[i];
            const PromptInfo& pInfo = producer.prompt(pid);
            const PromptInfo& cInfo = consumer.prompt(cid);
            const LayerBlocks pBlocks = readLayerBlocks(producer, pid, pInfo.snapshots.size() - 1, layer.name, &result.problems);
            const LayerBlocks cBlocks = readLayerBlocks(consumer, cid, cInfo.snapshots.size() - 1, layer.name, &result.problems);
            if (l == classifying) {
                result.prompts[i].positions = classifyPositions(pBlocks, cBlocks, cInfo.provenance);
                result.comparedPositions += result.prompts[i].positions.transferredCount();
            }
            for (ChangedBlock& block : compareBlocks(pBlocks, cBlocks, comparedMask(pBlocks, cBlocks, cInfo.provenance), judges)) {
                block.prompt = i;
                block.layer = l;
                ChangedRows rows;
                TransferExplanation x = explainLocally({block, pBlocks, cBlocks, layer, judges}, rows);
                if (!x.explained() && pending.size() < options.searchedBlocksPerLayer)
                    pending.push_back({findings.size(), std::move(rows), std::uint32_t(promptIndex(producer, pid))});
                findings.push_back({std::move(block), std::move(x)});
            }
            if (options.progress)
                options.progress(++done, total);
        }
        if (!pending.empty()) {
            const ProducerRows index = ProducerRows::ofLayer(producer, layer.name, options.cancel);
            for (Pending& w : pending) {
                BlockFinding& f = findings[w.finding];
                f.explanation = explainBySource(f.block, w.rows, index, w.producerPrompt, producerIds, layer.blockSize,
                                                std::move(f.explanation));
            }
        }
    }
    for (std::size_t l = 0; l < perLayer.size(); ++l) {
        // Prompt by prompt within the layer, blocks in order (as found).
        std::stable_sort(perLayer[l].begin(), perLayer[l].end(),
                         [](const BlockFinding& a, const BlockFinding& b) { return a.block.prompt < b.block.prompt; });
        for (BlockFinding& f : perLayer[l]) {
            ++result.changedBlocks;
            ++result.prompts[f.block.prompt].changedBlocks;
            ++result.byExplanation[f.explanation.name];
            if (!result.firstChange)
                result.firstChange = FirstChange{f.block.prompt, f.block.layer, f.block.first, f.block.block,
                                                 f.block.producerBlock, f.block.consumerBlock};
            if (result.changed.size() < options.listedBlocks)
                result.changed.push_back(std::move(f));
        }
    }
    return result;
}

TransferResult compareTransfer(const std::string& producerPath, const std::string& consumerPath,
                               const TransferOptions& options)
{
    const CaptureLoader producer(std::make_shared<const BundleReader>(producerPath));
    const CaptureLoader consumer(std::make_shared<const BundleReader>(consumerPath));
    return compareTransfer(producer, consumer, options);
}

}  // namespace kvscope
