#pragma once
// A half-open range of sequence positions [begin, end): what a snapshot contributes, or the
// window of tokens an analysis reads at a time.

#include <algorithm>
#include <cstdint>
#include <limits>

namespace kvscope {

struct PositionRange {
    std::int64_t begin = 0;
    std::int64_t end = 0;

    // Every position.
    static constexpr PositionRange all() { return {0, std::numeric_limits<std::int64_t>::max()}; }
    bool contains(std::int64_t pos) const { return pos >= begin && pos < end; }
    bool empty() const { return end <= begin; }
    PositionRange clippedTo(PositionRange other) const
    {
        return {std::max(begin, other.begin), std::min(end, other.end)};
    }
    bool operator==(const PositionRange&) const = default;
};

}  // namespace kvscope
