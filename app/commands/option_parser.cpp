#include "commands/option_parser.h"

#include "commands/commands.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <type_traits>
#include <ostream>
#include <stdexcept>

namespace kvscope::cli {

namespace {

template <typename Number>
Number parseNumber(const std::string& option, const std::string& text, const char* kind)
{
    Number value{};
    const char* end = text.data() + text.size();
    const auto [ptr, ec] = std::from_chars(text.data(), end, value);
    if (ec != std::errc() || ptr != end || text.empty())
        throw std::invalid_argument(option + " takes " + kind + ", not '" + text + "'");
    if constexpr (std::is_floating_point_v<Number>)
        if (!std::isfinite(value))  // a NaN threshold would pass every comparison
            throw std::invalid_argument(option + " takes a finite number, not '" + text + "'");
    return value;
}

}  // namespace

void OptionParser::flag(const std::string& name, bool& set)
{
    flag(name, [&set] { set = true; });
}

void OptionParser::flag(const std::string& name, std::function<void()> onSet)
{
    m_options.push_back({{name}, false, [onSet = std::move(onSet)](const std::string&) { onSet(); }});
}

void OptionParser::text(const std::vector<std::string>& names, std::string& value)
{
    m_options.push_back({names, true, [&value](const std::string& v) { value = v; }});
}

void OptionParser::requiredText(const std::vector<std::string>& names, const std::string& what, std::string& value)
{
    m_options.push_back({names, true, [&value](const std::string& v) { value = v; }, what});
}

void OptionParser::integer(const std::string& name, int& value)
{
    custom(name, [&value, name](const std::string& v) { value = parseNumber<int>(name, v, "a whole number"); });
}

void OptionParser::integer(const std::string& name, std::uint64_t& value)
{
    custom(name, [&value, name](const std::string& v) {
        value = parseNumber<std::uint64_t>(name, v, "a whole number of 0 or more");
    });
}

void OptionParser::real(const std::string& name, double& value)
{
    custom(name, [&value, name](const std::string& v) { value = parseNumber<double>(name, v, "a number"); });
}

void OptionParser::real(const std::string& name, std::optional<double>& value)
{
    custom(name, [&value, name](const std::string& v) { value = parseNumber<double>(name, v, "a number"); });
}

void OptionParser::repeated(const std::string& name, std::vector<std::string>& values)
{
    custom(name, [&values](const std::string& v) { values.push_back(v); });
}

void OptionParser::custom(const std::string& name, std::function<void(const std::string&)> onValue)
{
    m_options.push_back({{name}, true, std::move(onValue)});
}

void OptionParser::operand(const std::string& what, std::string& value, bool required)
{
    m_operands.push_back({what, &value, required});
}

void OptionParser::operands(const std::string& what, std::vector<std::string>& values)
{
    m_operands.push_back({what, nullptr, true, &values});
}

const OptionParser::Option* OptionParser::find(const std::string& name) const
{
    for (const Option& option : m_options)
        for (const std::string& n : option.names)
            if (n == name)
                return &option;
    return nullptr;
}

void OptionParser::parseOrThrow(const Args& args) const
{
    std::vector<const Option*> given;
    std::size_t operands = 0;
    for (std::size_t i = 0; i < args.size(); ++i) {
        const std::string& a = args[i];
        if (a.size() > 1 && a[0] == '-') {
            const Option* option = find(a);
            if (!option)
                throw std::invalid_argument("unknown option " + a);
            given.push_back(option);
            if (!option->takesValue) {
                option->apply({});
                continue;
            }
            if (i + 1 >= args.size() || find(args[i + 1]))  // `--against -o DIR`: -o is not A's path
                throw std::invalid_argument(a + " needs a value");
            option->apply(args[++i]);
            continue;
        }
        if (!m_operands.empty() && m_operands.back().values && operands + 1 >= m_operands.size()) {
            m_operands.back().values->push_back(a);
            operands = m_operands.size();
            continue;
        }
        if (operands >= m_operands.size())
            throw std::invalid_argument("unexpected argument '" + a + "'");
        *m_operands[operands++].value = a;
    }
    for (std::size_t o = operands; o < m_operands.size(); ++o)
        if (m_operands[o].required)
            throw std::invalid_argument("no " + m_operands[o].what + " given");
    for (const Option& option : m_options)
        if (!option.requiredWhat.empty() && std::find(given.begin(), given.end(), &option) == given.end())
            throw std::invalid_argument("no " + option.names.front() + " " + option.requiredWhat + " given");
}

bool OptionParser::parse(const Args& args, std::ostream& err) const
{
    try {
        parseOrThrow(args);
        return true;
    } catch (const std::exception& e) {
        err << "kvscope " << m_command << ": " << e.what() << "\n";
        printUsage(m_command, err);
        return false;
    }
}

}  // namespace kvscope::cli
