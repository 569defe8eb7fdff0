"""timing probe, exactly: every number from a fake clock, fake timer, fake /proc or known
inputs (never a timed assertion). The CUDA branches run on a fake device object."""

import io
import itertools
import math
import os
import subprocess
import sys
from types import SimpleNamespace as NS

import pytest
import torch
import torch.nn.functional as F
from conftest import ROOT
from pydantic import ValidationError
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.utils import benchmark

import variantlab as vl
from variantlab.probes import machine, run_probe, timing
from variantlab.probes.compiled import CompileError

REG = vl.get_registry()
SETTINGS = {"batch_size": 2, "seq_len": 16, "warmup": 1, "repeats": 3,
            "passes": ["forward", "backward"], "device": "cpu"}
# tiny (conftest): 6 * 27,328 non-embedding parameters + 12 * L2 * H4 * Q8 * T16
TRAIN_FLOPS = 6 * (30_400 - 64 * 32 - 32 * 32) + 12 * 2 * 4 * 8 * 16  # 176,256


def test_defaults():
    s = timing.TimingSettings()
    assert (s.batch_size, s.seq_len, s.passes, s.dtype, s.device) == (
        8, 256, ["forward", "backward"], "float32", "auto")
    assert (s.warmup, s.repeats, s.peak_flops, s.compile) == (2, 10, None, False)
    assert timing.TimingSettings(warmup=0).warmup == 0
    with pytest.raises(ValidationError):
        timing.TimingSettings(warmup=-1)
    assert timing.BLOCK_S == 0.05


# --- pass_fns ---------------------------------------------------------------------------

class Lin(torch.nn.Module):
    """y = w.x + b, with a parameter no pass uses."""

    def __init__(self) -> None:
        super().__init__()
        self.w = torch.nn.Parameter(torch.tensor([0.5, -1.0, 2.0]))
        self.b = torch.nn.Parameter(torch.tensor(0.25))
        self.unused = torch.nn.Parameter(torch.zeros(2))
        self.grad_enabled: list[bool] = []

    def forward(self, x):
        self.grad_enabled.append(torch.is_grad_enabled())
        return (self.w * x).sum() + self.b


SUM_TASK = NS(loss=lambda spec, out, batch: out * 2.0)  # d loss / d w = 2x, / d b = 2
BATCH = NS(inputs={"x": torch.tensor([1.0, -2.0, 3.0])})


def fns_of(model, passes):
    return timing.pass_fns(model, None, SUM_TASK, BATCH, "float32", torch.device("cpu"), passes)


def test_each_pass_is_its_closure_in_the_order_asked():
    model = Lin()
    fns = fns_of(model, ["step", "forward"])
    assert list(fns) == ["step", "forward"]
    fns["forward"]()
    assert model.grad_enabled == [False]  # no_grad: inference cost
    assert model.w.grad is None
    for unknown in ("sideways", "apple", "zzz"):  # between, before and after the names
        with pytest.raises(ValueError, match=f"unknown pass '{unknown}'; use forward, back"):
            fns_of(model, ["forward", unknown])


def test_backward_frees_the_last_gradients_before_each_call():
    model = Lin()
    model.unused.grad = torch.ones(2)
    backward = fns_of(model, ["backward"])["backward"]
    backward()
    backward()  # not accumulated: zeroed (freed) first
    assert model.grad_enabled == [True, True]
    assert model.w.grad.tolist() == [2.0, -4.0, 6.0]
    assert model.b.grad.item() == 2.0
    assert model.unused.grad is None  # set to None, not zeros


def test_step_is_backward_then_one_adamw_step_at_lr_1e_4():
    model = Lin()
    step = fns_of(model, ["step"])["step"]
    step()
    # AdamW's first step: p * (1 - lr * 0.01), then - lr * g / (|g| + 1e-8) (bias-corrected
    # moments are g and g^2)
    lr, wd = 1e-4, 0.01
    for p0, g, p in zip([0.5, -1.0, 2.0], [2.0, -4.0, 6.0], model.w.tolist()):
        assert p == pytest.approx(p0 * (1 - lr * wd) - lr * g / (abs(g) + 1e-8), rel=1e-6)
    assert model.b.item() == pytest.approx(0.25 * (1 - lr * wd) - lr, rel=1e-6)
    assert model.unused.tolist() == [0.0, 0.0]  # no gradient, not stepped


# --- time_fn, with a fake timer ---------------------------------------------------------

class FakeTimer(benchmark.Timer):
    """A real Timer whose timeit returns scripted times (and never calls ``fn``)."""

    made: list["FakeTimer"] = []
    estimates: list[float] = []
    blocks: list[float] = []

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.kwargs = kwargs
        self.numbers: list[int] = []
        FakeTimer.made.append(self)

    def timeit(self, number=1000000):
        self.numbers.append(number)
        if number == 1 and FakeTimer.estimates:
            t = FakeTimer.estimates.pop(0)
            return NS(mean=t, raw_times=[t])
        total = FakeTimer.blocks.pop(0)
        return NS(mean=total / number, raw_times=[total])


@pytest.fixture
def fake_timer(monkeypatch):
    FakeTimer.made = []
    monkeypatch.setattr(benchmark, "Timer", FakeTimer)
    return FakeTimer


def test_blocks_sized_from_the_least_of_three_single_calls(fake_timer):
    calls = []
    fake_timer.estimates = [0.02, 0.0125, 0.03]
    fake_timer.blocks = [0.04, 0.08, 0.12, 0.16, 0.2]  # per call 0.01 ... 0.05
    m = timing.time_fn(lambda: calls.append(1), warmup=3, repeats=5, label="fwd",
                       block_s=0.05)
    assert len(calls) == 3  # the warm-up calls
    (timer,) = fake_timer.made
    assert timer.kwargs["stmt"] == "fn()" and timer.kwargs["label"] == "fwd"
    assert timer.kwargs["num_threads"] == torch.get_num_threads()
    assert timer.numbers == [1, 1, 1, 4, 4, 4, 4, 4]  # 0.05 / 0.0125 = 4 calls a block
    assert m.number_per_run == 4
    assert m.raw_times == [0.04, 0.08, 0.12, 0.16, 0.2]
    assert m.median == pytest.approx(0.03)
    assert m.iqr == pytest.approx(0.02)
    assert m.label == "fwd"


@pytest.mark.parametrize(("estimate", "block_s", "number"), [
    (0.0, 5e-10, 1),  # a block shorter than the 1 ns floor: one call
    (0.0125, None, 4),  # the default block, BLOCK_S = 0.05
    (0.04, 0.05, 2),  # ceil(1.25)
    (0.05, 0.05, 1),  # a call as long as a block: one call a block
    (0.1, 0.05, 1),
    (0.0, 0.05, 50_000_000),  # a zero estimate is taken as 1 ns
])
def test_calls_per_block(fake_timer, estimate, block_s, number):
    fake_timer.estimates = [estimate] * 3
    fake_timer.blocks = [1.0, 2.0]
    kwargs = {} if block_s is None else {"block_s": block_s}
    m = timing.time_fn(lambda: None, warmup=0, repeats=2, **kwargs)
    assert fake_timer.made[0].numbers == [1, 1, 1, number, number]
    assert m.number_per_run == number
    assert m.raw_times == [1.0, 2.0]


# --- compile_time, with a fake clock ----------------------------------------------------

@pytest.mark.parametrize("kind", ["cpu", "cuda", "mps"])
def test_compile_time_is_the_first_call_between_synchronised_clock_reads(monkeypatch, kind):
    events = []
    clock = iter([10.0, 12.5])

    def perf_counter():
        events.append("clock")
        return next(clock)

    monkeypatch.setattr(timing, "time", NS(perf_counter=perf_counter))
    monkeypatch.setattr(torch.cuda, "synchronize", lambda device=None: events.append("sync"))
    assert timing.compile_time(lambda: events.append("fn"), torch.device(kind)) == 2.5
    if kind == "cuda":
        assert events == ["sync", "clock", "fn", "sync", "clock"]
    else:
        assert events == ["clock", "fn", "clock"]


def test_a_compiler_failure_during_the_first_call_is_a_compile_error():
    from torch._dynamo.exc import TorchDynamoException

    def fail():
        raise TorchDynamoException("graph break")

    with pytest.raises(CompileError, match="graph break"):
        timing.compile_time(fail, torch.device("cpu"))


# --- the SDPA backend -------------------------------------------------------------------

class TwoAttentions(torch.nn.Module):
    def __init__(self, second_math: bool | None) -> None:
        super().__init__()
        self.second_math = second_math  # None: only one attention call

    def forward(self, x):
        a = F.scaled_dot_product_attention(x, x, x)
        if self.second_math is None:
            return a
        if self.second_math:
            with sdpa_kernel(SDPBackend.MATH):
                return F.scaled_dot_product_attention(a, a, a)
        return F.scaled_dot_product_attention(a, a, a)


class DirectKernel(torch.nn.Module):
    """One F.scaled_dot_product_attention call, and the CPU's fused kernel called directly."""

    def forward(self, x):
        a = F.scaled_dot_product_attention(x, x, x)
        return torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(a, a, a)[0]


class NoAttention(torch.nn.Module):
    def forward(self, x):
        return x.softmax(-1)


@pytest.mark.parametrize(("model", "backend"), [
    (NoAttention(), "n/a"),
    (TwoAttentions(None), "flash"),  # the CPU's fused kernel
    (TwoAttentions(False), "flash"),  # both calls fused
    (TwoAttentions(True), "flash+math"),  # one of two calls not fused
    (DirectKernel(), "flash"),  # more fused kernels than sdpa calls: none was math
])
def test_sdpa_backend_counts_fused_kernels_against_calls(model, backend):
    batch = NS(inputs={"x": torch.randn(1, 2, 4, 8)})
    assert timing.sdpa_backend(model, batch, "float32", torch.device("cpu")) == backend


def test_sdpa_backend_all_math():
    class OneMath(torch.nn.Module):
        def forward(self, x):
            with sdpa_kernel(SDPBackend.MATH):
                return F.scaled_dot_product_attention(x, x, x)

    batch = NS(inputs={"x": torch.randn(1, 2, 4, 8)})
    assert timing.sdpa_backend(OneMath(), batch, "float32", torch.device("cpu")) == "math"


def test_kernel_watch_names_each_fused_kernel():
    class Op:
        def __init__(self, name):
            self.overloadpacket = NS(__name__=name)

        def __call__(self, *args, **kwargs):
            return (args, kwargs)

    watch = timing._KernelWatch()
    for name in ["_scaled_dot_product_efficient_attention", "mm",
                 "_scaled_dot_product_cudnn_attention", "flash_mm",
                 "_scaled_dot_product_flash_attention_for_cpu"]:
        assert watch.__torch_dispatch__(Op(name), (), (1,), {"k": 2}) == ((1,), {"k": 2})
    assert watch.__torch_dispatch__(Op("mm"), (), (3,)) == ((3,), {})
    assert watch.fused == ["efficient", "cudnn", "flash"]


# --- /proc and the peak memory ----------------------------------------------------------

def fake_proc(monkeypatch, files, written=None):
    """``open`` in timing reads ``files[path]`` (a list: one text per open) or raises."""

    def fake_open(path, mode="r"):
        if "w" in mode:
            if written is None:
                raise PermissionError(path)
            return _Writer(written, path)
        if path not in files or not files[path]:
            raise FileNotFoundError(path)
        texts = files[path]
        return io.StringIO(texts.pop(0) if len(texts) > 1 else texts[0])

    monkeypatch.setattr(timing, "open", fake_open, raising=False)


class _Writer(io.StringIO):
    def __init__(self, log, path):
        super().__init__()
        self.log, self.path = log, path

    def __exit__(self, *exc):
        self.log.append((self.path, self.getvalue()))
        return super().__exit__(*exc)


STATUS = "Name:\tpython\nVmHWMX:\t7 kB\nVmHWM:\t  1500 kB\nVmRSS:\t  1000 kB\n"


def test_vm_kb_reads_the_field_named_exactly(monkeypatch):
    fake_proc(monkeypatch, {"/proc/self/status": [STATUS]})
    assert timing._vm_kb("VmHWM") == 1500
    assert timing._vm_kb("VmRSS") == 1000
    assert timing._vm_kb("VmRS") is None
    assert timing._vm_kb("VmSwap") is None
    fake_proc(monkeypatch, {})
    assert timing._vm_kb("VmHWM") is None


def rusage(monkeypatch, values):
    seq = iter(values)
    monkeypatch.setattr(timing, "resource", NS(
        RUSAGE_SELF=0, getrusage=lambda who: NS(ru_maxrss=next(seq))))


def test_peak_memory_on_cpu_is_the_growth_of_the_reset_high_water_mark(monkeypatch):
    written = []
    fake_proc(monkeypatch, {"/proc/self/status": [
        "VmHWM:\t900 kB\nVmRSS:\t1000 kB\n",  # checks VmHWM is there
        "VmHWM:\t900 kB\nVmRSS:\t1000 kB\n",  # base
        "VmHWM:\t1500 kB\nVmRSS:\t1100 kB\n"]}, written)  # peak
    rusage(monkeypatch, [99_999])
    with timing.PeakMemory(torch.device("cpu")) as mem:
        assert written == [("/proc/self/clear_refs", "5")]
    assert mem.hwm is True and mem.base == 1000
    assert mem.bytes == 500 * 1024


def test_peak_memory_falls_back_to_the_max_rss_growth(monkeypatch):
    fake_proc(monkeypatch, {}, written=None)  # clear_refs refused, no /proc/self/status
    rusage(monkeypatch, [2000, 2600])
    with timing.PeakMemory(torch.device("cpu")) as mem:
        pass
    assert mem.hwm is False and mem.base == 2000
    assert mem.bytes == 600 * 1024
    rusage(monkeypatch, [2000, 2000])  # an earlier, higher peak: no growth seen
    with timing.PeakMemory(torch.device("cpu")) as mem:
        pass
    assert mem.bytes == 0.0


def test_peak_memory_without_vmhwm_or_below_the_base(monkeypatch):
    written = []
    fake_proc(monkeypatch, {"/proc/self/status": ["VmRSS:\t1000 kB\n"]}, written)
    rusage(monkeypatch, [3000, 3100])
    with timing.PeakMemory(torch.device("cpu")) as mem:
        pass
    assert mem.hwm is False and mem.base == 3000 and mem.bytes == 100 * 1024
    fake_proc(monkeypatch, {"/proc/self/status": [
        "VmHWM:\t1\nVmRSS:\t1000 kB\n", "VmHWM:\t1\nVmRSS:\t1000 kB\n",
        "VmHWM:\t800 kB\n"]}, written)
    rusage(monkeypatch, [5000])
    with timing.PeakMemory(torch.device("cpu")) as mem:
        pass
    assert mem.hwm is True and mem.base == 1000 and mem.bytes == 0.0  # never negative


def fake_cuda(monkeypatch, events, peak=12345, name="NVIDIA H100 80GB HBM3"):
    monkeypatch.setattr(torch.cuda, "synchronize", lambda d=None: events.append("sync"))
    monkeypatch.setattr(torch.cuda, "reset_peak_memory_stats",
                        lambda d=None: events.append("reset"))
    monkeypatch.setattr(torch.cuda, "max_memory_allocated", lambda d=None: peak)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda d=None: name)


def test_peak_memory_off_cuda_reads_the_resident_set(monkeypatch):
    events = []
    fake_cuda(monkeypatch, events)
    fake_proc(monkeypatch, {}, written=None)
    rusage(monkeypatch, [100, 300])
    with timing.PeakMemory(torch.device("mps")) as mem:
        pass
    assert events == [] and mem.bytes == 200 * 1024


def test_importing_the_module_does_not_import_the_benchmark_timer():
    """torch.utils.benchmark imports setuptools (0.2 s): only a timed unit pays for it."""
    code = ("import sys, variantlab.probes.timing; "
            "print('torch.utils.benchmark' in sys.modules)")
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         env=env, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "False"


def test_peak_memory_on_cuda_is_the_allocator_peak(monkeypatch):
    events = []
    fake_cuda(monkeypatch, events)
    with timing.PeakMemory(torch.device("cuda")) as mem:
        assert events == ["sync", "reset"]
    assert events == ["sync", "reset", "sync"]
    assert mem.base == 0 and mem.bytes == 12345.0


def test_device_name(monkeypatch):
    fake_cuda(monkeypatch, [], name="NVIDIA A100-SXM4-40GB")
    assert timing.device_name(torch.device("cuda")) == "NVIDIA A100-SXM4-40GB"
    fake_proc(monkeypatch, {"/proc/cpuinfo": [
        "processor\t: 0\nmodel name\t: Fake CPU @ 2.0GHz: v2  \nmodel name\t: other\n"]})
    assert timing.device_name(torch.device("cpu")) == "cpu: Fake CPU @ 2.0GHz: v2"
    fake_proc(monkeypatch, {})
    monkeypatch.setattr(timing.platform, "processor", lambda: "")
    monkeypatch.setattr(timing.platform, "machine", lambda: "riscv64")
    assert timing.device_name(torch.device("cpu")) == "cpu: riscv64"
    monkeypatch.setattr(timing.platform, "processor", lambda: "armv9")
    assert timing.device_name(torch.device("cpu")) == "cpu: armv9"
    fake_proc(monkeypatch, {"/proc/cpuinfo": ["processor\t: 0\n"]})
    assert timing.device_name(torch.device("cpu")) == "cpu: armv9"
    assert timing.device_name(torch.device("meta")) == "meta"


# --- run(): the rows from known times, loads and FLOPs -----------------------------------

def fake_run(monkeypatch, median=0.25, iqr=0.0625, loads=(3.0, 5.0), cores=4):
    """time_fn calls each pass once and returns the given median / IQR; the model built
    is kept in the returned dict."""
    seen: dict = {"passes": [], "compile_errors": []}
    real_make = timing.make_model

    def make_model(spec, seed, registry, dev):
        seen["model"] = real_make(spec, seed, registry, torch.device("cpu"))
        return seen["model"]

    def time_fn(fn, warmup, repeats, label=""):
        seen["passes"].append((label, warmup, repeats))
        fn()
        return NS(median=median, iqr=iqr)

    load = itertools.cycle(loads)  # start, end; again for a second run
    monkeypatch.setattr(timing, "make_model", make_model)
    monkeypatch.setattr(timing, "time_fn", time_fn)
    monkeypatch.setattr(timing, "machine", NS(load=lambda: next(load), cores=lambda: cores,
                                              busy=machine.busy))
    return seen


def fake_device(monkeypatch, kind):
    """``run`` resolves the device to an object of type ``kind``; the model and its batch
    stay on the CPU."""
    device = NS(type=kind)
    monkeypatch.setattr(timing, "resolve_device", lambda requested: device)
    real_batches = timing.datalib.batches
    monkeypatch.setattr(timing, "datalib", NS(batches=lambda *a, **k: [
        NS(to=lambda dev: real_batches(*a, **k)[0])]))
    return device


def model_rows(rows):
    return {r["metric"]: r["value"] for r in rows if r["scope"] == "model"}


def test_cpu_rows_exactly(monkeypatch, tiny):
    seen = fake_run(monkeypatch)
    drawn = []
    real_batches = timing.datalib.batches
    monkeypatch.setattr(timing, "datalib", NS(batches=lambda *a, **k: drawn.append(a[4]) or
                                              real_batches(*a, **k)))
    rows = run_probe("timing", tiny, {**SETTINGS, "peak_flops": 2e12}, seed=0, registry=REG)
    assert seen["passes"] == [("forward", 1, 3), ("backward", 1, 3)]
    assert drawn == [1]  # one batch, timed again and again
    m = model_rows(rows)
    for p in ("forward", "backward"):
        assert m[f"{p}_median_s"] == 0.25
        assert m[f"{p}_iqr_s"] == 0.0625
        assert m[f"{p}_tokens_per_s"] == 128.0  # 2 x 16 tokens / 0.25 s
        assert f"{p}_flops_per_s" not in m and f"{p}_mfu" not in m  # CUDA only
        assert f"{p}_compile_s" not in m
    assert (m["load_start"], m["load_end"], m["cores"], m["busy"]) == (3.0, 5.0, 4.0, 1.0)
    assert m["compiled"] == 0.0
    assert m["flops_per_token"] == TRAIN_FLOPS
    assert m["peak_flops"] == 2e12  # given, shown even on a CPU
    assert m["peak_memory_bytes"] >= 0
    assert all(p.grad is None for p in seen["model"].parameters())  # gradients freed


def test_not_busy_and_no_peak_on_cpu(monkeypatch, tiny):
    fake_run(monkeypatch, loads=(4.5, 1.0))
    m = model_rows(run_probe("timing", tiny, SETTINGS, seed=0, registry=REG))
    assert (m["load_start"], m["load_end"], m["busy"]) == (4.5, 1.0, 0.0)
    assert "peak_flops" not in m


@pytest.mark.parametrize("compiled", [False, True])
def test_rows_on_a_fake_cuda_device(monkeypatch, tiny, compiled):
    """The CUDA branch's arithmetic: the model runs on the CPU, the device reads as CUDA."""
    seen = fake_run(monkeypatch, median=0.5, iqr=0.125)
    events: list[str] = []
    fake_cuda(monkeypatch, events, peak=4096)
    cuda = fake_device(monkeypatch, "cuda")
    monkeypatch.setattr(timing, "compile_model", lambda model, enabled: model)
    compile_calls = []
    monkeypatch.setattr(timing, "compile_time",
                        lambda fn, dev: compile_calls.append(dev) or 1.5)
    settings = {**SETTINGS, "device": "cuda", "compile": compiled}
    m = model_rows(run_probe("timing", tiny, settings, seed=0, registry=REG))
    # no peak given: the table's H100 SXM peak for float32 (TF32 unless "highest")
    peak = 66.9e12 if torch.get_float32_matmul_precision() == "highest" else 494.7e12
    assert m["peak_flops"] == peak
    tok_s = 32 / 0.5
    for p, per_token in (("forward", TRAIN_FLOPS / 3), ("backward", TRAIN_FLOPS)):
        assert m[f"{p}_tokens_per_s"] == tok_s
        assert m[f"{p}_flops_per_s"] == pytest.approx(tok_s * per_token, rel=1e-12)
        assert m[f"{p}_mfu"] == pytest.approx(tok_s * per_token / peak, rel=1e-12)
        assert (m.get(f"{p}_compile_s")) == (1.5 if compiled else None)
    assert compile_calls == ([cuda, cuda] if compiled else [])
    assert m["compiled"] == float(compiled)
    assert m["peak_memory_bytes"] == 4096.0
    assert len(seen["passes"]) == 2
    given = model_rows(run_probe("timing", tiny, {**settings, "peak_flops": 1e12}, seed=0,
                                 registry=REG)) if not compiled else None
    if given is not None:
        assert given["peak_flops"] == 1e12
        assert given["backward_mfu"] == pytest.approx(tok_s * TRAIN_FLOPS / 1e12, rel=1e-12)


def test_no_mfu_on_a_cuda_device_missing_from_the_table(monkeypatch, tiny):
    fake_run(monkeypatch, median=0.5)
    fake_cuda(monkeypatch, [], name="Some Unknown GPU")
    fake_device(monkeypatch, "cuda")
    m = model_rows(run_probe("timing", tiny, {**SETTINGS, "device": "cuda"}, seed=0,
                             registry=REG))
    assert m["backward_flops_per_s"] == pytest.approx(64 * TRAIN_FLOPS, rel=1e-12)
    assert "backward_mfu" not in m and "peak_flops" not in m
    assert not math.isnan(m["forward_flops_per_s"])


def test_no_peak_from_the_table_off_cuda_even_for_a_matching_name(monkeypatch, tiny):
    """A CPU named like a GPU of the table (the lookup is by substring) gets no peak: the
    table is CUDA peaks."""
    fake_run(monkeypatch)
    fake_proc(monkeypatch, {"/proc/cpuinfo": ["model name\t: H100 emulator\n"]})
    m = model_rows(run_probe("timing", tiny, SETTINGS, seed=0, registry=REG))
    assert "peak_flops" not in m and "forward_flops_per_s" not in m


def test_no_flops_rows_on_another_accelerator(monkeypatch, tiny):
    """An MPS device (faked; the model runs on the CPU) times like the CPU: no FLOP/s rows."""
    fake_run(monkeypatch, median=0.5)
    fake_device(monkeypatch, "mps")
    m = model_rows(run_probe("timing", tiny, {**SETTINGS, "peak_flops": 1e12}, seed=0,
                             registry=REG))
    assert m["backward_tokens_per_s"] == 64.0
    assert not any(k.endswith(("_flops_per_s", "_mfu")) for k in m)
    assert m["peak_flops"] == 1e12
