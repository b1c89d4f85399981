#include "mpi/mpi_share.h"

#include "analysis/analysis_result.h"
#include "format/bundle_error.h"
#include "kv/capture_loader.h"
#include "results/analysis_record.h"
#include "results/results_file.h"
#include "results/results_writer.h"
#include "util/content_hash.h"

#include <unistd.h>

#include <algorithm>
#include <climits>
#include <filesystem>
#include <fstream>
#include <optional>

namespace kvscope {

namespace {

constexpr int kIndicesTag = 1;
constexpr int kBytesTag = 2;

// A results file in the temporary folder, removed when done with.
class TemporaryResults {
public:
    explicit TemporaryResults(int rank)
        : m_path((std::filesystem::temp_directory_path() /
                  ("kvscope-mpi-" + std::to_string(getpid()) + "-" + std::to_string(rank) + ".kvres"))
                     .string())
    {
    }
    ~TemporaryResults()
    {
        std::error_code ignored;
        std::filesystem::remove(m_path, ignored);
    }
    const std::string& path() const { return m_path; }

private:
    std::string m_path;
};

}  // namespace

MpiShare::MpiShare(MPI_Comm comm)
    : m_comm(comm)
{
    MPI_Comm_rank(comm, &m_rank);
    MPI_Comm_size(comm, &m_size);
}

void MpiShare::shareOut(const std::vector<std::string>& promptIds, const std::vector<std::uint64_t>& promptBytes)
{
    // Every rank must have opened the same prompts (a bundle one rank could read and another
    // not would pair different collectives): compared before anything else is combined, by
    // their count, bytes and names.
    std::uint64_t total = 0;
    for (std::uint64_t b : promptBytes)
        total += b;
    ContentHash names;
    for (const std::string& id : promptIds)
        names.add(id.data(), id.size() + 1);  // (with its end: "ab","c" is not "a","bc")
    const std::uint64_t hash = names.value();
    std::vector<double> seen{double(promptBytes.size()), double(total), double(hash >> 32), double(hash & 0xffffffffu)};
    std::vector<double> low = seen, high = seen;
    allReduce(low.data(), low.size(), MPI_DOUBLE, MPI_MIN);
    allReduce(high.data(), high.size(), MPI_DOUBLE, MPI_MAX);
    if (low != high)
        throw BundleError("kvscope-mpi", {}, "the ranks do not see the same prompts (a bundle readable on some nodes only?)");
    m_owner = balancePrompts(promptBytes, m_size);
    m_ids = promptIds;
    m_traffic = {};
    m_traffic.promptBytes.assign(std::size_t(m_size), 0);
    for (std::size_t i = 0; i < promptBytes.size(); ++i)
        m_traffic.promptBytes[std::size_t(m_owner[i])] += promptBytes[i];
    m_gathered = false;
}

bool MpiShare::analyses(std::size_t prompt) const
{
    return prompt < m_owner.size() && m_owner[prompt] == m_rank;
}

void MpiShare::allReduce(void* values, std::size_t count, MPI_Datatype type, MPI_Op op)
{
    int typeSize = 0;
    MPI_Type_size(type, &typeSize);
    m_traffic.reduced += count * std::uint64_t(typeSize);
    ++m_traffic.reductions;
    char* at = static_cast<char*>(values);
    for (std::size_t done = 0; done < count;) {  // MPI counts are ints
        const int n = int(std::min<std::size_t>(count - done, INT_MAX / 2));
        MPI_Allreduce(MPI_IN_PLACE, at + done * std::size_t(typeSize), n, type, op, m_comm);
        done += std::size_t(n);
    }
}

void MpiShare::minimum(std::vector<double>& values)
{
    allReduce(values.data(), values.size(), MPI_DOUBLE, MPI_MIN);
}

void MpiShare::maximum(std::vector<double>& values)
{
    allReduce(values.data(), values.size(), MPI_DOUBLE, MPI_MAX);
}

void MpiShare::sum(std::vector<std::uint64_t>& values)
{
    allReduce(values.data(), values.size(), MPI_UINT64_T, MPI_SUM);
}

void MpiShare::sum(std::vector<std::uint32_t>& values)
{
    allReduce(values.data(), values.size(), MPI_UINT32_T, MPI_SUM);
}

// A results file crosses in pieces of 16 MB, each written out as it comes: a rank's part of a
// large sweep is never held in memory whole, on either side.
constexpr std::size_t kPieceBytes = std::size_t(16) << 20;

void MpiShare::sendFile(const std::string& path, int to)
{
    std::uint64_t size = path.empty() ? 0 : std::uint64_t(std::filesystem::file_size(path));
    m_traffic.gathered += size;
    MPI_Send(&size, 1, MPI_UINT64_T, to, kBytesTag, m_comm);
    if (size == 0)
        return;
    std::ifstream in(path, std::ios::binary);
    std::vector<char> piece(kPieceBytes);
    for (std::uint64_t done = 0; done < size;) {
        const std::size_t n = std::size_t(std::min<std::uint64_t>(size - done, kPieceBytes));
        if (!in.read(piece.data(), std::streamsize(n)))
            throw BundleError(path, {}, "cannot be read back");
        MPI_Send(piece.data(), int(n), MPI_CHAR, to, kBytesTag, m_comm);
        done += n;
    }
}

std::uint64_t MpiShare::receiveFile(int from, const std::string& path)
{
    std::uint64_t size = 0;
    MPI_Recv(&size, 1, MPI_UINT64_T, from, kBytesTag, m_comm, MPI_STATUS_IGNORE);
    m_traffic.gathered += size;
    if (size == 0)
        return 0;
    std::ofstream out(path, std::ios::binary);
    std::vector<char> piece(kPieceBytes);
    for (std::uint64_t done = 0; done < size;) {
        const std::size_t n = std::size_t(std::min<std::uint64_t>(size - done, kPieceBytes));
        MPI_Recv(piece.data(), int(n), MPI_CHAR, from, kBytesTag, m_comm, MPI_STATUS_IGNORE);
        out.write(piece.data(), std::streamsize(n));  // (a failed write is found below: the rest still has to be received)
        done += n;
    }
    if (!out.flush())
        throw BundleError(path, {}, "cannot be written");
    return size;
}

bool MpiShare::gather(AnalysisResult& result, const CaptureLoader& loader)
{
    if (m_rank != 0) {
        AnalysisResult part;
        part.bundle = result.bundle;
        part.problems = result.problems;
        std::vector<std::int64_t> indices;
        for (std::size_t i = 0; i < result.prompts.size(); ++i)
            if (analyses(i)) {
                indices.push_back(std::int64_t(i));
                part.prompts.push_back(std::move(result.prompts[i]));
            }
        std::optional<TemporaryResults> file;
        if (!part.prompts.empty()) {
            file.emplace(m_rank);
            BundleOutline outline = loader.outline();
            outline.path.clear();  // nothing to find when it is read: the prompts are all it carries
            saveResults(file->path(), outline, part, RecordedOptions{});
        }
        const int count = int(indices.size());
        MPI_Send(&count, 1, MPI_INT, 0, kIndicesTag, m_comm);
        MPI_Send(indices.data(), count, MPI_INT64_T, 0, kIndicesTag, m_comm);
        sendFile(file ? file->path() : std::string(), 0);
        m_gathered = true;
        return false;
    }
    for (int from = 1; from < m_size; ++from) {
        int count = 0;
        MPI_Recv(&count, 1, MPI_INT, from, kIndicesTag, m_comm, MPI_STATUS_IGNORE);
        std::vector<std::int64_t> indices(std::size_t(std::max(0, count)));
        MPI_Recv(indices.data(), count, MPI_INT64_T, from, kIndicesTag, m_comm, MPI_STATUS_IGNORE);
        const TemporaryResults file(from);
        receiveFile(from, file.path());
        if (indices.empty())
            continue;
        ResultsFile part = readResultsFile(file.path());
        if (part.result.prompts.size() != indices.size())
            throw BundleError(file.path(), {}, "rank " + std::to_string(from) + " sent a different number of prompts");
        for (std::size_t k = 0; k < indices.size(); ++k) {
            const std::size_t at = std::size_t(indices[k]);
            if (at >= result.prompts.size() || part.result.prompts[k].id != m_ids[at])
                throw BundleError(file.path(), {}, "rank " + std::to_string(from) + " sent prompt " + part.result.prompts[k].id +
                                                        " for another one's place");
            result.prompts[at] = std::move(part.result.prompts[k]);
        }
        for (const std::string& problem : part.result.problems)  // (those found while pooling, on that rank)
            if (std::find(result.problems.begin(), result.problems.end(), problem) == result.problems.end())
                result.problems.push_back(problem);
    }
    m_gathered = true;
    return true;
}

}  // namespace kvscope
