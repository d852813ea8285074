// backend=cuda-fp32 (CudaF32Ops, kernels/fp32) against the CPU twin: every op it implements on fresh random
// fp32 inputs, to fp32 tolerance (both sum in fp32 or fp64, only the order differs); then whole training runs.
#include <algorithm>
#include <cmath>
#include <random>
#include <vector>

#include "cuda_test_util.hpp"
#include "fp32/cuda_f32_ops.hpp"
#include "mxtrain/data.hpp"
#include "mxtrain/mxfp8.hpp"
#include "mxtrain/trainer.hpp"
#include "tiny_config.hpp"
#include "trained_run.hpp"

namespace mxt::testing {
namespace {

constexpr double kTol = 1e-5;  // relative L2, fp32 results summed in another order

struct Backends {
  std::unique_ptr<Ops> gpu = make_cuda_f32_ops();
  std::unique_ptr<Ops> cpu = make_cpu_ops();
};

DeviceTensor up(Ops& o, const std::vector<float>& v, std::initializer_list<int64_t> dims) {
  return upload(o, v, DType::F32, dims);
}

TEST(CudaF32Ops, IsTheFp32Backend) {
  MXT_REQUIRE_GPU();
  Backends b;
  EXPECT_EQ(b.gpu->act_dtype(), DType::F32);
  EXPECT_STREQ(b.gpu->name(), "cuda-fp32");
}

TEST(CudaF32Ops, GemmAllTransposes) {
  MXT_REQUIRE_GPU();
  Backends b;
  const int64_t M = 37, N = 53, K = 71;
  for (int ta = 0; ta < 2; ++ta)
    for (int tb = 0; tb < 2; ++tb) {
      std::vector<float> A = randn(M * K, 1 + ta), B = randn(K * N, 3 + tb), C = randn(M * N, 5), Cc = C;
      auto dA = up(*b.gpu, A, {M * K}), dB = up(*b.gpu, B, {K * N}), dC = up(*b.gpu, C, {M * N});
      b.gpu->gemm(ta, tb, M, N, K, 0.7f, dA, dB, 0.5f, dC);
      b.cpu->gemm(ta, tb, M, N, K, 0.7f, host(A, {M * K}), host(B, {K * N}), 0.5f, host(Cc, {M * N}));
      EXPECT_CLOSE_REL(download(*b.gpu, dC), Cc, kTol);
    }
}

TEST(CudaF32Ops, EmbeddingForwardBackward) {
  MXT_REQUIRE_GPU();
  Backends b;
  const int64_t V = 50, d = 40, T = 300;
  std::mt19937 rng(7);
  std::vector<int32_t> ids(T);
  for (auto& i : ids) i = static_cast<int32_t>(rng() % 20);  // repeated ids: rows with many tokens
  std::vector<float> table = randn(V * d, 8), dout = randn(T * d, 9), dtab = randn(V * d, 10), dtab_c = dtab;
  auto dids = upload_i32(*b.gpu, ids, {T});
  auto dt = up(*b.gpu, table, {V, d}), dg = up(*b.gpu, dout, {T, d}), ddt = up(*b.gpu, dtab, {V, d});
  DeviceTensor out(*b.gpu, DType::F32, {T, d});
  std::vector<float> out_c(T * d);
  b.gpu->embedding_forward(dids, dt, out);
  b.cpu->embedding_forward(host_i32(ids, {T}), host(table, {V, d}), host(out_c, {T, d}));
  EXPECT_EQ(download(*b.gpu, out), out_c);
  b.gpu->embedding_backward(dids, dg, ddt);
  b.cpu->embedding_backward(host_i32(ids, {T}), host(dout, {T, d}), host(dtab_c, {V, d}));
  EXPECT_CLOSE_REL(download(*b.gpu, ddt), dtab_c, kTol);
}

TEST(CudaF32Ops, RmsNormForwardBackward) {
  MXT_REQUIRE_GPU();
  Backends b;
  const int64_t T = 77, d = 300;
  std::vector<float> x = randn(T * d, 11, 2.f), w = randn(d, 12), dy = randn(T * d, 13), dw = randn(d, 14), dw_c = dw;
  std::vector<float> y_c(T * d), r_c(T), dx_c(T * d);
  auto dx_ = up(*b.gpu, x, {T, d}), dw_ = up(*b.gpu, w, {d}), ddy = up(*b.gpu, dy, {T, d}), ddw = up(*b.gpu, dw, {d});
  DeviceTensor y(*b.gpu, DType::F32, {T, d}), r(*b.gpu, DType::F32, {T}), dx(*b.gpu, DType::F32, {T, d});
  b.gpu->rmsnorm_forward(dx_, dw_, 1e-5f, y, r);
  b.cpu->rmsnorm_forward(host(x, {T, d}), host(w, {d}), 1e-5f, host(y_c, {T, d}), host(r_c, {T}));
  EXPECT_CLOSE_REL(download(*b.gpu, y), y_c, kTol);
  EXPECT_CLOSE_REL(download(*b.gpu, r), r_c, kTol);
  b.gpu->rmsnorm_backward(ddy, dx_, dw_, r, dx, ddw);
  b.cpu->rmsnorm_backward(host(dy, {T, d}), host(x, {T, d}), host(w, {d}), host(r_c, {T}), host(dx_c, {T, d}),
                          host(dw_c, {d}));
  EXPECT_CLOSE_REL(download(*b.gpu, dx), dx_c, kTol);
  EXPECT_CLOSE_REL(download(*b.gpu, ddw), dw_c, kTol);
}

TEST(CudaF32Ops, RopeForwardBackward) {
  MXT_REQUIRE_GPU();
  Backends b;
  const int64_t T = 64, H = 3, D = 64;
  std::vector<int32_t> pos(T);
  std::mt19937 rng(15);
  for (auto& p : pos) p = static_cast<int32_t>(rng() % 4096);  // long positions: the angles' fp32 rounding
  std::vector<float> x = randn(T * H * D, 16), x_c = x;
  auto dx = up(*b.gpu, x, {T, H, D});
  auto dpos = upload_i32(*b.gpu, pos, {T});
  b.gpu->rope_forward(dx, dpos, 1e6f);
  b.cpu->rope_forward(host(x_c, {T, H, D}), host_i32(pos, {T}), 1e6f);
  EXPECT_CLOSE_REL(download(*b.gpu, dx), x_c, kTol);
  b.gpu->rope_backward(dx, dpos, 1e6f);
  b.cpu->rope_backward(host(x_c, {T, H, D}), host_i32(pos, {T}), 1e6f);
  EXPECT_CLOSE_REL(download(*b.gpu, dx), x_c, kTol);
  EXPECT_CLOSE_REL(x_c, x, 1e-5);  // the backward rotation undoes the forward one
}

// Causal GQA attention at head dims 16 and 64, sequences that cross the kernels' 128-key chunks, with and
// without packed documents.
TEST(CudaF32Ops, AttentionForwardBackward) {
  MXT_REQUIRE_GPU();
  Backends b;
  for (const int64_t D : {16, 64})
    for (const bool docs : {false, true}) {
      const int64_t B = 2, S = 200, H = 4, KVH = 2, T = B * S;
      std::vector<float> q = randn(T * H * D, 20 + D), k = randn(T * KVH * D, 21), v = randn(T * KVH * D, 22);
      std::vector<float> g = randn(T * H * D, 23);
      std::vector<int32_t> doc(T);
      for (int64_t t = 0; t < T; ++t) doc[t] = static_cast<int32_t>((t % S) / 70 + 10 * (t / S));  // 3 per row
      auto dq_in = up(*b.gpu, q, {T, H * D}), dk_in = up(*b.gpu, k, {T, KVH * D}), dv_in = up(*b.gpu, v, {T, KVH * D});
      auto dg = up(*b.gpu, g, {T, H * D});
      auto ddoc = upload_i32(*b.gpu, doc, {T});
      AttnShape s{B, S, H, KVH, D, docs ? ddoc.t : Tensor()};
      AttnShape sc{B, S, H, KVH, D, docs ? host_i32(doc, {T}) : Tensor()};
      DeviceTensor o(*b.gpu, DType::F32, {T, H * D}), lse(*b.gpu, DType::F32, {B * H * S});
      DeviceTensor dq(*b.gpu, DType::F32, {T, H * D}), dk(*b.gpu, DType::F32, {T, KVH * D}),
          dv(*b.gpu, DType::F32, {T, KVH * D});
      std::vector<float> o_c(T * H * D), lse_c(B * H * S), dq_c(T * H * D), dk_c(T * KVH * D), dv_c(T * KVH * D);
      b.gpu->attention_forward(s, dq_in, dk_in, dv_in, o, lse);
      b.cpu->attention_forward(sc, host(q, {T, H * D}), host(k, {T, KVH * D}), host(v, {T, KVH * D}),
                               host(o_c, {T, H * D}), host(lse_c, {B * H * S}));
      SCOPED_TRACE("D=" + std::to_string(D) + (docs ? " with documents" : ""));
      EXPECT_CLOSE_REL(download(*b.gpu, o), o_c, kTol);
      EXPECT_CLOSE_REL(download(*b.gpu, lse), lse_c, kTol);
      b.gpu->attention_backward(s, dg, dq_in, dk_in, dv_in, o, lse, dq, dk, dv);
      b.cpu->attention_backward(sc, host(g, {T, H * D}), host(q, {T, H * D}), host(k, {T, KVH * D}),
                                host(v, {T, KVH * D}), host(o_c, {T, H * D}), host(lse_c, {B * H * S}),
                                host(dq_c, {T, H * D}), host(dk_c, {T, KVH * D}), host(dv_c, {T, KVH * D}));
      EXPECT_CLOSE_REL(download(*b.gpu, dq), dq_c, kTol);
      EXPECT_CLOSE_REL(download(*b.gpu, dk), dk_c, kTol);
      EXPECT_CLOSE_REL(download(*b.gpu, dv), dv_c, kTol);
    }
}

// Uneven expert loads, an expert with no rows and capacity padding past offsets[E].
TEST(CudaF32Ops, GroupedGemmsAndPermutation) {
  MXT_REQUIRE_GPU();
  Backends b;
  const int64_t T = 90, k = 2, E = 5, in = 48, out = 70, R = T * k + 13;
  std::mt19937 rng(30);
  std::vector<int32_t> idx(T * k);
  for (int64_t t = 0; t < T; ++t) {
    idx[t * k] = static_cast<int32_t>(rng() % 2);          // experts 0 and 1 take most tokens
    idx[t * k + 1] = static_cast<int32_t>(3 + rng() % 2);  // expert 2 none
  }
  std::vector<int32_t> off(E + 1), perm(T * k);
  b.cpu->moe_plan(host_i32(idx, {T, k}), static_cast<int>(E), host_i32(off, {E + 1}), host_i32(perm, {T * k}));
  ASSERT_EQ(off[3] - off[2], 0);
  auto doff = upload_i32(*b.gpu, off, {E + 1});
  auto dperm = upload_i32(*b.gpu, perm, {T * k});

  std::vector<float> x = randn(T * in, 31), xp_c(T * k * in);
  auto dx = up(*b.gpu, x, {T, in});
  DeviceTensor xp(*b.gpu, DType::F32, {T * k, in});
  b.gpu->moe_permute(dx, dperm, static_cast<int>(k), xp);
  b.cpu->moe_permute(host(x, {T, in}), host_i32(perm, {T * k}), static_cast<int>(k), host(xp_c, {T * k, in}));
  EXPECT_EQ(download(*b.gpu, xp), xp_c);
  std::vector<float> back_c(T * in);
  DeviceTensor back(*b.gpu, DType::F32, {T, in});
  b.gpu->moe_unpermute(xp, dperm, static_cast<int>(k), back);
  b.cpu->moe_unpermute(host(xp_c, {T * k, in}), host_i32(perm, {T * k}), static_cast<int>(k), host(back_c, {T, in}));
  EXPECT_CLOSE_REL(download(*b.gpu, back), back_c, kTol);

  // y starts as garbage on both sides: the padding rows must come out as zeros.
  std::vector<float> xr = randn(R * in, 32), W = randn(E * out * in, 33, 0.1f), y_c = randn(R * out, 36);
  auto dxr = up(*b.gpu, xr, {R, in}), dW = up(*b.gpu, W, {E, out, in}), y = up(*b.gpu, y_c, {R, out});
  b.gpu->grouped_gemm(dxr, dW, doff, y);
  b.cpu->grouped_gemm(host(xr, {R, in}), host(W, {E, out, in}), host_i32(off, {E + 1}), host(y_c, {R, out}));
  EXPECT_CLOSE_REL(download(*b.gpu, y), y_c, kTol);

  std::vector<float> dy = randn(R * out, 34), dx_c(R * in), gW = randn(E * out * in, 35), gW_c = gW;
  auto ddy = up(*b.gpu, dy, {R, out}), dgW = up(*b.gpu, gW, {E, out, in});
  DeviceTensor dxo(*b.gpu, DType::F32, {R, in});
  b.gpu->grouped_gemm_dgrad(ddy, dW, doff, dxo);
  b.cpu->grouped_gemm_dgrad(host(dy, {R, out}), host(W, {E, out, in}), host_i32(off, {E + 1}), host(dx_c, {R, in}));
  EXPECT_CLOSE_REL(download(*b.gpu, dxo), dx_c, kTol);
  b.gpu->grouped_gemm_wgrad(ddy, dxr, doff, dgW);
  b.cpu->grouped_gemm_wgrad(host(dy, {R, out}), host(xr, {R, in}), host_i32(off, {E + 1}), host(gW_c, {E, out, in}));
  EXPECT_CLOSE_REL(download(*b.gpu, dgW), gW_c, kTol);
}

TEST(CudaF32Ops, SwiGluForwardBackward) {
  MXT_REQUIRE_GPU();
  Backends b;
  const int64_t R = 61, f = 96;
  std::vector<float> h = randn(R * 2 * f, 40, 2.f), w = randn(R, 41), da = randn(R * f, 42);
  std::vector<float> a_c(R * f), dh_c(R * 2 * f), dw_c(R);
  auto dh_in = up(*b.gpu, h, {R, 2 * f}), dw_in = up(*b.gpu, w, {R}), dda = up(*b.gpu, da, {R, f});
  DeviceTensor a(*b.gpu, DType::F32, {R, f}), dh(*b.gpu, DType::F32, {R, 2 * f}), dw(*b.gpu, DType::F32, {R});
  b.gpu->swiglu_forward(dh_in, dw_in, a);
  b.cpu->swiglu_forward(host(h, {R, 2 * f}), host(w, {R}), host(a_c, {R, f}));
  EXPECT_CLOSE_REL(download(*b.gpu, a), a_c, kTol);
  b.gpu->swiglu_backward(dda, dh_in, dw_in, dh, dw);
  b.cpu->swiglu_backward(host(da, {R, f}), host(h, {R, 2 * f}), host(w, {R}), host(dh_c, {R, 2 * f}), host(dw_c, {R}));
  EXPECT_CLOSE_REL(download(*b.gpu, dh), dh_c, kTol);
  EXPECT_CLOSE_REL(download(*b.gpu, dw), dw_c, kTol);
}

// Chunked (3 chunks of 24 rows for 70 tokens) and kept-logits forms, ignored labels, a gradient scale.
TEST(CudaF32Ops, LmHeadLoss) {
  MXT_REQUIRE_GPU();
  Backends b;
  const int64_t T = 70, d = 32, V = 301;
  std::mt19937 rng(50);
  std::vector<int32_t> lab(T);
  for (auto& l : lab) l = rng() % 5 == 0 ? -100 : static_cast<int32_t>(rng() % V);
  std::vector<float> h = randn(T * d, 51), W = randn(V * d, 52, 0.3f);
  auto dlab = upload_i32(*b.gpu, lab, {T});
  auto dh_in = up(*b.gpu, h, {T, d}), dW_in = up(*b.gpu, W, {V, d});
  b.gpu->set_lm_head_chunk_tokens(24);
  for (const bool keep : {false, true}) {
    SCOPED_TRACE(keep ? "kept logits" : "chunked");
    std::vector<float> loss = {1.5f}, loss_c = loss, dh_c(T * d), gW = randn(V * d, 53), gW_c = gW, dz_c(T * V);
    auto dloss = up(*b.gpu, loss, {1}), dgW = up(*b.gpu, gW, {V, d});
    DeviceTensor dh(*b.gpu, DType::F32, {T, d}), dz(*b.gpu, DType::F32, {T, V});
    b.gpu->lm_head_loss(dh_in, dW_in, dlab, 0.25f, dloss, dh, dgW, keep ? dz.t : Tensor());
    b.cpu->lm_head_loss(host(h, {T, d}), host(W, {V, d}), host_i32(lab, {T}), 0.25f, host(loss_c, {1}),
                        host(dh_c, {T, d}), host(gW_c, {V, d}), keep ? host(dz_c, {T, V}) : Tensor());
    EXPECT_NEAR(download(*b.gpu, dloss)[0], loss_c[0], 1e-6 * std::abs(loss_c[0]));
    EXPECT_CLOSE_REL(download(*b.gpu, dh), dh_c, kTol);
    if (keep) EXPECT_CLOSE_REL(download(*b.gpu, dz), dz_c, kTol);
    else EXPECT_CLOSE_REL(download(*b.gpu, dgW), gW_c, kTol);
  }
}

TEST(CudaF32Ops, MxOpsAreRefused) {
  MXT_REQUIRE_GPU();
  Backends b;
  mxfp8::MxView v{};
  try {
    b.gpu->mx_gemm(v, v, Tensor(), Tensor());
    FAIL() << "mx_gemm ran on the fp32 backend";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find("backend=cuda"), std::string::npos) << e.what();
  }
}

// Whole runs of the tiny model, on the GPU in fp32 and on the CPU: the same losses and weights to fp32 rounding
// (AdamW's step divides by sqrt(v), so order-of-summation differences in small gradients grow a little per step).
TEST(CudaF32Training, TracksTheCpuBackend) {
  MXT_REQUIRE_GPU();
  for (const bool packing : {false, true}) {
    SCOPED_TRACE(packing ? "sequence packing (document masks)" : "windows");
    TrainConfig c = tiny_config("mxtrain_test_cuda_f32", 64, 96);
    c.num_train_steps = 6;
    c.lr_scheduler = {2, 4, 0.1};
    c.dataset.sequence_packing = packing;
    auto gpu = make_cuda_f32_ops();
    auto cpu = make_cpu_ops();
    TrainedRun g;
    {
      Trainer t(c, *gpu, embedded_corpus_tokens());
      g.losses = t.run();
      EXPECT_TRUE(t.replaying_graphs()) << "the micro-batches were not captured as CUDA graphs (see the warning)";
      t.master_weights(g.dense, g.expert);
    }
    const TrainedRun r = train_to_end(c, *cpu);
    ASSERT_EQ(g.losses.size(), r.losses.size());
    for (size_t i = 0; i < r.losses.size(); ++i) {
      std::printf("  step %zu: cuda-fp32 %.7f cpu %.7f\n", i + 1, g.losses[i], r.losses[i]);
      EXPECT_NEAR(g.losses[i], r.losses[i], 1e-5 * std::abs(r.losses[i])) << "step " << i + 1;
    }
    EXPECT_CLOSE_REL(g.dense, r.dense, 1e-5);
    EXPECT_CLOSE_REL(g.expert, r.expert, 1e-5);
  }
}

}  // namespace
}  // namespace mxt::testing
