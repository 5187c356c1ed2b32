#include "core/sched/prefix_model.h"

namespace kvroute::sched {

std::unique_ptr<PrefixModel> MakeApproxPrefixModel(ApproxRules rules) {
  return std::make_unique<ApproxPrefixModel>(rules);
}

}  // namespace kvroute::sched
