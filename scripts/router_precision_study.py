#!/usr/bin/env python3
"""Which roundings make a bf16 Mixtral's router-gate gradients differ from fp32 (issue 3's 2e-2 criterion)?

A functional Mixtral (the HF model's weights, parity_hf.py's shapes, seeds and tokens) is run in fp32 (the
reference; checked against HF's own fp32 loss) and in bf16 with parts of the computation kept in fp32:
  bf16        every matmul and activation in bf16 (HF's bf16 model does this)
  router32    + router logits from the fp32 gate weight and fp32 input, routing weights applied in fp32
  resid32     + the residual stream in fp32 (norm inputs, adds)
  dwe32       + the expert output that meets the routing weight kept in fp32 (the routing-weight gradient's
                dot product in fp32)
  experts32   the whole expert MLP in fp32 (only attention, norms and LM head in bf16)
For each: loss error, worst gate-gradient error, worst other-gradient error, routing decisions that differ.
  python3 scripts/router_precision_study.py
"""
import json
import math
import sys

import torch
import torch.nn.functional as F

sys.path.insert(0, __file__.rsplit("/", 1)[0])
from parity_hf import SHAPES, build  # noqa: E402


def params_of(m, cfg):
    sd = {k: v.detach().float().clone() for k, v in m.state_dict().items()}
    E, f = cfg.num_local_experts, cfg.intermediate_size
    P = {"embed": sd["model.embed_tokens.weight"], "norm": sd["model.norm.weight"], "head": sd["lm_head.weight"]}
    for i in range(cfg.num_hidden_layers):
        p = f"model.layers.{i}."
        L = {k: sd[p + f"self_attn.{k}_proj.weight"] for k in "qkvo"}
        L["ln1"], L["ln2"] = sd[p + "input_layernorm.weight"], sd[p + "post_attention_layernorm.weight"]
        moe = "mlp." if p + "mlp.gate.weight" in sd else "block_sparse_moe."
        L["gate"] = sd[p + moe + "gate.weight"]
        if p + "mlp.experts.gate_up_proj" in sd:
            gu, dn = sd[p + "mlp.experts.gate_up_proj"], sd[p + "mlp.experts.down_proj"]
            L["w1"], L["w3"], L["w2"] = gu[:, :f].clone(), gu[:, f:].clone(), dn.clone()
        else:
            L["w1"] = torch.stack([sd[p + moe + f"experts.{e}.w1.weight"] for e in range(E)])
            L["w3"] = torch.stack([sd[p + moe + f"experts.{e}.w3.weight"] for e in range(E)])
            L["w2"] = torch.stack([sd[p + moe + f"experts.{e}.w2.weight"] for e in range(E)])
        P[f"layer{i}"] = L
    return P


def flat(P):
    out = {}
    for k, v in P.items():
        if isinstance(v, dict):
            out.update({f"{k}.{n}": t for n, t in v.items()})
        else:
            out[k] = v
    return out


def rmsnorm(x, w, eps, dt):
    x32 = x.float()
    return w.to(dt) * (x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps)).to(dt)


def rope(x, theta):
    S, D = x.shape[-2], x.shape[-1]
    inv = 1.0 / (theta ** (torch.arange(0, D, 2, device=x.device, dtype=torch.float32) / D))
    ang = torch.outer(torch.arange(S, device=x.device, dtype=torch.float32), inv)
    emb = torch.cat([ang, ang], -1)
    cos, sin = emb.cos().to(x.dtype), emb.sin().to(x.dtype)
    x1, x2 = x[..., : D // 2], x[..., D // 2:]
    return x * cos + torch.cat([-x2, x1], -1) * sin


def forward(P, cfg, theta, ids, v):
    """v: dict of flags (dt, router32, resid32, dwe32, experts32). Returns loss and each layer's top-k sets."""
    dt = v["dt"]
    rdt = torch.float32 if v["resid32"] else dt
    B, S = ids.shape
    H, KV = cfg.num_attention_heads, cfg.num_key_value_heads
    hd = cfg.hidden_size // H
    k = cfg.num_experts_per_tok
    x = P["embed"].to(rdt)[ids]
    picks = []
    for i in range(cfg.num_hidden_layers):
        L = P[f"layer{i}"]
        h = rmsnorm(x, L["ln1"], cfg.rms_norm_eps, dt)
        q = (h @ L["q"].to(dt).T).view(B, S, H, hd).transpose(1, 2)
        kk = (h @ L["k"].to(dt).T).view(B, S, KV, hd).transpose(1, 2)
        vv = (h @ L["v"].to(dt).T).view(B, S, KV, hd).transpose(1, 2)
        q, kk = rope(q, theta), rope(kk, theta)
        kk, vv = kk.repeat_interleave(H // KV, 1), vv.repeat_interleave(H // KV, 1)
        s = (q @ kk.transpose(-1, -2)) / math.sqrt(hd)
        s = s.masked_fill(torch.ones(S, S, dtype=torch.bool, device=x.device).triu(1), float("-inf"))
        a = torch.softmax(s.float(), -1).to(dt) @ vv
        o = a.transpose(1, 2).reshape(B, S, H * hd) @ L["o"].to(dt).T
        x = x + o.to(rdt)
        h = rmsnorm(x, L["ln2"], cfg.rms_norm_eps, dt).view(B * S, -1)
        if v["router32"]:
            logits = h.float() @ L["gate"].T
        else:
            logits = (h @ L["gate"].to(dt).T).float()
        probs = torch.softmax(logits, -1)
        w, idx = probs.topk(k, -1)
        w = w / w.sum(-1, keepdim=True)
        picks.append(idx.sort(-1).values)
        edt = torch.float32 if v["experts32"] else dt
        wdt = torch.float32 if (v["router32"] or v["experts32"]) else dt
        out = torch.zeros(B * S, cfg.hidden_size, dtype=torch.float32 if v["dwe32"] else rdt, device=x.device)
        for e in range(cfg.num_local_experts):
            tok, slot = torch.where(idx == e)
            if tok.numel() == 0:
                continue
            he = h[tok].to(edt)
            act = F.silu(he @ L["w1"][e].to(edt).T) * (he @ L["w3"][e].to(edt).T)
            y = act @ L["w2"][e].to(edt).T
            ww = w[tok, slot, None]
            if v["dwe32"]:
                contrib = y.float() * ww.float()
            else:
                contrib = (y.to(wdt) * ww.to(wdt)).to(out.dtype)
            out = out.index_add(0, tok, contrib.to(out.dtype))
        x = x + out.view(B, S, -1).to(rdt)
    h = rmsnorm(x, P["norm"], cfg.rms_norm_eps, dt)
    logits = (h @ P["head"].to(dt).T).float()
    loss = F.cross_entropy(logits[:, :-1].reshape(-1, logits.shape[-1]), ids[:, 1:].reshape(-1))
    return loss, picks


def rel(a, b):
    a, b = a.double().flatten(), b.double().flatten()
    return float((a - b).norm() / b.norm().clamp_min(1e-30))


def main():
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    bf = torch.bfloat16
    variants = {
        "fp32": dict(dt=torch.float32, router32=True, resid32=True, dwe32=True, experts32=True),
        "bf16": dict(dt=bf, router32=False, resid32=False, dwe32=False, experts32=False),
        "router32": dict(dt=bf, router32=True, resid32=False, dwe32=False, experts32=False),
        "router32+resid32": dict(dt=bf, router32=True, resid32=True, dwe32=False, experts32=False),
        "router32+resid32+dwe32": dict(dt=bf, router32=True, resid32=True, dwe32=True, experts32=False),
        "router32+dwe32": dict(dt=bf, router32=True, resid32=False, dwe32=True, experts32=False),
        "experts32": dict(dt=bf, router32=True, resid32=True, dwe32=True, experts32=True),
    }
    for name, (kw, batch, seq, uneven) in SHAPES.items():
        cfg, m = build(kw, uneven, seed=1234)
        g = torch.Generator().manual_seed(99)
        ids = torch.randint(0, cfg.vocab_size, (batch, seq), generator=g).to(dev)
        with torch.no_grad():
            hf_loss = float(m.to(dev)(input_ids=ids, labels=ids).loss)
        P0 = params_of(m, cfg)
        ref = None
        for vname, v in variants.items():
            P = {kk: ({n: t.detach().clone().to(dev).requires_grad_() for n, t in vv.items()} if isinstance(vv, dict)
                      else vv.detach().clone().to(dev).requires_grad_()) for kk, vv in P0.items()}
            loss, picks = forward(P, cfg, kw["rope_theta"], ids, v)
            loss.backward()
            grads = {n: t.grad.detach().float() for n, t in flat(P).items()}
            if ref is None:
                ref = (float(loss), grads, picks)
                print(json.dumps(dict(shape=name, check="functional fp32 vs HF fp32 loss",
                                      rel=abs(float(loss) - hf_loss) / hf_loss)))
            gate = max(rel(grads[n], ref[1][n]) for n in grads if n.endswith(".gate"))
            other = max(rel(grads[n], ref[1][n]) for n in grads if not n.endswith(".gate"))
            flips = sum(int((p != r).any(-1).sum()) for p, r in zip(picks, ref[2]))
            print(json.dumps(dict(shape=name, variant=vname, loss_rel=abs(float(loss) - ref[0]) / ref[0],
                                  gate_grad_rel=gate, other_grad_rel=other, tokens_rerouted=flips,
                                  tokens=int(ids.numel()) * cfg.num_hidden_layers)))


if __name__ == "__main__":
    main()
