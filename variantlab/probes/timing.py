"""Wall-clock timing of forward, forward+backward and a full AdamW step.

Each pass is a closure timed with ``torch.utils.benchmark.Timer`` (its timer synchronises
the accelerator before reading the clock, so CUDA work is waited for). After ``warmup``
untimed calls, ``repeats`` blocks of ``number`` calls are timed, ``number`` chosen so a
block lasts about ``BLOCK_S`` (tiny models would otherwise measure the timer); the median
and IQR come from the blocks' per-call times (a ``Measurement``). ``forward`` runs under
``torch.no_grad()`` (inference cost); ``backward`` is forward+backward of the family's loss;
``step`` adds ``AdamW.step()`` and zeroing the gradients.

Peak memory: the CUDA allocator's peak on GPU; on CPU the growth of the process's peak
resident set (Linux VmHWM, reset through /proc/self/clear_refs; else ru_maxrss growth,
which reads 0 when an earlier peak was higher), after the heap's free pages are given back
(:func:`variantlab.probes.allocator.release_free_memory`), so that memory freed before
the passes cannot serve them without showing.

Compiled (``compile: true``): the passes call the model under ``torch.compile``. Each
pass's first call, which traces and compiles its graph, is timed on its own
(``{pass}_compile_s``: compile plus one call) and is not a warm-up call; the ``warmup``
calls and the timed blocks come after it. ``compiled`` is 1 in every timing run's rows
that was compiled, else 0. The SDPA backend is read from an eager forward.

Busy machine: ``load_start`` / ``load_end`` are the 1-minute load average before the first
and after the last timed call, ``cores`` the CPUs the run may use, and ``busy`` is 1 when
either load is above ``cores`` + 0.5 (:mod:`variantlab.probes.machine`): other work shared
the cores, so the times read slow by an unknown factor; the report says so beside the speed
verdicts it affects.
"""

from __future__ import annotations

import math
import platform
import resource
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import torch
import torch.nn.functional as F
from pydantic import Field, PositiveFloat, PositiveInt
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode

from ..data import sources as datalib
from ..model.build import make_model
from ..model.specs import ModelSpec
from ..model.tasks import Batch, Task, task_for
from ..plugin.registry import Registry
from ..plugin.rows import Row, row
from ..plugin.settings import Device, DType, Strict
from . import flops as flopslib
from . import machine
from .allocator import release_free_memory
from .common import autocast, resolve_device
from .compiled import compile_errors, compile_model

if TYPE_CHECKING:  # imported when a unit is timed: it imports setuptools (0.2 s)
    from torch.utils import benchmark


class TimingSettings(Strict):
    """Forward / forward+backward / optimizer-step times (torch.utils.benchmark)."""

    batch_size: PositiveInt = Field(8, description="rows per timed batch")
    seq_len: PositiveInt = Field(256, description="positions per row")
    passes: list[Literal["forward", "backward", "step"]] = Field(
        ["forward", "backward"], description="what is timed: forward (no grad), backward "
        "(forward + backward), step (backward + AdamW step)")
    dtype: DType = Field("float32", description="autocast dtype; float32: none")
    device: Device = Field("auto", description="auto, cpu, cuda, cuda:N or mps")
    warmup: int = Field(2, ge=0, description="untimed calls before timing")
    repeats: PositiveInt = Field(10, description="timed blocks (median, IQR)")
    peak_flops: PositiveFloat | None = Field(
        None, description="device peak FLOP/s for MFU; default from the built-in table"
    )
    compile: bool = Field(
        False, description="run the model under torch.compile; compile time is timed apart")

BLOCK_S = 0.05  # target duration of one timed block


def pass_fns(model: torch.nn.Module, spec: ModelSpec, task: Task, batch: Batch, dtype: str,
             device: torch.device, passes: list[str]) -> dict[str, Callable[[], None]]:
    """A zero-argument closure per pass; ``step`` owns an AdamW optimizer; losses are
    ``task``'s."""
    inputs = batch.inputs

    def forward() -> None:
        with torch.no_grad(), autocast(dtype, device):
            model(**inputs)

    def backward() -> None:
        model.zero_grad(set_to_none=True)
        with autocast(dtype, device):
            loss = task.loss(spec, model(**inputs), batch)
        loss.backward()

    fns: dict[str, Callable[[], None]] = {}
    for name in passes:
        if name == "forward":
            fns[name] = forward
        elif name == "backward":
            fns[name] = backward
        elif name == "step":
            opt = torch.optim.AdamW(model.parameters(), lr=1e-4)

            def step(opt: torch.optim.Optimizer = opt) -> None:
                backward()
                opt.step()

            fns[name] = step
        else:
            raise ValueError(f"timing: unknown pass {name!r}; use forward, backward or step")
    return fns


def time_fn(fn: Callable[[], None], warmup: int, repeats: int, label: str = "",
            block_s: float = BLOCK_S) -> benchmark.Measurement:
    """Median/IQR-ready measurement of ``fn``: warm-up, then ``repeats`` timed blocks."""
    from torch.utils import benchmark

    timer = benchmark.Timer(stmt="fn()", globals={"fn": fn}, label=label,
                            num_threads=torch.get_num_threads())
    for _ in range(warmup):
        fn()
    # a few single calls, not kept in the results, size the blocks (min: the least noisy)
    estimate = min(timer.timeit(1).mean for _ in range(3))
    number = max(1, math.ceil(block_s / max(estimate, 1e-9))) if estimate < block_s else 1
    raw = [timer.timeit(number).raw_times[0] for _ in range(repeats)]  # block totals
    return benchmark.Measurement(number, raw, timer._task_spec)


def compile_time(fn: Callable[[], None], device: torch.device) -> float:
    """Seconds of ``fn``'s first call under torch.compile (tracing, compiling, one run),
    the accelerator synchronised; a compiler failure is a ``CompileError``."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    t0 = time.perf_counter()
    with compile_errors(True):
        fn()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return time.perf_counter() - t0


class _SDPAWatch(TorchFunctionMode):
    """Counts calls of F.scaled_dot_product_attention."""

    def __init__(self) -> None:
        super().__init__()
        self.calls = 0

    def __torch_function__(self, func, types, args=(), kwargs=None):
        if func is F.scaled_dot_product_attention:
            self.calls += 1
        return func(*args, **(kwargs or {}))


class _KernelWatch(TorchDispatchMode):
    """Records which fused SDPA kernels ran (below autograd, after backend selection)."""

    BACKENDS = {"flash": "flash", "efficient": "efficient", "cudnn": "cudnn"}

    def __init__(self) -> None:
        super().__init__()
        self.fused: list[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = func.overloadpacket.__name__
        if name.startswith("_scaled_dot_product_"):
            for key, backend in self.BACKENDS.items():
                if key in name:
                    self.fused.append(backend)
        return func(*args, **(kwargs or {}))


def sdpa_backend(model: torch.nn.Module, batch: Batch, dtype: str, device: torch.device) -> str:
    """The SDPA backend(s) one forward actually used: flash / efficient / cudnn / math;
    ``n/a`` when the model never calls scaled_dot_product_attention (naive attention)."""
    with torch.no_grad(), autocast(dtype, device), _SDPAWatch() as calls, _KernelWatch() as k:
        model(**batch.inputs)
    if calls.calls == 0:
        return "n/a"
    used = set(k.fused)
    if len(k.fused) < calls.calls:
        used.add("math")
    return "+".join(sorted(used))


def _vm_kb(field: str) -> int | None:
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1])
    except OSError:
        return None
    return None


class PeakMemory:
    """Peak memory over a region: CUDA allocator peak, or CPU resident-set growth."""

    def __init__(self, device: torch.device) -> None:
        self.device = device

    def __enter__(self) -> PeakMemory:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
            torch.cuda.reset_peak_memory_stats(self.device)
            self.base = 0
            return self
        self.hwm = False
        release_free_memory()  # memory freed before the region must not serve it unseen
        try:
            with open("/proc/self/clear_refs", "w") as f:
                f.write("5")  # resets VmHWM to the current RSS
            self.hwm = _vm_kb("VmHWM") is not None
        except OSError:
            pass
        self.base = (_vm_kb("VmRSS") if self.hwm else None) or \
            resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        return self

    def __exit__(self, *exc: Any) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
            self.bytes = float(torch.cuda.max_memory_allocated(self.device))
        else:
            peak = _vm_kb("VmHWM") if self.hwm else None
            peak = peak or resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
            self.bytes = float(max(0, peak - self.base) * 1024)


def device_name(device: torch.device) -> str:
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    if device.type == "cpu":
        try:
            with open("/proc/cpuinfo") as f:
                for line in f:
                    if line.startswith("model name"):
                        return f"cpu: {line.split(':', 1)[1].strip()}"
        except OSError:
            pass
        return f"cpu: {platform.processor() or platform.machine()}"
    return str(device)


def run(
    spec: ModelSpec, settings: TimingSettings, *, seed: int, data: Any = None,
    base_dir: Path | str = ".", device: str | None = None, registry: Registry,
) -> list[Row]:
    dev = resolve_device(device or settings.device)
    model = make_model(spec, seed, registry, dev)
    model.train()
    batch = datalib.batches(data, spec, settings.batch_size, settings.seq_len, 1, seed=seed,
                            registry=registry, base_dir=base_dir)[0].to(dev)
    backend = sdpa_backend(model, batch, settings.dtype, dev)
    fns = pass_fns(compile_model(model, settings.compile), spec, task_for(spec, registry), batch,
                   settings.dtype, dev, list(settings.passes))
    name = device_name(dev)

    # attention layers (self- and cross-), each 12*H*Q*T FLOPs per token; none in mlp
    train_flops = flopslib.model_flops_per_token(model, spec, settings.seq_len)
    peak = settings.peak_flops
    if peak is None and dev.type == "cuda":
        peak = flopslib.peak_flops(name, settings.dtype)

    rows: list[Row] = []
    load_start = machine.load()
    if settings.compile:  # each pass's compile, timed apart before the measured passes
        for pass_name, fn in fns.items():
            rows.append(row("timing", f"{pass_name}_compile_s", compile_time(fn, dev), unit="s"))
    with PeakMemory(dev) as mem:
        for pass_name, fn in fns.items():
            with compile_errors(settings.compile):
                m = time_fn(fn, settings.warmup, settings.repeats, label=pass_name)
            tok_s = batch.n_tokens / m.median
            rows += [
                row("timing", f"{pass_name}_median_s", m.median, unit="s"),
                row("timing", f"{pass_name}_iqr_s", m.iqr, unit="s"),
                row("timing", f"{pass_name}_tokens_per_s", tok_s, unit="tokens/s"),
            ]
            if dev.type == "cuda":
                achieved = tok_s * flopslib.pass_flops_per_token(train_flops, pass_name)
                rows.append(row("timing", f"{pass_name}_flops_per_s", achieved, unit="FLOP/s"))
                if peak:
                    rows.append(row("timing", f"{pass_name}_mfu", achieved / peak, unit="ratio"))
    rows.append(row("timing", "peak_memory_bytes", mem.bytes, unit="bytes"))
    load_end, n_cores = machine.load(), machine.cores()
    rows += [row("timing", "load_start", load_start, unit="load"),
             row("timing", "load_end", load_end, unit="load"),
             row("timing", "cores", float(n_cores), unit="count"),
             row("timing", "busy", float(machine.busy(load_start, load_end, n_cores)))]
    rows.append(row("timing", "compiled", float(settings.compile)))
    rows.append(row("timing", "flops_per_token", train_flops, unit="FLOP"))
    if peak:
        rows.append(row("timing", "peak_flops", peak, unit="FLOP/s"))
    info = {
        "device": name, "dtype": settings.dtype, "torch_version": torch.__version__,
        "sdpa_backend": backend, "flop_formula": flopslib.FLOP_FORMULA,
    }
    rows += [row("timing", k, math.nan, scope="info", name=v) for k, v in info.items()]
    model.zero_grad(set_to_none=True)
    return rows
