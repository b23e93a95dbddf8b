#include "llm/text/chat_template.h"

#include <fmt/format.h>
#include <simdjson.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <functional>
#include <stdexcept>
#include <variant>

#include "llm/text/harmony.h"
#include "llm/text/template_filters.h"
#include "llm/text/template_value.h"

namespace sluice::llm {
namespace {

using jinja::ApplyFilter;
using jinja::CallMethod;
using jinja::Dict;
using jinja::Equal;
using jinja::kWhitespace;
using jinja::List;
using jinja::ParseJsonValue;
using jinja::TemplateError;
using jinja::ToText;
using jinja::Undefined;
using jinja::Value;
using jinja::WritePythonJson;

// ---- Scopes ----------------------------------------------------------------------------------

struct Context {
  std::vector<Dict> scopes;
  std::string out;
  std::map<std::string, const ChatTemplate::Node*> macros;  // {% macro %}s defined so far.
  Value Lookup(const std::string& name) const {
    for (auto it = scopes.rbegin(); it != scopes.rend(); ++it) {
      auto found = it->find(name);
      if (found != it->end()) return found->second;
    }
    return Value();
  }
};

using Expr = std::function<Value(Context&)>;

// A {% macro %}'s output for `args` (defined with the statements, below).
Value CallMacro(const ChatTemplate::Node& macro, const List& args, Context& c);

// ---- Expression lexer and parser -------------------------------------------------------------

struct Token {
  enum Kind { kName, kString, kNumber, kOp, kEnd } kind;
  std::string text;
};

std::vector<Token> Lex(const std::string& source) {
  std::vector<Token> tokens;
  size_t i = 0;
  while (i < source.size()) {
    const char c = source[i];
    if (std::isspace(static_cast<unsigned char>(c))) {
      ++i;
    } else if (std::isalpha(static_cast<unsigned char>(c)) || c == '_') {
      size_t j = i;
      while (j < source.size() &&
             (std::isalnum(static_cast<unsigned char>(source[j])) || source[j] == '_'))
        ++j;
      tokens.push_back({Token::kName, source.substr(i, j - i)});
      i = j;
    } else if (std::isdigit(static_cast<unsigned char>(c))) {
      size_t j = i;
      while (j < source.size() && std::isdigit(static_cast<unsigned char>(source[j]))) ++j;
      tokens.push_back({Token::kNumber, source.substr(i, j - i)});
      i = j;
    } else if (c == '\'' || c == '"') {
      std::string text;
      size_t j = i + 1;
      for (; j < source.size() && source[j] != c; ++j) {
        if (source[j] == '\\' && j + 1 < source.size()) {
          const char e = source[++j];
          text += e == 'n' ? '\n' : e == 't' ? '\t' : e == 'r' ? '\r' : e;
        } else {
          text += source[j];
        }
      }
      if (j >= source.size()) throw TemplateError("unterminated string literal");
      tokens.push_back({Token::kString, text});
      i = j + 1;
    } else {
      static const char* kOps[] = {"==", "!=", "<=", ">=", "//", "**", "<", ">", "+",
                                   "-",  "*",  "/",  "%",  "~",  "(",  ")", "[", "]",
                                   "{",  "}",  ",",  ":",  ".",  "|",  "="};
      bool matched = false;
      for (const char* op : kOps) {
        const size_t n = std::char_traits<char>::length(op);
        if (source.compare(i, n, op) == 0) {
          tokens.push_back({Token::kOp, op});
          i += n;
          matched = true;
          break;
        }
      }
      if (!matched) throw TemplateError(fmt::format("unexpected character '{}'", c));
    }
  }
  tokens.push_back({Token::kEnd, ""});
  return tokens;
}

class ExprParser {
 public:
  explicit ExprParser(std::vector<Token> tokens) : tokens_(std::move(tokens)) {}

  bool AtEnd() const { return tokens_[pos_].kind == Token::kEnd; }
  bool PeekName(const char* name) const {
    return tokens_[pos_].kind == Token::kName && tokens_[pos_].text == name;
  }
  bool PeekOp(const char* op) const {
    return tokens_[pos_].kind == Token::kOp && tokens_[pos_].text == op;
  }
  bool AcceptName(const char* name) {
    if (!PeekName(name)) return false;
    ++pos_;
    return true;
  }
  bool AcceptOp(const char* op) {
    if (!PeekOp(op)) return false;
    ++pos_;
    return true;
  }
  void ExpectOp(const char* op) {
    if (!AcceptOp(op))
      throw TemplateError(fmt::format("expected '{}' near '{}'", op, tokens_[pos_].text));
  }
  std::string Name() {
    if (tokens_[pos_].kind != Token::kName) {
      throw TemplateError(fmt::format("expected a name near '{}'", tokens_[pos_].text));
    }
    return tokens_[pos_++].text;
  }
  void ExpectEnd() {
    if (!AtEnd()) throw TemplateError(fmt::format("unexpected '{}'", tokens_[pos_].text));
  }

  Expr Expression() {
    Expr value = Or();
    if (AcceptName("if")) {
      Expr condition = Or();
      Expr otherwise = AcceptName("else") ? Expression() : Expr([](Context&) { return Value(); });
      return [=](Context& c) { return condition(c).Truthy() ? value(c) : otherwise(c); };
    }
    return value;
  }

  // Without the conditional form: a for loop's `if` filter follows its iterable.
  Expr Or() {
    Expr left = And();
    while (AcceptName("or")) {
      Expr right = And();
      left = [=](Context& c) {
        Value a = left(c);
        return a.Truthy() ? a : right(c);
      };
    }
    return left;
  }

 private:
  Expr And() {
    Expr left = Not();
    while (AcceptName("and")) {
      Expr right = Not();
      left = [=](Context& c) {
        Value a = left(c);
        return a.Truthy() ? right(c) : a;
      };
    }
    return left;
  }
  Expr Not() {
    if (AcceptName("not")) {
      Expr inner = Not();
      return [=](Context& c) { return Value(!inner(c).Truthy()); };
    }
    return Compare();
  }
  Expr Compare() {
    Expr left = Concat();
    for (;;) {
      if (tokens_[pos_].kind == Token::kOp && (PeekOp("==") || PeekOp("!=") || PeekOp("<") ||
                                               PeekOp(">") || PeekOp("<=") || PeekOp(">="))) {
        const std::string op = tokens_[pos_++].text;
        Expr right = Concat();
        left = [=](Context& c) { return Value(CompareValues(op, left(c), right(c))); };
      } else if (PeekName("in") || (PeekName("not") && tokens_[pos_ + 1].text == "in")) {
        const bool negate = AcceptName("not");
        AcceptName("in");
        Expr right = Concat();
        left = [=](Context& c) { return Value(Contains(right(c), left(c)) != negate); };
      } else if (AcceptName("is")) {
        const bool negate = AcceptName("not");
        const std::string test = Name();
        left = [=](Context& c) { return Value(Test(test, left(c)) != negate); };
      } else {
        return left;
      }
    }
  }
  static bool CompareValues(const std::string& op, const Value& a, const Value& b) {
    if (op == "==") return Equal(a, b);
    if (op == "!=") return !Equal(a, b);
    int order = 0;
    if (a.integer() && b.integer()) {
      order = *a.integer() < *b.integer() ? -1 : *a.integer() > *b.integer() ? 1 : 0;
    } else if (a.str() && b.str()) {
      order = a.str()->compare(*b.str());
    } else {
      throw TemplateError("'" + op + "' compares values of different types");
    }
    if (op == "<") return order < 0;
    if (op == ">") return order > 0;
    if (op == "<=") return order <= 0;
    return order >= 0;
  }
  static bool Contains(const Value& container, const Value& item) {
    if (auto s = container.str()) {
      return item.str() && s->find(*item.str()) != std::string::npos;
    }
    if (auto l = container.list()) {
      return std::any_of(l->begin(), l->end(), [&](const Value& v) { return Equal(v, item); });
    }
    if (auto d = container.dict()) return item.str() && d->count(*item.str());
    return false;
  }
  static bool Test(const std::string& test, const Value& v) {
    if (test == "defined") return !v.undefined();
    if (test == "undefined") return v.undefined();
    if (test == "none") return v.none();
    if (test == "string") return v.str() != nullptr;
    if (test == "number" || test == "integer") return v.integer() != nullptr;
    if (test == "boolean") return std::holds_alternative<bool>(v.v);
    if (test == "mapping") return v.dict() != nullptr;
    if (test == "iterable" || test == "sequence") return v.list() || v.str() || v.dict();
    if (test == "true") return std::holds_alternative<bool>(v.v) && std::get<bool>(v.v);
    if (test == "false") return std::holds_alternative<bool>(v.v) && !std::get<bool>(v.v);
    throw TemplateError("unknown test '" + test + "'");
  }
  Expr Concat() {
    Expr left = Add();
    while (AcceptOp("~")) {
      Expr right = Add();
      left = [=](Context& c) { return Value(ToText(left(c)) + ToText(right(c))); };
    }
    return left;
  }
  // Tokens [begin, end) as the template wrote them (near enough to find them there).
  std::string Source(size_t begin, size_t end) const {
    std::string text;
    for (size_t i = begin; i < end && i < tokens_.size(); ++i) {
      const Token& t = tokens_[i];
      text += t.kind == Token::kString ? "'" + t.text + "'" : t.text;
    }
    return text;
  }
  static const char* KindOf(const Value& v) {
    if (v.undefined()) return "an undefined value";
    if (v.none()) return "none";
    if (std::holds_alternative<bool>(v.v)) return "a boolean";
    if (v.integer()) return "an integer";
    if (v.real()) return "a number";
    if (v.str()) return "a string";
    if (v.list()) return "a list";
    return "a mapping";
  }
  Expr Add() {
    const size_t start = pos_;
    Expr left = Mul();
    for (;;) {
      if (AcceptOp("+")) {
        const size_t right_start = pos_;
        Expr right = Mul();
        // Named in the error: which operand was what (a tool without a description, say).
        const std::string left_text = Source(start, right_start - 1);
        const std::string right_text = Source(right_start, pos_);
        left = [=](Context& c) {
          Value a = left(c), b = right(c);
          if (a.integer() && b.integer()) return Value(*a.integer() + *b.integer());
          if (a.str() && b.str()) return Value(*a.str() + *b.str());
          if (a.list() && b.list()) {
            List joined = *a.list();
            joined.insert(joined.end(), b.list()->begin(), b.list()->end());
            return Value(joined);
          }
          throw TemplateError(std::string("'+' on ") + KindOf(a) + " (" + left_text + ") and " +
                              KindOf(b) + " (" + right_text + ")");
        };
      } else if (AcceptOp("-")) {
        Expr right = Mul();
        left = [=](Context& c) { return Value(Int(left(c)) - Int(right(c))); };
      } else {
        return left;
      }
    }
  }
  static int64_t Int(const Value& v) {
    if (!v.integer()) throw TemplateError("arithmetic on a value that is not an integer");
    return *v.integer();
  }
  Expr Mul() {
    Expr left = Unary();
    for (;;) {
      std::string op;
      if (PeekOp("*") || PeekOp("//") || PeekOp("%") || PeekOp("/")) {
        op = tokens_[pos_++].text;
      } else {
        return left;
      }
      Expr right = Unary();
      left = [=](Context& c) {
        const int64_t a = Int(left(c)), b = Int(right(c));
        if (op == "*") return Value(a * b);
        if (b == 0) throw TemplateError("division by zero");
        return Value(op == "%" ? a % b : a / b);
      };
    }
  }
  Expr Unary() {
    if (AcceptOp("-")) {
      Expr inner = Unary();
      return [=](Context& c) { return Value(-Int(inner(c))); };
    }
    return Postfix(Primary());
  }
  // After '(' up to and including ')'. Keyword arguments are taken by position; their names in
  // `keywords` where given ("" for a positional one).
  std::vector<Expr> Arguments(std::vector<std::string>* keywords = nullptr) {
    std::vector<Expr> args;
    if (AcceptOp(")")) return args;
    do {
      std::string keyword;
      if (tokens_[pos_].kind == Token::kName && tokens_[pos_ + 1].text == "=") {
        keyword = tokens_[pos_].text;
        pos_ += 2;
      }
      if (keywords != nullptr) keywords->push_back(keyword);
      args.push_back(Expression());
    } while (AcceptOp(","));
    ExpectOp(")");
    return args;
  }
  static List Evaluate(const std::vector<Expr>& args, Context& c) {
    List values;
    for (const Expr& arg : args) values.push_back(arg(c));
    return values;
  }
  Expr Postfix(Expr value) {
    for (;;) {
      if (AcceptOp(".")) {
        const std::string name = Name();
        if (AcceptOp("(")) {
          std::vector<Expr> args = Arguments();
          value = [=](Context& c) { return CallMethod(value(c), name, Evaluate(args, c)); };
        } else {
          value = [=](Context& c) { return Attribute(value(c), Value(name)); };
        }
      } else if (AcceptOp("[")) {
        Expr start, stop, step;
        bool slice = false;
        if (!PeekOp(":")) start = Expression();
        if (AcceptOp(":")) {
          slice = true;
          if (!PeekOp("]") && !PeekOp(":")) stop = Expression();
          if (AcceptOp(":") && !PeekOp("]")) step = Expression();
        }
        ExpectOp("]");
        if (slice) {
          value = [=](Context& c) {
            return Slice(value(c), start ? start(c) : Value(), stop ? stop(c) : Value(),
                         step ? step(c) : Value());
          };
        } else {
          value = [=](Context& c) { return Attribute(value(c), start(c)); };
        }
      } else if (AcceptOp("|")) {
        const std::string name = Name();
        std::vector<Expr> args;
        if (AcceptOp("(")) args = Arguments();
        value = [=](Context& c) { return ApplyFilter(name, value(c), Evaluate(args, c)); };
      } else {
        return value;
      }
    }
  }
  static Value Attribute(const Value& object, const Value& key) {
    if (auto d = object.dict()) {
      if (!key.str()) return Value();
      auto it = d->find(*key.str());
      return it == d->end() ? Value() : it->second;
    }
    if (key.integer() && (object.list() || object.str())) {
      const int64_t size = object.list() ? static_cast<int64_t>(object.list()->size())
                                         : static_cast<int64_t>(object.str()->size());
      int64_t index = *key.integer();
      if (index < 0) index += size;
      if (index < 0 || index >= size) return Value();
      if (object.list()) return (*object.list())[static_cast<size_t>(index)];
      return Value(object.str()->substr(static_cast<size_t>(index), 1));
    }
    return Value();
  }
  static Value Slice(const Value& object, const Value& start, const Value& stop,
                     const Value& step) {
    const int64_t size = object.list()  ? static_cast<int64_t>(object.list()->size())
                         : object.str() ? static_cast<int64_t>(object.str()->size())
                                        : -1;
    if (size < 0) throw TemplateError("slice of a value that is not a list or string");
    const int64_t stride = step.integer() ? *step.integer() : 1;
    if (stride == 0) throw TemplateError("slice step cannot be zero");
    if (stride != 1) {
      // Python's rules: bounds default to the ends in the step's direction.
      auto bound = [&](const Value& v, int64_t fallback) {
        if (!v.integer()) return fallback;
        int64_t i = *v.integer();
        if (i < 0) i += size;
        return stride > 0 ? std::clamp<int64_t>(i, 0, size) : std::clamp<int64_t>(i, -1, size - 1);
      };
      const int64_t from = bound(start, stride > 0 ? 0 : size - 1);
      const int64_t to = bound(stop, stride > 0 ? size : -1);
      List items;
      std::string text;
      for (int64_t i = from; stride > 0 ? i < to : i > to; i += stride) {
        if (object.list()) {
          items.push_back((*object.list())[static_cast<size_t>(i)]);
        } else {
          text += (*object.str())[static_cast<size_t>(i)];
        }
      }
      return object.list() ? Value(items) : Value(text);
    }
    auto clamp = [&](const Value& v, int64_t fallback) {
      if (!v.integer()) return fallback;
      int64_t i = *v.integer();
      if (i < 0) i += size;
      return std::clamp<int64_t>(i, 0, size);
    };
    const int64_t a = clamp(start, 0), b = std::max(a, clamp(stop, size));
    if (object.str())
      return Value(object.str()->substr(static_cast<size_t>(a), static_cast<size_t>(b - a)));
    return Value(List(object.list()->begin() + a, object.list()->begin() + b));
  }
  Expr Primary() {
    const Token token = tokens_[pos_++];
    if (token.kind == Token::kString) {
      std::string text = token.text;
      while (tokens_[pos_].kind == Token::kString) text += tokens_[pos_++].text;  // Adjacent.
      return [text](Context&) { return Value(text); };
    }
    if (token.kind == Token::kNumber) {
      const int64_t number = std::stoll(token.text);
      return [number](Context&) { return Value(number); };
    }
    if (token.kind == Token::kName) {
      if (token.text == "true" || token.text == "True") return [](Context&) { return Value(true); };
      if (token.text == "false" || token.text == "False")
        return [](Context&) { return Value(false); };
      if (token.text == "none" || token.text == "None")
        return [](Context&) { return Value(nullptr); };
      const std::string name = token.text;
      if (name == "namespace" && AcceptOp("(")) {
        // namespace(key=value, ...): an object whose attributes `set` may change.
        std::vector<std::string> keywords;
        std::vector<Expr> args = Arguments(&keywords);
        return [=](Context& c) {
          Dict d;
          for (size_t i = 0; i < args.size(); ++i) {
            if (!keywords[i].empty()) d[keywords[i]] = args[i](c);
          }
          return Value(d);
        };
      }
      if (AcceptOp("(")) {
        std::vector<Expr> args = Arguments();
        return [=](Context& c) {
          auto macro = c.macros.find(name);
          if (macro != c.macros.end()) return CallMacro(*macro->second, Evaluate(args, c), c);
          return CallFunction(name, Evaluate(args, c));
        };
      }
      return [name](Context& c) { return c.Lookup(name); };
    }
    if (token.kind == Token::kOp && token.text == "(") {
      Expr inner = Expression();
      ExpectOp(")");
      return inner;
    }
    if (token.kind == Token::kOp && token.text == "[") {
      std::vector<Expr> items;
      if (!AcceptOp("]")) {
        do items.push_back(Expression());
        while (AcceptOp(","));
        ExpectOp("]");
      }
      return [=](Context& c) { return Value(Evaluate(items, c)); };
    }
    if (token.kind == Token::kOp && token.text == "{") {
      std::vector<std::pair<Expr, Expr>> items;
      if (!AcceptOp("}")) {
        do {
          Expr key = Expression();
          ExpectOp(":");
          items.emplace_back(key, Expression());
        } while (AcceptOp(","));
        ExpectOp("}");
      }
      return [=](Context& c) {
        Dict d;
        for (const auto& [key, value] : items) d[ToText(key(c))] = value(c);
        return Value(d);
      };
    }
    throw TemplateError(fmt::format("unexpected '{}'", token.text));
  }
  static Value CallFunction(const std::string& name, const List& args) {
    if (name == "raise_exception") {
      throw TemplateError(args.empty() ? "the template raised an exception" : ToText(args[0]));
    }
    if (name == "namespace") return Value(Dict());
    if (name == "range") {
      if (args.empty()) throw TemplateError("range() needs an argument");
      const int64_t begin = args.size() > 1 ? Int(args[0]) : 0;
      const int64_t end = Int(args.size() > 1 ? args[1] : args[0]);
      List out;
      for (int64_t i = begin; i < end && out.size() < 100000; ++i) out.push_back(Value(i));
      return Value(out);
    }
    if (name == "strftime_now") return Value("");
    throw TemplateError("unknown function '" + name + "'");
  }

  std::vector<Token> tokens_;
  size_t pos_ = 0;
};

}  // namespace

// ---- Statements ------------------------------------------------------------------------------

struct ChatTemplate::Node {
  enum Kind { kText, kOutput, kIf, kFor, kSet, kMacro } kind = kText;
  std::string text;  // kText
  Expr expr;         // kOutput, kFor (iterable), kSet
  std::vector<std::pair<Expr, std::vector<std::unique_ptr<Node>>>> branches;  // kIf
  std::vector<std::unique_ptr<Node>> body, otherwise;  // kFor (+else), kIf's else
  std::vector<std::string> names;  // kFor variables; kSet target; kMacro name, parameters
  Expr filter;                     // kFor's `if`
  std::vector<Expr> defaults;      // kMacro: each parameter's default (empty: none)
};

namespace {

using Node = ChatTemplate::Node;
using Body = std::vector<std::unique_ptr<Node>>;

// The template cut into text, {{ output }} and {% statement %} pieces, with Jinja's whitespace
// control ({%- -%}) and transformers' trim_blocks + lstrip_blocks applied to the text.
struct Piece {
  enum Kind { kText, kOutput, kStatement } kind;
  std::string text;
};

std::vector<Piece> Segment(const std::string& source) {
  std::vector<Piece> pieces;
  size_t i = 0;
  bool strip_next = false, trim_newline = false;
  while (i <= source.size()) {
    size_t open = source.find('{', i);
    while (open != std::string::npos && open + 1 < source.size() && source[open + 1] != '{' &&
           source[open + 1] != '%' && source[open + 1] != '#') {
      open = source.find('{', open + 1);
    }
    if (open + 1 >= source.size()) open = std::string::npos;
    std::string text = source.substr(i, open == std::string::npos ? std::string::npos : open - i);
    if (trim_newline && !text.empty() && text[0] == '\n') text.erase(0, 1);
    if (strip_next) text.erase(0, std::min(text.size(), text.find_first_not_of(kWhitespace)));
    strip_next = trim_newline = false;
    if (open == std::string::npos) {
      if (!text.empty()) pieces.push_back({Piece::kText, text});
      break;
    }
    const char kind = source[open + 1];
    const std::string close = kind == '{' ? "}}" : kind == '%' ? "%}" : "#}";
    // The close outside string literals: {{ "}}" }} is an output of two braces.
    size_t end = std::string::npos;
    char quote = 0;
    for (size_t k = open + 2; k + 1 < source.size(); ++k) {
      const char ch = source[k];
      if (kind == '#') {
        if (source.compare(k, 2, close) == 0) end = k;
      } else if (quote != 0) {
        if (ch == '\\') {
          ++k;
        } else if (ch == quote) {
          quote = 0;
        }
        continue;
      } else if (ch == '\'' || ch == '"') {
        quote = ch;
        continue;
      } else if (source.compare(k, 2, close) == 0) {
        end = k;
      }
      if (end != std::string::npos) break;
    }
    if (end == std::string::npos) throw TemplateError("unclosed tag");
    std::string inner = source.substr(open + 2, end - open - 2);
    bool strip_before = false, keep_lstrip = false;
    if (!inner.empty() && inner[0] == '-')
      strip_before = true, inner.erase(0, 1);
    else if (!inner.empty() && inner[0] == '+')
      keep_lstrip = true, inner.erase(0, 1);
    if (!inner.empty() && inner.back() == '-') strip_next = true, inner.pop_back();
    if (strip_before) {
      const size_t last = text.find_last_not_of(kWhitespace);
      text.erase(last == std::string::npos ? 0 : last + 1);
    } else if (kind != '{' && !keep_lstrip) {
      // lstrip_blocks: spaces and tabs between the start of a line and a block tag go.
      size_t k = open;
      while (k > i && (source[k - 1] == ' ' || source[k - 1] == '\t')) --k;
      const bool at_line_start = k == 0 || source[k - 1] == '\n';
      if (at_line_start) text.erase(text.size() - std::min(text.size(), open - k));
    }
    if (!text.empty()) pieces.push_back({Piece::kText, text});
    if (kind == '{') pieces.push_back({Piece::kOutput, inner});
    if (kind == '%') pieces.push_back({Piece::kStatement, inner});
    if (kind != '{') trim_newline = true;  // trim_blocks.
    i = end + 2;
  }
  return pieces;
}

class StatementParser {
 public:
  explicit StatementParser(std::vector<Piece> pieces) : pieces_(std::move(pieces)) {}

  // Parses until one of `terminators` (returned, its parser positioned after the keyword).
  std::string Parse(Body& body, std::initializer_list<const char*> terminators, ExprParser** rest) {
    while (pos_ < pieces_.size()) {
      const Piece& piece = pieces_[pos_++];
      if (piece.kind == Piece::kText) {
        auto node = std::make_unique<Node>();
        node->text = piece.text;
        body.push_back(std::move(node));
        continue;
      }
      parsers_.push_back(std::make_unique<ExprParser>(Lex(piece.text)));
      ExprParser& p = *parsers_.back();
      if (piece.kind == Piece::kOutput) {
        auto node = std::make_unique<Node>();
        node->kind = Node::kOutput;
        node->expr = p.Expression();
        p.ExpectEnd();
        body.push_back(std::move(node));
        continue;
      }
      const std::string keyword = p.Name();
      for (const char* terminator : terminators) {
        if (keyword == terminator) {
          *rest = &p;
          return keyword;
        }
      }
      auto node = std::make_unique<Node>();
      if (keyword == "if") {
        node->kind = Node::kIf;
        Expr condition = p.Expression();
        p.ExpectEnd();
        for (;;) {
          Body branch;
          ExprParser* next = nullptr;
          const std::string end = Parse(branch, {"elif", "else", "endif"}, &next);
          node->branches.emplace_back(condition, std::move(branch));
          if (end == "elif") {
            condition = next->Expression();
            next->ExpectEnd();
          } else if (end == "else") {
            next->ExpectEnd();
            if (Parse(node->otherwise, {"endif"}, &next) != "endif")
              throw TemplateError("if without endif");
            break;
          } else if (end == "endif") {
            break;
          } else {
            throw TemplateError("if without endif");
          }
        }
      } else if (keyword == "for") {
        node->kind = Node::kFor;
        node->names.push_back(p.Name());
        while (p.AcceptOp(",")) node->names.push_back(p.Name());
        if (!p.AcceptName("in")) throw TemplateError("for without in");
        node->expr = p.Or();
        if (p.AcceptName("if")) node->filter = p.Or();
        p.ExpectEnd();
        ExprParser* next = nullptr;
        std::string end = Parse(node->body, {"else", "endfor"}, &next);
        if (end == "else") end = Parse(node->otherwise, {"endfor"}, &next);
        if (end != "endfor") throw TemplateError("for without endfor");
      } else if (keyword == "macro") {
        node->kind = Node::kMacro;
        node->names.push_back(p.Name());
        p.ExpectOp("(");
        if (!p.AcceptOp(")")) {
          do {
            node->names.push_back(p.Name());
            node->defaults.push_back(p.AcceptOp("=") ? p.Expression() : Expr());
          } while (p.AcceptOp(","));
          p.ExpectOp(")");
        }
        p.ExpectEnd();
        ExprParser* next = nullptr;
        if (Parse(node->body, {"endmacro"}, &next) != "endmacro") {
          throw TemplateError("macro without endmacro");
        }
      } else if (keyword == "set") {
        node->kind = Node::kSet;
        node->names.push_back(p.Name());
        if (p.AcceptOp(".")) node->names.push_back(p.Name());
        p.ExpectOp("=");
        node->expr = p.Expression();
        p.ExpectEnd();
      } else {
        throw TemplateError("unsupported statement '" + keyword + "'");
      }
      body.push_back(std::move(node));
    }
    return "";
  }

 private:
  std::vector<Piece> pieces_;
  size_t pos_ = 0;
  std::vector<std::unique_ptr<ExprParser>> parsers_;  // Kept: closures refer to nothing in them.
};

void Execute(const Body& body, Context& c);

void ExecuteNode(const Node& node, Context& c) {
  switch (node.kind) {
    case Node::kText:
      c.out += node.text;
      return;
    case Node::kOutput:
      c.out += ToText(node.expr(c));
      return;
    case Node::kIf:
      for (const auto& [condition, branch] : node.branches) {
        if (condition(c).Truthy()) return Execute(branch, c);
      }
      return Execute(node.otherwise, c);
    case Node::kMacro:
      c.macros[node.names[0]] = &node;
      return;
    case Node::kSet: {
      Value value = node.expr(c);
      if (node.names.size() == 2) {
        Value target = c.Lookup(node.names[0]);
        if (!target.dict()) throw TemplateError("set on an attribute of a non-namespace");
        (*target.dict())[node.names[1]] = value;
      } else {
        c.scopes.back()[node.names[0]] = value;
      }
      return;
    }
    case Node::kFor: {
      Value iterable = node.expr(c);
      List items;
      if (auto l = iterable.list()) {
        items = *l;
      } else if (auto d = iterable.dict()) {
        for (const auto& [key, value] : *d) items.push_back(Value(key));
      } else if (auto s = iterable.str()) {
        for (char ch : *s) items.push_back(Value(std::string(1, ch)));
      } else if (!iterable.undefined() && !iterable.none()) {
        throw TemplateError("for over a value that is not iterable");
      }
      List kept;
      for (const Value& item : items) {
        if (!node.filter) {
          kept.push_back(item);
          continue;
        }
        c.scopes.push_back({{node.names[0], item}});
        if (node.filter(c).Truthy()) kept.push_back(item);
        c.scopes.pop_back();
      }
      if (kept.empty()) return Execute(node.otherwise, c);
      const auto n = static_cast<int64_t>(kept.size());
      for (int64_t i = 0; i < n; ++i) {
        Dict scope;
        const Value& item = kept[static_cast<size_t>(i)];
        if (node.names.size() == 1) {
          scope[node.names[0]] = item;
        } else if (auto pair = item.list()) {
          for (size_t k = 0; k < node.names.size() && k < pair->size(); ++k)
            scope[node.names[k]] = (*pair)[k];
        }
        scope["loop"] =
            Value(Dict{{"index0", Value(i)},
                       {"index", Value(i + 1)},
                       {"first", Value(i == 0)},
                       {"last", Value(i == n - 1)},
                       {"length", Value(n)},
                       {"revindex", Value(n - i)},
                       {"revindex0", Value(n - i - 1)},
                       {"previtem", i > 0 ? kept[static_cast<size_t>(i - 1)] : Value()},
                       {"nextitem", i < n - 1 ? kept[static_cast<size_t>(i + 1)] : Value()}});
        c.scopes.push_back(std::move(scope));
        Execute(node.body, c);
        c.scopes.pop_back();
      }
      return;
    }
  }
}

void Execute(const Body& body, Context& c) {
  for (const auto& node : body) ExecuteNode(*node, c);
}

Value CallMacro(const Node& macro, const List& args, Context& c) {
  Dict scope;
  for (size_t i = 1; i < macro.names.size(); ++i) {
    const Expr& fallback = macro.defaults[i - 1];
    scope[macro.names[i]] = i - 1 < args.size() ? args[i - 1] : fallback ? fallback(c) : Value();
  }
  std::string out = std::exchange(c.out, {});
  c.scopes.push_back(std::move(scope));
  Execute(macro.body, c);
  c.scopes.pop_back();
  return Value(std::exchange(c.out, std::move(out)));
}

}  // namespace

ChatTemplate::~ChatTemplate() = default;

Result<std::unique_ptr<ChatTemplate>> ChatTemplate::Parse(const std::string& source) {
  std::unique_ptr<ChatTemplate> result(new ChatTemplate());
  try {
    StatementParser parser(Segment(source));
    ExprParser* rest = nullptr;
    const std::string end = parser.Parse(result->body_, {"endif", "endfor", "else", "elif"}, &rest);
    if (!end.empty()) throw TemplateError("'" + end + "' without its opening statement");
  } catch (const TemplateError& e) {
    return Status::InvalidArgument(fmt::format("chat template: {}", e.what()));
  } catch (const std::exception& e) {
    return Status::InvalidArgument(fmt::format("chat template: {}", e.what()));
  }
  result->thinks_ = source.find("</think>") != std::string::npos;
  result->harmony_ = IsHarmonyTemplate(source);
  for (const std::string_view test :
       {"['content'] is none", "['content'] is not none", "[\"content\"] is none",
        "[\"content\"] is not none", "message.content is none", "message.content is not none"}) {
    result->content_none_ = result->content_none_ || source.find(test) != std::string::npos;
  }
  result->renders_tools_ = source.find("tools") != std::string::npos;
  result->reads_thinking_ = source.find("message.thinking") != std::string::npos;
  result->source_ = source;
  return result;
}

Result<std::string> ChatTemplate::Render(
    const std::vector<ChatMessage>& messages, bool add_generation_prompt,
    const std::map<std::string, std::string>& variables,
    const std::map<std::string, TemplateArgument>& arguments) const {
  Context c;
  Dict globals;
  List list;
  for (const ChatMessage& m : messages) {
    // An assistant turn of calls only has no content: None where the template asks (DeepSeek
    // R1's tells a call turn by `content is none`), "" for the others (Qwen3's strips it).
    const bool none = content_none_ && m.content.empty() && !m.tool_calls.empty();
    Dict message{{"role", Value(m.role)}, {"content", none ? Value(nullptr) : Value(m.content)}};
    if (!m.name.empty()) message.emplace("name", Value(m.name));
    if (!m.tool_call_id.empty()) message.emplace("tool_call_id", Value(m.tool_call_id));
    if (!m.reasoning_content.empty()) {
      message.emplace("reasoning_content", Value(m.reasoning_content));
      // gpt-oss's template reads an assistant turn's analysis as message.thinking.
      if (reads_thinking_) message.emplace("thinking", Value(m.reasoning_content));
    }
    if (!m.tool_calls.empty()) {
      // As transformers' templates expect them: arguments as an object where they parse as one.
      List calls;
      for (const ToolCallRecord& call : m.tool_calls) {
        Value arguments = ParseJsonValue(call.arguments);
        calls.push_back(Value(
            Dict{{"id", Value(call.id)},
                 {"type", Value("function")},
                 {"function", Value(Dict{{"name", Value(call.name)}, {"arguments", arguments}})}}));
      }
      message.emplace("tool_calls", Value(std::move(calls)));
    }
    list.push_back(Value(std::move(message)));
  }
  globals["messages"] = Value(list);
  globals["add_generation_prompt"] = Value(add_generation_prompt);
  for (const auto& [key, value] : variables) globals[key] = Value(value);
  for (const auto& [key, value] : arguments) {
    globals[key] = std::visit(
        [](const auto& v) {
          if constexpr (std::is_same_v<std::decay_t<decltype(v)>, TemplateJson>) {
            return ParseJsonValue(v.text);
          } else {
            return Value(v);
          }
        },
        value);
  }
  c.scopes.push_back(std::move(globals));
  try {
    Execute(body_, c);
  } catch (const TemplateError& e) {
    return Status::InvalidArgument(fmt::format("chat template: {}", e.what()));
  }
  return c.out;
}

}  // namespace sluice::llm
