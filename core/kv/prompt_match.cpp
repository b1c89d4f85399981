#include "kv/prompt_match.h"

namespace kvscope {

PromptMatch matchPromptsByTokens(const std::vector<const std::vector<std::int64_t>*>& a,
                                 const std::vector<const std::vector<std::int64_t>*>& b)
{
    PromptMatch match;
    std::vector<char> used(a.size(), 0);
    for (std::size_t ib = 0; ib < b.size(); ++ib) {
        std::size_t ia = 0;
        while (ia < a.size() && (used[ia] || b[ib]->empty() || *a[ia] != *b[ib]))
            ++ia;
        if (ia == a.size()) {
            match.onlyB.push_back(ib);
            continue;
        }
        used[ia] = 1;
        match.pairs.emplace_back(ia, ib);
    }
    for (std::size_t ia = 0; ia < a.size(); ++ia)
        if (!used[ia])
            match.onlyA.push_back(ia);
    return match;
}

std::string describeTokenIds(const std::vector<std::int64_t>& ids)
{
    std::string text;
    for (std::size_t i = 0; i < ids.size() && i < 6; ++i)
        text += (i ? ", " : "") + std::to_string(ids[i]);
    return "[" + text + (ids.size() > 6 ? ", ..." : "") + "] (" + std::to_string(ids.size()) + " tokens)";
}

}  // namespace kvscope
