#pragma once
// A results file's record of format 1 or 2 in format 3's names, so that one reader
// (results/analysis_record.h) reads every format. Formats 1 and 2 named and shaped the fields
// the record shares with the analysis JSON their own way (tokens, three_way, [k, v] pairs...);
// format 3 has the analysis JSON's (docs/results-files.md). Keys are only renamed and
// reshaped: a field that was wrong stays wrong, for the reader to name.

#include "format/json_fields.h"

namespace kvscope {

// Nothing for format 3 on. Format 1's aggregate BCs by generation index, flat in the record,
// become the analysis JSON's rows by layer (k_bc, v_bc_vs_noise, ...).
void upgradeRecordToV3(JsonFields::Json& record, int formatVersion);

}  // namespace kvscope
