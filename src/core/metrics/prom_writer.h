// Prometheus text exposition (0.0.4) writer for kvroute's own /metrics (simulator and
// router). Output mirrors Python prometheus_client, which is what vLLM serves, so a
// simulated replica's /metrics reads like a real one. Pure: appends to a string.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>

#include "core/metrics/prom_parser.h"

namespace kvroute::metrics {

struct Label {
  std::string_view name;
  std::string_view value;  // unescaped; the writer escapes it
};

// Appends `v` the way prometheus_client prints a float: Python's repr ("41.0",
// "0.9812345679012346", "9.75e-06", "1e+16"), except "+Inf", "-Inf", "NaN", and positive
// values of 1e6 and above with a fractional repr in Go-like exponent form, quirks included
// ("8.2634112e+07", "1.2345678901e+010").
void AppendPromValue(std::string& out, double v);
std::string FormatPromValue(double v);

// Appends `s` with label-value escaping: \ -> \\, " -> \", newline -> \n.
void AppendEscapedLabelValue(std::string& out, std::string_view s);

// "# HELP name help\n# TYPE name type\n" (help escaped: \ -> \\, newline -> \n).
void AppendHeader(std::string& out, std::string_view name, std::string_view help,
                  MetricType type);

// "name{l1="v1",...} value\n"; no braces when there are no labels. `extra`, when its name
// is not empty, is appended as the last label (used for a histogram's `le`).
void AppendSample(std::string& out, std::string_view name, std::span<const Label> labels,
                  double value, Label extra = {});

// Header plus one sample: a gauge, or a counter (pass the full "_total" name, as
// prometheus_client's 0.0.4 output names counters).
void AppendGauge(std::string& out, std::string_view name, std::string_view help,
                 std::span<const Label> labels, double value);
void AppendCounter(std::string& out, std::string_view name, std::string_view help,
                   std::span<const Label> labels, double value);

// One sample of a family with a single label: the label's value and the sample's.
struct LabeledValue {
  std::string_view label_value;
  double value;
};

// A counter family by one label (`label`): the header, then one sample per entry of
// `samples`, in order.
void AppendCounterFamily(std::string& out, std::string_view name, std::string_view help,
                         std::string_view label, std::span<const LabeledValue> samples);

// One histogram series (write AppendHeader(..., kHistogram) once per family first):
// name_bucket{...,le="b"} for each upper bound with cumulative counts, then le="+Inf",
// then name_count and name_sum. `bucket_counts` holds per-bucket (non-cumulative) counts:
// bucket_counts.size() == upper_bounds.size() + 1, the last being the overflow above the
// largest bound; when sizes differ, missing counts are taken as 0.
void AppendHistogramSeries(std::string& out, std::string_view name,
                           std::span<const Label> labels, std::span<const double> upper_bounds,
                           std::span<const uint64_t> bucket_counts, double sum);

}  // namespace kvroute::metrics
