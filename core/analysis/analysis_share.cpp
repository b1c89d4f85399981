#include "analysis/analysis_share.h"

#include <algorithm>
#include <numeric>

namespace kvscope {

std::vector<int> balancePrompts(const std::vector<std::uint64_t>& promptBytes, int processes)
{
    std::vector<std::size_t> order(promptBytes.size());
    std::iota(order.begin(), order.end(), std::size_t(0));
    std::stable_sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) { return promptBytes[a] > promptBytes[b]; });
    std::vector<std::uint64_t> load(std::size_t(std::max(1, processes)), 0);
    std::vector<int> owner(promptBytes.size(), 0);
    for (std::size_t prompt : order) {
        const auto least = std::min_element(load.begin(), load.end());  // the first of equals
        owner[prompt] = int(least - load.begin());
        *least += promptBytes[prompt];
    }
    return owner;
}

}  // namespace kvscope
