#pragma once
// kvscope transfer's result as strict JSON (docs/transfer.md): the matched prompts and which of
// their positions were transferred, each changed block with its explanation or what was
// measured, the first change and the exit status. Key names are stable: scripts read them.

#include "transfer/transfer_compare.h"

#include <iosfwd>
#include <string>

namespace kvscope {

void writeTransferJson(const TransferResult& result, std::ostream& out);
// The document of captures that could not be compared (exit status 2): the paths and why.
void writeTransferErrorJson(const std::string& producerPath, const std::string& consumerPath, const std::string& error,
                            std::ostream& out);

}  // namespace kvscope
