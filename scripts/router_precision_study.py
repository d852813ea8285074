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
import sys

import torch

sys.path.insert(0, __file__.rsplit("/", 1)[0])
from mixtral_reference import flat, forward, leaf_params, params_of, rel  # noqa: E402
from parity_hf import SHAPES, build  # noqa: E402


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
            P = leaf_params(P0, dev)
            loss, picks = forward(P, cfg, kw["rope_theta"], ids, v)
            loss.backward()
            grads = {n: t.grad.detach().float() for n, t in flat(P).items()}
            if ref is None:
                ref = (float(loss.detach()), grads, picks)
                print(json.dumps(dict(shape=name, check="functional fp32 vs HF fp32 loss",
                                      rel=abs(float(loss.detach()) - hf_loss) / hf_loss)))
            gate = max(rel(grads[n], ref[1][n]) for n in grads if n.endswith(".gate"))
            other = max(rel(grads[n], ref[1][n]) for n in grads if not n.endswith(".gate"))
            flips = sum(int((p != r).any(-1).sum()) for p, r in zip(picks, ref[2]))
            print(json.dumps(dict(shape=name, variant=vname, loss_rel=abs(float(loss.detach()) - ref[0]) / ref[0],
                                  gate_grad_rel=gate, other_grad_rel=other, tokens_rerouted=flips,
                                  tokens=int(ids.numel()) * cfg.num_hidden_layers)))


if __name__ == "__main__":
    main()
