#include "simkit/report/writers.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>

#include "core/api/openai.h"
#include "simkit/report/html.h"

namespace kvroute::report {
namespace {

void AppendEscaped(std::string& out, std::string_view s) { api::AppendJsonString(out, s); }

std::string Num(double v) {
  if (!std::isfinite(v)) return "null";
  return fmt::format("{}", v);
}

// A tiny JSON object writer: enough structure for the report, no dependency.
class JsonWriter {
 public:
  std::string& out() { return out_; }
  void Open(char c) {
    out_.push_back(c);
    ++depth_;
    first_ = true;
  }
  void Close(char c) {
    --depth_;
    if (!first_) Newline();
    out_.push_back(c);
    first_ = false;
  }
  void Key(std::string_view k) {
    Sep();
    AppendEscaped(out_, k);
    out_ += ": ";
  }
  void Elem() { Sep(); }
  void Field(std::string_view k, double v) {
    Key(k);
    out_ += Num(v);
  }
  // A figure that is negative when unknown (never measured): null then.
  void FieldOrNull(std::string_view k, double v) {
    Key(k);
    out_ += v >= 0 ? Num(v) : "null";
  }
  void FieldInt(std::string_view k, int64_t v) {
    Key(k);
    out_ += std::to_string(v);
  }
  void Field(std::string_view k, std::string_view v) {
    Key(k);
    AppendEscaped(out_, v);
  }
  void FieldBool(std::string_view k, bool v) {
    Key(k);
    out_ += v ? "true" : "false";
  }

 private:
  void Sep() {
    if (!first_) out_.push_back(',');
    first_ = false;
    Newline();
  }
  void Newline() {
    out_.push_back('\n');
    out_.append(static_cast<size_t>(depth_) * 2, ' ');
  }
  std::string out_;
  int depth_ = 0;
  bool first_ = true;
};

void WriteStats(JsonWriter& w, std::string_view name, const Stats& s) {
  w.Key(name);
  w.Open('{');
  w.FieldInt("count", s.count);
  w.Field("mean", s.mean);
  w.Field("min", s.min);
  w.Field("p50", s.p50);
  w.Field("p90", s.p90);
  w.Field("p99", s.p99);
  w.Field("max", s.max);
  w.Close('}');
}

void WritePdClass(JsonWriter& w, std::string_view name, const PdClassReport& c) {
  w.Key(name);
  w.Open('{');
  w.FieldInt("requests", c.requests);
  w.FieldInt("succeeded", c.succeeded);
  WriteStats(w, "ttft_s", c.ttft_s);
  WriteStats(w, "tpot_s", c.tpot_s);
  WriteStats(w, "e2e_s", c.e2e_s);
  w.Field("itl_mean_s", c.itl_mean_s);
  w.Field("itl_p99_s", c.itl_p99_s);
  w.Close('}');
}

void WritePd(JsonWriter& w, const PdReport& pd) {
  w.Key("pd");
  w.Open('{');
  w.Key("decisions");
  w.Open('{');
  for (const auto& [name, n] : pd.decisions) w.FieldInt(name, n);
  w.Close('}');
  w.FieldInt("disaggregated", pd.disaggregated);
  w.FieldInt("pulls", pd.pulls);
  w.FieldInt("recomputed", pd.recomputed);
  w.FieldInt("pull_failures", pd.pull_failures);
  w.FieldInt("prefill_retries", pd.prefill_retries);
  w.FieldInt("local_prefills", pd.local_prefills);
  w.FieldInt("holds_released", pd.holds_released);
  w.FieldInt("holds_expired", pd.holds_expired);
  WritePdClass(w, "disaggregated_requests", pd.disaggregated_requests);
  WritePdClass(w, "aggregated_requests", pd.aggregated_requests);
  WriteStats(w, "transfer_s", pd.transfer_s);
  w.Key("roles");
  w.Open('[');
  for (const PdRoleReport& r : pd.roles) {
    w.Elem();
    w.Open('{');
    w.Field("role", r.role);
    w.FieldInt("replicas", r.replicas);
    w.Field("busy_s", r.busy_s);
    w.Field("utilization", r.utilization);
    w.Field("kv_usage_mean", r.kv_usage_mean);
    w.Close('}');
  }
  w.Close(']');
  w.Close('}');
}

const char* kPalette[] = {"#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd",
                          "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22", "#17becf"};
constexpr size_t kPaletteSize = sizeof(kPalette) / sizeof(kPalette[0]);

std::string Ms(double s) {
  if (s < 0) return "-";
  if (s < 1.0) return fmt::format("{:.0f} ms", s * 1e3);
  return fmt::format("{:.2f} s", s);
}

}  // namespace

std::string ReportJson(const ReportMeta& meta, std::span<const PolicyReport> policies) {
  JsonWriter w;
  w.Open('{');
  w.Field("schema", std::string_view("kvroute.report/v1"));
  w.Field("tool", meta.tool);
  w.Field("scenario", meta.scenario);
  w.FieldInt("seed", static_cast<int64_t>(meta.seed));
  w.Key("slo");
  w.Open('{');
  w.Field("ttft_s", meta.slo.ttft_s);
  w.Field("tpot_s", meta.slo.tpot_s);
  w.Field("e2e_s", meta.slo.e2e_s);
  w.Close('}');
  w.Key("info");
  w.Open('{');
  for (const auto& [k, v] : meta.info) w.Field(k, v);
  w.Close('}');
  w.Key("policies");
  w.Open('[');
  for (const PolicyReport& p : policies) {
    w.Elem();
    w.Open('{');
    w.Field("policy", p.policy);
    w.FieldInt("requests", p.requests);
    w.FieldInt("succeeded", p.succeeded);
    w.FieldInt("good_requests", p.good);
    w.Field("span_s", p.span_s);
    w.Field("requests_per_s", p.requests_per_s);
    w.Field("output_tokens_per_s", p.output_tokens_per_s);
    w.Field("input_tokens_per_s", p.input_tokens_per_s);
    w.Field("goodput_requests_per_s", p.goodput_requests_per_s);
    w.Field("ttft_p50_s", p.ttft_s.p50);
    w.Field("ttft_p90_s", p.ttft_s.p90);
    w.Field("ttft_p99_s", p.ttft_s.p99);
    w.Field("tpot_p50_s", p.tpot_s.p50);
    w.Field("tpot_p99_s", p.tpot_s.p99);
    w.Field("e2e_p50_s", p.e2e_s.p50);
    w.Field("e2e_p99_s", p.e2e_s.p99);
    w.Field("itl_mean_s", p.itl_mean_s);
    w.Field("itl_p50_s", p.itl_p50_s);
    w.Field("itl_p99_s", p.itl_p99_s);
    w.Field("max_itl_p99_s", p.max_itl_p99_s);
    w.Field("prefix_hit_rate", p.prefix_hit_rate);
    w.FieldOrNull("request_cached_fraction", p.request_cached_fraction);
    w.FieldOrNull("oracle_hit_rate", p.oracle_hit_rate);
    w.FieldOrNull("oracle_ratio", p.oracle_ratio);
    w.Field("kv_usage_min", p.kv_usage_min);
    w.Field("kv_usage_max", p.kv_usage_max);
    w.Field("kv_usage_peak", p.kv_usage_peak);
    w.Field("waiting_mean", p.waiting_mean);
    w.Field("waiting_max", p.waiting_max);
    w.FieldInt("preemptions", p.preemptions);
    w.FieldInt("retried", p.retried);
    w.FieldInt("retries", p.retries);
    w.Key("errors");
    w.Open('{');
    for (const auto& [k, v] : p.errors_by_kind) w.FieldInt(k, v);
    w.Close('}');
    WriteStats(w, "ttft_s", p.ttft_s);
    WriteStats(w, "tpot_s", p.tpot_s);
    WriteStats(w, "e2e_s", p.e2e_s);
    w.Field("wall_s", p.wall_s);
    w.Key("flow");
    w.Open('{');
    w.FieldBool("enabled", p.flow_enabled);
    w.FieldInt("queued", p.flow_queued);
    w.FieldInt("shed", p.flow_shed);
    w.FieldInt("expired", p.flow_expired);
    w.FieldInt("affinity", p.flow_affinity);
    w.FieldInt("late", p.flow_late);
    w.Field("router_wait_mean_s", p.router_wait_mean_s);
    w.Field("router_wait_p99_s", p.router_wait_p99_s);
    w.Close('}');
    w.Key("tenants");
    w.Open('[');
    for (const TenantReport& t : p.tenants) {
      w.Elem();
      w.Open('{');
      w.Field("name", t.name);
      w.FieldInt("priority", t.priority);
      w.FieldInt("requests", t.requests);
      w.FieldInt("succeeded", t.succeeded);
      w.FieldInt("shed", t.shed);
      w.Field("ttft_p50_s", t.ttft_p50_s);
      w.Field("ttft_p99_s", t.ttft_p99_s);
      w.Field("goodput_requests_per_s", t.goodput_requests_per_s);
      w.Close('}');
    }
    w.Close(']');
    w.Key("by_region");
    w.Open('[');
    for (const RegionReport& r : p.regions) {
      w.Elem();
      w.Open('{');
      w.Field("region", r.region);
      w.FieldBool("local", r.local);
      w.FieldInt("replicas", r.replicas);
      w.FieldInt("requests", r.requests);
      w.FieldInt("succeeded", r.succeeded);
      w.Field("share", r.share);
      w.Field("ttft_p50_s", r.ttft_p50_s);
      w.Field("ttft_p99_s", r.ttft_p99_s);
      w.Close('}');
    }
    w.Close(']');
    w.Key("latency_model");
    w.Open('{');
    w.FieldInt("ttft_samples", p.latency_ttft_samples);
    w.FieldInt("tpot_samples", p.latency_tpot_samples);
    w.FieldInt("ttft_scored", p.latency_ttft_scored);
    w.FieldInt("tpot_scored", p.latency_tpot_scored);
    w.FieldOrNull("ttft_mape", p.latency_ttft_mape);
    w.FieldOrNull("tpot_mape", p.latency_tpot_mape);
    w.FieldOrNull("ttft_mae_s", p.latency_ttft_mae_s);
    w.FieldOrNull("tpot_mae_s", p.latency_tpot_mae_s);
    w.Close('}');
    if (p.pd_reported) WritePd(w, p.pd);
    if (p.lora_reported) {
      w.Key("lora");
      w.Open('{');
      w.FieldInt("loads", p.lora_loads);
      w.FieldInt("evictions", p.lora_evictions);
      w.Field("adapters_per_replica", p.lora_adapters_per_replica);
      w.Close('}');
    }
    if (p.kv_events_reported) {
      w.Key("kv_events");
      w.Open('{');
      w.FieldBool("enabled", p.kv_events_enabled);
      w.FieldInt("router_replicas", p.router_replicas);
      w.FieldInt("batches", p.kv_batches);
      w.FieldInt("lost", p.kv_lost);
      w.FieldInt("gaps", p.kv_gaps);
      w.FieldInt("gaps_unrepaired", p.kv_gaps_unrepaired);
      w.FieldInt("restarts", p.kv_restarts);
      w.FieldInt("replayed", p.kv_replayed);
      w.FieldInt("picks", p.receipt_picks);
      w.FieldInt("receipts", p.receipts);
      w.FieldOrNull("receipt_mae_tokens", p.receipt_mae_tokens);
      w.FieldOrNull("receipt_off_block_share", p.receipt_off_block_share);
      w.Close('}');
    }
    w.Close('}');
  }
  w.Close(']');
  w.Close('}');
  w.out().push_back('\n');
  return std::move(w.out());
}

std::string ReportMarkdown(const ReportMeta& meta, std::span<const PolicyReport> policies) {
  std::string out;
  if (!meta.scenario.empty()) out += fmt::format("### {}\n\n", meta.scenario);
  out +=
      "| policy | req/s | out tok/s | TTFT p50 | TTFT p99 | TPOT p50 | E2E p99 | goodput/s | "
      "hit rate | oracle | vs oracle | KV min | KV max | preempt | errors |\n"
      "|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|\n";
  for (const PolicyReport& p : policies) {
    int64_t errors = 0;
    for (const auto& [k, v] : p.errors_by_kind) errors += v;
    out += fmt::format(
        "| {} | {:.2f} | {:.0f} | {} | {} | {} | {} | {:.2f} | {:.1f}% | {} | {} | {:.0f}% | "
        "{:.0f}% | {} | {} |\n",
        p.policy, p.requests_per_s, p.output_tokens_per_s, Ms(p.ttft_s.p50), Ms(p.ttft_s.p99),
        Ms(p.tpot_s.p50), Ms(p.e2e_s.p99), p.goodput_requests_per_s, p.prefix_hit_rate * 100,
        p.oracle_hit_rate >= 0 ? fmt::format("{:.1f}%", p.oracle_hit_rate * 100) : "-",
        p.oracle_ratio >= 0 ? fmt::format("{:.2f}", p.oracle_ratio) : "-", p.kv_usage_min * 100,
        p.kv_usage_max * 100, p.preemptions, errors);
  }
  std::string retried;
  for (const PolicyReport& p : policies) {
    if (p.retried == 0) continue;
    retried += fmt::format("{} {}: {} requests ({} retries)", retried.empty() ? "" : ";",
                           p.policy, p.retried, p.retries);
  }
  if (!retried.empty()) out += "\nRetried after a failed attempt:" + retried + ".\n";
  std::string flow;
  for (const PolicyReport& p : policies) {
    if (!p.flow_enabled) continue;
    flow += fmt::format(
        "{} {}: {} queued, {} shed, {} expired, {} predicted to miss, router wait mean {} p99 {}",
        flow.empty() ? "" : ";", p.policy, p.flow_queued, p.flow_shed, p.flow_expired,
        p.flow_late, Ms(p.router_wait_mean_s), Ms(p.router_wait_p99_s));
  }
  if (!flow.empty()) out += "\nFlow control:" + flow + ".\n";
  std::string kv;
  for (const PolicyReport& p : policies) {
    if (!p.kv_events_reported) continue;
    kv += fmt::format("{} {}: {} router replica{}, events {}", kv.empty() ? "" : ";", p.policy,
                      p.router_replicas, p.router_replicas == 1 ? "" : "s",
                      p.kv_events_enabled ? "on" : "off");
    if (!p.kv_events_enabled) continue;
    kv += fmt::format(" ({} batches, {} lost, {} gaps, {} unrepaired, {} restarts)", p.kv_batches,
                      p.kv_lost, p.kv_gaps, p.kv_gaps_unrepaired, p.kv_restarts);
    if (p.receipts > 0) {
      kv += fmt::format(", receipts {} of {} picks: error mean {:.1f} tokens, {:.1f}% off by more "
                        "than a block",
                        p.receipts, p.receipt_picks, p.receipt_mae_tokens,
                        p.receipt_off_block_share * 100);
    } else {
      kv += fmt::format(", no receipts in {} picks", p.receipt_picks);
    }
  }
  if (!kv.empty()) out += "\nKV events:" + kv + ".\n";
  std::string lora;
  for (const PolicyReport& p : policies) {
    if (!p.lora_reported) continue;
    lora += fmt::format("{} {}: {} adapter loads, {} evictions, {:.1f} adapters per replica",
                        lora.empty() ? "" : ";", p.policy, p.lora_loads, p.lora_evictions,
                        p.lora_adapters_per_replica);
  }
  if (!lora.empty()) out += "\nLoRA:" + lora + ".\n";
  std::string lat;
  for (const PolicyReport& p : policies) {
    if (p.latency_ttft_scored == 0 && p.latency_tpot_scored == 0) continue;
    lat += fmt::format("{} {}: TTFT {:.1f}% ({}) over {} predictions, TPOT {:.1f}% ({}) over {}",
                       lat.empty() ? "" : ";", p.policy, std::max(0.0, p.latency_ttft_mape) * 100,
                       Ms(std::max(0.0, p.latency_ttft_mae_s)), p.latency_ttft_scored,
                       std::max(0.0, p.latency_tpot_mape) * 100,
                       Ms(std::max(0.0, p.latency_tpot_mae_s)), p.latency_tpot_scored);
  }
  if (!lat.empty()) out += "\nLatency model (mean absolute error of its predictions):" + lat + ".\n";
  std::string pd;
  for (const PolicyReport& p : policies) {
    if (!p.pd_reported) continue;
    for (const auto* c : {&p.pd.disaggregated_requests, &p.pd.aggregated_requests}) {
      if (c->requests == 0) continue;
      pd += fmt::format("| {} | {} | {} | {} | {} | {} | {} | {} | {} | {} |\n", p.policy,
                        c == &p.pd.disaggregated_requests ? "disaggregated" : "aggregated",
                        c->requests, Ms(c->ttft_s.mean), Ms(c->ttft_s.p99), Ms(c->itl_mean_s),
                        Ms(c->itl_p99_s), Ms(c->tpot_s.mean), Ms(c->e2e_s.mean),
                        Ms(c->e2e_s.p99));
    }
  }
  if (!pd.empty()) {
    out += "\n| policy | P/D served | requests | TTFT mean | TTFT p99 | ITL mean | ITL p99 | "
           "TPOT mean | E2E mean | E2E p99 |\n"
           "|---|---|--:|--:|--:|--:|--:|--:|--:|--:|\n" + pd;
    std::string legs;
    for (const PolicyReport& p : policies) {
      if (!p.pd_reported) continue;
      std::string decisions, roles;
      for (const auto& [name, n] : p.pd.decisions) {
        if (n > 0) decisions += fmt::format("{}{} {}", decisions.empty() ? "" : ", ", n, name);
      }
      for (const PdRoleReport& r : p.pd.roles) {
        roles += fmt::format("{}{} x{}: busy {:.0f}%, KV {:.0f}%", roles.empty() ? "" : "; ",
                             r.role, r.replicas, r.utilization * 100, r.kv_usage_mean * 100);
      }
      const std::string transfer =
          p.pd.pulls > 0 ? fmt::format(", transfer mean {} p99 {}", Ms(p.pd.transfer_s.mean),
                                       Ms(p.pd.transfer_s.p99))
                         : "";
      legs += fmt::format(
          "\n- {}: decisions {}; {} disaggregated ({} pulled{}; {} recomputed, {} pull "
          "failures); {} prefill retries, {} local prefills; by role (mean over the run): {}.",
          p.policy, decisions.empty() ? "none" : decisions, p.pd.disaggregated, p.pd.pulls,
          transfer, p.pd.recomputed, p.pd.pull_failures, p.pd.prefill_retries,
          p.pd.local_prefills, roles);
    }
    out += "\nPrefill/decode:" + legs + "\n";
  }
  std::string tenants;
  for (const PolicyReport& p : policies) {
    for (const TenantReport& t : p.tenants) {
      tenants += fmt::format("| {} | {} ({}) | {} | {} | {} | {} | {:.2f} |\n", p.policy, t.name,
                             t.priority, t.requests, t.shed, Ms(t.ttft_p50_s), Ms(t.ttft_p99_s),
                             t.goodput_requests_per_s);
    }
  }
  if (!tenants.empty()) {
    out += "\n| policy | tenant (priority) | requests | shed | TTFT p50 | TTFT p99 | goodput/s |\n"
           "|---|---|--:|--:|--:|--:|--:|\n" + tenants;
  }
  std::string regions;
  for (const PolicyReport& p : policies) {
    for (const RegionReport& r : p.regions) {
      regions += fmt::format("| {} | {}{} | {} | {} | {:.1f}% | {} | {} |\n", p.policy,
                             r.region.empty() ? "(none)" : r.region, r.local ? " (local)" : "",
                             r.replicas, r.requests, r.share * 100, Ms(r.ttft_p50_s),
                             Ms(r.ttft_p99_s));
    }
  }
  if (!regions.empty()) {
    out += "\n| policy | served in region | replicas | requests | share | TTFT p50 | TTFT p99 |\n"
           "|---|---|--:|--:|--:|--:|--:|\n" + regions;
  }
  std::string slo;
  if (meta.slo.ttft_s > 0) slo += fmt::format(" TTFT <= {}", Ms(meta.slo.ttft_s));
  if (meta.slo.tpot_s > 0) slo += fmt::format(" TPOT <= {}", Ms(meta.slo.tpot_s));
  if (meta.slo.e2e_s > 0) slo += fmt::format(" E2E <= {}", Ms(meta.slo.e2e_s));
  if (!slo.empty()) out += "\nGoodput SLOs:" + slo + ".\n";
  return out;
}

std::string TtftCdfSvg(std::span<const PolicyReport> policies) {
  const double w = 720, h = 420, left = 70, right = 170, top = 30, bottom = 50;
  const double pw = w - left - right, ph = h - top - bottom;
  double lo = 1e300, hi = 0;
  for (const auto& p : policies) {
    for (const auto& [x, y] : p.ttft_cdf) {
      lo = std::min(lo, std::max(x, 1e-4));
      hi = std::max(hi, x);
    }
  }
  if (hi <= 0) {
    lo = 1e-3;
    hi = 1;
  }
  const double llo = std::floor(std::log10(lo)), lhi = std::max(llo + 1, std::ceil(std::log10(hi)));
  auto X = [&](double v) {
    return left + (std::log10(std::max(v, 1e-4)) - llo) / (lhi - llo) * pw;
  };
  auto Y = [&](double f) { return top + (1.0 - f) * ph; };
  std::string s = fmt::format(
      "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{0}\" height=\"{1}\" "
      "viewBox=\"0 0 {0} {1}\" font-family=\"sans-serif\" font-size=\"12\">\n"
      "<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n"
      "<text x=\"{2}\" y=\"18\" font-size=\"14\">Time to first token (CDF)</text>\n",
      w, h, left);
  for (double d = llo; d <= lhi + 1e-9; d += 1) {
    const double x = X(std::pow(10.0, d));
    s += fmt::format(
        "<line x1=\"{0:.1f}\" y1=\"{1}\" x2=\"{0:.1f}\" y2=\"{2}\" stroke=\"#ddd\"/>"
        "<text x=\"{0:.1f}\" y=\"{3}\" text-anchor=\"middle\">{4}</text>\n",
        x, top, top + ph, top + ph + 16, Ms(std::pow(10.0, d)));
  }
  for (int k = 0; k <= 4; ++k) {
    const double y = Y(k / 4.0);
    s += fmt::format(
        "<line x1=\"{0}\" y1=\"{1:.1f}\" x2=\"{2}\" y2=\"{1:.1f}\" stroke=\"#ddd\"/>"
        "<text x=\"{3}\" y=\"{4:.1f}\" text-anchor=\"end\">{5}%</text>\n",
        left, y, left + pw, left - 6, y + 4, k * 25);
  }
  s += fmt::format("<text x=\"{}\" y=\"{}\" text-anchor=\"middle\">TTFT (log scale)</text>\n",
                   left + pw / 2, h - 10);
  for (size_t i = 0; i < policies.size(); ++i) {
    const PolicyReport& p = policies[i];
    const char* color = kPalette[i % kPaletteSize];
    std::string pts;
    double prev_y = 0.0;
    for (const auto& [x, f] : p.ttft_cdf) {
      // A step function: horizontal to the new value, then up.
      pts += fmt::format("{:.1f},{:.1f} {:.1f},{:.1f} ", X(x), Y(prev_y), X(x), Y(f));
      prev_y = f;
    }
    s += fmt::format("<polyline fill=\"none\" stroke=\"{}\" stroke-width=\"2\" points=\"{}\"/>\n",
                     color, pts);
    const double ly = top + 14 + 18 * static_cast<double>(i);
    s += fmt::format(
        "<line x1=\"{0}\" y1=\"{1:.1f}\" x2=\"{2}\" y2=\"{1:.1f}\" stroke=\"{3}\" "
        "stroke-width=\"3\"/><text x=\"{4}\" y=\"{5:.1f}\">{6}</text>\n",
        left + pw + 12, ly, left + pw + 32, color, left + pw + 38, ly + 4, HtmlEscape(p.policy));
  }
  s += "</svg>\n";
  return s;
}

std::string KvUsageSvg(std::span<const PolicyReport> policies) {
  const double w = 720, panel_h = 150, left = 60, right = 20, top = 30, gap = 30;
  const double pw = w - left - right;
  const double h = top + static_cast<double>(policies.size()) * (panel_h + gap) + 20;
  std::string s = fmt::format(
      "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{0}\" height=\"{1}\" "
      "viewBox=\"0 0 {0} {1}\" font-family=\"sans-serif\" font-size=\"12\">\n"
      "<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n"
      "<text x=\"{2}\" y=\"18\" font-size=\"14\">KV-cache usage per replica over time</text>\n",
      w, h, left);
  for (size_t i = 0; i < policies.size(); ++i) {
    const PolicyReport& p = policies[i];
    const double y0 = top + static_cast<double>(i) * (panel_h + gap) + 14;
    const double t_end = p.kv_times.empty() ? 1.0 : std::max(p.kv_times.back(), 1e-9);
    auto X = [&](double t) { return left + t / t_end * pw; };
    auto Y = [&](double u) { return y0 + (1.0 - std::clamp(u, 0.0, 1.0)) * panel_h; };
    s += fmt::format(
        "<text x=\"{0}\" y=\"{1:.1f}\">{2}</text>"
        "<rect x=\"{0}\" y=\"{3:.1f}\" width=\"{4}\" height=\"{5}\" fill=\"none\" "
        "stroke=\"#999\"/>\n"
        "<text x=\"{6}\" y=\"{7:.1f}\" text-anchor=\"end\">100%</text>"
        "<text x=\"{6}\" y=\"{8:.1f}\" text-anchor=\"end\">0%</text>"
        "<text x=\"{9}\" y=\"{10:.1f}\" text-anchor=\"end\">{11:.0f} s</text>\n",
        left, y0 - 4, HtmlEscape(p.policy), y0, pw, panel_h, left - 6, y0 + 10, y0 + panel_h,
        left + pw, y0 + panel_h + 14, t_end);
    for (size_t r = 0; r < p.kv_series.size(); ++r) {
      std::string pts;
      const auto& series = p.kv_series[r];
      for (size_t k = 0; k < series.size() && k < p.kv_times.size(); ++k) {
        pts += fmt::format("{:.1f},{:.1f} ", X(p.kv_times[k]), Y(series[k]));
      }
      s += fmt::format(
          "<polyline fill=\"none\" stroke=\"{}\" stroke-width=\"1\" stroke-opacity=\"0.8\" "
          "points=\"{}\"/>\n",
          kPalette[r % kPaletteSize], pts);
    }
  }
  s += "</svg>\n";
  return s;
}

}  // namespace kvroute::report
