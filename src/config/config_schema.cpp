// The resolved config against the schema (configs/defaults.yaml): no unknown keys (with a did-you-mean
// suggestion), every value of its default's type, no schema key missing.
#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <tuple>

#include "config/config_internal.hpp"

namespace mxt::cfg {
namespace {

// Optimal string alignment distance: Levenshtein plus transposition of neighbours ("bacth" -> "batch").
size_t edit_distance(const std::string& a, const std::string& b) {
  std::vector<std::vector<size_t>> d(a.size() + 1, std::vector<size_t>(b.size() + 1));
  for (size_t i = 0; i <= a.size(); ++i) d[i][0] = i;
  for (size_t j = 0; j <= b.size(); ++j) d[0][j] = j;
  for (size_t i = 1; i <= a.size(); ++i)
    for (size_t j = 1; j <= b.size(); ++j) {
      const size_t cost = a[i - 1] == b[j - 1] ? 0 : 1;
      d[i][j] = std::min({d[i - 1][j] + 1, d[i][j - 1] + 1, d[i - 1][j - 1] + cost});
      if (i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1])
        d[i][j] = std::min(d[i][j], d[i - 2][j - 2] + 1);
    }
  return d[a.size()][b.size()];
}

// The last segment of a dotted key or a config name.
std::string leaf(const std::string& s) {
  const size_t pos = s.find_last_of("./");
  return pos == std::string::npos ? s : s.substr(pos + 1);
}

class SchemaCheck {
 public:
  SchemaCheck(const YAML::Node& schema, const std::vector<std::string>& added)
      : all_keys_(key_paths(schema)), added_(added) {}

  void map(const YAML::Node& cfg, const YAML::Node& schema, const std::string& prefix) const {
    for (const auto& kv : cfg) {
      const std::string path = prefix + kv.first.Scalar();
      const YAML::Node def = find(schema, kv.first.Scalar());
      if (def.IsDefined()) {
        value(kv.second, def, path);
      } else if (is_added(path)) {
        spdlog::warn("config key '{}' was added with + but mxtrain does not read it", path);
      } else {
        throw ConfigError(fmt::format("unknown config key '{}'{}", path, did_you_mean(path, all_keys_)));
      }
    }
    for (const auto& kv : schema) {
      if (!find(cfg, kv.first.Scalar()).IsDefined())
        throw ConfigError(fmt::format("missing config key '{}{}' (default {}); a config takes the defaults "
                                      "by listing 'defaults' first in its defaults list", prefix,
                                      kv.first.Scalar(), describe(kv.second)));
    }
  }

 private:
  void value(const YAML::Node& v, const YAML::Node& def, const std::string& path) const {
    const Kind expected = kind_of(def);
    require_kind(v, expected, path);
    if (expected == Kind::Map) {
      map(v, def, path + ".");
    } else if (expected == Kind::List) {
      // Elements take the kind of the default's first element; an empty default takes any scalars.
      const Kind elem = def.size() ? kind_of(def[0]) : Kind::String;
      for (size_t i = 0; i < v.size(); ++i) require_kind(v[i], elem, fmt::format("{}[{}]", path, i));
    }
  }

  // Keys added with + / ++ (and anything under or above them on their path) are not schema errors.
  bool is_added(const std::string& path) const {
    for (const auto& a : added_)
      if (path == a || path.rfind(a + ".", 0) == 0 || a.rfind(path + ".", 0) == 0) return true;
    return false;
  }

  std::vector<std::string> all_keys_;
  const std::vector<std::string>& added_;
};

}  // namespace

std::string did_you_mean(const std::string& key, const std::vector<std::string>& candidates) {
  // Rank by the closer of the whole-key and last-segment distances, so a key at the wrong level
  // ("micro_batch_size" at the top) still finds its place ("dataset.micro_batch_size").
  const std::string* best = nullptr;
  std::tuple<size_t, size_t> best_score{SIZE_MAX, SIZE_MAX};
  for (const auto& c : candidates) {
    const size_t whole = edit_distance(key, c);
    const std::tuple<size_t, size_t> score{std::min(whole, edit_distance(leaf(key), leaf(c))), whole};
    if (score < best_score) best_score = score, best = &c;
  }
  const size_t limit = std::max<size_t>(2, leaf(key).size() / 3);
  if (!best || std::get<0>(best_score) > limit) return "";
  return fmt::format("; did you mean '{}'?", *best);
}

void check_against_schema(const YAML::Node& cfg, const YAML::Node& schema,
                          const std::vector<std::string>& added) {
  SchemaCheck(schema, added).map(cfg, schema, "");
}

}  // namespace mxt::cfg
