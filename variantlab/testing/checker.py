"""The battery every module under test goes through: output shape, finite values, a
gradient for every parameter, train/eval, determinism under a seed, ``state_dict`` round-trip,
float64 and device moves, plus a case's own extra checks. Problems are collected, not raised.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

#: The tiny model every component is tried in (emb_dim 32, 2 layers, no dropout).
TINY_MODEL: dict[str, Any] = {
    "vocab_size": 64, "context_length": 32, "emb_dim": 32, "n_heads": 4, "n_layers": 2,
    "drop_rate": 0.0,
}
B, T, D, HEADS, CTX = 2, 8, 32, 4, 32  # standalone sizes
SEED = 1234


@dataclass
class Case:
    """One module under test: how to build it, feed it and score it."""

    name: str
    make: Callable[[], nn.Module]
    args: tuple
    kwargs: dict = field(default_factory=dict)
    expect: tuple[int, ...] | None = None
    loss: Callable[[torch.Tensor], torch.Tensor] | None = None
    zero_grad_is_bug: bool = True  # standalone modules: a parameter with an all-zero grad
    extra: list[Callable[[], list[str]]] = field(default_factory=list)


def gen(seed: int = SEED) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def _map(obj: Any, fn: Callable[[torch.Tensor], torch.Tensor]) -> Any:
    if isinstance(obj, torch.Tensor):
        return fn(obj)
    if isinstance(obj, tuple):
        return tuple(_map(o, fn) for o in obj)
    if isinstance(obj, dict):
        return {k: _map(v, fn) for k, v in obj.items()}
    return obj


def _to(dtype: torch.dtype | None = None, device: str | None = None) -> Callable:
    def move(t: torch.Tensor) -> torch.Tensor:
        t = t.to(device) if device else t
        return t.to(dtype) if dtype and t.is_floating_point() else t

    return move


def close(a: torch.Tensor, b: torch.Tensor, tol: float = 1e-5) -> bool:
    return a.shape == b.shape and torch.allclose(a.float().cpu(), b.float().cpu(), rtol=tol, atol=tol)


def _projection_loss(shape: Sequence[int]) -> Callable[[torch.Tensor], torch.Tensor]:
    """A fixed random projection: no symmetry hides a parameter's gradient (unlike .sum())."""
    w = torch.randn(tuple(shape), generator=gen(7), dtype=torch.float64)
    return lambda out: (out * w.to(out.device, out.dtype)).sum()


class Checker:
    def __init__(self, case: Case):
        self.case = case
        self.problems: list[str] = []

    def fail(self, check: str, message: str) -> None:
        self.problems.append(f"{self.case.name}: {check}: {message}")

    def build(self, seed: int = 0) -> nn.Module:
        torch.manual_seed(seed)
        module = self.case.make()
        if not isinstance(module, nn.Module):
            raise TypeError(f"build returned {type(module).__name__}, not an nn.Module")
        return module

    def forward(self, module: nn.Module, move: Callable | None = None) -> torch.Tensor:
        args, kwargs = self.case.args, self.case.kwargs
        if move is not None:
            args, kwargs = _map(args, move), _map(kwargs, move)
        out = module(*args, **kwargs)
        if not isinstance(out, torch.Tensor):
            raise TypeError(f"forward returned {type(out).__name__}, not a tensor")
        return out

    def guarded(self, check: str, fn: Callable[[], None]) -> None:
        try:
            fn()
        except Exception as exc:  # a plugin may raise anything; it is a finding
            self.fail(check, f"raised {type(exc).__name__}: {exc}")

    def run(self) -> list[str]:
        try:
            module = self.build()
        except Exception as exc:
            self.fail("build", f"raised {type(exc).__name__}: {exc}")
            return self.problems
        state = copy.deepcopy(module.state_dict())
        before = len(self.problems)
        self.guarded("forward/backward (train mode)", lambda: self.train_step(module))
        if any("raised" in p for p in self.problems[before:]):
            return self.problems  # every later check would raise the same way
        module.load_state_dict(state)  # undo running-statistics updates of the train pass
        self.guarded("train/eval switch", lambda: self.train_eval(module))
        self.guarded("determinism under a seed", self.determinism)
        self.guarded("state_dict round-trip", self.state_dict_round_trip)
        self.guarded("dtype move to float64", self.float64)
        self.guarded("device move", self.devices)
        for extra in self.case.extra:
            name = extra.__doc__ or extra.__name__
            try:
                for message in extra():
                    self.fail(name, message)
            except Exception as exc:
                self.fail(name, f"raised {type(exc).__name__}: {exc}")
        return self.problems

    def check_output(self, check: str, out: torch.Tensor) -> None:
        if self.case.expect is not None and tuple(out.shape) != tuple(self.case.expect):
            self.fail(check, f"output shape {tuple(out.shape)}, expected {tuple(self.case.expect)}")
        if out.is_floating_point() and not torch.isfinite(out).all():
            self.fail(check, "output has NaN or inf")

    def train_step(self, module: nn.Module) -> None:
        module.train()
        # float inputs become leaves that take a gradient, as they would inside a model
        out = self.forward(module, lambda t: t.detach().clone().requires_grad_(
            t.is_floating_point()))
        self.check_output("forward (train mode)", out)
        loss_fn = self.case.loss or _projection_loss(out.shape)
        loss = loss_fn(out)
        if not torch.isfinite(loss):
            self.fail("loss", f"loss is {loss.item()}")
        if not loss.requires_grad:
            self.fail("gradients", "the output does not depend on the input or any parameter")
            return
        module.zero_grad(set_to_none=True)
        loss.backward()
        found: dict[str, list[str]] = {}
        for name, p in module.named_parameters():
            if not p.requires_grad:
                continue
            if p.grad is None:
                found.setdefault("got no gradient (used in forward?)", []).append(name)
            elif not torch.isfinite(p.grad).all():
                found.setdefault("have a NaN or inf gradient", []).append(name)
            elif self.case.zero_grad_is_bug and not p.grad.abs().sum() > 0:
                found.setdefault("have an all-zero gradient", []).append(name)
        for what, names in found.items():
            more = f" (+{len(names) - 4} more)" if len(names) > 4 else ""
            self.fail("gradients", f"{len(names)} parameter(s) {what}: "
                      f"{', '.join(names[:4])}{more}")

    def train_eval(self, module: nn.Module) -> None:
        module.eval()
        if any(m.training for m in module.modules()):
            self.fail("train/eval switch", ".eval() left a submodule in training mode")
        with torch.no_grad():
            first, second = self.forward(module), self.forward(module)
        self.check_output("forward (eval mode)", first)
        if not torch.equal(first, second):
            self.fail("train/eval switch", "two eval-mode forwards of the same input differ")
        module.train()
        if not all(m.training for m in module.modules()):
            self.fail("train/eval switch", ".train() left a submodule in eval mode")

    def eval_out(self, module: nn.Module, move: Callable | None = None) -> torch.Tensor:
        module.eval()
        with torch.no_grad():
            return self.forward(module, move)

    def determinism(self) -> None:
        a, b = self.build(seed=5), self.build(seed=5)
        sa, sb = a.state_dict(), b.state_dict()
        if list(sa) != list(sb):
            self.fail("determinism under a seed", "two builds have different state_dict keys")
            return
        differ = [k for k in sa if not torch.equal(sa[k], sb[k])]
        if differ:
            more = f" (+{len(differ) - 4} more)" if len(differ) > 4 else ""
            self.fail("determinism under a seed",
                      f"two builds after torch.manual_seed(5) differ in {', '.join(differ[:4])}"
                      f"{more}; "
                      "draw initial values from torch's global generator only")
        if not torch.equal(self.eval_out(a), self.eval_out(b)):
            self.fail("determinism under a seed",
                      "two builds after torch.manual_seed(5) give different eval outputs")

    def state_dict_round_trip(self) -> None:
        a, b = self.build(seed=1), self.build(seed=2)
        b.load_state_dict(a.state_dict())
        if not close(self.eval_out(a), self.eval_out(b), 1e-6):
            self.fail("state_dict round-trip",
                      "a fresh build loaded with the state_dict gives different outputs; "
                      "register every tensor the forward uses as a parameter or buffer")

    def float64(self) -> None:
        a = self.build()
        ref = self.eval_out(a)
        a64 = a.to(torch.float64)
        if a64 is None:
            self.fail("dtype move to float64", ".to(torch.float64) returned None")
            return
        wrong = [n for n, t in [*a64.named_parameters(), *a64.named_buffers()]
                 if t.is_floating_point() and t.dtype != torch.float64]
        if wrong:
            self.fail("dtype move to float64", f"tensors left in another dtype: {', '.join(wrong)}")
        out = self.eval_out(a64, _to(dtype=torch.float64))
        if out.dtype != torch.float64:
            self.fail("dtype move to float64", f"float64 input gave a {out.dtype} output")
        elif not close(out, ref, 1e-3):
            self.fail("dtype move to float64", "float64 output differs from the float32 one")

    def devices(self) -> None:
        a = self.build()
        ref = self.eval_out(a)
        if not close(self.eval_out(a.to("cpu"), _to(device="cpu")), ref, 1e-6):
            self.fail("device move", "output changed after .to('cpu')")
        if not torch.cuda.is_available():
            return
        gpu = self.build().to("cuda")
        out = self.eval_out(gpu, _to(device="cuda"))
        if out.device.type != "cuda":
            self.fail("device move", f"cuda input gave an output on {out.device}")
        elif not close(out, ref, 2e-3):
            self.fail("device move", "cuda output differs from the cpu one")
