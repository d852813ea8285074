#!/usr/bin/env python3
"""Parity of mxtrain with HF transformers' MixtralForCausalLM (run where torch + transformers are installed).

For each shape: build a random MixtralForCausalLM in fp32, save it as safetensors, run
`mxtrain --dump-first-batch` on the same weights and tokens (init_from_pretrained), and compare the loss, the
logits and every parameter's gradient with HF in fp32. Then the reverse direction (weights exported by mxtrain
load in transformers and give mxtrain's loss) and ten optimizer steps against an fp32 PyTorch AdamW with the
same schedule and clipping (for the CUDA backend also PyTorch under bf16 autocast beside it, the yardstick of
what bf16 compute alone moves). Prints one JSON line per check and a table; exits 1 if any check fails.

  python3 scripts/parity_hf.py --mxtrain build/mxtrain --backend cuda --out /tmp/parity
  (--backend cuda-fp32: the CUDA backend with fp32 activations, held to the CPU backend's fp32 limits)
"""
import argparse, json, math, os, subprocess, sys

import torch
from safetensors.torch import load_file
from transformers import MixtralConfig, MixtralForCausalLM

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from mixtral_reference import FP32, flat, forward, leaf_params, params_of  # noqa: E402

SHAPES = {
    # name: (config kwargs, batch, seq, uneven routing)
    "small-hd16": (dict(vocab_size=1000, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                        num_attention_heads=4, num_key_value_heads=2, num_local_experts=4, num_experts_per_tok=2,
                        rope_theta=10000.0), 2, 64, False),
    "uneven-hd64": (dict(vocab_size=512, hidden_size=128, intermediate_size=256, num_hidden_layers=2,
                         num_attention_heads=2, num_key_value_heads=1, num_local_experts=8, num_experts_per_tok=2,
                         rope_theta=1e6), 1, 128, True),
}
BASE = dict(max_position_embeddings=512, rms_norm_eps=1e-5, tie_word_embeddings=False, router_jitter_noise=0.0,
            router_aux_loss_coef=0.0, output_router_logits=False, initializer_range=0.05)


def rel(a, b):
    a, b = a.double().flatten(), b.double().flatten()
    return float((a - b).norm() / b.norm().clamp_min(1e-30))


def build(kw, uneven, seed):
    torch.manual_seed(seed)
    cfg = MixtralConfig(**kw, **BASE)
    cfg._attn_implementation = "eager"
    m = MixtralForCausalLM(cfg).float()
    if uneven:
        # A shared direction u in every embedding and router rows scaled by very different amounts: most
        # tokens pick the same experts, some experts get few or no tokens.
        with torch.no_grad():
            u = torch.randn(cfg.hidden_size)
            u /= u.norm()
            m.model.embed_tokens.weight += 0.2 * u
            for layer in m.model.layers:
                gate = layer.mlp.gate if hasattr(layer, "mlp") else layer.block_sparse_moe.gate
                w = gate.weight
                scale = torch.linspace(8.0, -8.0, w.shape[0])
                w.copy_(0.02 * torch.randn_like(w) + scale[:, None] * u[None, :])
    return cfg, m


def hf_forward_backward(m, ids, dev):
    m = m.to(dev)
    m.zero_grad(set_to_none=True)
    out = m(input_ids=ids.to(dev), labels=ids.to(dev))
    out.loss.backward()
    grads = {n: p.grad.detach().float().cpu() for n, p in m.named_parameters()}
    return float(out.loss), out.logits.detach().float().cpu(), grads


def expert_load(m, ids, dev, k):
    """Tokens routed to each expert, per layer, in the HF model."""
    with torch.no_grad():
        out = m.to(dev)(input_ids=ids.to(dev), output_router_logits=True)
    return [torch.bincount(r.float().topk(k, dim=-1).indices.flatten(), minlength=r.shape[-1]).tolist()
            for r in out.router_logits]


def mxtrain_args(kw, batch, seq, tokens_file, extra):
    a = ["--config-name", "L0_sanity", "parallelism.ep_size=1", "dataset.source=tokens",
         f"dataset.paths=[{tokens_file}]", "dataset.token_dtype=uint32", f"dataset.max_seq_length={seq}",
         "dataset.stride=0", "dataset.shuffle=false", f"dataset.micro_batch_size={batch}", "grad_acc_steps=1"]
    for k, v in kw.items():
        a.append(f"config_kwargs.{k}={v}")
    for k in ("max_position_embeddings", "rms_norm_eps", "initializer_range"):
        a.append(f"config_kwargs.{k}={BASE[k]}")
    return a + extra


def run(cmd, log):
    with open(log, "w") as f:
        r = subprocess.run(cmd, stdout=f, stderr=subprocess.STDOUT)
    if r.returncode != 0:
        sys.stderr.write(open(log).read()[-3000:])
        raise RuntimeError(f"command failed ({r.returncode}): {' '.join(cmd)}")


def lr_lambda(step, warmup, decay, min_ratio):
    if step < warmup:
        return step / warmup
    p = min(1.0, (step - warmup) / decay)
    return min_ratio + (1 - min_ratio) * 0.5 * (1 + math.cos(math.pi * p))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--mxtrain", default="build/mxtrain")
    ap.add_argument("--backend", default="cuda", choices=["cuda", "cuda-fp32", "cpu"])
    ap.add_argument("--out", default="/tmp/mxtrain_parity")
    ap.add_argument("--shapes", default=",".join(SHAPES))
    a = ap.parse_args()
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    bf16 = a.backend == "cuda"
    # Tolerances of the issue for the bf16 backend; the fp32 backends (cpu, cuda-fp32) must be far tighter.
    tol = dict(loss=1e-3, logits=2e-2, grad=2e-2, train=1e-2) if bf16 else dict(loss=1e-5, logits=1e-4, grad=1e-3,
                                                                                   train=1e-4)
    results, ok = [], True

    def report(shape, check, value, limit, **extra):
        nonlocal ok
        passed = bool(value < limit)
        ok &= passed
        r = dict(shape=shape, backend=a.backend, check=check, value=value, limit=limit, passed=passed, **extra)
        results.append(r)
        print(json.dumps(r), flush=True)

    for name in a.shapes.split(","):
        kw, batch, seq, uneven = SHAPES[name]
        d = os.path.join(a.out, name)
        os.makedirs(d, exist_ok=True)
        cfg, m = build(kw, uneven, seed=1234)
        m.save_pretrained(os.path.join(d, "hf"), safe_serialization=True)
        g = torch.Generator().manual_seed(99)
        ids = torch.randint(0, cfg.vocab_size, (batch, seq), generator=g)
        tokens_file = os.path.join(d, "tokens.u32")
        ids.to(torch.int64).numpy().astype("uint32").tofile(tokens_file)

        # HF fp32 reference; HF in bf16 beside it as the yardstick of what bf16 arithmetic alone costs
        loss_hf, logits_hf, grads_hf = hf_forward_backward(m, ids, dev)
        _, m16 = build(kw, uneven, seed=1234)
        loss16, logits16, grads16 = hf_forward_backward(m16.to(torch.bfloat16), ids, dev)
        print(json.dumps(dict(shape=name, tokens_per_expert=expert_load(m, ids, dev, kw["num_experts_per_tok"]))))
        base = mxtrain_args(kw, batch, seq, tokens_file, [f"backend={a.backend}"])
        dump = os.path.join(d, "dump")
        run([a.mxtrain] + base + [f"init_from_pretrained={os.path.join(d, 'hf')}", "--dump-first-batch", dump],
            os.path.join(d, "dump.log"))
        mx = json.load(open(os.path.join(dump, "loss.json")))
        assert mx["input_ids"] == ids.flatten().tolist(), "mxtrain read other tokens than HF"
        report(name, "loss", abs(mx["loss"] - loss_hf) / abs(loss_hf), tol["loss"], hf=loss_hf, mxtrain=mx["loss"],
               hf_bf16=abs(loss16 - loss_hf) / abs(loss_hf))
        logits_mx = load_file(os.path.join(dump, "logits.safetensors"))["logits"].reshape(logits_hf.shape)
        report(name, "logits", rel(logits_mx, logits_hf), tol["logits"], hf_bf16=rel(logits16, logits_hf))
        # Our gradients, written as an HF checkpoint, loaded by transformers: names and layout match HF's.
        gm = MixtralForCausalLM.from_pretrained(os.path.join(dump, "grads"), torch_dtype=torch.float32)
        worst, worst_name, worst16, n = 0.0, "", 0.0, 0
        per_tensor = {}
        for pname, p in gm.named_parameters():
            e, e16 = rel(p.detach(), grads_hf[pname]), rel(grads16[pname], grads_hf[pname])
            per_tensor[pname] = (e, e16)
            n += 1
            worst16 = max(worst16, e16)
            if e > worst:
                worst, worst_name = e, pname
        with open(os.path.join(d, "grad_errors.json"), "w") as f:
            json.dump(per_tensor, f, indent=1)
        report(name, "grads(worst of %d)" % n, worst, tol["grad"], tensor=worst_name,
               hf_bf16_same_tensor=per_tensor[worst_name][1], hf_bf16_worst=worst16)
        nongate = max(e for k, (e, _) in per_tensor.items() if ".gate." not in k)
        report(name, "grads(worst, router gates excluded)", nongate, tol["grad"],
               hf_bf16=max(e16 for k, (_, e16) in per_tensor.items() if ".gate." not in k))

        # The same gradients against an fp32 reference routed exactly as mxtrain routed (mixtral_reference.py,
        # equal to HF in fp32): one token whose near-tied top-k flips under bf16 rounding moves the gate
        # gradients by 8-40% in any bf16 implementation (docs/data/router_precision_study.log), so this check
        # separates the arithmetic from the routing.
        k = kw["num_experts_per_tok"]
        P0 = params_of(m.float(), cfg)
        with torch.no_grad():
            _, hf_picks = forward(leaf_params(P0, dev), cfg, kw["rope_theta"], ids.to(dev), FP32)
        force = [torch.tensor(t, dtype=torch.long).view(-1, k) for t in mx["topk"]]
        rerouted = sum(int((f.sort(-1).values.to(dev) != h).any(-1).sum()) for f, h in zip(force, hf_picks))
        P = leaf_params(P0, dev)
        loss_ref, _ = forward(P, cfg, kw["rope_theta"], ids.to(dev), FP32, force)
        loss_ref.backward()
        ref_grads = {n: t.grad.detach().float().cpu() for n, t in flat(P).items()}
        mx_grads = flat(params_of(gm, cfg))
        errs = {n: rel(mx_grads[n], g) for n, g in ref_grads.items()}
        worst_name = max(errs, key=errs.get)
        report(name, "grads under mxtrain's routing (worst of %d)" % len(errs), errs[worst_name], tol["grad"],
               tensor=worst_name, tokens_rerouted=rerouted, token_layer_picks=int(ids.numel()) * len(force),
               ref_loss_vs_mxtrain=abs(float(loss_ref.detach()) - mx["loss"]) / abs(mx["loss"]))

        # Reverse: 10 optimizer steps in mxtrain, exported, loaded by transformers; and the same 10 steps in
        # PyTorch fp32 AdamW.
        steps, warmup, decay, min_ratio, lr = 10, 2, 8, 0.1, 1e-3
        train_dir = os.path.join(d, "train")
        run([a.mxtrain] + base + [f"init_from_pretrained={os.path.join(d, 'hf')}", f"num_train_steps={steps}",
                                  f"lr_scheduler_kwargs.num_warmup_steps={warmup}",
                                  f"lr_scheduler_kwargs.num_decay_steps={decay}",
                                  f"lr_scheduler_kwargs.min_lr_ratio={min_ratio}", f"adamw_kwargs.lr={lr}",
                                  "logger.frequency=1", f"output_dir={train_dir}",
                                  f"checkpoint.ckpt_dir={train_dir}/ckpt", "checkpoint.save_final_model=true",
                                  "checkpoint.final_model_dtype=float32"],
            os.path.join(d, "train.log"))
        mx_losses = [json.loads(l)["loss"] for l in open(os.path.join(train_dir, "metrics.jsonl"))]
        def pytorch_losses(autocast_bf16):
            # fp32 AdamW on fp32 parameters; with autocast_bf16 the forward and backward compute in bf16 (the
            # mixed-precision setup mxtrain's CUDA backend has: fp32 master, bf16 GEMMs).
            _, ref = build(kw, uneven, seed=1234)
            ref = ref.to(dev)
            opt = torch.optim.AdamW(ref.parameters(), lr=lr, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.033)
            sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: lr_lambda(s, warmup, decay, min_ratio))
            losses = []
            for _ in range(steps):
                with torch.autocast(device_type=dev, dtype=torch.bfloat16, enabled=autocast_bf16):
                    out = ref(input_ids=ids.to(dev), labels=ids.to(dev))
                out.loss.backward()
                torch.nn.utils.clip_grad_norm_(ref.parameters(), 1.0)
                opt.step()
                sched.step()
                opt.zero_grad(set_to_none=True)
                losses.append(float(out.loss))
            return losses

        pt_losses = pytorch_losses(False)
        worst = max(abs(x - y) / abs(y) for x, y in zip(mx_losses, pt_losses))
        extra = {}
        if bf16:
            amp = pytorch_losses(True)
            extra["hf_bf16"] = max(abs(x - y) / abs(y) for x, y in zip(amp, pt_losses))
        report(name, "10-step losses", worst, tol["train"], mxtrain=mx_losses[-1], pytorch=pt_losses[-1], **extra)
        exported = MixtralForCausalLM.from_pretrained(os.path.join(train_dir, "ckpt", "final_model"),
                                                      torch_dtype=torch.float32).to(dev)
        exported.config._attn_implementation = "eager"
        with torch.no_grad():
            loss_exported = float(exported(input_ids=ids.to(dev), labels=ids.to(dev)).loss)
        # mxtrain's own loss on the exported weights
        dump2 = os.path.join(d, "dump_exported")
        run([a.mxtrain] + base + [f"init_from_pretrained={train_dir}/ckpt/final_model", "--dump-first-batch",
                                  dump2], os.path.join(d, "dump2.log"))
        mx2 = json.load(open(os.path.join(dump2, "loss.json")))["loss"]
        report(name, "export->HF loss", abs(loss_exported - mx2) / abs(loss_exported), tol["loss"],
               hf=loss_exported, mxtrain=mx2)

    print("\n| shape | backend | check | mxtrain vs HF fp32 | HF bf16 vs HF fp32 | limit | pass |")
    print("|---|---|---|---|---|---|---|")
    for r in results:
        y = r.get("hf_bf16", r.get("hf_bf16_same_tensor"))
        ys = f"{y:.2e}" if isinstance(y, float) else "-"
        print(f"| {r['shape']} | {r['backend']} | {r['check']} | {r['value']:.2e} | {ys} | {r['limit']:.0e} | "
              f"{'yes' if r['passed'] else 'NO'} |")
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
