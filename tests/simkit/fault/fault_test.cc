// The pure fault model: kind names, field parsing and validation, the JSON admin body,
// schedules in virtual time and the per-replica set of active faults.
#include "simkit/fault/fault.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

namespace kvroute::fault {
namespace {

TEST(FaultKindTest, NamesRoundTripAndAreTheContract) {
  const std::vector<std::string_view> want = {
      "crash",   "hang", "delay",         "stall",       "reset",           "http_error",
      "restart", "slow", "metrics_stale", "metrics_nan", "metrics_missing", "metrics_slow",
      "events_stall", "events_drop"};
  ASSERT_EQ(FaultKindNames().size(), want.size());
  for (size_t i = 0; i < want.size(); ++i) {
    EXPECT_EQ(FaultKindNames()[i], want[i]);
    auto k = FaultKindFromName(want[i]);
    ASSERT_TRUE(k.has_value());
    EXPECT_EQ(FaultKindName(*k), want[i]);
  }
  EXPECT_FALSE(FaultKindFromName("Crash").has_value());
  EXPECT_FALSE(FaultKindFromName("").has_value());
}

TEST(FaultDurationTest, SameSyntaxAsConfigDurations) {
  EXPECT_DOUBLE_EQ(*ParseDurationText("250ms"), 0.25);
  EXPECT_DOUBLE_EQ(*ParseDurationText("2s"), 2.0);
  EXPECT_DOUBLE_EQ(*ParseDurationText("1.5"), 1.5);
  EXPECT_DOUBLE_EQ(*ParseDurationText("100us"), 1e-4);
  EXPECT_DOUBLE_EQ(*ParseDurationText("1m"), 60.0);
  EXPECT_DOUBLE_EQ(*ParseDurationText("0"), 0.0);
  EXPECT_FALSE(ParseDurationText("").has_value());
  EXPECT_FALSE(ParseDurationText("s").has_value());
  EXPECT_FALSE(ParseDurationText("-1s").has_value());
  EXPECT_FALSE(ParseDurationText("fast").has_value());
  EXPECT_FALSE(ParseDurationText("2 s").has_value());
}

TEST(FaultFieldTest, SetsFieldsThatApplyToTheKind) {
  FaultSpec s;
  ASSERT_FALSE(SetField(&s, "kind", "http_error"));
  ASSERT_FALSE(SetField(&s, "status", "500"));
  ASSERT_FALSE(SetField(&s, "fraction", "0.25"));
  ASSERT_FALSE(SetField(&s, "at", "10s"));
  ASSERT_FALSE(SetField(&s, "duration", "5s"));
  EXPECT_EQ(s.kind, FaultKind::kHttpError);
  EXPECT_EQ(s.status, 500);
  EXPECT_DOUBLE_EQ(s.fraction, 0.25);
  EXPECT_DOUBLE_EQ(s.at_s, 10.0);
  EXPECT_DOUBLE_EQ(*s.duration_s, 5.0);
}

TEST(FaultFieldTest, ErrorsNameTheField) {
  FaultSpec s;
  auto e = SetField(&s, "kind", "hangg");
  ASSERT_TRUE(e);
  EXPECT_EQ(e->field, "kind");
  EXPECT_NE(e->message.find("unknown fault kind 'hangg'"), std::string::npos);
  EXPECT_NE(e->message.find("hang"), std::string::npos);

  ASSERT_FALSE(SetField(&s, "kind", "hang"));
  e = SetField(&s, "status", "500");
  ASSERT_TRUE(e);
  EXPECT_EQ(e->field, "status");
  EXPECT_EQ(e->message, "does not apply to fault kind 'hang'");
  e = SetField(&s, "durration", "1s");
  ASSERT_TRUE(e);
  EXPECT_EQ(e->field, "durration");
  e = SetField(&s, "duration", "0s");
  ASSERT_TRUE(e);
  EXPECT_EQ(e->field, "duration");

  ASSERT_FALSE(SetField(&s, "kind", "http_error"));
  EXPECT_TRUE(SetField(&s, "status", "200"));
  EXPECT_TRUE(SetField(&s, "status", "5xx"));
  EXPECT_TRUE(SetField(&s, "fraction", "0"));
  EXPECT_TRUE(SetField(&s, "fraction", "1.5"));
  EXPECT_EQ(s.status, 503);  // unchanged by the failures
  ASSERT_FALSE(SetField(&s, "kind", "stall"));
  EXPECT_TRUE(SetField(&s, "after_chunks", "-1"));
  EXPECT_FALSE(SetField(&s, "after_chunks", "0"));
}

TEST(FaultValidateTest, RequiredFields) {
  FaultSpec s;
  s.kind = FaultKind::kDelay;
  std::vector<std::string> set = {"kind"};
  auto e = Validate(s, set, false);
  ASSERT_TRUE(e);
  EXPECT_EQ(e->field, "delay");
  set.push_back("delay");
  EXPECT_FALSE(Validate(s, set, false));

  s.kind = FaultKind::kSlow;
  set = {"kind"};
  e = Validate(s, set, false);
  ASSERT_TRUE(e);
  EXPECT_EQ(e->field, "factor");

  // Crash without a duration: fine in a schedule (down until the end), not over admin.
  s.kind = FaultKind::kCrash;
  EXPECT_FALSE(Validate(s, set, false));
  e = Validate(s, set, true);
  ASSERT_TRUE(e);
  EXPECT_EQ(e->field, "duration");
  EXPECT_TRUE(Validate(s, std::vector<std::string>{}, false));  // kind required
}

TEST(FaultJsonTest, ParsesAnAdminBody) {
  FaultOr r = ParseFaultJson(R"({"kind":"http_error","status":500,"fraction":0.5,"duration":"2s"})");
  ASSERT_TRUE(r.ok()) << r.error.field << ": " << r.error.message;
  EXPECT_EQ(r.spec->kind, FaultKind::kHttpError);
  EXPECT_EQ(r.spec->status, 500);
  EXPECT_DOUBLE_EQ(r.spec->fraction, 0.5);
  EXPECT_DOUBLE_EQ(*r.spec->duration_s, 2.0);

  r = ParseFaultJson(R"({"duration":0.25,"kind":"hang"})");  // kind need not come first
  ASSERT_TRUE(r.ok());
  EXPECT_DOUBLE_EQ(*r.spec->duration_s, 0.25);

  r = ParseFaultJson(R"({"kind":"delay","delay":"150ms","duration":null})");
  ASSERT_TRUE(r.ok());
  EXPECT_DOUBLE_EQ(r.spec->delay_s, 0.15);
  EXPECT_FALSE(r.spec->duration_s.has_value());
}

TEST(FaultJsonTest, BadBodiesNameTheField) {
  struct Case {
    const char* body;
    const char* field;
  };
  const Case cases[] = {
      {"{", ""},
      {"[1]", ""},
      {"{}", "kind"},
      {R"({"kind":7})", "kind"},
      {R"({"kind":"nope"})", "kind"},
      {R"({"kind":"crash"})", "duration"},
      {R"({"kind":"hang","at":"1s"})", "at"},
      {R"({"kind":"hang","duration":true})", "duration"},
      {R"({"kind":"hang","duration":"soon"})", "duration"},
      {R"({"kind":"hang","status":500})", "status"},
      {R"({"kind":"slow"})", "factor"},
      {R"({"kind":"http_error","status":302})", "status"},
      {R"({"kind":"hang","bogus":1})", "bogus"},
  };
  for (const Case& c : cases) {
    FaultOr r = ParseFaultJson(c.body);
    EXPECT_FALSE(r.ok()) << c.body;
    EXPECT_EQ(r.error.field, c.field) << c.body << ": " << r.error.message;
    EXPECT_FALSE(r.error.message.empty());
  }
}

TEST(FaultScheduleTest, ActiveAtInVirtualTime) {
  std::vector<FaultSpec> schedule(4);
  schedule[0].kind = FaultKind::kHang;
  schedule[0].at_s = 10;
  schedule[0].duration_s = 5;
  schedule[1].kind = FaultKind::kHttpError;  // from 0, open-ended
  schedule[2].kind = FaultKind::kRestart;    // one-shot at 20: never "active"
  schedule[2].at_s = 20;
  schedule[3].kind = FaultKind::kRestart;  // 2 s of downtime from 30
  schedule[3].at_s = 30;
  schedule[3].duration_s = 2;
  using V = std::vector<std::size_t>;
  EXPECT_EQ(ActiveAt(schedule, 0.0), (V{1}));
  EXPECT_EQ(ActiveAt(schedule, 9.999), (V{1}));
  EXPECT_EQ(ActiveAt(schedule, 10.0), (V{0, 1}));
  EXPECT_EQ(ActiveAt(schedule, 14.999), (V{0, 1}));
  EXPECT_EQ(ActiveAt(schedule, 15.0), (V{1}));  // [at, at + duration)
  EXPECT_EQ(ActiveAt(schedule, 20.0), (V{1}));
  EXPECT_EQ(ActiveAt(schedule, 31.0), (V{1, 3}));
  EXPECT_EQ(ActiveAt(schedule, 32.0), (V{1}));
}

TEST(FaultSetTest, ActivateExpireClear) {
  FaultSet set;
  EXPECT_TRUE(set.empty());
  FaultSpec hang;
  hang.kind = FaultKind::kHang;
  hang.duration_s = 0.2;
  FaultSpec slow;
  slow.kind = FaultKind::kSlow;
  slow.factor = 3;
  ASSERT_NE(set.Activate(hang, 1.0), nullptr);
  ASSERT_NE(set.Activate(slow, 1.1), nullptr);
  EXPECT_TRUE(set.active(FaultKind::kHang));
  EXPECT_DOUBLE_EQ(*set.NextExpiry(), 1.2);
  EXPECT_TRUE(set.Expire(1.19).empty());
  EXPECT_EQ(set.Expire(1.2), (std::vector<FaultKind>{FaultKind::kHang}));
  EXPECT_FALSE(set.active(FaultKind::kHang));
  EXPECT_FALSE(set.NextExpiry().has_value());  // slow is open-ended
  EXPECT_DOUBLE_EQ(set.Find(FaultKind::kSlow)->spec.factor, 3.0);

  // Same kind again: replaced, with the new end time.
  ASSERT_NE(set.Activate(hang, 2.0), nullptr);
  hang.duration_s = 1.0;
  ASSERT_NE(set.Activate(hang, 2.5), nullptr);
  EXPECT_DOUBLE_EQ(*set.NextExpiry(), 3.5);

  EXPECT_TRUE(set.Clear(FaultKind::kHang));
  EXPECT_FALSE(set.Clear(FaultKind::kHang));
  EXPECT_EQ(set.ClearAll(), (std::vector<FaultKind>{FaultKind::kSlow}));
  EXPECT_TRUE(set.empty());

  FaultSpec restart;
  restart.kind = FaultKind::kRestart;
  EXPECT_EQ(set.Activate(restart, 0.0), nullptr);  // one-shot: nothing stays active
  restart.duration_s = 0.5;
  EXPECT_NE(set.Activate(restart, 0.0), nullptr);  // downtime
  EXPECT_EQ(set.Expire(0.5), (std::vector<FaultKind>{FaultKind::kRestart}));
}

TEST(FaultSetTest, HttpErrorFractionIsDeterministic) {
  auto pattern = [](double fraction, int n) {
    FaultSet set;
    FaultSpec e;
    e.kind = FaultKind::kHttpError;
    e.fraction = fraction;
    set.Activate(e, 0);
    std::string out;
    for (int i = 0; i < n; ++i) out += set.TakeHttpError() ? 'x' : '.';
    return out;
  };
  EXPECT_EQ(pattern(1.0, 5), "xxxxx");
  EXPECT_EQ(pattern(0.5, 6), ".x.x.x");
  EXPECT_EQ(pattern(0.25, 8), "...x...x");
  EXPECT_EQ(pattern(0.1, 20), ".........x.........x");
  EXPECT_EQ(pattern(0.75, 4), ".xxx");
  FaultSet none;
  EXPECT_FALSE(none.TakeHttpError());
}

TEST(FaultFieldTest, EventsDropTakesFractionAndSeed) {
  FaultOr r = ParseFaultJson(R"({"kind":"events_drop","fraction":0.5,"seed":7})");
  ASSERT_TRUE(r.ok()) << r.error.message;
  EXPECT_DOUBLE_EQ(r.spec->fraction, 0.5);
  EXPECT_EQ(r.spec->seed, 7u);
  FaultSpec s;
  ASSERT_FALSE(SetField(&s, "kind", "events_drop"));
  EXPECT_EQ(SetField(&s, "seed", "-1")->message, "must be a non-negative integer (got '-1')");
  EXPECT_EQ(SetField(&s, "fraction", "0")->message, "must be a number in (0, 1] (got '0')");
  ASSERT_FALSE(SetField(&s, "kind", "events_stall"));
  EXPECT_EQ(SetField(&s, "seed", "1")->message, "does not apply to fault kind 'events_stall'");
  ASSERT_FALSE(SetField(&s, "kind", "http_error"));
  EXPECT_EQ(SetField(&s, "seed", "1")->message, "does not apply to fault kind 'http_error'");
}

TEST(FaultSetTest, EventsDropIsDeterministicPerSeedAndSeq) {
  FaultSet set;
  EXPECT_FALSE(set.DropsEventBatch(0));
  FaultSpec spec;
  spec.kind = FaultKind::kEventsDrop;
  spec.fraction = 0.25;
  spec.seed = 1;
  set.Activate(spec, 0.0);
  int dropped = 0;
  std::vector<bool> first;
  for (uint64_t seq = 0; seq < 4000; ++seq) {
    first.push_back(set.DropsEventBatch(seq));
    dropped += first.back();
  }
  EXPECT_NEAR(dropped, 1000, 100);
  for (uint64_t seq = 0; seq < 4000; ++seq) EXPECT_EQ(set.DropsEventBatch(seq), first[seq]);
  spec.seed = 2;
  set.Activate(spec, 0.0);
  int same = 0;
  for (uint64_t seq = 0; seq < 4000; ++seq) same += set.DropsEventBatch(seq) == first[seq];
  EXPECT_LT(same, 3900);  // another seed, another pattern
  spec.fraction = 1.0;
  set.Activate(spec, 0.0);
  for (uint64_t seq = 0; seq < 100; ++seq) EXPECT_TRUE(set.DropsEventBatch(seq));
  EXPECT_EQ(set.ToJson(0.0),
            R"({"active":[{"kind":"events_drop","since_s":0.000,"remaining_s":null,"fraction":1,"seed":2}]})");
}

TEST(FaultSetTest, JsonListsActiveFaults) {
  FaultSet set;
  EXPECT_EQ(set.ToJson(0), R"({"active":[]})");
  FaultSpec e;
  e.kind = FaultKind::kHttpError;
  e.status = 500;
  e.duration_s = 2;
  set.Activate(e, 1.0);
  set.TakeHttpError();
  FaultSpec stall;
  stall.kind = FaultKind::kStall;
  stall.after_chunks = 3;
  set.Activate(stall, 1.5);
  EXPECT_EQ(set.ToJson(2.0),
            R"({"active":[{"kind":"stall","since_s":0.500,"remaining_s":null,"after_chunks":3},)"
            R"({"kind":"http_error","since_s":1.000,"remaining_s":1.000,"duration_s":2,)"
            R"("status":500,"fraction":1,"requests_seen":1,"requests_failed":1}]})");
}

}  // namespace
}  // namespace kvroute::fault
