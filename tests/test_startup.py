"""Start-up (issue 26.1): a command imports only what it uses. ``variantlab validate`` (and a
refusal) never imports matplotlib, transformers, mlflow or ray, nor the probes' report views
or pandas; the registry names the built-in views lazily and they resolve when asked.
Timings are in benchmarks/startup.py, not here."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from conftest import ROOT

HEAVY = ("matplotlib", "transformers", "mlflow", "ray", "pandas", "torch._dynamo",
         "variantlab.report", "setuptools", "sympy",
         "torch.fx.experimental.symbolic_shapes")

# runs `variantlab ARGS...` for each argument list in one fresh process (as the console
# script does), then prints which HEAVY modules it imported and each exit code
RUNNER = textwrap.dedent("""
    import json, sys
    from variantlab.cli.main import main
    codes = []
    for args in json.loads(sys.argv[1]):
        try:
            main(args, prog_name="variantlab")
        except SystemExit as exc:
            codes.append(exc.code)
    heavy = json.loads(sys.argv[2])
    print(json.dumps({"codes": codes,
                      "imported": [m for m in heavy if m in sys.modules]}))
""")


def _exp(tmp_path: Path, name: str, vocab: int) -> str:
    path = tmp_path / f"{name}.yaml"
    path.write_text(textwrap.dedent(f"""\
        name: {name}
        model: {{emb_dim: 32, n_layers: 2, n_heads: 2, vocab_size: {vocab}, context_length: 32}}
        grid: {{norm.kind: [layer, rms]}}
        seeds: [0]
        data: {{source: synthetic}}
        measure: {{params: {{}}, training: {{steps: 2, seq_len: 16}}}}
        """))
    return str(path)


@pytest.mark.slow  # a subprocess, a real pool or a browser: end to end
def test_validate_and_a_refusal_import_no_heavy_module(tmp_path):
    calls = [["validate", _exp(tmp_path, "ok", 256)],
             ["validate", _exp(tmp_path, "huge", 10**9)]]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.run([sys.executable, "-c", RUNNER, json.dumps(calls), json.dumps(HEAVY)],
                          capture_output=True, text=True, env=env, cwd=tmp_path, timeout=120)
    assert proc.returncode == 0, proc.stderr
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    assert got["codes"] == [0, 2]  # ok, then the 10^9 vocab refused as bad input
    assert "vocab_size" in proc.stderr
    assert got["imported"] == []


def test_builtin_views_resolve_lazily():
    from variantlab.plugin.probe import ProbeView
    from variantlab.plugin.registry import build_registry

    registry = build_registry(entry_points=False)
    probes = {p.name: p for p in registry.probes()}
    assert {n: isinstance(probes[n].views_given, str) for n in probes} == {
        "params": True, "gradients": True, "timing": True, "training": True, "dynamics": True}
    for name in ("params", "gradients", "timing", "training"):
        views = probes[name].views
        assert views and all(isinstance(v, ProbeView) for v in views)
    assert all(callable(v) or isinstance(v, ProbeView) for v in probes["dynamics"].views)
    assert len(probes["dynamics"].views) >= 2  # the dynamics lines and the routing views


def test_lazy_views_are_checked_when_resolved():
    import pytest

    from variantlab.errors import PluginLoadError
    from variantlab.plugin.probe import make_probe
    from variantlab.probes.params import ParamsSettings

    def run(*a, **k):
        return []

    with pytest.raises(PluginLoadError, match="must be 'package.module:attr'"):
        make_probe("p", "x", ParamsSettings, run, views="not a reference")
    missing = make_probe("p", "x", ParamsSettings, run, views="variantlab.nowhere:views")
    with pytest.raises(PluginLoadError, match="'variantlab.nowhere:views' cannot be imported"):
        missing.views  # noqa: B018
    not_views = make_probe("p", "x", ParamsSettings, run, views="variantlab.errors:__doc__")
    with pytest.raises(PluginLoadError, match="must be a sequence of views"):
        not_views.views  # noqa: B018
    good = make_probe("p", "x", ParamsSettings, run, views="variantlab.report.builtin.params:views")
    from variantlab.report.builtin.params import views

    assert good.views == views()


@pytest.mark.slow  # a subprocess, a real pool or a browser: end to end
def test_report_imports_no_torch(tmp_path):
    """``variantlab report`` needs the probes' views and metric directions, not their code:
    the registry defers the component modules, the probes' settings and run functions are
    references, so torch (and the model code) stay unimported; the report is whole."""
    from conftest import store_of

    from variantlab.testing.sample import sample_run

    run = store_of(sample_run(fail=None), tmp_path / "run")
    calls = [["report", str(run), "--out", str(tmp_path / "out")]]
    heavy = ["torch", "variantlab.model.build", "variantlab.probes.training",
             "variantlab_plugins.norms", "variantlab.config.experiment"]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.run([sys.executable, "-c", RUNNER, json.dumps(calls), json.dumps(heavy)],
                          capture_output=True, text=True, env=env, cwd=tmp_path, timeout=120)
    assert proc.returncode == 0, proc.stderr
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    assert got == {"codes": [0], "imported": []}, proc.stderr
    from variantlab.plugin.registry import build_registry
    from variantlab.report import write_report

    # the same report as one written with the whole registry loaded
    full = write_report([run], tmp_path / "full", registry=build_registry(entry_points=False))
    for name in ("report.md", "summary.csv", "params.svg"):
        assert (tmp_path / "out" / name).read_bytes() == (full.markdown.parent / name).read_bytes()
    assert "### Training" in (tmp_path / "out" / "report.md").read_text()


def test_deferred_registry_completes_to_the_full_one():
    """``build_registry(defer=True)`` holds the same probes at once, and once a component
    is asked for, the same components (then executors and plugins) in the same order; a
    module loaded after it comes after every built-in, as without deferring."""
    import sys

    from variantlab.plugin.registry import build_registry

    full = build_registry(entry_points=False)
    lazy = build_registry(entry_points=False, defer=True)
    assert lazy.probe_names() == full.probe_names()
    assert [p.views_given for p in lazy.probes()] == [p.views_given for p in full.probes()]
    assert lazy._deferred  # nothing asked yet
    assert lazy.get("norm", "rms").spec_cls is full.get("norm", "rms").spec_cls
    assert lazy._deferred == ["variantlab_plugins.executors"]  # a component asks no executor
    assert lazy.plugins == full.plugins
    assert not lazy._deferred
    assert [(c.slot, c.kind, c.plugin) for c in lazy.components()] == \
        [(c.slot, c.kind, c.plugin) for c in full.components()]
    assert lazy.executor_names() == full.executor_names()
    assert "variantlab_plugins.norms" in sys.modules
    listed = build_registry(entry_points=False, defer=True)
    assert listed.plugins == full.plugins and not listed._deferred  # asking completes too
    later, eager = (build_registry(entry_points=False, defer=d) for d in (True, False))
    for reg in (later, eager):
        reg.load("variantlab.probes.metricnames", "module")  # a plugin module of no hooks
    assert later.plugins == eager.plugins == [*full.plugins, ("variantlab.probes.metricnames",
                                                              "module")]


def test_probe_code_given_as_references_is_checked_when_resolved():
    """A probe's settings class and run function may be ``"module:attr"`` references
    (the built-ins are): imported on first use, checked as given ones are."""
    import pytest

    from variantlab.errors import PluginLoadError
    from variantlab.plugin.probe import make_probe
    from variantlab.plugin.registry import build_registry
    from variantlab.probes import training

    with pytest.raises(PluginLoadError, match="settings 'not a ref' must be"):
        make_probe("p", "x", "not a ref", "variantlab.probes.params:run")
    with pytest.raises(PluginLoadError, match="run 'nowhere' must be"):
        make_probe("p", "x", "variantlab.probes.params:ParamsSettings", "nowhere")
    bad = make_probe("p", "x", "variantlab.errors:SpecError", "variantlab.errors:__doc__")
    with pytest.raises(PluginLoadError, match="settings must subclass"):
        bad.settings_cls  # noqa: B018
    with pytest.raises(PluginLoadError, match="run must be callable"):
        bad.run  # noqa: B018
    gone = make_probe("p", "x", "variantlab.nowhere:S", "variantlab.nowhere:run")
    with pytest.raises(PluginLoadError, match="'variantlab.nowhere:S' cannot be imported"):
        gone.settings_cls  # noqa: B018
    probe = build_registry(entry_points=False).probe("training")
    assert isinstance(probe.settings_given, str) and isinstance(probe.run_given, str)
    assert probe.settings_cls is training.TrainingSettings and probe.run is training.run
    assert probe.settings({"steps": 3}).steps == 3


@pytest.mark.slow  # a subprocess, a real pool or a browser: end to end
def test_the_tuned_sweep_chooser_imports_no_report_writer_nor_scipy():
    """``variantlab run`` of a tuned sweep imports the chooser (``EdgeFeed``) before its
    first unit: the report's writer, its plots and scipy come later, when the report or a
    t-interval needs them (0.8 s of the driver's start, issue 39); the package's names
    still resolve, to the writer's."""
    code = textwrap.dedent("""
        import json, sys
        import variantlab.report.fair.extension
        before = [m for m in ("matplotlib", "scipy", "variantlab.report.writer",
                              "variantlab.report.panels", "variantlab.report.plots")
                  if m in sys.modules]
        from variantlab.report import plots, write_report
        import variantlab.report.writer as writer
        from variantlab.report.stats import t_quantile
        print(json.dumps({"before": before, "same": write_report is writer.write_report,
                          "plots": plots.__name__, "t": t_quantile(0.975, 2)}))
    """)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          env=env, timeout=120)
    assert proc.returncode == 0, proc.stderr
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    assert got["before"] == []
    assert got["same"] is True and got["plots"] == "variantlab.report.plots"
    assert abs(got["t"] - 4.302652729749464) < 1e-12  # t(0.975, 2 df), as scipy.stats.t.ppf
