// Packed rows keep attention inside each document: the CPU attention op with AttnShape::doc_ids (forward and
// backward) and the whole model with positions restarting per document.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "cpu/cpu_ops.hpp"
#include "mxtrain/model.hpp"
#include "mxtrain/ops.hpp"
#include "mxtrain/params.hpp"
#include "tiny_config.hpp"

namespace mxt {
namespace {

using mxt::testing::tiny_model;

using FVec = std::vector<float>;
using IVec = std::vector<int32_t>;

FVec uniform(size_t n, std::mt19937& rng) {
  std::uniform_real_distribution<float> d(-1.5f, 1.5f);
  FVec v(n);
  for (auto& x : v) x = d(rng);
  return v;
}
Tensor F(FVec& v, std::initializer_list<int64_t> dims) { return Tensor(v.data(), DType::F32, dims); }
Tensor I(IVec& v, std::initializer_list<int64_t> dims) { return Tensor(v.data(), DType::I32, dims); }

// Two rows of 12 tokens; row 0 packs documents of 4, 5 and 3 tokens, row 1 of 7 and 5.
struct Packed {
  static constexpr int64_t B = 2, S = 12, H = 4, KVH = 2, D = 8, T = B * S;
  IVec doc = {0, 0, 0, 0, 1, 1, 1, 1, 1, 2, 2, 2, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1};
  std::unique_ptr<Ops> ops = make_cpu_ops();
  FVec q, k, v;
  AttnShape shape(bool masked) {
    AttnShape s{B, S, H, KVH, D};
    if (masked) s.doc_ids = I(doc, {T});
    return s;
  }
  void forward(bool masked, FVec& out, FVec& lse) {
    out.assign(T * H * D, 0.f);
    lse.assign(B * H * S, 0.f);
    ops->attention_forward(shape(masked), F(q, {T, H, D}), F(k, {T, KVH, D}), F(v, {T, KVH, D}), F(out, {T, H, D}),
                           F(lse, {B, H, S}));
  }
};

// Tokens [first, first + n) of row b as a batch of their own (one row of n tokens), plain causal.
void alone(Packed& p, int64_t b, int64_t first, int64_t n, FVec& out) {
  auto cut = [&](const FVec& x, int64_t heads) {
    const int64_t w = heads * Packed::D;
    return FVec(x.begin() + (b * Packed::S + first) * w, x.begin() + (b * Packed::S + first + n) * w);
  };
  FVec q = cut(p.q, Packed::H), k = cut(p.k, Packed::KVH), v = cut(p.v, Packed::KVH), lse(Packed::H * n);
  out.assign(n * Packed::H * Packed::D, 0.f);
  p.ops->attention_forward(AttnShape{1, n, Packed::H, Packed::KVH, Packed::D}, F(q, {n, Packed::H, Packed::D}),
                           F(k, {n, Packed::KVH, Packed::D}), F(v, {n, Packed::KVH, Packed::D}),
                           F(out, {n, Packed::H, Packed::D}), F(lse, {1, Packed::H, n}));
}

TEST(DataAttention, EachPackedDocumentAttendsOnlyToItself) {
  std::mt19937 rng(11);
  Packed p;
  p.q = uniform(Packed::T * Packed::H * Packed::D, rng);
  p.k = uniform(Packed::T * Packed::KVH * Packed::D, rng);
  p.v = uniform(Packed::T * Packed::KVH * Packed::D, rng);
  FVec out, lse, plain, plain_lse;
  p.forward(true, out, lse);
  p.forward(false, plain, plain_lse);
  struct Doc {
    int64_t b, first, n;
  };
  const int64_t w = Packed::H * Packed::D;
  for (const Doc d : {Doc{0, 0, 4}, Doc{0, 4, 5}, Doc{0, 9, 3}, Doc{1, 0, 7}, Doc{1, 7, 5}}) {
    FVec ref;
    alone(p, d.b, d.first, d.n, ref);
    for (int64_t i = 0; i < d.n * w; ++i)
      ASSERT_NEAR(out[(d.b * Packed::S + d.first) * w + i], ref[i], 1e-6f) << d.b << "/" << d.first << " " << i;
  }
  // The first document of each row sees nothing else either way; later ones differ from plain causal.
  double diff = 0;
  for (int64_t i = 4 * w; i < 12 * w; ++i) diff = std::max(diff, double(std::abs(out[i] - plain[i])));
  EXPECT_GT(diff, 1e-2) << "the mask changed nothing: the test would not catch a missing mask";
}

TEST(DataAttention, ChangingOneDocumentLeavesTheNextOneAlone) {
  std::mt19937 rng(12);
  Packed p;
  p.q = uniform(Packed::T * Packed::H * Packed::D, rng);
  p.k = uniform(Packed::T * Packed::KVH * Packed::D, rng);
  p.v = uniform(Packed::T * Packed::KVH * Packed::D, rng);
  FVec out1, lse1, out2, lse2;
  p.forward(true, out1, lse1);
  // New q, k, v for document 0 of row 0 (tokens 0..3).
  for (int64_t t = 0; t < 4; ++t) {
    for (int64_t i = 0; i < Packed::H * Packed::D; ++i) p.q[t * Packed::H * Packed::D + i] += 0.7f;
    for (int64_t i = 0; i < Packed::KVH * Packed::D; ++i) {
      p.k[t * Packed::KVH * Packed::D + i] *= -1.3f;
      p.v[t * Packed::KVH * Packed::D + i] += 2.f;
    }
  }
  p.forward(true, out2, lse2);
  const int64_t w = Packed::H * Packed::D;
  for (int64_t i = 4 * w; i < Packed::T * w; ++i) ASSERT_EQ(out1[i], out2[i]) << "element " << i;
  EXPECT_NE(out1[0], out2[0]);
  FVec plain1, plain2, l;
  p.forward(false, plain2, l);  // without the mask document 1 does see document 0's change
  double diff = 0;
  for (int64_t i = 4 * w; i < 9 * w; ++i) diff = std::max(diff, double(std::abs(out2[i] - plain2[i])));
  EXPECT_GT(diff, 1e-2);
}

TEST(DataAttention, NoGradientCrossesADocumentBoundary) {
  std::mt19937 rng(13);
  Packed p;
  p.q = uniform(Packed::T * Packed::H * Packed::D, rng);
  p.k = uniform(Packed::T * Packed::KVH * Packed::D, rng);
  p.v = uniform(Packed::T * Packed::KVH * Packed::D, rng);
  const int64_t T = Packed::T, H = Packed::H, KVH = Packed::KVH, D = Packed::D;
  for (bool masked : {true, false}) {
    FVec out, lse;
    p.forward(masked, out, lse);
    // A loss on document 1 of row 0 only (tokens 4..8).
    FVec dout(T * H * D, 0.f);
    for (int64_t i = 4 * H * D; i < 9 * H * D; ++i) dout[i] = std::sin(0.37f * static_cast<float>(i));
    FVec dq(T * H * D), dk(T * KVH * D), dv(T * KVH * D);
    p.ops->attention_backward(p.shape(masked), F(dout, {T, H, D}), F(p.q, {T, H, D}), F(p.k, {T, KVH, D}),
                              F(p.v, {T, KVH, D}), F(out, {T, H, D}), F(lse, {Packed::B, H, Packed::S}),
                              F(dq, {T, H, D}), F(dk, {T, KVH, D}), F(dv, {T, KVH, D}));
    double to_doc0 = 0, to_doc1 = 0;
    for (int64_t i = 0; i < 4 * KVH * D; ++i) to_doc0 = std::max(to_doc0, double(std::abs(dk[i]) + std::abs(dv[i])));
    for (int64_t i = 4 * KVH * D; i < 9 * KVH * D; ++i)
      to_doc1 = std::max(to_doc1, double(std::abs(dk[i]) + std::abs(dv[i])));
    EXPECT_GT(to_doc1, 1e-3);
    if (masked)
      EXPECT_EQ(to_doc0, 0.0) << "document 1's loss reached document 0's keys/values";
    else
      EXPECT_GT(to_doc0, 1e-3) << "plain causal attention should pass gradient back to document 0";
    for (int64_t i = 9 * KVH * D; i < T * KVH * D; ++i) ASSERT_EQ(dk[i] + dv[i], 0.f);  // later tokens: never
  }
}

TEST(DataAttention, GradientMatchesFiniteDifferencesWithTheMask) {
  std::mt19937 rng(14);
  Packed p;
  p.q = uniform(Packed::T * Packed::H * Packed::D, rng);
  p.k = uniform(Packed::T * Packed::KVH * Packed::D, rng);
  p.v = uniform(Packed::T * Packed::KVH * Packed::D, rng);
  const int64_t T = Packed::T, H = Packed::H, KVH = Packed::KVH, D = Packed::D;
  const FVec R = uniform(T * H * D, rng);
  auto L = [&] {
    FVec out, lse;
    p.forward(true, out, lse);
    double s = 0;
    for (size_t i = 0; i < out.size(); ++i) s += double(out[i]) * R[i];
    return s;
  };
  FVec out, lse;
  p.forward(true, out, lse);
  FVec dq(T * H * D), dk(T * KVH * D), dv(T * KVH * D), r = R;
  p.ops->attention_backward(p.shape(true), F(r, {T, H, D}), F(p.q, {T, H, D}), F(p.k, {T, KVH, D}),
                            F(p.v, {T, KVH, D}), F(out, {T, H, D}), F(lse, {Packed::B, H, Packed::S}),
                            F(dq, {T, H, D}), F(dk, {T, KVH, D}), F(dv, {T, KVH, D}));
  for (auto [x, g] : {std::pair{&p.q, &dq}, std::pair{&p.k, &dk}, std::pair{&p.v, &dv}})
    for (size_t i = 0; i < x->size(); i += 7) {
      const float x0 = (*x)[i];
      (*x)[i] = x0 + 1e-3f;
      const double lp = L();
      (*x)[i] = x0 - 1e-3f;
      const double lm = L();
      (*x)[i] = x0;
      const double num = (lp - lm) / 2e-3;
      ASSERT_NEAR((*g)[i], num, 2e-3 + 1e-2 * std::abs(num)) << i;
    }
}

// ------------------------------------------------------------------------------------------ whole model

ModelConfig tiny() {
  ModelConfig m = tiny_model(40, 16, 24, 16);
  m.rope_theta = 10000;
  m.initializer_range = 0.3;
  return m;
}

// One packed row [A (5 tokens) | B (7 tokens)], loss on B only: its loss and gradients must not depend on A.
struct PackedModel {
  ModelConfig cfg = tiny();
  std::unique_ptr<Ops> ops = make_cpu_ops();
  ParamLayout layout = ParamLayout::build(cfg, 0, cfg.num_local_experts);
  std::vector<float> dense, expert, gdense, gexpert;
  std::unique_ptr<MixtralModel> model;
  static constexpr int64_t S = 12;

  PackedModel() {
    init_params_host(layout, cfg, 5, dense, expert);
    gdense.assign(dense.size(), 0.f);
    gexpert.assign(expert.size(), 0.f);
    model = std::make_unique<MixtralModel>(cfg, *ops, 1, S, layout);
    model->bind(Tensor(dense.data(), DType::F32, {(int64_t)dense.size()}),
                Tensor(expert.data(), DType::F32, {(int64_t)expert.size()}),
                Tensor(gdense.data(), DType::F32, {(int64_t)gdense.size()}),
                Tensor(gexpert.data(), DType::F32, {(int64_t)gexpert.size()}));
  }
  // Loss of document B given document A's tokens; packed: doc ids and positions restarting at B.
  float loss(IVec a, bool packed) {
    IVec b = {21, 22, 23, 24, 25, 26, 27};
    IVec ids = a, labels(S, -100), pos(S), doc(S);
    ids.insert(ids.end(), b.begin(), b.end());
    for (int64_t t = 0; t < S; ++t) {
      const bool in_b = t >= 5;
      pos[t] = static_cast<int32_t>(packed && in_b ? t - 5 : t);
      doc[t] = in_b ? 1 : 0;
      if (in_b && t + 1 < S) labels[t] = ids[t + 1];
    }
    std::fill(gdense.begin(), gdense.end(), 0.f);
    std::fill(gexpert.begin(), gexpert.end(), 0.f);
    MicroBatch mb{I(ids, {S}), I(labels, {S}), I(pos, {S})};
    if (packed) mb.doc_ids = I(doc, {S});
    float sum = 0;
    model->forward_backward(mb, 1.f, 1.f, Tensor(&sum, DType::F32, {1}), true, 1);
    return sum;
  }
  // Largest gradient magnitude on the embedding rows of tokens 1..5 (A's tokens; B uses 21..27).
  float embed_grad_of_a() {
    const ParamInfo& e = layout.find("model.embed_tokens.weight");
    float m = 0;
    for (int64_t tok = 1; tok <= 5; ++tok)
      for (int64_t i = 0; i < cfg.hidden_size; ++i)
        m = std::max(m, std::abs(gdense[e.offset + tok * cfg.hidden_size + i]));
    return m;
  }
};

TEST(DataAttention, ModelLossOfADocumentIgnoresItsPackedNeighbour) {
  PackedModel m;
  const float l1 = m.loss({1, 2, 3, 4, 5}, true);
  EXPECT_EQ(m.embed_grad_of_a(), 0.f) << "document B's loss reached document A's embeddings";
  const float l2 = m.loss({5, 3, 1, 2, 4}, true);
  EXPECT_NEAR(l1, l2, 1e-6f * std::abs(l1));
  // Unpacked (plain causal, positions 0..11) the same row does depend on A: the test can fail.
  const float u1 = m.loss({1, 2, 3, 4, 5}, false);
  EXPECT_GT(m.embed_grad_of_a(), 1e-4f);
  const float u2 = m.loss({5, 3, 1, 2, 4}, false);
  EXPECT_GT(std::abs(u1 - u2), 1e-4f);
}

}  // namespace
}  // namespace mxt
