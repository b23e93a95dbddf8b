// The HTTP/1.x wire format of an answer's head: status line, header fields and the body's framing
// (Content-Length for a whole body; chunks for a stream on HTTP/1.1), written straight into one
// buffer rather than through a field list. The session sends the head and the body together.
#pragma once

#include <string>
#include <string_view>

#include "http/router.h"

namespace sluice {

// What the connection decides about an answer, beside the answer itself.
struct ResponseFraming {
  unsigned version = 11;         // The request's: 10 (HTTP/1.0) or 11 (HTTP/1.1).
  bool keep_alive = true;        // The connection stays open after this answer.
  std::string_view traceparent;  // The traceparent to echo; none when empty.
};

// Whether an answer of `status` has a body: 1xx, 204 and 304 answers have none.
bool HasBody(int status);

// Whether a streamed answer to a request of `version` goes in chunks. HTTP/1.0 has no chunks:
// such a client gets the bytes as they come, and the closing connection ends the body.
bool StreamsInChunks(unsigned version);

// Appends the head of `response` to `out`: the status line, Server, Content-Type, its extra
// headers, traceparent, Connection where the version's default differs from `keep_alive`, then
// Content-Length of its body (none where !HasBody(status)) or, for a stream,
// Transfer-Encoding: chunked where StreamsInChunks(); and the blank line that ends the head.
void AppendResponseHead(const HttpResponse& response, const ResponseFraming& framing,
                        std::string& out);

}  // namespace sluice
