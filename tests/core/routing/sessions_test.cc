// Session affinity: the session table in virtual time, the token encoding, and the
// routing core's session path (a binding overriding the policy's ranking, moving once when
// its endpoint goes, token routing, reloads).
#include "core/routing/sessions.h"

#include <gtest/gtest.h>

#include <array>
#include <string>

#include "core/routing/routing_core.h"
#include "support/routing_fixture.h"

namespace kvroute::routing {
namespace {

using test_support::ScrapedLoad;
using test_support::TestEndpoint;

SessionTable::Binding To(uint32_t id) { return {id, SessionKey("ep" + std::to_string(id))}; }

TEST(SessionTable, BindsFindsAndRebinds) {
  SessionTable t;
  EXPECT_FALSE(t.Find(SessionKey("a"), 0.0).has_value());
  t.Bind(SessionKey("a"), To(2), 0.0);
  ASSERT_TRUE(t.Find(SessionKey("a"), 1.0).has_value());
  EXPECT_EQ(t.Find(SessionKey("a"), 1.0)->endpoint, 2u);
  EXPECT_EQ(t.Find(SessionKey("a"), 1.0)->address_key, SessionKey("ep2"));
  t.Bind(SessionKey("a"), To(5), 2.0);
  EXPECT_EQ(t.Find(SessionKey("a"), 2.0)->endpoint, 5u);
  EXPECT_EQ(t.size(), 1u);
  EXPECT_FALSE(t.Find(SessionKey("b"), 2.0).has_value());
  t.Erase(SessionKey("a"));
  EXPECT_EQ(t.size(), 0u);
}

TEST(SessionTable, IdleTtlExpiresAtExactlyTtlAndUseRefreshesIt) {
  SessionOptions o;
  o.ttl_s = 300.0;
  SessionTable t(o);
  t.Bind(SessionKey("a"), To(1), 10.0);
  // A lookup does not refresh; a bind does.
  EXPECT_TRUE(t.Find(SessionKey("a"), 309.999).has_value());
  EXPECT_FALSE(t.Find(SessionKey("a"), 310.0).has_value());
  EXPECT_EQ(t.size(), 0u);
  EXPECT_EQ(t.expired(), 1u);

  t.Bind(SessionKey("b"), To(1), 0.0);
  t.Bind(SessionKey("b"), To(1), 200.0);
  EXPECT_TRUE(t.Find(SessionKey("b"), 499.0).has_value());
  EXPECT_FALSE(t.Find(SessionKey("b"), 500.0).has_value());

  // A sweep drops every idle binding at once.
  t.Bind(SessionKey("c"), To(1), 1000.0);
  t.Bind(SessionKey("d"), To(2), 1100.0);
  t.Sweep(1299.0);
  EXPECT_EQ(t.size(), 2u);
  t.Sweep(1300.0);
  EXPECT_EQ(t.size(), 1u);
  t.Sweep(1400.0);
  EXPECT_EQ(t.size(), 0u);
  EXPECT_EQ(t.expired(), 4u);
}

TEST(SessionTable, BoundEvictsTheOldestIdleFirst) {
  SessionOptions o;
  o.max_sessions = 3;
  SessionTable t(o);
  t.Bind(SessionKey("a"), To(0), 1.0);
  t.Bind(SessionKey("b"), To(0), 2.0);
  t.Bind(SessionKey("c"), To(0), 3.0);
  t.Bind(SessionKey("a"), To(0), 4.0);  // a is now the most recently used
  t.Bind(SessionKey("d"), To(0), 5.0);  // b, idle longest, goes
  EXPECT_EQ(t.size(), 3u);
  EXPECT_EQ(t.evicted(), 1u);
  EXPECT_FALSE(t.Find(SessionKey("b"), 5.0).has_value());
  EXPECT_TRUE(t.Find(SessionKey("a"), 5.0).has_value());
  EXPECT_TRUE(t.Find(SessionKey("c"), 5.0).has_value());
  EXPECT_TRUE(t.Find(SessionKey("d"), 5.0).has_value());
  // A smaller bound applies at the next bind.
  o.max_sessions = 1;
  t.SetOptions(o);
  t.Bind(SessionKey("e"), To(0), 6.0);
  EXPECT_EQ(t.size(), 1u);
  EXPECT_TRUE(t.Find(SessionKey("e"), 6.0).has_value());
  EXPECT_EQ(t.evicted(), 4u);
}

TEST(SessionToken, RoundTripsAndRejectsGarbage) {
  EXPECT_EQ(EncodeSessionToken("10.0.0.7:8000"), "MTAuMC4wLjc6ODAwMA==");
  EXPECT_EQ(EncodeSessionToken("127.0.0.1:9001"), "MTI3LjAuMC4xOjkwMDE=");
  EXPECT_EQ(EncodeSessionToken("abc"), "YWJj");
  std::array<char, 256> buf;
  EXPECT_EQ(DecodeSessionToken("MTAuMC4wLjc6ODAwMA==", buf).value(), "10.0.0.7:8000");
  EXPECT_EQ(DecodeSessionToken(" MTAuMC4wLjc6ODAwMA ", buf).value(), "10.0.0.7:8000");
  EXPECT_EQ(DecodeSessionToken("YWJj", buf).value(), "abc");
  EXPECT_FALSE(DecodeSessionToken("", buf).has_value());
  EXPECT_FALSE(DecodeSessionToken("====", buf).has_value());
  EXPECT_EQ(DecodeSessionToken("YWI", buf).value(), "ab");  // padding is optional
  EXPECT_FALSE(DecodeSessionToken("Y", buf).has_value());
  EXPECT_FALSE(DecodeSessionToken("YW=J", buf).has_value());
  EXPECT_FALSE(DecodeSessionToken("YWJj!", buf).has_value());
  EXPECT_FALSE(DecodeSessionToken("YR==", buf).has_value());  // non-zero leftover bits
  EXPECT_FALSE(DecodeSessionToken("YWJjZA=", buf).has_value());  // wrong padding length
  std::array<char, 2> small;
  EXPECT_FALSE(DecodeSessionToken("YWJj", small).has_value());
}

// ---- the routing core ----

uint32_t IdOf(const RoutingCore& core, const std::string& name) {
  for (const auto& ep : core.table()->by_id) {
    if (ep && ep->spec.name == name) return ep->id;
  }
  ADD_FAILURE() << "no endpoint " << name;
  return 0;
}

CoreOptions Options() {
  CoreOptions o;
  o.scheduling.policy = "kvroute";
  o.health.staleness_s = 1000.0;
  return o;
}

std::vector<EndpointSpec> Three() {
  return {TestEndpoint("a", 9001), TestEndpoint("b", 9002), TestEndpoint("c", 9003)};
}

// a is the busiest of three calm endpoints, c the calmest: the policy prefers c.
void ScrapeAll(RoutingCore& core, double at) {
  core.OnScrape(IdOf(core, "a"), ScrapedLoad("4", "3", "0.5", at), at);
  core.OnScrape(IdOf(core, "b"), ScrapedLoad("2", "1", "0.3", at), at);
  core.OnScrape(IdOf(core, "c"), ScrapedLoad("0", "0", "0.1", at), at);
}

struct Served {
  std::string name;
  SessionOutcome session = SessionOutcome::kNone;
};

Served Serve(RoutingCore& core, double now, std::string_view id, std::string_view token = {},
             int i = 0) {
  PickRequest pr;
  pr.request.model = "m";
  pr.request.prompt = "turn " + std::to_string(i) + " of a conversation";
  pr.request.max_tokens = 16;
  pr.session_id = id;
  pr.session_token = token;
  pr.dispatch_first = true;
  PickResult r = core.Pick(pr, now);
  if (!r.ok()) return {};
  core.OnFinished(r.handle, r.ranked[0], 200, now + 0.01);
  return {r.endpoint(0).spec.name, r.session};
}

TEST(RoutingCoreSessions, ABoundSessionOverridesThePolicyAndMovesOnceWhenItsEndpointGoes) {
  RoutingCore core;
  ASSERT_TRUE(core.Configure(Options(), Three(), 0.0).ok());
  // First only a is known: the session binds there.
  core.OnScrape(IdOf(core, "a"), ScrapedLoad("4", "3", "0.5", 0.0), 0.0);
  Served first = Serve(core, 0.1, "conv-1");
  EXPECT_EQ(first.name, "a");
  EXPECT_EQ(first.session, SessionOutcome::kNew);
  // Now c is calmer and the policy would go there, but the session stays on a.
  ScrapeAll(core, 1.0);
  EXPECT_EQ(Serve(core, 1.1, "").name, "c");
  for (int i = 0; i < 20; ++i) {
    Served s = Serve(core, 2.0 + i, "conv-1", {}, i);
    EXPECT_EQ(s.name, "a");
    EXPECT_EQ(s.session, SessionOutcome::kBound);
  }
  EXPECT_EQ(core.session_picks(SessionOutcome::kBound), 20u);
  // a goes down (a connect failure): the session moves once, to the policy's pick, and
  // stays there.
  core.OnUpstreamFailure(IdOf(core, "a"), {"connect_refused", true}, 30.0);
  Served moved = Serve(core, 30.1, "conv-1");
  EXPECT_EQ(moved.name, "c");
  EXPECT_EQ(moved.session, SessionOutcome::kMovedGone);
  // Even when a comes back and c becomes the busier one.
  core.OnScrape(IdOf(core, "a"), ScrapedLoad("0", "0", "0.1", 31.0), 31.0);
  core.OnScrape(IdOf(core, "c"), ScrapedLoad("4", "3", "0.5", 31.0), 31.0);
  for (int i = 0; i < 20; ++i) EXPECT_EQ(Serve(core, 32.0 + i, "conv-1", {}, i).name, "c");
  EXPECT_EQ(core.session_picks(SessionOutcome::kMovedGone), 1u);
  EXPECT_EQ(core.session_picks(SessionOutcome::kMovedSaturated), 0u);
  EXPECT_EQ(core.session_picks(SessionOutcome::kBound), 40u);
  EXPECT_EQ(core.session_picks(SessionOutcome::kNew), 1u);
  EXPECT_EQ(core.sessions(), 1u);
  std::string m;
  core.AppendMetrics(m, 60.0);
  EXPECT_NE(m.find("kvroute_sessions 1.0\n"), std::string::npos) << m;
  EXPECT_NE(m.find("kvroute_session_picks_total{outcome=\"moved_gone\"} 1.0\n"), std::string::npos);
  EXPECT_NE(m.find("kvroute_session_picks_total{outcome=\"bound\"} 40.0\n"), std::string::npos);
  // Idle for the TTL: the binding is gone, the next request starts a new one.
  core.AppendMetrics(m, 51.01 + 300.0);
  EXPECT_EQ(core.sessions(), 0u);
}

TEST(RoutingCoreSessions, ASaturatedEndpointLosesItsSessionToACalmPick) {
  RoutingCore core;
  ASSERT_TRUE(core.Configure(Options(), Three(), 0.0).ok());
  ScrapeAll(core, 0.0);
  EXPECT_EQ(Serve(core, 0.1, "s", {}, 1).name, "c");
  // c saturates (5 waiting): the session moves to the policy's pick.
  ScrapeAll(core, 1.0);
  core.OnScrape(IdOf(core, "c"), ScrapedLoad("8", "5", "0.5", 1.0), 1.0);
  Served s = Serve(core, 1.1, "s", {}, 2);
  EXPECT_EQ(s.name, "b");
  EXPECT_EQ(s.session, SessionOutcome::kMovedSaturated);
  EXPECT_EQ(Serve(core, 1.2, "s", {}, 3).name, "b");
  EXPECT_EQ(core.session_picks(SessionOutcome::kMovedSaturated), 1u);
}

TEST(RoutingCoreSessions, TheTokenRoutesToItsEndpointAndBadTokensAreIgnored) {
  RoutingCore core;
  ASSERT_TRUE(core.Configure(Options(), Three(), 0.0).ok());
  ScrapeAll(core, 0.0);
  const std::string token_a = SessionToken(*core.table()->Find(IdOf(core, "a")));
  EXPECT_EQ(token_a, EncodeSessionToken("127.0.0.1:9001"));
  Served s = Serve(core, 0.1, "", token_a);
  EXPECT_EQ(s.name, "a");
  EXPECT_EQ(s.session, SessionOutcome::kToken);
  // Garbage, and an address that is no endpoint: the policy's pick, no error.
  EXPECT_EQ(Serve(core, 0.2, "", "%%%not base64").name, "c");
  EXPECT_EQ(Serve(core, 0.3, "", EncodeSessionToken("10.9.9.9:1")).session, SessionOutcome::kNone);
  EXPECT_EQ(Serve(core, 0.3, "", EncodeSessionToken("10.9.9.9:1")).name, "c");
  // A token wins over the id's binding, and rebinds the id.
  EXPECT_EQ(Serve(core, 0.4, "conv").name, "c");
  EXPECT_EQ(Serve(core, 0.5, "conv", token_a).name, "a");
  EXPECT_EQ(Serve(core, 0.6, "conv").name, "a");
  // A token for a down endpoint is not followed.
  core.OnUpstreamFailure(IdOf(core, "a"), {"connect_refused", true}, 1.0);
  EXPECT_EQ(Serve(core, 1.1, "", token_a).name, "c");
  EXPECT_EQ(core.session_picks(SessionOutcome::kToken), 2u);
}

TEST(RoutingCoreSessions, ReloadKeepsBindingsOfSurvivingAddresses) {
  RoutingCore core;
  ASSERT_TRUE(core.Configure(Options(), Three(), 0.0).ok());
  ScrapeAll(core, 0.0);
  const uint32_t a = IdOf(core, "a");
  EXPECT_EQ(Serve(core, 0.1, "on-a", EncodeSessionToken("127.0.0.1:9001")).name, "a");
  EXPECT_EQ(Serve(core, 0.2, "on-b", EncodeSessionToken("127.0.0.1:9002")).name, "b");
  // a is removed and d added (it takes a's vacant id); b survives.
  ASSERT_TRUE(core.Configure(Options(), {TestEndpoint("b", 9002), TestEndpoint("c", 9003),
                                         TestEndpoint("d", 9004)},
                             1.0)
                  .ok());
  EXPECT_EQ(IdOf(core, "d"), a);
  // (Fresh metrics: the policy's saturation filter drops endpoints scraped over 1 s ago.)
  core.OnScrape(IdOf(core, "b"), ScrapedLoad("2", "1", "0.3", 1.0), 1.0);
  core.OnScrape(IdOf(core, "c"), ScrapedLoad("0", "0", "0.1", 1.0), 1.0);
  core.OnScrape(IdOf(core, "d"), ScrapedLoad("0", "0", "0.05", 1.0), 1.0);
  Served b = Serve(core, 1.1, "on-b");
  EXPECT_EQ(b.name, "b");
  EXPECT_EQ(b.session, SessionOutcome::kBound);
  // The id a had now names d: not the session's endpoint, so it moves to the pick.
  Served moved = Serve(core, 1.2, "on-a");
  EXPECT_EQ(moved.session, SessionOutcome::kMovedGone);
  EXPECT_EQ(moved.name, "d");
  EXPECT_EQ(core.sessions(), 2u);
}

TEST(RoutingCoreSessions, DisabledSessionsChangeNothing) {
  RoutingCore core;
  CoreOptions o = Options();
  o.sessions.enabled = false;
  ASSERT_TRUE(core.Configure(o, Three(), 0.0).ok());
  ScrapeAll(core, 0.0);
  Served s = Serve(core, 0.1, "x", EncodeSessionToken("127.0.0.1:9001"));
  EXPECT_EQ(s.name, "c");
  EXPECT_EQ(s.session, SessionOutcome::kNone);
  EXPECT_EQ(core.sessions(), 0u);
}

}  // namespace
}  // namespace kvroute::routing
