// HttpServer on its own (no engine): a router with test routes, real loopback sockets.
#include "http/http_server.h"

#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <future>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

namespace sluice {
namespace {

// A blocking loopback connection whose reads give up after `timeout`.
class Connection {
 public:
  Connection(uint16_t port, std::chrono::seconds timeout) {
    fd_ = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_port = htons(port);
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    connected_ = connect(fd_, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0;
    timeval tv{static_cast<time_t>(timeout.count()), 0};
    setsockopt(fd_, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  }
  ~Connection() { close(fd_); }
  bool connected() const { return connected_; }
  bool Send(const std::string& data) {
    return send(fd_, data.data(), data.size(), MSG_NOSIGNAL) == static_cast<ssize_t>(data.size());
  }
  // What arrives until `text` has (or the server closes the connection, or a read times out).
  std::string ReadUntil(const std::string& text) {
    std::string all;
    char buffer[4096];
    ssize_t n;
    while (all.find(text) == std::string::npos && (n = recv(fd_, buffer, sizeof(buffer), 0)) > 0) {
      all.append(buffer, static_cast<size_t>(n));
    }
    return all;
  }
  // Everything until the server closes the connection (or a read times out).
  std::string ReadToClose() { return ReadUntil(std::string(1, '\0')); }
  // Whether the server closed the connection (end of stream, not a timeout).
  bool ClosedByServer() {
    char byte;
    return recv(fd_, &byte, 1, 0) == 0;
  }

 private:
  int fd_ = -1;
  bool connected_ = false;
};

// Whether a new connection to `port` is refused (the listening socket is closed).
bool Refused(uint16_t port) { return !Connection(port, std::chrono::seconds(1)).connected(); }

class HttpServerTest : public ::testing::Test {
 protected:
  // Starts the server on an ephemeral loopback port with router_'s routes, and sends GET `path`
  // on a new connection (client_).
  void StartAndGet(const std::string& path) {
    HttpServerOptions options;
    options.port = 0;
    server_ = std::make_unique<HttpServer>(options, router_);
    ASSERT_TRUE(server_->Start().ok());
    client_ = std::make_unique<Connection>(server_->port(), std::chrono::seconds(10));
    ASSERT_TRUE(client_->connected());
    ASSERT_TRUE(client_->Send("GET " + path + " HTTP/1.1\r\nHost: test\r\n\r\n"));
  }

  Router router_;  // Outlives the server.
  std::unique_ptr<HttpServer> server_;
  std::unique_ptr<Connection> client_;
};

TEST_F(HttpServerTest, AnswerGivenAfterTheListenerClosedIsStillWrittenAndShutdownEndsAtOnce) {
  // The handler answers later, from another thread, with nothing pending on the connection
  // meanwhile (it does not watch for a disconnect): the I/O threads must still be there to write.
  std::promise<Responder> held;
  router_.Get("/later", [&held](const HttpRequest&, const PathParams&, Responder respond) {
    held.set_value(std::move(respond));
  });
  ASSERT_NO_FATAL_FAILURE(StartAndGet("/later"));
  HttpServer& server = *server_;
  Responder respond = held.get_future().get();

  const auto grace = std::chrono::seconds(20);
  const auto shutdown_start = std::chrono::steady_clock::now();
  std::thread shutdown([&server, grace] { server.Shutdown(grace); });
  while (!Refused(server.port())) std::this_thread::sleep_for(std::chrono::milliseconds(5));

  // Answered, and the responder (which holds the connection) let go, as a handler does.
  std::exchange(respond, nullptr)(HttpResponse::Json(200, R"({"answer":"late"})"));
  const std::string reply = client_->ReadToClose();
  shutdown.join();
  EXPECT_EQ(reply.rfind("HTTP/1.1 200", 0), 0u) << reply;
  EXPECT_NE(reply.find(R"({"answer":"late"})"), std::string::npos) << reply;
  EXPECT_NE(reply.find("Connection: close"), std::string::npos) << reply;
  // Answered and closed: shutdown did not wait out its grace.
  EXPECT_LT(std::chrono::steady_clock::now() - shutdown_start, grace / 2);
  EXPECT_EQ(server.stats().open_connections, 0);
}

TEST_F(HttpServerTest, IdleKeepAliveConnectionClosesWhenShutdownBegins) {
  router_.Get("/now", [](const HttpRequest&, const PathParams&, Responder respond) {
    respond(HttpResponse::Json(200, R"({"answer":"now"})"));
  });
  ASSERT_NO_FATAL_FAILURE(StartAndGet("/now"));
  const std::string reply = client_->ReadUntil(R"({"answer":"now"})");
  ASSERT_NE(reply.find(R"({"answer":"now"})"), std::string::npos) << reply;
  EXPECT_EQ(reply.find("Connection: close"), std::string::npos) << reply;  // Kept alive.

  const auto grace = std::chrono::seconds(20);
  const auto shutdown_start = std::chrono::steady_clock::now();
  server_->Shutdown(grace);
  EXPECT_LT(std::chrono::steady_clock::now() - shutdown_start, grace / 2);
  EXPECT_TRUE(client_->ClosedByServer());
  EXPECT_EQ(server_->stats().open_connections, 0);
}

TEST_F(HttpServerTest, AConnectionWhoseRequestComesJustAfterShutdownBeginsIsAnswered) {
  // A client connects (the server takes the connection) and sends its request only after the
  // drain has begun: it is answered, with Connection: close, not reset. The drain gives an idle
  // connection a short while to deliver a request before closing it.
  router_.Get("/now", [](const HttpRequest&, const PathParams&, Responder respond) {
    respond(HttpResponse::Json(200, R"({"answer":"now"})"));
  });
  ASSERT_NO_FATAL_FAILURE(StartAndGet("/now"));
  ASSERT_NE(client_->ReadUntil(R"({"answer":"now"})").find("now"), std::string::npos);
  Connection late(server_->port(), std::chrono::seconds(10));
  ASSERT_TRUE(late.connected());
  std::this_thread::sleep_for(std::chrono::milliseconds(50));  // Taken by the acceptor.
  HttpServer& server = *server_;
  std::thread shutdown([&server] { server.Shutdown(std::chrono::seconds(20)); });
  while (!Refused(server.port())) std::this_thread::sleep_for(std::chrono::milliseconds(5));
  std::this_thread::sleep_for(std::chrono::milliseconds(30));
  ASSERT_TRUE(late.Send("GET /now HTTP/1.1\r\nHost: test\r\n\r\n"));
  const std::string reply = late.ReadToClose();
  shutdown.join();
  EXPECT_EQ(reply.rfind("HTTP/1.1 200 OK\r\n", 0), 0u) << reply;
  EXPECT_NE(reply.find("Connection: close"), std::string::npos) << reply;
  EXPECT_TRUE(client_->ClosedByServer());  // The idle kept-alive one closed.
  EXPECT_EQ(server.stats().open_connections, 0);
}

// A request is parsed from what one read brought when it is whole, and read on when it is not:
// a header and body sent apart, a header cut in two, and two requests in one write all get their
// answers, in order, each a complete HTTP/1.1 message.
TEST_F(HttpServerTest, RequestsInPiecesOrSeveralToAWriteAreEachAnsweredWhole) {
  router_.Post("/echo", [](const HttpRequest& request, const PathParams&, Responder respond) {
    HttpResponse response = HttpResponse::Json(200, "{\"echo\":" + request.body + "}");
    response.headers.emplace_back("X-Length", std::to_string(request.body.size()));
    respond(std::move(response));
  });
  ASSERT_NO_FATAL_FAILURE(StartAndGet("/missing"));
  std::string reply = client_->ReadUntil("}");
  EXPECT_EQ(reply.rfind("HTTP/1.1 404 Not Found\r\n", 0), 0u) << reply;

  auto post = [](const std::string& body) {
    return "POST /echo HTTP/1.1\r\nHost: test\r\nContent-Length: " + std::to_string(body.size()) +
           "\r\n\r\n" + body;
  };
  const std::string whole = post("[1]");
  const std::string expected =
      "HTTP/1.1 200 OK\r\nServer: sluice\r\nContent-Type: application/json\r\n"
      "X-Length: 3\r\nContent-Length: 12\r\n\r\n{\"echo\":[1]}";
  // The header, then the body a moment later.
  ASSERT_TRUE(client_->Send(whole.substr(0, whole.size() - 3)));
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  ASSERT_TRUE(client_->Send(whole.substr(whole.size() - 3)));
  EXPECT_EQ(client_->ReadUntil("[1]}"), expected);
  // A header cut in two.
  ASSERT_TRUE(client_->Send(whole.substr(0, 10)));
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  ASSERT_TRUE(client_->Send(whole.substr(10)));
  EXPECT_EQ(client_->ReadUntil("[1]}"), expected);
  // Two in one write.
  ASSERT_TRUE(client_->Send(whole + post("[22]")));
  reply = client_->ReadUntil("[22]}");
  EXPECT_EQ(reply.substr(0, expected.size()), expected) << reply;
  EXPECT_NE(reply.find("X-Length: 4\r\nContent-Length: 13\r\n\r\n{\"echo\":[22]}"),
            std::string::npos)
      << reply;
}

// Refusals for overload on one connection are spaced: the first leaves at once, the next one
// sent straight after it leaves about 250 ms after the first; the connection stays open for a
// refused body of 100 KiB (read, not kept); an admitted request right after a refusal is answered
// at once, and so is one refusal after a quiet spell.
TEST_F(HttpServerTest, OverloadRefusalsOnAConnectionAreSpacedAndAdmittedRequestsAreNotHeld) {
  std::atomic<bool> refusing{true};
  router_.Post("/work", [](const HttpRequest&, const PathParams&, Responder respond) {
    respond(HttpResponse::Json(200, "{\"done\":1}"));
  });
  router_.SetAdmission("POST", "/work", [&](const PathParams&) -> Result<AdmissionTicket> {
    if (refusing) return Status::Unavailable("busy").WithRetryAfter(0.5);
    return AdmissionTicket();
  });
  ASSERT_NO_FATAL_FAILURE(StartAndGet("/missing"));
  ASSERT_NE(client_->ReadUntil("}").find("404"), std::string::npos);

  const std::string body(100 << 10, 'x');
  const std::string request =
      "POST /work HTTP/1.1\r\nHost: test\r\nContent-Length: " + std::to_string(body.size()) +
      "\r\n\r\n" + body;
  using Ms = std::chrono::duration<double, std::milli>;
  auto exchange = [&](const std::string& expect) {
    const auto start = std::chrono::steady_clock::now();
    EXPECT_TRUE(client_->Send(request));
    const std::string reply = client_->ReadUntil("}");
    EXPECT_EQ(reply.rfind(expect, 0), 0u) << reply;
    return std::chrono::steady_clock::now() - start;
  };
  const auto first = exchange("HTTP/1.1 503");
  const auto second = exchange("HTTP/1.1 503");
  const auto third = exchange("HTTP/1.1 503");
  EXPECT_LT(Ms(first).count(), 200);
  EXPECT_GE(Ms(second).count(), 150);
  EXPECT_GE(Ms(second + third).count(), 400);
  refusing = false;
  EXPECT_LT(Ms(exchange("HTTP/1.1 200")).count(), 200);
  refusing = true;
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  EXPECT_LT(Ms(exchange("HTTP/1.1 503")).count(), 200);
}

// While a handler holds a request, the connection is watched: an answer that comes later is
// written, and a client that leaves first has the handler's cancel called.
TEST_F(HttpServerTest, AWatchedRequestIsAnsweredOrCancelledWhenItsClientLeaves) {
  std::promise<Responder> held;
  std::promise<void> cancelled;
  router_.Get("/held", [&](const HttpRequest& request, const PathParams&, Responder respond) {
    request.on_disconnect([&cancelled] { cancelled.set_value(); });
    held.set_value(std::move(respond));
  });
  ASSERT_NO_FATAL_FAILURE(StartAndGet("/held"));
  Responder respond = held.get_future().get();
  std::this_thread::sleep_for(std::chrono::milliseconds(20));  // The watch is in place.
  std::exchange(respond, nullptr)(HttpResponse::Json(200, R"({"answer":"held"})"));
  EXPECT_NE(client_->ReadUntil(R"({"answer":"held"})").find(R"({"answer":"held"})"),
            std::string::npos);

  // Again on the same connection; this time the client leaves before the answer.
  held = std::promise<Responder>();
  ASSERT_TRUE(client_->Send("GET /held HTTP/1.1\r\nHost: test\r\n\r\n"));
  respond = held.get_future().get();
  client_.reset();
  EXPECT_EQ(cancelled.get_future().wait_for(std::chrono::seconds(10)), std::future_status::ready);
  std::exchange(respond, nullptr)(HttpResponse::Json(200, R"({"answer":"too late"})"));
}

TEST_F(HttpServerTest, AClientThatLeftBeforeTheWatchBeganStillCancelsItsRequest) {
  // The request and the client's end of stream arrive together, and the handler returns only
  // after the other I/O thread has had time to see the socket turn readable with nothing waiting
  // on it. A watch that waited for the next readiness edge would wait forever: there is none.
  std::promise<void> left;
  std::promise<void> cancelled;
  Responder respond;
  router_.Get("/held", [&](const HttpRequest& request, const PathParams&, Responder r) {
    request.on_disconnect([&cancelled] { cancelled.set_value(); });
    respond = std::move(r);
    left.get_future().wait();
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  });
  ASSERT_NO_FATAL_FAILURE(StartAndGet("/held"));
  client_.reset();
  left.set_value();
  EXPECT_EQ(cancelled.get_future().wait_for(std::chrono::seconds(10)), std::future_status::ready);
  // The responder is set before the handler returns, which it has once the watch could start.
  std::exchange(respond, nullptr)(HttpResponse::Json(200, R"({"answer":"too late"})"));
}

TEST_F(HttpServerTest, AStreamGoesInChunksOnHttp11AndAsItComesThenCloseOnHttp10) {
  router_.Get("/events", [](const HttpRequest&, const PathParams&, Responder respond) {
    HttpResponse response;
    response.content_type = "text/event-stream";
    response.stream = std::make_shared<ResponseStream>();
    std::shared_ptr<ResponseStream> stream = response.stream;
    respond(std::move(response));
    std::thread([stream] {
      stream->Write("data: one\n\n");
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
      stream->Write("data: two\n\n");
      stream->Close();
    }).detach();
  });
  ASSERT_NO_FATAL_FAILURE(StartAndGet("/events"));
  const std::string head =
      "HTTP/1.1 200 OK\r\nServer: sluice\r\nContent-Type: text/event-stream\r\n"
      "Transfer-Encoding: chunked\r\n\r\n";
  std::string chunked = client_->ReadUntil("0\r\n\r\n");
  // The producer's writes may arrive in one chunk or two.
  EXPECT_TRUE(chunked == head + "b\r\ndata: one\n\n\r\nb\r\ndata: two\n\n\r\n0\r\n\r\n" ||
              chunked == head + "16\r\ndata: one\n\ndata: two\n\n\r\n0\r\n\r\n")
      << chunked;
  // The connection stays open for the next request.
  ASSERT_TRUE(client_->Send("GET /events HTTP/1.1\r\nHost: test\r\n\r\n"));
  EXPECT_NE(client_->ReadUntil("0\r\n\r\n").find("data: two"), std::string::npos);

  // HTTP/1.0 has no chunks: the bytes as they come, and the close ends the body.
  Connection old(server_->port(), std::chrono::seconds(10));
  ASSERT_TRUE(old.Send("GET /events HTTP/1.0\r\nConnection: keep-alive\r\n\r\n"));
  EXPECT_EQ(old.ReadToClose(),
            "HTTP/1.0 200 OK\r\nServer: sluice\r\nContent-Type: text/event-stream\r\n\r\n"
            "data: one\n\ndata: two\n\n");
}

TEST_F(HttpServerTest, RenderedBodiesAndStreamRenderersAreMadeOffTheProducersThread) {
  // For each renderer run: whether it ran on a thread other than the one that produced it.
  auto elsewhere = std::make_shared<std::vector<bool>>();
  auto mu = std::make_shared<std::mutex>();
  auto note = [elsewhere, mu](std::thread::id producer) {
    std::lock_guard<std::mutex> lock(*mu);
    elsewhere->push_back(std::this_thread::get_id() != producer);
  };
  router_.Get("/rendered", [=](const HttpRequest&, const PathParams&, Responder respond) {
    std::thread([=] {
      const std::thread::id me = std::this_thread::get_id();
      respond(HttpResponse::RenderedJson(200, [=] {
        note(me);
        return std::string(R"({"made":"late"})");
      }));
    }).detach();
  });
  router_.Get("/posted", [=](const HttpRequest&, const PathParams&, Responder respond) {
    HttpResponse response;
    response.content_type = "text/event-stream";
    response.stream = std::make_shared<ResponseStream>();
    std::shared_ptr<ResponseStream> stream = response.stream;
    respond(std::move(response));
    std::thread([=] {
      const std::thread::id me = std::this_thread::get_id();
      stream->Write("data: one\n\n");
      stream->Post(
          [=] {
            note(me);
            return std::string("data: two\n\n");
          },
          16);
      stream->Close();
    }).detach();
  });
  ASSERT_NO_FATAL_FAILURE(StartAndGet("/rendered"));
  EXPECT_EQ(client_->ReadUntil(R"({"made":"late"})"),
            "HTTP/1.1 200 OK\r\nServer: sluice\r\nContent-Type: application/json\r\n"
            "Content-Length: 15\r\n\r\n{\"made\":\"late\"}");
  ASSERT_TRUE(client_->Send("GET /posted HTTP/1.1\r\nHost: test\r\n\r\n"));
  const std::string chunked = client_->ReadUntil("0\r\n\r\n");
  ASSERT_NE(chunked.find("data: two\n\n"), std::string::npos) << chunked;
  EXPECT_LT(chunked.find("data: one\n\n"), chunked.find("data: two\n\n")) << chunked;
  std::lock_guard<std::mutex> lock(*mu);
  EXPECT_EQ(*elsewhere, (std::vector<bool>{true, true}));
}

}  // namespace
}  // namespace sluice
