// The KV cache config JSON (get_kv_cache_config's dict): parsed and checked; whatever is
// accepted must survive a round trip through toJson unchanged.

#include "format/bundle_error.h"
#include "format/kv_cache_config.h"

#include <string>

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size)
{
    using namespace kvscope;
    const std::string text(reinterpret_cast<const char*>(data), size);
    try {
        const KvCacheConfig config = KvCacheConfig::fromJson(text, "fuzz.json", "/kv_cache_config");
        const std::string written = config.toJson();
        const KvCacheConfig again = KvCacheConfig::fromJson(written, "fuzz.json", "/kv_cache_config");
        if (again.toJson() != written || again.layerNames() != config.layerNames())
            __builtin_trap();  // accepted once, then read back differently
    } catch (const BundleError&) {
    }
    return 0;
}
