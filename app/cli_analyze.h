#pragma once
// `kvscope analyze BUNDLE [--json OUT.json] [--prompt ID]... [--layers SPEC] [--threads N] [--strict]`

#include <ostream>
#include <string>
#include <vector>

namespace kvscope::cli {

// Exit code: 0 analysed (even when the engine is wrong: that is `check`'s job), 2 when the
// bundle cannot be read or the arguments are wrong.
int analyze(const std::vector<std::string>& args, std::ostream& out, std::ostream& err);

// "0-3,7,model.layers.9.self_attn": indices into `layers` (model order) or names.
std::vector<std::string> parseLayerSelection(const std::string& spec, const std::vector<std::string>& layers);

}  // namespace kvscope::cli
