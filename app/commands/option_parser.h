#pragma once
// One command's options and operands, declared, then read from its command line: every
// command reads its arguments the same way, and a wrong one gets the same answer (what is
// wrong, then the command's usage, exit 2).

#include <cstdint>
#include <functional>
#include <iosfwd>
#include <optional>
#include <string>
#include <vector>

namespace kvscope::cli {

using Args = std::vector<std::string>;

class OptionParser {
public:
    explicit OptionParser(std::string command) : m_command(std::move(command)) {}

    // An option without a value ("--strict").
    void flag(const std::string& name, bool& set);
    void flag(const std::string& name, std::function<void()> onSet);
    // An option with a value ("--json OUT", "-o DIR" with names {"-o", "--output"}). A number
    // must be one whole number (not "12x"); a repeated option sets the last value, except
    // `repeated`, which collects every one.
    void text(const std::vector<std::string>& names, std::string& value);
    // The same, but the command line must give it ("-o DIR": what = "DIR").
    void requiredText(const std::vector<std::string>& names, const std::string& what, std::string& value);
    void integer(const std::string& name, int& value);
    void integer(const std::string& name, std::uint64_t& value);
    void real(const std::string& name, double& value);
    void real(const std::string& name, std::optional<double>& value);
    void repeated(const std::string& name, std::vector<std::string>& values);
    // Any other option with a value, parsed by `onValue` (which throws std::invalid_argument
    // with a message on a bad one).
    void custom(const std::string& name, std::function<void(const std::string&)> onValue);
    // Arguments that are not options, in order ("BUNDLE", "DIR"); an optional one may be left out.
    void operand(const std::string& what, std::string& value, bool required = true);
    // The last operand, given one or more times ("BUNDLE..."): every remaining argument.
    void operands(const std::string& what, std::vector<std::string>& values);

    // Reads `args`. On a bad command line writes "kvscope COMMAND: what is wrong" and the
    // usage to `err` and returns false.
    bool parse(const Args& args, std::ostream& err) const;

private:
    struct Option {
        std::vector<std::string> names;
        bool takesValue;
        std::function<void(const std::string&)> apply;
        std::string requiredWhat = {};  // empty: optional
    };
    struct Operand {
        std::string what;
        std::string* value;
        bool required;
        std::vector<std::string>* values = nullptr;  // one or more
    };
    const Option* find(const std::string& name) const;
    void parseOrThrow(const Args& args) const;

    std::string m_command;
    std::vector<Option> m_options;
    std::vector<Operand> m_operands;
};

}  // namespace kvscope::cli
