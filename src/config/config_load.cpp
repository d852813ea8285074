// Finding config files (the --config-path directory first, then the configs built into the binary),
// merging `defaults:` lists, and resolve_config, which runs the whole pipeline.
//
// The defaults-list scheme: a config's `defaults:` is a list of other config names, relative to the config
// directory ("defaults", "model/mixtral-8x7B"), merged in order; `_self_` marks where the file's own keys
// go (last when absent). Listed configs may have defaults lists of their own; each config is merged once
// (the first time it is reached), and a cycle is an error. Merging is deep for maps; lists and scalars
// are replaced whole.
#include <fmt/format.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <optional>
#include <set>
#include <sstream>

#include "config/config_internal.hpp"

namespace fs = std::filesystem;

namespace mxt::cfg {
namespace {

struct ConfigText {
  std::string text, origin;
};

std::string normalize_name(std::string name) {
  for (const char* ext : {".yaml", ".yml"}) {
    const std::string e = ext;
    if (name.size() > e.size() && name.compare(name.size() - e.size(), e.size(), e) == 0)
      return name.substr(0, name.size() - e.size());
  }
  return name;
}

std::optional<ConfigText> find_in_dir(const std::string& dir, const std::string& name) {
  if (dir.empty()) return std::nullopt;
  for (const char* ext : {".yaml", ".yml"}) {
    const fs::path p = fs::path(dir) / (name + ext);
    if (!fs::is_regular_file(p)) continue;
    std::ifstream f(p, std::ios::binary);
    std::stringstream ss;
    ss << f.rdbuf();
    if (!f) throw ConfigError(fmt::format("cannot read config file {}", p.string()));
    return ConfigText{ss.str(), p.string()};
  }
  return std::nullopt;
}

std::optional<ConfigText> find_builtin(const std::string& name) {
  for (const auto& [n, text] : embedded_configs())
    if (n == name) return ConfigText{text, "<built-in>/" + name + ".yaml"};
  return std::nullopt;
}

std::vector<std::string> builtin_names() {
  std::vector<std::string> names;
  for (const auto& entry : embedded_configs()) names.push_back(entry.first);
  return names;
}

ConfigText find_config(const std::string& name, const std::string& dir, const std::string& included_from) {
  if (auto c = find_in_dir(dir, name)) return *c;
  if (auto c = find_builtin(name)) return *c;
  std::string names;
  for (const auto& n : builtin_names()) names += (names.empty() ? "" : ", ") + n;
  const std::string where = dir.empty() ? "among the built-in configs"
                                        : fmt::format("in config path '{}' or among the built-in configs", dir);
  const std::string from = included_from.empty() ? "" : fmt::format(" (named in the defaults list of {})",
                                                                    included_from);
  throw ConfigError(fmt::format("config '{}'{} not found {} ({}){}", name, from, where, names,
                                did_you_mean(name, builtin_names())));
}

// Maps merge key by key; anything else replaces what was there.
void deep_merge(YAML::Node dst, const YAML::Node& src) {
  for (const auto& kv : src) {
    const std::string key = kv.first.Scalar();
    if (kv.second.IsMap() && find(dst, key).IsMap()) {
      deep_merge(dst[key], kv.second);  // dst[key] exists, so operator[] hands back the live child
    } else {
      dst[key] = YAML::Clone(kv.second);
    }
  }
}

// The entries of `doc`'s defaults list, with _self_ placed (last when absent).
std::vector<std::string> defaults_list(const YAML::Node& doc, const std::string& origin) {
  const YAML::Node list = find(doc, "defaults");
  std::vector<std::string> names;
  if (list.IsDefined() && !list.IsNull()) {
    if (!list.IsSequence())
      throw ConfigError(fmt::format("{}: 'defaults' must be a list of config names, e.g. "
                                    "[defaults, model/mixtral-8x7B, _self_]; got {}", origin, describe(list)));
    for (const auto& e : list) {
      if (kind_of(e) != Kind::String)
        throw ConfigError(fmt::format("{}: defaults list entry {} is not a config name like "
                                      "'model/mixtral-8x7B'", origin, describe(e)));
      names.push_back(normalize_name(e.Scalar()));
    }
  }
  const auto selves = std::count(names.begin(), names.end(), "_self_");
  if (selves > 1) throw ConfigError(fmt::format("{}: defaults list names _self_ more than once", origin));
  if (selves == 0) names.push_back("_self_");
  return names;
}

class Composer {
 public:
  explicit Composer(std::string dir) : dir_(std::move(dir)) {}

  void merge(YAML::Node out, const std::string& name, const std::string& included_from) {
    if (std::find(stack_.begin(), stack_.end(), name) != stack_.end()) {
      std::string chain;
      for (const auto& n : stack_) chain += n + " -> ";
      throw ConfigError(fmt::format("config '{}' includes itself through its defaults list: {}{}", name,
                                    chain, name));
    }
    if (!merged_.insert(name).second) return;  // already merged: once is enough
    const ConfigText src = find_config(name, dir_, included_from);
    YAML::Node doc = parse_yaml(src.text, src.origin);
    if (doc.IsNull()) doc = YAML::Node(YAML::NodeType::Map);
    if (!doc.IsMap())
      throw ConfigError(fmt::format("{}: a config file must be a map of keys, got {}", src.origin,
                                    describe(doc)));
    const std::vector<std::string> order = defaults_list(doc, src.origin);
    doc.remove("defaults");
    stack_.push_back(name);
    for (const auto& entry : order) {
      if (entry == "_self_")
        deep_merge(out, doc);
      else
        merge(out, entry, src.origin);
    }
    stack_.pop_back();
  }

 private:
  std::string dir_;
  std::vector<std::string> stack_;  // configs being merged, for cycle detection
  std::set<std::string> merged_;
};

}  // namespace

YAML::Node compose(const std::string& name, const std::string& config_path) {
  YAML::Node out(YAML::NodeType::Map);
  Composer(config_path).merge(out, normalize_name(name), "");
  return out;
}

YAML::Node builtin_schema() {
  const auto src = find_builtin("defaults");
  if (!src) throw ConfigError("the built-in configs lack 'defaults' (configs/defaults.yaml): a broken build");
  return parse_yaml(src->text, src->origin);
}

}  // namespace mxt::cfg

namespace mxt {

YAML::Node resolve_config(const LoadOptions& opt) {
  if (!opt.config_path.empty() && !fs::is_directory(opt.config_path))
    throw ConfigError(fmt::format("config path '{}' is not a directory", opt.config_path));
  YAML::Node cfg = cfg::compose(opt.config_name.empty() ? "L0_sanity" : opt.config_name, opt.config_path);
  std::vector<std::string> added;
  for (const auto& ov : opt.overrides) cfg::apply_override(cfg, ov, added);
  cfg::check_against_schema(cfg, cfg::builtin_schema(), added);
  return cfg;
}

}  // namespace mxt
