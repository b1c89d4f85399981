#pragma once
// kvscope transfer's matching: a producer capture (where the KV left) and a consumer capture
// (where it arrived) paired, layer by layer and prompt by prompt. Layers are matched by name
// and must agree in heads, head widths and block size; prompts are matched by their token ids
// (kv/prompt_match.h, as kvscope diff matches them). A part stored in another dtype on the
// consumer is a declared conversion, judged in the coarser format's rounding.

#include "format/dtype.h"
#include "format/paged_kv.h"
#include "kv/layer_kv.h"

#include <array>
#include <optional>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

namespace kvscope {

class CaptureLoader;

// Captures that cannot be compared (kvscope transfer's exit 2): another model, other layers,
// heads or block sizes, no prompt in common. The message names both files and what differs.
class TransferMismatch : public std::runtime_error {
public:
    using std::runtime_error::runtime_error;
};

// TransferOptions::cancel was set.
class TransferCancelled : public std::runtime_error {
public:
    TransferCancelled() : std::runtime_error("transfer comparison cancelled") {}
};

// One layer as both captures hold it.
struct TransferLayer {
    std::string name;
    int heads = 0;      // every KV head (all TP ranks)
    HeadDims dims;
    int blockSize = 0;
    // The consumer's heads per TP rank: a misread layout mixes the rows of one rank's block.
    int consumerHeadsPerRank = 0;
    std::array<DType, 2> producerDType{}, consumerDType{};  // [K/V] as stored
    // [K/V] the format a converted part is judged in (the coarser of the two); none: bit for bit.
    std::array<std::optional<DType>, 2> judgedIn;
};

struct TransferPairing {
    std::vector<TransferLayer> layers;  // the consumer's compared layers, in model order
    std::vector<std::pair<std::string, std::string>> prompts;  // (producer id, consumer id), consumer's order
    std::vector<std::string> onlyProducer, onlyConsumer;       // prompts without a match
};

// Throws TransferMismatch when the captures cannot be compared, BundleError when a matched
// prompt of either cannot be read (its structure found broken on open).
TransferPairing pairCaptures(const CaptureLoader& producer, const CaptureLoader& consumer);

}  // namespace kvscope
