"""How far the throughput sweep's training step is from what torch can do at its size
(issue 39): one torch thread, the sweep's GELU model (width 32, 2 layers, 4 heads, vocab 256,
16 x 64 tokens), AdamW, gradient clipping at 1.0.

Rows, each the median over ``--steps`` steps after a warm-up, interleaved round by round:

- **variantlab, reference / fast**: the bare step below on the model built with
  ``kernels: reference`` (the seeds' written-out formulas) and ``kernels: fast`` (torch's
  fused LayerNorm, GELU and attention), with torch's default AdamW step and with its fused
  one (which ``kernels: fast`` also chooses);
- **variantlab training loop**: a step of the training probe's own loop
  (``training.train``: the batch drawn from its stream, the learning-rate schedule, the
  auxiliary-loss and after-step hooks) on ``kernels: fast`` and its fused AdamW;
- **bare loop**: a nanoGPT-style model written here in plain torch with the same fused
  kernels (``nn.LayerNorm``, ``F.scaled_dot_product_attention``, ``F.gelu``) and the same
  step, no framework around it;
- **bare loop, fused AdamW**: the same with ``AdamW(fused=True)``.

Then what the training loop's per-step walk over the model's modules costs (the auxiliary
loss and after-step hooks looked up by walking every module, as before the loop fixed them
once per run: ``variantlab.model.sparse.fixed_structure``); the elementwise kernels on a
(4,096, 128) float32 tensor, the sweep's feed-forward hidden at 64 rows: tanh-GELU
(``F.gelu(approximate="tanh")``), erf GELU, ``torch.tanh`` and a multiply; and how far
fused AdamW's weights are from the loop form's after 200 steps on the same gradients.

    .venv/bin/python benchmarks/kernel_floor.py [--steps 40] [--rounds 3] [--markdown F]
"""

from __future__ import annotations

import argparse
import platform
import statistics
import time
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

import variantlab as vl
from variantlab.model.kernels import with_kernels

REG = vl.get_registry()
VOCAB, CTX, DIM, HEADS, LAYERS = 256, 64, 32, 4, 2
MODEL = {"family": "gpt", "vocab_size": VOCAB, "context_length": CTX, "emb_dim": DIM,
         "n_heads": HEADS, "n_layers": LAYERS, "drop_rate": 0.0,
         "activation": {"kind": "gelu", "approximate": "tanh"}}


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(DIM), nn.LayerNorm(DIM)
        self.qkv, self.proj = nn.Linear(DIM, 3 * DIM), nn.Linear(DIM, DIM)
        self.fc, self.out = nn.Linear(DIM, 4 * DIM), nn.Linear(4 * DIM, DIM)

    def forward(self, x):  # (B, T, D)
        b, t, d = x.shape
        q, k, v = (z.view(b, t, HEADS, d // HEADS).transpose(1, 2)
                   for z in self.qkv(self.ln1(x)).split(d, 2))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(y.transpose(1, 2).reshape(b, t, d))
        return x + self.out(F.gelu(self.fc(self.ln2(x)), approximate="tanh"))


class Bare(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.tok, self.pos = nn.Embedding(VOCAB, DIM), nn.Embedding(CTX, DIM)
        self.blocks = nn.Sequential(*(Block() for _ in range(LAYERS)))
        self.ln, self.head = nn.LayerNorm(DIM), nn.Linear(DIM, VOCAB, bias=False)

    def forward(self, idx):  # (B, T) -> (B, T, V)
        x = self.tok(idx) + self.pos(torch.arange(idx.shape[1]))
        return self.head(self.ln(self.blocks(x)))


def step_times(model: nn.Module, opt: torch.optim.Optimizer, steps: int) -> list[float]:
    gen = torch.Generator().manual_seed(0)
    times = []
    for _ in range(steps + 5):
        idx = torch.randint(0, VOCAB, (16, CTX), generator=gen)
        target = torch.randint(0, VOCAB, (16, CTX), generator=gen)
        start = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        loss = F.cross_entropy(model(idx).view(-1, VOCAB), target.view(-1))
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        times.append(time.perf_counter() - start)
    return times[5:]


def variantlab_model(kernels: str) -> nn.Module:
    spec = with_kernels(vl.parse_model_spec(MODEL, REG), kernels, REG)
    torch.manual_seed(0)
    return vl.build_model(spec, REG).train()


def loop_times(steps: int) -> list[float]:
    """Step times of the training probe's own loop (``training.train``) on the experiment's
    ``kernels: fast`` model and settings (synthetic tokens, cosine schedule)."""
    from variantlab.model.kernels import settings_with_kernels
    from variantlab.probes.training import TrainingSettings, setup, train

    settings = settings_with_kernels({"training": TrainingSettings(
        steps=steps + 5, lr=3e-3, batch_size=16, seq_len=CTX, schedule="cosine",
        warmup_steps=5, eval_batches=0)}, "fast")["training"]
    spec = with_kernels(vl.parse_model_spec(MODEL, REG), "fast", REG)
    dev, model, opt, batches, objective = setup(spec, settings, 0, None, ".", "cpu", REG)
    stamps = [time.perf_counter()]
    train(model, model, opt, objective, batches, dev, settings,
          on_step=lambda step: stamps.append(time.perf_counter()))
    return [b - a for a, b in zip(stamps, stamps[1:], strict=False)][5:]


def module_walk_ms(model: nn.Module, repeats: int = 2000) -> float:
    """Milliseconds a step spends finding the routed modules and after-step hooks by walking
    ``model``'s modules (``sparse.aux_loss`` and ``sparse.after_step`` outside
    ``fixed_structure``), the median of five rounds."""
    from variantlab.model import sparse

    rounds = []
    for _ in range(5):
        start = time.perf_counter()
        for _ in range(repeats):
            sparse.aux_loss(model)
            sparse.after_step(model)
        rounds.append((time.perf_counter() - start) / repeats * 1e3)
    return statistics.median(rounds)


def bare_model() -> nn.Module:
    torch.manual_seed(0)
    return Bare().train()


def kernel_ms(fn, repeats: int = 50) -> float:
    fn()
    start = time.perf_counter()
    for _ in range(repeats):
        fn()
    return (time.perf_counter() - start) / repeats * 1e3


def adamw_gap(steps: int = 200) -> float:
    """Largest |weight difference| between AdamW's loop form and fused=True after ``steps``
    steps on the same gradients (weight decay 0.1, a decaying rate)."""
    results = []
    for fused in (False, True):
        torch.manual_seed(0)
        params = [nn.Parameter(torch.randn(shape)) for shape in ((256, 32), (32,), (128, 32))]
        opt = torch.optim.AdamW(params, lr=3e-2, weight_decay=0.1, fused=fused)
        gen = torch.Generator().manual_seed(1)
        for i in range(steps):
            for p in params:
                p.grad = torch.randn(p.shape, generator=gen)
            for group in opt.param_groups:
                group["lr"] = 3e-2 * (1 - i / steps)
            opt.step()
        results.append(params)
    return max((a - b).abs().max().item() for a, b in zip(*results, strict=True))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--markdown", type=Path)
    args = parser.parse_args()
    torch.set_num_threads(1)
    paths: dict[str, Any] = {
        "variantlab, kernels: reference": lambda: (variantlab_model("reference"), {}),
        "variantlab, kernels: fast": lambda: (variantlab_model("fast"), {}),
        "variantlab, kernels: fast, fused AdamW": lambda: (variantlab_model("fast"),
                                                           {"fused": True}),
        "variantlab training loop, kernels: fast (fused AdamW)": None,
        "bare loop (fused kernels)": lambda: (bare_model(), {}),
        "bare loop, fused AdamW": lambda: (bare_model(), {"fused": True}),
    }
    times: dict[str, list[float]] = {name: [] for name in paths}
    for _ in range(args.rounds):
        for name, make in paths.items():
            if make is None:
                times[name] += loop_times(args.steps)
                continue
            model, extra = make()
            opt = torch.optim.AdamW(model.parameters(), lr=3e-3, **extra)
            times[name] += step_times(model, opt, args.steps)
    walk = module_walk_ms(variantlab_model("fast"))
    x = torch.randn(4096, 128, generator=torch.Generator().manual_seed(0))
    kernels = {
        "F.gelu(approximate='tanh')": lambda: F.gelu(x, approximate="tanh"),
        "F.gelu (erf)": lambda: F.gelu(x),
        "torch.tanh": lambda: torch.tanh(x),
        "x * x": lambda: x * x,
    }
    lines = [f"Machine: {platform.processor() or platform.machine()}, torch {torch.__version__}, "
             f"one torch thread, CPU capability {torch.backends.cpu.get_cpu_capability()}; "
             f"{args.rounds} rounds of {args.steps} steps.", "",
             "| training step | median (ms) |", "|---|---:|"]
    lines += [f"| {name} | {statistics.median(t) * 1e3:.2f} |" for name, t in times.items()]
    lines += ["", f"Walking the model's modules for the auxiliary loss and the after-step "
                  f"hooks, unfixed: {walk:.3f} ms a step."]
    lines += ["", "| kernel on 4,096 x 128 float32 | ms |", "|---|---:|"]
    lines += [f"| {name} | {kernel_ms(fn):.3f} |" for name, fn in kernels.items()]
    lines += ["", f"AdamW, fused=True against the loop form after 200 steps: largest weight "
                  f"difference {adamw_gap():.2e}."]
    text = "\n".join(lines)
    print(text)
    if args.markdown:
        args.markdown.write_text(text + "\n")


if __name__ == "__main__":
    main()
