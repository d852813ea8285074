"""A functional Mixtral in PyTorch on HF MixtralForCausalLM's weights, with the precision of each part selectable
and the routing optionally forced: the reference of scripts/parity_hf.py's routing-matched gradient check and of
scripts/router_precision_study.py. In fp32 it equals HF's own fp32 loss (checked by both scripts)."""
import math

import torch
import torch.nn.functional as F

FP32 = dict(dt=torch.float32, router32=True, resid32=True, dwe32=True, experts32=True)


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


def forward(P, cfg, theta, ids, v, force=None):
    """v: dict of flags (dt, router32, resid32, dwe32, experts32); force: per layer, [T, k] expert indices to route
    to instead of the top-k (the routing weights are still the renormalised softmax probabilities at those
    experts). Returns the loss and each layer's sorted expert choices."""
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
        if force is None:
            w, idx = probs.topk(k, -1)
        else:
            idx = force[i].to(probs.device)
            w = probs.gather(-1, idx)
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


def leaf_params(P0, dev):
    """Fresh leaf tensors (requires_grad) on dev for a params_of() dictionary."""
    return {k: ({n: t.detach().clone().to(dev).requires_grad_() for n, t in v.items()} if isinstance(v, dict)
                else v.detach().clone().to(dev).requires_grad_()) for k, v in P0.items()}
