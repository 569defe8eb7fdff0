"""Setting axes (issue 23.1): ``measure.<probe>.<key>`` in ``grid:`` and ``variants[].set``:
validated at FILE:LINE:COL, part of the unit key, shown in labels, results() and validate."""

import re
from textwrap import dedent

import pytest
from click.testing import CliRunner
from conftest import exp

from variantlab.cli.main import main
from variantlab.config.experiment import InputError, experiment_from_text
from variantlab.sweep.units import plan_units

MEASURE = """\
measure:
  params: {}
  training: {steps: 3, lr: 1.0e-3, batch_size: 2, seq_len: 16, eval_batches: 1, device: cpu}
"""


def test_setting_axis_changes_only_that_probes_settings_and_keys():
    e = experiment_from_text(exp(dedent("""\
        grid:
          activation.kind: [gelu, relu]
          measure.training.lr: [1.0e-3, 3.0e-3]
        variants:
          - {name: slow, set: {measure.training.steps: 5}}
        """) + MEASURE))
    labels = [v.label for v in e.variants]
    assert labels == ["base", "measure.training.lr=0.003", "activation.kind=relu",
                      "activation.kind=relu,measure.training.lr=0.003", "slow"]
    by = {v.name: v for v in e.variants}
    assert by["measure.training.lr=0.003"].settings == {"training": {"lr": 3e-3}}
    assert by["measure.training.lr=0.003"].spec == by["base"].spec  # the model is unchanged
    assert e.probes_of(by["measure.training.lr=0.003"])["training"].lr == 3e-3
    assert e.probes_of(by["slow"])["training"].steps == 5
    assert e.probes_of(by["base"])["training"].lr == 1e-3
    units = {(u.variant.name, u.probe): u for u in plan_units(e)}
    # params does not read lr: the lr variants share its unit; training's keys differ
    assert units[("base", "params")].key == units[("measure.training.lr=0.003", "params")].key
    assert units[("base", "training")].key != units[("measure.training.lr=0.003", "training")].key
    assert units[("measure.training.lr=0.003", "training")].settings.lr == 3e-3
    assert units[("slow", "training")].settings.steps == 5


def test_without_setting_axes_the_units_are_the_base_settings():
    e = experiment_from_text(exp("grid:\n  activation.kind: [gelu, relu]\n" + MEASURE))
    assert all(v.settings == {} for v in e.variants)
    base = e.measure.probes()
    assert all(u.settings is base[u.probe] for u in plan_units(e))


def errors(text: str) -> list[str]:
    with pytest.raises(InputError) as info:
        experiment_from_text(text, "exp.yaml")
    return info.value.messages


def test_bad_setting_axes_are_located_with_a_suggestion():
    msgs = errors(exp(dedent("""\
        grid:
          measure.training.lrr: [1.0e-3]
          measure.training.lr: [1.0e-3, -3.0e-3]
          measure.gradients.batch_size: [2]
          measure.training: [1]
        variants:
          - {name: v, set: {measure.trainng.lr: 0.1, measure.training.steps: 0}}
        """) + MEASURE))
    text = "\n".join(msgs)
    assert re.search(r"exp.yaml:\d+:3: grid.measure.training.lrr: .*did you mean "
                     r"'measure.training.lr'\?", text), text
    assert re.search(r"exp.yaml:\d+:\d+: grid.measure.training.lr\[1\]: Input should be "
                     r"greater than 0", text), text
    assert re.search(r"grid.measure.gradients.batch_size: .*probe 'gradients' does not run"
                     r".*\(params, training\)", text), text
    assert "grid.measure.training: 'measure.training': a setting axis is written" in text
    assert re.search(r"variants\[0\].set.measure.trainng.lr: .*did you mean "
                     r"'measure.training.lr'", text), text
    assert "variants[0].set.measure.training.steps: Input should be greater than 0" in text
    assert len(msgs) == 6, msgs  # each problem once, not once per grid combination


def test_a_seq_len_axis_is_checked_against_each_variants_context():
    msgs = errors(exp("grid:\n  measure.training.seq_len: [16, 64]\n" + MEASURE))
    assert len(msgs) == 1 and re.match(
        r"exp.yaml:\d+:\d+: grid.measure.training.seq_len\[1\]: seq_len=64 is above "
        r"context_length=32", msgs[0]), msgs


@pytest.mark.parametrize("axis", ["measure.training.lrr: [1.0e-3]",
                                  "measure.training.lr: [1.0e-3, -1.0e-3]",
                                  "measure.timing.repeats: [2, 3]"])
def test_cli_refuses_bad_setting_axes_exit_2_nothing_stored(axis, tmp_path):
    path = tmp_path / "exp.yaml"
    path.write_text(exp(f"grid:\n  {axis}\n" + MEASURE))
    out = tmp_path / "runs"
    result = CliRunner().invoke(main, ["run", str(path), "--out", str(out)])
    assert result.exit_code == 2, result.output
    assert re.search(rf"{re.escape(str(path))}:\d+:\d+: grid\.measure\.", result.output)
    assert not out.exists()


def test_validate_names_the_architecture_and_setting_axes(tmp_path):
    path = tmp_path / "exp.yaml"
    path.write_text(exp("grid:\n  activation.kind: [gelu, relu]\n"
                        "  measure.training.lr: [1.0e-3, 3.0e-3]\n" + MEASURE))
    result = CliRunner().invoke(main, ["validate", str(path)])
    assert result.exit_code == 0, result.output
    assert "activation.kind=relu,measure.training.lr=0.003" in result.output
    assert "  activation.kind: compared\n" in result.output
    assert "  measure.training.lr: tuned\n" in result.output
    assert "compare_on: loss (lower is better; chosen on val_loss, reported on test_loss)" \
        in result.output


@pytest.mark.slow
def test_a_tuning_sweep_runs_end_to_end_and_resumes(tmp_path):
    """Issue 23's done-when: activation x lr x 3 seeds; results() has the setting column;
    tuned.csv's lr per activation is recomputable from results() by the documented rule;
    effects.csv's n is 3; a second run computes nothing."""
    import pandas as pd

    import variantlab as vl
    from variantlab.report.fair.tuned import CHOOSE

    path = tmp_path / "tune.yaml"
    path.write_text(exp("seeds: [0, 1, 2]\ngrid:\n  activation.kind: [gelu, relu]\n"
                        "  measure.training.lr: [1.0e-3, 1.0e-2]\n" + MEASURE))
    out = tmp_path / "runs"
    first = CliRunner().invoke(main, ["run", str(path), "--out", str(out)])
    assert first.exit_code == 0, first.output
    again = CliRunner().invoke(main, ["run", str(path), "--out", str(out)])
    # 24 units, and a test unit per seed of each activation's chosen rate (stored too)
    assert again.exit_code == 0 and "30 unit(s): 0 computed, 30 stored already" in again.output
    rows = vl.results(out / "demo")
    assert "measure.training.lr" in rows.columns
    train = rows[rows["probe"] == "training"]
    assert set(train["measure.training.lr"]) == {1e-3, 1e-2}
    metric = next(m for m in CHOOSE if m in set(train["metric"]))
    part = train[train["metric"] == metric].copy()
    part["activation"] = ["relu" if "relu" in v else "gelu" for v in part["variant"]]
    means = part.groupby(["activation", "measure.training.lr"])["value"].mean()
    tuned = pd.read_csv(out / "demo" / "report" / "tuned.csv").set_index("variant")
    for act in ("gelu", "relu"):
        best = means[act].idxmin()
        assert tuned.loc[f"activation={act}", "measure.training.lr"] == best
        assert tuned.loc[f"activation={act}", "val_loss"] == pytest.approx(
            means[act].min(), rel=1e-5)
        assert tuned.loc[f"activation={act}", "n"] == 3
    effects = pd.read_csv(out / "demo" / "report" / "effects.csv")
    assert set(effects["n"]) == {3}


def test_the_schema_accepts_setting_axes_and_refuses_unknown_settings():
    import jsonschema
    import yaml

    from variantlab.config.schema import experiment_schema

    validator = jsonschema.Draft7Validator(experiment_schema())
    doc = yaml.safe_load(exp("grid:\n  measure.training.lr: [1.0e-3, 3.0e-3]\n"
                             "variants:\n  - {name: v, set: {measure.training.steps: 5}}\n"
                             + MEASURE))
    assert [e.message for e in validator.iter_errors(doc)] == []
    doc["grid"]["measure.training.lrr"] = [1e-3]
    doc["grid"]["measure.training.lr"] = [-1e-3]
    assert len(list(validator.iter_errors(doc))) == 2


def test_the_size_guard_reads_each_variants_own_settings(tmp_path):
    from variantlab.sweep.preflight import size_problems

    e = experiment_from_text(exp("grid:\n  measure.training.batch_size: [2, 64]\n" + MEASURE))
    seen = []
    size_problems(e, e.doc, None, lambda device: seen.append(device) or 10**15)
    assert len(seen) >= 2  # probed per variant and probe
    found = size_problems(e, e.doc, None, lambda device: 5_000_000)  # 0.8 MB vs 11.8 MB
    assert len(found) == 1 and "variant 'measure.training.batch_size=64'" in found[0], found
    assert found[0].startswith("<string>:12:36: grid.measure.training.batch_size[1]: "), found
