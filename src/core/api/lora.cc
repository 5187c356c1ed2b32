#include "core/api/lora.h"

#include <simdjson.h>

#include <tuple>

namespace kvroute::api {
namespace {

// `body` as a JSON object (this thread's parser: valid until its next use), or false with
// the 400 saying why.
bool ParseObject(std::string_view body, simdjson::dom::object* obj, std::string* error) {
  thread_local simdjson::dom::parser parser;
  simdjson::dom::element root;
  if (auto ec = parser.parse(body.data(), body.size(), /*realloc_if_needed=*/true).get(root)) {
    *error = std::string("Invalid JSON body: ") + simdjson::error_message(ec);
    return false;
  }
  if (root.get_object().get(*obj)) {
    *error = "Request body must be a JSON object";
    return false;
  }
  return true;
}

// Reads `key` of `obj` as a string into `*out`: "" on success, else the message. Absent
// or null is "is required" when `required`, else leaves `*out` empty.
std::string ReadString(simdjson::dom::object obj, std::string_view key, bool required,
                       std::size_t max_bytes, std::string* out) {
  simdjson::dom::element v;
  if (obj[key].get(v) || v.is_null()) {
    return required ? std::string(key) + " is required" : std::string();
  }
  std::string_view s;
  if (v.get_string().get(s)) return std::string(key) + " must be a string";
  if (required && s.empty()) return std::string(key) + " must not be empty";
  if (s.size() > max_bytes) {
    return std::string(key) + " must be at most " + std::to_string(max_bytes) + " bytes";
  }
  out->assign(s);
  return {};
}

}  // namespace

LoraAdapterParse ParseLoraAdapterRequest(std::string_view body, bool unload) {
  LoraAdapterParse result;
  simdjson::dom::object obj;
  std::string message;
  if (!ParseObject(body, &obj, &message)) {
    result.error = MakeError(400, std::move(message));
    return result;
  }
  LoraAdapterRequest req;
  std::string field = "lora_name";
  message = ReadString(obj, "lora_name", true, kMaxLoraNameBytes, &req.lora_name);
  if (message.empty()) {
    field = "lora_path";
    message = ReadString(obj, "lora_path", !unload, kMaxLoraPathBytes, &req.lora_path);
  }
  if (!message.empty()) {
    result.error = MakeError(400, std::move(message), std::move(field));
    return result;
  }
  result.request = std::move(req);
  return result;
}

std::string LoraLoadedMessage(std::string_view name) {
  return "Success: LoRA adapter '" + std::string(name) + "' added successfully.";
}

std::string LoraUnloadedMessage(std::string_view name) {
  return "Success: LoRA adapter '" + std::string(name) + "' removed successfully.";
}

std::string LoraAlreadyLoadedMessage(std::string_view name) {
  return "The lora adapter '" + std::string(name) + "' has already been loaded.";
}

std::string LoraNotFoundMessage(std::string_view name) {
  return "The lora adapter '" + std::string(name) + "' cannot be found.";
}

std::optional<LoraModule> ParseLoraModule(std::string_view spec, std::string* error) {
  LoraModule m;
  const auto first = spec.find_first_not_of(" \t");
  if (first != std::string_view::npos && spec[first] == '{') {
    simdjson::dom::object obj;
    if (!ParseObject(spec, &obj, error)) return std::nullopt;
    for (auto [key, out, required, max] :
         {std::tuple{"name", &m.name, true, kMaxLoraNameBytes},
          std::tuple{"path", &m.path, true, kMaxLoraPathBytes},
          std::tuple{"base_model_name", &m.base_model_name, false, kMaxLoraNameBytes}}) {
      if (std::string e = ReadString(obj, key, required, max, out); !e.empty()) {
        *error = std::move(e);
        return std::nullopt;
      }
    }
    return m;
  }
  const auto eq = spec.find('=');
  if (eq == std::string_view::npos || eq == 0 || eq + 1 == spec.size()) {
    *error = "must be name=path or a JSON object with name and path (got '" +
             std::string(spec.substr(0, kMaxLoraNameBytes)) + "')";
    return std::nullopt;
  }
  if (eq > kMaxLoraNameBytes || spec.size() - eq - 1 > kMaxLoraPathBytes) {
    *error = "name must be at most " + std::to_string(kMaxLoraNameBytes) + " bytes and path " +
             std::to_string(kMaxLoraPathBytes);
    return std::nullopt;
  }
  m.name.assign(spec.substr(0, eq));
  m.path.assign(spec.substr(eq + 1));
  return m;
}

}  // namespace kvroute::api
