#include "core/sched/plugins/inflight_accounting/inflight_accounting.h"

namespace kvroute::sched {

PluginFactory InflightAccountingFactory() {
  return FactoryWithoutParams<InflightAccounting>(PluginKind::kMarker);
}

}  // namespace kvroute::sched
