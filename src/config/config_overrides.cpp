// Hydra-style command-line overrides:
//   a.b=v    set a key the config has (a typo is an error, not a new key)
//   +a.b=v   add a key the config lacks (error if present)
//   ++a.b=v  set or add
//   ~a.b     remove a key (~a.b=v: only if its value is v)
// Values are read as YAML: 3e-4, true, null, [0.9, 0.99], 'quoted strings'.
#include <fmt/format.h>

#include "config/config_internal.hpp"

namespace mxt::cfg {
namespace {

enum class Op { Set, Add, Force, Remove };

YAML::Node parse_value(const std::string& value, const std::string& text) {
  try {
    return YAML::Load(value);
  } catch (const YAML::Exception& e) {
    throw ConfigError(fmt::format("override '{}': cannot read value '{}' as YAML: {}", text, value, e.msg));
  }
}

std::string join(const std::vector<std::string>& parts, size_t n) {
  std::string s;
  for (size_t i = 0; i < n; ++i) s += (i ? "." : "") + parts[i];
  return s;
}

}  // namespace

void apply_override(YAML::Node& root, const std::string& text, std::vector<std::string>& added) {
  Op op = Op::Set;
  size_t skip = 0;
  if (text.rfind("++", 0) == 0) {
    op = Op::Force, skip = 2;
  } else if (text.rfind('+', 0) == 0) {
    op = Op::Add, skip = 1;
  } else if (text.rfind('~', 0) == 0) {
    op = Op::Remove, skip = 1;
  }
  const std::string body = text.substr(skip);
  const size_t eq = body.find('=');
  const bool has_value = eq != std::string::npos;
  if (!has_value && op != Op::Remove)
    throw ConfigError(fmt::format("override '{}': expected key=value (+key=value adds a key, ~key removes "
                                  "one); to choose a config, use --config-name NAME", text));
  const std::string key = body.substr(0, eq);
  const std::vector<std::string> segs = split(key, '.');
  for (const auto& s : segs)
    if (s.empty()) throw ConfigError(fmt::format("override '{}': malformed key '{}'", text, key));
  const YAML::Node value = has_value ? parse_value(body.substr(eq + 1), text) : YAML::Node();

  auto unknown = [&] {
    return ConfigError(fmt::format("override '{}': unknown config key '{}'{} (to add a new key, use +{})", text,
                                   key, did_you_mean(key, key_paths(root)), body));
  };

  // Walk to the parent map. Handles share the tree; move between levels with reset(): assigning one
  // yaml-cpp node to another would overwrite the content instead.
  YAML::Node node = root;
  for (size_t i = 0; i + 1 < segs.size(); ++i) {
    const YAML::Node child = find(node, segs[i]);
    if (!child.IsDefined()) {
      if (op == Op::Set || op == Op::Remove) throw unknown();
      node[segs[i]] = YAML::Node(YAML::NodeType::Map);
    } else if (!child.IsMap()) {
      throw ConfigError(fmt::format("override '{}': '{}' is {}, not a map", text, join(segs, i + 1),
                                    describe(child)));
    }
    YAML::Node next = node[segs[i]];
    node.reset(next);
  }

  const std::string& leaf = segs.back();
  const YAML::Node current = find(node, leaf);
  const bool exists = current.IsDefined();
  switch (op) {
    case Op::Set:
      if (!exists) throw unknown();
      node[leaf] = value;
      break;
    case Op::Add:
      if (exists)
        throw ConfigError(fmt::format("override '{}': config key '{}' already exists (value {}); use {} to "
                                      "change it", text, key, describe(current), body));
      node[leaf] = value;
      added.push_back(key);
      break;
    case Op::Force:
      if (!exists) added.push_back(key);
      node[leaf] = value;
      break;
    case Op::Remove:
      if (!exists)
        throw ConfigError(fmt::format("override '{}': cannot remove config key '{}': the config has no such "
                                      "key{}", text, key, did_you_mean(key, key_paths(root))));
      if (has_value && describe(current) != describe(value))
        throw ConfigError(fmt::format("override '{}': config key '{}' is {}, not {}; not removed", text, key,
                                      describe(current), describe(value)));
      node.remove(leaf);
      break;
  }
}

}  // namespace mxt::cfg
