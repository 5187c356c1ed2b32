// The kvroute_flow_* metric families, from a flow::FlowQueue's counters: one exporter for
// every front end with flow control (`kvroute serve`, `kvroute epp`), so both publish
// the same series.
//
//   kvroute_flow_waiting_requests{priority}, kvroute_flow_waiting_bytes{priority} (gauges),
//   kvroute_flow_wait_seconds{priority} (histogram), kvroute_flow_dispatched_total{cause}
//   (immediate, order, affinity, aged), kvroute_flow_rejected_total{reason},
//   kvroute_flow_expired_total{reason}, kvroute_flow_cancelled_total.
#pragma once

#include <string>

#include "core/flow/flow_queue.h"

namespace kvroute::flow {

// Appends the families above, in Prometheus text format, to `out`. Thread: any (it reads
// only `stats`).
void AppendFlowMetrics(std::string& out, const flow::FlowStats& stats);

}  // namespace kvroute::flow
