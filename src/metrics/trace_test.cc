#include "metrics/trace.h"

#include <gtest/gtest.h>
#include <simdjson.h>
#include <unistd.h>

#include <fstream>
#include <iterator>
#include <map>
#include <string>
#include <vector>

namespace sluice {
namespace {

TEST(TraceparentTest, ParsesTheSpecificationsExample) {
  auto context = ParseTraceparent("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01");
  ASSERT_TRUE(context.has_value());
  EXPECT_EQ(context->trace_id[0], 0x4b);
  EXPECT_EQ(context->trace_id[15], 0x36);
  EXPECT_EQ(context->parent_id, 0x00f067aa0ba902b7u);
  EXPECT_TRUE(context->sampled());
  // Sent on with our span in place of the caller's; trace id and flags kept.
  EXPECT_EQ(FormatTraceparent(*context, 0x1122334455667788u),
            "00-4bf92f3577b34da6a3ce929d0e0e4736-1122334455667788-01");
  auto unsampled =
      ParseTraceparent(" 00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-00 ");
  ASSERT_TRUE(unsampled.has_value());
  EXPECT_FALSE(unsampled->sampled());
  // A later version may add fields after a dash.
  EXPECT_TRUE(
      ParseTraceparent("01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-extra").has_value());
}

TEST(TraceparentTest, MalformedHeadersAreIgnored) {
  for (const char* bad : {
           "",
           "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7",         // No flags.
           "00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01",      // Upper case.
           "00-00000000000000000000000000000000-00f067aa0ba902b7-01",      // Zero trace id.
           "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",      // Zero parent.
           "ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",      // Version ff.
           "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-x",    // v00 is exact.
           "00_4bf92f3577b34da6a3ce929d0e0e4736_00f067aa0ba902b7_01",      // Separators.
           "00-4bf92f3577b34da6a3ce929d0e0e473g-00f067aa0ba902b7-01",      // Not hex.
       }) {
    EXPECT_FALSE(ParseTraceparent(bad).has_value()) << bad;
  }
}

TEST(TraceWriterTest, SamplesExactlyTheRateEvenlySpread) {
  std::string path = testing::TempDir() + "/sample-" + std::to_string(getpid()) + ".json";
  auto writer = TraceWriter::Open({.path = path, .sample_rate = 0.25});
  ASSERT_TRUE(writer.ok()) << writer.status().message();
  int traced = 0, longest_gap = 0, gap = 0;
  for (int i = 0; i < 1000; ++i) {
    if ((*writer)->ShouldSample()) {
      ++traced;
      gap = 0;
    } else {
      longest_gap = std::max(longest_gap, ++gap);
    }
  }
  EXPECT_EQ(traced, 250);
  EXPECT_EQ(longest_gap, 3);
  EXPECT_TRUE((*writer)->ShouldSample(/*forced=*/true));  // The caller sampled it.
  auto none = TraceWriter::Open({.path = path, .sample_rate = 0});
  ASSERT_TRUE(none.ok());
  for (int i = 0; i < 100; ++i) EXPECT_FALSE((*none)->ShouldSample());
  EXPECT_FALSE(TraceWriter::Open({.path = path, .sample_rate = 1.5}).ok());
  EXPECT_FALSE(TraceWriter::Open({.path = "/nonexistent-dir/x.json"}).ok());
}

struct Event {
  std::string name, ph, cat;
  double ts = 0, dur = 0;
  int64_t tid = 0;
  std::map<std::string, std::string> args;  // Values as raw JSON.
};

std::vector<Event> ReadEvents(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::string text((std::istreambuf_iterator<char>(in)), {});
  simdjson::dom::parser parser;
  simdjson::dom::element doc;
  EXPECT_EQ(parser.parse(text).get(doc), simdjson::SUCCESS) << text;
  std::vector<Event> events;
  simdjson::dom::array array;
  if (doc["traceEvents"].get_array().get(array)) return events;
  for (simdjson::dom::element e : array) {
    Event event;
    event.name = std::string(e["name"].get_string().value());
    event.ph = std::string(e["ph"].get_string().value());
    std::string_view cat;
    if (!e["cat"].get_string().get(cat)) event.cat = cat;
    double d;
    if (!e["ts"].get_double().get(d)) event.ts = d;
    if (!e["dur"].get_double().get(d)) event.dur = d;
    event.tid = e["tid"].get_int64().value();
    simdjson::dom::object args;
    if (!e["args"].get_object().get(args)) {
      for (auto [key, value] : args) event.args[std::string(key)] = simdjson::minify(value);
    }
    events.push_back(event);
  }
  return events;
}

TEST(TraceWriterTest, StagesTileTheRequestAndBatchesAppearOncePerInstance) {
  std::string path = testing::TempDir() + "/tile-" + std::to_string(getpid()) + ".json";
  auto writer = TraceWriter::Open({.path = path});
  ASSERT_TRUE(writer.ok());
  const Clock::time_point t0 = Clock::Real().Now();
  auto at = [&](int us) { return t0 + std::chrono::microseconds(us); };
  // Two requests of one batch on two connections, and a request no model ran.
  for (int lane : {7, 8}) {
    RequestTrace trace;
    trace.name = "POST /v2/models/m/infer";
    trace.start = at(lane);
    trace.lane = static_cast<uint64_t>(lane);
    trace.status = 200;
    trace.model = "m";
    trace.End(TraceStage::kRead, at(20));
    InferResponse response;
    response.times = {at(30), at(100), at(110), at(300)};
    response.batch_id = 5;
    response.batch_size = 2;
    response.instance = 1;
    trace.SetEngineTimes(response);
    trace.End(TraceStage::kRespond, at(310));
    trace.End(TraceStage::kEncode, at(330));
    trace.End(TraceStage::kWrite, at(350));
    auto context = ParseTraceparent("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01");
    trace.trace_id = context->trace_id;
    trace.parent_span_id = context->parent_id;
    trace.span_id = 0xabc;
    (*writer)->Record(std::move(trace));
  }
  RequestTrace health;
  health.name = "GET \"/v2/health/ready\"";  // Quotes must be escaped.
  health.start = at(400);
  health.lane = 9;
  health.status = 200;
  health.End(TraceStage::kRead, at(410));
  health.End(TraceStage::kHandle, at(415));
  health.End(TraceStage::kWrite, at(425));
  (*writer)->Record(std::move(health));
  ASSERT_TRUE((*writer)->Close().ok());
  EXPECT_EQ((*writer)->written(), 3u);
  (*writer)->Record(RequestTrace{});  // After Close(): dropped, counted.
  EXPECT_EQ((*writer)->dropped(), 1u);

  std::vector<Event> events = ReadEvents(path);
  std::map<int64_t, Event> roots;
  std::map<int64_t, std::vector<Event>> stages;
  std::vector<Event> batches;
  for (const Event& e : events) {
    if (e.cat == "request") roots[e.tid] = e;
    if (e.cat == "stage") stages[e.tid].push_back(e);
    if (e.cat == "batch") batches.push_back(e);
  }
  ASSERT_EQ(roots.size(), 3u);
  for (auto& [tid, root] : roots) {
    double at_us = root.ts, sum = 0;
    for (const Event& s : stages[tid]) {
      EXPECT_NEAR(s.ts, at_us, 1e-3) << s.name;  // Back to back, from the root's start.
      at_us = s.ts + s.dur;
      sum += s.dur;
    }
    EXPECT_NEAR(sum, root.dur, 1e-2);
    EXPECT_NEAR(at_us, root.ts + root.dur, 1e-2);
  }
  std::vector<std::string> names;
  for (const Event& s : stages[7]) names.push_back(s.name);
  EXPECT_EQ(names, (std::vector<std::string>{"read", "decode", "queue", "batch", "compute",
                                             "respond", "encode", "write"}));
  EXPECT_NEAR(stages[7][2].dur, 70, 1e-3);   // Queue: 30 -> 100 us.
  EXPECT_NEAR(stages[7][4].dur, 190, 1e-3);  // Compute: 110 -> 300 us.
  EXPECT_EQ(stages[7][4].args["batch_id"], "5");
  EXPECT_EQ(roots[7].args["trace_id"], "\"4bf92f3577b34da6a3ce929d0e0e4736\"");
  EXPECT_EQ(roots[7].args["parent_span_id"], "\"00f067aa0ba902b7\"");
  EXPECT_EQ(roots[7].args["span_id"], "\"0000000000000abc\"");
  EXPECT_EQ(roots[7].args["model"], "\"m\"");
  names.clear();
  for (const Event& s : stages[9]) names.push_back(s.name);
  EXPECT_EQ(names, (std::vector<std::string>{"read", "handle", "write"}));
  EXPECT_EQ(roots[9].name, "GET \"/v2/health/ready\"");
  // The batch once, on its own lane, named after its model and instance.
  ASSERT_EQ(batches.size(), 1u);
  EXPECT_NEAR(batches[0].dur, 190, 1e-3);
  bool lane_named = false;
  for (const Event& e : events) {
    if (e.ph == "M" && e.tid == batches[0].tid) lane_named = e.args.at("name") == "\"m instance 1\"";
  }
  EXPECT_TRUE(lane_named);
}

TEST(TraceWriterTest, AFullFileDropsLaterRequestsAndStaysValid) {
  std::string path = testing::TempDir() + "/full-" + std::to_string(getpid()) + ".json";
  auto writer = TraceWriter::Open({.path = path, .max_bytes = 2000});
  ASSERT_TRUE(writer.ok());
  const Clock::time_point t0 = Clock::Real().Now();
  for (int i = 0; i < 100; ++i) {
    RequestTrace trace;
    trace.name = "GET /v2";
    trace.start = t0;
    trace.lane = 1;
    trace.End(TraceStage::kWrite, t0 + std::chrono::microseconds(10));
    (*writer)->Record(std::move(trace));
  }
  ASSERT_TRUE((*writer)->Close().ok());
  EXPECT_GT((*writer)->written(), 0u);
  EXPECT_LT((*writer)->written(), 100u);
  EXPECT_EQ((*writer)->written() + (*writer)->dropped(), 100u);
  size_t roots = 0;
  for (const Event& e : ReadEvents(path)) roots += e.cat == "request";
  EXPECT_EQ(roots, (*writer)->written());
}

}  // namespace
}  // namespace sluice
