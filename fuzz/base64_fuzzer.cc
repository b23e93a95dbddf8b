// Base64: decoding arbitrary text never fails other than with an error, and decode(encode(x))
// gives x back.
#include <cstdint>
#include <cstdlib>
#include <string_view>

#include "codec/base64.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string_view text(reinterpret_cast<const char*>(data), size);
  auto decoded = sluice::Base64Decode(text);
  if (decoded.ok()) {
    // Whatever decodes re-encodes to something that decodes to the same bytes.
    auto again = sluice::Base64Decode(sluice::Base64Encode(*decoded));
    if (!again.ok() || *again != *decoded) std::abort();
  }
  auto round_trip = sluice::Base64Decode(sluice::Base64Encode(text));
  if (!round_trip.ok() || *round_trip != text) std::abort();
  return 0;
}
