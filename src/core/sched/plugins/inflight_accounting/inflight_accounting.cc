#include "core/sched/plugins/inflight_accounting/inflight_accounting.h"

namespace kvroute::sched {

PluginFactory InflightAccountingFactory() {
  return {PluginKind::kMarker, {}, [](const PluginParams&) {
            return std::unique_ptr<Plugin>(new InflightAccounting());
          }};
}

}  // namespace kvroute::sched
