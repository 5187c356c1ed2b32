#include "apps/bench/request_body.h"

#include "core/api/openai.h"

namespace kvroute::bench {

std::string_view RequestTarget(const workload::RequestSpec& spec) {
  return spec.endpoint == api::Endpoint::kChatCompletions ? "/v1/chat/completions"
                                                          : "/v1/completions";
}

void BuildRequestBody(const workload::RequestSpec& spec, std::string_view model,
                      const workload::OutputTextFn& output_text, std::string* scratch,
                      std::string* body) {
  body->clear();
  *body += "{\"model\":";
  api::AppendJsonString(*body, model);
  if (spec.endpoint == api::Endpoint::kChatCompletions) {
    *body += ",\"messages\":[";
    bool first = true;
    for (const workload::OwnedMessage& m : workload::ChatMessages(spec, output_text)) {
      if (!first) body->push_back(',');
      first = false;
      *body += "{\"role\":";
      api::AppendJsonString(*body, workload::RoleName(m.role));
      *body += ",\"content\":";
      api::AppendJsonString(*body, m.content);
      body->push_back('}');
    }
    body->push_back(']');
  } else {
    workload::RenderPrompt(spec, output_text, scratch);
    *body += ",\"prompt\":";
    api::AppendJsonString(*body, *scratch);
  }
  *body += ",\"max_tokens\":";
  *body += std::to_string(spec.max_tokens);
  *body +=
      ",\"ignore_eos\":true,\"temperature\":0,\"stream\":true,"
      "\"stream_options\":{\"include_usage\":true}}";
}

}  // namespace kvroute::bench
