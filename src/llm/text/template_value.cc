#include "llm/text/template_value.h"

#include <fmt/format.h>
#include <simdjson.h>

#include <cmath>
#include <string>

namespace sluice::llm::jinja {

Value::Value(Dict d) : v(std::make_shared<Dict>(std::move(d))) {}

bool Value::Truthy() const {
  if (undefined() || none()) return false;
  if (auto b = std::get_if<bool>(&v)) return *b;
  if (auto i = integer()) return *i != 0;
  if (auto r = real()) return *r != 0;
  if (auto s = str()) return !s->empty();
  if (auto l = list()) return !l->empty();
  if (auto d = dict()) return !d->empty();
  return false;
}

namespace {

// A JSON document as a template value (objects keep their key order; numbers with a fraction or
// exponent are floats).
Value FromJson(simdjson::dom::element element) {
  switch (element.type()) {
    case simdjson::dom::element_type::ARRAY: {
      List list;
      simdjson::dom::array array;
      if (element.get(array) == simdjson::SUCCESS) {
        for (simdjson::dom::element item : array) list.push_back(FromJson(item));
      }
      return Value(std::move(list));
    }
    case simdjson::dom::element_type::OBJECT: {
      Dict dict;
      simdjson::dom::object object;
      if (element.get(object) == simdjson::SUCCESS) {
        for (auto field : object) dict[std::string(field.key)] = FromJson(field.value);
      }
      return Value(std::move(dict));
    }
    case simdjson::dom::element_type::INT64:
      return Value(element.get_int64().value_unsafe());
    case simdjson::dom::element_type::UINT64:
      return Value(static_cast<double>(element.get_uint64().value_unsafe()));
    case simdjson::dom::element_type::DOUBLE:
      return Value(element.get_double().value_unsafe());
    case simdjson::dom::element_type::STRING:
      return Value(std::string(element.get_string().value_unsafe()));
    case simdjson::dom::element_type::BOOL:
      return Value(element.get_bool().value_unsafe());
    case simdjson::dom::element_type::NULL_VALUE:
      return Value(nullptr);
  }
  return Value();
}

// A float as Python's repr() writes it ("0.5", "1.0", "1e-05").
std::string FloatText(double value) {
  if (std::isnan(value)) return "NaN";
  if (std::isinf(value)) return value > 0 ? "Infinity" : "-Infinity";
  std::string text = fmt::format("{}", value);
  if (text.find_first_of(".en") == std::string::npos) text += ".0";
  return text;
}

}  // namespace

Value ParseJsonValue(const std::string& text) {
  simdjson::dom::parser parser;
  simdjson::dom::element root;
  if (parser.parse(text).get(root) != simdjson::SUCCESS) return Value(text);
  return FromJson(root);
}

// Python's json.dumps(value, ensure_ascii=False), as transformers' tojson filter writes it:
// ", " and ": " between items, keys in their order, non-ASCII characters as they are.
void WritePythonJson(const Value& value, std::string& out) {
  if (value.undefined() || value.none()) {
    out += "null";
  } else if (auto b = std::get_if<bool>(&value.v)) {
    out += *b ? "true" : "false";
  } else if (auto i = value.integer()) {
    out += std::to_string(*i);
  } else if (auto r = value.real()) {
    out += FloatText(*r);
  } else if (auto s = value.str()) {
    out += '"';
    for (const char ch : *s) {
      switch (ch) {
        case '"':
          out += "\\\"";
          break;
        case '\\':
          out += "\\\\";
          break;
        case '\n':
          out += "\\n";
          break;
        case '\r':
          out += "\\r";
          break;
        case '\t':
          out += "\\t";
          break;
        case '\b':
          out += "\\b";
          break;
        case '\f':
          out += "\\f";
          break;
        default:
          if (static_cast<unsigned char>(ch) < 0x20) {
            out += fmt::format("\\u{:04x}", static_cast<int>(ch));
          } else {
            out += ch;
          }
      }
    }
    out += '"';
  } else if (auto l = value.list()) {
    out += '[';
    for (size_t k = 0; k < l->size(); ++k) {
      if (k > 0) out += ", ";
      WritePythonJson((*l)[k], out);
    }
    out += ']';
  } else if (auto d = value.dict()) {
    out += '{';
    bool first = true;
    for (const auto& [key, item] : *d) {
      if (!first) out += ", ";
      first = false;
      WritePythonJson(Value(key), out);
      out += ": ";
      WritePythonJson(item, out);
    }
    out += '}';
  }
}

std::string ToText(const Value& value) {
  if (value.undefined()) return "";
  if (value.none()) return "None";
  if (auto b = std::get_if<bool>(&value.v)) return *b ? "True" : "False";
  if (auto i = value.integer()) return std::to_string(*i);
  if (auto r = value.real()) return FloatText(*r);
  if (auto s = value.str()) return *s;
  std::string out;
  WritePythonJson(value, out);
  return out;
}

bool Equal(const Value& a, const Value& b) {
  if (a.str() && b.str()) return *a.str() == *b.str();
  if ((a.real() || a.integer()) && (b.real() || b.integer()) && (a.real() || b.real())) {
    const double x = a.real() ? *a.real() : static_cast<double>(*a.integer());
    const double y = b.real() ? *b.real() : static_cast<double>(*b.integer());
    return x == y;
  }
  if (a.integer() && b.integer()) return *a.integer() == *b.integer();
  if (std::holds_alternative<bool>(a.v) && std::holds_alternative<bool>(b.v)) {
    return std::get<bool>(a.v) == std::get<bool>(b.v);
  }
  if ((a.none() || a.undefined()) && (b.none() || b.undefined())) return a.none() == b.none();
  if (a.list() && b.list()) {
    if (a.list()->size() != b.list()->size()) return false;
    for (size_t i = 0; i < a.list()->size(); ++i) {
      if (!Equal((*a.list())[i], (*b.list())[i])) return false;
    }
    return true;
  }
  return false;
}

}  // namespace sluice::llm::jinja
