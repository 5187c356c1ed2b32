#include "adapters/k8s/objects/objects.h"

#include <charconv>

#include <simdjson.h>

#include <algorithm>
#include <limits>

#include "core/common/enum_names.h"

namespace kvroute::k8s {
namespace {

// The names of selector operators and watch event types, as the API writes them (both
// directions: the decoders read them, the *Name functions write them).
constexpr EnumName<SelectorRequirement::Op> kSelectorOps[] = {
    {SelectorRequirement::Op::kIn, "In"},
    {SelectorRequirement::Op::kNotIn, "NotIn"},
    {SelectorRequirement::Op::kExists, "Exists"},
    {SelectorRequirement::Op::kDoesNotExist, "DoesNotExist"}};
constexpr EnumName<WatchEventType> kWatchEventTypes[] = {{WatchEventType::kAdded, "ADDED"},
                                                         {WatchEventType::kModified, "MODIFIED"},
                                                         {WatchEventType::kDeleted, "DELETED"},
                                                         {WatchEventType::kBookmark, "BOOKMARK"},
                                                         {WatchEventType::kError, "ERROR"}};

using simdjson::dom::array;
using simdjson::dom::element;
using simdjson::dom::object;

Status FieldError(const std::string& path, std::string_view what) {
  std::string m = path;
  m += ": ";
  m += what;
  return Status::InvalidArgument(std::move(m));
}

std::string Join(const std::string& path, std::string_view key) {
  if (path.empty()) return std::string(key);
  std::string p = path;
  p += '.';
  p += key;
  return p;
}

// The thread's parser. The elements it returns live until that thread's next Parse, so
// everything below decodes from one parse into owned strings before returning.
Result<element> Parse(std::string_view json) {
  thread_local simdjson::dom::parser parser;
  element root;
  if (auto ec = parser.parse(json.data(), json.size(), /*realloc_if_needed=*/true).get(root)) {
    return Status::InvalidArgument(std::string("not valid JSON: ") + simdjson::error_message(ec));
  }
  return root;
}

// Looks up `key` in `obj`. Absent and null both read as "not there" (Kubernetes writes
// null for unset pointers, e.g. "deletionTimestamp": null).
bool Lookup(object obj, std::string_view key, element& out) {
  if (obj[key].get(out) != simdjson::SUCCESS) return false;
  return !out.is_null();
}

// Optional string field: "" when absent; an error when present and not a string.
Status OptString(object obj, std::string_view key, const std::string& path, std::string& out) {
  element e;
  if (!Lookup(obj, key, e)) return Status::Ok();
  std::string_view s;
  if (e.get_string().get(s)) return FieldError(Join(path, key), "not a string");
  out.assign(s);
  return Status::Ok();
}

// Optional field of JSON type T (an object or an array): `present` false when absent; an
// error, "not <what>", when present and of another type.
template <class T>
Status OptContainer(object obj, std::string_view key, const std::string& path, T& out,
                    bool& present, std::string_view what) {
  present = false;
  element e;
  if (!Lookup(obj, key, e)) return Status::Ok();
  if (e.get(out)) return FieldError(Join(path, key), "not " + std::string(what));
  present = true;
  return Status::Ok();
}

Status OptObject(object obj, std::string_view key, const std::string& path, object& out,
                 bool& present) {
  return OptContainer(obj, key, path, out, present, "an object");
}

Status OptArray(object obj, std::string_view key, const std::string& path, array& out,
                bool& present) {
  return OptContainer(obj, key, path, out, present, "an array");
}

// Calls read(obj, path[i]) for each element of `list`, in order, each of which must be an
// object; stops at the first error.
template <class Read>
Status ForEachObject(array list, const std::string& path, Read read) {
  std::size_t i = 0;
  for (element item : list) {
    const std::string ipath = path + "[" + std::to_string(i++) + "]";
    object obj;
    if (item.get_object().get(obj)) return FieldError(ipath, "not an object");
    if (Status s = read(obj, ipath); !s.ok()) return s;
  }
  return Status::Ok();
}

Status ReadPort(element e, const std::string& path, uint16_t& out) {
  int64_t n = 0;
  if (e.get_int64().get(n)) return FieldError(path, "not an integer");
  if (n < 1 || n > 65535) return FieldError(path, "not a port (1..65535)");
  out = static_cast<uint16_t>(n);
  return Status::Ok();
}

Status OptPort(object obj, std::string_view key, const std::string& path, uint16_t& out) {
  element e;
  if (!Lookup(obj, key, e)) return Status::Ok();
  return ReadPort(e, Join(path, key), out);
}

// A map of string to string (labels, a v1alpha2 selector, matchLabels), sorted by key.
Status ReadStringMap(object obj, const std::string& path, Labels& out) {
  out.clear();
  for (auto field : obj) {
    std::string_view value;
    if (field.value.get_string().get(value)) {
      return FieldError(Join(path, field.key), "not a string");
    }
    out.emplace_back(std::string(field.key), std::string(value));
  }
  std::sort(out.begin(), out.end());
  // JSON allows a repeated key; the API server never writes one, so one means the input
  // is not what it claims to be.
  for (std::size_t i = 1; i < out.size(); ++i) {
    if (out[i].first == out[i - 1].first) {
      return FieldError(Join(path, out[i].first), "repeated key");
    }
  }
  return Status::Ok();
}

Status ReadSelectorOp(std::string_view name, const std::string& path,
                      SelectorRequirement::Op& op) {
  if (std::optional<SelectorRequirement::Op> found = ValueOf(kSelectorOps, name)) {
    op = *found;
    return Status::Ok();
  }
  // Gt and Lt exist for node selectors only; a LabelSelector never has them.
  return FieldError(path, "unknown operator \"" + std::string(name) +
                              "\" (want In, NotIn, Exists or DoesNotExist)");
}

// spec.selector.matchExpressions: [{key, operator, values}], appended in the order given.
Status ReadExpressions(array list, const std::string& path,
                       std::vector<SelectorRequirement>& out) {
  return ForEachObject(list, path, [&](object obj, const std::string& ipath) -> Status {
    SelectorRequirement req;
    if (Status s = OptString(obj, "key", ipath, req.key); !s.ok()) return s;
    if (req.key.empty()) return FieldError(Join(ipath, "key"), "missing");
    std::string op;
    if (Status s = OptString(obj, "operator", ipath, op); !s.ok()) return s;
    if (op.empty()) return FieldError(Join(ipath, "operator"), "missing");
    if (Status s = ReadSelectorOp(op, Join(ipath, "operator"), req.op); !s.ok()) return s;
    array values;
    bool present = false;
    const std::string vpath = Join(ipath, "values");
    if (Status s = OptArray(obj, "values", ipath, values, present); !s.ok()) return s;
    if (present) {
      std::size_t j = 0;
      for (element v : values) {
        std::string_view value;
        if (v.get_string().get(value)) {
          return FieldError(vpath + "[" + std::to_string(j) + "]", "not a string");
        }
        ++j;
        req.values.emplace_back(value);
      }
    }
    std::sort(req.values.begin(), req.values.end());
    req.values.erase(std::unique(req.values.begin(), req.values.end()), req.values.end());
    const bool wants_values =
        req.op == SelectorRequirement::Op::kIn || req.op == SelectorRequirement::Op::kNotIn;
    if (wants_values && req.values.empty()) {
      return FieldError(vpath, "empty (" + op + " needs at least one value)");
    }
    if (!wants_values && !req.values.empty()) {
      return FieldError(vpath, "not empty (" + op + " takes no values)");
    }
    out.push_back(std::move(req));
    return Status::Ok();
  });
}

Status ReadMeta(object obj, const std::string& path, bool name_required, ObjectMeta& meta) {
  object m;
  bool present = false;
  const std::string mpath = Join(path, "metadata");
  if (Status s = OptObject(obj, "metadata", path, m, present); !s.ok()) return s;
  if (!present) {
    if (name_required) return FieldError(mpath, "missing");
    return Status::Ok();
  }
  if (Status s = OptString(m, "name", mpath, meta.name); !s.ok()) return s;
  if (name_required && meta.name.empty()) return FieldError(Join(mpath, "name"), "missing");
  if (Status s = OptString(m, "namespace", mpath, meta.namespace_name); !s.ok()) return s;
  if (Status s = OptString(m, "resourceVersion", mpath, meta.resource_version); !s.ok()) {
    return s;
  }
  object labels;
  if (Status s = OptObject(m, "labels", mpath, labels, present); !s.ok()) return s;
  if (present) {
    if (Status s = ReadStringMap(labels, Join(mpath, "labels"), meta.labels); !s.ok()) return s;
  }
  std::string deletion;
  if (Status s = OptString(m, "deletionTimestamp", mpath, deletion); !s.ok()) return s;
  meta.being_deleted = !deletion.empty();
  return Status::Ok();
}

// "8000, 8001,x": the port numbers 1-65535 among the comma-separated entries.
std::vector<uint16_t> ParsePortList(std::string_view text) {
  std::vector<uint16_t> out;
  while (!text.empty()) {
    const std::size_t comma = text.find(',');
    std::string_view item = text.substr(0, comma);
    while (!item.empty() && item.front() == ' ') item.remove_prefix(1);
    while (!item.empty() && item.back() == ' ') item.remove_suffix(1);
    unsigned v = 0;
    auto [end, ec] = std::from_chars(item.data(), item.data() + item.size(), v);
    if (!item.empty() && ec == std::errc() && end == item.data() + item.size() && v >= 1 && v <= 65535) {
      out.push_back(static_cast<uint16_t>(v));
    }
    if (comma == std::string_view::npos) break;
    text.remove_prefix(comma + 1);
  }
  return out;
}

Status ReadPod(element e, const std::string& path, Pod& pod) {
  object obj;
  if (e.get_object().get(obj)) return FieldError(path.empty() ? "pod" : path, "not an object");
  if (Status s = ReadMeta(obj, path, /*name_required=*/true, pod.meta); !s.ok()) return s;
  object status;
  bool present = false;
  {
    object m, annotations;
    const std::string mpath = Join(path, "metadata");
    if (Status s = OptObject(obj, "metadata", path, m, present); !s.ok()) return s;
    if (present) {
      if (Status s = OptObject(m, "annotations", mpath, annotations, present); !s.ok()) return s;
    }
    if (present) {
      Labels a;
      if (Status s = ReadStringMap(annotations, Join(mpath, "annotations"), a); !s.ok()) return s;
      for (std::string_view key : {kActivePortsAnnotation, kActivePortsAnnotationOld}) {
        auto it = std::find_if(a.begin(), a.end(), [&](const auto& kv) { return kv.first == key; });
        if (it == a.end()) continue;
        pod.active_ports = ParsePortList(it->second);
        break;
      }
    }
  }
  if (Status s = OptObject(obj, "status", path, status, present); !s.ok() || !present) return s;
  const std::string spath = Join(path, "status");
  if (Status s = OptString(status, "podIP", spath, pod.ip); !s.ok()) return s;
  if (Status s = OptString(status, "phase", spath, pod.phase); !s.ok()) return s;
  array conditions;
  if (Status s = OptArray(status, "conditions", spath, conditions, present); !s.ok() || !present) {
    return s;
  }
  std::size_t i = 0;
  for (element c : conditions) {
    const std::string cpath = Join(spath, "conditions[" + std::to_string(i++) + "]");
    object cond;
    if (c.get_object().get(cond)) return FieldError(cpath, "not an object");
    std::string type, value;
    if (Status s = OptString(cond, "type", cpath, type); !s.ok()) return s;
    if (Status s = OptString(cond, "status", cpath, value); !s.ok()) return s;
    if (type == "Ready") pod.ready = value == "True";
  }
  return Status::Ok();
}

Status ReadPool(element e, const std::string& path, InferencePool& pool) {
  const std::string opath = path.empty() ? "inferencepool" : path;
  object obj;
  if (e.get_object().get(obj)) return FieldError(opath, "not an object");
  if (Status s = ReadMeta(obj, path, /*name_required=*/true, pool.meta); !s.ok()) return s;
  object spec;
  bool present = false;
  if (Status s = OptObject(obj, "spec", path, spec, present); !s.ok()) return s;
  const std::string spath = Join(path, "spec");
  if (!present) return FieldError(spath, "missing");

  std::string api_version;
  if (Status s = OptString(obj, "apiVersion", path, api_version); !s.ok()) return s;
  if (api_version == kPoolApiV1) {
    pool.api_version = PoolApiVersion::kV1;
  } else if (api_version == kPoolApiV1Alpha2) {
    pool.api_version = PoolApiVersion::kV1Alpha2;
  } else if (api_version.empty()) {
    element probe;
    pool.api_version = Lookup(spec, "targetPortNumber", probe) ? PoolApiVersion::kV1Alpha2
                                                               : PoolApiVersion::kV1;
  } else {
    return FieldError(Join(path, "apiVersion"),
                      "unknown InferencePool version \"" + api_version + "\" (want " +
                          std::string(kPoolApiV1) + " or " + std::string(kPoolApiV1Alpha2) + ")");
  }

  object selector;
  if (Status s = OptObject(spec, "selector", spath, selector, present); !s.ok()) return s;
  const std::string selpath = Join(spath, "selector");
  if (!present) return FieldError(selpath, "missing");
  object ref;
  std::string ref_path;
  bool have_ref = false;
  if (pool.api_version == PoolApiVersion::kV1) {
    object match;
    bool have_labels = false;
    if (Status s = OptObject(selector, "matchLabels", selpath, match, have_labels); !s.ok()) {
      return s;
    }
    if (have_labels) {
      if (Status s = ReadStringMap(match, Join(selpath, "matchLabels"), pool.selector); !s.ok()) {
        return s;
      }
    }
    array expressions;
    bool have_expressions = false;
    if (Status s = OptArray(selector, "matchExpressions", selpath, expressions, have_expressions);
        !s.ok()) {
      return s;
    }
    if (have_expressions) {
      if (Status s = ReadExpressions(expressions, Join(selpath, "matchExpressions"),
                                     pool.selector_expressions);
          !s.ok()) {
        return s;
      }
    }
    // Neither key: most likely a v1alpha2-style plain map under a v1 apiVersion.
    if (!have_labels && !have_expressions) {
      return FieldError(selpath, "no matchLabels or matchExpressions");
    }
    array ports;
    if (Status s = OptArray(spec, "targetPorts", spath, ports, present); !s.ok()) return s;
    const std::string ppath = Join(spath, "targetPorts");
    if (!present) return FieldError(ppath, "missing");
    Status read_ports =
        ForEachObject(ports, ppath, [&](object port, const std::string& ipath) {
          element number;
          if (!Lookup(port, "number", number)) return FieldError(Join(ipath, "number"), "missing");
          uint16_t n = 0;
          if (Status s = ReadPort(number, Join(ipath, "number"), n); !s.ok()) return s;
          if (std::find(pool.target_ports.begin(), pool.target_ports.end(), n) !=
              pool.target_ports.end()) {
            return FieldError(Join(ipath, "number"), "repeated port " + std::to_string(n));
          }
          pool.target_ports.push_back(n);
          return Status::Ok();
        });
    if (!read_ports.ok()) return read_ports;
    if (pool.target_ports.empty()) return FieldError(ppath, "empty");
    if (Status s = OptObject(spec, "endpointPickerRef", spath, ref, have_ref); !s.ok()) return s;
    ref_path = Join(spath, "endpointPickerRef");
  } else {
    if (Status s = ReadStringMap(selector, selpath, pool.selector); !s.ok()) return s;
    element number;
    const std::string ppath = Join(spath, "targetPortNumber");
    if (!Lookup(spec, "targetPortNumber", number)) return FieldError(ppath, "missing");
    uint16_t n = 0;
    if (Status s = ReadPort(number, ppath, n); !s.ok()) return s;
    pool.target_ports.push_back(n);
    if (Status s = OptObject(spec, "extensionRef", spath, ref, have_ref); !s.ok()) return s;
    ref_path = Join(spath, "extensionRef");
  }
  // An empty selector would select every pod in the namespace: refuse rather than route
  // to whatever happens to run there.
  if (pool.selector.empty() && pool.selector_expressions.empty()) {
    return FieldError(selpath, "selects nothing (no labels)");
  }

  if (have_ref) {
    if (Status s = OptString(ref, "name", ref_path, pool.picker_name); !s.ok()) return s;
    if (Status s = OptString(ref, "failureMode", ref_path, pool.failure_mode); !s.ok()) return s;
    if (pool.api_version == PoolApiVersion::kV1) {
      object port;
      if (Status s = OptObject(ref, "port", ref_path, port, present); !s.ok()) return s;
      if (present) {
        if (Status s = OptPort(port, "number", Join(ref_path, "port"), pool.picker_port);
            !s.ok()) {
          return s;
        }
      }
    } else {
      if (Status s = OptPort(ref, "portNumber", ref_path, pool.picker_port); !s.ok()) return s;
    }
  }
  return Status::Ok();
}

Status ObjectiveGroupFor(std::string_view api_version, const std::string& path,
                         ObjectiveApiGroup& group) {
  if (api_version == kObjectiveApiLlmD) {
    group = ObjectiveApiGroup::kLlmD;
  } else if (api_version == kObjectiveApiXK8s) {
    group = ObjectiveApiGroup::kXK8s;
  } else {
    return FieldError(path, "unknown InferenceObjective version \"" + std::string(api_version) +
                                "\" (want " + std::string(kObjectiveApiLlmD) + " or " +
                                std::string(kObjectiveApiXK8s) + ")");
  }
  return Status::Ok();
}

// `list_api_version` is the enclosing list's apiVersion ("" for a lone object or when the
// list has none); an item without its own takes it, and an unknown one is reported at the
// list's field.
Status ReadObjective(element e, const std::string& path, std::string_view list_api_version,
                     InferenceObjective& out) {
  object obj;
  if (e.get_object().get(obj)) {
    return FieldError(path.empty() ? "inferenceobjective" : path, "not an object");
  }
  if (Status s = ReadMeta(obj, path, /*name_required=*/true, out.meta); !s.ok()) return s;
  std::string api_version;
  if (Status s = OptString(obj, "apiVersion", path, api_version); !s.ok()) return s;
  if (!api_version.empty()) {
    if (Status s = ObjectiveGroupFor(api_version, Join(path, "apiVersion"), out.group); !s.ok()) {
      return s;
    }
  } else if (!list_api_version.empty()) {
    if (Status s = ObjectiveGroupFor(list_api_version, "apiVersion", out.group); !s.ok()) {
      return s;
    }
  } else {
    // Without it the two groups cannot be told apart, and they are followed separately.
    return FieldError(Join(path, "apiVersion"), "missing");
  }

  object spec;
  bool present = false;
  const std::string spath = Join(path, "spec");
  if (Status s = OptObject(obj, "spec", path, spec, present); !s.ok()) return s;
  if (!present) return FieldError(spath, "missing");
  element priority;
  if (Lookup(spec, "priority", priority)) {
    const std::string ppath = Join(spath, "priority");
    // A number too large for int64 parses as UINT64; it is out of range, not malformed.
    if (priority.type() == simdjson::dom::element_type::UINT64) {
      return FieldError(ppath, "outside int32");
    }
    int64_t n = 0;
    if (priority.get_int64().get(n)) return FieldError(ppath, "not an integer");
    if (n < std::numeric_limits<int32_t>::min() || n > std::numeric_limits<int32_t>::max()) {
      return FieldError(ppath, "outside int32");
    }
    out.priority = n;
    out.has_priority = true;
  }
  object ref;
  if (Status s = OptObject(spec, "poolRef", spath, ref, present); !s.ok()) return s;
  if (present) {
    const std::string rpath = Join(spath, "poolRef");
    if (Status s = OptString(ref, "name", rpath, out.pool_ref_name); !s.ok()) return s;
    if (out.pool_ref_name.empty()) return FieldError(Join(rpath, "name"), "missing");
    if (Status s = OptString(ref, "group", rpath, out.pool_ref_group); !s.ok()) return s;
    std::string kind;
    if (Status s = OptString(ref, "kind", rpath, kind); !s.ok()) return s;
  }
  return Status::Ok();
}

Status ReadStatus(element e, const std::string& path, ApiStatus& out) {
  object obj;
  if (e.get_object().get(obj)) return FieldError(path.empty() ? "status" : path, "not an object");
  element code;
  if (Lookup(obj, "code", code)) {
    if (code.get_int64().get(out.code)) return FieldError(Join(path, "code"), "not an integer");
  }
  if (Status s = OptString(obj, "reason", path, out.reason); !s.ok()) return s;
  return OptString(obj, "message", path, out.message);
}

// The envelope of a watch line: its type and its object. `object` is left pointing into
// the thread's parser.
Status ReadEnvelope(std::string_view line, WatchEventType& type, element& object_out) {
  Result<element> root = Parse(line);
  if (!root.ok()) return root.status();
  object obj;
  if (root->get_object().get(obj)) return FieldError("watch event", "not an object");
  std::string t;
  if (Status s = OptString(obj, "type", "", t); !s.ok()) return s;
  if (t.empty()) return FieldError("type", "missing");
  std::optional<WatchEventType> found = ValueOf(kWatchEventTypes, t);
  if (!found) return FieldError("type", "unknown watch event type \"" + t + "\"");
  type = *found;
  if (!Lookup(obj, "object", object_out)) return FieldError("object", "missing");
  return Status::Ok();
}

// A bookmark's object carries only metadata.resourceVersion (its kind's other fields are
// empty); a bookmark without one is useless to the caller, so it is an error.
Status ReadBookmark(element e, ObjectMeta& meta) {
  object obj;
  if (e.get_object().get(obj)) return FieldError("object", "not an object");
  if (Status s = ReadMeta(obj, "object", /*name_required=*/false, meta); !s.ok()) return s;
  if (meta.resource_version.empty()) {
    return FieldError("object.metadata.resourceVersion", "missing in a BOOKMARK");
  }
  return Status::Ok();
}

// One object of the API from its JSON: `read(element, path, out)`.
template <typename T, typename Read>
Result<T> DecodeOne(std::string_view json, Read read) {
  Result<element> root = Parse(json);
  if (!root.ok()) return root.status();
  T out;
  if (Status s = read(*root, "", out); !s.ok()) return s;
  return out;
}

// The list envelope every collection shares: metadata.resourceVersion and items, each item
// read by `read(element, "items[i]", list_api_version, item)`. `what` names the list when
// it is not an object; the list's apiVersion is read (and must be a string) only when
// `with_api_version` (items without their own take it). "items": null or absent is empty.
// Any item that does not decode rejects the whole list: a partial list would silently
// drop objects.
template <typename List, typename Read>
Result<List> DecodeList(std::string_view json, std::string_view what, bool with_api_version, Read read) {
  Result<element> root = Parse(json);
  if (!root.ok()) return root.status();
  object obj;
  if (root->get_object().get(obj)) return FieldError(std::string(what), "not an object");
  List list;
  object meta;
  bool present = false;
  if (Status s = OptObject(obj, "metadata", "", meta, present); !s.ok()) return s;
  if (present) {
    if (Status s = OptString(meta, "resourceVersion", "metadata", list.resource_version); !s.ok()) return s;
  }
  std::string api_version;
  if (with_api_version) {
    if (Status s = OptString(obj, "apiVersion", "", api_version); !s.ok()) return s;
  }
  array items;
  if (Status s = OptArray(obj, "items", "", items, present); !s.ok()) return s;
  if (!present) return list;
  std::size_t i = 0;
  for (element item : items) {
    typename decltype(list.items)::value_type value;
    if (Status s = read(item, "items[" + std::to_string(i++) + "]", api_version, value); !s.ok()) return s;
    list.items.push_back(std::move(value));
  }
  return list;
}

// One line of a watch: its envelope, then BOOKMARK's metadata, ERROR's Status, or the
// object itself (ADDED, MODIFIED, DELETED), read by `read` into event.*object.
template <class Event, class Object, class Read>
Result<Event> DecodeEvent(std::string_view line, Object Event::*object, Read read) {
  Event event;
  element obj;
  if (Status s = ReadEnvelope(line, event.type, obj); !s.ok()) return s;
  Status s;
  switch (event.type) {
    case WatchEventType::kBookmark: s = ReadBookmark(obj, (event.*object).meta); break;
    case WatchEventType::kError: s = ReadStatus(obj, "object", event.status); break;
    default: s = read(obj, "object", event.*object); break;
  }
  if (!s.ok()) return s;
  return event;
}

}  // namespace

std::string_view SelectorOpName(SelectorRequirement::Op op) {
  return NameOf(kSelectorOps, op, "Unknown");
}

std::string_view WatchEventTypeName(WatchEventType type) {
  return NameOf(kWatchEventTypes, type, "UNKNOWN");
}

Result<PodList> DecodePodList(std::string_view json) {
  return DecodeList<PodList>(json, "pod list", false,
                             [](element e, const std::string& path, std::string_view, Pod& pod) {
                               return ReadPod(e, path, pod);
                             });
}

Result<InferencePoolList> DecodeInferencePoolList(std::string_view json) {
  return DecodeList<InferencePoolList>(
      json, "InferencePool list", false,
      [](element e, const std::string& path, std::string_view, InferencePool& pool) {
        return ReadPool(e, path, pool);
      });
}

Result<Pod> DecodePod(std::string_view json) { return DecodeOne<Pod>(json, ReadPod); }

Result<InferencePool> DecodeInferencePool(std::string_view json) {
  return DecodeOne<InferencePool>(json, ReadPool);
}

Result<ApiStatus> DecodeStatus(std::string_view json) { return DecodeOne<ApiStatus>(json, ReadStatus); }

Result<PodEvent> DecodePodEvent(std::string_view line) {
  return DecodeEvent(line, &PodEvent::pod, ReadPod);
}

Result<PoolEvent> DecodePoolEvent(std::string_view line) {
  return DecodeEvent(line, &PoolEvent::pool, ReadPool);
}

Result<InferenceObjective> DecodeInferenceObjective(std::string_view json) {
  return DecodeOne<InferenceObjective>(
      json, [](element e, const std::string& path, InferenceObjective& o) { return ReadObjective(e, path, "", o); });
}

Result<ObjectiveList> DecodeObjectiveList(std::string_view json) {
  return DecodeList<ObjectiveList>(json, "objective list", true, ReadObjective);
}

Result<ObjectiveEvent> DecodeObjectiveEvent(std::string_view line) {
  return DecodeEvent(line, &ObjectiveEvent::objective,
                     [](element e, const std::string& path, InferenceObjective& o) {
                       return ReadObjective(e, path, "", o);
                     });
}

Status WatchErrorStatus(std::string_view resource, const ApiStatus& status, bool& relist) {
  std::string m(resource);
  m += " watch: ERROR ";
  m += std::to_string(status.code);
  if (!status.reason.empty()) m += " " + status.reason;
  if (!status.message.empty()) m += ": " + status.message;
  if (status.gone()) {
    relist = true;
    m += " (resourceVersion expired: relist)";
    return Status::FailedPrecondition(std::move(m));
  }
  return Status::Unavailable(std::move(m));
}

}  // namespace kvroute::k8s
