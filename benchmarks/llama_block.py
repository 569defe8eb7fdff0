"""A Llama-style model composed by variantlab vs a hand-written one, same weights.

Usage: python benchmarks/llama_block.py [--rounds 5] [--min-run-time 0.5] [--markdown FILE]

The composed model is ``build_model`` with RMSNorm, a SwiGLU ``glu`` feed-forward (silu),
rotary positions, grouped-query ``mha`` (``n_kv_heads``), no biases, pre-norm residuals.
The hand-written one below is plain torch written for this script (explicit
RMSNorm, rotate_half RoPE, repeat_interleave GQA, SDPA). Weights are copied, outputs are
checked equal, then forward+backward is timed on CPU in interleaved rounds (medians).
A second table times rotary attention with ``impl: sdpa`` against ``impl: naive``
(the same comparison as benchmarks/rotary_attention.py, in the same run). Not a test.
"""

from __future__ import annotations

import argparse
import os
import platform

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils import benchmark

import variantlab as vl

REG = vl.get_registry()


class HandRMSNorm(nn.Module):
    def __init__(self, d: int, eps: float = 1e-5):
        super().__init__()
        self.weight, self.eps = nn.Parameter(torch.ones(d)), eps

    def forward(self, x):
        return self.weight * (x / torch.sqrt(x.pow(2).mean(-1, keepdim=True) + self.eps))


def rope(x, cos, sin):  # x (B, H, T, hd); cos/sin (T, hd)
    x1, x2 = x.chunk(2, dim=-1)
    return x * cos + torch.cat((-x2, x1), dim=-1) * sin


class HandLlamaBlock(nn.Module):
    def __init__(self, d: int, n_heads: int, n_kv: int, hidden: int):
        super().__init__()
        self.h, self.kv, self.hd = n_heads, n_kv, d // n_heads
        self.n1, self.n2 = HandRMSNorm(d), HandRMSNorm(d)
        self.q = nn.Linear(d, d, bias=False)
        self.k = nn.Linear(d, n_kv * self.hd, bias=False)
        self.v = nn.Linear(d, n_kv * self.hd, bias=False)
        self.o = nn.Linear(d, d, bias=False)
        self.gate, self.up = nn.Linear(d, hidden, bias=False), nn.Linear(d, hidden, bias=False)
        self.down = nn.Linear(hidden, d, bias=False)

    def forward(self, x, cos, sin):
        b, t, d = x.shape
        h = self.n1(x)
        q = self.q(h).view(b, t, self.h, self.hd).transpose(1, 2)
        k = self.k(h).view(b, t, self.kv, self.hd).transpose(1, 2)
        v = self.v(h).view(b, t, self.kv, self.hd).transpose(1, 2)
        q, k = rope(q, cos, sin), rope(k, cos, sin)
        rep = self.h // self.kv
        k, v = k.repeat_interleave(rep, dim=1), v.repeat_interleave(rep, dim=1)
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.o(a.transpose(1, 2).reshape(b, t, d))
        h = self.n2(x)
        return x + self.down(F.silu(self.gate(h)) * self.up(h))


class HandLlama(nn.Module):
    def __init__(self, vocab, d, n_heads, n_kv, hidden, n_layers, theta=10000.0):
        super().__init__()
        self.tok = nn.Embedding(vocab, d)
        self.blocks = nn.ModuleList(HandLlamaBlock(d, n_heads, n_kv, hidden) for _ in range(n_layers))
        self.norm, self.head = HandRMSNorm(d), nn.Linear(d, vocab, bias=False)
        self.hd, self.theta = d // n_heads, theta

    def forward(self, idx):
        t = idx.shape[1]
        inv = 1.0 / self.theta ** (torch.arange(0, self.hd, 2, dtype=torch.float32) / self.hd)
        ang = torch.outer(torch.arange(t, dtype=torch.float32), inv)
        ang = torch.cat((ang, ang), dim=-1)
        cos, sin = ang.cos(), ang.sin()
        x = self.tok(idx)
        for block in self.blocks:
            x = block(x, cos, sin)
        return self.head(self.norm(x))


INNER = {
    "att.norm.scale": "n1.weight", "att.sublayer.W_query.weight": "q.weight",
    "att.sublayer.W_key.weight": "k.weight", "att.sublayer.W_value.weight": "v.weight",
    "att.sublayer.out_proj.weight": "o.weight", "ff.norm.scale": "n2.weight",
    "ff.sublayer.W_gate.weight": "gate.weight", "ff.sublayer.W_up.weight": "up.weight",
    "ff.sublayer.W_down.weight": "down.weight",
}
OUTER = {"embed.tok_emb.weight": "tok.weight", "final_norm.scale": "norm.weight",
         "out_head.weight": "head.weight"}


def hand_state(composed: dict) -> dict:
    out = {}
    for key, value in composed.items():
        if key in OUTER:
            out[OUTER[key]] = value
        else:
            _, i, rest = key.split(".", 2)  # trf_blocks.<i>.<rest>
            out[f"blocks.{i}.{INNER[rest]}"] = value
    return out


def llama_spec(args, impl: str) -> dict:
    return {
        "family": "gpt", "vocab_size": args.vocab, "context_length": args.seq,
        "emb_dim": args.emb_dim, "n_heads": args.heads, "n_layers": args.layers,
        "drop_rate": 0.0, "tie_weights": False, "qkv_bias": False, "attn_out_bias": False,
        "ffn_bias": False, "norm_bias": False, "norm": {"kind": "rms"},
        "activation": {"kind": "silu"}, "feedforward": {"kind": "glu"},
        "positional": {"kind": "rotary"},
        "attention": {"kind": "mha", "impl": impl, "n_kv_heads": args.kv_heads},
    }


def time_once(model: nn.Module, idx: torch.Tensor, min_run_time: float) -> float:
    def step():
        model.zero_grad(set_to_none=True)
        model(idx).float().square().mean().backward()

    step()
    timer = benchmark.Timer(stmt="step()", globals={"step": step}, num_threads=torch.get_num_threads())
    return timer.blocked_autorange(min_run_time=min_run_time).median


def interleave(models: dict, idx, rounds: int, min_run_time: float) -> dict:
    results = {name: [] for name in models}
    for _ in range(rounds):
        for name, model in models.items():
            results[name].append(time_once(model, idx, min_run_time))
    return results


def table(results: dict) -> list[str]:
    med = {k: sorted(v)[len(v) // 2] for k, v in results.items()}
    lines = ["| model | median ms | rounds (ms) |", "|---|---|---|"]
    for name, values in results.items():
        lines.append(f"| {name} | {med[name] * 1e3:.2f} | {', '.join(f'{v * 1e3:.2f}' for v in values)} |")
    a, b = list(results)
    ratios = sorted(x / y for x, y in zip(results[a], results[b]))
    lines += ["", f"{a} / {b} = {med[a] / med[b]:.3f} (medians); median per-round ratio "
              f"{ratios[len(ratios) // 2]:.3f}"]
    return lines


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--emb-dim", type=int, default=256)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--kv-heads", type=int, default=2)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--vocab", type=int, default=4096)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--seq", type=int, default=128)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--min-run-time", type=float, default=0.5)
    ap.add_argument("--markdown", help="also write the tables to this file")
    args = ap.parse_args()
    torch.manual_seed(0)
    composed = vl.build_model(llama_spec(args, "sdpa"), REG)
    hidden = composed.trf_blocks[0].ff.sublayer.W_up.out_features
    hand = HandLlama(args.vocab, args.emb_dim, args.heads, args.kv_heads, hidden, args.layers)
    hand.load_state_dict(hand_state(composed.state_dict()))
    naive = vl.build_model(llama_spec(args, "naive"), REG)
    naive.load_state_dict(composed.state_dict())
    idx = torch.randint(0, args.vocab, (args.batch, args.seq))
    with torch.no_grad():
        ref = hand(idx)
        torch.testing.assert_close(composed(idx), ref, atol=1e-4, rtol=1e-4)
        torch.testing.assert_close(naive(idx), ref, atol=1e-4, rtol=1e-4)
    n_params = sum(p.numel() for p in composed.parameters())
    load = os.getloadavg()
    head = (f"forward+backward, llama-style gpt emb_dim={args.emb_dim} heads={args.heads} "
            f"kv_heads={args.kv_heads} glu hidden={hidden} n_layers={args.layers} "
            f"({n_params:,} params) batch={args.batch} seq={args.seq}, cpu "
            f"({platform.processor() or platform.machine()}), torch {torch.__version__}, "
            f"{torch.get_num_threads()} threads; {args.rounds} interleaved rounds; "
            f"load average before: {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}")
    lines = [head, "", "composed (sdpa) vs hand-written:", ""]
    lines += table(interleave({"composed": composed, "hand-written": hand}, idx,
                              args.rounds, args.min_run_time))
    lines += ["", "rotary attention, composed sdpa vs composed naive:", ""]
    lines += table(interleave({"sdpa": composed, "naive": naive}, idx, args.rounds, args.min_run_time))
    load = os.getloadavg()
    lines += ["", f"load average after: {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}"]
    print("\n".join(lines))
    if args.markdown:
        with open(args.markdown, "w") as fh:
            fh.write("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
