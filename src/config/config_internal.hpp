#pragma once
// Helpers shared by the config sources (src/config/*.cpp); not part of the public API.
#include <yaml-cpp/yaml.h>

#include <cstdint>
#include <string>
#include <vector>

#include "mxtrain/config.hpp"

namespace mxt::cfg {

// What a value is. Plain scalars follow YAML 1.2's core schema plus what OmegaConf also reads as numbers
// ("3e-3", "500_000"), so the recipe's YAML means the same here; quoted scalars are always strings.
enum class Kind { Null, Bool, Int, Float, String, List, Map };
Kind kind_of(const YAML::Node& n);
Kind plain_kind(const std::string& text);  // the kind an unquoted scalar with this text reads as
const char* kind_name(Kind k);             // "an integer", "a map", ...
std::string describe(const YAML::Node& n);  // a value, short, for messages: 'abc', [1, 2], a map

// Throws ConfigError unless `value` fits a key whose default has kind `expected`: ints fit numbers, any
// scalar or null fits a string (a null default means an optional string), "???" (mandatory) fits nothing.
void require_kind(const YAML::Node& value, Kind expected, const std::string& key);
int64_t parse_int(const std::string& text, const std::string& key);  // text of Kind::Int
double parse_float(const std::string& text);                        // text of Kind::Int or Kind::Float
bool parse_bool(const std::string& text);                            // text of Kind::Bool

// YAML text -> node; syntax errors and duplicate keys name `origin` and the line.
YAML::Node parse_yaml(const std::string& text, const std::string& origin);

// Map access that never inserts (yaml-cpp's non-const operator[] would): an undefined node if absent.
YAML::Node find(const YAML::Node& map, const std::string& key);
std::vector<std::string> split(const std::string& s, char sep);
std::vector<std::string> key_paths(const YAML::Node& map);  // every dotted path, maps included

// "; did you mean 'x'?" for the candidate nearest to `key` by edit distance, or "" if none is close.
std::string did_you_mean(const std::string& key, const std::vector<std::string>& candidates);

// The composed config named `name` with its defaults list merged (config_load.cpp).
YAML::Node compose(const std::string& name, const std::string& config_path);
YAML::Node builtin_schema();  // configs/defaults.yaml as compiled into the binary

// Applies one Hydra-style override to `root`; keys it adds (+, ++) are appended to `added`.
void apply_override(YAML::Node& root, const std::string& text, std::vector<std::string>& added);

// Every key known to `schema` and of the right type, every schema key present (config_schema.cpp).
void check_against_schema(const YAML::Node& cfg, const YAML::Node& schema,
                          const std::vector<std::string>& added);

}  // namespace mxt::cfg
