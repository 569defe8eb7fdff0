"""Runner: unit keys, resume, retries, failure isolation, fail-fast, Ctrl-C."""

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

import variantlab as vl
from variantlab import get_registry, parse_model_spec
from variantlab.config.measure import MeasureSpec
from variantlab.data.sources import SyntheticData
from variantlab.executors.runner import plan_units, run_experiment
from variantlab.plugin.rows import row
from variantlab.store.store import Store, load_run, results
from variantlab.sweep.units import unit_key

REG = vl.get_registry()


@dataclass(frozen=True)
class FakeVariant:
    name: str
    label: str
    overrides: dict
    spec: Any
    warnings: list = field(default_factory=list)


@dataclass
class FakeExperiment:
    """Just the attributes of ``experiment.Experiment`` that the runner reads."""

    variants: list
    name: str = "fake"
    description: str = "runner test"
    seeds: tuple = (0, 1)
    measure: Any = MeasureSpec(params={}, gradients={"batch_size": 2, "seq_len": 8},
                               registry=get_registry())
    data: Any = SyntheticData()
    baseline: str = "base"
    source_text: str = "name: fake\n"
    base_dir: Path = Path(".")
    registry: Any = field(default_factory=get_registry)


def make_experiment(tiny, **kw) -> FakeExperiment:
    variants = []
    for name, over in [("base", {}), ("rms", {"norm": {"kind": "rms"}}),
                       ("relu", {"activation": {"kind": "relu"}})]:
        spec = parse_model_spec({**tiny, **over}, REG)
        label = "base" if not over else f"{next(iter(over))}.kind={over[next(iter(over))]['kind']}"
        variants.append(FakeVariant(name, label, {}, spec))
    return FakeExperiment(variants=variants, **kw)


class Recorder:
    """A probe function: one row per call, the value from the seed; optional failures."""

    def __init__(self, fail_for=(), interrupt_at=None):
        self.calls = []
        self.fail_for = set(fail_for)
        self.interrupt_at = interrupt_at

    def __call__(self, name, spec, settings, *, seed, data, base_dir, device=None,
                 registry=None):
        self.calls.append((spec.norm.kind, spec.activation.kind, seed, name, device))
        if self.interrupt_at is not None and len(self.calls) == self.interrupt_at:
            raise KeyboardInterrupt
        if (spec.norm.kind, spec.activation.kind) in self.fail_for:
            raise RuntimeError(f"component bug in {spec.norm.kind}")
        return [row(name, "total", 100 * seed + len(name), unit="count"),
                row(name, "per_layer", seed, scope="layer", layer=1)]


def test_plan_order_and_keys(tiny):
    exp = make_experiment(tiny)
    units = plan_units(exp)
    assert [(u.variant.name, u.seed, u.probe) for u in units[:4]] == [
        ("base", 0, "params"), ("base", 0, "gradients"), ("base", 1, "params"),
        ("base", 1, "gradients")]
    assert len(units) == 12 and len({u.key for u in units}) == 12
    assert units[0].device is None and units[1].device == "cpu"
    assert [u.key for u in plan_units(exp)] == [u.key for u in units]  # stable
    spec = exp.variants[0].spec.to_data()
    k = unit_key(spec, "params", {}, None, {"source": "synthetic", "task": "random"}, 0)
    assert k == units[0].key and len(k) == 64
    assert unit_key(spec, "params", {}, None, {"source": "synthetic", "task": "random"}, 0, "9.9") != k
    assert unit_key(spec, "params", {}, None, {"source": "stdlib"}, 0) != k
    # --device changes the key of device-dependent probes only
    moved = plan_units(exp, device="cuda")
    assert moved[0].key == units[0].key and moved[1].key != units[1].key


def test_timing_units_come_last_interleaved_across_variants(tiny):
    exp = make_experiment(tiny, measure=MeasureSpec(
        params={}, timing={"batch_size": 1, "seq_len": 8}, gradients={"seq_len": 8},
        registry=get_registry()))
    order = [(u.variant.name, u.seed, u.probe) for u in plan_units(exp)]
    assert order[:3] == [("base", 0, "params"), ("base", 0, "gradients"), ("base", 1, "params")]
    assert [o for o in order if o[2] == "timing"] == order[-6:] == [
        ("base", 0, "timing"), ("rms", 0, "timing"), ("relu", 0, "timing"),
        ("base", 1, "timing"), ("rms", 1, "timing"), ("relu", 1, "timing")]


def test_run_stores_everything_and_rerun_computes_nothing(tiny, tmp_path):
    exp = make_experiment(tiny)
    probe = Recorder()
    summary = run_experiment(exp, tmp_path, probe_fn=probe)
    assert (summary.total, summary.done, summary.skipped, summary.failed) == (12, 12, 0, [])
    assert summary.exit_code == 0 and summary.store == tmp_path / "fake" / "results.sqlite"
    df = results(summary.run_dir)
    assert len(df) == 24
    first = df[(df.variant == "rms") & (df.seed == 1) & (df.probe == "gradients")]
    assert first["value"].tolist() == [109.0, 1.0] and first["label"].iloc[0] == "norm.kind=rms"
    run = load_run(summary.run_dir)
    assert run.meta.experiment == "fake" and run.meta.yaml == "name: fake\n"
    assert run.meta.measure["gradients"]["seq_len"] == 8
    assert run.variants["name"].tolist() == ["base", "rms", "relu"]

    again = Recorder()
    summary = run_experiment(exp, tmp_path, probe_fn=again)
    assert again.calls == [] and summary.skipped == 12 and summary.done == 0
    assert results(summary.run_dir).equals(df)


def test_failing_variant_fails_only_its_units_and_is_retried(tiny, tmp_path):
    exp = make_experiment(tiny)
    summary = run_experiment(exp, tmp_path, probe_fn=Recorder(fail_for={("rms", "gelu")}))
    assert summary.done == 8 and len(summary.failed) == 4 and summary.exit_code == 1
    assert {u.variant.name for u, _ in summary.failed} == {"rms"}
    assert all(err == "RuntimeError: component bug in rms" for _, err in summary.failed)
    df = results(summary.run_dir)
    failed = df[df.status == "failed"]
    assert len(failed) == 4 and set(failed.metric) == {"error"}
    assert len(df[df.status == "ok"]) == 16
    units = load_run(summary.run_dir).units
    tb = units.loc[units.status == "failed", "traceback"].iloc[0]
    assert "RuntimeError: component bug in rms" in tb and "Traceback" in tb

    retry = Recorder()
    summary = run_experiment(exp, tmp_path, probe_fn=retry)
    assert summary.done == 4 and summary.skipped == 8 and summary.exit_code == 0
    assert {c[0] for c in retry.calls} == {"rms"}
    df = results(summary.run_dir)
    assert len(df) == 24 and set(df.status) == {"ok"}


def test_fail_fast_stops_at_first_failure(tiny, tmp_path):
    exp = make_experiment(tiny)
    probe = Recorder(fail_for={("rms", "gelu")})
    summary = run_experiment(exp, tmp_path, probe_fn=probe, fail_fast=True)
    assert summary.done == 4 and len(summary.failed) == 1 and summary.not_run == 7
    assert len(probe.calls) == 5 and summary.exit_code == 1


def test_only_runs_selected_variants_and_keeps_others(tiny, tmp_path):
    exp = make_experiment(tiny)
    run_experiment(exp, tmp_path, probe_fn=Recorder(), only=["relu"])
    assert set(results(tmp_path / "fake").variant) == {"relu"}
    probe = Recorder()
    summary = run_experiment(exp, tmp_path, probe_fn=probe)
    assert summary.skipped == 4 and summary.done == 8
    assert set(results(tmp_path / "fake").variant) == {"base", "rms", "relu"}
    with pytest.raises(ValueError, match="no variant named 'nope'.*base, rms, relu"):
        run_experiment(exp, tmp_path, probe_fn=probe, only=["nope"])


def test_keyboard_interrupt_keeps_finished_units(tiny, tmp_path):
    exp = make_experiment(tiny)
    summary = run_experiment(exp, tmp_path, probe_fn=Recorder(interrupt_at=6))
    assert summary.interrupted and summary.done == 5 and summary.not_run == 7
    assert summary.exit_code == 130
    with Store(summary.store) as store:
        assert list(store.statuses().values()) == ["ok"] * 5
    summary = run_experiment(exp, tmp_path, probe_fn=Recorder())
    assert summary.done == 7 and summary.skipped == 5 and len(results(summary.run_dir)) == 24


def test_device_override_reaches_the_probe(tiny, tmp_path):
    exp = make_experiment(tiny, seeds=(0,))
    probe = Recorder()
    run_experiment(exp, tmp_path, probe_fn=probe, device="cpu", only=["base"])
    assert [c[4] for c in probe.calls] == [None, "cpu"]


def test_changed_spec_is_a_new_unit(tiny, tmp_path):
    exp = make_experiment(tiny, seeds=(0,))
    run_experiment(exp, tmp_path, probe_fn=Recorder())
    wider = make_experiment({**tiny, "emb_dim": 64}, seeds=(0,))
    probe = Recorder()
    summary = run_experiment(wider, tmp_path, probe_fn=probe)
    assert summary.done == 6 and summary.skipped == 0
    assert len(results(summary.run_dir)) == 12  # the old spec's units are not shown


def test_identical_specs_share_units_but_both_show(tiny, tmp_path):
    exp = make_experiment(tiny, seeds=(0,))
    twin = FakeVariant("twin", "twin", {}, exp.variants[0].spec)
    exp.variants.append(twin)
    probe = Recorder()
    summary = run_experiment(exp, tmp_path, probe_fn=probe)
    assert len(probe.calls) == 6 and summary.done == 6 and summary.skipped == 2
    df = results(summary.run_dir)
    assert df["variant"].unique().tolist() == ["base", "rms", "relu", "twin"]
    base, twin_rows = df[df.variant == "base"], df[df.variant == "twin"]
    assert base["value"].tolist() == twin_rows["value"].tolist() and len(base) == 4
    assert twin_rows["label"].unique().tolist() == ["twin"]
