#include "analysis/error_shape.h"

#include "util/median.h"
#include "util/short_number.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <set>
#include <sstream>

namespace kvscope {

namespace {

constexpr std::size_t kMinCells = 8;
// Position in block is named instead of token when it explains this much of what token does
// (it is a coarsening of token: it can only explain less).
constexpr double kCoarser = 0.8;

struct Measured {
    const OffCell* cell;
    double factor;       // best factor <a, r> / <r, r>
    double norms;        // |a| / |r|
    double sizeFloors;   // (factor - 1) over the cell's floor, signed
    double direction;    // error left after the cell's own factor, in floors
    double oneMinusCos;
};

std::string number(double x, int digits = 2)  // (two digits in the measured sentences)
{
    return shortNumber(x, digits);
}

// The share of the variation of `x` beyond noise (variance `noise` a cell) that the means of
// `level` explain, beyond what noise alone gives k levels' means: (SS - (k - 1) noise) / beyond.
double axisShare(const std::vector<double>& x, const std::vector<std::int64_t>& level, double noise, double beyond)
{
    double mean = 0;
    for (double v : x)
        mean += v;
    mean /= double(x.size());
    std::map<std::int64_t, std::pair<double, int>> sums;
    for (std::size_t i = 0; i < x.size(); ++i) {
        auto& [sum, n] = sums[level[i]];
        sum += x[i];
        ++n;
    }
    double between = 0;
    for (const auto& [l, s] : sums)
        between += s.second * std::pow(s.first / s.second - mean, 2);
    return std::clamp((between - double(sums.size() - 1) * noise) / beyond, 0.0, 1.0);
}

// The share of the rest after each cell's own factor (a - s r, summed squares about zero) that
// one vector per head and part explains (the same offset per channel at every token), beyond
// what the means of as many groups of noise would: chance = channels / values. NaN with fewer
// than two cells a group.
double channelShare(const std::vector<Measured>& cells, const HypothesisInput& in, const HeadDims& dims)
{
    std::map<std::pair<int, int>, std::pair<std::vector<double>, int>> groups;  // (head, part) -> sums, cells
    double total = 0;
    std::size_t values = 0;
    for (const Measured& m : cells) {
        const OffCell& c = *m.cell;
        const int dim = dims.of(c.part);
        const float* a = in.engine.at(c.part, c.token, c.head);
        const float* r = in.reference.at(c.part, c.token, c.head);
        auto& [sums, n] = groups[{c.head, int(c.part)}];
        sums.resize(std::size_t(dim), 0.0);
        for (int i = 0; i < dim; ++i) {
            const double u = double(a[i]) - m.factor * double(r[i]);
            sums[std::size_t(i)] += u;
            total += u * u;
        }
        ++n;
        values += std::size_t(dim);
    }
    double explained = 0;
    std::size_t channels = 0;
    for (const auto& [key, g] : groups) {
        for (double s : g.first)
            explained += s * s / g.second;
        channels += g.first.size();
    }
    if (total <= 0 || 2 * channels > values)
        return std::nan("");
    const double chance = double(channels) / double(values);
    return std::clamp((explained / total - chance) / (1 - chance), 0.0, 1.0);
}

// Each cell's factor, size and direction (cells without data left out).
std::vector<Measured> measureCells(const HypothesisInput& in, const HeadDims& dims)
{
    std::vector<Measured> out;
    for (const OffCell& c : in.cells) {
        const float* a = in.engine.at(c.part, c.token, c.head);
        const float* r = in.reference.at(c.part, c.token, c.head);
        if (!a || !r)
            continue;
        const int dim = dims.of(c.part);
        double aa = 0, rr = 0, ar = 0;
        for (int i = 0; i < dim; ++i)
            aa += double(a[i]) * a[i], rr += double(r[i]) * r[i], ar += double(a[i]) * r[i];
        if (!(rr > 0) || !std::isfinite(aa) || !std::isfinite(rr))
            continue;
        const double s = ar / rr;
        std::vector<float> scaled(static_cast<std::size_t>(dim));
        for (int i = 0; i < dim; ++i)
            scaled[std::size_t(i)] = float(s * r[i]);
        // (s - 1) relative to the reference, in floors: between() of r and s r.
        const double unitSize = in.ratios.between(in.layer, c.token, c.part, r, r, scaled.data(), dim);
        const double direction = in.ratios.between(in.layer, c.token, c.part, r, scaled.data(), a, dim);
        const double cosine = aa > 0 ? ar / std::sqrt(aa * rr) : 0.0;
        out.push_back({&c, s, std::sqrt(aa / rr), s >= 1 ? unitSize : -unitSize, direction, 1 - cosine});
    }
    return out;
}

const char* axisWords(const std::string& axis)
{
    return axis == "block_position" ? "position in block" : axis == "part" ? "part (K against V)" : axis.c_str();
}

// The axes that carry the variation (shape.shares filled), from the cells' error: its signed
// size error when the direction is kept, else its error in floors.
void findAxes(const std::vector<Measured>& cells, const HypothesisInput& in, const HeadDims& dims, double clean,
              ErrorShape& shape)
{
    const std::int64_t block = std::max<std::int64_t>(
        1, in.config.positionsPerEntry(in.config.groups[std::size_t(in.prompt.layerGroups[std::size_t(in.layer)])]));
    std::vector<double> x;
    std::vector<std::int64_t> token, position, head, part;
    std::set<std::int64_t> tokens, positions;
    for (const Measured& m : cells) {
        x.push_back(shape.directionKept ? m.sizeFloors : double(m.cell->ratio));
        token.push_back(m.cell->token);
        position.push_back(m.cell->token % block);
        head.push_back(m.cell->head);
        part.push_back(int(m.cell->part));
        tokens.insert(m.cell->token);
        positions.insert(m.cell->token % block);
    }
    double mean = 0, ss = 0;
    for (double v : x)
        mean += v / double(x.size());
    for (double v : x)
        ss += (v - mean) * (v - mean);
    const double noise = clean * clean;
    const double beyond = ss - double(x.size() - 1) * noise;
    const double channel = shape.directionKept ? std::nan("") : channelShare(cells, in, dims);
    const bool varies = beyond > 0;
    const auto share = [&](const std::vector<std::int64_t>& level) { return varies ? axisShare(x, level, noise, beyond) : 0.0; };
    // Position in block only where it is coarser than the token: each position seen at two tokens
    // or more on average (else it is the token again, and NaN: not measured).
    const double byToken = share(token);
    const double byPosition = tokens.size() >= 2 * positions.size() ? share(position) : std::nan("");
    const double byHead = share(head), byPart = share(part);
    shape.shares = {{"token", byToken}, {"block_position", byPosition}, {"head", byHead}, {"part", byPart},
                    {"channel", channel}};
    if (varies) {
        // Token or position in block, whichever is the coarser axis that carries it.
        if (byPosition >= kAxisCarries && byPosition >= kCoarser * byToken)  // false for NaN
            shape.variesAlong.push_back("block_position");
        else if (byToken >= kAxisCarries)
            shape.variesAlong.push_back("token");
        if (byHead >= kAxisCarries)
            shape.variesAlong.push_back("head");
        if (byPart >= kAxisCarries)
            shape.variesAlong.push_back("part");
    }
    if (channel >= kAxisCarries)  // NaN: not measured
        shape.variesAlong.push_back("channel");
    if (shape.variesAlong.empty() && varies)
        shape.variesAlong = {"cell"};
}

// Floors as the evidence gives them: two digits under 10, whole numbers above.
std::string floorsText(double x)
{
    return x < 10 ? number(x) : std::to_string(std::lround(x));
}

std::string shapeText(const ErrorShape& s, const PromptAnalysis& p)
{
    std::ostringstream out;
    out << "direction " << (s.directionKept ? "kept" : "off") << " (1 - cos " << number(s.oneMinusCos) << ", "
        << floorsText(s.directionFloors) << " floors left after each cell's own factor"
        << (s.directionKept ? ": noise); " : "); ");
    const std::string range =
        number(s.sizeMin) == number(s.sizeMax) ? number(s.sizeMin) + "x" : number(s.sizeMin) + "-" + number(s.sizeMax) + "x";
    out << (s.sizeOff ? "size off by a factor of " + range : "size kept (" + range + ")");
    std::string along;
    for (const std::string& axis : s.variesAlong)
        along += (along.empty() ? "" : " and ") + std::string(axisWords(axis));
    // With the direction kept the size is what varies; else the error as a whole.
    const bool size = s.directionKept;
    if (s.variesAlong.empty())
        out << (size ? (s.sizeOff ? ", the same everywhere (within noise)" : "")
                     : "; the error is the same everywhere (within noise)");
    else if (s.variesAlong == std::vector<std::string>{"cell"})
        out << (size ? ", varying" : "; the error varies") << " from cell to cell, along no one axis";
    else
        out << (size ? ", varying by " : "; the error varies along ") << along;
    if (std::find(s.variesAlong.begin(), s.variesAlong.end(), "channel") != s.variesAlong.end())
        out << " (one offset per channel at every token, as an added bias)";
    const bool k = std::find(s.parts.begin(), s.parts.end(), "k") != s.parts.end();
    const bool v = std::find(s.parts.begin(), s.parts.end(), "v") != s.parts.end();
    out << "; " << (k && v ? partTitle(p, KvPart::K) + " and " + partTitle(p, KvPart::V)
                           : partTitle(p, k ? KvPart::K : KvPart::V) + " only");
    return out.str();
}

}  // namespace

ErrorShape measureErrorShape(const HypothesisInput& in, double cleanLevel)
{
    ErrorShape shape;
    const HeadDims dims = std::size_t(in.layer) < in.prompt.layerDims.size() ? in.prompt.layerDims[std::size_t(in.layer)]
                                                                             : in.prompt.dims;
    const std::vector<Measured> cells = measureCells(in, dims);
    int k = 0, v = 0;
    for (const OffCell& c : in.cells)
        (c.part == KvPart::K ? k : v)++;
    // A part with under a tenth of the off cells is left out, as the suspect's kv does.
    if (10 * k >= k + v)
        shape.parts.push_back("k");
    if (10 * v >= k + v)
        shape.parts.push_back("v");
    shape.cells = int(cells.size());
    if (cells.empty())
        return shape;
    std::vector<double> direction, size, cosines, norms;
    for (const Measured& m : cells) {
        direction.push_back(m.direction);
        size.push_back(std::fabs(m.sizeFloors));
        cosines.push_back(m.oneMinusCos);
        norms.push_back(m.norms);
    }
    shape.directionFloors = median(direction);
    shape.sizeFloors = median(size);
    shape.oneMinusCos = median(cosines);
    shape.directionKept = shape.directionFloors <= in.explained;
    shape.sizeOff = shape.sizeFloors > in.explained;
    shape.sizeMin = *std::min_element(norms.begin(), norms.end());
    shape.sizeMax = *std::max_element(norms.begin(), norms.end());
    if (cells.size() >= kMinCells)
        findAxes(cells, in, dims, cleanLevel, shape);
    shape.text = shapeText(shape, in.prompt);
    return shape;
}

}  // namespace kvscope
