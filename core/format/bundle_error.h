#pragma once
// The one error type for bad input: it always says which file, which object in it, and
// what is wrong, so that a user can find and fix the problem.

#include <stdexcept>
#include <string>

namespace kvscope {

class BundleError : public std::runtime_error {
public:
    BundleError(std::string file, std::string object, std::string problem)
        : std::runtime_error(format(file, object, problem))
        , m_file(std::move(file))
        , m_object(std::move(object))
        , m_problem(std::move(problem))
    {
    }

    const std::string& file() const { return m_file; }
    const std::string& object() const { return m_object; }
    const std::string& problem() const { return m_problem; }

private:
    static std::string format(const std::string& file, const std::string& object,
                              const std::string& problem)
    {
        std::string text = file.empty() ? std::string("<memory>") : file;
        if (!object.empty())
            text += ": " + object;
        return text + ": " + problem;
    }

    std::string m_file;
    std::string m_object;
    std::string m_problem;
};

}  // namespace kvscope
