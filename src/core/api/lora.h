// vLLM's LoRA adapter inputs (REFERENCE.md section 19) as pure logic, for the simulator:
//   - the bodies of POST /v1/load_lora_adapter and POST /v1/unload_lora_adapter;
//   - one `--lora-modules` entry: `name=path`, or the JSON form
//     {"name": ..., "path": ..., "base_model_name": ...}.
// Bytes in, values out; no exceptions escape. Thread: any (each thread reuses its own
// simdjson parser).
#pragma once

#include <optional>
#include <string>
#include <string_view>

#include "core/api/openai.h"

namespace kvroute::api {

// Longest adapter name or path accepted (both are echoed in answers and metric labels).
inline constexpr std::size_t kMaxLoraNameBytes = 256;
inline constexpr std::size_t kMaxLoraPathBytes = 4096;

struct LoraAdapterRequest {
  std::string lora_name;  // non-empty
  std::string lora_path;  // load: non-empty; unload: as given (vLLM ignores it), may be ""
};

struct LoraAdapterParse {
  std::optional<LoraAdapterRequest> request;
  ApiError error;  // status 400 when !ok()
  bool ok() const { return request.has_value(); }
};

// Parses a load (`unload` false) or unload body. lora_name (both) and lora_path (load)
// are required non-empty strings, at most kMaxLoraNameBytes / kMaxLoraPathBytes; other
// keys are ignored, as vLLM's pydantic model does (load_inplace is read by vLLM, ignored
// here). Errors are 400 BadRequestErrors naming the field.
LoraAdapterParse ParseLoraAdapterRequest(std::string_view body, bool unload);

// vLLM's answers: the 200 plain-text bodies and the error messages.
std::string LoraLoadedMessage(std::string_view name);      // "Success: LoRA adapter '<n>' added successfully."
std::string LoraUnloadedMessage(std::string_view name);    // "... removed successfully."
std::string LoraAlreadyLoadedMessage(std::string_view name);  // 400
std::string LoraNotFoundMessage(std::string_view name);       // 404

struct LoraModule {
  std::string name;
  std::string path;
  std::string base_model_name;  // "" = the served model
};

// Parses one --lora-modules entry: "name=path" (the first '=' splits; both sides
// non-empty) or a JSON object with string "name" and "path" and optional string
// "base_model_name". Returns the module, or sets `*error` (a sentence for the command
// line) and returns nullopt.
std::optional<LoraModule> ParseLoraModule(std::string_view spec, std::string* error);

}  // namespace kvroute::api
