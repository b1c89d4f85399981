#pragma once
// One process's share of an analysis that several processes run together (kvscope-mpi): the
// prompts it analyses, and how the pooled statistics of every process's prompts are combined.
// Every prompt is prepared on every process (names, shapes: from the bundles' metadata), but
// only a process's own are read, compared and allocated. The combinations are exact (ranges by
// minimum and maximum, counts by integer sums), so the pooled BCs do not depend on how the
// prompts were shared out. Every process makes them in the same order (each pooled layer's, in
// model order), as collective operations need.

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace kvscope {

struct AnalysisResult;
class CaptureLoader;

// What runAnalysis throws on a process whose prompts were handed over to the one that writes
// the result: that process's work is done. Not a std::exception: no command mistakes it for a
// failure.
struct AnalysisHandedOver {};

class AnalysisShare {
public:
    virtual ~AnalysisShare() = default;
    // Called once, by prepareAnalysis on every process, with the prompts (their names, and what
    // each one's analysis reads, in bytes): the share decides, the same way on every process,
    // which prompts are whose. It throws when the processes do not see the same prompts.
    virtual void shareOut(const std::vector<std::string>& promptIds, const std::vector<std::uint64_t>& promptBytes) = 0;
    // Whether this process analyses prompt `index` of the prepared result.
    virtual bool analyses(std::size_t prompt) const = 0;
    // Element by element over every process, the result on each of them.
    virtual void minimum(std::vector<double>& values) = 0;
    virtual void maximum(std::vector<double>& values) = 0;
    virtual void sum(std::vector<std::uint64_t>& values) = 0;
    // Wraps at 2^32 as one process's LogHistogram counts do.
    virtual void sum(std::vector<std::uint32_t>& values) = 0;
    // At the end of runAnalysis: every process's prompts into `result` on the process that
    // writes it (true there); false on the others, whose prompts have been handed over.
    virtual bool gather(AnalysisResult& result, const CaptureLoader& loader) = 0;
};

// Prompts shared out by size over `processes`: the largest first, each to the process with the
// fewest bytes so far (the lowest-numbered of equals). Per prompt, its process.
std::vector<int> balancePrompts(const std::vector<std::uint64_t>& promptBytes, int processes);

}  // namespace kvscope
