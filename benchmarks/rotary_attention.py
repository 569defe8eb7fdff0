"""Rotary attention: ``impl: sdpa`` vs ``impl: naive``, forward+backward, same weights.

Usage: python benchmarks/rotary_attention.py [--device cpu|cuda] [--seq 256] [--threads 1]

Times one ``mha`` layer with rotary positions (and a tiny Llama-style ``gpt``: RMSNorm,
SwiGLU, rotary, grouped-query attention) under both implementations, after checking that
their outputs agree. Prints a Markdown table: median and IQR over repeats
(torch.utils.benchmark), and the sdpa/naive ratio. Not a test; a run takes about a minute.
"""

from __future__ import annotations

import argparse

import torch
from torch.utils import benchmark

import variantlab as vl
from variantlab_plugins.rotary import RotaryPositions

REG = vl.get_registry()


def attention_layer(impl: str, args: argparse.Namespace) -> torch.nn.Module:
    comp = vl.get_registry().get("attention", "mha")
    spec = comp.spec_cls(impl=impl, n_kv_heads=args.kv_heads)
    return comp.build(spec, emb_dim=args.emb, n_heads=args.heads, context_length=args.seq,
                      drop_rate=0.0, qkv_bias=False, causal=True,
                      positions=RotaryPositions(), out_bias=False)


def llama_like(impl: str, args: argparse.Namespace) -> torch.nn.Module:
    return vl.build_model({
        "family": "gpt", "vocab_size": 1024, "context_length": args.seq, "emb_dim": args.emb,
        "n_heads": args.heads, "n_layers": 2, "drop_rate": 0.0, "norm": "rms",
        "activation": "silu", "feedforward": "glu", "positional": "rotary",
        "attention": {"kind": "mha", "impl": impl, "n_kv_heads": args.kv_heads},
    }, REG)


def time_pair(name: str, make, inputs, args) -> list[tuple[str, float, float]]:
    torch.manual_seed(0)
    naive = make("naive", args).to(args.device)
    torch.manual_seed(0)
    sdpa = make("sdpa", args).to(args.device)
    sdpa.load_state_dict(naive.state_dict())
    with torch.no_grad():
        torch.testing.assert_close(sdpa(inputs), naive(inputs), atol=1e-4, rtol=1e-4)
    rows = []
    for impl, module in (("naive", naive), ("sdpa", sdpa)):
        def step(module=module):
            module.zero_grad(set_to_none=True)
            module(inputs).float().square().mean().backward()
            if args.device == "cuda":
                torch.cuda.synchronize()

        step()  # warm-up
        timer = benchmark.Timer("step()", globals={"step": step}, num_threads=args.threads)
        m = timer.blocked_autorange(min_run_time=args.min_time)
        rows.append((f"{name}, {impl}", m.median * 1e3, m.iqr * 1e3))
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--seq", type=int, default=256)
    parser.add_argument("--emb", type=int, default=128)
    parser.add_argument("--heads", type=int, default=8)
    parser.add_argument("--kv-heads", type=int, default=2)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--min-time", type=float, default=2.0, help="seconds per measurement")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(args.batch, args.seq, args.emb, generator=gen).to(args.device)
    idx = torch.randint(0, 1024, (args.batch, args.seq), generator=gen).to(args.device)
    rows = time_pair("mha + rotary layer", attention_layer, x, args)
    rows += time_pair("llama-like gpt (2 layers)", llama_like, idx, args)
    print(f"device {args.device}, torch {torch.__version__}, {args.threads} thread(s), batch "
          f"{args.batch} x {args.seq} tokens, emb_dim {args.emb}, {args.heads} heads, "
          f"{args.kv_heads} kv heads, float32, forward+backward\n")
    print("| model, impl | median (ms) | IQR (ms) | sdpa / naive |")
    print("|---|---:|---:|---:|")
    for i, (label, median, iqr) in enumerate(rows):
        ratio = f"{median / rows[i - 1][1]:.3f}" if label.endswith("sdpa") else ""
        print(f"| {label} | {median:.3f} | {iqr:.3f} | {ratio} |")


if __name__ == "__main__":
    main()
