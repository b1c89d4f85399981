#pragma once
// One layer of one prompt at one snapshot as the engine held it, block by block: each
// block-table entry's physical block decoded whole (every row, written or not: a misread layout
// or a block written only in part draws on all of them), the heads of every TP rank side by side.
// Entry e holds positions [e * block_size, (e + 1) * block_size).

#include "format/paged_kv.h"
#include "kv/layer_kv.h"

#include <array>
#include <cstdint>
#include <string>
#include <vector>

namespace kvscope {

class CaptureLoader;

struct LayerBlocks {
    int heads = 0;
    int blockSize = 0;
    HeadDims dims;
    std::int64_t written = 0;               // positions [0, written) hold data
    std::vector<std::int64_t> physical;     // per entry; -1 a null entry
    std::vector<std::uint8_t> stored;       // per entry: its block is in the bundle (a null one is not)
    // Per part, [entry][head][row][dim], decoded (scales applied); NaN where not stored.
    std::array<std::vector<float>, 2> values;
    // Per part, [entry][head][row]: the largest dequantisation scale among the row's values (1
    // for an unscaled cache): the absolute step of a quantised format there.
    std::array<std::vector<float>, 2> rowScales;

    std::int64_t entries() const { return std::int64_t(physical.size()); }
    std::int64_t entryOf(std::int64_t pos) const { return pos / blockSize; }
    // Whether position `pos` holds data: written, in a stored block.
    bool present(std::int64_t pos) const;
    std::size_t rowIndex(std::int64_t entry, int head, int row) const
    {
        return (std::size_t(entry) * std::size_t(heads) + std::size_t(head)) * std::size_t(blockSize) + std::size_t(row);
    }
    const float* row(KvPart part, std::int64_t entry, int head, int row) const
    {
        return values[std::size_t(part)].data() + rowIndex(entry, head, row) * std::size_t(dims.of(part));
    }
    float rowScale(KvPart part, std::int64_t entry, int head, int row) const
    {
        return rowScales[std::size_t(part)][rowIndex(entry, head, row)];
    }
};

// Reads `layer` of `promptId` at `snapshot` (the table's row of the snapshot's batch row).
// Blocks the table names that the bundle does not store are left NaN and `stored` 0; each is
// named in `problems`. Throws BundleError for what cannot be read at all.
LayerBlocks readLayerBlocks(const CaptureLoader& loader, const std::string& promptId, std::size_t snapshot,
                            const std::string& layer, std::vector<std::string>* problems = nullptr);

}  // namespace kvscope
