// The HTTP body a load generator sends for one workload request.
#pragma once

#include <string>
#include <string_view>

#include "simkit/workload/workload.h"

namespace kvroute::bench {

// The request path for the spec's endpoint: "/v1/completions" or "/v1/chat/completions".
std::string_view RequestTarget(const workload::RequestSpec& spec);

// Writes into `*body` (cleared first) the JSON body for `spec`: model, the prompt
// (completions) or messages (chat), max_tokens = spec.max_tokens with ignore_eos so the
// output length is exact, stream = true and stream_options.include_usage = true.
// `output_text` supplies earlier turns' generated text (multi-turn); `scratch` is reused
// for the rendered prompt.
void BuildRequestBody(const workload::RequestSpec& spec, std::string_view model,
                      const workload::OutputTextFn& output_text, std::string* scratch,
                      std::string* body);

}  // namespace kvroute::bench
