// The HTTP request path, end to end: raw bytes on a loopback connection to the real server
// (Beast parsing, limits, keep-alive and pipelining, the route table, the v2 and predict handlers,
// the codecs, the engine with an echo backend). Each input is one connection: its bytes are sent,
// the write side is closed, and every byte of the answer is read. The server must close the
// connection within seconds and answer only in HTTP.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>

#include "common/thread_pool.h"
#include "engine/engine.h"
#include "engine/fake_backends.h"
#include "fuzz/fuzz_models.h"
#include "http/http_server.h"
#include "http/predict_handlers.h"
#include "http/v2_handlers.h"

namespace {

using sluice::Seconds;

// Built once per process and never destroyed: the server keeps running between inputs.
class Fixture {
 public:
  Fixture()
      : engine_([](const sluice::ModelConfig&) -> sluice::Result<std::shared_ptr<sluice::Backend>> {
          return std::shared_ptr<sluice::Backend>(std::make_shared<sluice::testing::EchoBackend>());
        }),
        service_(engine_),
        v2_(service_, [this] { return server_ ? server_->stats() : sluice::HttpStats{}; }),
        decode_pool_(1, 64),
        predict_(engine_, decode_pool_, "image") {
    for (const auto& config : {sluice::fuzz::MultiInputConfig(), sluice::fuzz::EchoConfig(),
                               sluice::fuzz::ImageConfig()}) {
      Check(engine_.AddModel(config));
    }
    service_.SetLoadError("broken", "cannot read model.pt");
    v2_.AddRoutes(router_);
    predict_.AddRoutes(router_);
    sluice::HttpServerOptions options;
    options.port = 0;
    options.io_threads = 2;
    options.max_body_bytes = 1 << 16;
    options.max_header_bytes = 4096;
    options.idle_timeout = Seconds(2);
    options.header_timeout = Seconds(2);
    options.body_timeout = Seconds(2);
    options.max_connections = 64;
    server_ = std::make_unique<sluice::HttpServer>(options, router_);
    Check(server_->Start());
  }

  uint16_t port() const { return server_->port(); }

 private:
  static void Check(const sluice::Status& status) {
    if (!status.ok()) {
      std::fprintf(stderr, "http_fuzzer: %s\n", status.message().c_str());
      std::abort();
    }
  }

  sluice::Engine engine_;
  sluice::V2Service service_;
  sluice::V2Handlers v2_;
  sluice::ThreadPool decode_pool_;
  sluice::PredictHandlers predict_;
  sluice::Router router_;
  std::unique_ptr<sluice::HttpServer> server_;
};

[[noreturn]] void Fail(const char* what) {
  std::fprintf(stderr, "http_fuzzer: %s (errno %d)\n", what, errno);
  std::abort();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static Fixture* fixture = new Fixture();
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) Fail("socket");
  timeval timeout{5, 0};  // Longer than every server timeout: no answer by then is a hang.
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &timeout, sizeof timeout);
  setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &timeout, sizeof timeout);
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_port = htons(fixture->port());
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  // libFuzzer's timeout alarm interrupts system calls (EINTR); an interrupted connect goes on
  // in the background (EALREADY until it completes, then EISCONN).
  while (connect(fd, reinterpret_cast<sockaddr*>(&address), sizeof address) != 0) {
    if (errno == EISCONN) break;
    if (errno != EINTR && errno != EALREADY) Fail("connect");
  }
  // The server may answer early (413, 431, 400) and close before reading everything.
  size_t sent = 0;
  while (sent < size) {
    ssize_t n = send(fd, data + sent, size - sent, MSG_NOSIGNAL);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    sent += static_cast<size_t>(n);
  }
  shutdown(fd, SHUT_WR);
  std::string answer;
  char buffer[16384];
  for (;;) {
    ssize_t n = recv(fd, buffer, sizeof buffer, 0);
    if (n > 0) {
      answer.append(buffer, static_cast<size_t>(n));
      continue;
    }
    if (n == 0 || errno == ECONNRESET) break;
    if (errno == EINTR) continue;
    Fail("the server neither answered nor closed the connection");
  }
  close(fd);
  if (!answer.empty() && answer.rfind("HTTP/1.", 0) != 0) Fail("an answer that is not HTTP");
  return 0;
}
