// Charts read at a glance, written as SVG by our own code (no plotting library): the KV
// usage of every replica over time as a heatmap, and throughput against fleet size.
// Pure: data in, a complete SVG document (trailing newline) out.
#pragma once

#include <span>
#include <string>

#include "simkit/report/scaling.h"
#include "simkit/report/summary.h"

namespace kvroute::report {

// The heatmap's colour for a KV usage `u` (0..1, clamped): "#rrggbb" interpolated
// linearly in RGB between the stops 0 #f7fbff, 0.5 #fed976, 0.8 #fd8d3c and 1 #bd0026
// (each channel rounded to nearest). A non-finite `u` (unknown) is "#cccccc".
std::string KvColor(double u);

// One panel per policy: a row per recorded replica (PolicyReport::kv_series, top row
// replica 0) and a column per time slice, at most `max_columns` slices of equal length
// over [first, last] of kv_times (as many as there are samples when fewer). A cell is a
// <rect class="kv"> filled with KvColor of the highest usage sampled in its slice, so a
// short peak stays visible; a slice without samples is KvColor(NaN). A policy without
// samples gets its title and "no samples". A colour legend closes the chart.
std::string KvHeatmapSvg(std::span<const PolicyReport> policies, int max_columns = 90);

// Output tokens/s against fleet size: a line with a marker (<circle class="pt">) and its
// value per point for each policy (in order of first appearance), on a linear fleet-size
// axis from 0, and, dashed, what linear scaling from the policy's smallest fleet would
// give (<line class="ideal">) when it has more than one fleet size. Each policy's legend
// entry names its gain ("kvroute x3.9").
std::string ScalingSvg(std::span<const ScalingPoint> points);

}  // namespace kvroute::report
