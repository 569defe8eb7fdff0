"""The ``moe`` feed-forward vs a hand-written grouped MoE on the same weights, and vs a dense
GLU of equal active parameters.

Usage: python benchmarks/moe.py [--rounds 5] [--min-run-time 0.5] [--markdown FILE]

Three modules, forward+backward on (batch, seq, emb_dim) float32 inputs on CPU:

- ``moe``: variantlab's ``feedforward: {kind: moe}`` (Mixtral routing: softmax, top-k,
  renormalised; SwiGLU experts), its module as ``build_model`` makes it;
- ``hand``: plain torch written for this script: the same routing, the (token, choice)
  assignments argsorted by expert, ``split`` into per-expert chunks, three matmuls each,
  ``index_add_`` back; it reads the ``moe`` module's weights, and the outputs are checked
  equal (1e-5) before timing;
- ``dense``: a ``glu`` feed-forward whose parameters equal the MoE's active parameters
  per token (router + top_k experts): hidden = round((top_k * 3 * D * H + E * D) / (3 * D)).

Timed in interleaved rounds (torch.utils.benchmark, medians); reported as ms per step and
tokens/s. Not a test.
"""

from __future__ import annotations

import argparse
import os
import platform

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils import benchmark

from variantlab_plugins.feedforwards import GLU
from variantlab_plugins.moe import MoE, MoESpec


def hand_moe(x: torch.Tensor, moe: MoE) -> torch.Tensor:
    """Top-k MoE by hand on ``moe``'s weights: x (B, T, D) -> (B, T, D)."""
    k, n_exp = moe.spec.top_k, moe.spec.n_experts
    flat = x.reshape(-1, x.shape[-1])  # (N, D)
    probs = torch.softmax(flat @ moe.gate.weight.t(), -1)  # (N, E)
    top_w, top_i = probs.topk(k, -1)  # (N, k)
    top_w = top_w / top_w.sum(-1, keepdim=True)
    flat_i = top_i.reshape(-1)  # (N*k,) token-major
    order = flat_i.argsort()
    counts = torch.bincount(flat_i, minlength=n_exp).tolist()
    tok = order // k  # (N*k,)
    xs = flat[tok]
    assert moe.W_gate is not None
    outs = []
    for e, chunk in enumerate(xs.split(counts)):
        h = F.silu(chunk @ moe.W_gate[e].t()) * (chunk @ moe.W_up[e].t())  # (n_e, H)
        outs.append(h @ moe.W_down[e].t())  # (n_e, D)
    y = torch.cat(outs) * top_w.reshape(-1)[order, None]
    return torch.zeros_like(flat).index_add_(0, tok, y).reshape(x.shape)


class Hand(nn.Module):
    def __init__(self, moe: MoE):
        super().__init__()
        self.moe = moe

    def forward(self, x):
        return hand_moe(x, self.moe)


def time_once(model: nn.Module, x: torch.Tensor, min_run_time: float) -> float:
    def step():
        model.zero_grad(set_to_none=True)
        model(x).square().mean().backward()

    timer = benchmark.Timer(stmt="step()", globals={"step": step},
                            num_threads=torch.get_num_threads())
    return timer.blocked_autorange(min_run_time=min_run_time).median


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--emb-dim", type=int, default=256)
    ap.add_argument("--hidden", type=int, default=256, help="each expert's width")
    ap.add_argument("--experts", type=int, default=8)
    ap.add_argument("--top-k", type=int, default=2)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--seq", type=int, default=128)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--min-run-time", type=float, default=0.5)
    ap.add_argument("--markdown", help="also write the tables to this file")
    args = ap.parse_args()

    torch.manual_seed(0)
    d, h, e, k = args.emb_dim, args.hidden, args.experts, args.top_k
    moe = MoE(MoESpec(n_experts=e, top_k=k, expert={"hidden_dim": h}), d, nn.SiLU)
    dense_hidden = round((k * 3 * d * h + e * d) / (3 * d))
    models: dict[str, nn.Module] = {"moe": moe, "hand": Hand(moe),
                                    "dense": GLU(d, dense_hidden, nn.SiLU())}
    x = torch.randn(args.batch, args.seq, d)
    with torch.no_grad():
        torch.testing.assert_close(moe(x), hand_moe(x, moe), rtol=1e-5, atol=1e-5)
    active = sum(p.numel() for p in moe.parameters()) - moe.inactive_params()
    dense_params = sum(p.numel() for p in models["dense"].parameters())

    times: dict[str, list[float]] = {name: [] for name in models}
    for _ in range(args.rounds):
        for name, model in models.items():
            times[name].append(time_once(model, x, args.min_run_time))
    med = {name: sorted(v)[len(v) // 2] for name, v in times.items()}
    tokens = args.batch * args.seq
    lines = [
        f"Machine: {platform.node()} ({platform.processor() or platform.machine()}), "
        f"{os.cpu_count()} CPUs, torch {torch.__version__}, {torch.get_num_threads()} "
        f"thread(s)",
        "",
        f"forward+backward of one layer, emb_dim={d}, {e} experts of glu width {h}, top_k={k} "
        f"({active:,} active of {sum(p.numel() for p in moe.parameters()):,} parameters); "
        f"dense glu width {dense_hidden} ({dense_params:,} parameters); "
        f"batch={args.batch} seq={args.seq}, {args.rounds} interleaved rounds:",
        "",
        "| module | median ms | tokens/s | rounds (ms) |",
        "|---|---|---|---|",
    ]
    for name, v in times.items():
        lines.append(f"| {name} | {med[name] * 1e3:.2f} | {tokens / med[name]:,.0f} | "
                     + ", ".join(f"{t * 1e3:.2f}" for t in v) + " |")
    per_round = sorted(a / b for a, b in zip(times["moe"], times["hand"]))
    lines += ["", f"moe / hand = **{med['moe'] / med['hand']:.3f}** (medians); median "
              f"per-round ratio {per_round[len(per_round) // 2]:.3f}; "
              f"moe / dense = {med['moe'] / med['dense']:.3f}"]
    text = "\n".join(lines)
    print(text)
    if args.markdown:
        with open(args.markdown, "w") as fh:
            fh.write(text + "\n")


if __name__ == "__main__":
    main()
