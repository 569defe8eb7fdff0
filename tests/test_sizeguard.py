"""Size guard (issue 10, item 6): memory estimated on the meta device, extrapolated in
n_layers, refused before anything is allocated; and the pre-compute checks' CLI output."""

from __future__ import annotations

import re
import resource
import time
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner
from conftest import TINY

from variantlab import build_registry, hookimpl
from variantlab.cli.main import main
from variantlab.errors import PluginLoadError
from variantlab.model.build import build_model
from variantlab.model.specs import parse_model_spec
from variantlab.model.tasks import task_for
from variantlab.plugin.registry import get_registry
from variantlab.probes.gradients import GradientsSettings
from variantlab.probes.params import ParamsSettings
from variantlab.probes.timing import TimingSettings
from variantlab.probes.training import TrainingSettings
from variantlab.sweep import metarun, sizeguard
from variantlab.sweep.sizeguard import (
    ROW_BYTES,
    _meta_cost,
    available_bytes,
    footprint,
    largest_fit,
    model_cost,
    refusal,
)

SDPA = {"attention": {"kind": "mha", "impl": "sdpa"}, "positional": "sinusoidal"}


def spec_of(**kw):
    return parse_model_spec({**TINY, **kw}, get_registry())


@pytest.mark.parametrize("family", ["gpt", "encoder", "decoder", "encoder_decoder", "block"])
@pytest.mark.parametrize("extra", [{}, SDPA], ids=["naive", "sdpa"])
def test_extrapolation_equals_a_full_meta_build(family, extra):
    registry = get_registry()
    for n in (3, 7):
        spec = spec_of(family=family, n_layers=n, **extra)
        assert model_cost(spec, registry, (2, 8)) == _meta_cost(spec, registry, (2, 8))


@pytest.mark.parametrize("family", ["gpt", "encoder_decoder"])
def test_costs_without_a_batch_reuse_a_batchs_builds(monkeypatch, family):
    """A probe without a batch beside one with a batch builds nothing more: its costs are
    the batch's builds less activations and batch, equal to builds of their own."""
    registry, spec = get_registry(), spec_of(family=family, n_layers=3)
    own = (_meta_cost(spec.model_copy(update={"n_layers": 1}), registry, None),
           _meta_cost(spec.model_copy(update={"n_layers": 2}), registry, None))
    monkeypatch.setattr(sizeguard, "_CACHE", {})
    built = []
    real = sizeguard._meta_cost
    monkeypatch.setattr(sizeguard, "_meta_cost", lambda *a: built.append(a[2]) or real(*a))
    with_batch = sizeguard.layer_costs(spec, registry, (2, 8))
    assert with_batch[1].activation_bytes > 0 and built == [(2, 8), (2, 8)]
    assert sizeguard.layer_costs(spec, registry) == own
    assert built == [(2, 8), (2, 8)]  # nothing more built


def test_meta_counts_equal_a_real_build():
    spec = spec_of(n_layers=3, **SDPA)
    model = build_model(spec, get_registry())
    cost = model_cost(spec, get_registry())
    assert cost.params == sum(p.numel() for p in model.parameters()) == 41_984
    assert cost.param_bytes == 4 * cost.params
    assert cost.buffer_bytes == sum(b.numel() * b.element_size() for b in model.buffers())


def test_activations_grow_with_the_batch_and_the_depth():
    registry = get_registry()
    a = model_cost(spec_of(), registry, (2, 8)).activation_bytes
    double = model_cost(spec_of(), registry, (4, 8)).activation_bytes
    assert 2 * a - 1024 < double <= 2 * a  # linear in batch_size, up to a few small tensors
    one = model_cost(spec_of(n_layers=1), registry, (2, 8)).activation_bytes
    four = model_cost(spec_of(n_layers=4), registry, (2, 8)).activation_bytes
    assert 0 < one < a < four
    assert four - a == 2 * (a - one)  # linear in n_layers


def test_each_probe_counts_what_it_keeps():
    spec, registry = spec_of(), get_registry()
    p = model_cost(spec, registry)
    params = footprint(spec, registry, "params", ParamsSettings(), "cpu")
    assert params.total == p.param_bytes + p.buffer_bytes and params.activation_bytes == 0
    train = footprint(spec, registry, "training", TrainingSettings(batch_size=2, seq_len=8), "cpu")
    act = model_cost(spec, registry, (2, 8)).activation_bytes
    batch = 2 * 8 * 8 * 2  # int64 inputs and targets, (2, 8) each
    # the step's batch, 200 steps' rows, and the validation and test scoring sets: 65,536
    # targets each (HELD_TOKENS), in batches like the step's (16 targets)
    held = batch + 200 * 2 * ROW_BYTES + 2 * batch * 65_536 // 16
    assert train.eval_bytes == 2 * batch * 65_536 // 16
    assert train.total == 2 * p.param_bytes + 8 * p.params + p.buffer_bytes + act + held
    grads = footprint(spec, registry, "gradients", GradientsSettings(batch_size=2, seq_len=8),
                      "cpu")
    n = GradientsSettings().batches
    assert grads.total == 2 * p.param_bytes + p.buffer_bytes + act + n * batch
    fwd = footprint(spec, registry, "timing",
                    TimingSettings(batch_size=2, seq_len=8, passes=["forward"]), "cpu")
    assert fwd.grad_bytes == fwd.optimizer_bytes == 0
    step = footprint(spec, registry, "timing",
                     TimingSettings(batch_size=2, seq_len=8, passes=["step"]), "cpu")
    assert step.optimizer_bytes == 8 * p.params


def fits(spec, settings, available):
    return footprint(spec, get_registry(), "training", settings, "cpu").total <= available


def test_largest_batch_size_that_fits_is_exact():
    spec, registry = spec_of(), get_registry()
    settings = TrainingSettings(batch_size=64, seq_len=8)
    small = footprint(spec, registry, "training", settings.model_copy(update={"batch_size": 5}),
                      "cpu").total
    available = small + 100
    fp = footprint(spec, registry, "training", settings, "cpu")
    assert largest_fit(spec, registry, fp, available, settings) == ("batch_size", 5)
    assert fits(spec, settings.model_copy(update={"batch_size": 5}), available)
    assert not fits(spec, settings.model_copy(update={"batch_size": 6}), available)


def test_largest_n_layers_then_vocab_size_that_fits():
    registry = get_registry()
    settings = TrainingSettings(batch_size=1, seq_len=8)
    deep = spec_of(n_layers=100_000)
    at = lambda s: footprint(s, registry, "training", settings, "cpu").total  # noqa: E731
    available = at(deep.model_copy(update={"n_layers": 37})) + 10
    field, n = largest_fit(deep, registry, footprint(deep, registry, "training", settings, "cpu"),
                           available, settings)
    assert (field, n) == ("n_layers", 37)
    wide = spec_of(vocab_size=10**9, n_layers=1)
    available = at(wide.model_copy(update={"vocab_size": 5000})) + 10
    field, v = largest_fit(wide, registry, footprint(wide, registry, "training", settings, "cpu"),
                           available, settings)
    assert field == "vocab_size" and 4990 <= v <= 5000
    assert at(wide.model_copy(update={"vocab_size": v})) <= available
    assert at(wide.model_copy(update={"vocab_size": v + 20})) > available


def test_refusal_names_estimate_and_fit_and_is_none_when_memory_unknown():
    spec, registry = spec_of(vocab_size=10**9), get_registry()
    settings = TrainingSettings(batch_size=2, seq_len=8)
    field, message = refusal(spec, registry, "training", settings, "cpu", lambda d: 2**30)
    assert field == "vocab_size"
    assert "training needs about 1.1 TiB (parameters 238.4 GiB" in message
    assert "cpu has 1.0 GiB available; the largest vocab_size that fits is" in message
    assert refusal(spec, registry, "training", settings, "mps", lambda d: None) is None
    assert refusal(spec_of(), registry, "training", settings, "cpu", lambda d: 2**30) is None


def test_no_estimate_no_refusal_when_meta_fails(monkeypatch):
    import variantlab.sweep.sizeguard as sg
    from variantlab.cli.fmt import memory_lines

    def fails(*args):
        raise RuntimeError("Tensor.item() cannot be called on meta tensors")

    monkeypatch.setattr(sg, "_meta_cost_unguarded", fails)
    monkeypatch.setattr(sg, "_CACHE", {})
    spec, settings = spec_of(vocab_size=10**9), TrainingSettings(batch_size=2, seq_len=8)
    assert refusal(spec, get_registry(), "training", settings, "cpu", lambda d: 2**30) is None
    assert memory_lines(spec, get_registry(), None) == [
        "memory: no estimate (cannot estimate on the meta device: RuntimeError: Tensor.item() "
        "cannot be called on meta tensors)"]


def test_available_bytes_reads_memavailable(tmp_path):
    info = tmp_path / "meminfo"
    info.write_text("MemTotal:  2048 kB\nMemFree:  100 kB\nMemAvailable:  1500 kB\n")
    assert available_bytes("cpu", info) == 1500 * 1024
    assert available_bytes("cpu", tmp_path / "missing", cgroup=tmp_path / "none") is None \
        or resource.getrlimit(resource.RLIMIT_AS)[0] != resource.RLIM_INFINITY
    assert available_bytes("mps") is None


# -- through the command -------------------------------------------------------------------
def experiment(tmp_path: Path, extra: str = "", **model: object) -> Path:
    path = tmp_path / "exp.yaml"
    fields = ", ".join(f"{k}: {v}" for k, v in {**TINY, **model}.items())
    path.write_text("name: big\nmodel: {" + fields + "}\n" + extra +
                    "measure:\n  params: {}\n  training: {steps: 2, batch_size: 2, seq_len: 8}\n")
    return path


def status_kib(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    return 0  # pragma: no cover


def reset_peak_rss() -> str:
    """Reset VmHWM (the peak RSS) where the kernel allows it; the field to read after."""
    try:
        Path("/proc/self/clear_refs").write_text("5")
        return "VmHWM"
    except OSError:  # pragma: no cover - then the RSS after the call is all we see
        return "VmRSS"


@pytest.mark.parametrize("command", ["validate", "run"])
@pytest.mark.parametrize("model, fit", [({"vocab_size": 10**9}, "vocab_size"),
                                        ({"n_layers": 10**7}, "n_layers")])
def test_huge_models_are_refused_fast_without_allocating(tmp_path, command, model, fit):
    path = experiment(tmp_path, **model)
    out = tmp_path / "runs"
    args = [command, str(path)] + (["--out", str(out)] if command == "run" else [])
    rss, peak = status_kib("VmRSS"), reset_peak_rss()
    start = time.perf_counter()
    result = CliRunner().invoke(main, args)
    seconds = time.perf_counter() - start
    assert result.exit_code == 2, result.output
    assert seconds < 5, seconds
    assert status_kib(peak) - rss < 256 * 1024  # < 256 MiB more: nothing near the estimate
    assert re.search(r"training needs about [\d.]+ [GT]iB \(parameters [\d.]+ GiB", result.output)
    assert f"the largest {fit} that fits is" in result.output
    assert "Traceback" not in result.output and not out.exists()
    # training is checked first (its builds serve params), the messages in reading order
    needs = re.findall(r"variant 'base': (\w+) needs", result.output)
    assert needs == ["params", "training"]


def test_describe_shows_params_and_memory_per_probe(tmp_path):
    # the written-out kernels' activations (the fused ones save fewer: a smaller number)
    path = experiment(tmp_path, extra="kernels: reference\ngrid:\n  n_layers: [2, 1000000]\n")
    result = CliRunner().invoke(main, ["describe", str(path)])
    assert result.exit_code == 0, result.output
    real = sum(p.numel() for p in build_model(spec_of(), get_registry()).parameters())
    assert f"parameters: {real:,} (" in result.output
    assert "memory params on cpu: about" in result.output
    # training's device is auto: CUDA where the machine has it (params always run on the CPU)
    trains_on = "cuda" if torch.cuda.is_available() else "cpu"
    assert f"memory training on {trains_on}: about" in result.output
    assert "activations" in result.output and "at batch_size 2, seq_len 8" in result.output
    assert "(module tree left out: n_layers 1,000,000 > 1000)" in result.output
    per_layer = 12_608  # one TransformerBlock of the tiny model
    assert f"parameters: {per_layer * 10**6 + real - 2 * per_layer:,} (" in result.output
    assert re.search(rf"training on {trains_on}: about 256\.7 GiB .*; does not fit: {trains_on}(:\d)? "
                     r"has [\d.]+ [GM]iB available", result.output)


def test_max_variants_raises_the_cap(tmp_path):
    path = experiment(tmp_path, extra="grid:\n  n_layers: [1, 2, 3]\n")
    refused = CliRunner().invoke(main, ["validate", str(path), "--max-variants", "2"])
    assert refused.exit_code == 2 and "3 variants (3 (n_layers))" in refused.output
    ok = CliRunner().invoke(main, ["validate", str(path), "--max-variants", "3"])
    assert ok.exit_code == 0, ok.output


def test_validate_says_what_base_is(tmp_path):
    path = experiment(tmp_path, extra="variants:\n  - {name: rms, set: {norm.kind: rms}}\n")
    result = CliRunner().invoke(main, ["validate", str(path)])
    assert result.exit_code == 0, result.output
    assert "note: base: the model as written under `model:`" in result.output
    assert "because `variants:` lists changes to it and there is no `grid:`" in result.output
    grid = experiment(tmp_path, extra="grid:\n  norm.kind: [layer, rms]\n")
    assert "note: base" not in CliRunner().invoke(main, ["validate", str(grid)]).output


def test_binary_or_non_utf8_corpus_is_a_warning(tmp_path):
    (tmp_path / "a.txt").write_bytes(b"caf\xe9 " * 200)
    (tmp_path / "b.txt").write_bytes(b"text\0with nul " * 100)
    path = experiment(tmp_path, extra="data: {source: text, path: '*.txt'}\n")
    result = CliRunner().invoke(main, ["validate", str(path)])
    assert result.exit_code == 0, result.output
    assert re.search(r"warning: data: \S*a\.txt is not UTF-8 \(byte 3", result.output)
    assert re.search(r"warning: data: \S*b\.txt looks binary", result.output)


def test_refusal_points_at_the_grid_value_and_only_skips_it(tmp_path):
    path = experiment(tmp_path, extra="grid:\n  n_layers: [1, 1000000]\n")
    result = CliRunner().invoke(main, ["validate", str(path)])
    assert result.exit_code == 2, result.output
    lines = [x for x in result.output.splitlines() if "that fits" in x]
    assert lines and all(x.startswith(f"{path}:4:17: ") and "grid.n_layers[1]: variant "
                         "'n_layers=1000000'" in x for x in lines), lines
    out = tmp_path / "runs"
    ran = CliRunner().invoke(main, ["run", str(path), "--out", str(out), "--no-report",
                                    "--only", "n_layers=1"])
    assert ran.exit_code == 0, ran.output
    assert "2 unit(s): 2 computed" in ran.output


def _every_builtin_kind():
    registry = get_registry()
    for slot in ("norm", "activation", "feedforward", "attention", "residual", "positional",
                 "init"):
        for kind in registry.kinds(slot):
            yield slot, kind


@pytest.mark.parametrize("slot,kind", list(_every_builtin_kind()))
def test_every_builtin_kind_can_be_estimated_on_meta(slot, kind):
    """A built-in component that cannot run on the meta device would silently switch the
    size guard off for every variant using it."""
    spec = spec_of(**{slot: {"kind": kind}})
    one_layer = model_cost(spec.model_copy(update={"n_layers": 1}), get_registry(), (2, 8))
    real = build_model(spec.model_copy(update={"n_layers": 1}), get_registry())
    assert one_layer.params == sum(p.numel() for p in real.parameters())
    assert one_layer.activation_bytes > 0


def _plain_meta_cost(spec, batch):
    """Reference for metarun: the meta build and forward with PyTorch's own fills, dropout
    and torch._dynamo (what metarun keeps out)."""
    import torch._dynamo  # noqa: F401
    registry = get_registry()
    with torch.device("meta"):
        model = build_model(spec, registry)
        params = list(model.parameters())
        act = sizeguard._activation_bytes(model, spec, task_for(spec, registry),
                                          {id(p) for p in params}, *batch)
        buffers = sum(b.numel() * b.element_size() for b in model.buffers())
    return (sum(p.numel() for p in params), buffers, act)


@pytest.mark.parametrize("slot,kind", list(_every_builtin_kind()))
def test_meta_fills_cost_the_same_as_pytorchs_fills(slot, kind):
    """The size guard skips random fills and dropout's mask on meta tensors and keeps
    torch._dynamo out (start-up); the counts must equal PyTorch's own meta build, dropout on."""
    spec = spec_of(n_layers=1, drop_rate=0.1, **{slot: {"kind": kind}})
    got = sizeguard._meta_cost(spec, get_registry(), (2, 8))
    assert (got.params, got.buffer_bytes, got.activation_bytes) == _plain_meta_cost(spec, (2, 8))
    assert got.activation_bytes > 0


def test_meta_fills_leave_other_devices_alone():
    torch.manual_seed(0)
    with metarun.MetaFills():
        x = torch.nn.init.normal_(torch.empty(64))
        y = torch.nn.functional.dropout(torch.ones(64), 0.5, True)
    assert x.std() > 0.5  # filled
    assert set(y.tolist()) <= {0.0, 2.0} and 0.0 in y.tolist() and 2.0 in y.tolist()


STAND_IN_RUN = """
import json, sys, torch
sys.path.insert(0, sys.argv[2])
from conftest import TINY
from variantlab.model.specs import parse_model_spec
from variantlab.plugin.registry import get_registry
from variantlab.sweep import metarun, sizeguard
answered = []
real_init = metarun._StandIn.__init__
def init(self):
    real_init(self)
    answered.append(self)
metarun._StandIn.__init__ = init
asked = []
real_asked = metarun._StandInAsked.__init__
def ask(self, *args):
    real_asked(self, *args)
    asked.append(str(self))
metarun._StandInAsked.__init__ = ask
out = {}
for name, extra in json.loads(sys.argv[1]).items():
    spec = parse_model_spec({**TINY, "n_layers": 1, "drop_rate": 0.1, **extra}, get_registry())
    c = sizeguard._meta_cost(spec, get_registry(), (2, 8))
    out[name] = [c.params, c.buffer_bytes, c.activation_bytes]
kernels = [fn for s in answered for fn in s.answered]
print(json.dumps({"costs": out, "dynamo": "torch._dynamo" in sys.modules, "asked": asked,
                  "sympy": [m for m in ("sympy", "torch.fx.experimental.symbolic_shapes")
                            if m in sys.modules],
                  "torch_attr": "_dynamo" in torch.__dict__, "kernels": len(kernels),
                  "left": sum("__dynamo_disable" in fn.__dict__ for fn in kernels)}))
"""


@pytest.mark.slow  # a subprocess, a real pool or a browser: end to end
def test_meta_run_without_dynamo_counts_the_same_and_leaves_no_trace():
    """In a fresh process the stand-ins (torch._dynamo, symbolic_shapes, sympy) answer the
    reference kernels for every built-in component, none is asked for more; the counts equal
    PyTorch's own, and afterwards neither the modules nor the kernels' cached answers are
    left (a later torch.compile imports the real ones)."""
    import json
    import os
    import subprocess
    import sys

    specs = {"gpt": {}, "llama": {"norm": {"kind": "rms"}, "positional": "rotary",
                                  "feedforward": "glu"}}
    specs.update({f"{slot}={kind}": {slot: {"kind": kind}} for slot, kind in _every_builtin_kind()})
    root = Path(__file__).resolve().parent
    env = {**os.environ, "PYTHONPATH": str(root.parent)}
    proc = subprocess.run([sys.executable, "-c", STAND_IN_RUN, json.dumps(specs), str(root)],
                          capture_output=True, text=True, env=env, timeout=120)
    assert proc.returncode == 0, proc.stderr
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    assert (got["dynamo"], got["torch_attr"], got["left"]) == (False, False, 0)
    assert (got["sympy"], got["asked"]) == ([], [])
    assert got["kernels"] > 10  # the stand-in was used
    for name, extra in specs.items():
        spec = spec_of(n_layers=1, drop_rate=0.1, **extra)
        assert got["costs"][name] == list(_plain_meta_cost(spec, (2, 8))), name


class _BackwardProbe:
    """A plugin probe under its own name that takes gradients but no steps."""

    @staticmethod
    @hookimpl
    def register_probes(register):
        register("grad_stats", GradientsSettings, lambda *a, **k: [],
                 passes=("forward", "backward"))


def test_the_registered_passes_decide_what_is_counted_not_the_probe_name():
    spec = spec_of()
    registry = build_registry(entry_points=False)
    registry.load_module(_BackwardProbe(), "grad_stats_plugin", "module")
    settings = GradientsSettings(batch_size=2, seq_len=8)
    mine = footprint(spec, registry, "grad_stats", settings, "cpu")
    builtin = footprint(spec, registry, "gradients", settings, "cpu")
    assert mine.grad_bytes == builtin.grad_bytes == model_cost(spec, registry).param_bytes > 0
    assert mine.optimizer_bytes == 0 and mine.total == builtin.total


def test_passes_outside_forward_backward_step_are_refused():
    class Bad:
        @staticmethod
        @hookimpl
        def register_probes(register):
            register("odd", GradientsSettings, lambda *a, **k: [], passes=("backwards",))

    with pytest.raises(PluginLoadError, match="passes must be among backward, forward, step"):
        build_registry(entry_points=False).load_module(Bad(), "odd_plugin", "module")


LATE_IMPORT = """
import sys, torch
sys.path.insert(0, sys.argv[1])
from variantlab.sweep import metarun
def run():
    import late_import_probe  # first imported during the run: binds the stand-ins
    return late_import_probe.sympy.Basic, late_import_probe.guard_or_false(True)
basic, answer = metarun.meta_run(run)
assert answer is True and basic is metarun._NoSympyExpression, "no stand-ins in place"
import late_import_probe as m
import sympy
from torch.fx.experimental import symbolic_shapes
print(m.sympy is sympy, m.guard_or_false is symbolic_shapes.guard_or_false)
"""


@pytest.mark.slow  # a subprocess, a real pool or a browser: end to end
def test_a_module_imported_during_a_meta_run_keeps_no_stand_in(tmp_path):
    """A module first imported inside a meta run that binds sympy and a symbolic_shapes
    helper at its top gets the real ones when the run ends (a later symbolic trace in the
    same process must not meet the stand-in)."""
    import os
    import subprocess
    import sys

    (tmp_path / "late_import_probe.py").write_text(
        "import sympy\nfrom torch.fx.experimental.symbolic_shapes import guard_or_false\n")
    root = Path(__file__).resolve().parent.parent
    env = {**os.environ, "PYTHONPATH": str(root)}
    proc = subprocess.run([sys.executable, "-c", LATE_IMPORT, str(tmp_path)],
                          capture_output=True, text=True, env=env, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["True", "True"]
