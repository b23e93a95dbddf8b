#include "llm/text/template_filters.h"

#include <algorithm>
#include <cctype>

namespace sluice::llm::jinja {
namespace {

std::string Strip(const std::string& s, const std::string& chars) {
  const size_t begin = s.find_first_not_of(chars);
  if (begin == std::string::npos) return "";
  return s.substr(begin, s.find_last_not_of(chars) - begin + 1);
}

}  // namespace

Value CallMethod(const Value& self, const std::string& name, const List& args) {
  if (auto s = self.str()) {
    const std::string chars = args.empty() || !args[0].str() ? kWhitespace : *args[0].str();
    if (name == "strip") return Value(Strip(*s, chars));
    if (name == "lstrip") {
      const size_t begin = s->find_first_not_of(chars);
      return Value(begin == std::string::npos ? "" : s->substr(begin));
    }
    if (name == "rstrip") {
      const size_t end = s->find_last_not_of(chars);
      return Value(end == std::string::npos ? "" : s->substr(0, end + 1));
    }
    if (name == "upper" || name == "lower") {
      std::string out = *s;
      for (char& ch : out)
        ch = static_cast<char>(name == "upper" ? std::toupper(static_cast<unsigned char>(ch))
                                               : std::tolower(static_cast<unsigned char>(ch)));
      return Value(out);
    }
    if ((name == "startswith" || name == "endswith") && !args.empty() && args[0].str()) {
      const std::string& affix = *args[0].str();
      if (affix.size() > s->size()) return Value(false);
      return Value(name == "startswith"
                       ? s->compare(0, affix.size(), affix) == 0
                       : s->compare(s->size() - affix.size(), affix.size(), affix) == 0);
    }
    if (name == "split") {
      List parts;
      const std::string sep = args.empty() || !args[0].str() ? " " : *args[0].str();
      size_t begin = 0;
      for (size_t at; !sep.empty() && (at = s->find(sep, begin)) != std::string::npos;
           begin = at + sep.size()) {
        parts.push_back(Value(s->substr(begin, at - begin)));
      }
      parts.push_back(Value(s->substr(begin)));
      return Value(parts);
    }
    if (name == "replace" && args.size() >= 2 && args[0].str() && args[1].str()) {
      std::string out = *s;
      const std::string& from = *args[0].str();
      const std::string& to = *args[1].str();
      for (size_t at = 0; !from.empty() && (at = out.find(from, at)) != std::string::npos;
           at += to.size()) {
        out.replace(at, from.size(), to);
      }
      return Value(out);
    }
  }
  if (auto d = self.dict()) {
    if (name == "get" && !args.empty() && args[0].str()) {
      auto it = d->find(*args[0].str());
      return it != d->end() ? it->second : args.size() > 1 ? args[1] : Value(nullptr);
    }
    if (name == "items") {
      List items;
      for (const auto& [key, value] : *d) items.push_back(Value(List{Value(key), value}));
      return Value(items);
    }
    if (name == "keys" || name == "values") {
      List out;
      for (const auto& [key, value] : *d) out.push_back(name == "keys" ? Value(key) : value);
      return Value(out);
    }
  }
  throw TemplateError("unknown method '" + name + "'");
}

Value ApplyFilter(const std::string& name, const Value& value, const List& args) {
  if (name == "trim") return Value(Strip(ToText(value), kWhitespace));
  if (name == "length" || name == "count") {
    if (auto s = value.str()) return Value(static_cast<int64_t>(s->size()));
    if (auto l = value.list()) return Value(static_cast<int64_t>(l->size()));
    if (auto d = value.dict()) return Value(static_cast<int64_t>(d->size()));
    return Value(int64_t{0});
  }
  if (name == "upper" || name == "lower") return CallMethod(Value(ToText(value)), name, {});
  if (name == "string") return Value(ToText(value));
  if (name == "tojson") {
    std::string out;
    WritePythonJson(value, out);
    return Value(out);
  }
  if (name == "default" || name == "d") {
    return value.undefined() && !args.empty() ? args[0] : value;
  }
  if (name == "join") {
    std::string out;
    const std::string sep = args.empty() ? "" : ToText(args[0]);
    if (auto l = value.list()) {
      for (size_t i = 0; i < l->size(); ++i) out += (i ? sep : "") + ToText((*l)[i]);
    }
    return Value(out);
  }
  if (name == "first" || name == "last") {
    if (auto l = value.list(); l && !l->empty()) return name == "first" ? l->front() : l->back();
    return Value();
  }
  if (name == "items") {
    List out;
    if (auto d = value.dict()) {
      for (const auto& [key, v] : *d) out.push_back(Value(List{Value(key), v}));
    }
    return Value(out);
  }
  if (name == "list") {
    if (value.list()) return value;
    List out;
    if (auto s = value.str()) {
      for (char ch : *s) out.push_back(Value(std::string(1, ch)));
    } else if (auto d = value.dict()) {
      for (const auto& [key, v] : *d) out.push_back(Value(key));
    }
    return Value(out);
  }
  if (name == "selectattr" || name == "rejectattr") {
    // (attribute[, test[, argument]]): the items whose attribute passes the test (truthy without
    // one), or, rejectattr, those whose does not.
    if (args.empty() || !args[0].str()) throw TemplateError(name + " needs an attribute name");
    const std::string test = args.size() > 1 ? ToText(args[1]) : "";
    List out;
    if (auto l = value.list()) {
      for (const Value& item : *l) {
        Value field;
        if (auto d = item.dict()) {
          auto it = d->find(*args[0].str());
          if (it != d->end()) field = it->second;
        }
        bool pass;
        if (test.empty()) {
          pass = field.Truthy();
        } else if (test == "equalto" || test == "==" || test == "eq") {
          pass = args.size() > 2 && ToText(field) == ToText(args[2]) &&
                 (field.str() != nullptr) == (args[2].str() != nullptr);
        } else if (test == "defined") {
          pass = !field.undefined();
        } else if (test == "undefined") {
          pass = field.undefined();
        } else if (test == "none") {
          pass = field.none();
        } else if (test == "string") {
          pass = field.str() != nullptr;
        } else {
          throw TemplateError(name + ": unknown test '" + test + "'");
        }
        if (pass == (name == "selectattr")) out.push_back(item);
      }
    }
    return Value(out);
  }
  throw TemplateError("unknown filter '" + name + "'");
}

}  // namespace sluice::llm::jinja
