#pragma once
// Why a block changed on its way from the producer to the consumer: explanations tested, as
// the suspects' are (analysis/hypotheses.h). Each is applied to the producer's data and is
// accepted only if it makes every changed row of the block what the consumer holds (bit for
// bit, or within a declared conversion's rounding). Otherwise the block is "unexplained", with
// what was measured. Tried in this order, the cheapest and most specific first:
// - not written when read: the changed rows are zeros (the first rows of the block right: how
//   many were written), or old data (found by the search below);
// - a layout read as another, within one TP rank's block: head-major written and read
//   token-major or the other way round, K and V swapped, K and V split token-major (vLLM's
//   page before K and V were packed) read as packed or the other way round, K and V
//   interleaved (per row of a head, or per head) read as split or split read as interleaved.
//   The first that gives the values is named. With few heads (two KV heads, or a block as
//   many rows as heads) shapes agree and only the values tell;
// - a conversion: the values cast through another format (bf16, fp16, fp8), or rescaled by a
//   factor (per part);
// - data from elsewhere, found by fingerprint (transfer/producer_rows.h): the producer's
//   position p + k * block_size (a block offset), another request's block, or what the
//   producer's block held earlier (a stale block: an earlier request's or snapshot's data).

#include "transfer/block_comparison.h"
#include "transfer/producer_rows.h"
#include "transfer/transfer_pairing.h"

#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace kvscope {

// Where a block's data was found in the producer.
struct DataSource {
    std::string prompt;          // the producer's prompt id
    std::int64_t snapshot = 0;
    bool lastSnapshot = true;
    std::int64_t block = 0;      // its block-table entry
    std::int64_t physicalBlock = -1;
    KvPart part = KvPart::K;     // the part the consumer's K rows came from (V's the other, if swapped)
};

// What was measured of a changed block, explained or not.
struct BlockSignature {
    std::int64_t changedRows = 0;      // changed (position, head, part) rows
    std::int64_t zeroRows = 0;         // of them, all zeros on the consumer
    std::int64_t firstChangedRow = 0;  // the first changed position's row in the block
    bool tail = false;                 // the changed positions are the block's compared ones from the first changed on
    // Whether the changed rows were looked up in the producer, and how many were found there.
    bool searched = false;
    std::int64_t rowsFound = 0;
};

struct TransferExplanation {
    // "not_written", "layout", "conversion", "scale", "block_offset", "other_request",
    // "stale_block", or "unexplained".
    std::string name = "unexplained";
    std::string writtenAs, readAs;  // layout: "head_major" / "token_major", "k_v" / "v_k", "kv_split" / "kv_split_token_major" / "kv_interleaved_rows" / "kv_interleaved_heads"
    std::string format;             // conversion: the format cast through (dtypeName)
    std::array<double, 2> factor{1.0, 1.0};  // scale: [K/V] consumer / producer
    std::int64_t offsetBlocks = 0;  // block_offset: consumer position p holds the producer's p + k * block_size
    std::optional<DataSource> source;  // other_request, stale_block, not_written with old data
    std::int64_t rowsWritten = -1;  // not_written: rows of the block written before the read (-1: zeros not only at the end)
    std::string rest;               // not_written: "zeros" or "old_data"
    BlockSignature signature;
    std::string sentence;           // for people

    bool explained() const { return name != "unexplained"; }
};

// The changed rows of a block as the consumer holds them, kept (a copy, small) for the search
// of their origin, which runs once a layer's blocks are all compared.
struct ChangedRows {
    struct Row {
        std::int64_t position = 0;
        int head = 0;
        KvPart part = KvPart::K;
        std::vector<float> values;
    };
    std::vector<Row> rows;
};

struct BlockEvidence {
    const ChangedBlock& block;
    const LayerBlocks& producer;
    const LayerBlocks& consumer;
    const TransferLayer& layer;
    const std::array<ValueJudge, 2>& judges;
};

// The hypotheses that read this block only (not written as zeros, layout, conversion, scale);
// unexplained when none holds, with `rows` filled for explainBySource.
TransferExplanation explainLocally(const BlockEvidence& evidence, ChangedRows& rows);

// The hypotheses that look for the rows in the producer (block offset, another request's
// block, a stale block, not written with old data), given the block's own producer prompt
// (index among the producer's prompts) and their ids; `local` is explainLocally's answer, whose
// signature is completed.
TransferExplanation explainBySource(const ChangedBlock& block, const ChangedRows& rows, const ProducerRows& index,
                                    std::uint32_t producerPrompt, const std::vector<std::string>& producerPromptIds,
                                    int blockSize, TransferExplanation local);

}  // namespace kvscope
