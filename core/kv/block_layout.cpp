#include "kv/block_layout.h"

#include <utility>

namespace kvscope {

namespace {

KvPart other(KvPart part) { return part == KvPart::K ? KvPart::V : KvPart::K; }

}  // namespace

std::vector<BlockMisread> blockMisreads(int group, int bs, bool sameWidth)
{
    std::vector<BlockMisread> layouts;
    const auto local = [group](int head) { return std::pair{head - head % group, head % group}; };
    // Written head-major ([heads, rows]), read token-major ([rows, heads]): the read (h, r) is
    // memory row r * group + h of the head-major block.
    layouts.push_back({"head_major", "token_major", [=](BlockRow c) {
                           const auto [base, h] = local(c.head);
                           const int i = c.row * group + h;
                           return BlockRow{c.part, base + i / bs, i % bs};
                       }});
    layouts.push_back({"token_major", "head_major", [=](BlockRow c) {
                           const auto [base, h] = local(c.head);
                           const int j = h * bs + c.row;
                           return BlockRow{c.part, base + j % group, j / group};
                       }});
    if (!sameWidth)
        return layouts;
    layouts.push_back({"k_v", "v_k", [](BlockRow c) { return BlockRow{other(c.part), c.head, c.row}; }});
    // K and V split, each token-major ([2, rows, heads]: FlashAttention's page before vLLM packed
    // K and V, FlashInfer's NHD), against the packed page (K|V per row of a head: [heads, rows, 2]).
    layouts.push_back({"kv_split_token_major", "kv_interleaved_rows", [=](BlockRow c) {
                           const auto [base, h] = local(c.head);
                           const int i = 2 * (h * bs + c.row) + (c.part == KvPart::K ? 0 : 1);  // memory row
                           const int rest = i % (group * bs);
                           return BlockRow{i < group * bs ? KvPart::K : KvPart::V, base + rest % group, rest / group};
                       }});
    layouts.push_back({"kv_interleaved_rows", "kv_split_token_major", [=](BlockRow c) {
                           const auto [base, h] = local(c.head);
                           const int i = (c.part == KvPart::K ? 0 : group * bs) + c.row * group + h;  // memory row
                           return BlockRow{i % 2 ? KvPart::V : KvPart::K, base + (i / 2) / bs, (i / 2) % bs};
                       }});
    // K and V interleaved in units of `unit` rows of the head-major block, against all of K then
    // all of V.
    for (const auto& [unit, name] : {std::pair{1, "kv_interleaved_rows"}, std::pair{bs, "kv_interleaved_heads"}}) {
        const int units = group * bs / unit;
        if (units < 2)
            continue;
        layouts.push_back({name, "kv_split", [=](BlockRow c) {
                               const auto [base, h] = local(c.head);
                               const int i = h * bs + c.row;
                               const int j = (c.part == KvPart::K ? 0 : units) + i / unit;  // memory unit
                               const int from = (j / 2) * unit + i % unit;
                               return BlockRow{j % 2 ? KvPart::V : KvPart::K, base + from / bs, from % bs};
                           }});
        layouts.push_back({"kv_split", name, [=](BlockRow c) {
                               const auto [base, h] = local(c.head);
                               const int i = h * bs + c.row;
                               const int j = 2 * (i / unit) + (c.part == KvPart::K ? 0 : 1);
                               const KvPart part = j < units ? KvPart::K : KvPart::V;
                               const int from = (j % units) * unit + i % unit;
                               return BlockRow{part, base + from / bs, from % bs};
                           }});
    }
    return layouts;
}

std::vector<CacheMisread> cacheMisreads(std::int64_t numBlocks)
{
    const std::int64_t n = numBlocks;
    // Memory as pages: K/V-first page u is part u / n of block u % n; blocks-first page u is
    // part u % 2 of block u / 2. A misread takes the page its own order puts at u.
    return {{"kv_first", "blocks_first", [n](CachePage read) {
                 const std::int64_t u = 2 * read.block + (read.part == KvPart::K ? 0 : 1);
                 return CachePage{u < n ? KvPart::K : KvPart::V, u % n};
             }},
            {"blocks_first", "kv_first", [n](CachePage read) {
                 const std::int64_t u = (read.part == KvPart::K ? 0 : n) + read.block;
                 return CachePage{u % 2 ? KvPart::V : KvPart::K, u / 2};
             }}};
}

}  // namespace kvscope
