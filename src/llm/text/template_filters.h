// A chat template's filters ({{ x | tojson }}, selectattr, ...) and the methods of its strings,
// lists and dicts ({{ s.strip() }}, d.items()), as Jinja and Python have them. Internal to the
// chat template (chat_template.cc).
#pragma once

#include <stdexcept>
#include <string>

#include "llm/text/template_value.h"

namespace sluice::llm::jinja {

// What a template does wrong (at parse or render time).
struct TemplateError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

inline const std::string kWhitespace = " \t\n\r\f\v";

// self.name(args...); TemplateError for a method it has not.
Value CallMethod(const Value& self, const std::string& name, const List& args);
// value | name(args...); TemplateError for an unknown filter.
Value ApplyFilter(const std::string& name, const Value& value, const List& args);

}  // namespace sluice::llm::jinja
