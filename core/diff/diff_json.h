#pragma once
// kvscope diff's verdict as strict JSON (schema: docs/diff.md), by util/json_writer.h's rules.

#include "diff/capture_diff.h"

#include <ostream>

namespace kvscope {

void writeDiffJson(const DiffResult& diff, std::ostream& out);

}  // namespace kvscope
