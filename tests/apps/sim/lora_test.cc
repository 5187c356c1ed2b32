// LoRA adapters on a simulated replica over loopback: --lora-modules, the runtime load and
// unload endpoints with vLLM's answers, requests naming an adapter, /v1/models, and
// vllm:lora_requests_info line for line under an injected Unix clock.
#include <gtest/gtest.h>
#include <simdjson.h>

#include <atomic>
#include <string>
#include <vector>

#include "core/metrics/prom_writer.h"
#include "adapters/http/test_client.h"
#include "apps/sim/fleet.h"
#include "support/openai_body.h"
#include "support/sim_replica.h"

namespace kvroute::sim {
namespace {

using http::ClientResponse;
using http::Fetch;
using test_support::CompletionBody;
using test_support::kTestModel;

ReplicaConfig LoraReplica(bool enabled = true) {
  ReplicaConfig r = test_support::SimReplica();
  r.engine.lora.enabled = enabled;
  r.engine.lora.max_loras = 2;
  r.engine.lora.max_cpu_loras = 4;
  if (enabled) r.lora_modules.push_back({"sql-lora", "/adapters/sql", ""});
  return r;
}

// The Unix clock the tests inject: call n (from 1) answers kT0 + n.
constexpr double kT0 = 1767225400.2113;

class SimLoraTest : public ::testing::Test {
 protected:
  void Start(ReplicaConfig r) {
    fleet_ = std::make_unique<Fleet>(std::vector<ReplicaConfig>{std::move(r)}, 1);
    fleet_->SetUnixClock(0, [this] { return kT0 + static_cast<double>(++clock_calls_); });
    ASSERT_TRUE(fleet_->Start().ok());
  }
  ClientResponse Call(std::string_view method, std::string_view path, std::string_view body = {}) {
    std::optional<ClientResponse> r = Fetch("127.0.0.1", fleet_->port(0), method, path, body);
    EXPECT_TRUE(r.has_value());
    return r ? *r : ClientResponse{};
  }
  // The error message of an OpenAI-shaped error body, after checking its type and code.
  std::string ErrorMessage(const ClientResponse& r, std::string_view type) {
    simdjson::dom::element doc;
    if (parser_.parse(r.body).get(doc)) return "<not json: " + r.body + ">";
    EXPECT_EQ(std::string_view(doc["error"]["type"]), type) << r.body;
    EXPECT_EQ(int64_t(doc["error"]["code"]), r.status) << r.body;
    return std::string(std::string_view(doc["error"]["message"]));
  }
  // The vllm:lora_requests_info lines of /metrics (HELP and TYPE included).
  std::vector<std::string> LoraLines() {
    std::vector<std::string> lines;
    const std::string text = Call("GET", "/metrics").body;
    std::size_t pos = 0;
    while (pos < text.size()) {
      std::size_t end = text.find('\n', pos);
      if (end == std::string::npos) end = text.size();
      std::string line = text.substr(pos, end - pos);
      if (line.find("vllm:lora_requests_info") != std::string::npos) lines.push_back(line);
      pos = end + 1;
    }
    return lines;
  }

  std::atomic<int> clock_calls_{0};
  std::unique_ptr<Fleet> fleet_;
  simdjson::dom::parser parser_;
};

std::string LoraSeries(std::string_view running, std::string_view waiting, double value) {
  return "vllm:lora_requests_info{max_lora=\"2\",running_lora_adapters=\"" +
         std::string(running) + "\",waiting_lora_adapters=\"" + std::string(waiting) + "\"} " +
         metrics::FormatPromValue(value);
}

TEST_F(SimLoraTest, LoadAndUnloadAnswerAsVllm) {
  Start(LoraReplica());
  ClientResponse r = Call("POST", "/v1/load_lora_adapter",
                          R"({"lora_name":"chat-lora","lora_path":"/adapters/chat"})");
  EXPECT_EQ(r.status, 200);
  EXPECT_EQ(r.body, "Success: LoRA adapter 'chat-lora' added successfully.");
  EXPECT_EQ(r.Header("content-type"), "text/plain; charset=utf-8");

  r = Call("POST", "/v1/load_lora_adapter", R"({"lora_name":"chat-lora","lora_path":"/x"})");
  EXPECT_EQ(r.status, 400);
  EXPECT_EQ(ErrorMessage(r, "BadRequestError"),
            "The lora adapter 'chat-lora' has already been loaded.");
  r = Call("POST", "/v1/load_lora_adapter", R"({"lora_name":"sql-lora","lora_path":"/x"})");
  EXPECT_EQ(r.status, 400);  // a --lora-modules adapter is loaded too
  r = Call("POST", "/v1/load_lora_adapter", R"({"lora_name":"x"})");
  EXPECT_EQ(r.status, 400);
  EXPECT_EQ(ErrorMessage(r, "BadRequestError"), "lora_path is required");
  r = Call("POST", "/v1/load_lora_adapter", "not json");
  EXPECT_EQ(r.status, 400);
  r = Call("POST", "/v1/unload_lora_adapter", R"({"lora_path":"/x"})");
  EXPECT_EQ(r.status, 400);
  EXPECT_EQ(ErrorMessage(r, "BadRequestError"), "lora_name is required");
  r = Call("GET", "/v1/load_lora_adapter");
  EXPECT_EQ(r.status, 405);

  r = Call("POST", "/v1/unload_lora_adapter", R"({"lora_name":"nope"})");
  EXPECT_EQ(r.status, 404);
  EXPECT_EQ(ErrorMessage(r, "NotFoundError"), "The lora adapter 'nope' cannot be found.");

  r = Call("POST", "/v1/unload_lora_adapter", R"({"lora_name":"chat-lora"})");
  EXPECT_EQ(r.status, 200);
  EXPECT_EQ(r.body, "Success: LoRA adapter 'chat-lora' removed successfully.");
  r = Call("POST", "/v1/completions", CompletionBody("hello", 2, false, false, 0, "chat-lora"));
  EXPECT_EQ(r.status, 404);
  EXPECT_EQ(ErrorMessage(r, "NotFoundError"), "The model `chat-lora` does not exist.");
}

TEST_F(SimLoraTest, ARequestNamingAnAdapterIsServedUnderItsName) {
  Start(LoraReplica());
  ClientResponse r =
      Call("POST", "/v1/completions", CompletionBody("hello adapter", 3, false, false, 0, "sql-lora"));
  ASSERT_EQ(r.status, 200) << r.body;
  simdjson::dom::element doc = parser_.parse(r.body);
  EXPECT_EQ(std::string_view(doc["model"]), "sql-lora");
  EXPECT_EQ(int64_t(doc["usage"]["completion_tokens"]), 3);
  std::optional<engine::EngineStats> s = fleet_->Stats(0);
  ASSERT_TRUE(s.has_value());
  EXPECT_EQ(s->lora_loads, 1);
  EXPECT_EQ(s->loras_cached, 1);

  // The base model still answers, and loads nothing.
  r = Call("POST", "/v1/completions", CompletionBody("hello base", 2));
  ASSERT_EQ(r.status, 200) << r.body;
  EXPECT_EQ(std::string_view(parser_.parse(r.body)["model"]), kTestModel);
  EXPECT_EQ(fleet_->Stats(0)->lora_loads, 1);
}

TEST_F(SimLoraTest, ModelsListsAdaptersWithTheirParent) {
  Start(LoraReplica());
  ASSERT_EQ(Call("POST", "/v1/load_lora_adapter",
                 R"({"lora_name":"chat-lora","lora_path":"/adapters/chat"})")
                .status,
            200);
  ClientResponse r = Call("GET", "/v1/models");
  ASSERT_EQ(r.status, 200);
  simdjson::dom::element doc = parser_.parse(r.body);
  simdjson::dom::array data = doc["data"];
  ASSERT_EQ(data.size(), 3u);
  EXPECT_EQ(std::string_view(data.at(0)["id"]), kTestModel);
  EXPECT_TRUE(data.at(0)["parent"].is_null());
  const char* names[] = {"sql-lora", "chat-lora"};
  const char* roots[] = {"/adapters/sql", "/adapters/chat"};
  for (std::size_t i = 0; i < 2; ++i) {
    simdjson::dom::element m = data.at(i + 1);
    EXPECT_EQ(std::string_view(m["id"]), names[i]);
    EXPECT_EQ(std::string_view(m["object"]), "model");
    EXPECT_EQ(std::string_view(m["root"]), roots[i]);
    EXPECT_EQ(std::string_view(m["parent"]), kTestModel);
    EXPECT_EQ(std::string_view(m["owned_by"]), "vllm");
    EXPECT_EQ(int64_t(m["max_model_len"]), 8192);
  }
  // The runtime adapter was created at the injected clock's second call.
  EXPECT_EQ(int64_t(data.at(2)["created"]), static_cast<int64_t>(kT0 + 2));
}

TEST_F(SimLoraTest, LoraRequestsInfoIsWrittenAsVllmDoes) {
  Start(LoraReplica());
  // Before any request: the empty combination, set when the clock was injected (call 1).
  EXPECT_EQ(LoraLines(), (std::vector<std::string>{
                             "# HELP vllm:lora_requests_info Running stats on lora requests.",
                             "# TYPE vllm:lora_requests_info gauge",
                             LoraSeries("", "", kT0 + 1)}));
  // One request of 2 tokens: admitted and waiting (call 2), running after its first step
  // (call 3), finished after its second (call 4). Each combination keeps its own series.
  ClientResponse r =
      Call("POST", "/v1/completions", CompletionBody("hi", 2, false, false, 0, "sql-lora"));
  ASSERT_EQ(r.status, 200) << r.body;
  EXPECT_EQ(LoraLines(), (std::vector<std::string>{
                             "# HELP vllm:lora_requests_info Running stats on lora requests.",
                             "# TYPE vllm:lora_requests_info gauge",
                             LoraSeries("", "", kT0 + 4),
                             LoraSeries("", "sql-lora", kT0 + 2),
                             LoraSeries("sql-lora", "", kT0 + 3)}));
}

TEST_F(SimLoraTest, WithoutEnableLoraThereAreNoAdapters) {
  Start(LoraReplica(/*enabled=*/false));
  ClientResponse r = Call("POST", "/v1/load_lora_adapter",
                          R"({"lora_name":"chat-lora","lora_path":"/adapters/chat"})");
  EXPECT_EQ(r.status, 404);
  EXPECT_EQ(ErrorMessage(r, "NotFoundError"), "Not Found");
  r = Call("POST", "/v1/completions", CompletionBody("hi", 2, false, false, 0, "sql-lora"));
  EXPECT_EQ(r.status, 404);
  EXPECT_TRUE(LoraLines().empty());
  EXPECT_EQ(clock_calls_.load(), 0);
}

}  // namespace
}  // namespace kvroute::sim
