#include "format/bundle_outline.h"

#include "util/content_hash.h"
#include "util/json_writer.h"

#include <sstream>

namespace kvscope {

namespace {

const LogitsRole kLogitsRoles[] = {LogitsRole::Expected, LogitsRole::Actual, LogitsRole::Baseline};

void writePromptInfo(JsonWriter& w, const PromptInfo& p)
{
    w.beginObject()
        .field("id", p.id)
        .field("prompt_len", p.promptLen)
        .key("input_ids")
        .numbers(p.inputIds)
        .key("teacher_tokens")
        .numbers(p.teacherTokens)
        .field("has_divergences", p.hasDivergences)
        .key("divergence_positions")
        .numbers(p.divergencePositions)
        .key("token_strings")
        .strings(p.tokenStrings)
        .key("snapshots")
        .array(p.snapshots.size(), [&](std::size_t s) {
            const SnapshotInfo& snap = p.snapshots[s];
            w.beginObject()
                .field("batch_row", snap.batchRow)
                .key("seq_lens")
                .numbers(snap.seqLens)
                .field("validated_until", snap.validatedUntil)
                .field("subset_stored", snap.subsetStored)
                .key("stored_block_ids")
                .numbers(snap.storedBlockIds)
                .endObject();
        })
        .field("has_expected", p.hasExpected)
        .field("has_baseline", p.hasBaseline)
        .key("logits")
        .array(p.logits.size(), [&](std::size_t i) { w.value(logitsRoleName(p.logits[i])); })
        .key("problems")
        .strings(p.problems)
        .endObject();
}

PromptInfo readPromptInfo(const JsonFields& f, const JsonFields::Json& p, const std::string& where)
{
    PromptInfo info;
    info.id = f.text(p, "id", where);
    info.promptLen = f.integer(p, "prompt_len", where);
    info.inputIds = f.integers(p, "input_ids", where);
    info.teacherTokens = f.integers(p, "teacher_tokens", where);
    info.hasDivergences = f.boolean(p, "has_divergences", where);
    info.divergencePositions = f.integers(p, "divergence_positions", where);
    info.tokenStrings = f.texts(p, "token_strings", where);
    const JsonFields::Json& snapshots = f.array(p, "snapshots", where);
    for (std::size_t s = 0; s < snapshots.size(); ++s) {
        const std::string at = where + "snapshots[" + std::to_string(s) + "].";
        SnapshotInfo snap;
        snap.batchRow = f.integer(snapshots[s], "batch_row", at);
        snap.seqLens = f.integers(snapshots[s], "seq_lens", at);
        if (snap.batchRow < 0 || snap.batchRow >= std::int64_t(snap.seqLens.size()))
            f.fail(at + "batch_row", "outside seq_lens");
        if (snap.seqLen() < 1)  // (as a bundle's own check: bundle_reader.cpp)
            f.fail(at + "seq_lens", "the prompt's own row has no length");
        snap.validatedUntil = f.integer(snapshots[s], "validated_until", at);
        snap.subsetStored = f.boolean(snapshots[s], "subset_stored", at);
        snap.storedBlockIds = f.integers(snapshots[s], "stored_block_ids", at);
        info.snapshots.push_back(std::move(snap));
    }
    if (info.snapshots.empty())
        f.fail(where + "snapshots", "is empty: a prompt needs at least one engine snapshot");
    info.hasExpected = f.boolean(p, "has_expected", where);
    info.hasBaseline = f.boolean(p, "has_baseline", where);
    for (const std::string& name : f.texts(p, "logits", where)) {
        bool known = false;
        for (LogitsRole role : kLogitsRoles)
            if (logitsRoleName(role) == name) {
                info.logits.push_back(role);
                known = true;
            }
        if (!known)
            f.fail(where + "logits", "names '" + name + "', not a logits role");
    }
    info.problems = f.texts(p, "problems", where);
    return info;
}

}  // namespace

void writeOutlineJson(JsonWriter& w, const BundleOutline& outline)
{
    const BundleMetadata& m = outline.metadata;
    w.beginObject()
        .field("bytes", outline.bytes)
        .key("metadata")
        .beginObject()
        .field("model", m.model)
        .field("engine", m.engine)
        .field("created", m.created)
        .field("notes", m.notes)
        .field("writer", m.writer)
        .field("format_version", m.formatVersion)
        .key("extra")
        .beginObject();
    for (const auto& [key, value] : m.extra)
        w.field(key, value);
    w.endObject()
        .endObject()
        .field("kv_cache_config", outline.config.json)
        .key("prompts")
        .array(outline.prompts.size(), [&](std::size_t i) { writePromptInfo(w, outline.prompts[i]); })
        .endObject();
}

BundleOutline readOutlineJson(const JsonFields& f, const JsonFields::Json& document, const std::string& where)
{
    BundleOutline outline;
    const std::int64_t bytes = f.integer(document, "bytes", where);
    if (bytes < 0)
        f.fail(where + "bytes", "is negative");
    outline.bytes = std::uint64_t(bytes);
    const std::string at = where + "metadata.";
    const JsonFields::Json& m = f.at(document, "metadata", where);
    outline.metadata.model = f.text(m, "model", at);
    outline.metadata.engine = f.text(m, "engine", at);
    outline.metadata.created = f.text(m, "created", at);
    outline.metadata.notes = f.text(m, "notes", at);
    outline.metadata.writer = f.text(m, "writer", at);
    outline.metadata.formatVersion = int(f.integer(m, "format_version", at));
    const JsonFields::Json& extra = f.at(m, "extra", at);
    if (!extra.is_object())
        f.fail(at + "extra", "must be an object");
    for (const auto& [key, value] : extra.items()) {
        if (!value.is_string())
            f.fail(at + "extra." + key, "must be a string");
        outline.metadata.extra[key] = value.get<std::string>();
    }
    outline.config = KvCacheConfig::fromJson(f.text(document, "kv_cache_config", where), f.file(),
                                             where + "kv_cache_config");
    const JsonFields::Json& prompts = f.array(document, "prompts", where);
    for (std::size_t i = 0; i < prompts.size(); ++i)
        outline.prompts.push_back(readPromptInfo(f, prompts[i], where + "prompts[" + std::to_string(i) + "]."));
    return outline;
}

std::uint64_t outlineFingerprint(const BundleOutline& outline)
{
    std::ostringstream text;
    JsonWriter w(text);
    writeOutlineJson(w, outline);
    const std::string bytes = text.str();
    ContentHash hash;
    hash.add(bytes.data(), bytes.size());
    return hash.value();
}

}  // namespace kvscope
