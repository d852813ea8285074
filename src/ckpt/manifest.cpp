// manifest.json: the layout, sizes and checksums of a checkpoint and its scalar state. Written last, so its
// presence marks a complete checkpoint; it carries a checksum of its own body, so a damaged manifest is
// caught too. Parsing checks that the shards together hold every expert once and tile the dense buffers.
#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <tuple>

#include "ckpt/ckpt_internal.hpp"
#include "mxtrain/data.hpp"
#include "mxtrain/params.hpp"
#include "mxtrain/version.hpp"

namespace mxt::ckpt {
namespace {

using ojson = nlohmann::ordered_json;

[[noreturn]] void bad(const std::string& where, const std::string& what) {
  throw CheckpointError("checkpoint " + where + ": " + what);
}

template <class T>
T field(const nlohmann::json& j, const char* key, const std::string& where) {
  auto it = j.find(key);
  if (it == j.end()) bad(where, std::string("missing field \"") + key + "\"");
  try {
    return it->get<T>();
  } catch (const nlohmann::json::exception&) {
    bad(where, std::string("field \"") + key + "\" has the wrong type: " + it->dump());
  }
}

// The manifest's checksum covers the compact dump of every other field, in file order.
std::string body_hash(ojson j) {
  j.erase("checksum");
  const std::string s = j.dump();
  return hex64(hash64(s.data(), s.size()));
}

void flatten(const YAML::Node& n, const std::string& prefix, std::map<std::string, std::string>& out) {
  if (n.IsMap()) {
    for (const auto& kv : n) flatten(kv.second, prefix.empty() ? kv.first.as<std::string>() : prefix + "." + kv.first.as<std::string>(), out);
  } else {
    YAML::Emitter e;
    e << YAML::Flow << n;
    out[prefix] = e.c_str();
  }
}

ojson shard_ojson(const ShardRecord& r) {
  ojson t = ojson::array();
  for (const auto& x : r.tensors)
    t.push_back({{"name", x.name}, {"key", x.key}, {"begin", x.begin}, {"end", x.end}, {"xxh64", x.hash}});
  return {{"file", r.file},         {"rank", r.rank},  {"bytes", r.bytes}, {"header_bytes", r.header_bytes},
          {"header_xxh64", r.header_hash}, {"tensors", t}};
}

}  // namespace

nlohmann::json to_json(const ShardRecord& r) { return nlohmann::json::parse(shard_ojson(r).dump()); }

ShardRecord shard_from_json(const nlohmann::json& j, const std::string& where) {
  ShardRecord r;
  r.file = field<std::string>(j, "file", where);
  const std::string w = where + " shard " + r.file;
  r.rank = field<int>(j, "rank", w);
  r.bytes = field<uint64_t>(j, "bytes", w);
  r.header_bytes = field<uint64_t>(j, "header_bytes", w);
  r.header_hash = field<std::string>(j, "header_xxh64", w);
  for (const auto& t : field<nlohmann::json>(j, "tensors", w))
    r.tensors.push_back({field<std::string>(t, "name", w), field<std::string>(t, "key", w), field<int64_t>(t, "begin", w),
                         field<int64_t>(t, "end", w), field<std::string>(t, "xxh64", w)});
  if (r.file.find('/') != std::string::npos || r.file.empty()) bad(w, "shard file name must be a plain name");
  return r;
}

nlohmann::json model_shape_json(const ModelConfig& m) {
  return {{"vocab_size", m.vocab_size},
          {"hidden_size", m.hidden_size},
          {"intermediate_size", m.intermediate_size},
          {"num_hidden_layers", m.num_hidden_layers},
          {"num_attention_heads", m.num_attention_heads},
          {"num_key_value_heads", m.num_key_value_heads},
          {"num_local_experts", m.num_local_experts},
          {"tie_word_embeddings", m.tie_word_embeddings}};
}

Manifest describe(const TrainConfig& cfg, const TrainState& s, int world) {
  Manifest m;
  m.step = s.step;
  m.world_size = world;
  m.dp_size = static_cast<int>(cfg.parallelism.dp_size);
  m.ep_size = static_cast<int>(cfg.parallelism.ep_size);
  m.model = model_shape_json(cfg.model);
  m.dense_numel = s.layout.dense_numel;
  m.num_experts = cfg.model.num_local_experts;
  m.expert_block_numel = expert_block_numel(s.layout);
  m.data_epoch = s.loader.epoch();
  m.data_cursor = s.loader.cursor();
  m.data_offset = s.loader.offset();
  m.data_world = s.data_world;
  m.data_windows = s.loader.num_windows();
  m.seed = cfg.seed;
  m.config_yaml = cfg.resolved_yaml;
  return m;
}

std::string manifest_text(const Manifest& m) {
  ojson shards = ojson::array();
  for (const auto& s : m.shards) shards.push_back(shard_ojson(s));
  ojson j = {{"format", "mxtrain-checkpoint"},
             {"format_version", m.format_version},
             {"written_by", "mxtrain " + version_string()},  // provenance only; not read back
             {"step", m.step},
             {"world_size", m.world_size},
             {"dp_size", m.dp_size},
             {"ep_size", m.ep_size},
             {"model", ojson::parse(m.model.dump())},
             {"dense_numel", m.dense_numel},
             {"num_experts", m.num_experts},
             {"expert_block_numel", m.expert_block_numel},
             {"data", {{"epoch", m.data_epoch}, {"cursor", m.data_cursor}, {"offset", m.data_offset}, {"world", m.data_world},
                       {"num_windows", m.data_windows}}},
             {"seed", m.seed},
             {"config_yaml", m.config_yaml},
             {"shards", shards}};
  j["checksum"] = body_hash(j);
  return j.dump(1) + "\n";
}

Manifest read_manifest(const std::string& dir) {
  const std::string path = dir + "/manifest.json";
  std::ifstream in(path, std::ios::binary);
  if (!in) bad(dir, "manifest.json is missing: not a complete checkpoint");
  std::stringstream ss;
  ss << in.rdbuf();
  ojson oj;  // in file order, for the checksum
  nlohmann::json j;
  try {
    oj = ojson::parse(ss.str());
    j = nlohmann::json::parse(ss.str());
  } catch (const nlohmann::json::exception& e) {
    bad(path, std::string("malformed JSON: ") + e.what());
  }
  if (!j.is_object() || j.value("format", "") != "mxtrain-checkpoint") bad(path, "not an mxtrain checkpoint manifest");
  if (field<std::string>(j, "checksum", path) != body_hash(oj))
    bad(path, "checksum mismatch: the manifest is damaged");
  Manifest m;
  m.format_version = field<int>(j, "format_version", path);
  if (m.format_version != kFormatVersion)
    bad(path, "format_version " + std::to_string(m.format_version) + ", this mxtrain reads version " +
                  std::to_string(kFormatVersion));
  m.step = field<int64_t>(j, "step", path);
  m.world_size = field<int>(j, "world_size", path);
  m.dp_size = field<int>(j, "dp_size", path);
  m.ep_size = field<int>(j, "ep_size", path);
  m.model = field<nlohmann::json>(j, "model", path);
  m.dense_numel = field<int64_t>(j, "dense_numel", path);
  m.num_experts = field<int64_t>(j, "num_experts", path);
  m.expert_block_numel = field<int64_t>(j, "expert_block_numel", path);
  const auto data = field<nlohmann::json>(j, "data", path);
  m.data_epoch = field<int64_t>(data, "epoch", path);
  m.data_cursor = field<int64_t>(data, "cursor", path);
  m.data_offset = field<int64_t>(data, "offset", path);
  m.data_world = field<int64_t>(data, "world", path);
  m.data_windows = field<int64_t>(data, "num_windows", path);
  m.seed = field<uint64_t>(j, "seed", path);
  m.config_yaml = field<std::string>(j, "config_yaml", path);
  for (const auto& s : field<nlohmann::json>(j, "shards", path)) m.shards.push_back(shard_from_json(s, path));

  check_tiling(m, path);
  return m;
}

void check_tiling(const Manifest& m, const std::string& where) {
  // key -> (begin, end, file) of every stored part
  std::map<std::string, std::vector<std::tuple<int64_t, int64_t, std::string>>> parts;
  for (const ShardRecord& r : m.shards)
    for (const TensorRecord& t : r.tensors) parts[t.key].emplace_back(t.begin, t.end, r.file);
  auto check = [&](const std::string& key, int64_t len) {
    auto it = parts.find(key);
    if (it == parts.end()) bad(where, key + " is in no shard");
    auto& v = it->second;
    std::sort(v.begin(), v.end());
    int64_t at = 0;
    for (const auto& [b, e, file] : v) {
      if (b != at || e <= b)
        bad(where, key + ": the part [" + std::to_string(b) + ", " + std::to_string(e) + ") in " + file +
                       (b > at ? " leaves a gap at " : " overlaps at ") + std::to_string(std::min(b, at)));
      at = e;
    }
    if (at != len) bad(where, key + ": the parts end at " + std::to_string(at) + ", not " + std::to_string(len));
    parts.erase(it);
  };
  for (int role = 0; role < 3; ++role) {
    check(std::string("dense.") + role_name(role), m.dense_numel);
    for (int64_t g = 0; g < m.num_experts; ++g)
      check("expert." + std::to_string(g) + "." + role_name(role), m.expert_block_numel);
  }
  if (!parts.empty()) bad(where, "unexpected tensor key " + parts.begin()->first);
}

void check_compatible(const Manifest& m, const std::string& dir, const TrainConfig& cfg, const ParamLayout& layout) {
  const nlohmann::json now = model_shape_json(cfg.model);
  for (auto it = now.begin(); it != now.end(); ++it) {
    const auto saved = m.model.find(it.key());
    const std::string there = saved == m.model.end() ? "absent" : saved->dump();
    if (saved == m.model.end() || *saved != it.value())
      throw CheckpointIncompatible("checkpoint " + dir + " was saved for another model shape: config_kwargs." +
                                   it.key() + " is " + there + " there and " + it.value().dump() +
                                   " in this run");
  }
  auto same = [&](int64_t a, int64_t b, const char* what) {
    if (a != b)
      throw CheckpointIncompatible("checkpoint " + dir + ": " + what + " is " + std::to_string(a) + " there and " +
                                   std::to_string(b) + " in this run");
  };
  same(m.dense_numel, layout.dense_numel, "the dense parameter count");
  same(m.expert_block_numel, expert_block_numel(layout), "the parameter count per expert");
}

std::vector<std::string> config_changes(const std::string& saved_yaml, const std::string& current_yaml) {
  if (saved_yaml.empty() || current_yaml.empty()) return {};
  std::map<std::string, std::string> a, b;
  try {
    flatten(YAML::Load(saved_yaml), "", a);
    flatten(YAML::Load(current_yaml), "", b);
  } catch (const YAML::Exception& e) {
    return {std::string("(the configs could not be compared: ") + e.what() + ")"};
  }
  std::vector<std::string> out;
  for (const auto& [k, v] : b) {
    auto it = a.find(k);
    if (it == a.end()) out.push_back(k + ": (absent) -> " + v);
    else if (it->second != v) out.push_back(k + ": " + it->second + " -> " + v);
  }
  for (const auto& [k, v] : a)
    if (!b.count(k)) out.push_back(k + ": " + v + " -> (absent)");
  return out;
}

}  // namespace mxt::ckpt
