"""Probe plugins: the docs/probes.md example runs as printed, from a file beside an
experiment; measure: is validated against the registered probes; registry rules."""

import re
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner
from conftest import BUILTIN_PROBES, layer_modules

import variantlab
from variantlab import build_registry, hookimpl, parse_model_spec
from variantlab.cli.main import main
from variantlab.config.experiment import InputError, experiment_from_text
from variantlab.errors import DuplicateKindError, PluginLoadError
from variantlab.executors.runner import plan_units
from variantlab.plugin.settings import ProbeSettings
from variantlab.probes import run_probe

ROOT = Path(__file__).resolve().parent.parent
PAGE = (ROOT / "docs" / "probes.md").read_text()


def block(lang: str, marker: str) -> str:
    """The first ```lang block of docs/probes.md that contains ``marker``."""
    return next(b for b in re.findall(rf"```{lang}\n(.*?)```", PAGE, re.S) if marker in b)


PLUGIN = block("python", "# weightnorms.py")
EXPERIMENT = block("yaml", "weight_norms")


def test_the_plugin_is_about_thirty_lines():
    assert 20 <= len(PLUGIN.strip().splitlines()) <= 35


def test_the_page_test_passes(tmp_path, monkeypatch):
    (tmp_path / "weightnorms.py").write_text(PLUGIN)
    monkeypatch.chdir(tmp_path)
    exec(compile(block("python", "run_probe("), "probes.md#test", "exec"), {})


def test_plugin_rows_match_a_hand_computation(tmp_path, tiny):
    (tmp_path / "weightnorms.py").write_text(PLUGIN)
    registry = build_registry([str(tmp_path / "weightnorms.py")], entry_points=False)
    spec = parse_model_spec(tiny, registry)
    rows = run_probe("weight_norms", spec, {"matrices_only": False}, seed=3, registry=registry)
    torch.manual_seed(3)
    model = variantlab.build_model(spec, registry)
    by_layer = {i: sum(float(p.detach().pow(2).sum()) for p in m.parameters()) ** 0.5
                for i, m in layer_modules(model)}
    layer_rows = {r["layer"]: r["value"] for r in rows if r["scope"] == "layer"}
    assert sorted(layer_rows) == sorted(by_layer) == [0, 1]
    for i, v in by_layer.items():
        assert layer_rows[i] == pytest.approx(v, rel=1e-6)
    matrices = run_probe("weight_norms", spec, {}, seed=3, registry=registry)
    assert all(m["value"] < layer_rows[m["layer"]] for m in matrices if m["scope"] == "layer")
    total = next(r["value"] for r in rows if r["metric"] == "total_weight_norm")
    assert total == pytest.approx(sum(v * v for v in layer_rows.values()) ** 0.5, rel=1e-9)


@pytest.mark.slow
def test_the_docs_experiment_runs_and_the_report_shows_it(tmp_path):
    (tmp_path / "weightnorms.py").write_text(PLUGIN)
    exp_file = tmp_path / "weight-norms.yaml"
    exp_file.write_text(EXPERIMENT)
    out = tmp_path / "runs"
    result = CliRunner().invoke(main, ["run", str(exp_file), "--out", str(out)])
    assert result.exit_code == 0, result.output
    frame = variantlab.results(out / "weight-norms")
    mine = frame[frame["probe"] == "weight_norms"]
    assert set(mine["variant"]) == {"base", "norm.kind=rms"}
    assert sorted(set(mine.loc[mine["scope"] == "layer", "layer"])) == [0, 1]
    assert (mine["value"] > 0).all()
    report = (out / "weight-norms" / "report" / "report.md").read_text()
    assert "Probe: weight_norms" in report and "weight\\_norm layer 1" in report
    html = (out / "weight-norms" / "report" / "report.html").read_text()
    assert "Probe: weight_norms" in html


def test_unknown_probe_is_a_located_error_with_a_suggestion(tmp_path):
    (tmp_path / "weightnorms.py").write_text(PLUGIN)
    text = EXPERIMENT.replace("weight_norms: {", "weight_norm: {")
    with pytest.raises(InputError) as err:
        experiment_from_text(text, tmp_path / "e.yaml")
    (msg,) = err.value.messages
    assert re.match(r".*e\.yaml:8:3: measure\.weight_norm: unknown probe 'weight_norm'; "
                    r"did you mean 'weight_norms'\?", msg), msg
    bad = EXPERIMENT.replace("matrices_only: false", "matrices_only: 1")
    with pytest.raises(InputError) as err:
        experiment_from_text(bad, tmp_path / "e.yaml")
    assert "measure.weight_norms.matrices_only" in str(err.value)


def test_the_plugin_probe_is_in_the_schema_and_in_unit_keys(tmp_path):
    from variantlab.config.schema import experiment_schema

    plugin = tmp_path / "weightnorms.py"
    plugin.write_text(PLUGIN)
    exp = experiment_from_text(EXPERIMENT, tmp_path / "e.yaml")
    schema = experiment_schema(exp.registry)
    measure = schema["properties"]["measure"]
    assert set(measure["properties"]) == {*BUILTIN_PROBES, "weight_norms"}
    assert measure["additionalProperties"] is False
    keys = {u.key for u in plan_units(exp) if u.probe == "weight_norms"}
    assert all(u.device is None for u in plan_units(exp) if u.probe == "weight_norms")
    plugin.write_text(PLUGIN + "\n# edited\n")
    edited = experiment_from_text(EXPERIMENT, tmp_path / "e.yaml")
    after = plan_units(edited)
    assert not keys & {u.key for u in after if u.probe == "weight_norms"}
    assert ({u.key for u in plan_units(exp) if u.probe == "params"}
            == {u.key for u in after if u.probe == "params"})


class _Settings(ProbeSettings):
    pass


def _run(spec, settings, **_):
    return []


class _Twice:
    @hookimpl
    def register_probes(self, register):
        register("params", _Settings, _run)


class _NotStrict:
    @hookimpl
    def register_probes(self, register):
        register("loose", dict, _run)


def test_registry_refuses_duplicate_and_malformed_probes():
    reg = build_registry(entry_points=False)
    with pytest.raises(DuplicateKindError, match="probe 'params'.*variantlab_plugins.probes"):
        reg.load_module(_Twice(), "twice", "module")
    with pytest.raises(PluginLoadError, match="must subclass variantlab.ProbeSettings"):
        reg.load_module(_NotStrict(), "loose", "module")
    assert reg.probe_names() == list(BUILTIN_PROBES)
    serial = [p.name for p in reg.probes() if p.serial]
    assert serial == ["timing"] and [p.name for p in reg.probes() if p.device_free] == ["params"]
