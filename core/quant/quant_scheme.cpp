#include "quant/quant_scheme.h"

namespace kvscope {

std::string QuantScheme::name() const
{
    switch (format) {
    case Format::Nvfp4:
        return "nvfp4";
    case Format::Int4:
        return scaling == Scaling::Kivi           ? "int4/kivi"
               : scaling == Scaling::TokenHeadRht ? "int4/token_head_rht"
                                                  : "int4/g" + std::to_string(group);
    default:
        break;
    }
    const std::string f = format == Format::Fp8E4M3 ? "fp8_e4m3" : format == Format::Fp8E5M2 ? "fp8_e5m2" : "int8";
    switch (scaling) {
    case Scaling::Tensor: return f + "/tensor";
    case Scaling::VllmStatic: return f + "/vllm";
    case Scaling::Head: return f + "/head";
    case Scaling::TokenHead: return f + "/token_head";
    default: return f;
    }
}

std::string QuantScheme::description() const
{
    const std::string f = format == Format::Fp8E4M3 ? "fp8 e4m3" : format == Format::Fp8E5M2 ? "fp8 e5m2"
                          : format == Format::Int8  ? "int8" : format == Format::Int4 ? "int4" : "NVFP4";
    switch (scaling) {
    case Scaling::Tensor: return f + " per tensor";
    case Scaling::VllmStatic: return f + " per tensor, vLLM's warm-up scales (amax/200 K, amax/100 V)";
    case Scaling::Head: return f + " per head";
    case Scaling::TokenHead: return f + " per token and head";
    case Scaling::Group: return f + " asymmetric, groups of " + std::to_string(group);
    case Scaling::Kivi: return f + " KIVI (K per channel, V per token, last " + std::to_string(residual) + " tokens kept)";
    case Scaling::Block16: return "NVFP4 (e2m1, an e4m3 scale per 16)";
    case Scaling::TokenHeadRht: return "int4 per token and head after a signed Hadamard rotation (vLLM's int4_per_token_head)";
    }
    return f;
}

int QuantScheme::bits() const
{
    switch (format) {
    case Format::Fp8E4M3:
    case Format::Fp8E5M2:
    case Format::Int8: return 8;
    case Format::Int4:
    case Format::Nvfp4: return 4;
    }
    return 0;
}

std::vector<QuantScheme> allSchemes()
{
    using F = QuantScheme::Format;
    using S = QuantScheme::Scaling;
    return {{F::Fp8E4M3, S::Tensor},    {F::Fp8E4M3, S::VllmStatic}, {F::Fp8E4M3, S::Head},
            {F::Fp8E4M3, S::TokenHead}, {F::Fp8E5M2, S::Tensor},     {F::Fp8E5M2, S::Head},
            {F::Fp8E5M2, S::TokenHead}, {F::Int8, S::TokenHead},     {F::Int4, S::Group, 32},
            {F::Int4, S::Group, 64},    {F::Int4, S::Group, 128},    {F::Int4, S::Kivi, 32, 32},
            {F::Int4, S::TokenHeadRht}, {F::Nvfp4, S::Block16, 16}};
}

std::vector<QuantScheme> defaultSchemes()
{
    using F = QuantScheme::Format;
    using S = QuantScheme::Scaling;
    return {{F::Fp8E4M3, S::Tensor}, {F::Fp8E4M3, S::Head}, {F::Int8, S::TokenHead}, {F::Int4, S::Group, 32}};
}

std::optional<QuantScheme> parseScheme(const std::string& name, std::string& error)
{
    for (const QuantScheme& s : allSchemes())
        if (s.name() == name)
            return s;
    // Other int4 group sizes.
    if (name.rfind("int4/g", 0) == 0) {
        try {
            std::size_t used = 0;
            const int group = std::stoi(name.substr(6), &used);
            if (used == name.size() - 6 && group >= 2 && group <= 4096)
                return QuantScheme{QuantScheme::Format::Int4, QuantScheme::Scaling::Group, group, 0};
        } catch (const std::exception&) {
        }
    }
    std::string known;
    for (const QuantScheme& s : allSchemes())
        known += (known.empty() ? "" : ", ") + s.name();
    error = "unknown scheme '" + name + "' (known: " + known + ", or int4/gN)";
    return std::nullopt;
}

}  // namespace kvscope
