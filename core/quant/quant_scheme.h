#pragma once
// How a KV cache could be quantised: a number format and what its scales cover. The what-if
// (whatif.h) quantises the reference KV with each scheme to see what it would cost.

#include <optional>
#include <string>
#include <vector>

namespace kvscope {

struct QuantScheme {
    enum class Format { Fp8E4M3, Fp8E5M2, Int8, Int4, Nvfp4 };
    enum class Scaling {
        Tensor,      // one scale per layer and part: amax / the format's largest value
        VllmStatic,  // vLLM's calculate_kv_scales: amax of a warm-up batch / 200 (K), / 100 (V)
        Head,        // one per head
        TokenHead,   // one per token and head
        Group,       // int4: asymmetric (scale and zero point) per token and head, per `group` values of head_dim
        Kivi,        // int4, KIVI's axes: K per channel over `group` tokens, V per token in groups of
                     // `group` values; the last `residual` tokens kept in full precision
        Block16,     // NVFP4: e2m1 values, one e4m3 scale per 16 values, one fp32 scale per tensor
        TokenHeadRht,  // int4: vLLM's int4_per_token_head, each token and head rotated by a signed
                       // Walsh-Hadamard transform, then asymmetric over the head (format/int4_rht.h)
    };
    Format format = Format::Fp8E4M3;
    Scaling scaling = Scaling::Tensor;
    int group = 0;
    int residual = 0;

    std::string name() const;         // "fp8_e4m3/tensor", "int4/g32", "int4/kivi", "int4/token_head_rht", "nvfp4"
    std::string description() const;  // "fp8 e4m3, one scale per tensor"
    int bits() const;                 // bits per value, scales left out
};

// Parses one name (as name() writes it); nullopt with `error` set otherwise.
std::optional<QuantScheme> parseScheme(const std::string& name, std::string& error);
// Every scheme kvscope knows, in a sensible order.
std::vector<QuantScheme> allSchemes();
// Four for a quick look (the bench's): fp8 e4m3 per tensor and per head, int8 per token and
// head, int4 in groups of 32.
std::vector<QuantScheme> defaultSchemes();

}  // namespace kvscope
