#pragma once
// An analysis shared by the ranks of an MPI job (kvscope-mpi): the prompts balanced over the
// ranks by the bytes they read, the pooled statistics combined with MPI_Allreduce (exactly:
// analysis/analysis_share.h), and every rank's prompts gathered on rank 0, which writes what
// the command writes. The prompts travel as results files (results/results_file.h): one
// format for an analysis kept on disk and one sent to another rank.

#include "analysis/analysis_share.h"

#include <mpi.h>

#include <vector>

namespace kvscope {

class MpiShare final : public AnalysisShare {
public:
    explicit MpiShare(MPI_Comm comm);

    int rank() const { return m_rank; }
    int size() const { return m_size; }
    // Whether the analysis ended in gather() (this rank's part handed over, or all of them
    // gathered on rank 0): until then, a rank that leaves would leave the others waiting.
    bool gathered() const { return m_gathered; }

    void shareOut(const std::vector<std::string>& promptIds, const std::vector<std::uint64_t>& promptBytes) override;
    bool analyses(std::size_t prompt) const override;
    void minimum(std::vector<double>& values) override;
    void maximum(std::vector<double>& values) override;
    void sum(std::vector<std::uint64_t>& values) override;
    void sum(std::vector<std::uint32_t>& values) override;
    bool gather(AnalysisResult& result, const CaptureLoader& loader) override;

    // What the last analysis moved, for docs/scale-out.md's model (KVSCOPE_MPI_STATS=1).
    struct Traffic {
        std::vector<std::uint64_t> promptBytes;  // per rank: what its prompts read (estimated)
        std::uint64_t reduced = 0;               // bytes each rank put into MPI_Allreduce
        std::uint64_t reductions = 0;            // how many calls
        std::uint64_t gathered = 0;              // bytes sent to rank 0 (this rank's, or all on rank 0)
    };
    const Traffic& traffic() const { return m_traffic; }

private:
    void allReduce(void* values, std::size_t count, MPI_Datatype type, MPI_Op op);
    // A file to rank `to` (none: an empty path), and one from rank `from` into `path`; its size.
    void sendFile(const std::string& path, int to);
    std::uint64_t receiveFile(int from, const std::string& path);

    MPI_Comm m_comm;
    int m_rank = 0;
    int m_size = 1;
    std::vector<int> m_owner;  // per prompt, its rank
    std::vector<std::string> m_ids;  // per prompt
    bool m_gathered = false;
    Traffic m_traffic;
};

}  // namespace kvscope
