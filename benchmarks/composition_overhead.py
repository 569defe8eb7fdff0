"""Composed model vs a hand-written one with the same weights: forward+backward time.

Usage: python benchmarks/composition_overhead.py [--device cpu|cuda] [--markdown FILE]

The hand-written GPT below is a flat, direct implementation (fused LayerNorm, tanh GELU,
torch's scaled_dot_product_attention); the composed one is ``build_model`` with the matching
fast components. Both get the same state dict; outputs are checked equal before timing.
"""

from __future__ import annotations

import argparse
import platform

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils import benchmark

import variantlab as vl

REG = vl.get_registry()


class HandBlock(nn.Module):
    def __init__(self, d: int, n_heads: int):
        super().__init__()
        self.n_heads = n_heads
        self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.q, self.k, self.v = (nn.Linear(d, d, bias=False) for _ in range(3))
        self.proj = nn.Linear(d, d)
        self.fc1, self.fc2 = nn.Linear(d, 4 * d), nn.Linear(4 * d, d)

    def forward(self, x):  # (B, T, D)
        b, t, d = x.shape
        h = self.ln1(x)
        q, k, v = (m(h).view(b, t, self.n_heads, -1).transpose(1, 2) for m in (self.q, self.k, self.v))
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True)  # (B, H, T, hd)
        x = x + self.proj(a.transpose(1, 2).reshape(b, t, d))
        return x + self.fc2(F.gelu(self.fc1(self.ln2(x)), approximate="tanh"))


class HandGPT(nn.Module):
    def __init__(self, vocab: int, ctx: int, d: int, n_heads: int, n_layers: int):
        super().__init__()
        self.tok, self.pos = nn.Embedding(vocab, d), nn.Embedding(ctx, d)
        self.blocks = nn.ModuleList(HandBlock(d, n_heads) for _ in range(n_layers))
        self.ln_f, self.head = nn.LayerNorm(d), nn.Linear(d, vocab, bias=False)

    def forward(self, idx):  # (B, T)
        x = self.tok(idx) + self.pos(torch.arange(idx.shape[1], device=idx.device))
        for block in self.blocks:
            x = block(x)
        return self.head(self.ln_f(x))


def hand_state(composed: dict) -> dict:
    """Rename the composed model's state dict to the hand-written layout."""
    names = {
        "embed.tok_emb.weight": "tok.weight", "embed.pos_emb.pos_emb.weight": "pos.weight",
        "final_norm.scale": "ln_f.weight", "final_norm.shift": "ln_f.bias",
        "out_head.weight": "head.weight",
    }
    inner = {
        "att.norm.scale": "ln1.weight", "att.norm.shift": "ln1.bias",
        "att.sublayer.W_query.weight": "q.weight", "att.sublayer.W_key.weight": "k.weight",
        "att.sublayer.W_value.weight": "v.weight", "att.sublayer.out_proj.weight": "proj.weight",
        "att.sublayer.out_proj.bias": "proj.bias", "ff.norm.scale": "ln2.weight",
        "ff.norm.shift": "ln2.bias", "ff.sublayer.layers.0.weight": "fc1.weight",
        "ff.sublayer.layers.0.bias": "fc1.bias", "ff.sublayer.layers.2.weight": "fc2.weight",
        "ff.sublayer.layers.2.bias": "fc2.bias",
    }
    out = {}
    for key, value in composed.items():
        if key in names:
            out[names[key]] = value
        else:
            _, i, rest = key.split(".", 2)  # trf_blocks.<i>.<rest>
            out[f"blocks.{i}.{inner[rest]}"] = value
    return out


def time_fwd_bwd(model: nn.Module, idx: torch.Tensor, min_run_time: float) -> benchmark.Measurement:
    def step():
        model.zero_grad(set_to_none=True)
        model(idx).float().square().mean().backward()

    for _ in range(3):
        step()
    timer = benchmark.Timer(stmt="step()", globals={"step": step}, num_threads=torch.get_num_threads())
    return timer.blocked_autorange(min_run_time=min_run_time)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--emb-dim", type=int, default=256)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--seq", type=int, default=128)
    ap.add_argument("--rounds", type=int, default=5, help="alternating timing rounds")
    ap.add_argument("--min-run-time", type=float, default=1.0)
    ap.add_argument("--markdown", help="also write the table to this file")
    args = ap.parse_args()
    d, n_heads, vocab, ctx = args.emb_dim, max(1, args.emb_dim // 64), 4096, args.seq
    spec = {
        "family": "gpt", "vocab_size": vocab, "context_length": ctx, "emb_dim": d,
        "n_heads": n_heads, "n_layers": args.layers, "drop_rate": 0.0,
        "norm": {"kind": "layer", "impl": "fused"},
        "activation": {"kind": "gelu", "approximate": "tanh", "impl": "fused"},
        "attention": {"kind": "mha", "impl": "sdpa"},
    }
    torch.manual_seed(0)
    composed = vl.build_model(spec, REG).to(args.device)
    hand = HandGPT(vocab, ctx, d, n_heads, args.layers).to(args.device)
    hand.load_state_dict(hand_state(composed.state_dict()))
    idx = torch.randint(0, vocab, (args.batch, args.seq), device=args.device)
    with torch.no_grad():
        torch.testing.assert_close(composed(idx), hand(idx), atol=1e-4, rtol=1e-4)

    results = {"composed": [], "hand-written": []}
    for _ in range(args.rounds):  # alternate to spread machine noise over both
        for name, model in (("composed", composed), ("hand-written", hand)):
            results[name].append(time_fwd_bwd(model, idx, args.min_run_time).median)
    med = {k: sorted(v)[len(v) // 2] for k, v in results.items()}
    cpu_name = platform.processor() or platform.machine()
    device = torch.cuda.get_device_name() if args.device.startswith("cuda") else cpu_name
    lines = [
        f"forward+backward, gpt emb_dim={d} n_layers={args.layers} batch={args.batch} "
        f"seq={args.seq}, {args.device} ({device}), torch {torch.__version__}, "
        f"{torch.get_num_threads()} threads; median of {args.rounds} alternating rounds",
        "",
        "| model | median ms | rounds (ms) |",
        "|---|---|---|",
    ]
    for name, values in results.items():
        rounds = ", ".join(f"{v * 1e3:.2f}" for v in values)
        lines.append(f"| {name} | {med[name] * 1e3:.2f} | {rounds} |")
    lines += ["", f"composed / hand-written = {med['composed'] / med['hand-written']:.3f}"]
    print("\n".join(lines))
    if args.markdown:
        with open(args.markdown, "w") as fh:
            fh.write("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
