#include "dumps/pickle_check.h"

#include "format/bundle_error.h"
#include "dumps/zip_check.h"

#include <cstdint>
#include <cstring>
#include <algorithm>
#include <iterator>
#include <vector>

namespace kvscope {

namespace {

// Bytes of argument after the opcode: fixed, a length of `lengthBytes` bytes then that many
// bytes, or text lines. From Python's pickletools, protocols 0-5.
struct Opcode {
    int fixed = 0;
    int lengthBytes = 0;
    int lines = 0;
};

bool describe(unsigned char op, Opcode& out)
{
    static const char* const noArgument = "(.012N)]}aesutldRbo\x81\x85\x86\x87\x88\x89Q\x92\x93\x94\x8f\x90\x91\x97\x98";
    if (op != 0 && std::strchr(noArgument, op))
        return out = {}, true;
    switch (op) {
    case 'K': case 'h': case 'q': case 0x80: case 0x82: out = {1, 0, 0}; return true;
    case 'M': case 0x83: out = {2, 0, 0}; return true;
    case 'J': case 'j': case 'r': case 0x84: out = {4, 0, 0}; return true;
    case 'G': case 0x95: out = {8, 0, 0}; return true;
    case 'U': case 'C': case 0x8c: case 0x8a: out = {0, 1, 0}; return true;
    case 'T': case 'X': case 'B': case 0x8b: out = {0, 4, 0}; return true;
    case 0x8d: case 0x8e: case 0x96: out = {0, 8, 0}; return true;
    case 'I': case 'L': case 'F': case 'S': case 'V': case 'P': case 'g': case 'p': out = {0, 0, 1}; return true;
    case 'c': case 'i': out = {0, 0, 2}; return true;
    default: return false;
    }
}

// The bytes per element of a storage type torch.save names ("FloatStorage"), or 0.
std::uint64_t itemSize(const std::string& type)
{
    static const std::map<std::string, std::uint64_t> sizes = {
        {"DoubleStorage", 8}, {"FloatStorage", 4}, {"HalfStorage", 2}, {"BFloat16Storage", 2}, {"LongStorage", 8},
        {"IntStorage", 4}, {"ShortStorage", 2}, {"CharStorage", 1}, {"ByteStorage", 1}, {"BoolStorage", 1}};
    const auto it = sizes.find(type);
    return it == sizes.end() ? 0 : it->second;
}

std::uint64_t littleEndian(const unsigned char* bytes, std::size_t count)
{
    std::uint64_t value = 0;
    for (std::size_t i = count; i-- > 0;)
        value = value << 8 | bytes[i];
    return value;
}

// What the walk knows of a value on the unpickler's stack: a short string, a global's name, a
// non-negative integer, a tuple of at most five such (a persistent id), or nothing more. Kept
// small on purpose: memo gets and DUP copy values, and hostile pickles repeat them. `depth` is
// how deeply containers nest in it.
struct Value {
    enum class Kind { Unknown, String, Global, Integer, Tuple } kind = Kind::Unknown;
    std::string text = {};
    std::uint64_t integer = 0;
    std::vector<Value> items = {};
    int depth = 0;
    bool scalar() const { return kind == Kind::String || kind == Kind::Global || kind == Kind::Integer; }
};

constexpr std::size_t kLongestKeptString = 256;  // 'storage', types, keys, 'cpu' are short
// libtorch (and kvscope after it) destroys and converts nested values recursively; Python's
// own pickler does not nest deeper than its recursion limit (1000).
constexpr int kDeepest = 1000;

// The globals torch.save writes for what kvscope reads (tensors in dicts, lists and tuples).
// '_codecs encode' (Python bytes) is let through: libtorch refuses it with a known message.
bool allowedGlobal(const std::string& name)
{
    return name == "torch._utils _rebuild_tensor_v2" || name == "collections OrderedDict" ||
           name == "_codecs encode" || (name.starts_with("torch ") && itemSize(name.substr(6)) != 0);
}

// The unpickler's stack and memo, as far as they matter for persistent ids: torch.save writes
// a repeated 'storage', type or location as a memo get. libtorch 1.13 does not check its stack
// (a pop from an empty stack reads before its buffer: fuzzing found it), so that is refused here.
class Machine {
public:
    Machine(const std::string& path, const std::string& entry) : m_path(path), m_entry(entry) {}
    void at(std::size_t byte) { m_at = byte; }
    void push(Value v)
    {
        if (v.depth > kDeepest)
            fail("nests containers more than " + std::to_string(kDeepest) + " deep");
        m_stack.push_back(std::move(v));
    }
    Value pop()
    {
        if (m_stack.size() <= (m_marks.empty() ? 0 : m_marks.back()))
            fail("takes a value from an empty stack");
        Value v = std::move(m_stack.back());
        m_stack.pop_back();
        return v;
    }
    // Items go into the container below them (SETITEM, APPENDS): one must be there, and it
    // nests as deep as what it now holds.
    void addToTarget(const std::vector<Value>& items)
    {
        if (m_stack.size() <= (m_marks.empty() ? 0 : m_marks.back()))
            fail("adds to a container that is not on the stack");
        Value& target = m_stack.back();
        target.kind = Value::Kind::Unknown;
        target.items.clear();
        target.depth = std::max(target.depth, containerDepth(items));
        if (target.depth > kDeepest)
            fail("nests containers more than " + std::to_string(kDeepest) + " deep");
    }
    void mark() { m_marks.push_back(m_stack.size()); }
    std::vector<Value> popToMark()
    {
        if (m_marks.empty())
            fail("closes a mark that was never set");
        const std::size_t mark = m_marks.back();
        m_marks.pop_back();
        std::vector<Value> items(std::make_move_iterator(m_stack.begin() + std::ptrdiff_t(mark)),
                                 std::make_move_iterator(m_stack.end()));
        m_stack.resize(mark);
        return items;
    }
    // Dict items come in key, value pairs (libtorch reads one past its stack on an odd count).
    std::vector<Value> popPairsToMark()
    {
        std::vector<Value> items = popToMark();
        if (items.size() % 2)
            fail("gives a dict an odd number of keys and values");
        return items;
    }
    void pushContainer(const std::vector<Value>& items) { push({Value::Kind::Unknown, {}, 0, {}, containerDepth(items)}); }
    void pushTuple(std::vector<Value> items)
    {
        const int depth = containerDepth(items);
        const bool kept = items.size() <= 5 && std::all_of(items.begin(), items.end(), [](const Value& v) { return v.scalar(); });
        push(kept ? Value{Value::Kind::Tuple, {}, 0, std::move(items), depth} : Value{Value::Kind::Unknown, {}, 0, {}, depth});
    }
    void pushTupleOf(std::size_t count)
    {
        std::vector<Value> items(count);
        for (std::size_t i = count; i-- > 0;)
            items[i] = pop();
        pushTuple(std::move(items));
    }
    void put(std::uint64_t index)
    {
        // libtorch sizes its memo table by the largest index put; torch.save puts 0, 1, 2, ...
        if (index > m_memo.size())
            fail("puts memo entry " + std::to_string(index) + " after only " + std::to_string(m_memo.size()));
        if (m_stack.empty())
            fail("puts an empty stack in the memo");
        if (index == m_memo.size())
            m_memo.push_back(m_stack.back());
        else
            m_memo[index] = m_stack.back();
    }
    void get(std::uint64_t index)
    {
        if (index >= m_memo.size())
            fail("gets memo entry " + std::to_string(index) + ", which was never put");
        push(m_memo[index]);
    }
    void memoize() { put(m_memo.size()); }
    [[noreturn]] void fail(const std::string& what) const { refuse(what + ": the file is damaged"); }
    // What a valid pickle may hold but libtorch or kvscope does not read.
    [[noreturn]] void refuse(const std::string& what) const
    {
        throw BundleError(m_path, m_entry, "the opcode at byte " + std::to_string(m_at) + " " + what);
    }

private:
    static int containerDepth(const std::vector<Value>& items)
    {
        int deepest = 0;
        for (const Value& v : items)
            deepest = std::max(deepest, v.depth);
        return deepest + 1;
    }
    const std::string& m_path;
    const std::string& m_entry;
    std::size_t m_at = 0;
    std::vector<Value> m_stack;
    std::vector<std::size_t> m_marks;  // stack sizes at each open mark
    std::vector<Value> m_memo;
};

// A persistent id: libtorch reads only torch.save's ('storage', type, key, location, numel),
// and gives the storage the size it declares whatever its record holds, so the storage must
// fit in its record, and anything kvscope cannot verify is refused.
void checkStorage(const Value& id, const std::map<std::string, std::uint64_t>& records, const std::string& prefix,
                  const std::string& path, const std::string& entry, std::size_t at)
{
    using Kind = Value::Kind;
    const std::string where = "the storage at byte " + std::to_string(at);
    const bool shaped = id.kind == Kind::Tuple && id.items.size() == 5 && id.items[0].kind == Kind::String &&
                        id.items[0].text == "storage" && id.items[1].kind == Kind::Global &&
                        id.items[1].text.starts_with("torch ") && id.items[2].kind == Kind::String &&
                        id.items[3].kind == Kind::String && id.items[4].kind == Kind::Integer;
    if (!shaped)
        throw BundleError(path, entry, where + " is not torch.save's ('storage', type, key, location, numel): the file is damaged");
    // Elsewhere than "cpu" ("meta" say) libtorch makes a tensor without data.
    if (id.items[3].text != "cpu")
        throw BundleError(path, entry, where + " is on device '" + id.items[3].text + "'; kvscope reads tensors saved from the CPU "
                                                "(torch.save(tensor.cpu()))");
    const std::string type = id.items[1].text.substr(6);
    const std::string& key = id.items[2].text;
    const std::uint64_t item = itemSize(type);
    if (item == 0)
        throw BundleError(path, entry, where + " is of type '" + type + "', which kvscope does not read");
    const auto record = records.find(matchingName(prefix + "data/" + key));
    std::uint64_t needed = 0;
    const bool overflows = __builtin_mul_overflow(id.items[4].integer, item, &needed);
    if (overflows || record == records.end() || record->second < needed)
        throw BundleError(path, entry, "storage '" + key + "' declares " +
                                           (overflows ? "more than 2^64" : std::to_string(needed)) + " bytes but its record " +
                                           (record == records.end() ? std::string("is missing")
                                                                    : "holds " + std::to_string(record->second)) +
                                           ": the file is damaged");
}

Value global(const std::string& name, const Machine& m)
{
    if (!allowedGlobal(name))
        m.refuse("names '" + name + "', which torch.save does not write for tensors, lists, tuples and dicts");
    return {Value::Kind::Global, name};
}

// What an opcode without argument does to the stack.
void apply(unsigned char code, Machine& m)
{
    switch (code) {
    case '(': m.mark(); break;
    case 't': m.pushTuple(m.popToMark()); break;
    case ')': m.pushTuple({}); break;
    case 0x85: case 0x86: case 0x87: m.pushTupleOf(std::size_t(code - 0x84)); break;
    case '0': m.pop(); break;
    case '1': m.popToMark(); break;
    case 'e': case 0x90: m.addToTarget(m.popToMark()); break;
    case 'u': m.addToTarget(m.popPairsToMark()); break;
    case 'l': case 0x91: m.pushContainer(m.popToMark()); break;
    case 'd': m.pushContainer(m.popPairsToMark()); break;
    case 'o': m.popToMark(); m.push({}); break;
    case '2': { Value top = m.pop(); m.push(top); m.push(top); break; }
    case 's': { Value value = m.pop(), key = m.pop(); m.addToTarget({key, value}); break; }
    case 'a': { Value value = m.pop(); m.addToTarget({value}); break; }
    // REDUCE and BUILD (libtorch runs BUILD as it runs REDUCE): a global's result, from the
    // allowed ones a tensor or an empty dict.
    case 'R': case 'b': case 0x81: m.pop(); m.pop(); m.push({Value::Kind::Unknown, {}, 0, {}, 1}); break;
    case 0x93: {  // STACK_GLOBAL: module and name from the stack
        const Value name = m.pop(), module = m.pop();
        if (module.kind != Value::Kind::String || name.kind != Value::Kind::String)
            m.fail("names a global that is not two strings");
        m.push(global(module.text + " " + name.text, m));
        break;
    }
    case 0x92: m.pop(); m.pop(); m.pop(); m.push({}); break;
    case 0x94: m.memoize(); break;
    case 0x98: break;  // READONLY_BUFFER changes nothing here
    case '}': case ']': case 0x8f: m.pushContainer({}); break;
    default: m.push({}); break;  // N, NEWTRUE/FALSE, NEXT_BUFFER
    }
}

}  // namespace

void checkPickle(const char* pickle, std::size_t size, const std::map<std::string, std::uint64_t>& records,
                 const std::string& prefix, const std::string& path, const std::string& entry)
{
    using Kind = Value::Kind;
    const auto* p = reinterpret_cast<const unsigned char*>(pickle);
    Machine machine(path, entry);
    for (std::size_t at = 0; at < size;) {
        Opcode op;
        const unsigned char code = p[at];
        if (!describe(code, op) || code == '.')
            return;  // an opcode no unpickler knows (libtorch refuses it too), or the end of the pickle
        const std::size_t start = at++;
        machine.at(start);
        if (op.lines) {
            // libtorch looks for the newline beyond the pickle's end (in stale buffer bytes):
            // a line that does not end inside the pickle is refused.
            std::vector<std::string> lines;
            for (int line = 0; line < op.lines; ++line) {
                const void* newline = std::memchr(p + at, '\n', size - at);
                if (!newline)
                    machine.fail("has a line without its end");
                const std::size_t end = std::size_t(static_cast<const unsigned char*>(newline) - p);
                lines.emplace_back(pickle + at, std::min(end - at, kLongestKeptString + 1));
                at = end + 1;
            }
            if (code == 'c')
                machine.push(global(lines[0] + " " + lines[1], machine));
            else if (code == 'i')
                machine.popToMark(), machine.push({});
            else if (code != 'p')
                machine.push({});  // protocol 0 values and text memo gets (libtorch reads none of them)
            continue;
        }
        if (op.lengthBytes == 0 && op.fixed == 0) {
            if (code == 'Q') {
                checkStorage(machine.pop(), records, prefix, path, entry, start);
                machine.push({});
            } else {
                apply(code, machine);
            }
            continue;
        }
        const std::size_t fieldBytes = std::size_t(op.fixed + op.lengthBytes);
        if (size - at < fieldBytes)
            throw BundleError(path, entry, "the pickle ends inside an opcode at byte " + std::to_string(start));
        // The argument as an integer: lengths, and fixed fields of up to 4 bytes (BINFLOAT's
        // and FRAME's 8 bytes are not needed).
        std::uint64_t value = 0;
        for (int i = (op.lengthBytes ? op.lengthBytes : op.fixed) - 1; i >= 0 && (op.lengthBytes || op.fixed <= 4); --i)
            value = value << 8 | p[at + std::size_t(i)];
        at += fieldBytes;
        if (code == 0x80 && value != 2)
            machine.refuse(std::string(value > 2 ? "uses a pickle protocol above 2" : "uses an older pickle protocol") +
                           " (" + std::to_string(value) + "), which libtorch does not read: save with pickle_protocol=2 "
                           "(torch.save's default)");
        if (code == 'q' || code == 'r')
            machine.put(value);
        else if (code == 'h' || code == 'j')
            machine.get(value);
        else if (code == 'K' || code == 'M' || (code == 'J' && !(value & 0x80000000u)))
            machine.push({Kind::Integer, {}, value});
        else if (code != 0x80 && code != 0x95 && !op.lengthBytes)
            machine.push({});  // BININT < 0, BINFLOAT, EXT1/2/4 (PROTO and FRAME push nothing)
        if (op.lengthBytes) {
            if (op.lengthBytes == 4 && (code == 'T' || code == 0x8b) && (value & 0x80000000u))
                throw BundleError(path, entry, "a negative length at byte " + std::to_string(start));
            if (value > size - at)
                throw BundleError(path, entry, "a value at byte " + std::to_string(start) + " claims " +
                                                   std::to_string(value) + " bytes, more than the pickle holds: the file is damaged");
            const bool text = code == 'X' || code == 'U' || code == 'T' || code == 0x8c || code == 0x8d;
            if (text && value <= kLongestKeptString)
                machine.push({Kind::String, std::string(pickle + at, std::size_t(value))});
            else if (code == 0x8a && value <= 8 && (value == 0 || !(p[at + value - 1] & 0x80)))
                machine.push({Kind::Integer, {}, littleEndian(p + at, std::size_t(value))});  // LONG1, non-negative
            else
                machine.push({});
            at += std::size_t(value);
        }
    }
}

}  // namespace kvscope
