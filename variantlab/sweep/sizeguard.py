"""Size guard: each variant's memory per probe, estimated without allocating anything.

The model is built on PyTorch's ``meta`` device (shapes and dtypes, no storage) with 1 and
2 layers; parameters, buffers and the activations saved for backward (counted with
``torch.autograd.graph.saved_tensors_hooks`` during a meta forward at the probe's batch) are
linear in ``n_layers``, so the model as written is extrapolated from those two builds and
``n_layers: 1000000`` never builds a million layers. A probe needs:

- ``params``: parameters and buffers;
- ``gradients``: + one gradient per parameter + activations at its batch;
- ``timing``: + gradients and activations when it times ``backward`` or ``step``, + AdamW's
  two moments for ``step``;
- ``training``: parameters, gradients, AdamW's two moments (float32) and activations.

Every probe with a batch also holds that batch and, when it scores held-out data, its
validation and test sets (:func:`eval_set_bytes`); a training run also the rows each step
leaves (:func:`held_bytes`).

The activation count is an estimate (saved tensors plus the output and its gradient, at
float32); allocator overhead and backward's temporaries are not in it, so it reads low: for
GPT models training on CPU the measured peak RSS was 1.4-1.6x the estimate. The guard thus
refuses what cannot fit, not everything that will not.
"""

from __future__ import annotations

import json
import math
import warnings
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import torch

from ..data.splits import HELD_TOKENS
from ..model.build import build_model
from ..model.specs import ModelSpec
from ..model.tasks import Task, task_for
from ..plugin.registry import Registry
from ..probes.common import EMBEDDING_SLOTS, param_index
from ..probes.heldout import scores_held_out
from ..probes.machine import memory_limits
from ..probes.recipe import MAX_STEPS, RecipeSettings, worked_out_steps
from .metarun import meta_run

#: rows a training step leaves in memory until the unit is stored (its loss and lr) and the
#: bytes each takes (a row dict, its floats, its tuple for the store: measured 336 B + slack)
ROWS_PER_STEP = 2
ROW_BYTES = 512


class EstimateError(RuntimeError):
    """The model could not be built or run on the meta device (e.g. a plugin that reads
    tensor values); no estimate, so no refusal."""


@dataclass(frozen=True)
class Cost:
    """Counts of one model build: parameters (all, and those outside the embedding slots),
    and bytes of parameters, buffers, activations and one batch."""

    params: int
    param_bytes: int
    buffer_bytes: int
    activation_bytes: int
    non_embedding: int = 0
    batch_bytes: int = 0

    def line(self, other: Cost, n: int) -> Cost:
        """The cost at ``n`` layers, given ``self`` at 1 layer and ``other`` at 2."""
        return Cost(*(a + (n - 1) * (b - a) for a, b in zip(self.values(), other.values())))

    def plus(self, other: Cost, times: int = 1) -> Cost:
        return Cost(*(a + times * b for a, b in zip(self.values(), other.values())))

    def minus(self, other: Cost) -> Cost:
        return self.plus(other, -1)

    def values(self) -> tuple[int, ...]:
        return (self.params, self.param_bytes, self.buffer_bytes, self.activation_bytes,
                self.non_embedding, self.batch_bytes)


@dataclass(frozen=True)
class Footprint:
    """What one probe of one variant needs on its device, in bytes."""

    probe: str
    device: str
    batch_size: int
    seq_len: int
    params: int  # parameter count
    param_bytes: int
    buffer_bytes: int
    grad_bytes: int
    optimizer_bytes: int
    activation_bytes: int
    data_bytes: int = 0  # the batches the unit holds (linear in batch_size)
    rows_bytes: int = 0  # the rows its steps leave until it is stored
    eval_bytes: int = 0  # its held-out scoring sets (fixed targets: not in batch_size)

    @property
    def held_bytes(self) -> int:
        return self.data_bytes + self.rows_bytes + self.eval_bytes

    @property
    def total(self) -> int:
        return (self.param_bytes + self.buffer_bytes + self.grad_bytes + self.optimizer_bytes
                + self.activation_bytes + self.held_bytes)

    def describe(self) -> str:
        parts = [f"parameters {human(self.param_bytes)}"]
        for name, value in (("buffers", self.buffer_bytes), ("gradients", self.grad_bytes),
                            ("AdamW state", self.optimizer_bytes)):
            if value:
                parts.append(f"{name} {human(value)}")
        if self.activation_bytes:
            parts.append(f"activations {human(self.activation_bytes)} at batch_size "
                         f"{self.batch_size}, seq_len {self.seq_len}")
        if self.data_bytes:
            parts.append(f"batches {human(self.data_bytes)}")
        if self.eval_bytes:
            parts.append(f"held-out scoring sets {human(self.eval_bytes)}")
        if self.rows_bytes:
            steps = self.rows_bytes // (ROWS_PER_STEP * ROW_BYTES)
            parts.append(f"per-step rows {human(self.rows_bytes)} over {steps:,} steps")
        return f"about {human(self.total)} ({', '.join(parts)})"


def human(n_bytes: float) -> str:
    """``1536`` -> ``1.5 KiB``."""
    for unit in ("B", "KiB", "MiB", "GiB", "TiB", "PiB"):
        if abs(n_bytes) < 1024 or unit == "PiB":
            return f"{n_bytes:.0f} {unit}" if unit == "B" else f"{n_bytes:.1f} {unit}"
        n_bytes /= 1024
    return f"{n_bytes:.1f} EiB"  # pragma: no cover


# -- counting on the meta device -------------------------------------------------------------
def _meta_cost(spec: ModelSpec, registry: Registry, batch: tuple[int, int] | None) -> Cost:
    try:
        return _meta_cost_unguarded(spec, registry, batch)
    except KeyboardInterrupt:
        raise
    except BaseException as exc:  # plugin code on meta tensors: anything can go wrong,
        # sys.exit() included; the unit itself reports it when it runs
        raise EstimateError(f"cannot estimate on the meta device: {type(exc).__name__}: "
                            f"{exc}") from exc


def _meta_cost_unguarded(spec: ModelSpec, registry: Registry,
                         batch: tuple[int, int] | None) -> Cost:
    def count() -> Cost:
        with torch.device("meta"), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            model = build_model(spec, registry)
            params = list(model.parameters())
            counted = {id(p) for p in params}
            buffer_bytes = sum(b.numel() * b.element_size() for b in model.buffers())
            non_embedding = sum(i.param.numel() for i in param_index(model)
                                if i.slot not in EMBEDDING_SLOTS)
            # the model is counted before the forward, so a build without a batch counts
            # the same (layer_costs reuses one for the other)
            task = task_for(spec, registry)
            act = _activation_bytes(model, spec, task, counted, *batch) if batch else 0
            batch_bytes = _batch_bytes(spec, task, *batch) if batch else 0
        return Cost(sum(p.numel() for p in params),
                    sum(p.numel() * p.element_size() for p in params), buffer_bytes, act,
                    non_embedding, batch_bytes)

    return meta_run(count)  # without importing torch._dynamo (metarun.py)


def _activation_bytes(model: torch.nn.Module, spec: ModelSpec, task: Task, params: set[int],
                      batch_size: int, seq_len: int) -> int:
    """Bytes of the tensors autograd saves for backward in one forward of the family's loss,
    plus the output and its gradient (parameters, and views of them, are not counted)."""
    seen: dict[int, torch.Tensor] = {}  # held, so a freed tensor's id is never reused here
    total = 0

    def pack(t: torch.Tensor) -> torch.Tensor:
        nonlocal total
        base = t._base if t._base is not None else t
        if id(t) not in seen and id(base) not in params:
            seen[id(t)] = t
            total += t.numel() * t.element_size()
        return t

    model.train()
    batch = task.batch(spec, batch_size, seq_len)
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = model(**batch.inputs)
        task.loss(spec, out, batch)
    out_t = out if isinstance(out, torch.Tensor) else None
    return total + (2 * out_t.numel() * out_t.element_size() if out_t is not None else 0)


def _batch_bytes(spec: ModelSpec, task: Task, batch_size: int, seq_len: int) -> int:
    """Bytes of one batch of the family's task: its inputs and target (on meta)."""
    batch = task.batch(spec, batch_size, seq_len)
    return sum(t.numel() * t.element_size() for t in (*batch.inputs.values(), batch.target))


#: (spec without n_layers, registry) -> batch (None: none) -> the costs at 1 and 2 layers
_CACHE: dict[tuple[str, int], dict[tuple[int, int] | None, tuple[Cost, Cost]]] = {}


def layer_costs(spec: ModelSpec, registry: Registry,
                batch: tuple[int, int] | None = None) -> tuple[Cost, Cost]:
    """The costs of ``spec`` built with 1 and 2 layers (activations at ``batch``); variants
    that differ only in ``n_layers`` share them, and the costs without a batch are those of
    any batch's builds less the activations and the batch (the model is counted before the
    forward), so a probe without a batch beside one with a batch builds nothing more."""
    data = spec.model_dump(mode="json")
    data.pop("n_layers", None)
    key = (json.dumps(data, sort_keys=True), id(registry))
    if key not in _CACHE and len(_CACHE) > 1024:
        _CACHE.clear()
    known = _CACHE.setdefault(key, {})
    if batch is None and None not in known and known:
        one, two = next(iter(known.values()))
        known[None] = (replace(one, activation_bytes=0, batch_bytes=0),
                       replace(two, activation_bytes=0, batch_bytes=0))
    if batch not in known:
        known[batch] = (_meta_cost(spec.model_copy(update={"n_layers": 1}), registry, batch),
                        _meta_cost(spec.model_copy(update={"n_layers": 2}), registry, batch))
    return known[batch]


def model_cost(spec: ModelSpec, registry: Registry,
               batch: tuple[int, int] | None = None) -> Cost:
    """Parameters, buffers and activations of ``spec`` as written, without allocating. With a
    layout: the stack's base (embeddings, head; the line at 0 layers) plus, for each layer,
    the per-layer cost of a uniform model of that layer's spec."""
    if spec.layout is None:
        one, two = layer_costs(spec, registry, batch)
        return one.line(two, spec.n_layers)
    uniform = spec.model_copy(update={"layout": None})
    one, two = layer_costs(uniform, registry, batch)
    total = one.line(two, 0)
    kinds = Counter(spec.layout.kind_at(i) for i in range(spec.n_layers))
    for kind, count in kinds.items():
        layer = uniform.model_copy(update=spec.layout.overrides(kind))
        one, two = layer_costs(layer, registry, batch)
        total = total.plus(two.minus(one), count)
    return total


# -- per probe --------------------------------------------------------------------------------
def footprint(spec: ModelSpec, registry: Registry, probe: str, settings: Any,
              device: str) -> Footprint:
    """What ``probe`` with ``settings`` needs for ``spec`` on ``device``."""
    batch_size = getattr(settings, "batch_size", 0)
    seq_len = getattr(settings, "seq_len", 0)
    found = {p.name: p for p in registry.probes()}.get(probe) if registry is not None else None
    passes = found.memory_passes(settings) if found is not None else frozenset()
    step = "step" in passes  # it takes optimizer steps
    backward = step or "backward" in passes
    batch = (batch_size, seq_len) if batch_size and seq_len else None
    cost = model_cost(spec, registry, batch)
    grads = cost.param_bytes if backward else 0
    optim = 2 * cost.params * 4 if step else 0  # exp_avg and exp_avg_sq, float32
    return Footprint(probe, device, batch_size, seq_len, cost.params, cost.param_bytes,
                     cost.buffer_bytes, grads, optim, cost.activation_bytes,
                     *held_bytes(cost, settings))


def held_bytes(cost: Cost, settings: Any) -> tuple[int, int, int]:
    """(data, rows, eval): what a unit keeps besides the model: the batch of the step
    (``batches`` of them for a probe that reads several at once), for a training run the
    rows each step leaves (``ROWS_PER_STEP`` of ``ROW_BYTES``; the batches themselves are
    drawn one at a time, :class:`variantlab.data.sources.BatchStream`), and the held-out
    scoring sets (validation and test, :func:`eval_set_bytes`)."""
    drawn = int(getattr(settings, "batches", 1) or 1)  # a probe that reads several at once
    data = cost.batch_bytes * drawn
    rows = 0
    if isinstance(settings, RecipeSettings) and cost.batch_bytes:
        steps = worked_out_steps(settings, settings_tokens(settings), cost.non_embedding)
        rows = min(steps, MAX_STEPS + 1) * ROWS_PER_STEP * ROW_BYTES
    return data, rows, 2 * eval_set_bytes(cost, settings)


def eval_set_bytes(cost: Cost, settings: Any) -> int:
    """Bytes of one held-out scoring set (:mod:`variantlab.data.heldout`): up to
    ``eval_tokens`` targets (unset: ``HELD_TOKENS``, the most a corpus split gives; a
    synthetic set holds fewer), or ``eval_batches`` batches where that is smaller; none when
    the probe scores no held-out data."""
    if not hasattr(settings, "eval_batches") or not scores_held_out(settings):
        return 0
    step_tokens = settings_tokens(settings)
    targets = int(getattr(settings, "eval_tokens", None) or HELD_TOKENS)
    if settings.eval_batches:
        targets = min(targets, int(settings.eval_batches) * step_tokens)
    return math.ceil(cost.batch_bytes * targets / max(1, step_tokens))


def settings_tokens(settings: Any) -> int:
    """Tokens of one step of a training run: ``batch_size`` x ``seq_len``."""
    return int(getattr(settings, "batch_size", 1)) * int(getattr(settings, "seq_len", 1))


# -- what the machine has ---------------------------------------------------------------------
def available_bytes(device: str, meminfo: str | Path = "/proc/meminfo",
                    cgroup: str | Path = "/sys/fs/cgroup",
                    status: str | Path = "/proc/self/status") -> int | None:
    """Memory free for a probe on ``device``: CUDA's ``mem_get_info``; on the CPU the
    smallest of ``MemAvailable``, what the process's address-space limit (``RLIMIT_AS``,
    ``ulimit -v``) leaves above its current size and what its cgroup's memory limit leaves
    (v2 ``memory.max``, v1 ``memory.limit_in_bytes``); None when unknown (mps, no /proc)."""
    found = memory_limits(device, meminfo, cgroup, status)
    return min(found)[0] if found else None


# -- what fits --------------------------------------------------------------------------------
def largest_fit(spec: ModelSpec, registry: Registry, fp: Footprint, available: int,
                settings: Any) -> tuple[str, int] | None:
    """(field, value): the largest ``batch_size``, else (a mixture of experts) the largest
    ``feedforward.n_experts``, else ``n_layers``, else ``vocab_size`` with which this probe
    fits in ``available`` bytes, the rest as written; None if none."""
    fixed = fp.total - fp.activation_bytes - fp.data_bytes
    if fp.activation_bytes and fp.batch_size and fixed < available:
        per_row = (fp.activation_bytes + fp.data_bytes) / fp.batch_size
        best = math.floor((available - fixed) / per_row)
        if best >= 1:
            return "batch_size", best
    at = lambda s: footprint(s, registry, fp.probe, settings, fp.device).total  # noqa: E731
    experts = expert_fit(spec, at, available)
    if experts is not None:
        return experts
    t1 = at(spec.model_copy(update={"n_layers": 1}))
    t2 = at(spec.model_copy(update={"n_layers": 2}))
    if t1 <= available and t2 > t1 and spec.n_layers > 1:
        return "n_layers", min(spec.n_layers - 1, math.floor((available - t1) / (t2 - t1)) + 1)
    if task_for(spec, registry).inputs == "tokens" and spec.vocab_size > 4:
        half = spec.vocab_size // 2
        t_half = at(spec.model_copy(update={"vocab_size": half}))
        slope = (fp.total - t_half) / (spec.vocab_size - half)
        if slope > 0:
            best = math.floor(spec.vocab_size - (fp.total - available) / slope)
            if 4 <= best < spec.vocab_size:
                return "vocab_size", best
    return None


def expert_fit(spec: ModelSpec, at: Callable[[ModelSpec], int],
               available: int) -> tuple[str, int] | None:
    """("feedforward.n_experts", the most routed experts that fit, at least ``top_k``) for a
    model whose feed-forward has ``n_experts`` (its memory is linear in them); else None."""
    ff = getattr(spec, "feedforward", None)
    n, k = getattr(ff, "n_experts", None), getattr(ff, "top_k", 1)
    if ff is None or not isinstance(n, int) or not isinstance(k, int) or n <= k:
        return None
    with_n = lambda m: spec.model_copy(  # noqa: E731
        update={"feedforward": ff.model_copy(update={"n_experts": m})})
    low, high = at(with_n(k)), at(with_n(k + 1))
    if low > available or high <= low:
        return None
    return "feedforward.n_experts", min(n - 1, k + math.floor((available - low) / (high - low)))


def refusal(spec: ModelSpec, registry: Registry, probe: str, settings: Any, device: str,
            available: Callable[[str], int | None] = available_bytes) -> tuple[str, str] | None:
    """(field to point at, message) when ``probe`` cannot fit on ``device``; None if it fits
    or the memory available is unknown."""
    free = available(device)
    if free is None:
        return None
    try:
        fp = footprint(spec, registry, probe, settings, device)
        if fp.total <= free:
            return None
        fit = largest_fit(spec, registry, fp, free, settings)
    except EstimateError:
        return None
    limits = memory_limits(device) if available is available_bytes else []
    what = f" {min(limits)[1]}" if limits else ""
    msg = (f"{probe} needs {fp.describe()} but {device} has {human(free)} available{what}; ")
    if fit is None:
        return "n_layers", msg + "it does not fit even with 1 layer; make the model smaller"
    field, value = fit
    what = "the model as written" if field == "batch_size" else "the rest as written"
    return field, msg + f"the largest {field} that fits is {value:,} ({what})"
