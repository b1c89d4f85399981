#pragma once
// Prompts of two captures matched by their token ids: kvscope diff's A and B, kvscope transfer's
// producer and consumer. Ids differ between captures (and engines); the tokens do not.

#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace kvscope {

struct PromptMatch {
    std::vector<std::pair<std::size_t, std::size_t>> pairs;  // (index in A, index in B), in B's order
    std::vector<std::size_t> onlyA, onlyB;                    // without a match, in their order
};

// Each prompt of B matched with the first prompt of A with the same (non-empty) token ids not
// matched already: a prompt asked twice is matched twice, in order.
PromptMatch matchPromptsByTokens(const std::vector<const std::vector<std::int64_t>*>& a,
                                 const std::vector<const std::vector<std::int64_t>*>& b);

// "[1, 2, 3, 4, 5, 6, ...] (40 tokens)": a prompt's tokens in a message.
std::string describeTokenIds(const std::vector<std::int64_t>& ids);

}  // namespace kvscope
