#pragma once
// What a bundle says about itself without its tensors: its size, metadata, KV cache config and
// prompts (tokens, snapshots, which references and logits it holds). A results file keeps it,
// so that an analysis can be shown (the report, the app) where the bundle is not: a
// BundleReader made from an outline answers everything but reads of data.

#include "format/capture_bundle.h"
#include "format/json_fields.h"
#include "format/kv_cache_config.h"

#include <cstdint>
#include <string>
#include <vector>

namespace kvscope {

class JsonWriter;

struct BundleOutline {
    std::string path;         // where the bundle was read (not part of the fingerprint: bundles move)
    std::uint64_t bytes = 0;  // its size
    BundleMetadata metadata;
    KvCacheConfig config;
    std::vector<PromptInfo> prompts;
};

// The outline as JSON (all but the path) and back; reading names the field that is wrong.
void writeOutlineJson(JsonWriter& w, const BundleOutline& outline);
BundleOutline readOutlineJson(const JsonFields& f, const JsonFields::Json& document, const std::string& where);

// A bundle's fingerprint: its size and every field of its outline, hashed. Not its tensors:
// hashing every byte of a 100 GB capture would cost minutes (the reference fingerprints of the
// analysis, util/content_hash.h, cover the bytes it compared).
std::uint64_t outlineFingerprint(const BundleOutline& outline);

}  // namespace kvscope
