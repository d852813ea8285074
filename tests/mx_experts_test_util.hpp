#pragma once
// One MXFP8 expert-MLP problem (uneven expert loads, one empty expert, a token count that is not a multiple
// of 32) and its buffers on a backend, shared by the CPU test (against the fp32 ops) and the CUDA test
// (against the CPU twin).
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <memory>
#include <random>
#include <vector>

#include "model/mx_experts.hpp"
#include "mxtrain/arena.hpp"
#include "mxtrain/bf16.hpp"
#include "mxtrain/ops.hpp"

namespace mxt::testing {

struct MxExpertProblem {
  int64_t E = 4, d = 64, f = 96;
  std::vector<int32_t> off;  // [E+1]
  int64_t n = 0, np = 0;     // rows, rows padded to 32
  std::vector<float> x, w13, w2, wp, dy;  // x, dy: [n, d]; w13 [E, 2f, d]; w2 [E, d, f]; wp [n]

  // loads: rows per expert (one may be 0). Values are bf16-representable so every backend sees the same.
  MxExpertProblem(std::vector<int32_t> loads, uint32_t seed) : E(static_cast<int64_t>(loads.size())) {
    off.assign(1, 0);
    for (int32_t c : loads) off.push_back(off.back() + c);
    n = off.back();
    np = mx_pad_rows(n);
    std::mt19937 rng(seed);
    auto fill = [&](std::vector<float>& v, size_t count, float scale) {
      std::normal_distribution<float> g(0.f, scale);
      v.resize(count);
      for (auto& e : v) e = bf16(g(rng));
    };
    fill(x, n * d, 1.f);
    fill(w13, E * 2 * f * d, 0.125f);
    fill(w2, E * d * f, 0.1f);
    fill(dy, n * d, 1e-3f);  // gradients are small: the scales must follow them
    std::uniform_real_distribution<float> u(0.2f, 1.f);
    wp.resize(n);
    for (auto& e : wp) e = bf16(u(rng));
  }
  static float bf16(float v) { return round_to_bf16(v); }
};

// Everything mx_experts_forward / backward read and write, allocated on `ops` in one arena.
struct MxExpertBuffers {
  Arena arena;
  MxExpertWeights w;
  MxBuf x_col, act_col, row, col;
  Tensor off, x, wp, h13, act, y, dy, dact, dh13, dx, dwp, dw13, dw2;
  MxExpertRun run;

  MxExpertBuffers(Ops& ops, const MxExpertProblem& p, mxfp8::Format grad) {
    const DType A = ops.act_dtype(), F = DType::F32;
    const int64_t np = p.np, d = p.d, f = p.f, E = p.E;
    w.w13.plan(arena, "w13", E, 2 * f, d);
    w.w2.plan(arena, "w2", E, d, f);
    x_col.plan(arena, "x_col", np * d);
    act_col.plan(arena, "act_col", np * f);
    row.plan(arena, "row", np * std::max(d, 2 * f));
    col.plan(arena, "col", np * std::max(d, 2 * f));
    arena.add(off, "off", DType::I32, {E + 1});
    arena.add(x, "x", A, {np, d});
    arena.add(wp, "wp", F, {p.n});
    arena.add(h13, "h13", A, {p.n, 2 * f});
    arena.add(act, "act", A, {np, f});
    arena.add(y, "y", A, {p.n, d});
    arena.add(dy, "dy", A, {np, d});
    arena.add(dact, "dact", A, {p.n, f});
    arena.add(dh13, "dh13", A, {np, 2 * f});
    arena.add(dx, "dx", A, {p.n, d});
    arena.add(dwp, "dwp", F, {p.n});
    arena.add(dw13, "dw13", F, {E, 2 * f, d});
    arena.add(dw2, "dw2", F, {E, d, f});
    arena.finalize(ops);
    ops.upload(off.data, p.off.data(), p.off.size() * 4);
    put(ops, x, p.x, 1e4f);  // garbage in the pad rows: the forward must zero them
    put(ops, dy, p.dy, 1e4f);
    put(ops, wp, p.wp, 0.f);
    Tensor tw13, tw2;  // the weights go through a scratch tensor in the act dtype
    Arena wa;
    wa.add(tw13, "w13", A, {E, 2 * f, d});
    wa.add(tw2, "w2", A, {E, d, f});
    wa.finalize(ops);
    put(ops, tw13, p.w13, 0.f);
    put(ops, tw2, p.w2, 0.f);
    mx_quantize_weight(ops, tw13, w.w13);
    mx_quantize_weight(ops, tw2, w.w2);
    ops.synchronize();
    run.n = p.n;
    run.d = d;
    run.f = f;
    run.fwd = mxfp8::Format::E4M3;
    run.grad = grad;
    run.offsets = off;
    run.x_col = x_col;
    run.act_col = act_col;
    run.row = row;
    run.col = col;
  }

  void forward_backward(Ops& ops) {
    mx_experts_forward(ops, run, w, x, wp, h13, act, y);
    mx_experts_backward(ops, run, w, dy, h13, wp, dact, dh13, dx, dwp, dw13, dw2);
    ops.synchronize();
  }

  // Host floats into t (act dtype or F32); rows past v's end get `pad`.
  static void put(Ops& ops, const Tensor& t, const std::vector<float>& v, float pad) {
    std::vector<float> h(static_cast<size_t>(t.numel()), pad);
    std::copy(v.begin(), v.end(), h.begin());
    upload_f32(ops, t, 0, t.numel(), h.data());  // BF16: values are bf16-exact, except the pad
  }
  static std::vector<float> get(Ops& ops, const Tensor& t) {
    std::vector<float> h(static_cast<size_t>(t.numel()));
    download_f32(ops, t, 0, t.numel(), h.data());
    return h;
  }
};

// ||a - b|| / ||b|| and max |a - b| / max |b|.
inline double mx_rel_l2(const std::vector<float>& a, const std::vector<float>& b) {
  double num = 0, den = 0;
  for (size_t i = 0; i < b.size(); ++i) {
    num += (double(a[i]) - b[i]) * (double(a[i]) - b[i]);
    den += double(b[i]) * b[i];
  }
  return den > 0 ? std::sqrt(num / den) : std::sqrt(num);
}
inline double mx_rel_worst(const std::vector<float>& a, const std::vector<float>& b) {
  double num = 0, den = 0;
  for (size_t i = 0; i < b.size(); ++i) {
    num = std::max(num, std::fabs(double(a[i]) - b[i]));
    den = std::max(den, std::fabs(double(b[i])));
  }
  return den > 0 ? num / den : num;
}

}  // namespace mxt::testing
