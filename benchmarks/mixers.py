"""Sequence mixers against sequence length: forward+backward time and activation memory.

Each mixer is built alone as the attention slot builds it (emb_dim 64, 4 heads, float32,
batch 1) and timed on a forward+backward (sum of the output as the loss) at T = 128 ..
4096 on CPU. Memory is what the forward keeps for the backward: the bytes of the distinct
tensors autograd saves (``torch.autograd.graph.saved_tensors_hooks``), the activation memory
that the backward's peak adds to the weights. Chunked/parallel forms and the token-by-token
recurrences (``impl: recurrent``, up to ``--max-recurrent``) are both measured; the
crossover is the first T at which a mixer's chunked form is faster than attention (mha,
naive and sdpa).

    .venv/bin/python benchmarks/mixers.py [--threads 1] [--repeats 3] [--markdown F] [--plot F]
"""

from __future__ import annotations

import argparse
import platform
import statistics
import sys
import time
from typing import Any

import torch

import variantlab as vl
from variantlab.probes.timing import device_name

REG = vl.get_registry()
MODEL = {"vocab_size": 64, "context_length": 4096, "emb_dim": 64, "n_heads": 4,
         "n_layers": 1, "drop_rate": 0.0, "positional": "none"}
MIXERS: dict[str, dict[str, Any]] = {
    "mha naive": {"kind": "mha"},
    "mha sdpa": {"kind": "mha", "impl": "sdpa"},
    "linear_attention chunked": {"kind": "linear_attention"},
    "retention chunked": {"kind": "retention"},
    "short_conv": {"kind": "short_conv"},
    "linear_attention recurrent": {"kind": "linear_attention", "impl": "recurrent"},
    "retention recurrent": {"kind": "retention", "impl": "recurrent"},
    "short_conv recurrent": {"kind": "short_conv", "impl": "recurrent"},
}
LENGTHS = (128, 256, 512, 1024, 2048, 4096)


def build(attention: dict[str, Any]) -> torch.nn.Module:
    spec = vl.parse_model_spec({**MODEL, "attention": attention}, REG)
    comp = REG.get("attention", spec.attention.kind)
    torch.manual_seed(0)
    kw = {"make_norm": lambda dim, s=None: torch.nn.LayerNorm(dim)} if "linear" in \
        attention["kind"] or "retention" in attention["kind"] else {}
    return comp.build(spec.attention, emb_dim=64, n_heads=4, context_length=4096,
                      drop_rate=0.0, qkv_bias=False, causal=True, **kw)


def saved_bytes(module: torch.nn.Module, x: torch.Tensor) -> int:
    """Bytes of the distinct tensors the forward saves for the backward."""
    seen: dict[tuple, int] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        if t.device.type == "cpu" and t.untyped_storage().data_ptr():
            key = (t.untyped_storage().data_ptr(),)
            seen[key] = max(seen.get(key, 0), t.untyped_storage().nbytes())
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = module(x)
    del out
    return sum(seen.values())


def fwd_bwd(module: torch.nn.Module, x: torch.Tensor, repeats: int) -> float:
    """Median seconds of a forward+backward."""
    times = []
    for _ in range(repeats + 1):  # the first is a warm-up
        t0 = time.perf_counter()
        module(x).sum().backward()
        times.append(time.perf_counter() - t0)
        module.zero_grad(set_to_none=True)
    return statistics.median(times[1:])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, default=1, help="torch threads (default 1)")
    ap.add_argument("--repeats", type=int, default=3, help="timed runs per point (median)")
    ap.add_argument("--max-recurrent", type=int, default=1024,
                    help="longest T for the token-by-token forms (default 1024)")
    ap.add_argument("--markdown", help="also write the tables to this file")
    ap.add_argument("--plot", help="write a PNG of time and memory against T")
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    results: dict[str, dict[int, tuple[float, int]]] = {}
    for name, attention in MIXERS.items():
        module = build(attention)
        results[name] = {}
        for t in LENGTHS:
            if "recurrent" in name and t > args.max_recurrent:
                continue
            x = torch.randn(1, t, 64, generator=torch.Generator().manual_seed(t))
            results[name][t] = (fwd_bwd(module, x, args.repeats), saved_bytes(module, x))
            print(f"{name:28s} T={t:5d} {results[name][t][0] * 1e3:10.2f} ms "
                  f"{results[name][t][1] / 2 ** 20:9.2f} MiB", file=sys.stderr)
    head = (f"{device_name(torch.device('cpu'))}, torch {torch.__version__}, Python "
            f"{platform.python_version()}, {args.threads} thread(s); one mixer alone, emb_dim "
            f"64, 4 heads, batch 1, float32; median of {args.repeats} forward+backward")
    lines = [head, "", "Forward+backward time (ms):", "",
             "| mixer | " + " | ".join(f"T={t}" for t in LENGTHS) + " |",
             "|---|" + "---:|" * len(LENGTHS)]
    for name, row in results.items():
        lines.append(f"| {name} | " + " | ".join(
            f"{row[t][0] * 1e3:.1f}" if t in row else "-" for t in LENGTHS) + " |")
    lines += ["", "Saved for backward (MiB) and its growth per doubling of T (last step):", "",
              "| mixer | " + " | ".join(f"T={t}" for t in LENGTHS) + " | growth |",
              "|---|" + "---:|" * (len(LENGTHS) + 1)]
    for name, row in results.items():
        ts = sorted(row)
        growth = row[ts[-1]][1] / row[ts[-2]][1]
        lines.append(f"| {name} | " + " | ".join(
            f"{row[t][1] / 2 ** 20:.2f}" if t in row else "-" for t in LENGTHS)
            + f" | x{growth:.2f} |")
    lines += ["", "Crossover: the first T at which the chunked form's time is below attention's:",
              ""]
    for name in (n for n in results if "mha" not in n and "recurrent" not in n):
        for ref in ("mha naive", "mha sdpa"):
            first = next((t for t in LENGTHS if results[name][t][0] < results[ref][t][0]), None)
            lines.append(f"- {name} vs {ref}: " + (f"T={first}" if first else f"none up to {LENGTHS[-1]}"))
    text = "\n".join(lines)
    print(text)
    if args.markdown:
        with open(args.markdown, "w") as f:
            f.write(text + "\n")
    if args.plot:
        plot(results, args.plot, head)
    return 0


def plot(results: dict[str, dict[int, tuple[float, int]]], path: str, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (a, b) = plt.subplots(1, 2, figsize=(12, 4.5))
    for name, row in results.items():
        ts = sorted(row)
        style = "--" if "recurrent" in name else "-"
        a.plot(ts, [row[t][0] * 1e3 for t in ts], style, marker="o", label=name)
        b.plot(ts, [row[t][1] / 2 ** 20 for t in ts], style, marker="o", label=name)
    for ax, what in ((a, "forward+backward (ms)"), (b, "saved for backward (MiB)")):
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("sequence length T")
        ax.set_ylabel(what)
        ax.grid(True, which="both", alpha=0.3)
    a.legend(fontsize=7)
    fig.suptitle(title, fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


if __name__ == "__main__":
    raise SystemExit(main())
