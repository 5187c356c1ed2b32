#include "config/yaml_reader.h"

#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

namespace kvroute::config {
namespace {

// Runs `read` on `text` (file "r.yaml"); returns the error text, "" when it succeeded.
std::string ErrorOf(std::string_view text, const std::function<void(const ConfigNode&)>& read) {
  std::optional<ConfigError> e = ReadYaml(text, "r.yaml", read);
  return e ? e->ToString() : "";
}

TEST(ConfigError, ToStringLeavesOutEmptyParts) {
  EXPECT_EQ((ConfigError{"a.yaml", 3, "pool.endpoints[2].address", "bad"}).ToString(),
            "a.yaml:3: pool.endpoints[2].address: bad");
  EXPECT_EQ((ConfigError{"a.yaml", 0, "pool", "bad"}).ToString(), "a.yaml: pool: bad");
  EXPECT_EQ((ConfigError{"a.yaml", 7, "", "bad"}).ToString(), "a.yaml:7: bad");
}

TEST(YamlReader, FieldPathsAndLines) {
  const char* text = R"(# comment
pool:
  endpoints:
    - address: a:1
    - name: b
      address: b:2
)";
  std::vector<std::string> seen;
  EXPECT_EQ(
      ErrorOf(text,
              [&](const ConfigNode& root) {
                const ConfigNode pool = root.Get("pool");
                for (const ConfigNode& ep : pool.Get("endpoints").Items()) {
                  const ConfigNode a = ep.Get("address");
                  seen.push_back(a.field() + "@" + std::to_string(a.line()) + "=" + a.String());
                }
                // Absent keys carry their path and the enclosing node's line.
                const ConfigNode missing = pool.Get("model");
                EXPECT_FALSE(missing.present());
                EXPECT_TRUE(missing.IsNull());
                EXPECT_EQ(missing.field(), "pool.model");
                EXPECT_EQ(missing.line(), 3);
              }),
      "");
  EXPECT_EQ(seen, (std::vector<std::string>{"pool.endpoints[0].address@4=a:1",
                                            "pool.endpoints[1].address@6=b:2"}));
}

TEST(YamlReader, TypedGettersAcceptTheirForms) {
  EXPECT_EQ(ErrorOf(R"(i: -12
u: 18446744073709551615
plus: +7
f: 1.5e-3
inf: .inf
b: True
d: 250ms
z: 16MiB
s: "007"
e: gamma
)",
                    [](const ConfigNode& r) {
                      EXPECT_EQ(r.Get("i").Int(), -12);
                      EXPECT_EQ(r.Get("u").Uint(), UINT64_MAX);
                      EXPECT_EQ(r.Get("plus").Int(), 7);
                      EXPECT_DOUBLE_EQ(r.Get("f").Number(), 1.5e-3);
                      EXPECT_TRUE(std::isinf(r.Get("inf").Float()));
                      EXPECT_TRUE(r.Get("b").Bool());
                      EXPECT_DOUBLE_EQ(r.Get("d").Duration(), 0.25);
                      EXPECT_EQ(r.Get("z").ByteSize(), 16u << 20);
                      EXPECT_EQ(r.Get("s").String(), "007");
                      EXPECT_FALSE(r.Get("s").IsPlain());
                      EXPECT_EQ(r.Get("e").Enum<int>("process", {{"poisson", 1}, {"gamma", 2}}), 2);
                    }),
            "");
}

TEST(YamlReader, BadValuesNameFileLineAndField) {
  auto get = [](std::string_view text, const std::function<void(const ConfigNode&)>& f) {
    return ErrorOf(text, [&](const ConfigNode& r) { f(r.Get("x").Get("v")); });
  };
  EXPECT_EQ(get("x:\n  v: many\n", [](const ConfigNode& n) { n.Int(); }),
            "r.yaml:2: x.v: must be an integer (got 'many')");
  EXPECT_EQ(get("x:\n  v: 0x10\n", [](const ConfigNode& n) { n.Int(); }),
            "r.yaml:2: x.v: must be an integer (got '0x10')");
  EXPECT_EQ(get("x:\n  v: \"5\"\n", [](const ConfigNode& n) { n.Int(); }),
            "r.yaml:2: x.v: must be an integer (got '5')");
  EXPECT_EQ(get("x:\n  v: 0\n", [](const ConfigNode& n) { n.Int(1, 9); }),
            "r.yaml:2: x.v: must be >= 1 (got 0)");
  EXPECT_EQ(get("x:\n  v: 10\n", [](const ConfigNode& n) { n.Int(1, 9); }),
            "r.yaml:2: x.v: must be <= 9 (got 10)");
  EXPECT_EQ(get("x:\n  v: -1\n", [](const ConfigNode& n) { n.Uint(); }),
            "r.yaml:2: x.v: must be a non-negative integer (got '-1')");
  EXPECT_EQ(get("x:\n  v: fast\n", [](const ConfigNode& n) { n.Number(); }),
            "r.yaml:2: x.v: must be a number (got 'fast')");
  EXPECT_EQ(get("x:\n  v: .inf\n", [](const ConfigNode& n) { n.Number(); }),
            "r.yaml:2: x.v: must be a finite number (got '.inf')");
  EXPECT_EQ(get("x:\n  v: yes\n", [](const ConfigNode& n) { n.Bool(); }),
            "r.yaml:2: x.v: must be true or false (got 'yes')");
  EXPECT_EQ(get("x:\n  v: 5 s\n", [](const ConfigNode& n) { n.Duration(); }),
            "r.yaml:2: x.v: must be a duration such as 50ms, 2s or 0.5 (seconds) (got '5 s')");
  EXPECT_EQ(get("x:\n  v: 0s\n", [](const ConfigNode& n) { n.Duration(); }),
            "r.yaml:2: x.v: must be > 0 (got '0s')");
  EXPECT_EQ(get("x:\n  v: 16 MiB\n", [](const ConfigNode& n) { n.ByteSize(); }),
            "r.yaml:2: x.v: must be a size such as 16MiB, 64KiB or 1048576 (got '16 MiB')");
  EXPECT_EQ(get("x:\n  v: [1]\n", [](const ConfigNode& n) { n.String(); }),
            "r.yaml:2: x.v: must be a string");
  EXPECT_EQ(get("x:\n  v:\n", [](const ConfigNode& n) { n.String(); }),
            "r.yaml:2: x.v: must be a string");
  EXPECT_EQ(get("x:\n  w: 1\n", [](const ConfigNode& n) { n.Int(); }), "r.yaml:2: x.v: required");
  EXPECT_EQ(get("x:\n  v: {a: 1}\n", [](const ConfigNode& n) { n.Items("a list of things"); }),
            "r.yaml:2: x.v: must be a list of things");
  EXPECT_EQ(get("x:\n  v: [a]\n", [](const ConfigNode& n) { n.Entries(); }),
            "r.yaml:2: x.v: must be a mapping");
  EXPECT_EQ(ErrorOf("- a\n", [](const ConfigNode& r) { r.Entries(); }),
            "r.yaml:1: the top level must be a mapping");
  EXPECT_EQ(get("x:\n  v: 1\n", [](const ConfigNode& n) { n.Fail("custom problem"); }),
            "r.yaml:2: x.v: custom problem");
}

TEST(YamlReader, EnumsSuggestOrListTheirNames) {
  auto pick = [](std::string_view text) {
    return ErrorOf(text, [](const ConfigNode& r) {
      r.Get("p").Enum<int>("process",
                           {{"poisson", 1}, {"gamma", 2}, {"constant", 3}, {"Poisson", 1}});
    });
  };
  EXPECT_EQ(pick("p: gama\n"), "r.yaml:1: p: unknown process 'gama' (did you mean 'gamma'?)");
  // Aliases (a second name for the same value) are accepted but not listed.
  EXPECT_EQ(pick("p: Poisson\n"), "");
  EXPECT_EQ(pick("p: burst\n"),
            "r.yaml:1: p: unknown process 'burst' (known: poisson, gamma, constant)");
}

TEST(YamlReader, UnknownKeysGetDidYouMean) {
  auto check = [](std::string_view text) {
    return ErrorOf(text, [](const ConfigNode& r) {
      r.CheckKeys({"pool"});
      r.Get("pool").CheckKeys({"scrape_interval", "staleness", "endpoints"});
    });
  };
  EXPECT_EQ(check("pool:\n  staleness: 1s\n  scrape_intervl: 50ms\n"),
            "r.yaml:3: pool.scrape_intervl: unknown key 'scrape_intervl' (did you mean "
            "'scrape_interval'?)");
  EXPECT_EQ(check("pool: {}\nfoo: 1\n"), "r.yaml:2: foo: unknown key 'foo' (known: pool)");
  EXPECT_EQ(check("pool:\n  staleness: 1s\n  staleness: 2s\n"),
            "r.yaml:3: pool.staleness: duplicate key 'staleness'");
  EXPECT_EQ(check(""), "");         // an empty document is an empty mapping
  EXPECT_EQ(check("pool:\n"), "");  // and so is an empty value
  // ForEachKey reports the first error in file order.
  EXPECT_EQ(ErrorOf("a: x\nb: 1\n",
                    [](const ConfigNode& r) {
                      r.ForEachKey({"a"}, [](const std::string&, const ConfigNode& v) { v.Int(); });
                    }),
            "r.yaml:1: a: must be an integer (got 'x')");
}

TEST(YamlReader, SyntaxErrorsNameTheLine) {
  EXPECT_EQ(ErrorOf("a: 1\nb: [1, 2\nc: 3\n", [](const ConfigNode&) {}),
            "r.yaml:3: YAML syntax error: end of sequence flow not found (column 2)");
  EXPECT_EQ(ErrorOf("a:\n\tb: 1\n", [](const ConfigNode&) {}),
            "r.yaml:2: YAML syntax error: illegal map value (column 3)");
}

TEST(YamlReader, ParseYamlReturnsTheValueOrTheError) {
  auto load = [](std::string_view text) {
    return ParseYaml<int>(
        text, "n.yaml", [](const ConfigNode& r) { return static_cast<int>(r.Require("n").Int()); });
  };
  ConfigOr<int> ok = load("n: 4\n");
  ASSERT_TRUE(ok.ok());
  EXPECT_EQ(*ok.value, 4);
  ConfigOr<int> bad = load("m: 4\n");
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.error.ToString(), "n.yaml:1: n: required");
}

TEST(YamlReader, ConfigOrStatusCarriesTheErrorText) {
  auto load = [](std::string_view text) {
    return ParseYaml<int>(
        text, "n.yaml", [](const ConfigNode& r) { return static_cast<int>(r.Require("n").Int()); });
  };
  EXPECT_TRUE(load("n: 4\n").status().ok());
  Status st = load("m: 4\n").status();
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(st.message(), "n.yaml:1: n: required");
}

TEST(YamlReader, MissingFile) {
  ConfigOr<std::string> r = ReadConfigFile("/nonexistent/x.yaml");
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.error.ToString(), "/nonexistent/x.yaml: cannot read file: No such file or directory");
}

TEST(Suggest, NearMissOrKnownList) {
  EXPECT_EQ(EditDistance("kitten", "sitting"), 3u);
  EXPECT_EQ(Suggest("adress", {"address", "name"}), " (did you mean 'address'?)");
  EXPECT_EQ(Suggest("foo", {"pool", "listen"}), " (known: pool, listen)");
}

TEST(Durations, Parse) {
  EXPECT_DOUBLE_EQ(*ParseDuration("50ms"), 0.05);
  EXPECT_DOUBLE_EQ(*ParseDuration("2s"), 2.0);
  EXPECT_DOUBLE_EQ(*ParseDuration("1.5s"), 1.5);
  EXPECT_DOUBLE_EQ(*ParseDuration("250us"), 250e-6);
  EXPECT_DOUBLE_EQ(*ParseDuration("2m"), 120.0);
  EXPECT_DOUBLE_EQ(*ParseDuration("1h"), 3600.0);
  EXPECT_DOUBLE_EQ(*ParseDuration("0.25"), 0.25);
  EXPECT_DOUBLE_EQ(*ParseDuration("3"), 3.0);
  EXPECT_DOUBLE_EQ(*ParseDuration("0"), 0.0);
  EXPECT_EQ(ParseDuration(""), std::nullopt);
  EXPECT_EQ(ParseDuration("ms"), std::nullopt);
  EXPECT_EQ(ParseDuration("5 s"), std::nullopt);
  EXPECT_EQ(ParseDuration("5sec"), std::nullopt);
  EXPECT_EQ(ParseDuration("-1s"), std::nullopt);
  EXPECT_EQ(ParseDuration("1e400s"), std::nullopt);
  EXPECT_EQ(ParseDuration("0x10"), std::nullopt);
  EXPECT_EQ(ParseDuration("nan"), std::nullopt);
}

TEST(ByteSizes, Parse) {
  EXPECT_EQ(ParseByteSize("16MiB"), 16u << 20);
  EXPECT_EQ(ParseByteSize("64KiB"), 64u << 10);
  EXPECT_EQ(ParseByteSize("1GiB"), 1u << 30);
  EXPECT_EQ(ParseByteSize("2MB"), 2000000u);
  EXPECT_EQ(ParseByteSize("1.5KiB"), 1536u);
  EXPECT_EQ(ParseByteSize("1024"), 1024u);
  EXPECT_EQ(ParseByteSize("1024B"), 1024u);
  EXPECT_EQ(ParseByteSize("1.5"), std::nullopt);
  EXPECT_EQ(ParseByteSize("16mib"), std::nullopt);
  EXPECT_EQ(ParseByteSize("-1"), std::nullopt);
}

}  // namespace
}  // namespace kvroute::config
