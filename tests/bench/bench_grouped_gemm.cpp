// Grouped expert GEMM benchmark (one GPU): forward, dgrad and wgrad of both expert projections at the
// Mixtral-8x7B expert shapes (16,384 routed rows over 8 experts, uneven; hidden 4096, intermediate 14336) and
// the 8x1B ones (32,768 rows, and 8,192: one trainer micro-batch; 2048, 4096), for each implementation beside two cuBLASLt references measured in
// the same process:
//   dense   one cuBLASLt GEMM of equal FLOPs and equal output semantics (bf16 out; wgrad: f32 out, beta = 1)
//   loop    one cuBLASLt GEMM per expert on its rows (counts known on the host: fine for a reference)
//   sm90    the TMA + wgmma grouped kernels, block tile 128 x 256 and 128 x 128, clusters of 1 and 2 CTAs
//           (c2: CTA pairs share the weight tile (forward, dgrad) or the dy tile (wgrad) through TMA multicast)
//   wmma    the fallback grouped kernels (fewer runs: slow)
//   + SwiGLU the forward x@W13^T with SwiGLU x routing weight in its epilogue, and the dgrad dy@W2 with the SwiGLU
//           backward in its epilogue, each beside the unfused GEMM + swiglu kernel pair (same FLOPs counted)
// Timing: CUDA events around each call on the op stream, after warm-up, median (and min) of --runs runs, each
// preceded by a 256 MiB memset that evicts L2; operands are random (never zeros) and far larger than L2.
// Before timing, each sm90 variant's output is checked against the per-expert cuBLASLt output on the device
// (relative L2 error; wgrad from zeroed dW). The trainer's kernel is also timed in alternation with the dense GEMM
// ("alternating" rows, each against its own dense partner), where timing each in its own block of runs gives the
// first block a cooler GPU and a higher clock.
//
// --sustain S: also runs the W13 forward, dgrad and wgrad back to back for S seconds each as cuBLASLt's dense GEMM,
// our 1-CTA and our CTA-pair kernel, printing one JSON line per run with its wall-clock window; sampled beside it
// with nvidia-smi, scripts/gpu_samples.py gives each one's clock and power (an H200 is power-capped in training).
// --wgrad-groups G,...: the trainer-shape wgrad rows also with the raster in groups of G fast units
// (set_grouped_wgrad_group), each against the same single-call reference.
// Built with cmake -DMXTRAIN_GG_CLOCKS=ON, each weight-gradient row also prints its consumers' cycles per item
// (first k-block, mainloop, epilogue, and the waits in each; docs/perf.md, session 43).
// --gemm-sms N: our persistent kernels on N SMs (CudaOps::set_sm_reserve; cuBLASLt keeps all of them), e.g. to see
// whether a phase of them is limited per SM or by the whole GPU's L2 (docs/perf.md, session 41).
//
// --trainer-call: as --trainer-wgrad, but only the trainer's call itself (its six rows per weight), for A/B calls.
// Usage: bench_grouped_gemm [--runs N] [--shape 8x7B|8x1B|8x1B-mb1|all] [--ops fwd,dgrad,wgrad]
//        [--trainer-wgrad|--trainer-call] [--no-wmma] [--no-cluster] [--sustain S] [--wgrad-groups G,...] [--gemm-sms N]
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <functional>
#include <memory>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#include "bench_util.hpp"
#include "cuda_context.cuh"
#include "cuda_ops.hpp"
#include "mxtrain/device_info.hpp"
#include "mxtrain/trace.hpp"
#include "sm90_cluster_code.hpp"
#include "sm90_grouped_gemm.cuh"

namespace {

// A diagnostic build's (-DMXTRAIN_GG_CLOCKS) per-item consumer cycles of the weight-gradient launches since the last
// call, warpgroup 0 and 1; empty in other builds.
std::string clocks_note() {
  unsigned long long c[14];
  if (!mxt::sm90::grouped_clocks_take(c) || c[4] == 0 || c[11] == 0) return "";
  auto per = [&](int i) { return double(c[i]) / c[4]; };
  auto per1 = [&](int i) { return double(c[7 + i]) / c[11]; };
  char b[400];
  std::snprintf(b, sizeof(b),
                " | cycles per item, wg0/wg1: first k-block %.0f/%.0f (before its wait %.0f/%.0f), mainloop %.0f/%.0f "
                "(of it k-block waits %.0f/%.0f), epilogue %.0f/%.0f (of it box-read waits %.0f/%.0f)",
                per(0), per1(0), per(6), per1(6), per(1), per1(1), per(2), per1(2), per(3), per1(3), per(5), per1(5));
  return b;
}

int g_op_mask = 7;  // --ops: bit k runs the ops of kind k (0 forward, 1 dgrad, 2 wgrad)
std::vector<int> g_wgrad_groups;  // --wgrad-groups 2,4,8: the trainer-shape wgrad also with those raster groups
bool g_trainer_wgrad = false;  // --trainer-wgrad: the weight gradients' trainer-shape rows only (for ncu)
bool g_trainer_call_only = false;  // --trainer-call: of those, only the trainer's call itself (A/B of its settings)

using namespace mxt::bench;
using mxt::DType;
using mxt::Device;
using mxt::Tensor;



struct Shape {
  const char* name;
  int64_t rows, hidden, inter;
  std::vector<double> mult;  // per-expert load multipliers, mean 1 (uneven routing)
};

std::vector<int32_t> loads_of(const Shape& s) {
  const int64_t E = static_cast<int64_t>(s.mult.size());
  std::vector<int32_t> loads(E);
  int64_t sum = 0;
  for (int64_t e = 0; e + 1 < E; ++e) {
    loads[e] = static_cast<int32_t>(std::llround(s.rows / static_cast<double>(E) * s.mult[e]));
    sum += loads[e];
  }
  loads[E - 1] = static_cast<int32_t>(s.rows - sum);
  return loads;
}

struct Row {
  std::string shape, op, impl;
  Timing t;
  double tflops = 0, vs_dense = 0, vs_loop = 0;
  std::string note;
  double ref_tflops = 0;  // set: "x dense" is against this (the dense calls timed in alternation with the row's)
};

// ||a - b|| / ||b|| on the device (a, b equal shapes); clobbers a.
double rel_l2_device(mxt::CudaOps& ops, const Tensor& a, const Tensor& b, const Tensor& acc2) {
  ops.zero(acc2);
  ops.sum_squares(b, acc2.rows(1, 1));
  ops.scale(a, -1.f);
  ops.add(a, b, a);  // a := b - a
  ops.sum_squares(a, acc2.rows(0, 1));
  float h[2];
  ops.download(h, acc2.data, sizeof(h));
  return std::sqrt(static_cast<double>(h[0]) / std::max(static_cast<double>(h[1]), 1e-30));
}

void bench_shape(mxt::CudaOps& ops, const Shape& s, int runs, bool with_wmma, bool with_cluster, void* flush,
                 size_t flush_bytes, double sustain_s, std::vector<Row>& rows) {
  const int64_t E = static_cast<int64_t>(s.mult.size()), R = s.rows, d = s.hidden, f = s.inter;
  const auto loads = loads_of(s);
  std::vector<int32_t> off(E + 1, 0);
  for (int64_t e = 0; e < E; ++e) off[e + 1] = off[e] + loads[e];
  std::printf("\n%s: %lld rows over %lld experts, loads", s.name, static_cast<long long>(R), static_cast<long long>(E));
  for (auto l : loads) std::printf(" %d", l);
  std::printf("\n");
  cudaStream_t st = ops.ctx().stream;

  Buf OFF(ops, DType::I32, {E + 1});
  ops.upload(OFF.t.data, off.data(), off.size() * 4);
  Buf x(ops, DType::BF16, {R, d}), w13(ops, DType::BF16, {E, 2 * f, d}), act(ops, DType::BF16, {R, f});
  Buf w2(ops, DType::BF16, {E, d, f}), dh13(ops, DType::BF16, {R, 2 * f}), dy(ops, DType::BF16, {R, d});
  fill_uniform(ops, x.t, 1, 1.f);
  fill_uniform(ops, w13.t, 2, 0.02f);
  fill_uniform(ops, act.t, 3, 1.f);
  fill_uniform(ops, w2.t, 4, 0.02f);
  fill_uniform(ops, dh13.t, 5, 1.f);
  fill_uniform(ops, dy.t, 6, 1.f);
  Buf acc2(ops, DType::F32, {2});
  // Routing weights for the SwiGLU fusions (0.25 .. 0.68, never zero).
  Buf wp(ops, DType::F32, {R});
  {
    std::vector<float> hw(static_cast<size_t>(R));
    for (int64_t r = 0; r < R; ++r) hw[static_cast<size_t>(r)] = 0.25f + 0.5f * static_cast<float>(r % 7) / 7.f;
    ops.upload(wp.t.data, hw.data(), hw.size() * 4);
  }

  struct Op {
    const char* name;
    int kind;  // 0 forward, 1 dgrad, 2 wgrad
    const Tensor *in, *W, *x2;  // wgrad: x (the second operand)
    int64_t out, inn;  // the weight's [out, in]
  };
  const Op list[] = {
      {"fwd  x@W13^T", 0, &x.t, &w13.t, nullptr, 2 * f, d},  {"fwd  a@W2^T", 0, &act.t, &w2.t, nullptr, d, f},
      {"dgrad dh13@W13", 1, &dh13.t, &w13.t, nullptr, 2 * f, d}, {"dgrad dy@W2", 1, &dy.t, &w2.t, nullptr, d, f},
      {"wgrad W13", 2, &dh13.t, nullptr, &x.t, 2 * f, d},       {"wgrad W2", 2, &dy.t, nullptr, &act.t, d, f},
  };
  for (const Op& op : list) {
    if (!(g_op_mask >> op.kind & 1)) continue;
    const double flops = 2.0 * R * op.out * op.inn;
    // Outputs: y / dx [R, width] bf16 (two: implementation under test and reference); dW [E, out, in] f32.
    const int64_t width = op.kind == 0 ? op.out : op.inn;
    std::unique_ptr<Buf> o1, o2;
    if (op.kind == 2) {
      o1 = std::unique_ptr<Buf>(new Buf(ops, DType::F32, {E, op.out, op.inn}));
      o2 = std::unique_ptr<Buf>(new Buf(ops, DType::F32, {E, op.out, op.inn}));
    } else {
      o1 = std::unique_ptr<Buf>(new Buf(ops, DType::BF16, {R, width}));
      o2 = std::unique_ptr<Buf>(new Buf(ops, DType::BF16, {R, width}));
    }
    const Tensor& out1 = o1->t;
    const Tensor& out2 = o2->t;
    auto expert_w = [&](const Tensor& Wt, int64_t e) {
      return Tensor(static_cast<uint16_t*>(Wt.data) + e * op.out * op.inn, DType::BF16, {op.out, op.inn},
                    Device::CUDA);
    };
    auto dw_e = [&](const Tensor& dW, int64_t e) {
      return Tensor(static_cast<float*>(dW.data) + e * op.out * op.inn, DType::F32, {op.out, op.inn}, Device::CUDA);
    };
    auto grouped = [&](const Tensor& dst) {
      if (op.kind == 0) ops.grouped_gemm(*op.in, *op.W, OFF.t, dst);
      else if (op.kind == 1) ops.grouped_gemm_dgrad(*op.in, *op.W, OFF.t, dst);
      else ops.grouped_gemm_wgrad(*op.in, *op.x2, OFF.t, dst);
    };
    auto loop = [&](const Tensor& dst) {
      for (int64_t e = 0; e < E; ++e) {
        const int64_t r0 = off[e], n = loads[e];
        if (n == 0) continue;
        if (op.kind == 0)
          ops.gemm(false, true, n, op.out, op.inn, 1.f, op.in->rows(r0, n), expert_w(*op.W, e), 0.f, dst.rows(r0, n));
        else if (op.kind == 1)
          ops.gemm(false, false, n, op.inn, op.out, 1.f, op.in->rows(r0, n), expert_w(*op.W, e), 0.f, dst.rows(r0, n));
        else
          ops.gemm(true, false, op.out, op.inn, n, 1.f, op.in->rows(r0, n), op.x2->rows(r0, n), 1.f, dw_e(dst, e));
      }
    };
    auto dense = [&](const Tensor& dst) {
      if (op.kind == 0)
        ops.gemm(false, true, R, op.out, op.inn, 1.f, *op.in, expert_w(*op.W, 0), 0.f, dst);
      else if (op.kind == 1)
        ops.gemm(false, false, R, op.inn, op.out, 1.f, *op.in, expert_w(*op.W, 0), 0.f, dst);
      else
        ops.gemm(true, false, op.out, op.inn, R, 1.f, *op.in, *op.x2, 1.f, dw_e(dst, 0));
    };

    auto add_row = [&](const char* impl, const Timing& t, const std::string& note) {
      Row r{s.name, op.name, impl, t, flops / (t.median_ms * 1e-3) / 1e12, 0, 0, note};
      rows.push_back(r);
    };
    const size_t first = rows.size();
    add_row("cublasLt dense", time_it(st, flush, flush_bytes, 3, runs, [&] { dense(out2); }), "");
    add_row("cublasLt loop", time_it(st, flush, flush_bytes, 3, runs, [&] { loop(out2); }), "");

    struct Variant {
      int bn, cl, tma_store;  // cl: a cluster code (sm90_cluster_code.hpp)
      const char* name;
      int l2_hints = 0;       // set_grouped_l2_hints (forward and dgrad only)
    };
    // tma_store: the TMA epilogue (forward / dgrad: TMA stores; wgrad: TMA reduce-adds), else direct from the
    // registers (stores; wgrad: red.global).
    static const Variant variants[] = {{256, 1, 1, "sm90 128x256 c1"},
                                       {256, 1, 0, "sm90 128x256 c1 direct"},
                                       {128, 1, 1, "sm90 128x128 c1"},
                                       {256, 2, 1, "sm90 128x256 c2"},
                                       {256, 3, 1, "sm90 128x256 c2, wgrad pairs over m"},
                                       {128, 2, 1, "sm90 128x128 c2"},
                                       {256, 2, 1, "sm90 128x256 c2, L2 hints", 1}};
    for (const Variant& v : variants) {
      if ((v.cl > 1 && !with_cluster) || g_trainer_wgrad || (v.cl == 3 && op.kind != 2)) continue;
      if (v.l2_hints && op.kind == 2) continue;
      mxt::sm90::set_grouped_l2_hints(v.l2_hints ? mxt::sm90::kL2HintsAll : 0);
      mxt::sm90::set_grouped_impl(mxt::sm90::GroupedImpl::Sm90);
      mxt::sm90::set_grouped_tile_n(v.bn);
      mxt::sm90::use_cluster_code(v.cl);
      mxt::sm90::set_grouped_tma_store(v.tma_store);
      mxt::sm90::set_grouped_wgrad_tma(v.tma_store);
      // Correctness first: against the per-expert cuBLASLt result (wgrad from zeroed dW on both sides).
      ops.zero(out1);
      ops.zero(out2);
      grouped(out1);
      const std::string path = mxt::sm90::last_grouped_impl();
      loop(out2);
      const double err = rel_l2_device(ops, out1, out2, acc2.t);
      char note[96];
      std::snprintf(note, sizeof(note), "rel L2 vs loop %.2e%s", err, path == "sm90" ? "" : " (FELL BACK to wmma)");
      clocks_note();  // only this variant's launches below
      const Timing t = time_it(st, flush, flush_bytes, 3, runs, [&] { grouped(out1); });
      add_row(v.name, t, note + clocks_note());
    }
    // The trainer's kernel (128 x 256, its default epilogue and L2 hints) in one CTA and in CTA pairs (wgrad: pairs
    // over m-tiles, the trainer's), each timed in alternation with the dense GEMM so that the two share the GPU's
    // clock and temperature: timed in blocks as above, the first row (dense) gets a cooler GPU.
    for (int code : {1, 3}) {
      if ((code > 1 && !with_cluster) || g_trainer_wgrad) continue;
      mxt::sm90::set_grouped_l2_hints(-1);
      mxt::sm90::set_grouped_impl(mxt::sm90::GroupedImpl::Sm90);
      mxt::sm90::set_grouped_tile_n(256);
      mxt::sm90::use_cluster_code(code);
      mxt::sm90::set_grouped_tma_store(-1);
      mxt::sm90::set_grouped_wgrad_tma(-1);
      clocks_note();
      const auto t = time_rotating(st, flush, flush_bytes, 3, runs, {[&] { dense(out2); }, [&] { grouped(out1); }});
      const std::string c = code == 1 ? "c1" : "c2";
      add_row(("cublasLt dense, alternating with " + c).c_str(), t[0], "");
      add_row(("sm90 128x256 " + c + ", alternating with dense").c_str(), t[1],
              "x dense: against the row above" + clocks_note());
      rows.back().ref_tflops = rows[rows.size() - 2].tflops;
    }
    if (op.kind == 2 && !g_trainer_wgrad && with_cluster) {
      // The recipe's gradient dtype (expert_grad_dtype=bfloat16) on both sides: one call storing a bf16 dW (the
      // trainer's kernel and variants below) against cuBLASLt's dense GEMM of equal FLOPs storing bf16 (beta 0), all
      // in rotation.
      // Each checked against the per-expert fp32 result: the one rounding, about 1e-3.
      mxt::sm90::set_grouped_l2_hints(-1);
      mxt::sm90::set_grouped_impl(mxt::sm90::GroupedImpl::Sm90);
      mxt::sm90::set_grouped_tile_n(256);
      mxt::sm90::set_grouped_wgrad_tma(-1);
      Buf b16(ops, DType::BF16, {E, op.out, op.inn}), dense16(ops, DType::BF16, {op.out, op.inn});
      const std::vector<mxt::Ops::WgradRowSet> one{{*op.in, *op.x2, OFF.t}};
      // Each call in an NVTX range ("wgrad_W2_bf16_c2m", ...), so ncu --nvtx-include can pick one launch
      // (device_dist_checks.sh wgncu16).
      std::string tag = op.name;
      std::replace(tag.begin(), tag.end(), ' ', '_');
      // Variants of ours, each the same bits; -1 keeps the default (or the env var's choice). c2n, CTA pairs over n
      // (else over m, the trainer's); words, the epilogue's boxes by per-word st.shared instead of stmatrix.x2, the
      // default before session 73 (set_grouped_wgrad_epi_stmatrix); bars2, two named barriers per box, the form
      // before session 61 (set_grouped_wgrad_epi_bars); rows, the schedule's experts by decreasing k-blocks
      // (set_grouped_wgrad_order); direct, st.global from the registers instead of the TMA's boxes
      // (set_grouped_wgrad_tma(0)).
      struct Variant {
        const char* tag;
        const char* name;
        int code, by_rows, bars, direct, stm;
      };
      const Variant variants[] = {
          {"_bf16_c2m", "c2m", 3, -1, -1, 0, -1},
          {"_bf16_c2m_words", "c2m, words", 3, -1, -1, 0, 0},
          {"_bf16_c2m_bars2", "c2m, two barriers per epilogue box", 3, -1, 2, 0, -1},
          {"_bf16_c2m_rows", "c2m, experts by rows", 3, 1, -1, 0, -1},
          {"_bf16_c2n", "c2n", 2, -1, -1, 0, -1},
          {"_bf16_c2m_direct", "c2m, st.global", 3, -1, -1, 1, -1},
      };
      constexpr int kVariants = static_cast<int>(sizeof(variants) / sizeof(variants[0]));
      auto ours = [&, tag](const Variant& v) {
        mxt::TraceScope range(tag + v.tag);
        mxt::sm90::use_cluster_code(v.code);
        mxt::sm90::set_grouped_wgrad_order(v.by_rows);
        mxt::sm90::set_grouped_wgrad_epi_bars(v.bars);
        mxt::sm90::set_grouped_wgrad_epi_stmatrix(v.stm);
        mxt::sm90::set_grouped_wgrad_tma(v.direct ? 0 : -1);
        ops.grouped_gemm_wgrad_sets(one, b16.t, false);
        mxt::sm90::set_grouped_wgrad_order(-1);
        mxt::sm90::set_grouped_wgrad_epi_bars(-1);
        mxt::sm90::set_grouped_wgrad_epi_stmatrix(-1);
        mxt::sm90::set_grouped_wgrad_tma(-1);
      };
      auto dense_b16 = [&, tag] {
        mxt::TraceScope range(tag + "_bf16_dense");
        ops.gemm(true, false, op.out, op.inn, R, 1.f, *op.in, *op.x2, 0.f, dense16.t);
      };
      ops.zero(out2);
      loop(out2);
      std::vector<std::string> notes;
      std::vector<std::function<void()>> fns{dense_b16};
      for (const Variant& v : variants) {
        ours(v);
        const std::string path = mxt::sm90::last_grouped_impl();
        ops.copy(b16.t, out1);
        const double err = rel_l2_device(ops, out1, out2, acc2.t);
        char note[96];
        std::snprintf(note, sizeof(note), "rel L2 vs loop (fp32) %.2e%s; x dense: the dense row", err,
                      path == "sm90" ? "" : " (FELL BACK)");
        notes.push_back(note);
        fns.push_back([&ours, &v] { ours(v); });
      }
      clocks_note();
      const auto t = time_rotating(st, flush, flush_bytes, 3, runs, fns);
      add_row("cublasLt dense, bf16 dW stored, rotating", t[0], "");
      const double ref = rows.back().tflops;
      for (int i = 0; i < kVariants; ++i) {
        const std::string name = std::string("sm90 128x256 ") + variants[i].name + ", bf16 dW stored, rotating";
        add_row(name.c_str(), t[i + 1], notes[i] + (i + 1 == kVariants ? clocks_note() : std::string()));
        rows.back().ref_tflops = ref;
      }
    }
    if (sustain_s > 0 && op.out == 2 * f) {  // the W13 GEMMs, each held for sustain_s seconds
      auto held = [&](const char* impl, int cl, const std::function<void()>& fn) {
        if (cl) {
          mxt::sm90::set_grouped_impl(mxt::sm90::GroupedImpl::Sm90);
          mxt::sm90::set_grouped_tile_n(256);
          mxt::sm90::set_grouped_cluster(cl);
          mxt::sm90::set_grouped_tma_store(1);
          mxt::sm90::set_grouped_wgrad_tma(1);
        }
        const Sustained r = sustain(st, sustain_s, fn);
        std::printf("{\"name\": \"%s %s %s\", \"window\": [%.3f, %.3f], \"calls\": %ld, \"tflops\": %.1f}\n", s.name,
                    op.name, impl, r.start, r.end, r.calls, r.calls * flops / (r.end - r.start) / 1e12);
        std::fflush(stdout);
      };
      held("cublasLt dense", 0, [&] { dense(out2); });
      held("sm90 128x256 c1", 1, [&] { grouped(out1); });
      held("sm90 128x256 c2", 2, [&] { grouped(out1); });
    }
    if (op.kind == 0 && op.W == &w13.t) {
      // The forward with SwiGLU x routing weight in its epilogue (h13 and act from one kernel) beside the forward
      // followed by the swiglu kernel, both sm90 128x256 with TMA stores; the check compares the two acts.
      mxt::sm90::set_grouped_impl(mxt::sm90::GroupedImpl::Sm90);
      mxt::sm90::set_grouped_tile_n(256);
      mxt::sm90::set_grouped_cluster(1);
      mxt::sm90::set_grouped_tma_store(1);
      Buf a1(ops, DType::BF16, {R, f}), a2(ops, DType::BF16, {R, f});
      mxt::sm90::set_grouped_swiglu_fusion(1);
      auto fused = [&] { ops.grouped_gemm_swiglu(x.t, w13.t, OFF.t, wp.t, out1, a1.t); };
      auto separate = [&] {
        ops.grouped_gemm(x.t, w13.t, OFF.t, out2);
        ops.swiglu_forward(out2, wp.t, a2.t);
      };
      fused();
      const std::string path = mxt::sm90::last_grouped_impl();
      separate();
      const double err = rel_l2_device(ops, a1.t, a2.t, acc2.t);
      char note[96];
      std::snprintf(note, sizeof(note), "act rel L2 vs the separate pair %.2e%s", err,
                    path == "sm90" ? "" : " (FELL BACK)");
      add_row("sm90 + SwiGLU epilogue", time_it(st, flush, flush_bytes, 3, runs, fused), note);
      add_row("sm90, then swiglu kernel", time_it(st, flush, flush_bytes, 3, runs, separate), "");
    }
    if (op.kind == 1 && op.W == &w2.t) {
      // The dgrad through W2 with the SwiGLU backward in its epilogue (dh13, dwp) beside the dgrad followed by the
      // swiglu_backward kernel (h13: the random dh13 operand, read only); the check compares the two dh13.
      mxt::sm90::set_grouped_impl(mxt::sm90::GroupedImpl::Sm90);
      mxt::sm90::set_grouped_tile_n(256);
      mxt::sm90::set_grouped_cluster(1);
      mxt::sm90::set_grouped_tma_store(1);
      Buf dwp(ops, DType::F32, {R}), g1(ops, DType::BF16, {R, 2 * f}), g2(ops, DType::BF16, {R, 2 * f});
      mxt::sm90::set_grouped_swiglu_fusion(1);
      auto fused = [&] { ops.grouped_gemm_dgrad_swiglu(dy.t, w2.t, OFF.t, dh13.t, wp.t, out1, g1.t, dwp.t); };
      auto separate = [&] {
        ops.grouped_gemm_dgrad(dy.t, w2.t, OFF.t, out2);
        ops.swiglu_backward(out2, dh13.t, wp.t, g2.t, dwp.t);
      };
      fused();
      const std::string path = mxt::sm90::last_grouped_impl();
      separate();
      const double err = rel_l2_device(ops, g1.t, g2.t, acc2.t);
      char note[96];
      std::snprintf(note, sizeof(note), "dh13 rel L2 vs the separate pair %.2e%s", err,
                    path == "sm90" ? "" : " (FELL BACK)");
      add_row("sm90 + SwiGLU bwd epilogue", time_it(st, flush, flush_bytes, 3, runs, fused), note);
      add_row("sm90, then swiglu_backward", time_it(st, flush, flush_bytes, 3, runs, separate), "");
    }
    if (op.kind == 2 && !g_trainer_wgrad) {
      // expert_wgrad_micro_batches's launch: the same rows as G row sets (G micro-batches' worth, G times the
      // FLOPs) into one read-add-write of dW, beside the G single calls it replaces; and as the step's first group,
      // which stores dW instead; one set storing is a step's first micro-batch without expert_wgrad_micro_batches.
      mxt::sm90::set_grouped_impl(mxt::sm90::GroupedImpl::Sm90);
      mxt::sm90::set_grouped_tile_n(256);
      mxt::sm90::set_grouped_cluster(1);
      for (const int sets : {1, 2, 4, 8}) {
        for (const int variant : {0, 1, 2, 3}) {  // add (TMA), store (TMA), add (red.global), store (st.global)
          const bool accumulate = variant % 2 == 0, direct = variant >= 2;
          // every variant at 8 sets; one set only storing (adding is the rows above); 2 and 4 only adding (TMA)
          if (sets != 8 && variant != (sets == 1 ? 1 : 0)) continue;
          mxt::sm90::set_grouped_wgrad_tma(direct ? 0 : 1);
          const std::vector<mxt::Ops::WgradRowSet> rs(sets, mxt::Ops::WgradRowSet{*op.in, *op.x2, OFF.t});
          auto grouped_sets = [&](const Tensor& dst) { ops.grouped_gemm_wgrad_sets(rs, dst, accumulate); };
          ops.zero(out1);
          ops.zero(out2);
          grouped_sets(out1);
          const std::string path = mxt::sm90::last_grouped_impl();
          for (int k = 0; k < sets; ++k) grouped(out2);
          const double err = rel_l2_device(ops, out1, out2, acc2.t);
          char note[96];
          std::snprintf(note, sizeof(note), "rel L2 vs %d single calls %.2e%s", sets, err,
                        path == "sm90" ? "" : " (FELL BACK)");
          const Timing t = time_it(st, flush, flush_bytes, 3, runs, [&] { grouped_sets(out1); });
          char name[64];
          std::snprintf(name, sizeof(name), "sm90 %d row set%s%s%s (%dx rows)", sets, sets > 1 ? "s" : "",
                        accumulate ? "" : ", store", direct ? ", direct" : "", sets);
          rows.push_back(Row{s.name, op.name, name, t, sets * flops / (t.median_ms * 1e-3) / 1e12, 0, 0, note});
        }
      }
    }
    if (op.kind == 2) {
      // The trainer's shape of that launch (bench_8x7B_2layer: 8 micro-batches of 4,096 tokens x top-2): 8 row
      // sets of R / 2 rows each, in distinct buffers as the held micro-batches are, so no set's operands are
      // another's in L2. Session 28: in the 8x7B step the wgrad ran at 544 TFLOP/s against 655-664 for the 8
      // repeated full sets above; this row says how much of that is the shape.
      const int64_t half = R / 2, sets = 8;
      std::vector<int32_t> off_h(E + 1);
      for (int64_t e = 0; e <= E; ++e) off_h[e] = off[e] / 2;
      off_h[E] = static_cast<int32_t>(half);
      Buf OFFH(ops, DType::I32, {E + 1});
      ops.upload(OFFH.t.data, off_h.data(), off_h.size() * 4);
      Buf din(ops, DType::BF16, {sets * half, op.out}), dx2(ops, DType::BF16, {sets * half, op.inn});
      fill_uniform(ops, din.t, 11, 1.f);
      fill_uniform(ops, dx2.t, 12, 1.f);
      std::vector<mxt::Ops::WgradRowSet> rs;
      for (int64_t k = 0; k < sets; ++k)
        rs.push_back(mxt::Ops::WgradRowSet{din.t.rows(k * half, half), dx2.t.rows(k * half, half), OFFH.t});
      mxt::sm90::set_grouped_wgrad_tma(1);
      ops.zero(out2);  // the reference, once: 8 single calls (1 CTA, the default tail mode)
      for (const auto& r : rs) ops.grouped_gemm_wgrad(r.dy, r.x, r.offsets, out2);
      // Each row set's last k-block of an expert: only its rows' k16 steps (steps, the default), both operands'
      // other rows zeroed (zero: before session 29), or left (none: wrong sums, what the tail costs by difference);
      // 1 CTA, CTA pairs (the trainer's default) over n-tiles, and pairs over m-tiles (c2m, the default tail only).
      const char* tails[] = {"steps", "zero", "none"};
      // Then the default arrangement (c2m, tail steps) with the raster in groups of g fast units (g_wgrad_groups),
      // without and with L2 hints.
      struct TwVariant {
        int cl, tail, group, hints;
      };
      std::vector<TwVariant> variants;
      if (!g_trainer_call_only)
        for (const int cl : {1, 2, 3})
          for (int tail = 0; tail < (cl == 3 ? 1 : 3); ++tail) variants.push_back({cl, tail, 0, 0});
      for (const int g : g_wgrad_groups)
        for (const int hints : {0, 1}) variants.push_back({3, 0, g, hints});
      for (const auto& [cl, tail, group, hints] : variants) {
        mxt::sm90::use_cluster_code(cl);
        mxt::sm90::set_grouped_wgrad_group(group);
        mxt::sm90::set_grouped_l2_hints(hints ? mxt::sm90::kL2HintsAll : 0);
        mxt::sm90::set_grouped_wgrad_tail(tail);
        ops.zero(out1);
        ops.grouped_gemm_wgrad_sets(rs, out1, true);
        const std::string path = mxt::sm90::last_grouped_impl();
        const double err = rel_l2_device(ops, out1, out2, acc2.t);
        char note[112];
        std::snprintf(note, sizeof(note), "rel L2 vs 8 single calls %.2e%s%s", err,
                      path == "sm90" ? "" : " (FELL BACK)", tail == 2 ? " (wrong sums: timing only)" : "");
        const Timing t =
            time_it(st, flush, flush_bytes, 3, runs, [&] { ops.grouped_gemm_wgrad_sets(rs, out1, true); });
        char name[96];
        if (group > 0)
          std::snprintf(name, sizeof(name), "sm90 c%s 8 distinct half row sets, raster groups of %d%s (4x rows)",
                        mxt::sm90::cluster_code_name(cl), group, hints ? ", L2 hints" : "");
        else
          std::snprintf(name, sizeof(name), "sm90 c%s 8 distinct half row sets, tail %s (4x rows, the trainer's)",
                        mxt::sm90::cluster_code_name(cl), tails[tail]);
        rows.push_back(Row{s.name, op.name, name, t, 4 * flops / (t.median_ms * 1e-3) / 1e12, 0, 0, note});
      }
      // The trainer's call itself (bench_8x7B_2layer: the step's one weight gradient per weight stores dW), in the
      // default arrangement, without and with the clipping norm's sums of squares in its epilogue.
      mxt::sm90::use_cluster_code(3);
      mxt::sm90::set_grouped_wgrad_group(-1);  // the default's raster: groups of 8 over several row sets
      mxt::sm90::set_grouped_l2_hints(0);
      mxt::sm90::set_grouped_wgrad_tail(-1);
      Buf norm_acc(ops, DType::F32, {1});
      // Each with the row sets' tails gathered into one more set (the default), left in place, and gathered with
      // the CTAs kept in lockstep (set_grouped_wgrad_lockstep), alternating; last, the default with a bf16 dW
      // (expert_grad_dtype=bfloat16; its error is the one rounding, about 1e-3).
      Buf out_b16(ops, DType::BF16, {out1.shape[0], out1.shape[1], out1.shape[2]});
      for (const int pass : {0, 1, 2, 3, 4, 5, 6}) {
        const bool norm = pass >= 3, gather = pass % 3 != 1, lockstep = pass % 3 == 2 || pass == 6, b16 = pass == 6;
        mxt::sm90::set_grouped_wgrad_gather(gather ? 1 : 0);
        mxt::sm90::set_grouped_wgrad_lockstep(lockstep ? 1 : 0);
        const Tensor& dw = b16 ? out_b16.t : out1;
        auto call = [&] {
          if (norm)
            ops.grouped_gemm_wgrad_sets_norm(rs, dw, norm_acc.t);
          else
            ops.grouped_gemm_wgrad_sets(rs, dw, false);
        };
        call();
        if (b16) ops.copy(out_b16.t, out1);
        const double err = rel_l2_device(ops, out1, out2, acc2.t);
        char note[112];
        std::snprintf(note, sizeof(note), "rel L2 vs 8 single calls %.2e%s", err,
                      std::string(mxt::sm90::last_grouped_impl()) == "sm90" ? "" : " (FELL BACK)");
        const Timing t = time_it(st, flush, flush_bytes, 3, runs, call);
        char name[112];
        std::snprintf(name, sizeof(name),
                      "sm90 c2m 8 distinct half row sets, store%s, tails %s%s (the trainer's call)%s",
                      norm ? " + norm" : "", gather ? "gathered" : "in place", lockstep ? ", lockstep" : "",
                      b16 ? ", bf16 dW" : "");
        rows.push_back(Row{s.name, op.name, name, t, 4 * flops / (t.median_ms * 1e-3) / 1e12, 0, 0, note});
      }
      mxt::sm90::set_grouped_wgrad_gather(-1);
      mxt::sm90::set_grouped_wgrad_lockstep(-1);
      mxt::sm90::set_grouped_wgrad_tail(-1);
      mxt::sm90::set_grouped_wgrad_group(-1);
      mxt::sm90::set_grouped_l2_hints(-1);
      mxt::sm90::set_grouped_cluster(1);
      mxt::sm90::set_grouped_wgrad_pair(-1);
      mxt::sm90::set_grouped_wgrad_tma(-1);
    }
    if (with_wmma) {
      mxt::sm90::set_grouped_impl(mxt::sm90::GroupedImpl::Wmma);
      add_row("wmma", time_it(st, flush, flush_bytes, 1, std::max(3, runs / 4), [&] { grouped(out1); }), "");
    }
    mxt::sm90::set_grouped_impl(mxt::sm90::GroupedImpl::Auto);
    mxt::sm90::set_grouped_tile_n(0);
    mxt::sm90::set_grouped_cluster(0);
    mxt::sm90::set_grouped_tma_store(-1);
    mxt::sm90::set_grouped_wgrad_tma(-1);
    mxt::sm90::set_grouped_swiglu_fusion(-1);
    mxt::sm90::set_grouped_wgrad_pair(-1);
    mxt::sm90::set_grouped_l2_hints(-1);
    const double dense_tf = rows[first].tflops, loop_tf = rows[first + 1].tflops;
    for (size_t i = first; i < rows.size(); ++i) {
      rows[i].vs_dense = rows[i].tflops / (rows[i].ref_tflops > 0 ? rows[i].ref_tflops : dense_tf);
      rows[i].vs_loop = rows[i].tflops / loop_tf;
      std::printf("  %-16s %-15s %8.3f ms  %7.1f TFLOP/s  %5.2f x dense  %5.2f x loop  %s\n", op.name,
                  rows[i].impl.c_str(), rows[i].t.median_ms, rows[i].tflops, rows[i].vs_dense, rows[i].vs_loop,
                  rows[i].note.c_str());
      std::fflush(stdout);
    }
  }
}

}  // namespace

int main(int argc, char** argv) {
  int runs = 20;
  std::string which = "all";
  bool with_wmma = true, with_cluster = true;
  double sustain_s = 0;
  int gemm_sms = 0;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--runs" && i + 1 < argc) {
      runs = std::atoi(argv[++i]);
    } else if (a == "--shape" && i + 1 < argc) {
      which = argv[++i];
    } else if (a == "--ops" && i + 1 < argc) {
      const std::string v = argv[++i];
      g_op_mask = (v.find("fwd") != std::string::npos ? 1 : 0) | (v.find("dgrad") != std::string::npos ? 2 : 0) |
                  (v.find("wgrad") != std::string::npos ? 4 : 0);
      if (v == "all") g_op_mask = 7;
      if (g_op_mask == 0) {
        std::fprintf(stderr, "bench_grouped_gemm: bad --ops %s (a list of fwd, dgrad, wgrad, or all)\n", v.c_str());
        return 2;
      }
    } else if (a == "--wgrad-groups" && i + 1 < argc) {
      std::stringstream ss(argv[++i]);
      for (std::string t; std::getline(ss, t, ',');) {
        char* end = nullptr;
        const long g = std::strtol(t.c_str(), &end, 10);
        if (t.empty() || *end != 0 || g < 1) {
          std::fprintf(stderr, "--wgrad-groups: '%s' is not a positive integer\n", t.c_str());
          return 2;
        }
        g_wgrad_groups.push_back(static_cast<int>(g));
      }
    } else if (a == "--trainer-wgrad" || a == "--trainer-call") {
      g_trainer_wgrad = true;
      g_trainer_call_only = a == "--trainer-call";
      g_op_mask = 4;
    } else if (a == "--no-wmma") {
      with_wmma = false;
    } else if (a == "--no-cluster") {
      with_cluster = false;
    } else if (a == "--sustain" && i + 1 < argc) {
      sustain_s = std::atof(argv[++i]);
    } else if (a == "--gemm-sms" && i + 1 < argc) {
      gemm_sms = std::atoi(argv[++i]);
      if (gemm_sms < 1) {
        std::fprintf(stderr, "bench_grouped_gemm: --gemm-sms must be a positive number of SMs, got '%s'\n", argv[i]);
        return 2;
      }
    } else {
      std::fprintf(stderr,
                   "usage: %s [--runs N] [--shape 8x7B|8x1B|8x1B-mb1|all] [--ops fwd,dgrad,wgrad] "
                   "[--trainer-wgrad|--trainer-call] [--no-wmma] [--no-cluster] [--sustain S] [--wgrad-groups G,...] "
                   "[--gemm-sms N]\n",
                   argv[0]);
      return 2;
    }
  }
  if (runs < 1 || (which != "all" && which != "8x7B" && which != "8x1B" && which != "8x1B-mb1")) {
    std::fprintf(stderr, "bench_grouped_gemm: bad --runs %d or --shape %s\n", runs, which.c_str());
    return 2;
  }
  if (mxt::cuda_device_count() == 0) {
    std::fprintf(stderr, "bench_grouped_gemm: no CUDA device\n");
    return 1;
  }
  try {
    auto base = mxt::make_cuda_ops();
    auto& ops = dynamic_cast<mxt::CudaOps&>(*base);
    cudaDeviceProp prop{};
    ck(cudaGetDeviceProperties(&prop, ops.ctx().device), "cudaGetDeviceProperties");
    std::printf("bench_grouped_gemm: %s, sm_%d%d, %d SMs, median of %d runs (L2 flushed before each)\n", prop.name,
                prop.major, prop.minor, prop.multiProcessorCount, runs);
    if (gemm_sms > prop.multiProcessorCount) {
      std::fprintf(stderr, "bench_grouped_gemm: --gemm-sms %d: the device has %d SMs\n", gemm_sms,
                   prop.multiProcessorCount);
      return 2;
    }
    if (gemm_sms > 0) {
      ops.set_sm_reserve(prop.multiProcessorCount - gemm_sms);
      std::printf("our persistent kernels on %d SMs (--gemm-sms)\n", gemm_sms);
    }
    const size_t flush_bytes = 256ull << 20;
    void* flush = ops.alloc(flush_bytes);
    const std::vector<double> mult = {1.30, 0.70, 1.15, 0.85, 1.05, 0.95, 1.25, 0.75};
    const Shape shapes[] = {{"8x7B", 16384, 4096, 14336, mult}, {"8x1B", 32768, 2048, 4096, mult},
                            {"8x1B-mb1", 8192, 2048, 4096, mult}};  // one micro-batch of the trainer: 4096 x top-2
    std::vector<Row> rows;
    for (const Shape& s : shapes)
      if (which == "all" || which == s.name) bench_shape(ops, s, runs, with_wmma, with_cluster, flush, flush_bytes, sustain_s, rows);
    ops.release(flush);

    std::printf("\n| shape | op | impl | median ms | min ms | TFLOP/s | vs dense cuBLASLt | vs per-expert loop "
                "| check |\n");
    std::printf("| --- | --- | --- | --- | --- | --- | --- | --- | --- |\n");
    for (const Row& r : rows)
      std::printf("| %s | %s | %s | %.3f | %.3f | %.1f | %.2f | %.2f | %s |\n", r.shape.c_str(), r.op.c_str(),
                  r.impl.c_str(), r.t.median_ms, r.t.min_ms, r.tflops, r.vs_dense, r.vs_loop, r.note.c_str());
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_grouped_gemm: %s\n", e.what());
    return 1;
  }
  return 0;
}
