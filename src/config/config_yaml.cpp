// YAML primitives for the config code: value kinds, number parsing, parsing text with errors that name
// the file and line, and printing a resolved config.
#include <fmt/format.h>

#include <algorithm>
#include <charconv>
#include <cstdlib>
#include <limits>
#include <regex>
#include <set>

#include "config/config_internal.hpp"

namespace mxt::cfg {

Kind plain_kind(const std::string& t) {
  static const std::regex int_re("[-+]?[0-9][0-9_]*");
  static const std::regex float_re("[-+]?(\\.[0-9]+|[0-9][0-9_]*(\\.[0-9_]*)?)([eE][-+]?[0-9]+)?");
  static const std::regex special_re("[-+]?\\.(inf|Inf|INF)|\\.(nan|NaN|NAN)");
  static const std::set<std::string> nulls = {"", "~", "null", "Null", "NULL"};
  static const std::set<std::string> bools = {"true", "True", "TRUE", "false", "False", "FALSE"};
  if (nulls.count(t)) return Kind::Null;
  if (bools.count(t)) return Kind::Bool;
  if (std::regex_match(t, int_re)) return Kind::Int;
  if (std::regex_match(t, float_re) || std::regex_match(t, special_re)) return Kind::Float;
  return Kind::String;
}

Kind kind_of(const YAML::Node& n) {
  if (!n.IsDefined() || n.IsNull()) return Kind::Null;
  if (n.IsMap()) return Kind::Map;
  if (n.IsSequence()) return Kind::List;
  // yaml-cpp tags quoted scalars "!" and plain ones "?".
  if (n.Tag() == "!" || n.Tag() == "tag:yaml.org,2002:str") return Kind::String;
  return plain_kind(n.Scalar());
}

const char* kind_name(Kind k) {
  switch (k) {
    case Kind::Null: return "null";
    case Kind::Bool: return "true or false";
    case Kind::Int: return "an integer";
    case Kind::Float: return "a number";
    case Kind::String: return "a string";
    case Kind::List: return "a list";
    case Kind::Map: return "a map";
  }
  return "?";
}

std::string describe(const YAML::Node& n) {
  switch (kind_of(n)) {
    case Kind::Null: return "null";
    case Kind::Map: return "a map";
    case Kind::List: {
      YAML::Emitter out;
      out << YAML::Flow << n;
      std::string s = out.c_str();
      return s.size() > 60 ? s.substr(0, 57) + "..." : s;
    }
    default: return "'" + n.Scalar() + "'";
  }
}

void require_kind(const YAML::Node& value, Kind expected, const std::string& key) {
  const Kind k = kind_of(value);
  if (value.IsScalar() && value.Tag() != "!" && value.Scalar() == "???")  // unquoted: Hydra's "missing"
    throw ConfigError(fmt::format("config key '{}' is mandatory but has no value (\?\?\?); set it, e.g. {}=...",
                                  key, key));
  const bool scalar = k != Kind::List && k != Kind::Map;
  const bool ok = k == expected || (expected == Kind::Float && k == Kind::Int) ||
                  ((expected == Kind::String || expected == Kind::Null) && scalar);
  if (!ok) {
    const Kind shown = expected == Kind::Null ? Kind::String : expected;
    throw ConfigError(fmt::format("config key '{}' must be {}, got {}", key, kind_name(shown), describe(value)));
  }
}

static std::string without_underscores(std::string t) {
  t.erase(std::remove(t.begin(), t.end(), '_'), t.end());
  return t;
}

int64_t parse_int(const std::string& text, const std::string& key) {
  std::string t = without_underscores(text);
  if (!t.empty() && t[0] == '+') t.erase(0, 1);  // from_chars takes no '+'
  int64_t v = 0;
  auto [end, ec] = std::from_chars(t.data(), t.data() + t.size(), v);
  if (ec != std::errc() || end != t.data() + t.size())
    throw ConfigError(fmt::format("config key '{}': integer '{}' is out of range", key, text));
  return v;
}

double parse_float(const std::string& text) {
  const std::string t = without_underscores(text);
  const bool neg = !t.empty() && t[0] == '-';
  const std::string body = (!t.empty() && (t[0] == '-' || t[0] == '+')) ? t.substr(1) : t;
  if (body == ".inf" || body == ".Inf" || body == ".INF")
    return neg ? -std::numeric_limits<double>::infinity() : std::numeric_limits<double>::infinity();
  if (body == ".nan" || body == ".NaN" || body == ".NAN") return std::numeric_limits<double>::quiet_NaN();
  return std::strtod(t.c_str(), nullptr);
}

bool parse_bool(const std::string& text) { return text == "true" || text == "True" || text == "TRUE"; }

// yaml-cpp keeps both entries of a repeated key and reads the first: reject them instead.
static void check_duplicate_keys(const YAML::Node& n, const std::string& origin) {
  if (n.IsSequence())
    for (const auto& e : n) check_duplicate_keys(e, origin);
  if (!n.IsMap()) return;
  std::set<std::string> seen;
  for (const auto& kv : n) {
    if (!seen.insert(kv.first.Scalar()).second)
      throw ConfigError(fmt::format("{}:{}: duplicate key '{}'", origin, kv.first.Mark().line + 1,
                                    kv.first.Scalar()));
    check_duplicate_keys(kv.second, origin);
  }
}

YAML::Node parse_yaml(const std::string& text, const std::string& origin) {
  YAML::Node doc;
  try {
    doc = YAML::Load(text);
  } catch (const YAML::Exception& e) {
    if (e.mark.is_null()) throw ConfigError(fmt::format("{}: YAML syntax error: {}", origin, e.msg));
    throw ConfigError(
        fmt::format("{}:{}:{}: YAML syntax error: {}", origin, e.mark.line + 1, e.mark.column + 1, e.msg));
  }
  check_duplicate_keys(doc, origin);
  return doc;
}

YAML::Node find(const YAML::Node& map, const std::string& key) {
  // const operator[] does not insert, but gives an invalid "zombie" node for a missing key, on which
  // Type() throws: hand back a valid undefined node instead.
  const YAML::Node v = map.IsMap() ? map[key] : YAML::Node(YAML::NodeType::Undefined);
  return v.IsDefined() ? v : YAML::Node(YAML::NodeType::Undefined);
}

std::vector<std::string> split(const std::string& s, char sep) {
  std::vector<std::string> parts;
  size_t start = 0;
  for (size_t pos; (pos = s.find(sep, start)) != std::string::npos; start = pos + 1)
    parts.push_back(s.substr(start, pos - start));
  parts.push_back(s.substr(start));
  return parts;
}

static void collect_paths(const YAML::Node& map, const std::string& prefix, std::vector<std::string>& out) {
  for (const auto& kv : map) {
    const std::string path = prefix + kv.first.Scalar();
    out.push_back(path);
    if (kv.second.IsMap()) collect_paths(kv.second, path + ".", out);
  }
}

std::vector<std::string> key_paths(const YAML::Node& map) {
  std::vector<std::string> out;
  if (map.IsMap()) collect_paths(map, "", out);
  return out;
}

static void emit(YAML::Emitter& out, const YAML::Node& n) {
  switch (n.Type()) {
    case YAML::NodeType::Map:
      out << YAML::BeginMap;
      for (const auto& kv : n) {
        out << YAML::Key << kv.first.Scalar() << YAML::Value;
        emit(out, kv.second);
      }
      out << YAML::EndMap;
      break;
    case YAML::NodeType::Sequence: {
      bool flat = true;  // lists of scalars print on one line: betas: [0.9, 0.95]
      for (const auto& e : n) flat = flat && !e.IsMap() && !e.IsSequence();
      if (flat) out << YAML::Flow;
      out << YAML::BeginSeq;
      for (const auto& e : n) emit(out, e);
      out << YAML::EndSeq;
      break;
    }
    case YAML::NodeType::Scalar:
      // A quoted value stays quoted where, unquoted, it would read back as a number, bool or null.
      if (kind_of(n) == Kind::String && plain_kind(n.Scalar()) != Kind::String) out << YAML::DoubleQuoted;
      out << n.Scalar();
      break;
    default:
      out << YAML::Null;
  }
}

}  // namespace mxt::cfg

namespace mxt {

std::string dump_config(const YAML::Node& resolved) {
  YAML::Emitter out;
  out.SetNullFormat(YAML::LowerNull);  // "null", as the recipe's configs write it, rather than "~"
  cfg::emit(out, resolved);
  return std::string(out.c_str()) + "\n";
}

}  // namespace mxt
