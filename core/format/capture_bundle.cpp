#include "format/capture_bundle.h"

namespace kvscope {

std::string referenceRoleName(ReferenceRole role)
{
    return role == ReferenceRole::Expected ? "expected" : "baseline";
}

std::string logitsRoleName(LogitsRole role)
{
    switch (role) {
    case LogitsRole::Expected:
        return "expected";
    case LogitsRole::Actual:
        return "actual";
    case LogitsRole::Baseline:
        return "baseline";
    }
    return "?";
}

namespace bundle_path {

std::string prompt(const std::string& id)
{
    return std::string(kPrompts) + "/" + id;
}

std::string snapshot(const std::string& id, std::size_t index)
{
    return prompt(id) + "/engine/snapshot_" + std::to_string(index);
}

std::string blockTable(const std::string& id, std::size_t snapshotIndex, std::size_t group)
{
    return snapshot(id, snapshotIndex) + "/block_tables/group_" + std::to_string(group);
}

std::string engineKv(const std::string& id, std::size_t snapshotIndex, int rank, const std::string& layer,
                     const char* part)
{
    return snapshot(id, snapshotIndex) + "/rank_" + std::to_string(rank) + "/" + layer + "/" + part;
}

std::string referenceRole(const std::string& id, ReferenceRole role)
{
    return prompt(id) + "/reference/" + referenceRoleName(role);
}

std::string referenceKv(const std::string& id, ReferenceRole role, const std::string& layer, const char* part)
{
    return referenceRole(id, role) + "/" + layer + "/" + part;
}

std::string engineStates(const std::string& id)
{
    return prompt(id) + "/engine/states";
}

std::string engineState(const std::string& id, const std::string& layer)
{
    return engineStates(id) + "/" + layer;
}

std::string referenceState(const std::string& id, ReferenceRole role, const std::string& layer)
{
    return referenceRole(id, role) + "/states/" + layer;
}

std::string logits(const std::string& id, LogitsRole role)
{
    return prompt(id) + "/logits/" + logitsRoleName(role);
}

}  // namespace bundle_path
}  // namespace kvscope
