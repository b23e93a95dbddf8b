// Answer heads byte for byte: framing by version, keep-alive, status and streaming.
#include "http/http_wire.h"

#include <gtest/gtest.h>

#include <memory>
#include <string>

namespace sluice {
namespace {

std::string Head(const HttpResponse& response, ResponseFraming framing) {
  std::string out;
  AppendResponseHead(response, framing, out);
  return out;
}

TEST(HttpWireTest, AWholeAnswerCarriesItsLengthAndTheConnectionAsTheVersionNeeds) {
  const HttpResponse ok = HttpResponse::Json(200, R"({"a":1})");
  EXPECT_EQ(Head(ok, {11, true, {}}),
            "HTTP/1.1 200 OK\r\nServer: sluice\r\nContent-Type: application/json\r\n"
            "Content-Length: 7\r\n\r\n");
  EXPECT_EQ(Head(ok, {11, false, {}}),
            "HTTP/1.1 200 OK\r\nServer: sluice\r\nContent-Type: application/json\r\n"
            "Connection: close\r\nContent-Length: 7\r\n\r\n");
  EXPECT_EQ(Head(ok, {10, true, {}}),
            "HTTP/1.0 200 OK\r\nServer: sluice\r\nContent-Type: application/json\r\n"
            "Connection: keep-alive\r\nContent-Length: 7\r\n\r\n");
  EXPECT_EQ(Head(ok, {10, false, {}}),
            "HTTP/1.0 200 OK\r\nServer: sluice\r\nContent-Type: application/json\r\n"
            "Content-Length: 7\r\n\r\n");
}

TEST(HttpWireTest, ExtraHeadersAndTheTraceparentFollowTheContentType) {
  HttpResponse busy = HttpResponse::Json(503, R"({"error":"busy"})");
  busy.headers = {{"Retry-After", "2"}, {"Server-Timing", "queue;dur=1.5"}};
  EXPECT_EQ(Head(busy, {11, true, "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"}),
            "HTTP/1.1 503 Service Unavailable\r\nServer: sluice\r\n"
            "Content-Type: application/json\r\nRetry-After: 2\r\n"
            "Server-Timing: queue;dur=1.5\r\n"
            "traceparent: 00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01\r\n"
            "Content-Length: 16\r\n\r\n");
}

TEST(HttpWireTest, AnswersWithoutABodyCarryNoLength) {
  HttpResponse none;
  none.status = 204;
  none.body = "ignored";
  EXPECT_EQ(Head(none, {11, true, {}}),
            "HTTP/1.1 204 No Content\r\nServer: sluice\r\nContent-Type: application/json\r\n\r\n");
  none.status = 304;
  EXPECT_EQ(Head(none, {11, true, {}}).find("Content-Length"), std::string::npos);
  // An empty body that is a body still says so.
  EXPECT_NE(Head(HttpResponse::Json(200, ""), {11, true, {}}).find("Content-Length: 0\r\n"),
            std::string::npos);
}

TEST(HttpWireTest, AStreamGoesInChunksOnHttp11AndAsItComesOnHttp10) {
  HttpResponse events;
  events.content_type = "text/event-stream";
  events.headers = {{"Cache-Control", "no-cache"}};
  events.stream = std::make_shared<ResponseStream>();
  EXPECT_TRUE(StreamsInChunks(11));
  EXPECT_FALSE(StreamsInChunks(10));
  EXPECT_EQ(Head(events, {11, true, {}}),
            "HTTP/1.1 200 OK\r\nServer: sluice\r\nContent-Type: text/event-stream\r\n"
            "Cache-Control: no-cache\r\nTransfer-Encoding: chunked\r\n\r\n");
  EXPECT_EQ(Head(events, {10, false, {}}),
            "HTTP/1.0 200 OK\r\nServer: sluice\r\nContent-Type: text/event-stream\r\n"
            "Cache-Control: no-cache\r\n\r\n");
}

TEST(HttpWireTest, AppendsToWhatTheBufferHolds) {
  std::string out = "kept";
  AppendResponseHead(HttpResponse::Json(404, "{}"), {11, true, {}}, out);
  EXPECT_EQ(out.rfind("keptHTTP/1.1 404 Not Found\r\n", 0), 0u);
}

}  // namespace
}  // namespace sluice
