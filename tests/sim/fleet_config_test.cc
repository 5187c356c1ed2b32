#include "sim/fleet_config.h"

#include <gtest/gtest.h>

namespace kvroute::sim {
namespace {

TEST(FleetConfigTest, ExampleFileParsesAndResolves) {
  std::string error;
  auto file = LoadFleetFile(std::string(KVROUTE_SOURCE_DIR) + "/examples/fleet.yaml", &error);
  ASSERT_TRUE(file.has_value()) << error;
  ASSERT_EQ(file->replicas.size(), 4u);
  EXPECT_EQ(file->base_port, 18001);
  std::vector<ReplicaConfig> out;
  ASSERT_EQ(ResolveFleet(*file, {}, 0, *file->base_port, &out), "");
  ASSERT_EQ(out.size(), 4u);
  EXPECT_EQ(out[0].name, "h100-a");
  EXPECT_EQ(out[0].port, 18001);
  EXPECT_EQ(out[3].port, 18004);
  EXPECT_EQ(out[0].engine.num_gpu_blocks, 26304);
  EXPECT_EQ(out[2].preset, "small-kv");
  EXPECT_EQ(out[2].engine.num_gpu_blocks, 1024);
  EXPECT_EQ(out[2].engine.max_num_seqs, 64);
  EXPECT_EQ(out[2].latency_ms, 20.0);
  EXPECT_TRUE(out[3].old_metric_names);
  EXPECT_EQ(out[3].engine.mean_output_tokens, 200.0);
  using Labels = std::vector<std::pair<std::string, std::string>>;
  EXPECT_EQ(out[1].labels, (Labels{{"region", "us-east"}, {"zone", "b"}}));
  EXPECT_EQ(out[2].labels, (Labels{{"region", "eu-west"}}));
}

TEST(FleetConfigTest, PrecedenceIsPresetDefaultsCliReplica) {
  std::string error;
  auto file = ParseFleetYaml(
      "defaults:\n  kv_blocks: 100\n  max_num_seqs: 7\n  time_scale: 2\n"
      "replicas:\n  - max_num_seqs: 9\n  - preset: small-kv\n",
      "t.yaml", &error);
  ASSERT_TRUE(file.has_value()) << error;
  ReplicaOverrides cli;
  cli.max_num_seqs = 8;
  cli.time_scale = 0.5;
  std::vector<ReplicaConfig> out;
  ASSERT_EQ(ResolveFleet(*file, cli, 3, 9000, &out), "");
  ASSERT_EQ(out.size(), 3u);
  EXPECT_EQ(out[0].engine.max_num_seqs, 9);  // replica entry beats the flag
  EXPECT_EQ(out[1].engine.max_num_seqs, 8);  // flag beats defaults
  EXPECT_EQ(out[2].engine.max_num_seqs, 8);
  EXPECT_EQ(out[0].time_scale, 0.5);
  EXPECT_EQ(out[1].engine.num_gpu_blocks, 100);  // defaults beat the preset
  EXPECT_EQ(out[1].preset, "small-kv");
  EXPECT_EQ(out[2].port, 9002);
}

TEST(FleetConfigTest, ErrorsNameLineAndField) {
  std::string error;
  EXPECT_FALSE(ParseFleetYaml("replicas:\n  - kv_blocks: lots\n", "f.yaml", &error));
  EXPECT_EQ(error, "f.yaml:2: replicas[0].kv_blocks: invalid value 'lots'");
  EXPECT_FALSE(ParseFleetYaml("defaults:\n  colour: red\n", "f.yaml", &error));
  EXPECT_EQ(error, "f.yaml:2: defaults.colour: unknown key");
  EXPECT_FALSE(ParseFleetYaml("replicas: 3\n", "f.yaml", &error));
  EXPECT_EQ(error, "f.yaml:1: replicas: expected a list");

  auto file = ParseFleetYaml("defaults:\n  preset: nope\n", "f.yaml", &error);
  ASSERT_TRUE(file.has_value());
  std::vector<ReplicaConfig> out;
  EXPECT_EQ(ResolveFleet(*file, {}, 1, 0, &out),
            "replica 0: unknown preset 'nope' (known: llama3-8b-h100, small-kv)");
  file = ParseFleetYaml("replicas:\n  - max_num_seqs: 0\n", "f.yaml", &error);
  ASSERT_TRUE(file.has_value());
  EXPECT_EQ(ResolveFleet(*file, {}, 1, 0, &out), "replica-0: max_num_seqs must be >= 1");
}

}  // namespace
}  // namespace kvroute::sim
