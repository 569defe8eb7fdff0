"""Results are never stale (issue 10, item 1): a unit's key covers the code of the plugins it
uses, the core code, the versions and the data files; --rerun recomputes; the report and
results() show only the current plan."""

import textwrap
from pathlib import Path

import pandas as pd
import pytest
from click.testing import CliRunner

from variantlab.cli.main import main
from variantlab.config.experiment import load_experiment
from variantlab.executors.runner import plan_units
from variantlab.store.store import results
from variantlab.sweep import keys as fingerprint

PLUGIN = '''
from typing import Literal

import torch
from torch import nn

import variantlab


class ScaledTanhSpec(variantlab.ComponentSpec):
    kind: Literal["scaled_tanh"] = "scaled_tanh"


class ScaledTanh(nn.Module):
    def forward(self, x):
        return torch.tanh(x) * SCALE


@variantlab.hookimpl
def register_activations(register):
    register("scaled_tanh", ScaledTanhSpec, lambda spec: ScaledTanh())
'''

EXPERIMENT = """\
name: fresh
seeds: [0, 1]
model: {family: gpt, vocab_size: 64, context_length: 32, emb_dim: 32, n_heads: 4,
        n_layers: 2, drop_rate: 0.0}
grid:
  activation.kind: [gelu, scaled_tanh]
plugins: [scaled_tanh.py]
measure:
  params: {}
  gradients: {batch_size: 2, seq_len: 16, batches: 1}
"""


def write(folder: Path, scale: str = "1.0") -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "scaled_tanh.py").write_text(PLUGIN.replace("SCALE", scale))
    path = folder / "exp.yaml"
    path.write_text(EXPERIMENT)
    return path


def run(*args: object):
    result = CliRunner().invoke(main, ["run", *map(str, args), "--no-report"])
    if result.exception and not isinstance(result.exception, SystemExit):
        raise result.exception
    return result


def stored_already(output: str) -> int:
    """The "N stored already" count of the run summary (0 when the line says none)."""
    import re

    found = re.search(r"(\d+) stored already", output)
    return int(found.group(1)) if found else 0


def gradient_values(run_dir: Path) -> pd.DataFrame:
    frame = results(run_dir)
    frame = frame[(frame.probe == "gradients") & (frame.status == "ok")]
    cols = ["variant", "seed", "metric", "scope", "name", "layer"]
    return frame.sort_values(cols, na_position="first")[cols + ["value", "unit_key"]] \
        .reset_index(drop=True)


@pytest.mark.slow
def test_editing_a_plugin_recomputes_its_units_with_the_new_code(tmp_path):
    exp = write(tmp_path / "exp")
    out = tmp_path / "runs"
    first = run(exp, "--out", out)
    assert first.exit_code == 0, first.output
    before = gradient_values(out / "fresh")
    assert stored_already(first.output) == 0

    write(tmp_path / "exp", scale="2.0")  # the plugin's forward now doubles
    second = run(exp, "--out", out)
    assert second.exit_code == 0, second.output
    # gelu's 4 units (params+gradients, 2 seeds) are stored; scaled_tanh's 4 are recomputed
    assert stored_already(second.output) == 4
    after = gradient_values(out / "fresh")
    assert len(after) == len(before) > 0
    gelu_b, gelu_a = (f[f.variant.str.contains("gelu")] for f in (before, after))
    pd.testing.assert_frame_equal(gelu_a, gelu_b)  # untouched units: same keys, same numbers
    new_b, new_a = (f[f.variant.str.contains("scaled_tanh")] for f in (before, after))
    assert not set(new_a.unit_key) & set(new_b.unit_key)  # old keys are gone from results()
    changed = (new_a.value.to_numpy() != new_b.value.to_numpy())
    assert changed.sum() > len(new_a) // 2  # the numbers are the new code's

    fresh = write(tmp_path / "clean", scale="2.0")  # a fresh run of the new code elsewhere
    assert run(fresh, "--out", tmp_path / "clean-runs").exit_code == 0
    pd.testing.assert_frame_equal(gradient_values(tmp_path / "clean-runs" / "fresh"), after)

    third = run(exp, "--out", out)  # nothing changed: nothing recomputed
    assert third.exit_code == 0 and stored_already(third.output) == 8, third.output


@pytest.mark.slow
def test_editing_a_plugin_recomputes_with_workers(tmp_path):
    exp = write(tmp_path / "exp")
    out = tmp_path / "runs"
    assert run(exp, "--out", out, "--workers", 2).exit_code == 0
    before = gradient_values(out / "fresh")
    write(tmp_path / "exp", scale="2.0")
    second = run(exp, "--out", out, "--workers", 2)
    assert second.exit_code == 0, second.output  # worker keys equal the driver's
    assert stored_already(second.output) == 4
    after = gradient_values(out / "fresh")
    fresh = write(tmp_path / "clean", scale="2.0")
    assert run(fresh, "--out", tmp_path / "clean-runs").exit_code == 0
    pd.testing.assert_frame_equal(gradient_values(tmp_path / "clean-runs" / "fresh"), after)
    new_b = before[before.variant.str.contains("scaled_tanh")]
    new_a = after[after.variant.str.contains("scaled_tanh")]
    assert (new_a.value.to_numpy() != new_b.value.to_numpy()).sum() > len(new_a) // 2
    third = run(exp, "--out", out, "--workers", 2)
    assert third.exit_code == 0 and stored_already(third.output) == 8, third.output


def test_keys_depend_on_plugin_source_only_for_variants_using_it(tmp_path):
    exp_path = write(tmp_path)
    keys = {(u.variant.name, u.seed, u.probe): u.key for u in plan_units(load_experiment(exp_path))}
    again = {(u.variant.name, u.seed, u.probe): u.key
             for u in plan_units(load_experiment(exp_path))}
    assert keys == again  # deterministic
    (tmp_path / "scaled_tanh.py").write_text(PLUGIN.replace("SCALE", "1.0") + "\n# comment\n")
    edited = {(u.variant.name, u.seed, u.probe): u.key
              for u in plan_units(load_experiment(exp_path))}
    for unit, key in keys.items():
        assert (edited[unit] != key) == ("scaled_tanh" in unit[0]), unit


def test_text_data_content_is_part_of_the_key(tmp_path):
    (tmp_path / "corpus").mkdir()
    (tmp_path / "corpus" / "a.txt").write_text("the cat sat on the mat. " * 50)
    path = tmp_path / "exp.yaml"
    path.write_text(textwrap.dedent("""\
        name: text
        model: {family: gpt, vocab_size: 64, context_length: 32, emb_dim: 32, n_heads: 4,
                n_layers: 2, drop_rate: 0.0}
        data: {source: text, path: "corpus/*.txt"}
        measure: {params: {}, gradients: {batch_size: 2, seq_len: 16, batches: 1}}
        """))
    first = [u.key for u in plan_units(load_experiment(path))]
    (tmp_path / "corpus" / "a.txt").write_text("a dog ran in the park. " * 50)
    second = [u.key for u in plan_units(load_experiment(path))]
    (tmp_path / "corpus" / "b.txt").write_text("one more file")
    third = [u.key for u in plan_units(load_experiment(path))]
    assert len({first[1], second[1], third[1]}) == 3  # gradients read the text
    assert len(set(first) & set(second)) == 0  # params keys carry the data spec too


def test_environment_covers_core_code_and_versions():
    import torch

    import variantlab

    env = fingerprint.environment()
    assert env["torch"] == torch.__version__ and env["variantlab"] == variantlab.__version__
    assert len(env["code"]) == 64


def test_module_digest_hashes_a_whole_package(tmp_path, monkeypatch):
    pkg = tmp_path / "mypkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("from .helpers import k\n")
    (pkg / "helpers.py").write_text("k = 1\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    import importlib

    module = importlib.import_module("mypkg")
    first = fingerprint.module_digest(module)
    (pkg / "helpers.py").write_text("k = 22\n")  # a helper beside the plugin module
    assert fingerprint.module_digest(module) != first


@pytest.mark.slow
def test_rerun_recomputes_all_or_one_probe(tmp_path):
    exp = write(tmp_path / "exp")
    out = tmp_path / "runs"
    assert run(exp, "--out", out).exit_code == 0
    first = results(out / "fresh")
    everything = run(exp, "--out", out, "--rerun")
    assert everything.exit_code == 0 and stored_already(everything.output) == 0
    one = run(exp, "--out", out, "--rerun", "gradients")
    assert one.exit_code == 0 and stored_already(one.output) == 4, one.output
    again = results(out / "fresh")
    cols = ["variant", "seed", "probe", "metric", "scope", "name", "layer", "value"]
    pd.testing.assert_frame_equal(again[cols], first[cols])  # same numbers, not doubled
    bad = run(exp, "--out", out, "--rerun", "gradient")
    assert bad.exit_code == 2
    assert "'gradient' is not a probe" in bad.output and "all, params, gradients" in bad.output
    assert "Traceback" not in bad.output


def test_only_code_that_computes_numbers_is_in_the_key():
    from variantlab.sweep.keys import core_files

    (root, files), = core_files("variantlab").items()
    names = {f.relative_to(root).as_posix() for f in files}
    assert {"model/build.py", "probes/gradients.py", "data/sources.py", "data/gpt2.tiktoken",
            "plugin/registry.py", "plugin/rows.py"} <= names
    assert {n.split("/")[0] for n in names} == {"plugin", "model", "data", "probes"}
    # messages, checks, scheduling, storage and presentation never make results stale
    assert not names & {"errors.py", "sweep/preflight.py", "config/checks.py", "cli/main.py",
                        "executors/runner.py", "store/store.py", "config/schema.py"}
    (builtin_root, builtin), = core_files("variantlab_plugins").items()
    assert {"norms.py", "attentions.py", "probes.py"} <= {f.name for f in builtin}


def test_an_edited_message_keeps_every_unit_key(tmp_path, monkeypatch):
    """Copy the core, edit a message in errors.py and in the preflight checks: the code
    digest is unchanged; edit a model module: it changes."""
    import shutil

    import variantlab

    src = Path(variantlab.__file__).parent
    copy = tmp_path / "variantlab"
    shutil.copytree(src, copy, ignore=shutil.ignore_patterns("__pycache__"))

    def digest() -> str:
        from variantlab.sweep.keys import NUMBER_FOLDERS, number_files, tree_digest

        return tree_digest(number_files(copy, NUMBER_FOLDERS["variantlab"]), copy)

    before = digest()
    for rel in ("errors.py", "sweep/preflight.py"):
        path = copy / rel
        path.write_text(path.read_text().replace("is not", "isn't"))
    assert digest() == before
    build = copy / "model" / "build.py"
    build.write_text(build.read_text() + "\n# an edit\n")
    assert digest() != before
