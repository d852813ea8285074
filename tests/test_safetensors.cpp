// safetensors reader / writer and HF Mixtral checkpoint import / export.
#include <gtest/gtest.h>
#include <gmock/gmock.h>
#include <stdlib.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <set>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "mxtrain/params.hpp"
#include "mxtrain/safetensors.hpp"
#include "tiny_config.hpp"

namespace fs = std::filesystem;
using namespace mxt;
using ::testing::AllOf;
using ::testing::HasSubstr;

namespace {

using mxt::testing::tiny_model;

class TempDir {
 public:
  TempDir() {
    std::string tmpl = (fs::temp_directory_path() / "mxtrain_st_XXXXXX").string();
    if (!mkdtemp(tmpl.data())) throw std::runtime_error("mkdtemp failed");
    path_ = tmpl;
  }
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(path_, ec);
  }
  std::string operator/(const std::string& name) const { return (path_ / name).string(); }
  std::string str() const { return path_.string(); }

 private:
  fs::path path_;
};

ModelConfig tiny_config() { return tiny_model(32, 16, 24); }

struct Weights {
  ParamLayout layout;
  std::vector<float> dense, expert;
};

Weights make_weights(const ModelConfig& m, int64_t first, int64_t n, uint64_t seed = 7) {
  Weights w;
  w.layout = ParamLayout::build(m, first, n);
  init_params_host(w.layout, m, seed, w.dense, w.expert);
  return w;
}

std::string message_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const SafetensorsError& e) {
    return e.what();
  } catch (const std::exception& e) {
    return std::string("<not a SafetensorsError> ") + e.what();
  }
  return "<nothing thrown>";
}

// A safetensors file from raw header text and data bytes.
void write_raw(const std::string& path, const std::string& header, const std::string& data,
               uint64_t header_len_override = 0) {
  std::ofstream out(path, std::ios::binary);
  uint64_t n = header_len_override ? header_len_override : header.size();
  for (int i = 0; i < 8; ++i) out.put(static_cast<char>((n >> (8 * i)) & 0xff));
  out << header << data;
}

// All tensors of a file as float.
struct Loaded {
  std::vector<int64_t> shape;
  std::vector<float> data;
};
std::map<std::string, Loaded> load_all(const std::string& path) {
  SafetensorsFile f(path);
  std::map<std::string, Loaded> out;
  for (const auto& n : f.names()) out[n] = {f.info(n).shape, f.read_f32(n)};
  return out;
}
void save_all(const std::string& path, const std::map<std::string, Loaded>& tensors) {
  std::vector<SafetensorsWriteEntry> e;
  for (const auto& [name, t] : tensors) e.push_back({name, t.shape, t.data.data()});
  write_safetensors(path, e, DType::F32);
}

float bf16_round(float x) { return round_to_bf16(x); }

}  // namespace

// ---- low level --------------------------------------------------------------------------------------------

TEST(Safetensors, WriteReadF32AndBf16) {
  TempDir dir;
  const std::vector<float> a = {1.f, -2.5f, 3.25f, 1e-3f, 7.f, 0.f};
  const std::vector<float> b = {0.1f, 0.2f, 0.3f};
  for (DType dt : {DType::F32, DType::BF16}) {
    const std::string p = dir / "t.safetensors";
    write_safetensors(p, {{"a", {2, 3}, a.data()}, {"b", {3}, b.data()}}, dt, {{"format", "pt"}, {"k", "v"}});
    std::ifstream in(p, std::ios::binary);
    uint8_t len[8];
    in.read(reinterpret_cast<char*>(len), 8);
    uint64_t n = 0;
    for (int i = 7; i >= 0; --i) n = (n << 8) | len[i];
    EXPECT_EQ(n % 8, 0u) << "header padded to 8 bytes";
    SafetensorsFile f(p);
    EXPECT_EQ(f.metadata().at("format"), "pt");
    EXPECT_EQ(f.metadata().at("k"), "v");
    EXPECT_EQ(f.info("a").dtype, dt == DType::F32 ? "F32" : "BF16");
    EXPECT_EQ(f.info("a").shape, (std::vector<int64_t>{2, 3}));
    const auto ra = f.read_f32("a"), rb = f.read_f32("b");
    for (size_t i = 0; i < a.size(); ++i) EXPECT_EQ(ra[i], dt == DType::F32 ? a[i] : bf16_round(a[i]));
    for (size_t i = 0; i < b.size(); ++i) EXPECT_EQ(rb[i], dt == DType::F32 ? b[i] : bf16_round(b[i]));
    float part[2];
    f.read_f32("a", 3, 2, part);
    EXPECT_EQ(part[0], dt == DType::F32 ? a[3] : bf16_round(a[3]));
    EXPECT_EQ(part[1], a[4]);
    EXPECT_THAT(message_of([&] { f.read_f32("a", 5, 2, part); }), HasSubstr("'a'"));
    EXPECT_THAT(message_of([&] { f.info("zzz"); }), HasSubstr("'zzz'"));
  }
}

// Large enough for the threaded conversion paths (and several write chunks).
TEST(Safetensors, LargeTensorThreadedConversion) {
  TempDir dir;
  const int64_t n = (int64_t(1) << 22) + 12345;
  std::vector<float> a(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) a[i] = std::sin(0.001f * static_cast<float>(i)) * 3.f;
  for (DType dt : {DType::F32, DType::BF16}) {
    const std::string p = dir / "big.safetensors";
    write_safetensors(p, {{"small", {1}, a.data()}, {"big", {n}, a.data()}}, dt);
    SafetensorsFile f(p);
    const auto r = f.read_f32("big");
    ASSERT_EQ(static_cast<int64_t>(r.size()), n);
    for (int64_t i = 0; i < n; ++i) ASSERT_EQ(r[i], dt == DType::F32 ? a[i] : bf16_round(a[i])) << i;
    std::vector<float> part(static_cast<size_t>(n - 1001));
    f.read_f32("big", 1001, n - 1001, part.data());
    for (int64_t i = 0; i < n - 1001; i += 997) ASSERT_EQ(part[i], r[i + 1001]) << i;
  }
}

TEST(Safetensors, Bf16Rounding) {
  EXPECT_EQ(f32_to_bf16_bits(1.f), 0x3f80);
  // 1 + 2^-8 is halfway between 1 and 1 + 2^-7: ties to even (1.0).
  EXPECT_EQ(f32_to_bf16_bits(1.f + std::ldexp(1.f, -8)), 0x3f80);
  EXPECT_EQ(f32_to_bf16_bits(1.f + 3 * std::ldexp(1.f, -8)), 0x3f82);
  EXPECT_TRUE(std::isnan(bf16_bits_to_f32(f32_to_bf16_bits(std::nanf("")))));
  EXPECT_EQ(bf16_bits_to_f32(f32_to_bf16_bits(INFINITY)), INFINITY);
}

TEST(Safetensors, ReadsF16) {
  TempDir dir;
  const std::vector<uint16_t> h = {0x3c00, 0xc000, 0x3800, 0x0001, 0x7c00, 0x8000, 0x03ff};
  std::string data(reinterpret_cast<const char*>(h.data()), h.size() * 2);
  std::string hdr = R"({"h":{"dtype":"F16","shape":[7],"data_offsets":[0,14]}})";
  write_raw(dir / "h.safetensors", hdr, data);
  SafetensorsFile f(dir / "h.safetensors");
  const auto v = f.read_f32("h");
  EXPECT_EQ(v[0], 1.f);
  EXPECT_EQ(v[1], -2.f);
  EXPECT_EQ(v[2], 0.5f);
  EXPECT_EQ(v[3], std::ldexp(1.f, -24));
  EXPECT_EQ(v[4], INFINITY);
  EXPECT_TRUE(v[5] == 0.f && std::signbit(v[5]));
  EXPECT_EQ(v[6], std::ldexp(1023.f, -24));
}

TEST(Safetensors, HeaderValidation) {
  TempDir dir;
  const std::string p = dir / "bad.safetensors";
  auto open_msg = [&] { return message_of([&] { SafetensorsFile f(p); }); };

  {
    std::ofstream(p, std::ios::binary) << "abc";
    EXPECT_THAT(open_msg(), AllOf(HasSubstr(p), HasSubstr("too short")));
  }
  write_raw(p, "{}", "", 1000000);
  EXPECT_THAT(open_msg(), AllOf(HasSubstr(p), HasSubstr("header length 1000000 exceeds the file size")));

  write_raw(p, R"({"a": {"dtype": "F32", "shape": [1], )", "");
  EXPECT_THAT(open_msg(), AllOf(HasSubstr(p), HasSubstr("malformed JSON")));

  write_raw(p, R"([1, 2])", "");
  EXPECT_THAT(open_msg(), AllOf(HasSubstr(p), HasSubstr("not an object")));

  write_raw(p, R"({"w":{"dtype":"Q7","shape":[1],"data_offsets":[0,4]}})", std::string(4, '\0'));
  EXPECT_THAT(open_msg(), AllOf(HasSubstr(p), HasSubstr("'w'"), HasSubstr("unknown dtype \"Q7\"")));

  write_raw(p, R"({"w":{"dtype":"F32","shape":[2],"data_offsets":[0,4]}})", std::string(8, '\0'));
  EXPECT_THAT(open_msg(), AllOf(HasSubstr(p), HasSubstr("'w'"), HasSubstr("needs 8")));

  write_raw(p, R"({"w":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})", std::string(4, '\0'));
  EXPECT_THAT(open_msg(), AllOf(HasSubstr(p), HasSubstr("'w'"), HasSubstr("past the data section")));

  write_raw(p, R"({"w":{"dtype":"F32","shape":[2],"data_offsets":[8,0]}})", std::string(8, '\0'));
  EXPECT_THAT(open_msg(), AllOf(HasSubstr("'w'"), HasSubstr("begin after end")));

  write_raw(p,
            R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}})",
            std::string(12, '\0'));
  EXPECT_THAT(open_msg(), AllOf(HasSubstr(p), HasSubstr("'b'"), HasSubstr("overlap tensor 'a'")));

  write_raw(p, R"({"w":{"dtype":"F32","shape":[-2],"data_offsets":[0,8]}})", std::string(8, '\0'));
  EXPECT_THAT(open_msg(), AllOf(HasSubstr("'w'"), HasSubstr("non-negative")));

  write_raw(p, R"({"w":{"dtype":"F32","shape":[2]}})", std::string(8, '\0'));
  EXPECT_THAT(open_msg(), AllOf(HasSubstr("'w'"), HasSubstr("data_offsets")));

  write_raw(p, R"({"w":{"dtype":"F32","shape":[4611686018427387904,4611686018427387904],"data_offsets":[0,8]}})",
            std::string(8, '\0'));
  EXPECT_THAT(open_msg(), AllOf(HasSubstr("'w'"), HasSubstr("more than 2^64")));

  // Empty tensors may share an offset with others.
  write_raw(p,
            R"({"e":{"dtype":"BF16","shape":[0,3],"data_offsets":[0,0]},"w":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})",
            std::string(8, '\0'));
  EXPECT_EQ(SafetensorsFile(p).read_f32("e").size(), 0u);

  // A valid file with an integer tensor opens; reading that tensor as float names it.
  write_raw(p, R"({"i":{"dtype":"I64","shape":[1],"data_offsets":[0,8]}})", std::string(8, '\0'));
  SafetensorsFile ok(p);
  EXPECT_THAT(message_of([&] { ok.read_f32("i"); }), AllOf(HasSubstr("'i'"), HasSubstr("I64")));

  EXPECT_THAT(message_of([&] { SafetensorsFile f(dir / "nope.safetensors"); }), HasSubstr("nope.safetensors"));
}

// ---- model level ------------------------------------------------------------------------------------------

TEST(HfCheckpoint, RoundTripF32Exact) {
  TempDir dir;
  const ModelConfig m = tiny_config();
  const Weights w = make_weights(m, 0, m.num_local_experts);
  export_hf_weights(dir.str(), w.layout, m, w.dense, w.expert, DType::F32);
  EXPECT_TRUE(fs::exists(dir / "model.safetensors"));
  EXPECT_FALSE(fs::exists(dir / "model.safetensors.index.json"));

  std::vector<float> dense, expert;
  import_hf_weights(dir.str(), w.layout, m, dense, expert);
  EXPECT_EQ(dense, w.dense);
  EXPECT_EQ(expert, w.expert);
  // The file path works as well.
  import_hf_weights(dir / "model.safetensors", w.layout, m, dense, expert);
  EXPECT_EQ(expert, w.expert);

  // Original per-expert names, with w1 = rows [0, f) and w3 = rows [f, 2f) of our fused w13.
  SafetensorsFile f(dir / "model.safetensors");
  EXPECT_EQ(f.metadata().at("format"), "pt");
  const int64_t d = m.hidden_size, ff = m.intermediate_size;
  const ParamInfo& w13 = w.layout.find("model.layers.1.block_sparse_moe.experts.w13");
  const ParamInfo& w2 = w.layout.find("model.layers.1.block_sparse_moe.experts.w2");
  const auto e_w1 = f.read_f32("model.layers.1.block_sparse_moe.experts.2.w1.weight");
  const auto e_w3 = f.read_f32("model.layers.1.block_sparse_moe.experts.2.w3.weight");
  const auto e_w2 = f.read_f32("model.layers.1.block_sparse_moe.experts.2.w2.weight");
  EXPECT_EQ(f.info("model.layers.1.block_sparse_moe.experts.2.w2.weight").shape, (std::vector<int64_t>{d, ff}));
  const float* base = w.expert.data() + w13.offset + 2 * 2 * ff * d;
  EXPECT_EQ(e_w1, std::vector<float>(base, base + ff * d));
  EXPECT_EQ(e_w3, std::vector<float>(base + ff * d, base + 2 * ff * d));
  const float* b2 = w.expert.data() + w2.offset + 2 * d * ff;
  EXPECT_EQ(e_w2, std::vector<float>(b2, b2 + d * ff));
  EXPECT_TRUE(f.has("lm_head.weight"));
  EXPECT_TRUE(f.has("model.layers.0.block_sparse_moe.gate.weight"));
  // 1 embed + 2 * (7 + 3 * 4) + norm + lm_head
  EXPECT_EQ(f.names().size(), 1u + 2 * (7 + 3 * 4) + 2);

  // config.json for MixtralConfig.
  std::ifstream cin(dir / "config.json");
  const auto cfg = nlohmann::json::parse(cin);
  EXPECT_EQ(cfg["model_type"], "mixtral");
  EXPECT_EQ(cfg["architectures"][0], "MixtralForCausalLM");
  EXPECT_EQ(cfg["num_local_experts"], 4);
  EXPECT_EQ(cfg["intermediate_size"], 24);
  EXPECT_EQ(cfg["num_key_value_heads"], 2);
  EXPECT_EQ(cfg["rope_theta"], 1e6);
  EXPECT_EQ(cfg["tie_word_embeddings"], false);
  EXPECT_EQ(cfg["torch_dtype"], "float32");
  for (const auto& e : fs::directory_iterator(dir.str()))
    EXPECT_EQ(e.path().filename().string().find(".tmp"), std::string::npos) << "temp file left behind";
}

TEST(HfCheckpoint, RoundTripBf16) {
  TempDir dir;
  const ModelConfig m = tiny_config();
  const Weights w = make_weights(m, 0, m.num_local_experts);
  export_hf_weights(dir.str(), w.layout, m, w.dense, w.expert, DType::BF16);
  SafetensorsFile f(dir / "model.safetensors");
  EXPECT_EQ(f.info("model.embed_tokens.weight").dtype, "BF16");
  std::vector<float> dense, expert;
  import_hf_weights(dir.str(), w.layout, m, dense, expert);
  ASSERT_EQ(dense.size(), w.dense.size());
  ASSERT_EQ(expert.size(), w.expert.size());
  for (size_t i = 0; i < dense.size(); ++i) {
    ASSERT_EQ(dense[i], bf16_round(w.dense[i])) << i;
    ASSERT_LE(std::fabs(dense[i] - w.dense[i]), std::fabs(w.dense[i]) * (1.f / 256)) << i;
  }
  for (size_t i = 0; i < expert.size(); ++i) ASSERT_EQ(expert[i], bf16_round(w.expert[i])) << i;
  std::ifstream cin(dir / "config.json");
  EXPECT_EQ(nlohmann::json::parse(cin)["torch_dtype"], "bfloat16");
}

TEST(HfCheckpoint, ShardedExportAndIndexImport) {
  TempDir dir;
  const ModelConfig m = tiny_config();
  const Weights w = make_weights(m, 0, m.num_local_experts);
  const int64_t limit = 4096;
  export_hf_weights(dir.str(), w.layout, m, w.dense, w.expert, DType::F32, limit);
  EXPECT_FALSE(fs::exists(dir / "model.safetensors"));
  std::ifstream iin(dir / "model.safetensors.index.json");
  const auto idx = nlohmann::json::parse(iin);
  std::set<std::string> shards;
  for (auto it = idx["weight_map"].begin(); it != idx["weight_map"].end(); ++it) shards.insert(it.value());
  ASSERT_GT(shards.size(), 2u);
  const std::string n = std::to_string(shards.size());
  EXPECT_TRUE(shards.count("model-00001-of-" + std::string(5 - n.size(), '0') + n + ".safetensors"));
  int64_t total = 0;
  for (const auto& s : shards) {
    SafetensorsFile f(dir / s);
    int64_t bytes = 0;
    for (const auto& name : f.names()) bytes += f.info(name).end - f.info(name).begin;
    total += bytes;
    if (f.names().size() > 1) {
      EXPECT_LE(bytes, limit) << s;
    }
  }
  EXPECT_EQ(idx["metadata"]["total_size"], total);

  std::vector<float> dense, expert;
  import_hf_weights(dir.str(), w.layout, m, dense, expert);
  EXPECT_EQ(dense, w.dense);
  EXPECT_EQ(expert, w.expert);
  import_hf_weights(dir / "model.safetensors.index.json", w.layout, m, dense, expert);
  EXPECT_EQ(expert, w.expert);

  // Re-exporting unsharded into the same directory removes the stale shards and index.
  export_hf_weights(dir.str(), w.layout, m, w.dense, w.expert, DType::F32);
  EXPECT_TRUE(fs::exists(dir / "model.safetensors"));
  EXPECT_FALSE(fs::exists(dir / "model.safetensors.index.json"));
  for (const auto& s : shards) EXPECT_FALSE(fs::exists(dir / s)) << s;
}

// A checkpoint in transformers-5 naming: mlp.gate, fused mlp.experts.gate_up_proj [E, 2f, d] ([w1; w3] per
// expert) and mlp.experts.down_proj [E, d, f], built from a per-expert export.
std::string write_v5_checkpoint(const TempDir& dir, const ModelConfig& m, const Weights& w) {
  const std::string v4 = dir / "v4";
  export_hf_weights(v4, w.layout, m, w.dense, w.expert, DType::F32);
  auto t = load_all(v4 + "/model.safetensors");
  const int64_t E = m.num_local_experts, d = m.hidden_size, f = m.intermediate_size;
  std::map<std::string, Loaded> out;
  for (auto& [name, x] : t) {
    if (name.find(".experts.") != std::string::npos) continue;
    std::string n = name;
    const auto pos = n.find("block_sparse_moe.gate.weight");
    if (pos != std::string::npos) n = n.substr(0, pos) + "mlp.gate.weight";
    out[n] = x;
  }
  for (int64_t l = 0; l < m.num_hidden_layers; ++l) {
    const std::string pre = "model.layers." + std::to_string(l) + ".";
    Loaded gu{{E, 2 * f, d}, {}}, dn{{E, d, f}, {}};
    for (int64_t j = 0; j < E; ++j) {
      const std::string e = pre + "block_sparse_moe.experts." + std::to_string(j) + ".";
      const auto &w1 = t.at(e + "w1.weight").data, &w3 = t.at(e + "w3.weight").data, &w2 = t.at(e + "w2.weight").data;
      gu.data.insert(gu.data.end(), w1.begin(), w1.end());
      gu.data.insert(gu.data.end(), w3.begin(), w3.end());
      dn.data.insert(dn.data.end(), w2.begin(), w2.end());
    }
    out[pre + "mlp.experts.gate_up_proj"] = gu;
    out[pre + "mlp.experts.down_proj"] = dn;
  }
  fs::create_directories(dir / "v5");
  save_all(dir / "v5/model.safetensors", out);
  return dir / "v5";
}

TEST(HfCheckpoint, ImportsTransformers5FusedNaming) {
  TempDir dir;
  const ModelConfig m = tiny_config();
  const Weights w = make_weights(m, 0, m.num_local_experts);
  const std::string v5 = write_v5_checkpoint(dir, m, w);
  SafetensorsFile f(v5 + "/model.safetensors");
  EXPECT_FALSE(f.has("model.layers.0.block_sparse_moe.gate.weight"));
  EXPECT_TRUE(f.has("model.layers.0.mlp.experts.gate_up_proj"));
  std::vector<float> dense, expert;
  import_hf_weights(v5, w.layout, m, dense, expert);
  EXPECT_EQ(dense, w.dense);
  EXPECT_EQ(expert, w.expert);
}

TEST(HfCheckpoint, PartialExpertImport) {
  TempDir dir;
  const ModelConfig m = tiny_config();
  const Weights full = make_weights(m, 0, m.num_local_experts);
  export_hf_weights(dir / "v4", full.layout, m, full.dense, full.expert, DType::F32);
  const std::string v5 = write_v5_checkpoint(dir, m, full);

  // Experts 2 and 3 of 4; init_params_host draws each expert from its own stream, so a partial init with the
  // same seed is what the import must produce.
  const Weights part = make_weights(m, 2, 2);
  for (const std::string& src : {dir / "v4", v5}) {
    std::vector<float> dense, expert;
    import_hf_weights(src, part.layout, m, dense, expert);
    EXPECT_EQ(dense, full.dense) << src;
    ASSERT_EQ(static_cast<int64_t>(expert.size()), part.layout.expert_numel);
    EXPECT_EQ(expert, part.expert) << src;
    // And directly against the full buffers.
    for (const ParamInfo& p : part.layout.params) {
      if (!p.expert) continue;
      const ParamInfo& q = full.layout.find(p.name);
      const int64_t per = p.numel / 2;
      const std::vector<float> want(full.expert.begin() + q.offset + 2 * per,
                                    full.expert.begin() + q.offset + 4 * per);
      EXPECT_EQ(std::vector<float>(expert.begin() + p.offset, expert.begin() + p.offset + p.numel), want)
          << p.name << " from " << src;
    }
  }
}

TEST(HfCheckpoint, MissingAndMisshapedTensors) {
  TempDir dir;
  const ModelConfig m = tiny_config();
  const Weights w = make_weights(m, 0, m.num_local_experts);
  export_hf_weights(dir / "ok", w.layout, m, w.dense, w.expert, DType::F32);
  const auto all = load_all(dir / "ok/model.safetensors");
  std::vector<float> dense, expert;

  auto variant = [&](const std::string& name, const std::function<void(std::map<std::string, Loaded>&)>& edit) {
    auto t = all;
    edit(t);
    fs::create_directories(dir / name);
    save_all(dir / (name + "/model.safetensors"), t);
    return dir / name;
  };

  const std::string k = "model.layers.1.self_attn.k_proj.weight";
  std::string p = variant("missing", [&](auto& t) { t.erase(k); });
  EXPECT_THAT(message_of([&] { import_hf_weights(p, w.layout, m, dense, expert); }),
              AllOf(HasSubstr("'" + k + "'"), HasSubstr("not found"), HasSubstr(p)));

  const std::string w3 = "model.layers.0.block_sparse_moe.experts.3.w3.weight";
  p = variant("missing_expert", [&](auto& t) { t.erase(w3); });
  EXPECT_THAT(message_of([&] { import_hf_weights(p, w.layout, m, dense, expert); }),
              AllOf(HasSubstr("'" + w3 + "'"), HasSubstr("not found")));
  // A partial layout that does not need expert 3 does not care.
  const Weights lo = make_weights(m, 0, 2);
  EXPECT_NO_THROW(import_hf_weights(p, lo.layout, m, dense, expert));

  const std::string q = "model.layers.0.self_attn.q_proj.weight";
  p = variant("shape", [&](auto& t) {
    t[q].shape = {8, 32};  // same numel, wrong shape
  });
  EXPECT_THAT(message_of([&] { import_hf_weights(p, w.layout, m, dense, expert); }),
              AllOf(HasSubstr("'" + q + "'"), HasSubstr("[8, 32]"), HasSubstr("expected [16, 16]"),
                    HasSubstr(p + "/model.safetensors")));

  p = variant("no_lm_head", [&](auto& t) { t.erase("lm_head.weight"); });
  EXPECT_THAT(message_of([&] { import_hf_weights(p, w.layout, m, dense, expert); }),
              AllOf(HasSubstr("lm_head.weight"), HasSubstr("tie_word_embeddings")));
  ModelConfig tied = m;
  tied.tie_word_embeddings = true;
  import_hf_weights(p, w.layout, tied, dense, expert);
  const ParamInfo& lm = w.layout.find("lm_head.weight");
  const ParamInfo& emb = w.layout.find("model.embed_tokens.weight");
  EXPECT_TRUE(std::equal(dense.begin() + lm.offset, dense.begin() + lm.offset + lm.numel,
                         w.dense.begin() + emb.offset));

  // Extra tensors: warned about, not fatal.
  p = variant("extra", [&](auto& t) {
    t["model.layers.0.self_attn.rotary_emb.inv_freq"] = {{4}, {1, 2, 3, 4}};
  });
  import_hf_weights(p, w.layout, m, dense, expert);
  EXPECT_EQ(dense, w.dense);
  EXPECT_EQ(expert, w.expert);

  // No experts under either naming.
  p = variant("no_experts", [&](auto& t) {
    for (auto it = t.begin(); it != t.end();)
      it = it->first.find("layers.1.block_sparse_moe.experts") != std::string::npos ? t.erase(it) : std::next(it);
  });
  EXPECT_THAT(message_of([&] { import_hf_weights(p, w.layout, m, dense, expert); }),
              AllOf(HasSubstr("model.layers.1.block_sparse_moe.experts.0.w1.weight"),
                    HasSubstr("model.layers.1.mlp.experts.gate_up_proj")));

  // Fused tensor with the wrong expert count.
  const std::string v5 = write_v5_checkpoint(dir, m, w);
  auto t5 = load_all(v5 + "/model.safetensors");
  t5["model.layers.1.mlp.experts.down_proj"].shape = {2, 16, 48};
  save_all(v5 + "/model.safetensors", t5);
  EXPECT_THAT(message_of([&] { import_hf_weights(v5, w.layout, m, dense, expert); }),
              AllOf(HasSubstr("'model.layers.1.mlp.experts.down_proj'"), HasSubstr("[2, 16, 48]"),
                    HasSubstr("expected [4, 16, 24]")));

  EXPECT_THAT(message_of([&] { import_hf_weights(dir / "empty_dir_xyz", w.layout, m, dense, expert); }),
              HasSubstr("empty_dir_xyz"));
  fs::create_directories(dir / "empty");
  EXPECT_THAT(message_of([&] { import_hf_weights(dir / "empty", w.layout, m, dense, expert); }),
              HasSubstr("model.safetensors.index.json"));
}

TEST(HfCheckpoint, CorruptFiles) {
  TempDir dir;
  const ModelConfig m = tiny_config();
  const Weights w = make_weights(m, 0, m.num_local_experts);
  std::vector<float> dense, expert;

  export_hf_weights(dir / "trunc", w.layout, m, w.dense, w.expert, DType::F32);
  const std::string file = dir / "trunc/model.safetensors";
  fs::resize_file(file, fs::file_size(file) / 2);
  EXPECT_THAT(message_of([&] { import_hf_weights(dir / "trunc", w.layout, m, dense, expert); }),
              AllOf(HasSubstr(file), HasSubstr("past the data section")));

  fs::create_directories(dir / "hdr");
  write_raw(dir / "hdr/model.safetensors", "{}", "", uint64_t(1) << 40);
  EXPECT_THAT(message_of([&] { import_hf_weights(dir / "hdr", w.layout, m, dense, expert); }),
              AllOf(HasSubstr(dir / "hdr/model.safetensors"), HasSubstr("header length")));

  fs::create_directories(dir / "json");
  write_raw(dir / "json/model.safetensors", "{\"model.norm.weight\": {\"dtype\": ", "");
  EXPECT_THAT(message_of([&] { import_hf_weights(dir / "json", w.layout, m, dense, expert); }),
              AllOf(HasSubstr(dir / "json/model.safetensors"), HasSubstr("malformed JSON")));

  // Index pointing at a missing shard.
  export_hf_weights(dir / "shards", w.layout, m, w.dense, w.expert, DType::BF16, 4096);
  std::ifstream iin(dir / "shards/model.safetensors.index.json");
  const auto idx = nlohmann::json::parse(iin);
  const std::string victim = idx["weight_map"]["model.norm.weight"];
  fs::remove(dir / ("shards/" + victim));
  EXPECT_THAT(message_of([&] { import_hf_weights(dir / "shards", w.layout, m, dense, expert); }),
              AllOf(HasSubstr("'" + victim + "'"), HasSubstr("does not exist")));

  // Malformed index.
  {
    std::ofstream(dir / "shards/model.safetensors.index.json") << "{\"weight_map\": 3}";
  }
  EXPECT_THAT(message_of([&] { import_hf_weights(dir / "shards", w.layout, m, dense, expert); }),
              HasSubstr("weight_map"));
}

TEST(HfCheckpoint, ExportNeedsAllExperts) {
  TempDir dir;
  const ModelConfig m = tiny_config();
  const Weights part = make_weights(m, 2, 2);
  EXPECT_THAT(message_of([&] {
                export_hf_weights(dir.str(), part.layout, m, part.dense, part.expert, DType::F32);
              }),
              HasSubstr("every expert"));
  const Weights w = make_weights(m, 0, m.num_local_experts);
  EXPECT_THAT(message_of([&] { export_hf_weights(dir.str(), w.layout, m, w.dense, w.expert, DType::I32); }),
              HasSubstr("F32 or BF16"));
}
