// Fuzz target: what the prefill/decode legs read from outside (issue 25): a client's body
// (BuildPrefillBody, BuildDecodeBody, and ReplaceModel for x-llm-d-model-name-rewrite), a
// prefill engine's answer (ReadPrefillAnswer), a decode engine's bytes
// (RewriteCachedTokens), and the sidecar's x-prefiller-host-port and --prefiller-allow
// values (ParsePrefiller, ParseCidrList).
//
// Invariants: a leg body is built for every JSON object (and for no other valid JSON), and
// is then a JSON object again; the prefill body has stream false and max_tokens 1; a body
// with its model replaced is built where a leg body is, and is a JSON object again;
// prefill's parameters read back are empty or valid JSON; rewriting cached tokens keeps
// valid JSON valid; a prefiller accepted names an IP address literal and a port > 0; an
// allow list parsed has lengths within its family's.
#include <simdjson.h>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <string_view>

#include "core/api/pd_legs.h"
#include "fuzz_check.h"
#include "apps/sidecar/sidecar.h"

namespace {

using namespace kvroute;
using kvroute::fuzz::Check;

// 1: a JSON object; 0: other valid JSON; -1: not JSON.
int Kind(std::string_view s) {
  thread_local simdjson::dom::parser parser;
  simdjson::dom::element root;
  if (parser.parse(s.data(), s.size()).get(root)) return -1;
  return root.is_object() ? 1 : 0;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view in(reinterpret_cast<const char*>(data), size);
  const int kind = Kind(in);

  // Bytes that only look like an object inside (a broken nested value) go on as broken as
  // they came, for the engine to refuse; a valid object stays valid.
  std::optional<std::string> prefill = api::BuildPrefillBody(in);
  Check(kind != 1 || prefill.has_value(), "prefill body built for a JSON object");
  Check(kind != 0 || !prefill.has_value(), "no prefill body for other JSON");
  if (prefill) Check(prefill->find("\"stream\":false,\"max_tokens\":1,") != std::string::npos, "prefill limits");
  if (kind == 1) Check(Kind(*prefill) == 1, "prefill body is a JSON object");
  constexpr std::string_view kKv = R"({"do_remote_prefill":true,"remote_block_ids":[1]})";
  std::optional<std::string> decode = api::BuildDecodeBody(in, kKv);
  Check(decode.has_value() == prefill.has_value(), "decode body built where prefill's is");
  if (kind == 1) Check(Kind(*decode) == 1, "decode body is a JSON object");

  std::optional<std::string> renamed = api::ReplaceModel(in, "m\"\\x");
  Check(renamed.has_value() == prefill.has_value(), "model replaced where a prefill body is built");
  if (kind == 1) Check(Kind(*renamed) == 1, "renamed body is a JSON object");

  api::PrefillAnswer a = api::ReadPrefillAnswer(in);
  Check(a.kv_raw.empty() || Kind(a.kv_raw) >= 0, "prefill parameters are JSON");

  std::string text(in);
  const int n = api::RewriteCachedTokens(text, 7);
  Check(n >= 0, "rewrite count");
  if (kind >= 0) Check(Kind(text) >= 0, "rewriting keeps JSON valid");

  sidecar::Prefiller p;
  std::optional<std::vector<sidecar::Cidr>> allow = sidecar::ParseCidrList(in);
  if (allow) {
    for (const sidecar::Cidr& c : *allow) Check(c.bits >= 0 && c.bits <= (c.v4 ? 32 : 128), "prefix length");
  }
  if (sidecar::ParsePrefiller(in, allow ? *allow : std::vector<sidecar::Cidr>{}, &p) ==
      sidecar::PrefillerRefusal::kNone) {
    Check(p.port > 0 && !p.host.empty(), "prefiller host and port");
    Check(sidecar::ParseCidrList(p.host).has_value(), "prefiller host is an address");
  }
  return 0;
}
