#include "config/endpoints_file.h"

#include <map>
#include <optional>
#include <string>
#include <utility>

namespace kvroute::config {

namespace {

std::string Join(const std::string& path, std::string_view key) {
  return path.empty() ? std::string(key) : path + "." + std::string(key);
}

HostPort Address(const ConfigNode& at, const std::string& s, const std::string& field, int line) {
  std::string why;
  std::optional<HostPort> hp = ParseHostPort(s, &why);
  if (!hp) at.FailAt(line, field, "bad address '" + s + "': " + why);
  return *hp;
}

}  // namespace

void ReadEndpoints(const ConfigNode& list, std::vector<EndpointConfig>& out) {
  std::map<std::string, int> names, addresses;
  for (const ConfigNode& item : list.Items("a list of endpoints")) {
    EndpointConfig ep;
    ep.line = item.line();
    int address_line = ep.line;
    std::string address_field = item.field();
    if (item.IsScalar()) {
      ep.address = item.Scalar();
    } else {
      if (!item.IsMap()) item.Fail("must be an address or a mapping");
      int replay_line = 0;
      item.ForEachKey({"address", "name", "labels", "kv_events", "kv_events_replay"},
                      [&](const std::string& key, const ConfigNode& ev) {
                        if (key == "kv_events" || key == "kv_events_replay") {
                          std::string url = ev.String();
                          if (Status st = CheckKvEventsUrl(url, /*bind=*/false); !st.ok()) ev.Fail(st.message());
                          if (key == "kv_events") {
                            ep.kv_events = std::move(url);
                          } else {
                            ep.kv_events_replay = std::move(url);
                            replay_line = ev.key_line();
                          }
                        } else if (key == "address") {
                          ep.address = ev.String();
                          address_line = ev.line();
                        } else if (key == "name") {
                          ep.name = ev.String();
                          if (ep.name.empty()) ev.Fail("must not be empty");
                        } else {
                          for (const ConfigNode& l : ev.Entries()) ep.labels[l.key()] = l.String();
                        }
                      });
      if (!ep.kv_events_replay.empty() && ep.kv_events.empty()) {
        item.FailAt(replay_line, Join(item.field(), "kv_events_replay"), "kv_events_replay needs kv_events");
      }
      address_field = Join(item.field(), "address");
      if (ep.address.empty()) item.FailAt(ep.line, address_field, "missing address");
    }
    // A scheme says how to speak to it: https:// is TLS, http:// (or none) plain.
    std::string_view bare = ep.address;
    if (bare.rfind("https://", 0) == 0) {
      ep.tls = true;
      bare.remove_prefix(8);
    } else if (bare.rfind("http://", 0) == 0) {
      bare.remove_prefix(7);
    } else if (bare.find("://") != std::string_view::npos) {
      item.FailAt(address_line, address_field,
                  "bad address '" + ep.address + "': the scheme must be http:// or https://");
    }
    if (!bare.empty() && bare.back() == '/') bare.remove_suffix(1);
    ep.host_port = Address(item, std::string(bare), address_field, address_line);
    if (ep.name.empty()) ep.name = ep.address;
    // The address first: with names defaulted to addresses, a repeated address would
    // otherwise read as a repeated name.
    if (auto [it, fresh] = addresses.emplace(ep.host_port.ToString(), ep.line); !fresh) {
      item.FailAt(address_line, item.field(),
                  "duplicate endpoint address '" + ep.address + "' (first at line " +
                      std::to_string(it->second) + ")");
    }
    if (auto [it, fresh] = names.emplace(ep.name, ep.line); !fresh) {
      item.FailAt(ep.line, item.field(),
                  "duplicate endpoint name '" + ep.name + "' (first at line " +
                      std::to_string(it->second) + ")");
    }
    out.push_back(std::move(ep));
  }
}

ConfigOr<std::vector<EndpointConfig>> ParseEndpointsFile(std::string_view text,
                                                         std::string_view filename) {
  ConfigOr<std::vector<EndpointConfig>> r = ParseYaml<std::vector<EndpointConfig>>(
      text, filename, [](const ConfigNode& root) {
        std::vector<EndpointConfig> out;
        ReadEndpoints(root, out);
        return out;
      });
  // The document is the list: its items' paths start "[i]"; name the list so the field
  // reads like the router config's ("endpoints[1].address").
  if (!r.ok() && !r.error.field.empty() && r.error.field.front() == '[') {
    r.error.field = "endpoints" + r.error.field;
  } else if (!r.ok() && r.error.field.empty() && r.error.message == "must be a list of endpoints") {
    r.error.field = "endpoints";
  }
  return r;
}

}  // namespace kvroute::config
