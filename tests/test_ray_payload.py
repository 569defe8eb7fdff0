"""What ``--executor ray`` ships (issue 21.2), checked without starting Ray: the plugin files
and the data files ``data:`` matches and nothing else beside them; never ``--out`` or a Ray
temp folder; a payload above ``--ray-max-upload`` refused with exit 2 naming the largest
files; the staged working folder rebuilds the experiment with the same unit keys."""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import FAST_PROBES, TINY_MODEL, invoke

from variantlab.config.experiment import load_experiment
from variantlab.errors import SpecError
from variantlab.executors import ray_payload
from variantlab.executors.base import ExperimentSource
from variantlab.executors.runner import plan_units

NORM = '''
from typing import Literal

from torch import nn

import variantlab


class HalfSpec(variantlab.ComponentSpec):
    kind: Literal["half_layer"] = "half_layer"


@variantlab.hookimpl
def register_norms(register):
    register("half_layer", HalfSpec, lambda spec, dim: nn.LayerNorm(dim))
'''
TEXT = "the quick brown fox jumps over the lazy dog. " * 40


def big(path: Path, mb: float) -> Path:
    """A sparse file of ``mb`` MB (its size counts; no disk used)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "wb") as f:
        f.truncate(int(mb * 1e6))
    return path


def folder_with(tmp_path: Path, data: str = "corpus/*.txt") -> Path:
    """An experiment folder: the YAML, a plugin file, two text files data.path matches,
    a 300 MB checkpoint beside the YAML and a notes file nothing reads."""
    folder = tmp_path / "exp"
    (folder / "corpus").mkdir(parents=True)
    (folder / "norms.py").write_text(NORM)
    (folder / "corpus" / "a.txt").write_text(TEXT)
    (folder / "corpus" / "b.txt").write_text(TEXT.upper())
    big(folder / "checkpoint.pt", 300)
    (folder / "notes.md").write_text("not read by any unit\n")
    (folder / "exp.yaml").write_text(
        f"name: ship\nseeds: [0]\nmodel: {TINY_MODEL}\nplugins: [norms.py]\n"
        f"data: {{source: text, path: '{data}'}}\n"
        "grid:\n  norm.kind: [layer, half_layer]\n" + FAST_PROBES)
    return folder


def shipped(payload: ray_payload.Payload) -> set[str]:
    return {rel for _, rel in payload.files}


def test_only_the_plugin_and_the_matched_data_files_are_shipped(tmp_path, monkeypatch):
    folder = folder_with(tmp_path)
    exp = load_experiment(folder / "exp.yaml")
    payload = ray_payload.select(exp, (), tmp_path / "runs" / "ship")
    assert shipped(payload) == {"norms.py", "corpus/a.txt", "corpus/b.txt"}
    assert payload.base == "." and payload.plugin_files == [] and payload.modules == []
    total = ray_payload.check_size(payload, ray_payload.DEFAULT_MAX_MB)  # the 300 MB stays
    assert total == len(NORM) + 2 * len(TEXT)

    stage = tmp_path / "stage"
    env, plugins, base = ray_payload.stage(payload, stage)
    work = Path(env["working_dir"])
    assert sorted(p.relative_to(work).as_posix() for p in work.rglob("*") if p.is_file()) == \
        ["corpus/a.txt", "corpus/b.txt", "norms.py"]
    assert plugins is None and "py_modules" not in env and base == "."
    # a worker rebuilds the experiment from its copy: the same units, the same keys
    monkeypatch.chdir(work)
    source = ExperimentSource.of(exp)
    _, units = ExperimentSource(source.text, source.path, base).load()
    assert sorted(units) == sorted(u.key for u in plan_units(exp))


def test_out_and_a_ray_temp_folder_inside_the_experiment_folder_are_not_shipped(
        tmp_path, monkeypatch):
    folder = folder_with(tmp_path, data="**/*.txt")
    # Ray's temp folder (as `ray start --temp-dir` puts it) and one named by RAY_TMPDIR,
    # both inside the experiment's folder, and --out there too: all hold .txt files
    (folder / "raytmp" / "session_2026").mkdir(parents=True)
    (folder / "raytmp" / "session_latest").symlink_to(folder / "raytmp" / "session_2026")
    big(folder / "raytmp" / "session_2026" / "logs" / "worker.txt", 500)
    big(folder / "envtmp" / "x.txt", 500)
    monkeypatch.setenv("RAY_TMPDIR", str(folder / "envtmp"))
    big(folder / "runs" / "ship" / "report" / "table.txt", 500)
    big(folder / "runs" / "older" / "log.txt", 500)
    exp = load_experiment(folder / "exp.yaml")
    payload = ray_payload.select(exp, (), folder / "runs" / "ship")
    assert shipped(payload) == {"norms.py", "corpus/a.txt", "corpus/b.txt"}
    ray_payload.check_size(payload, 1)


def test_out_that_holds_the_experiment_folder_only_keeps_the_run_folder_back(tmp_path):
    folder = folder_with(tmp_path)
    big(folder / "corpus" / "ship" / "c.txt", 1)  # the run folder (--out .)
    payload = ray_payload.select(load_experiment(folder / "exp.yaml"), (), folder / "ship")
    assert shipped(payload) == {"norms.py", "corpus/a.txt", "corpus/b.txt"}


def test_a_large_data_file_is_refused_above_the_limit_naming_it(tmp_path):
    folder = folder_with(tmp_path)
    big(folder / "corpus" / "huge.txt", 150)
    payload = ray_payload.select(load_experiment(folder / "exp.yaml"), (), None)
    with pytest.raises(SpecError) as err:
        ray_payload.check_size(payload, ray_payload.DEFAULT_MAX_MB)
    message = str(err.value.issues[0].message)
    assert "would ship 150.0 MB in 4 file(s)" in message and "limit of 100 MB" in message
    assert f"the largest: {folder / 'corpus' / 'huge.txt'} (150.0 MB), " in message
    assert "same absolute path" in message and "--ray-max-upload MB" in message
    assert ray_payload.check_size(payload, 200) == int(150e6) + len(NORM) + 2 * len(TEXT)


def test_data_outside_the_folder_and_absolute_plugins(tmp_path, monkeypatch):
    folder = folder_with(tmp_path, data="../shared/*.txt")
    (tmp_path / "shared").mkdir()
    (tmp_path / "shared" / "s.txt").write_text(TEXT)
    (tmp_path / "lib").mkdir()
    (tmp_path / "lib" / "extra.py").write_text("X = 1\n")
    exp = load_experiment(folder / "exp.yaml", extra_plugins=[str(tmp_path / "lib/extra.py")])
    payload = ray_payload.select(exp, [str(tmp_path / "lib/extra.py")], None)
    # the working folder is the folders' common parent; the experiment sits in it at exp/
    assert shipped(payload) == {"exp/norms.py", "shared/s.txt"} and payload.base == "exp"
    assert [t for t, _ in payload.plugin_files] == [str(tmp_path / "lib/extra.py")]
    env, plugins, base = ray_payload.stage(payload, tmp_path / "stage")
    assert plugins is not None and len(env["py_modules"]) == 1
    monkeypatch.chdir(env["working_dir"])
    source = ExperimentSource.of(exp)
    _, units = ExperimentSource(source.text, source.path, base).load()
    assert sorted(units) == sorted(u.key for u in plan_units(exp))

    # an absolute data path is read there on every node: not shipped
    text = (folder / "exp.yaml").read_text().replace("../shared", str(tmp_path / "shared"))
    (folder / "exp.yaml").write_text(text)
    payload = ray_payload.select(load_experiment(folder / "exp.yaml"), (), None)
    assert shipped(payload) == {"norms.py"}
    # a glob that matches nothing ships nothing (the units fail saying so)
    (folder / "exp.yaml").write_text(text.replace(str(tmp_path / "shared"), "none"))
    payload = ray_payload.select(load_experiment(folder / "exp.yaml"), (), None)
    assert shipped(payload) == {"norms.py"}


def test_a_plugin_package_in_the_folder_ships_its_files_only(tmp_path, monkeypatch):
    folder = tmp_path / "exp"
    (folder / "mynorms" / "__pycache__").mkdir(parents=True)
    (folder / "mynorms" / "__init__.py").write_text(NORM)
    (folder / "mynorms" / "__pycache__" / "x.pyc").write_bytes(b"0")
    big(folder / "weights.bin", 200)
    (folder / "exp.yaml").write_text(
        f"name: pkg\nseeds: [0]\nmodel: {TINY_MODEL}\nplugins: [mynorms]\n"
        "grid:\n  norm.kind: [half_layer]\n" + FAST_PROBES)
    monkeypatch.syspath_prepend(str(folder))
    payload = ray_payload.select(load_experiment(folder / "exp.yaml"), (), None)
    assert shipped(payload) == {"mynorms/__init__.py"}


def test_the_cli_refuses_an_oversize_payload_before_ray_starts(tmp_path):
    pytest.importorskip("ray")
    folder = folder_with(tmp_path)
    (folder / "corpus" / "huge.txt").write_text(TEXT * 20)  # 36 kB
    result = invoke("run", folder / "exp.yaml", "--out", tmp_path / "runs", "--executor", "ray",
                    "--ray-max-upload", "0.01")
    assert result.exit_code == 2, result.output
    line = " ".join(result.output.split())
    assert "\n--ray-max-upload: --executor ray would ship 39.9 kB in 4 file(s) to the " \
        "workers, above the limit of 0.01 MB" in result.output, line
    assert f"{folder / 'corpus' / 'huge.txt'} (36.0 kB)" in line
    assert "Traceback" not in result.output and not (tmp_path / "runs").exists()
    # the option is Ray's: another executor refuses it
    other = invoke("run", folder / "exp.yaml", "--out", tmp_path / "runs",
                   "--ray-max-upload", "1")
    assert other.exit_code == 2 and "--ray-max-upload: the inprocess executor does not take it" \
        in " ".join(other.output.split())
