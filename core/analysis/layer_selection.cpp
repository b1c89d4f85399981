#include "analysis/layer_selection.h"

#include <algorithm>
#include <sstream>
#include <stdexcept>

namespace kvscope {

std::vector<std::string> parseLayerSelection(const std::string& spec, const std::vector<std::string>& layers)
{
    std::vector<std::string> selected;
    std::stringstream items(spec);
    for (std::string item; std::getline(items, item, ',');) {
        if (item.empty())
            continue;
        if (std::find(layers.begin(), layers.end(), item) != layers.end()) {
            selected.push_back(item);
            continue;
        }
        const auto dash = item.find('-');
        std::size_t first = 0, last = 0;
        try {
            std::size_t used = 0;
            first = last = std::stoul(item, &used);
            if (dash != std::string::npos)
                last = std::stoul(item.substr(dash + 1), &used);
            else if (used != item.size())
                throw std::invalid_argument(item);
        } catch (const std::exception&) {
            throw std::invalid_argument("--layers: '" + item + "' is neither a layer name nor an index range");
        }
        if (layers.empty())
            throw std::invalid_argument("--layers: the capture has no layers");
        if (first > last || last >= layers.size())
            throw std::invalid_argument("--layers: '" + item + "' outside 0-" + std::to_string(layers.size() - 1));
        for (std::size_t i = first; i <= last; ++i)
            selected.push_back(layers[i]);
    }
    return selected;
}

}  // namespace kvscope
