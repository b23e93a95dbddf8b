// HTTP/1.x answer heads.
#include "http/http_wire.h"

#include <fmt/format.h>

#include <boost/beast/http/status.hpp>
#include <iterator>

namespace sluice {

bool HasBody(int status) { return status >= 200 && status != 204 && status != 304; }

bool StreamsInChunks(unsigned version) { return version >= 11; }

void AppendResponseHead(const HttpResponse& response, const ResponseFraming& framing,
                        std::string& out) {
  const auto reason =
      boost::beast::http::obsolete_reason(static_cast<boost::beast::http::status>(response.status));
  size_t size = 128 + reason.size() + response.content_type.size() + framing.traceparent.size();
  for (const auto& [name, value] : response.headers) size += name.size() + value.size() + 4;
  out.reserve(out.size() + size);
  fmt::format_to(std::back_inserter(out), "HTTP/{}.{} {} ", framing.version / 10,
                 framing.version % 10, response.status);
  out.append(reason.data(), reason.size());
  out += "\r\nServer: sluice\r\nContent-Type: ";
  out += response.content_type;
  out += "\r\n";
  for (const auto& [name, value] : response.headers) {
    out += name;
    out += ": ";
    out += value;
    out += "\r\n";
  }
  if (!framing.traceparent.empty()) {
    out += "traceparent: ";
    out += framing.traceparent;
    out += "\r\n";
  }
  // HTTP/1.1 keeps a connection open unless told; HTTP/1.0 closes it unless told.
  if (framing.version >= 11 && !framing.keep_alive) out += "Connection: close\r\n";
  if (framing.version < 11 && framing.keep_alive) out += "Connection: keep-alive\r\n";
  if (response.stream) {
    if (StreamsInChunks(framing.version)) out += "Transfer-Encoding: chunked\r\n";
  } else if (HasBody(response.status)) {
    fmt::format_to(std::back_inserter(out), "Content-Length: {}\r\n", response.body.size());
  }
  out += "\r\n";
}

}  // namespace sluice
