#pragma once
// Choosing layers on the command line: "0-3,7,model.layers.9.self_attn".

#include <string>
#include <vector>

namespace kvscope {

// Indices into `layers` (model order), index ranges, or layer names, comma-separated; the
// selected names in the order given. Throws std::invalid_argument naming the bad item.
std::vector<std::string> parseLayerSelection(const std::string& spec, const std::vector<std::string>& layers);

}  // namespace kvscope
