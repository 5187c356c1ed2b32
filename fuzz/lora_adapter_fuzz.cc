// Fuzz target: the LoRA inputs of core/api/lora.h on outside bytes: a load and an unload
// body the sim reads (POST /v1/load_lora_adapter, /v1/unload_lora_adapter) and one
// --lora-modules entry.
//
// Invariants: a body error is a 400 BadRequestError with a message and a JSON body; a read
// request has a non-empty lora_name within its bound (and for a load a non-empty path);
// the answers built from the name are the fixed sentences around it; a module read has a
// non-empty name and path, else an error sentence is set.
#include <simdjson.h>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <string_view>

#include "core/api/lora.h"
#include "core/api/openai.h"

#include "fuzz_check.h"

namespace {

using namespace kvroute;

using fuzz::Check;

bool IsJson(std::string_view s) {
  thread_local simdjson::dom::parser parser;
  simdjson::dom::element root;
  return !parser.parse(s.data(), s.size()).get(root);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view in(reinterpret_cast<const char*>(data), size);

  for (bool unload : {false, true}) {
    const api::LoraAdapterParse p = api::ParseLoraAdapterRequest(in, unload);
    if (!p.ok()) {
      Check(p.error.status == 400 && p.error.type == "BadRequestError", "a body error not a 400");
      Check(!p.error.message.empty(), "an error without a message");
      Check(IsJson(api::ErrorBody(p.error)), "an error body that is not JSON");
      continue;
    }
    const api::LoraAdapterRequest& r = *p.request;
    Check(!r.lora_name.empty() && r.lora_name.size() <= api::kMaxLoraNameBytes,
          "a lora_name empty or past its bound");
    Check(unload || !r.lora_path.empty(), "a load without a path");
    Check(r.lora_path.size() <= api::kMaxLoraPathBytes, "a lora_path past its bound");
    const std::string ok = api::LoraLoadedMessage(r.lora_name);
    Check(ok.find(r.lora_name) != std::string::npos, "an answer without the name");
    Check(IsJson(api::ErrorBody(api::MakeError(404, api::LoraNotFoundMessage(r.lora_name)))),
          "a 404 body that is not JSON");
  }

  std::string error;
  const std::optional<api::LoraModule> m = api::ParseLoraModule(in, &error);
  if (m) {
    Check(!m->name.empty() && !m->path.empty(), "a module without a name or path");
  } else {
    Check(!error.empty(), "a refused module without a sentence");
  }
  return 0;
}
