#pragma once
// Importing torch.save dumps needs libtorch, which costs a second of start-up and 300 shared
// libraries. So the import runs in its own executable, `kvscope-import`, that the CLI and the
// app start on demand: nothing else links libtorch, and a hostile pickle cannot take the
// app down with it. This is the launcher (no libtorch here).

#include <atomic>
#include <string>

namespace kvscope {

// The helper executable: $KVSCOPE_IMPORT_HELPER, else `kvscope-import` beside the running
// executable, else ../lib/kvscope/kvscope-import from it (the installed layout).
std::string importHelperPath();

// Runs `kvscope-import DIRECTORY -o BUNDLE`. Throws BundleError with the helper's own message
// when the import fails, or when the helper is missing or crashed; ImportCancelled when
// `cancel` became true (the helper is killed and the half-written bundle removed).
void runImport(const std::string& directory, const std::string& bundlePath, const std::atomic<bool>* cancel = nullptr);

struct ImportCancelled {};

}  // namespace kvscope
