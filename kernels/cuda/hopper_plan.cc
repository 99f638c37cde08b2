#include "kernels/cuda/hopper_plan.h"

#include <algorithm>
#include <functional>
#include <optional>
#include <vector>

namespace matmul::cuda {

std::pair<double, SplitPlan> PlanSingle(const DeviceGemmProblem& p, DType input, int tile_n,
                                        int num_sms, int splits) {
  const double per_kblock = KBlockCost(tile_n);
  const int64_t tiles = HopperTiles(p, tile_n);
  const int64_t kblocks = KBlocks(p, input);
  const double tile_cost = static_cast<double>(kblocks) * per_kblock + kPerTile;
  const int64_t waves = tiles / num_sms, tail = tiles % num_sms;
  // A unit of a tile split `s` ways.
  auto unit_cost = [&](int64_t s) {
    return static_cast<double>(CeilDiv(kblocks, s)) * per_kblock + kPerTile +
           kPerPartial * static_cast<double>(1 + s) * tile_n / 256.0;
  };
  SplitPlan plan;
  double best = static_cast<double>(waves + (tail > 0 ? 1 : 0)) * tile_cost;
  if (splits >= 2) {
    plan.splits = static_cast<int>(std::min<int64_t>({splits, kblocks, kHopperMaxSplits}));
    plan.tiles = std::min<int64_t>(tail > 0 ? tail : std::min<int64_t>(tiles, num_sms),
                                   kHopperMaxSplitTiles);
    if (plan.splits < 2 || plan.tiles == 0) return {best, SplitPlan()};
    plan.first_tile = tiles - plan.tiles;
    const double rest = static_cast<double>(CeilDiv(plan.first_tile, num_sms)) * tile_cost;
    return {rest + static_cast<double>(CeilDiv(plan.tiles * plan.splits, num_sms)) *
                       unit_cost(plan.splits),
            plan};
  }
  if (splits == 1 || tail == 0) return {best, plan};
  // The tail's units fit one wave: `s` up to num_sms / tail.
  const int64_t most = std::min<int64_t>({num_sms / tail, kblocks, kHopperMaxSplits});
  for (int64_t s = 2; s <= most; ++s) {
    const double t = static_cast<double>(waves) * tile_cost + unit_cost(s);
    if (t < best) {
      best = t;
      plan.splits = static_cast<int>(s);
      plan.tiles = tail;
      plan.first_tile = tiles - tail;
    }
  }
  return {best, plan};
}

double EstimateHopperTime(absl::Span<const DeviceGemmProblem> problems, DType input, int tile_n,
                          int num_sms, bool split_tail, const BatchTally& tally) {
  if (problems.size() == 1) {
    return PlanSingle(problems[0], input, tile_n, num_sms, split_tail ? 0 : 1).first;
  }
  if (tally.tiles > 4 * static_cast<int64_t>(num_sms)) {
    return tally.work / num_sms + tally.longest;
  }
  const double per_kblock = KBlockCost(tile_n);
  std::vector<double> free_at(num_sms, 0.0);  // A min-heap of SM finish times.
  for (const DeviceGemmProblem& p : problems) {
    const int64_t n = HopperTiles(p, tile_n);
    const double cost = static_cast<double>(KBlocks(p, input)) * per_kblock + kPerTile;
    for (int64_t i = 0; i < n; ++i) {
      std::pop_heap(free_at.begin(), free_at.end(), std::greater<>());
      free_at.back() += cost;
      std::push_heap(free_at.begin(), free_at.end(), std::greater<>());
    }
  }
  return *std::max_element(free_at.begin(), free_at.end());
}

bool PairsPay(absl::Span<const DeviceGemmProblem> hopper, const GroupedGemmOptions& o,
              const BatchTally& wide, int num_sms) {
  if (hopper.empty() || o.family != KernelFamily::kPersistent ||
      (o.input != DType::kBFloat16 && o.input != DType::kFloat16)) {
    return false;
  }
  if (hopper.size() == 1 && (o.hopper_split_k >= 2 || wide.tiles < 2 * int64_t{num_sms} ||
                             // Rows on 32-byte sectors (each 128-byte row of a TMA
                             // box spans four sectors, not five).
                             RowsAlignedTo(hopper[0], o.input, 32))) {
    return false;
  }
  return wide.work >= kPairsMinShare * wide.pair_work;
}

HopperShape ChooseHopperShape(absl::Span<const DeviceGemmProblem> hopper,
                              const GroupedGemmOptions& o, int num_sms, int max_clusters) {
  HopperShape shape;
  if (o.hopper_pingpong) {  // 128-wide tiles, single CTAs, no split (ValidHopperOptions).
    shape.tile_n = kHopperNarrowN;
    return shape;
  }
  const bool may_split = hopper.size() == 1 && o.family == KernelFamily::kPersistent &&
                         o.hopper_split_k != 1 && o.hopper_inline_problems != 0 &&
                         o.hopper_cluster != 2;
  shape.tile_n = o.hopper_tile_n;
  std::optional<BatchTally> wide;  // TallyBatch for wide tiles, once needed.
  if (shape.tile_n == 0) {
    constexpr std::array<int, 3> kWidths = {kHopperWideN, kHopperNarrowN, kHopperSmallN};
    const std::array<BatchTally, 3> tally =
        hopper.size() > 1 ? TallyBatch(hopper, o.input, kWidths) : std::array<BatchTally, 3>{};
    if (hopper.size() > 1) wide = tally[0];
    shape.tile_n = kWidths[0];
    double best = EstimateHopperTime(hopper, o.input, kWidths[0], num_sms, may_split, tally[0]);
    for (size_t w = 1; w < kWidths.size(); ++w) {
      const double t =
          EstimateHopperTime(hopper, o.input, kWidths[w], num_sms, may_split, tally[w]);
      if (t < best) {  // Ties keep the wider.
        best = t;
        shape.tile_n = kWidths[w];
      }
    }
  }
  // Pairs where asked for, or where the launcher has the choice and they
  // pay (PairsPay); only wide tiles run in pairs.
  if (shape.tile_n == kHopperWideN && max_clusters > 0) {
    if (o.hopper_cluster == 0 && !wide) {
      wide = TallyBatch(hopper, o.input, std::array<int, 1>{kHopperWideN})[0];
    }
    shape.cluster =
        o.hopper_cluster == 2 || (o.hopper_cluster == 0 && wide && PairsPay(hopper, o, *wide, num_sms))
            ? 2
            : 1;
  }
  if (may_split && shape.cluster == 1) {
    shape.split =
        PlanSingle(hopper[0], o.input, shape.tile_n, num_sms, o.hopper_split_k).second;
  }
  return shape;
}

}  // namespace matmul::cuda
