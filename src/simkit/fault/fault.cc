#include "simkit/fault/fault.h"

#include <fmt/format.h>
#include <simdjson.h>

#include <algorithm>
#include <charconv>
#include <cmath>

#include "core/api/openai.h"

namespace kvroute::fault {

namespace {

constexpr std::array<std::string_view, kNumFaultKinds> kKindNames = {
    "crash", "hang",    "delay", "stall",         "reset",           "http_error",
    "restart", "slow", "metrics_stale", "metrics_nan", "metrics_missing", "metrics_slow",
    "events_stall", "events_drop"};

constexpr std::string_view kFieldNames[] = {"kind",   "at",       "duration", "delay",
                                            "after_chunks", "status", "fraction", "factor",
                                            "seed"};

std::optional<double> ParseNumber(std::string_view s) {
  if (s.empty()) return std::nullopt;
  double v = 0.0;
  auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  if (ec != std::errc() || end != s.data() + s.size() || !std::isfinite(v)) return std::nullopt;
  return v;
}

std::optional<int64_t> ParseInteger(std::string_view s) {
  if (!s.empty() && s.front() == '+') s.remove_prefix(1);
  int64_t v = 0;
  auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  if (s.empty() || ec != std::errc() || end != s.data() + s.size()) return std::nullopt;
  return v;
}

std::string Quote(std::string_view s) { return "'" + std::string(s) + "'"; }

FaultError Err(std::string_view field, std::string message) {
  return FaultError{std::string(field), std::move(message)};
}

}  // namespace

std::string_view FaultKindName(FaultKind kind) { return kKindNames[static_cast<size_t>(kind)]; }

const std::array<std::string_view, kNumFaultKinds>& FaultKindNames() { return kKindNames; }

std::optional<FaultKind> FaultKindFromName(std::string_view name) {
  for (size_t i = 0; i < kKindNames.size(); ++i) {
    if (kKindNames[i] == name) return static_cast<FaultKind>(i);
  }
  return std::nullopt;
}

std::span<const std::string_view> FieldNames() { return kFieldNames; }

bool FieldApplies(FaultKind kind, std::string_view field) {
  if (field == "kind" || field == "at" || field == "duration") return true;
  switch (kind) {
    case FaultKind::kDelay:
    case FaultKind::kMetricsSlow:
      return field == "delay";
    case FaultKind::kStall:
    case FaultKind::kReset:
      return field == "after_chunks";
    case FaultKind::kHttpError:
      return field == "status" || field == "fraction";
    case FaultKind::kSlow:
      return field == "factor";
    case FaultKind::kEventsDrop:
      return field == "fraction" || field == "seed";
    default:
      return false;
  }
}

std::optional<double> ParseDurationText(std::string_view s) {
  struct Unit {
    std::string_view suffix;
    double seconds;
  };
  // Longest suffix first: "ms" before "s", "us" before "s".
  static constexpr Unit kUnits[] = {{"us", 1e-6}, {"ms", 1e-3}, {"s", 1.0}, {"m", 60.0},
                                    {"h", 3600.0}};
  double scale = 1.0;
  for (const Unit& u : kUnits) {
    if (s.size() > u.suffix.size() && s.substr(s.size() - u.suffix.size()) == u.suffix) {
      s.remove_suffix(u.suffix.size());
      scale = u.seconds;
      break;
    }
  }
  if (!s.empty() && s.front() == '+') return std::nullopt;
  std::optional<double> v = ParseNumber(s);
  if (!v || *v < 0) return std::nullopt;
  return *v * scale;
}

std::optional<FaultError> SetField(FaultSpec* spec, std::string_view field,
                                   std::string_view text) {
  if (field == "kind") {
    std::optional<FaultKind> k = FaultKindFromName(text);
    if (!k) {
      std::string known;
      for (std::string_view n : kKindNames) known += (known.empty() ? "" : ", ") + std::string(n);
      return Err(field, "unknown fault kind " + Quote(text) + " (known: " + known + ")");
    }
    spec->kind = *k;
    return std::nullopt;
  }
  if (std::find(std::begin(kFieldNames), std::end(kFieldNames), field) == std::end(kFieldNames)) {
    std::string known;
    for (std::string_view n : kFieldNames) known += (known.empty() ? "" : ", ") + std::string(n);
    return Err(field, "unknown field " + Quote(field) + " (known: " + known + ")");
  }
  if (!FieldApplies(spec->kind, field)) {
    return Err(field, "does not apply to fault kind " + Quote(FaultKindName(spec->kind)));
  }
  auto duration = [&](bool positive) -> std::optional<double> {
    std::optional<double> d = ParseDurationText(text);
    if (d && positive && *d <= 0) return std::nullopt;
    return d;
  };
  if (field == "at") {
    std::optional<double> d = duration(false);
    if (!d) return Err(field, "must be a duration >= 0 such as 10s or 250ms (got " + Quote(text) + ")");
    spec->at_s = *d;
  } else if (field == "duration" || field == "delay") {
    std::optional<double> d = duration(true);
    if (!d) return Err(field, "must be a duration > 0 such as 5s or 250ms (got " + Quote(text) + ")");
    if (field == "duration") {
      spec->duration_s = *d;
    } else {
      spec->delay_s = *d;
    }
  } else if (field == "after_chunks") {
    std::optional<int64_t> n = ParseInteger(text);
    if (!n || *n < 0 || *n > 1000000) {
      return Err(field, "must be an integer from 0 to 1000000 (got " + Quote(text) + ")");
    }
    spec->after_chunks = static_cast<int>(*n);
  } else if (field == "status") {
    std::optional<int64_t> n = ParseInteger(text);
    if (!n || *n < 400 || *n > 599) {
      return Err(field, "must be an HTTP error status from 400 to 599 (got " + Quote(text) + ")");
    }
    spec->status = static_cast<int>(*n);
  } else if (field == "fraction") {
    std::optional<double> v = ParseNumber(text);
    if (!v || *v <= 0 || *v > 1) {
      return Err(field, "must be a number in (0, 1] (got " + Quote(text) + ")");
    }
    spec->fraction = *v;
  } else if (field == "seed") {
    uint64_t v = 0;
    auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
    if (text.empty() || ec != std::errc() || end != text.data() + text.size()) {
      return Err(field, "must be a non-negative integer (got " + Quote(text) + ")");
    }
    spec->seed = v;
  } else {  // factor
    std::optional<double> v = ParseNumber(text);
    if (!v || *v <= 0 || *v > 1e6) {
      return Err(field, "must be a number > 0 (got " + Quote(text) + ")");
    }
    spec->factor = *v;
  }
  return std::nullopt;
}

std::optional<FaultError> Validate(const FaultSpec& spec, std::span<const std::string> set_fields,
                                   bool admin) {
  auto has = [&](std::string_view f) {
    return std::find(set_fields.begin(), set_fields.end(), f) != set_fields.end();
  };
  if (!has("kind")) return Err("kind", "required");
  const std::string kind(FaultKindName(spec.kind));
  if ((spec.kind == FaultKind::kDelay || spec.kind == FaultKind::kMetricsSlow) && !has("delay")) {
    return Err("delay", "required for fault kind '" + kind + "'");
  }
  if (spec.kind == FaultKind::kSlow && !has("factor")) {
    return Err("factor", "required for fault kind 'slow'");
  }
  if (admin) {
    if (has("at")) return Err("at", "not accepted here: an admin fault starts at once");
    if (spec.kind == FaultKind::kCrash && !spec.duration_s) {
      return Err("duration", "required for fault kind 'crash' (the port is closed meanwhile)");
    }
  }
  return std::nullopt;
}

FaultOr ParseFaultJson(std::string_view body) {
  FaultOr out;
  auto fail = [&](std::string field, std::string message) {
    out.error = FaultError{std::move(field), std::move(message)};
    return out;
  };
  simdjson::dom::parser parser;
  simdjson::padded_string padded(body);
  simdjson::dom::element root;
  if (auto ec = parser.parse(padded).get(root)) {
    return fail("", std::string("Invalid JSON body: ") + simdjson::error_message(ec));
  }
  simdjson::dom::object obj;
  if (root.get(obj)) return fail("", "The body must be a JSON object.");

  // The text of a scalar as YAML would hold it: strings as they are, numbers printed.
  auto text_of = [](simdjson::dom::element v, std::string* text) {
    switch (v.type()) {
      case simdjson::dom::element_type::STRING:
        *text = std::string(v.get_string().value_unsafe());
        return true;
      case simdjson::dom::element_type::INT64:
        *text = std::to_string(v.get_int64().value_unsafe());
        return true;
      case simdjson::dom::element_type::UINT64:
        *text = std::to_string(v.get_uint64().value_unsafe());
        return true;
      case simdjson::dom::element_type::DOUBLE:
        *text = fmt::format("{}", v.get_double().value_unsafe());
        return true;
      default:
        return false;
    }
  };

  FaultSpec spec;
  std::vector<std::string> set;
  simdjson::dom::element kind;
  if (obj["kind"].get(kind) || kind.is_null()) return fail("kind", "required");
  std::string_view kind_text;
  if (kind.get_string().get(kind_text)) return fail("kind", "must be a string");
  if (auto e = SetField(&spec, "kind", kind_text)) return fail(e->field, e->message);
  set.emplace_back("kind");
  for (auto [key, value] : obj) {
    if (key == "kind" || value.is_null()) continue;
    const std::string field(key);
    if (std::find(set.begin(), set.end(), field) != set.end()) {
      return fail(field, "duplicate field");
    }
    std::string text;
    if (!text_of(value, &text)) return fail(field, "must be a string or a number");
    if (auto e = SetField(&spec, field, text)) return fail(e->field, e->message);
    set.push_back(field);
  }
  if (auto e = Validate(spec, set, /*admin=*/true)) return fail(e->field, e->message);
  out.spec = spec;
  return out;
}

bool ActiveAt(const FaultSpec& spec, double t_s) {
  if (t_s < spec.at_s) return false;
  if (spec.kind == FaultKind::kRestart && !spec.duration_s) return false;
  return !spec.duration_s || t_s < spec.at_s + *spec.duration_s;
}

std::vector<std::size_t> ActiveAt(std::span<const FaultSpec> schedule, double t_s) {
  std::vector<std::size_t> out;
  for (std::size_t i = 0; i < schedule.size(); ++i) {
    if (ActiveAt(schedule[i], t_s)) out.push_back(i);
  }
  return out;
}

const ActiveFault* FaultSet::Activate(const FaultSpec& spec, double now_s) {
  auto& slot = faults_[static_cast<size_t>(spec.kind)];
  if (spec.kind == FaultKind::kRestart && !spec.duration_s) {
    slot.reset();
    return nullptr;
  }
  ActiveFault a;
  a.spec = spec;
  a.since_s = now_s;
  if (spec.duration_s) a.until_s = now_s + *spec.duration_s;
  slot = a;
  return &*slot;
}

bool FaultSet::Clear(FaultKind kind) {
  auto& slot = faults_[static_cast<size_t>(kind)];
  const bool was = slot.has_value();
  slot.reset();
  return was;
}

std::vector<FaultKind> FaultSet::ClearAll() {
  std::vector<FaultKind> out;
  for (size_t i = 0; i < faults_.size(); ++i) {
    if (faults_[i]) out.push_back(static_cast<FaultKind>(i));
    faults_[i].reset();
  }
  return out;
}

std::vector<FaultKind> FaultSet::Expire(double now_s) {
  std::vector<FaultKind> out;
  for (size_t i = 0; i < faults_.size(); ++i) {
    if (faults_[i] && faults_[i]->until_s && *faults_[i]->until_s <= now_s) {
      faults_[i].reset();
      out.push_back(static_cast<FaultKind>(i));
    }
  }
  return out;
}

std::optional<double> FaultSet::NextExpiry() const {
  std::optional<double> next;
  for (const auto& f : faults_) {
    if (f && f->until_s && (!next || *f->until_s < *next)) next = f->until_s;
  }
  return next;
}

const ActiveFault* FaultSet::Find(FaultKind kind) const {
  const auto& slot = faults_[static_cast<size_t>(kind)];
  return slot ? &*slot : nullptr;
}

bool FaultSet::empty() const {
  return std::none_of(faults_.begin(), faults_.end(), [](const auto& f) { return f.has_value(); });
}

bool FaultSet::TakeHttpError() {
  auto& slot = faults_[static_cast<size_t>(FaultKind::kHttpError)];
  if (!slot) return false;
  const uint64_t k = ++slot->requests_seen;
  const double f = slot->spec.fraction;
  // A small epsilon keeps k * 0.1 == 1 (and the like) from landing just below an integer.
  const bool fail = std::floor(static_cast<double>(k) * f + 1e-9) >
                    std::floor(static_cast<double>(k - 1) * f + 1e-9);
  if (fail) ++slot->requests_failed;
  return fail;
}

bool FaultSet::DropsEventBatch(uint64_t seq) const {
  const auto& slot = faults_[static_cast<size_t>(FaultKind::kEventsDrop)];
  if (!slot) return false;
  if (slot->spec.fraction >= 1.0) return true;
  uint64_t x = slot->spec.seed ^ (seq * 0x9e3779b97f4a7c15ULL);  // SplitMix64 finaliser
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  x ^= x >> 31;
  return static_cast<double>(x >> 11) * 0x1.0p-53 < slot->spec.fraction;
}

std::string FaultSet::ToJson(double now_s) const {
  std::string out = "{\"active\":[";
  bool first = true;
  for (const auto& f : faults_) {
    if (!f) continue;
    if (!first) out += ',';
    first = false;
    const FaultSpec& s = f->spec;
    out += "{\"kind\":";
    api::AppendJsonString(out, FaultKindName(s.kind));
    out += fmt::format(",\"since_s\":{:.3f}", std::max(0.0, now_s - f->since_s));
    if (f->until_s) {
      out += fmt::format(",\"remaining_s\":{:.3f}", std::max(0.0, *f->until_s - now_s));
    } else {
      out += ",\"remaining_s\":null";
    }
    if (s.duration_s) out += fmt::format(",\"duration_s\":{}", *s.duration_s);
    switch (s.kind) {
      case FaultKind::kDelay:
      case FaultKind::kMetricsSlow:
        out += fmt::format(",\"delay_s\":{}", s.delay_s);
        break;
      case FaultKind::kStall:
      case FaultKind::kReset:
        out += fmt::format(",\"after_chunks\":{}", s.after_chunks);
        break;
      case FaultKind::kHttpError:
        out += fmt::format(",\"status\":{},\"fraction\":{},\"requests_seen\":{},"
                           "\"requests_failed\":{}",
                           s.status, s.fraction, f->requests_seen, f->requests_failed);
        break;
      case FaultKind::kSlow:
        out += fmt::format(",\"factor\":{}", s.factor);
        break;
      case FaultKind::kEventsDrop:
        out += fmt::format(",\"fraction\":{},\"seed\":{}", s.fraction, s.seed);
        break;
      default:
        break;
    }
    out += '}';
  }
  out += "]}";
  return out;
}

}  // namespace kvroute::fault
