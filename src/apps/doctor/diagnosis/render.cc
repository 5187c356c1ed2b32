// The report's three faces: JSON for tools (schema in docs/DOCTOR.md), text for a person
// at a terminal, and the --watch screen. Unknown is null in JSON and "-" in text, never 0.
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <string>

#include "apps/doctor/diagnosis/doctor.h"

namespace kvroute::doctor {
namespace {

using Opt = std::optional<double>;

// Length of the valid UTF-8 sequence at s[i], or 0. Error texts and garbage lines carry
// bytes a replica sent; JSON must stay valid whatever they were.
size_t Utf8Len(std::string_view s, size_t i) {
  const auto b = [&](size_t k) { return static_cast<unsigned char>(s[k]); };
  const unsigned char c = b(i);
  size_t n = c < 0x80 ? 1 : (c >> 5) == 0x6 ? 2 : (c >> 4) == 0xe ? 3 : (c >> 3) == 0x1e ? 4 : 0;
  if (n == 0 || i + n > s.size()) return 0;
  for (size_t k = 1; k < n; ++k) {
    if ((b(i + k) & 0xc0) != 0x80) return 0;
  }
  // Overlong forms, surrogates and code points past U+10FFFF are invalid too.
  if (n == 2 && c < 0xc2) return 0;
  if (n == 3) {
    const unsigned c1 = b(i + 1);
    if ((c == 0xe0 && c1 < 0xa0) || (c == 0xed && c1 >= 0xa0)) return 0;
  }
  if (n == 4) {
    const unsigned c1 = b(i + 1);
    if ((c == 0xf0 && c1 < 0x90) || c > 0xf4 || (c == 0xf4 && c1 >= 0x90)) return 0;
  }
  return n;
}

void AppendString(std::string& out, std::string_view s) {
  out.push_back('"');
  for (size_t i = 0; i < s.size();) {
    const char c = s[i];
    const size_t n = Utf8Len(s, i);
    if (n == 0) {
      out += "\\ufffd";
      ++i;
      continue;
    }
    if (n > 1) {
      out.append(s.substr(i, n));
      i += n;
      continue;
    }
    switch (c) {
      case '"':
        out += "\\\"";
        break;
      case '\\':
        out += "\\\\";
        break;
      case '\n':
        out += "\\n";
        break;
      case '\r':
        out += "\\r";
        break;
      case '\t':
        out += "\\t";
        break;
      default:
        if (static_cast<unsigned char>(c) < 0x20) {
          out += fmt::format("\\u{:04x}", static_cast<unsigned>(c));
        } else {
          out.push_back(c);
        }
    }
    ++i;
  }
  out.push_back('"');
}

std::string JNum(const Opt& v) {
  if (!v || !std::isfinite(*v)) return "null";
  return fmt::format("{}", *v);
}
std::string JNum(double v) { return JNum(Opt(v)); }
std::string JInt(const std::optional<int64_t>& v) { return v ? std::to_string(*v) : "null"; }
std::string JBool(const std::optional<bool>& v) { return v ? (*v ? "true" : "false") : "null"; }
std::string JStr(std::string_view s) {
  std::string out;
  AppendString(out, s);
  return out;
}
std::string JStrOrNull(std::string_view s) { return s.empty() ? "null" : JStr(s); }
std::string JList(const std::vector<std::string>& v) {
  std::string out = "[";
  for (size_t i = 0; i < v.size(); ++i) {
    if (i) out += ", ";
    AppendString(out, v[i]);
  }
  return out + "]";
}
std::string JQuantiles(const Quantiles& q) {
  return fmt::format("{{\"p50\": {}, \"p99\": {}}}", JNum(q.p50), JNum(q.p99));
}

std::string JEvents(const std::optional<ReplicaFigures::Events>& e) {
  if (!e) return "null";
  std::string sizes = "[";
  for (size_t i = 0; i < e->block_sizes.size(); ++i) {
    sizes += (i ? ", " : "") + std::to_string(e->block_sizes[i]);
  }
  sizes += "]";
  return fmt::format(
      "{{\"address\": {}, \"error\": {}, \"batches\": {}, \"decode_errors\": {}, "
      "\"last_batch_s\": {}, \"block_sizes\": {}, \"tokens_computed\": {}}}",
      JStr(e->address), JStrOrNull(e->error), e->batches, e->decode_errors, JNum(e->last_batch_s),
      sizes, JNum(e->tokens_computed));
}

// Text cells: "-" for unknown.
std::string TPct(const Opt& v) { return v ? fmt::format("{:.0f}%", *v * 100) : "-"; }
std::string TPct1(const Opt& v) { return v ? fmt::format("{:.1f}%", *v * 100) : "-"; }
std::string TNum(const Opt& v, int decimals = 0) {
  if (!v) return "-";
  return fmt::format("{:.{}f}", *v, decimals);
}
std::string TSec(const Opt& v) {
  if (!v) return "-";
  if (*v < 1) return fmt::format("{:.0f}ms", *v * 1000);
  return fmt::format("{:.2f}s", *v);
}
std::string TOnOff(const std::optional<bool>& v) { return v ? (*v ? "on" : "off") : "-"; }

// Names, errors and summaries may carry a replica's bytes: one terminal line each.
std::string OneLine(std::string_view v) {
  std::string s(v);
  for (char& c : s) {
    if (static_cast<unsigned char>(c) < 0x20 || c == 0x7f) c = ' ';
  }
  return s;
}

std::string Fit(std::string s, size_t width) {
  if (s.size() <= width) return s;
  if (width <= 1) return s.substr(0, width);
  return s.substr(0, width - 1) + "~";
}

std::string JRouterKind(const RouterFigures::Kind& k) {
  return fmt::format(
      "{{\"predictions\": {}, \"mape\": {}, \"mean_abs_error_s\": {}, \"slo_requests\": {}, "
      "\"slo_violations\": {}, \"attainment\": {}}}",
      JNum(k.predictions), JNum(k.mape), JNum(k.mean_abs_error_s), JNum(k.slo_requests),
      JNum(k.slo_violations), JNum(k.attainment));
}

std::string JRouter(const std::optional<RouterFigures>& r) {
  if (!r) return "null";
  return fmt::format(
      "{{\"name\": {}, \"address\": {}, \"reachable\": {}, \"error\": {}, \"scrapes\": {}, "
      "\"failures\": {}, \"kvroute\": {}, \"flow_control\": {}, \"ttft\": {}, \"tpot\": {}}}",
      JStr(r->name), JStr(r->address), r->reachable ? "true" : "false", JStrOrNull(r->error),
      r->scrapes, r->failures, r->kvroute ? "true" : "false",
      r->flow_control ? "true" : "false", JRouterKind(r->ttft), JRouterKind(r->tpot));
}

// "12.0% (0.031 s, 412 predictions)" or "-".
std::string TRouterError(const RouterFigures::Kind& k) {
  if (!k.mape) return "-";
  return fmt::format("{:.1f}% (mean {:.3f} s, {:.0f} predictions)", *k.mape * 100,
                     k.mean_abs_error_s.value_or(0), k.predictions.value_or(0));
}
std::string TAttainment(const RouterFigures::Kind& k) {
  if (!k.attainment) return "-";
  return fmt::format("{:.1f}% of {:.0f}", *k.attainment * 100, k.slo_requests.value_or(0));
}

}  // namespace

std::string ReportJson(const Report& r) {
  std::string o;
  o.reserve(4096);
  o += "{\n  \"schema\": \"kvroute-doctor/1\",\n";
  o += fmt::format("  \"window\": {{\"intended_s\": {}, \"actual_s\": {}, \"at_s\": {}}},\n",
                   JNum(r.intended_window_s), JNum(r.window_s), JNum(r.at_s));
  o += "  \"replicas\": [";
  for (size_t i = 0; i < r.replicas.size(); ++i) {
    const ReplicaFigures& x = r.replicas[i];
    o += i ? ",\n    {" : "\n    {";
    o += fmt::format("\"name\": {}, \"address\": {}, \"reachable\": {}, \"error\": {}, ",
                     JStr(x.name), JStr(x.address), x.reachable ? "true" : "false",
                     JStrOrNull(x.error));
    o += fmt::format("\"scrapes\": {}, \"failures\": {}, ", x.scrapes, x.failures);
    o += fmt::format("\"running\": {}, \"waiting\": {}, \"waiting_mean\": {}, ", JNum(x.running),
                     JNum(x.waiting), JNum(x.waiting_mean));
    o += fmt::format("\"kv\": {{\"now\": {}, \"mean\": {}, \"max\": {}}}, ", JNum(x.kv_now),
                     JNum(x.kv_mean), JNum(x.kv_max));
    o += fmt::format("\"hit_rate\": {}, \"hit_rate_source\": {}, \"queried_tokens\": {}, ",
                     JNum(x.hit_rate), JStrOrNull(x.hit_rate_source), JNum(x.queried_tokens));
    o += fmt::format("\"preemptions_per_s\": {}, \"tokens_per_s\": {}, \"requests_per_s\": {}, ",
                     JNum(x.preemptions_per_s), JNum(x.tokens_per_s), JNum(x.requests_per_s));
    o += fmt::format(
        "\"ttft_s\": {}, \"prefix_caching\": {}, \"block_size\": {}, "
        "\"num_gpu_blocks\": {}, \"garbage\": {}, \"kv_events\": {}}}",
        JQuantiles(x.ttft_s), JBool(x.prefix_caching), JInt(x.block_size), JInt(x.num_gpu_blocks),
        JList(x.garbage), JEvents(x.events));
  }
  o += r.replicas.empty() ? "],\n" : "\n  ],\n";
  const FleetFigures& f = r.fleet;
  o += fmt::format("  \"fleet\": {{\"replicas\": {}, \"reachable\": {}, ", f.replicas, f.reachable);
  o += fmt::format("\"hit_rate\": {}, \"hit_rate_source\": {}, \"queried_tokens\": {}, ",
                   JNum(f.hit_rate), JStrOrNull(f.hit_rate_source), JNum(f.queried_tokens));
  o += fmt::format("\"kv\": {{\"min\": {}, \"max\": {}, \"spread\": {}}}, ", JNum(f.kv_min),
                   JNum(f.kv_max), JNum(f.kv_spread));
  o += fmt::format("\"rounds\": {}, \"lopsided_rounds\": {}, ", f.rounds, f.lopsided_rounds);
  o += fmt::format("\"waiting\": {{\"total\": {}, \"min_mean\": {}, \"max_mean\": {}}}, ",
                   JNum(f.waiting_total), JNum(f.waiting_min), JNum(f.waiting_max));
  o += fmt::format("\"preemptions_per_s\": {}, \"preempting\": {}, ", JNum(f.preemptions_per_s),
                   JList(f.preempting));
  o += fmt::format("\"tokens_per_s\": {}, \"requests_per_s\": {}, \"ttft_s\": {}}},\n",
                   JNum(f.tokens_per_s), JNum(f.requests_per_s), JQuantiles(f.ttft_s));
  o += "  \"router\": " + JRouter(r.router) + ",\n";
  o += "  \"findings\": [";
  for (size_t i = 0; i < r.findings.size(); ++i) {
    const Finding& x = r.findings[i];
    o += i ? ",\n    {" : "\n    {";
    o += fmt::format(
        "\"rule\": {}, \"severity\": {}, \"routing\": {}, \"summary\": {}, "
        "\"condition\": {}, \"remedy\": {}, \"replicas\": {}}}",
        JStr(x.rule), JStr(x.severity), x.routing ? "true" : "false", JStr(x.summary),
        JStr(x.condition), JStr(x.remedy), JList(x.replicas));
  }
  o += r.findings.empty() ? "],\n" : "\n  ],\n";
  o += fmt::format("  \"readable\": {},\n  \"healthy\": {},\n  \"exit_code\": {}\n}}\n",
                   r.readable ? "true" : "false", r.findings.empty() ? "true" : "false",
                   r.ExitCode());
  return o;
}

std::string ReportText(const Report& r) {
  std::string o;
  size_t name_w = 7;
  for (const ReplicaFigures& x : r.replicas)
    name_w = std::max(name_w, std::min<size_t>(x.name.size(), 28));
  o +=
      fmt::format("kvroute doctor: {} replicas, {} reachable, window {:.1f} s (asked {:.0f} s)\n\n",
                  r.fleet.replicas, r.fleet.reachable, r.window_s, r.intended_window_s);
  o += fmt::format(
      "{:<{}} {:>3} {:>7} {:>7} {:>5} {:>5} {:>5} {:>6} {:>9} {:>7} {:>7} {:>8} {:>6}\n", "replica",
      name_w, "up", "running", "waiting", "KV", "mean", "max", "hit", "preempt/s", "TTFTp50",
      "TTFTp99", "tok/s", "prefix");
  for (const ReplicaFigures& x : r.replicas) {
    o += fmt::format(
        "{:<{}} {:>3} {:>7} {:>7} {:>5} {:>5} {:>5} {:>6} {:>9} {:>7} {:>7} {:>8} {:>6}\n",
        Fit(OneLine(x.name), name_w), name_w, x.reachable ? "yes" : "NO", TNum(x.running),
        TNum(x.waiting), TPct(x.kv_now), TPct(x.kv_mean), TPct(x.kv_max), TPct1(x.hit_rate),
        TNum(x.preemptions_per_s, 2), TSec(x.ttft_s.p50), TSec(x.ttft_s.p99), TNum(x.tokens_per_s),
        TOnOff(x.prefix_caching));
  }
  for (const ReplicaFigures& x : r.replicas) {
    if (!x.reachable && !x.error.empty()) {
      o += fmt::format("  {}: {}\n", OneLine(x.name), OneLine(x.error));
    }
  }
  for (const ReplicaFigures& x : r.replicas) {
    if (!x.events) continue;
    const ReplicaFigures::Events& e = *x.events;
    std::string sizes;
    for (int32_t bs : e.block_sizes) sizes += (sizes.empty() ? "" : ",") + std::to_string(bs);
    o += fmt::format("  {} KV events {}: {} batches{}{}, tokens computed {}{}\n", OneLine(x.name),
                     OneLine(e.address), e.batches,
                     e.last_batch_s ? fmt::format(" (last at {:.1f}s)", *e.last_batch_s) : "",
                     sizes.empty() ? "" : ", block size " + sizes, TNum(e.tokens_computed),
                     e.error.empty() ? "" : ", probe: " + OneLine(e.error));
  }
  const FleetFigures& f = r.fleet;
  std::string preempting = f.preempting.empty() ? "none" : "";
  for (size_t i = 0; i < f.preempting.size(); ++i) {
    preempting += (i ? ", " : "") + OneLine(f.preempting[i]);
  }
  o += fmt::format(
      "\nfleet: hit rate {}{}, KV min {} max {} spread {}, waiting {} (mean min {} max {}), "
      "preemptions {}/s ({}), TTFT p50 {} p99 {}, {} tok/s\n",
      TPct1(f.hit_rate), f.hit_rate_source.empty() ? "" : " (" + f.hit_rate_source + ")",
      TPct(f.kv_min), TPct(f.kv_max),
      f.kv_spread ? fmt::format("{:.0f} pts", *f.kv_spread * 100) : "-", TNum(f.waiting_total),
      TNum(f.waiting_min, 1), TNum(f.waiting_max, 1), TNum(f.preemptions_per_s, 2), preempting,
      TSec(f.ttft_s.p50), TSec(f.ttft_s.p99), TNum(f.tokens_per_s));
  if (r.router) {
    const RouterFigures& x = *r.router;
    if (x.kvroute) {
      o += fmt::format(
          "router {}: latency model error TTFT {}, TPOT {}; objectives met: TTFT {}, TPOT {}; "
          "flow control {}\n",
          OneLine(x.address), TRouterError(x.ttft), TRouterError(x.tpot), TAttainment(x.ttft),
          TAttainment(x.tpot), x.flow_control ? "on" : "off");
    } else {
      o += fmt::format("router {}: {}\n", OneLine(x.address),
                       x.reachable ? "no kvroute latency series" : OneLine(x.error));
    }
  }
  o += "\n";
  if (r.findings.empty()) {
    o += r.readable ? "healthy: no findings\n" : "nothing readable\n";
  }
  for (const Finding& x : r.findings) {
    o += fmt::format("FINDING {}{}: {}\n", x.rule, x.severity == "error" ? " (error)" : "",
                     OneLine(x.summary));
    o += fmt::format("  rule: {}\n", x.condition);
    o += fmt::format("  fix: {}\n", x.remedy);
  }
  return o;
}

std::string WatchView(const Report& r, int width) {
  const size_t w = static_cast<size_t>(std::max(width, 20));
  std::string o;
  const FleetFigures& f = r.fleet;
  std::string head = fmt::format(
      "kvroute doctor  {}/{} up  hit {}  KV {}-{}  waiting {}  preempt {}/s  {} finding(s)",
      f.reachable, f.replicas, TPct1(f.hit_rate), TPct(f.kv_min), TPct(f.kv_max),
      TNum(f.waiting_total), TNum(f.preemptions_per_s, 2), r.findings.size());
  o += Fit(head, w) + "\n";
  // Columns after the bar: " 100%  wait 1234  run 1234  hit 100.0%  pre 12.34" (~50).
  size_t name_w = 4;
  for (const ReplicaFigures& x : r.replicas)
    name_w = std::max(name_w, std::min<size_t>(x.name.size(), 20));
  const size_t fixed = name_w + 1 + 2 + 45;
  const size_t bar_w = w > fixed + 4 ? std::min<size_t>(w - fixed, 30) : 4;
  for (const ReplicaFigures& x : r.replicas) {
    std::string bar(bar_w, '.');
    if (x.kv_now) {
      const auto filled = static_cast<size_t>(std::lround(std::clamp(*x.kv_now, 0.0, 1.0) * bar_w));
      std::fill(bar.begin(), bar.begin() + static_cast<long>(filled), '#');
    } else {
      std::fill(bar.begin(), bar.end(), ' ');
    }
    std::string row;
    if (!x.reachable) {
      row = fmt::format("{:<{}} [{}] DOWN {}", Fit(OneLine(x.name), name_w), name_w,
                        std::string(bar_w, ' '), OneLine(x.error));
    } else {
      row = fmt::format("{:<{}} [{}] {:>4} wait {:>4} run {:>4} hit {:>6} pre {:>5}",
                        Fit(OneLine(x.name), name_w), name_w, bar, TPct(x.kv_now), TNum(x.waiting),
                        TNum(x.running), TPct1(x.hit_rate), TNum(x.preemptions_per_s, 2));
    }
    o += Fit(row, w) + "\n";
  }
  for (const Finding& x : r.findings) o += Fit("! " + x.rule + ": " + OneLine(x.summary), w) + "\n";
  if (r.findings.empty() && r.readable) o += Fit("healthy: no findings", w) + "\n";
  return o;
}

}  // namespace kvroute::doctor
