#pragma once
// `kvscope import DIR -o BUNDLE.h5`: a folder of raw dumps (torch.save files, JSON,
// safetensors) made into a capture bundle. File names: docs/import.md.

#include <string>

namespace kvscope {

// Throws BundleError naming the file and what is wrong with it.
void importDumpDirectory(const std::string& directory, const std::string& bundlePath);

}  // namespace kvscope
