#pragma once
// What an unexplained error looks like (Suspect::measured), measured on the onset layer's off
// cells with the vectors the hypotheses already read (hypotheses.h), from principles that hold
// for any fault (docs/suspects.md, "What was measured"):
// - direction against size: each cell's best factor s = <a, r> / <r, r> splits the engine's
//   vector a into s r (its size) and a - s r (its direction). The direction is kept when the
//   error left after each cell's own factor is within the explained bound (an explanation's
//   bound: noise); the size is off when (s - 1) over the cell's floor is beyond it. The factor
//   range is the engine's L2 norm over the reference's, min and max over the cells.
// - the axes it varies along: the cells' error (its signed size error when the direction is
//   kept, so that 0.5x and 1.5x differ) split by the marginal of each axis (token, position in
//   block, head, part): an axis's share is the variation its means explain beyond what noise
//   alone would (the clean level's variance per cell and level), of the variation beyond
//   noise. When the direction is off, the channel axis too: the share of what is left after
//   each cell's factor that one vector per head and part explains (a bias), beyond chance.
// - the parts: K, V or both.

#include "analysis/hypotheses.h"
#include "analysis/suspect.h"

namespace kvscope {

// An axis carries the variation when its share is at least this.
constexpr double kAxisCarries = 1.0 / 3.0;

// `input.explained` is the noise bound, `cleanLevel` the layer's clean level (off_floor.h):
// the noise of one cell, in floors. Cells without the engine's or the reference's vector, or
// with non-finite values, are left out; with fewer than 8 cells no axis is named.
ErrorShape measureErrorShape(const HypothesisInput& input, double cleanLevel);

}  // namespace kvscope
