#include "dumps/import_process.h"

#include "format/bundle_error.h"
#include "util/sibling_executables.h"

#include "util/child_process.h"

#include <filesystem>
#include <stdexcept>

namespace kvscope {

std::string importHelperPath()
{
    return siblingExecutable("kvscope-import", "KVSCOPE_IMPORT_HELPER");
}

namespace {

// Whether the folder holds any file of a folder of dumps (docs/import.md): a folder that does
// is one with a file missing, which the importer names.
bool holdsAnyDump(const std::string& directory)
{
    std::error_code error;
    for (const auto& entry : std::filesystem::directory_iterator(directory, error)) {
        const std::string name = entry.path().filename().string();
        if (name == "kv_cache_config.json" || name == "prompt.json" || name == "block_tables.pt" ||
            name.starts_with("kv_caches_rank") || name.starts_with("expected.") || name.starts_with("baseline."))
            return true;
    }
    return false;
}

}  // namespace

void runImport(const std::string& directory, const std::string& bundlePath, const std::atomic<bool>* cancel)
{
    // A folder given by mistake (dropped on the app, or a typo): say what was given and what a
    // folder of dumps holds, rather than the importer's first complaint about a missing file.
    if (!std::filesystem::exists(directory))
        throw BundleError(directory, {}, "does not exist");
    if (!std::filesystem::is_directory(directory))
        throw BundleError(directory, {}, "is a file, not a folder of dumps (a capture bundle opens as it is: kvscope BUNDLE)");
    if (!holdsAnyDump(directory))
        throw BundleError(directory, {},
                          "is a folder, not a capture bundle (.h5), and not a folder of dumps either: a folder of dumps "
                          "holds kv_cache_config.json, prompt.json, kv_caches_rank<R>.pt for every TP rank, "
                          "block_tables.pt, and expected.pt or expected.safetensors (baseline.* for three-way); see "
                          "docs/import.md. To open a bundle, choose its file.");
    const std::string helper = importHelperPath();
    ChildExit exit;
    try {
        exit = runChildProcess({helper, directory, "-o", bundlePath}, cancel);
    } catch (const std::exception& e) {
        throw BundleError(directory, "", std::string("cannot run the import helper: ") + e.what());
    }
    if (exit.cancelled) {
        std::error_code ignored;
        std::filesystem::remove(bundlePath, ignored);
        throw ImportCancelled{};
    }
    if (exit.signal == 0 && exit.exitCode == 0)
        return;
    // The helper prints "kvscope-import: <BundleError text>"; pass its message on.
    std::string messages = exit.messages;
    const std::string prefix = "kvscope-import: ";
    if (messages.rfind(prefix, 0) == 0)
        messages.erase(0, prefix.size());
    if (exit.signal != 0)
        messages = "the import helper crashed (signal " + std::to_string(exit.signal) + ")" +
                   (messages.empty() ? "" : ": " + messages);
    else if (messages.empty())
        messages = "the import helper failed with exit code " + std::to_string(exit.exitCode);
    throw std::runtime_error(messages);  // already "file: object: problem"
}

}  // namespace kvscope
