// The API keys file (auth.api_keys_file), the upstream key file, and the `auth:` section.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "config/api_keys.h"
#include "config/router_config.h"

#include "router_config_util.h"

namespace kvroute::config {
namespace {

using config_test::ParseErr;
using config_test::ParseOk;

std::vector<ApiKeyEntry> KeysOk(std::string_view text) {
  ConfigOr<std::vector<ApiKeyEntry>> r = ParseApiKeys(text, "keys.txt");
  EXPECT_TRUE(r.ok()) << r.error.ToString();
  return r.ok() ? *r.value : std::vector<ApiKeyEntry>{};
}

std::string KeysErr(std::string_view text) {
  ConfigOr<std::vector<ApiKeyEntry>> r = ParseApiKeys(text, "keys.txt");
  EXPECT_FALSE(r.ok()) << text;
  return r.error.ToString();
}

TEST(ApiKeysTest, NamedAndUnnamedEntriesCommentsAndBlankLines) {
  const std::vector<ApiKeyEntry> keys = KeysOk(
      "# team keys\n"
      "\n"
      "alice  sk-alice-1\n"
      "   sk-anonymous\t\r\n"
      "\t# indented comment\n"
      "bob.ci-2\tsk-bob");  // no final newline
  const std::vector<ApiKeyEntry> want = {
      {"alice", "sk-alice-1", 3}, {"line-4", "sk-anonymous", 4}, {"bob.ci-2", "sk-bob", 6}};
  EXPECT_EQ(keys, want);
}

TEST(ApiKeysTest, AKeyMayHoldAnyPrintableCharacterButSpace) {
  const std::vector<ApiKeyEntry> keys = KeysOk("k sk-a#b=c/d+e\n");
  ASSERT_EQ(keys.size(), 1u);
  EXPECT_EQ(keys[0].key, "sk-a#b=c/d+e");
}

TEST(ApiKeysTest, ErrorsNameTheFileAndLineAndNeverTheKey) {
  EXPECT_EQ(KeysErr("a k1\nb k2 extra\n"),
            "keys.txt:2: api_keys: expected KEY or NAME KEY, got more than two fields");
  EXPECT_EQ(KeysErr("a sk-secret\nb sk-secret\n"),
            "keys.txt:2: api_keys: duplicate key (the same key as line 1)");
  EXPECT_EQ(KeysErr("\nsame k1\n# c\nsame k2\n"),
            "keys.txt:4: api_keys: duplicate key name 'same' (also on line 2)");
  EXPECT_EQ(KeysErr("line-2 k1\nk2\n"),
            "keys.txt:2: api_keys: duplicate key name 'line-2' (also on line 1)");
  EXPECT_EQ(KeysErr("bad/name k1\n"),
            "keys.txt:1: api_keys: bad key name (1-64 of A-Z a-z 0-9 _ . -; the key itself comes second)");
  EXPECT_EQ(KeysErr(std::string(65, 'n') + " k1\n"),
            "keys.txt:1: api_keys: bad key name (1-64 of A-Z a-z 0-9 _ . -; the key itself comes second)");
  EXPECT_EQ(KeysErr("ok k1\nn k\x01x\n"),
            "keys.txt:2: api_keys: key holds a character that is not printable ASCII");
  EXPECT_EQ(KeysErr("n " + std::string(4097, 'k') + "\n"), "keys.txt:1: api_keys: key longer than 4096 bytes");
  EXPECT_EQ(KeysOk("n " + std::string(4096, 'k')).size(), 1u);
  EXPECT_EQ(KeysOk(std::string(64, 'n') + " k").size(), 1u);
}

TEST(ApiKeysTest, AFileWithoutKeysIsAnError) {
  const std::string want =
      "keys.txt: api_keys: no API key in the file (auth is configured: nobody could be let in)";
  EXPECT_EQ(KeysErr(""), want);
  EXPECT_EQ(KeysErr("\n  \n# only comments\n"), want);
}

TEST(ApiKeysTest, UpstreamKeyIsTheFirstNonEmptyLineTrimmed) {
  ConfigOr<std::string> k = ParseUpstreamApiKey("\n  \n  sk-up-1 \r\nsk-ignored\n", "up.key");
  ASSERT_TRUE(k.ok()) << k.error.ToString();
  EXPECT_EQ(*k.value, "sk-up-1");
  ConfigOr<std::string> none = ParseUpstreamApiKey("\n \n", "up.key");
  ASSERT_FALSE(none.ok());
  EXPECT_EQ(none.error.ToString(),
            "up.key: upstream_api_key: no key in the file (its first non-empty line is sent)");
  ConfigOr<std::string> control = ParseUpstreamApiKey("\nsk\x01x\n", "up.key");
  ASSERT_FALSE(control.ok());
  EXPECT_EQ(control.error.ToString(), "up.key:2: upstream_api_key: the upstream key holds a control character");
}

TEST(AuthConfigTest, OffWhenAbsent) {
  const RouterConfig c = ParseOk("pool: {endpoints: [127.0.0.1:1]}\n");
  EXPECT_FALSE(c.auth.enabled());
  EXPECT_EQ(c.auth.upstream_authorization, UpstreamAuthorization::kForward);
}

TEST(AuthConfigTest, ReadsEveryKeyAndResolvesPathsAgainstTheConfigsDirectory) {
  ConfigOr<RouterConfig> r = ParseRouterConfig(
      "auth:\n"
      "  api_keys_file: keys.txt\n"
      "  api_keys_poll: 100ms\n"
      "  upstream_authorization: replace\n"
      "  upstream_api_key_file: /etc/kvroute/up.key\n",
      "/srv/conf/serve.yaml");
  ASSERT_TRUE(r.ok()) << r.error.ToString();
  const AuthConfig& a = r.value->auth;
  EXPECT_TRUE(a.enabled());
  EXPECT_EQ(a.api_keys_file, "keys.txt");
  EXPECT_EQ(a.api_keys_file_path, "/srv/conf/keys.txt");
  EXPECT_DOUBLE_EQ(a.api_keys_poll_s, 0.1);
  EXPECT_EQ(a.upstream_authorization, UpstreamAuthorization::kReplace);
  EXPECT_EQ(a.upstream_api_key_file_path, "/etc/kvroute/up.key");
  EXPECT_EQ(ParseOk("auth: {api_keys_file: k, upstream_authorization: drop}\n").auth.upstream_authorization,
            UpstreamAuthorization::kDrop);
}

TEST(AuthConfigTest, ErrorsNameTheLineAndField) {
  EXPECT_EQ(ParseErr("auth:\n  api_keys_poll: 1s\n"),
            "t.yaml:2: auth: api_keys_file is required in the auth block");
  EXPECT_EQ(ParseErr("auth:\n  api_keys_file: \"\"\n"), "t.yaml:2: auth.api_keys_file: must not be empty");
  EXPECT_EQ(ParseErr("auth:\n  api_keys_file: k\n  upstream_authorization: replace\n"),
            "t.yaml:3: auth.upstream_authorization: replace needs upstream_api_key_file (the key "
            "sent to the replicas)");
  EXPECT_EQ(ParseErr("auth:\n  api_keys_file: k\n  upstream_api_key_file: up\n"),
            "t.yaml:3: auth.upstream_api_key_file: only used with upstream_authorization: replace");
  EXPECT_EQ(ParseErr("auth:\n  api_keys_file: k\n  upstream_authorization: swap\n")
                .rfind("t.yaml:3: auth.upstream_authorization: ", 0),
            0u);
  EXPECT_EQ(ParseErr("auth:\n  api_keys_file: k\n  api_keys_pol: 1s\n")
                .rfind("t.yaml:3: auth.api_keys_pol: unknown key", 0),
            0u)
      << ParseErr("auth:\n  api_keys_file: k\n  api_keys_pol: 1s\n");
  EXPECT_EQ(ParseErr("auth:\n  api_keys_file: k\n  api_keys_poll: 0s\n").rfind("t.yaml:3: auth.api_keys_poll: ", 0),
            0u);
}

}  // namespace
}  // namespace kvroute::config
