#include "adapters/k8s/kubeconfig.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>

namespace kvroute::k8s {
namespace {

namespace fs = std::filesystem;

class KubeconfigTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() /
           ("kvroute-kubeconfig-" + std::to_string(getpid()) + "-" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  std::string Write(const std::string& name, const std::string& text) {
    std::ofstream(dir_ / name, std::ios::binary | std::ios::trunc) << text;
    return (dir_ / name).string();
  }
  fs::path dir_;
};

constexpr const char* kCaPem = "-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n";

std::string Config(const std::string& cluster, const std::string& user) {
  return "apiVersion: v1\n"
         "kind: Config\n"
         "current-context: dev\n"
         "contexts:\n"
         "- name: other\n"
         "  context: {cluster: nowhere, user: nobody}\n"
         "- name: dev\n"
         "  context: {cluster: c1, user: u1, namespace: llm}\n"
         "clusters:\n"
         "- name: c1\n"
         "  cluster:\n" +
         cluster +
         "users:\n"
         "- name: u1\n"
         "  user:\n" +
         user;
}

TEST(Base64, DecodesWithAndWithoutPadding) {
  EXPECT_EQ(DecodeBase64("aGVsbG8="), "hello");
  EXPECT_EQ(DecodeBase64("aGVsbG8"), "hello");
  EXPECT_EQ(DecodeBase64("aGVs\nbG8h"), "hello!");
  EXPECT_EQ(DecodeBase64(""), "");
  EXPECT_FALSE(DecodeBase64("aGV*bG8="));
  EXPECT_FALSE(DecodeBase64("a"));
  EXPECT_FALSE(DecodeBase64("aG=VsbG8"));
}

TEST(ServerUrl, HostPortPath) {
  ClusterAccess a;
  EXPECT_EQ(ParseServerUrl("https://10.0.0.1:6443", a).ToString(), "OK");
  EXPECT_EQ(a.host, "10.0.0.1");
  EXPECT_EQ(a.port, 6443);
  EXPECT_EQ(ParseServerUrl("https://api.example.com/k8s/", a).ToString(), "OK");
  EXPECT_EQ(a.host, "api.example.com");
  EXPECT_EQ(a.port, 443);
  EXPECT_EQ(a.base_path, "/k8s");
  EXPECT_EQ(ParseServerUrl("https://[::1]:8443", a).ToString(), "OK");
  EXPECT_EQ(a.host, "::1");
  EXPECT_EQ(a.port, 8443);
  EXPECT_EQ(ParseServerUrl("http://x:1", a).message(), "must be an https:// URL");
  EXPECT_EQ(ParseServerUrl("https://x:99999", a).message(), "bad port '99999'");
}

TEST_F(KubeconfigTest, CaFileAndFixedToken) {
  Write("ca.crt", kCaPem);
  std::string kc = Write("kc.yaml", Config("    server: https://127.0.0.1:6443\n"
                                           "    certificate-authority: ca.crt\n",
                                           "    token: abc123\n"));
  auto r = LoadKubeconfig(kc);
  ASSERT_TRUE(r.ok()) << r.error.ToString();
  EXPECT_EQ(r.value->host, "127.0.0.1");
  EXPECT_EQ(r.value->port, 6443);
  EXPECT_EQ(r.value->ca_pem, kCaPem);
  EXPECT_EQ(r.value->token.Current(), "abc123");
  EXPECT_EQ(r.value->namespace_name, "llm");
  EXPECT_FALSE(r.value->insecure_skip_tls_verify);
  EXPECT_EQ(r.value->source, "kubeconfig " + kc + " (context dev)");
}

TEST_F(KubeconfigTest, CaDataAndClientCertificateData) {
  // "LS0t" = "---"; base64 of the PEM strings.
  std::string kc = Write(
      "kc.yaml", Config("    server: https://k8s.local\n"
                        "    certificate-authority-data: aGVsbG8=\n"
                        "    insecure-skip-tls-verify: true\n",
                        "    client-certificate-data: Y2VydA==\n"
                        "    client-key-data: a2V5\n"));
  auto r = LoadKubeconfig(kc);
  ASSERT_TRUE(r.ok()) << r.error.ToString();
  EXPECT_EQ(r.value->ca_pem, "hello");
  EXPECT_TRUE(r.value->insecure_skip_tls_verify);
  EXPECT_EQ(r.value->client_cert_pem, "cert");
  EXPECT_EQ(r.value->client_key_pem, "key");
  EXPECT_FALSE(r.value->token.has_token());
}

TEST_F(KubeconfigTest, ClientCertificateFiles) {
  Write("c.pem", "CERT");
  Write("k.pem", "KEY");
  std::string kc = Write("kc.yaml", Config("    server: https://k8s.local:443\n",
                                           "    client-certificate: c.pem\n"
                                           "    client-key: " + (dir_ / "k.pem").string() + "\n"));
  auto r = LoadKubeconfig(kc);
  ASSERT_TRUE(r.ok()) << r.error.ToString();
  EXPECT_EQ(r.value->client_cert_pem, "CERT");
  EXPECT_EQ(r.value->client_key_pem, "KEY");
}

TEST_F(KubeconfigTest, TokenFileIsReReadWhenItRotates) {
  Write("token", "first-token\n");
  std::string kc = Write("kc.yaml", Config("    server: https://k8s.local\n",
                                           "    tokenFile: token\n"));
  auto r = LoadKubeconfig(kc);
  ASSERT_TRUE(r.ok()) << r.error.ToString();
  TokenSource& t = r.value->token;
  EXPECT_EQ(t.Current(), "first-token");
  EXPECT_EQ(t.Current(), "first-token");
  EXPECT_EQ(t.reloads(), 1u);
  Write("token", "second-token-rotated\n");
  EXPECT_EQ(t.Current(), "second-token-rotated");
  EXPECT_EQ(t.reloads(), 2u);
  fs::remove(dir_ / "token");
  std::string err;
  EXPECT_EQ(t.Current(&err), "second-token-rotated");  // the last good one is kept
  EXPECT_NE(err.find("cannot read token"), std::string::npos) << err;
}

TEST_F(KubeconfigTest, ErrorsNameFileLineAndField) {
  std::string kc = Write("kc.yaml", Config("    server: https://k8s.local\n"
                                           "    certificate-authority: missing.crt\n",
                                           "    token: t\n"));
  auto r = LoadKubeconfig(kc);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.error.file, kc);
  EXPECT_EQ(r.error.line, 13);
  EXPECT_EQ(r.error.field, "clusters[0].cluster.certificate-authority");
  EXPECT_NE(r.error.message.find("cannot read 'missing.crt'"), std::string::npos)
      << r.error.ToString();

  kc = Write("kc.yaml", Config("    server: http://k8s.local\n", "    token: t\n"));
  r = LoadKubeconfig(kc);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.error.ToString(), kc + ":12: clusters[0].cluster.server: must be an https:// URL");

  kc = Write("kc.yaml", Config("    server: https://k8s.local\n"
                               "    certificate-authority-data: '!!'\n",
                               "    token: t\n"));
  r = LoadKubeconfig(kc);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.error.ToString(),
            kc + ":13: clusters[0].cluster.certificate-authority-data: must be base64");

  kc = Write("kc.yaml", Config("    server: https://k8s.local\n",
                               "    exec: {command: aws}\n"));
  r = LoadKubeconfig(kc);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.error.field, "users[0].user.exec");

  kc = Write("kc.yaml", Config("    server: https://k8s.local\n",
                               "    client-certificate-data: Y2VydA==\n"));
  r = LoadKubeconfig(kc);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.error.message.find("both the certificate and the key"), std::string::npos);
}

TEST_F(KubeconfigTest, ContextOverrideAndMissingNames) {
  std::string kc = Write("kc.yaml", Config("    server: https://k8s.local\n", "    token: t\n"));
  auto r = LoadKubeconfig(kc, "other");
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.error.message, "no cluster named 'nowhere' in clusters");
  EXPECT_EQ(r.error.line, 6);
  r = LoadKubeconfig(kc, "nope");
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.error.message, "no context named 'nope' in contexts");
  r = LoadKubeconfig((dir_ / "absent.yaml").string());
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.error.ToString().find("cannot read file"), std::string::npos);
}

TEST_F(KubeconfigTest, InClusterServiceAccount) {
  InClusterPaths paths{Write("token", "sa-token\n"), Write("ca.crt", kCaPem),
                       Write("namespace", "inference\n")};
  auto env = [](const char* name) -> const char* {
    std::string n = name;
    if (n == "KUBERNETES_SERVICE_HOST") return "10.96.0.1";
    if (n == "KUBERNETES_SERVICE_PORT") return "443";
    return nullptr;
  };
  auto r = LoadInCluster(paths, env);
  ASSERT_TRUE(r.ok()) << r.error.ToString();
  EXPECT_EQ(r.value->host, "10.96.0.1");
  EXPECT_EQ(r.value->port, 443);
  EXPECT_EQ(r.value->ca_pem, kCaPem);
  EXPECT_EQ(r.value->token.Current(), "sa-token");
  EXPECT_EQ(r.value->namespace_name, "inference");
  EXPECT_EQ(r.value->source, "in-cluster");
  Write("token", "rotated-sa-token\n");
  EXPECT_EQ(r.value->token.Current(), "rotated-sa-token");

  auto none = LoadInCluster(paths, [](const char*) -> const char* { return nullptr; });
  ASSERT_FALSE(none.ok());
  EXPECT_NE(none.error.message.find("KUBERNETES_SERVICE_HOST"), std::string::npos);
}

}  // namespace
}  // namespace kvroute::k8s
