// pool.discovery.kubernetes (issue 9): the keys, their defaults and their errors.
#include <gtest/gtest.h>

#include <string>

#include "config/router_config.h"

namespace kvroute::config {
namespace {

ConfigOr<RouterConfig> Parse(std::string_view text) {
  return ParseRouterConfig(text, "/etc/kvroute/router.yaml");
}

TEST(KubernetesDiscoveryConfig, AllKeys) {
  ConfigOr<RouterConfig> r = Parse(
      "pool:\n"
      "  discovery:\n"
      "    kubernetes:\n"
      "      inference_pool: vllm-llama\n"
      "      namespace: inference\n"
      "      group: inference.networking.x-k8s.io\n"
      "      kubeconfig: kube/config\n"
      "      context: staging\n"
      "      objectives: false\n");
  ASSERT_TRUE(r.ok()) << r.error.ToString();
  const KubernetesDiscoveryConfig& k = r.value->pool.kubernetes;
  EXPECT_TRUE(k.enabled());
  EXPECT_EQ(k.inference_pool, "vllm-llama");
  EXPECT_EQ(k.namespace_name, "inference");
  EXPECT_EQ(k.group, "inference.networking.x-k8s.io");
  EXPECT_EQ(k.kubeconfig, "kube/config");
  EXPECT_EQ(k.kubeconfig_path, "/etc/kvroute/kube/config");
  EXPECT_EQ(k.context, "staging");
  EXPECT_FALSE(k.objectives);
  EXPECT_TRUE(r.value->pool.endpoints.empty());
}

TEST(KubernetesDiscoveryConfig, Defaults) {
  ConfigOr<RouterConfig> r = Parse("pool:\n  discovery:\n    kubernetes: {inference_pool: p}\n");
  ASSERT_TRUE(r.ok()) << r.error.ToString();
  const KubernetesDiscoveryConfig& k = r.value->pool.kubernetes;
  EXPECT_EQ(k.inference_pool, "p");
  EXPECT_EQ(k.namespace_name, "");
  EXPECT_EQ(k.group, "inference.networking.k8s.io");
  EXPECT_EQ(k.kubeconfig_path, "");  // in cluster
  EXPECT_TRUE(k.objectives);
  EXPECT_FALSE(Parse("pool: {}\n").value->pool.kubernetes.enabled());
}

TEST(KubernetesDiscoveryConfig, ErrorsNameFileLineAndField) {
  EXPECT_EQ(Parse("pool:\n  discovery:\n    kubernetes: {namespace: x}\n").error.ToString(),
            "/etc/kvroute/router.yaml:3: pool.discovery.kubernetes: inference_pool is required");
  EXPECT_EQ(Parse("pool:\n  discovery:\n    kubernetes:\n      inference_pool: p\n      group: example.com\n")
                .error.ToString(),
            "/etc/kvroute/router.yaml:5: pool.discovery.kubernetes.group: unknown InferencePool group "
            "'example.com' (use inference.networking.k8s.io or inference.networking.x-k8s.io)");
  EXPECT_EQ(Parse("pool:\n  discovery:\n    kubernetes: {inference_pool: Bad_Name}\n").error.ToString(),
            "/etc/kvroute/router.yaml:3: pool.discovery.kubernetes.inference_pool: 'Bad_Name' is not a "
            "Kubernetes object name (lower-case letters, digits, '-' and '.')");
  EXPECT_EQ(Parse("pool:\n  discovery:\n    kubernetes: {inference_pool: p, namespace: a.b}\n").error.ToString(),
            "/etc/kvroute/router.yaml:3: pool.discovery.kubernetes.namespace: 'a.b' is not a Kubernetes "
            "namespace name");
  EXPECT_EQ(Parse("pool:\n  discovery:\n    kubernetes: {inference_pool: p, kubeconfg: x}\n").error.ToString(),
            "/etc/kvroute/router.yaml:3: pool.discovery.kubernetes.kubeconfg: unknown key 'kubeconfg' (did "
            "you mean 'kubeconfig'?)");
  EXPECT_EQ(Parse("pool:\n  discovery:\n    consul: {}\n").error.ToString(),
            "/etc/kvroute/router.yaml:3: pool.discovery.consul: unknown key 'consul' (known: kubernetes)");
}

TEST(KubernetesDiscoveryConfig, ExclusiveWithStaticAndFileEndpoints) {
  EXPECT_EQ(Parse("pool:\n  endpoints: [127.0.0.1:8000]\n  discovery:\n    kubernetes: {inference_pool: p}\n")
                .error.ToString(),
            "/etc/kvroute/router.yaml:3: pool.discovery: Kubernetes discovery replaces pool.endpoints; use one");
  EXPECT_EQ(Parse("pool:\n  discovery:\n    kubernetes: {inference_pool: p}\n  endpoints_file: e.yaml\n")
                .error.ToString(),
            "/etc/kvroute/router.yaml:2: pool.discovery: Kubernetes discovery replaces pool.endpoints_file; use one");
}

}  // namespace
}  // namespace kvroute::config
