#pragma once
// kvscope transfer: two engine captures of the same requests, one taken where the KV left (the
// producer: a disaggregated-prefill instance, the offloading side) and one where it arrived
// (the consumer), compared bit for bit (docs/transfer.md). Prompts are matched by their token
// ids and blocks by position (the engines' physical ids differ); no reference model is read.
// Every layer of every matched prompt is compared; each changed block is explained by a tested
// hypothesis (transfer/transfer_hypotheses.h) or measured as unexplained.
//
// Identical: 0; something changed (or nothing was transferred at all): 1; captures that cannot
// be compared throw TransferMismatch or BundleError (kvscope transfer's 2).

#include "transfer/block_comparison.h"
#include "transfer/transfer_hypotheses.h"
#include "transfer/transfer_pairing.h"
#include "transfer/transferred_positions.h"

#include <atomic>
#include <cstddef>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

namespace kvscope {

class CaptureLoader;

struct TransferOptions {
    // Called after each (layer, prompt) compared, with how many of layers x prompts are done.
    std::function<void(std::size_t done, std::size_t total)> progress;
    const std::atomic<bool>* cancel = nullptr;
    // Changed blocks kept in the result, in order (all are counted and explained).
    std::size_t listedBlocks = 1000;
    // Changed blocks per layer whose rows are looked up in the producer; past it, unexplained.
    std::size_t searchedBlocksPerLayer = 4096;
};

// One matched prompt: its ids and which positions were transferred (classified by the first
// full-attention layer's blocks: a sliding window frees old blocks on both sides).
struct PromptTransfer {
    std::string producer, consumer;
    std::string classifiedBy;  // the layer
    TransferredPositions positions;
    std::size_t changedBlocks = 0;
};

struct BlockFinding {
    ChangedBlock block;
    TransferExplanation explanation;
};

// The first changed value: the lowest layer, then the consumer's prompt order, position, head.
struct FirstChange {
    std::size_t prompt = 0;  // index into TransferResult::prompts
    std::size_t layer = 0;   // index into TransferResult::layers
    ValueAt at;
    std::int64_t block = 0;
    std::int64_t producerBlock = -1, consumerBlock = -1;
};

struct TransferResult {
    std::string producerPath, consumerPath;
    std::vector<TransferLayer> layers;
    std::vector<PromptTransfer> prompts;
    std::vector<std::string> onlyProducer, onlyConsumer;
    std::vector<BlockFinding> changed;  // the first TransferOptions::listedBlocks, by layer, prompt, block
    std::size_t changedBlocks = 0;      // all of them
    std::map<std::string, std::size_t> byExplanation;  // changed blocks per explanation's name
    std::optional<FirstChange> firstChange;
    std::int64_t comparedPositions = 0;  // over the matched prompts
    std::vector<std::string> problems;   // blocks a table names that a bundle does not store

    // 0 identical, 1 changed or nothing compared.
    int exitStatus() const { return changedBlocks || comparedPositions == 0 ? 1 : 0; }
};

TransferResult compareTransfer(const CaptureLoader& producer, const CaptureLoader& consumer,
                               const TransferOptions& options = {});
// The bundles at these paths (engine-only, or with a reference, which is ignored).
TransferResult compareTransfer(const std::string& producerPath, const std::string& consumerPath,
                               const TransferOptions& options = {});

}  // namespace kvscope
