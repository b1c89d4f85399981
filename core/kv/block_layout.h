#pragma once
// A block's bytes read in another order than they were written: the misreads of one TP rank's
// block of a paged KV cache (`heads` KV heads of `rows` positions, K and V). Each maps a row as
// it was read (part, head, row in block) to the row of the block as written that it holds.
// And the misread across blocks: a layer's cache of K/V-first pages read blocks-first or the
// other way round, each page read holding another block's page (cacheMisreads).
// Shared by the producer-vs-consumer explanations (transfer/transfer_hypotheses.h) and the
// engine-vs-reference ones (analysis/hypotheses.h). With few heads (two KV heads, or a block
// as many rows as heads) the shapes of two layouts agree and only the values tell.

#include "format/paged_kv.h"

#include <functional>
#include <string>
#include <vector>

namespace kvscope {

// A row of a block: its part, its head (the model's index; the rank's heads are consecutive)
// and its row (position within the block).
struct BlockRow {
    KvPart part = KvPart::K;
    int head = 0;
    int row = 0;
};

struct BlockMisread {
    // "head_major" / "token_major", "k_v" / "v_k", "kv_split" / "kv_split_token_major" /
    // "kv_interleaved_rows" / "kv_interleaved_heads".
    std::string writtenAs, readAs;
    std::function<BlockRow(BlockRow)> source;  // the written row a read row holds
};

// The misreads of a rank's block of `heads` heads and `rows` rows, in the order they are tried:
// head-major written and read token-major and the other way round; when `sameWidth` (K and V
// as wide: only then can one be read as the other) also K and V swapped, K and V split
// token-major (FlashAttention's page before K and V were packed) against the packed page,
// and K and V interleaved (per row of a head, or per head) against all K then all V.
std::vector<BlockMisread> blockMisreads(int heads, int rows, bool sameWidth);

// A page of a layer's cache on one TP rank: one part of one physical block (its heads x rows).
struct CachePage {
    KvPart part = KvPart::K;
    std::int64_t block = 0;
    bool operator==(const CachePage&) const = default;
};

struct CacheMisread {
    // "kv_first" ([2, num_blocks, ...]: all K pages, then all V pages; vLLM's FlashAttention
    // cache) / "blocks_first" ([num_blocks, 2, ...]: each block's K page then its V page;
    // FlashInfer's and others').
    std::string writtenAs, readAs;
    std::function<CachePage(CachePage)> source;  // the written page a read page holds
};

// The two: K/V-first read blocks-first, and blocks-first read K/V-first, over a cache of
// `numBlocks` blocks. Each is the other's inverse: re-read through the other, a misread cache
// gives back the pages as written.
std::vector<CacheMisread> cacheMisreads(std::int64_t numBlocks);

}  // namespace kvscope
