// Base64 (RFC 4648, standard alphabet) decoding and encoding.
#pragma once

#include <string>
#include <string_view>

#include "sluice/status.h"

namespace sluice {

// Decodes `text`; padding is optional, whitespace and characters outside the alphabet are
// errors (kInvalidArgument naming the offset). A "data:...;base64," prefix is accepted.
Result<std::string> Base64Decode(std::string_view text);

std::string Base64Encode(std::string_view bytes);

}  // namespace sluice
