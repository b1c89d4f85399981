#include "dumps/pt_value.h"

#include "format/bundle_error.h"
#include "dumps/pickle_check.h"
#include "dumps/zip_check.h"

#include <torch/csrc/jit/serialization/pickle.h>
#include <torch/torch.h>

#include <fstream>
#include <map>
#include <iterator>

namespace kvscope {

namespace {

// libtorch 1.13's pickle_load fails on some things Python writes; say what and what to do.
std::string explain(const std::string& message)
{
    const std::pair<const char*, const char*> known[] = {
        {"Unknown opcode", "a dict or list with exactly one entry cannot be read by libtorch 1.13: save two or more "
                           "entries, a bare tensor, or write the bundle with kvscope_capture in Python"},
        {"_codecs.encode", "holds Python bytes objects (e.g. raw RPC results); decode them with torch.load and save "
                           "the tensors, or write the bundle with kvscope_capture"},
        {"Expected length to be 8", "holds an integer of magnitude 2^31 or more, which libtorch 1.13 misreads: "
                                    "store it in a tensor"},
        {"central directory", "is in the legacy torch.save format: save with the default zip format "
                              "(no _use_new_zipfile_serialization=False)"},
        {"Only Pickle protocol 2", "uses a pickle protocol above 2: save with pickle_protocol=2 (torch.save's default)"},
    };
    for (const auto& [needle, advice] : known)
        if (message.find(needle) != std::string::npos)
            return advice;
    const std::string firstLine = message.substr(0, message.find('\n'));
    return "libtorch cannot read it (" + firstLine + ")";
}

// libtorch 1.13 does not check a tensor's sizes, strides and offset against its storage: a
// damaged file can declare more elements than its storage holds (fuzzing found it), and any
// read of the tensor would run past the buffer.
void requireWithinStorage(const at::Tensor& t, const std::string& path, const std::string& where)
{
    for (std::int64_t d = 0; d < t.dim(); ++d)
        if (t.size(d) < 0)
            throw BundleError(path, where, "a tensor of shape " + shapeToString(t.sizes().vec()) + ": the file is damaged");
    if (!t.is_cpu())
        throw BundleError(path, where, "a tensor on device " + t.device().str() + " holds no data here");
    if (t.numel() == 0)
        return;
    std::int64_t last = t.storage_offset();  // the furthest element, in elements
    bool ok = last >= 0;
    for (std::int64_t d = 0; ok && d < t.dim(); ++d) {
        std::int64_t reach = 0;
        ok = t.stride(d) >= 0 && !__builtin_mul_overflow(t.size(d) - 1, t.stride(d), &reach) &&
             !__builtin_add_overflow(last, reach, &last);
    }
    std::int64_t bytes = 0;
    ok = ok && !__builtin_mul_overflow(last + 1, std::int64_t(t.element_size()), &bytes) &&
         bytes <= std::int64_t(t.storage().nbytes());
    if (!ok)
        throw BundleError(path, where, "a tensor of shape " + shapeToString(t.sizes().vec()) +
                                           " reaches past its storage (" + std::to_string(t.storage().nbytes()) +
                                           " bytes): the file is damaged");
}

// libtorch's lists and dicts are shared: memo gets can make one hold itself, or a few values
// stand for exponentially many. The conversion stops at limits no dump reaches.
struct ConvertBudget {
    int depth = 0;
    std::int64_t nodes = 0;
};
constexpr int kDeepestValue = 64;
constexpr std::int64_t kMostValues = 10'000'000;

PtValue convert(const c10::IValue& v, const std::string& path, const std::string& where, ConvertBudget& budget)
{
    if (budget.depth > kDeepestValue || ++budget.nodes > kMostValues)
        throw BundleError(path, where, "nests more than " + std::to_string(kDeepestValue) + " deep or holds more than " +
                                           std::to_string(kMostValues) + " values (a value that holds itself?)");
    PtValue out;
    if (v.isNone())
        return out;
    if (v.isBool()) {
        out.kind = PtValue::Kind::Bool;
        out.boolean = v.toBool();
    } else if (v.isInt()) {
        out.kind = PtValue::Kind::Int;
        out.integer = v.toInt();
    } else if (v.isDouble()) {
        out.kind = PtValue::Kind::Double;
        out.number = v.toDouble();
    } else if (v.isString()) {
        out.kind = PtValue::Kind::String;
        out.text = v.toStringRef();
    } else if (v.isTensor()) {
        requireWithinStorage(v.toTensor(), path, where);
        const at::Tensor t = v.toTensor().contiguous();
        for (std::int64_t d : t.sizes())
            out.shape.push_back(d);
        const c10::ScalarType type = t.scalar_type();
        if (type == at::kBFloat16 || type == at::kHalf || type == at::kFloat) {
            out.kind = PtValue::Kind::FloatTensor;
            out.tensor.dtype = type == at::kBFloat16 ? DType::BFloat16 : type == at::kHalf ? DType::Float16 : DType::Float32;
            out.tensor.shape = out.shape;
            out.tensor.bytes.resize(std::size_t(t.numel()) * t.element_size());
            if (!out.tensor.bytes.empty())  // an empty tensor has no data pointer
                std::memcpy(out.tensor.bytes.data(), t.data_ptr(), out.tensor.bytes.size());
        } else if (type == at::kLong || type == at::kInt || type == at::kShort || type == at::kByte ||
                   type == at::kChar || type == at::kBool) {
            out.kind = PtValue::Kind::IntTensor;
            if (t.numel() > 0) {
                const at::Tensor l = t.to(at::kLong);
                out.intValues.assign(l.data_ptr<std::int64_t>(), l.data_ptr<std::int64_t>() + l.numel());
            }
        } else {
            throw BundleError(path, where, std::string("tensor of dtype ") + c10::toString(type) +
                                               " is not supported (bfloat16, float16, float32, integers)");
        }
    } else if (v.isList() || v.isTuple()) {
        out.kind = PtValue::Kind::List;
        const auto elements = v.isList() ? v.toListRef().vec() : v.toTupleRef().elements().vec();
        ++budget.depth;
        for (std::size_t i = 0; i < elements.size(); ++i)
            out.items.push_back(convert(elements[i], path, where + "[" + std::to_string(i) + "]", budget));
        --budget.depth;
    } else if (v.isGenericDict()) {
        out.kind = PtValue::Kind::Dict;
        ++budget.depth;
        for (const auto& entry : v.toGenericDict()) {
            const c10::IValue& key = entry.key();
            const std::string name = key.isString() ? key.toStringRef() : key.isInt() ? std::to_string(key.toInt()) : "?";
            out.entries.push_back({name, convert(entry.value(), path, where + "['" + name + "']", budget)});
        }
        --budget.depth;
    } else {
        throw BundleError(path, where, "holds a " + v.tagKind() + ", which kvscope does not read");
    }
    return out;
}

}  // namespace

std::string PtValue::kindName() const
{
    static const char* const names[] = {"None", "bool", "int", "float", "str", "float tensor", "integer tensor",
                                        "list", "dict"};
    return names[int(kind)];
}

PtValue loadPtFile(const std::string& path)
{
    std::ifstream in(path, std::ios::binary);
    if (!in)
        throw BundleError(path, {}, std::string("cannot open: ") + std::strerror(errno));
    const std::vector<char> data((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    // Before libtorch, which trusts the archive's offsets and the pickle's lengths. Its zip
    // reader (miniz) finds entries by name ignoring case: so are they matched here.
    const std::vector<ZipEntry> entries = checkZipStructure(data, path);
    std::map<std::string, std::uint64_t> records;
    for (const ZipEntry& entry : entries)
        if (!records.emplace(matchingName(entry.name), entry.size).second)
            throw BundleError(path, entry.name, "two entries of the archive have this name (ignoring case): the file is damaged");
    for (const ZipEntry& entry : entries)
        if (const std::string name = matchingName(entry.name); name.ends_with("data.pkl"))
            checkPickle(data.data() + entry.data, std::size_t(entry.size), records, name.substr(0, name.size() - 8),
                        path, entry.name);
    c10::IValue value;
    try {
        value = torch::jit::pickle_load(data);
    } catch (const std::exception& e) {
        throw BundleError(path, {}, explain(e.what()));
    }
    ConvertBudget budget;
    return convert(value, path, "root", budget);
}

}  // namespace kvscope
