#include "kv/sweep.h"

#include "format/bundle_error.h"

#include <algorithm>
#include <filesystem>
#include <map>

namespace kvscope {

bool isSweep(const std::vector<std::string>& operands)
{
    std::error_code error;
    return operands.size() > 1 || (operands.size() == 1 && std::filesystem::is_directory(operands.front(), error));
}

std::vector<std::string> sweepBundlePaths(const std::vector<std::string>& operands)
{
    namespace fs = std::filesystem;
    std::vector<std::string> paths;
    for (const std::string& operand : operands) {
        std::error_code error;
        if (fs::is_directory(operand, error)) {
            std::vector<std::string> found;
            // Every *.h5 but folders: one that cannot be read (a broken link) is left out, named.
            for (const fs::directory_entry& entry : fs::directory_iterator(operand, error))
                if (std::error_code kind; entry.path().extension() == ".h5" && !entry.is_directory(kind))
                    found.push_back(entry.path().string());
            if (error)
                throw BundleError(operand, {}, "cannot be listed: " + error.message());
            if (found.empty())
                throw BundleError(operand, {}, "is a folder without bundles (*.h5 files)");
            std::sort(found.begin(), found.end());
            paths.insert(paths.end(), found.begin(), found.end());
        } else if (fs::exists(operand, error)) {
            paths.push_back(operand);
        } else {
            throw BundleError(operand, {}, "does not exist");
        }
    }
    // The same file twice (a folder and a file in it, or two spellings of one path) would be
    // pooled twice.
    std::map<std::string, std::string> seen;  // canonical -> as given
    for (const std::string& path : paths) {
        std::error_code error;
        const std::string canonical = fs::weakly_canonical(path, error).string();
        if (const auto [at, fresh] = seen.emplace(error ? path : canonical, path); !fresh)
            throw BundleError(path, {}, "is given twice (also as " + at->second + "): a sweep takes each bundle once");
    }
    return paths;
}

std::string sweepMismatch(const BundleReader& first, const BundleReader& other)
{
    const auto rope = [](const BundleMetadata& m) {
        const auto it = m.extra.find("rope");
        return it == m.extra.end() ? std::string() : it->second;
    };
    if (first.metadata().model != other.metadata().model)
        return "its model '" + other.metadata().model + "' is not the sweep's first bundle's ('" + first.metadata().model + "')";
    if (rope(first.metadata()) != rope(other.metadata()))
        return "its RoPE settings (metadata attribute 'rope') are not the sweep's first bundle's";
    return sweepConfigMismatch(first.config(), other.config());
}

std::string sweepConfigMismatch(const KvCacheConfig& first, const KvCacheConfig& other)
{
    KvCacheConfig a = first, b = other;
    a.numBlocks = b.numBlocks = 0;
    if (a.toJson() == b.toJson())
        return {};
    if (a.layerNames() != b.layerNames())
        return "its layers are not those of the sweep's first bundle";
    if (a.tpSize != b.tpSize || a.dcpSize != b.dcpSize)
        return "its tensor parallelism (TP " + std::to_string(b.tpSize) + ", DCP " + std::to_string(b.dcpSize) +
               ") is not that of the sweep's first bundle (TP " + std::to_string(a.tpSize) + ", DCP " +
               std::to_string(a.dcpSize) + ")";
    return "its kv_cache_config differs from the sweep's first bundle's (in more than num_blocks)";
}

void requireEveryBundle(const Sweep& sweep)
{
    std::string leftOut;
    for (const SweepBundle& b : sweep.bundles)
        if (!b.problem.empty())
            leftOut += "\n  " + b.problem;
    if (!leftOut.empty())
        throw BundleError(sweep.label, {}, "bundles of the sweep cannot be analysed:" + leftOut);
}

Sweep openSweep(const std::vector<std::string>& operands, UnreadableBlockPolicy policy, const BundleProbe& probe)
{
    namespace fs = std::filesystem;
    Sweep sweep;
    const std::vector<std::string> paths = sweepBundlePaths(operands);
    sweep.label = operands.size() == 1 && fs::is_directory(operands.front())
                      ? operands.front()
                      : paths.front() + (paths.size() > 1 ? " and " + std::to_string(paths.size() - 1) + " more" : "");
    std::map<std::string, int> stems;
    for (const std::string& path : paths)
        ++stems[fs::path(path).stem().string()];
    std::vector<SweepMember> members;
    for (const std::string& path : paths) {
        const std::string stem = fs::path(path).stem().string();
        SweepBundle bundle{stems[stem] > 1 ? fs::path(path).replace_extension().string() : stem, path, {}};
        try {
            if (probe)
                probe(path);
            auto reader = std::make_shared<const BundleReader>(path);
            bundle.created = reader->metadata().created;
            if (!members.empty())
                if (const std::string mismatch = sweepMismatch(*members.front().reader, *reader); !mismatch.empty())
                    bundle.problem = BundleError(path, {}, mismatch).what();
            if (bundle.problem.empty())
                members.push_back({bundle.name, std::move(reader)});
        } catch (const std::exception& e) {
            bundle.problem = e.what();
        }
        sweep.bundles.push_back(std::move(bundle));
    }
    if (!members.empty())
        sweep.loader = std::make_shared<const CaptureLoader>(std::move(members), sweep.label, policy);
    return sweep;
}

}  // namespace kvscope
