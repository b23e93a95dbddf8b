// Helpers of the black-box server tests: `sluice serve` as a child process on ephemeral loopback
// ports (stopped by its PID), and a minimal blocking HTTP/1.1 client.
#pragma once

#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iterator>
#include <map>
#include <sstream>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

namespace sluice_test {

// A running `sluice serve`, stopped by its PID (SIGTERM) at the end.
class ServerProcess {
 public:
  explicit ServerProcess(std::vector<std::string> extra_args = {},
                         std::string repository = SLUICE_TEST_MODELS) {
    int out[2];
    if (pipe(out) != 0) return;
    pid_ = fork();
    if (pid_ == 0) {
      dup2(out[1], STDOUT_FILENO);
      close(out[0]);
      close(out[1]);
      std::vector<std::string> args = {SLUICE_BINARY, "serve",  "--model-repository",
                                       repository,    "--port", "0"};
      args.insert(args.end(), extra_args.begin(), extra_args.end());
      std::vector<char*> argv;
      for (auto& a : args) argv.push_back(a.data());
      argv.push_back(nullptr);
      execv(argv[0], argv.data());
      _exit(127);
    }
    close(out[1]);
    stdout_ = fdopen(out[0], "r");
    char line[512];
    while (stdout_ && fgets(line, sizeof(line), stdout_)) {
      output_ += line;
      const char* grpc = strstr(line, "Sluice gRPC listening on 127.0.0.1:");
      if (grpc) grpc_port_ = atoi(grpc + strlen("Sluice gRPC listening on 127.0.0.1:"));
      const char* marker = strstr(line, "Sluice listening on http://127.0.0.1:");
      if (marker) {
        port_ = atoi(marker + strlen("Sluice listening on http://127.0.0.1:"));
        break;
      }
    }
  }
  ~ServerProcess() {
    if (pid_ > 0 && !stopped_) Stop();
    if (stdout_) fclose(stdout_);
  }
  // SIGTERM, then the exit status (as from waitpid). What the server printed after it started is
  // read first (to its end), so it never blocks on a full pipe; a server that waited out its
  // shutdown grace with something still open fails the test.
  int Stop() {
    stopped_ = true;
    kill(pid_, SIGTERM);
    char line[512];
    while (stdout_ && fgets(line, sizeof(line), stdout_)) output_ += line;
    int status = 0;
    waitpid(pid_, &status, 0);
    if (output_.find("shutdown grace expired") != std::string::npos) {
      ADD_FAILURE() << "sluice serve left something open at SIGTERM:\n" << output_;
    }
    return status;
  }
  int port() const { return port_; }
  // The gRPC port, when started with --grpc-port; 0 otherwise.
  int grpc_port() const { return grpc_port_; }
  pid_t pid() const { return pid_; }
  const std::string& output() const { return output_; }

 private:
  pid_t pid_ = -1;
  FILE* stdout_ = nullptr;
  int port_ = 0;
  int grpc_port_ = 0;
  bool stopped_ = false;
  std::string output_;
};

struct Response {
  int status = 0;
  std::map<std::string, std::string> headers;  // Lower-case names.
  std::string body;
  bool closed = false;  // The server closed the connection after this response.
};

// A minimal HTTP/1.1 client over a blocking socket; responses carry Content-Length.
class Client {
 public:
  explicit Client(int port) {
    fd_ = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_port = htons(static_cast<uint16_t>(port));
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    connected_ = connect(fd_, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0;
    int one = 1;
    setsockopt(fd_, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    timeval timeout{10, 0};
    setsockopt(fd_, SOL_SOCKET, SO_RCVTIMEO, &timeout, sizeof(timeout));
  }
  ~Client() { close(fd_); }
  bool connected() const { return connected_; }

  bool SendRaw(std::string_view data) {
    while (!data.empty()) {
      ssize_t n = send(fd_, data.data(), data.size(), MSG_NOSIGNAL);
      if (n <= 0) return false;
      data.remove_prefix(static_cast<size_t>(n));
    }
    return true;
  }

  // Reads one response (status 0 when the connection closed or timed out first).
  Response Read() {
    Response r;
    size_t header_end;
    while ((header_end = buffer_.find("\r\n\r\n")) == std::string::npos) {
      if (!Fill()) return r;
    }
    std::istringstream head(buffer_.substr(0, header_end));
    std::string line;
    std::getline(head, line);
    if (line.size() >= 12) r.status = std::stoi(line.substr(9, 3));
    while (std::getline(head, line)) {
      if (!line.empty() && line.back() == '\r') line.pop_back();
      size_t colon = line.find(':');
      if (colon == std::string::npos) continue;
      std::string name = line.substr(0, colon);
      for (char& c : name) c = static_cast<char>(std::tolower(c));
      r.headers[name] = line.substr(line.find_first_not_of(' ', colon + 1));
    }
    size_t length = r.headers.count("content-length") ? std::stoul(r.headers["content-length"]) : 0;
    buffer_.erase(0, header_end + 4);
    while (buffer_.size() < length) {
      if (!Fill()) return Response{};
    }
    r.body = buffer_.substr(0, length);
    buffer_.erase(0, length);
    std::string connection = r.headers["connection"];
    r.closed = connection == "close" || (r.headers.count("connection") == 0 && http10_);
    return r;
  }

  Response Request(const std::string& method, const std::string& path, const std::string& body = "",
                   const std::string& extra_headers = "") {
    std::string request = method + " " + path + " HTTP/1.1\r\nHost: 127.0.0.1\r\n" + extra_headers +
                          "Content-Length: " + std::to_string(body.size()) + "\r\n\r\n" + body;
    if (!SendRaw(request)) return Response{};
    return Read();
  }

  // True when bytes (or the end of the stream) arrive within `ms`.
  bool Readable(int ms) {
    if (!buffer_.empty()) return true;
    pollfd p{fd_, POLLIN, 0};
    return poll(&p, 1, ms) > 0;
  }

  // True when the server has closed the connection (reads EOF within `ms`).
  bool ClosedByServer(int ms = 2000) {
    pollfd p{fd_, POLLIN, 0};
    if (poll(&p, 1, ms) <= 0) return false;
    char c;
    return recv(fd_, &c, 1, MSG_PEEK) == 0;
  }

  void set_http10(bool v) { http10_ = v; }

 private:
  bool Fill() {
    char chunk[65536];
    ssize_t n = recv(fd_, chunk, sizeof(chunk), 0);
    if (n <= 0) return false;
    buffer_.append(chunk, static_cast<size_t>(n));
    return true;
  }

  int fd_ = -1;
  bool connected_ = false;
  bool http10_ = false;
  std::string buffer_;
};

// The whole file at `path` (empty when it cannot be read).
inline std::string ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

// Polls /v2/models/slow/stats (the "slow" model of the tests' repositories) until `needle`
// appears, at most ~2 s.
inline bool WaitForStats(int port, const std::string& needle) {
  for (int i = 0; i < 400; ++i) {
    Client c(port);
    if (c.Request("GET", "/v2/models/slow/stats").body.find(needle) != std::string::npos) {
      return true;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  return false;
}

}  // namespace sluice_test
