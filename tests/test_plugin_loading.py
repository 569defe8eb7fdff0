"""Plugin loading: files beside an experiment, broken plugins, entry points, duplicates, typos."""

import json
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

import variantlab as vl
import variantlab.plugin.registry as registry_mod
from variantlab.config.catalog import failure_rows, plugin_rows
from variantlab.errors import DuplicateKindError, PluginLoadError

FIXTURES = Path(__file__).parent / "plugins_fixtures"


def fixture(name: str) -> str:
    return str(FIXTURES / name)


def test_plugin_file_beside_experiment_is_listed_and_used(tmp_path, tiny):
    shutil.copy(FIXTURES / "local_norm.py", tmp_path / "local_norm.py")
    reg = vl.build_registry(extra=["local_norm.py"], base_dir=tmp_path, entry_points=False)
    rows = {(r["slot"], r["kind"]): r for r in plugin_rows(reg, "norm")}
    row = rows[("norm", "centre")]
    assert row["plugin"] == "local_norm.py" and row["source"] == "module"
    assert row["params"] == [{"name": "init_scale", "type": "float (> 0)", "default": 1.0,
                              "description": "initial value of the per-channel scale"}]
    model = vl.build_model({**tiny, "norm": {"kind": "centre", "init_scale": 0.5}}, reg)
    norms = [m for m in model.modules() if getattr(m, "variantlab_slot", None) == "norm"]
    assert len(norms) == 5 and all(m.variantlab_kind == "centre" for m in norms)
    assert torch.equal(norms[0].scale, torch.full((32,), 0.5))
    x = torch.randn(3, 32)
    assert torch.allclose(norms[0](x), 0.5 * (x - x.mean(-1, keepdim=True)))
    logits = model(torch.randint(0, 64, (2, 8)))
    assert logits.shape == (2, 8, 64) and torch.isfinite(logits).all()


def test_module_name_beside_experiment_is_importable(tmp_path, tiny):
    shutil.copy(FIXTURES / "local_norm.py", tmp_path / "my_norms_mod.py")
    reg = vl.build_registry(extra=["my_norms_mod"], base_dir=tmp_path, entry_points=False)
    assert reg.get("norm", "centre").plugin == "my_norms_mod"


def test_experiment_plugins_list_loads_the_file(tmp_path):
    from variantlab.config import experiment
    shutil.copy(FIXTURES / "local_norm.py", tmp_path / "local_norm.py")
    (tmp_path / "exp.yaml").write_text(textwrap.dedent("""\
        name: centre-vs-layer
        seeds: [0]
        model: {family: gpt, vocab_size: 64, context_length: 32, emb_dim: 32, n_heads: 4,
                n_layers: 2, drop_rate: 0.0}
        grid:
          norm.kind: [layer, centre]
        plugins: [local_norm.py]
        measure: {params: {}}
        """))
    exp = experiment.load_experiment(tmp_path / "exp.yaml")
    assert [v.spec.norm.kind for v in exp.variants] == ["layer", "centre"]
    assert exp.registry.get("norm", "centre").plugin == "local_norm.py"


def test_plugin_raising_on_import_names_it():
    with pytest.raises(PluginLoadError) as info:
        vl.build_registry(extra=[fixture("raises_on_import.py")], entry_points=False)
    message = str(info.value)
    assert "raises_on_import.py" in message and "broken on purpose" in message


def test_missing_plugin_file_is_an_error_naming_it(tmp_path):
    with pytest.raises(PluginLoadError, match="nothere.py"):
        vl.build_registry(extra=["nothere.py"], base_dir=tmp_path, entry_points=False)


def test_duplicate_kind_names_both_plugins():
    with pytest.raises(PluginLoadError) as info:
        vl.build_registry(extra=[fixture("duplicate_layer.py")], entry_points=False)
    # build_registry wraps the DuplicateKindError; the cause keeps its type
    assert isinstance(info.value, DuplicateKindError) or isinstance(
        info.value.__cause__, DuplicateKindError)
    message = str(info.value)
    assert "variantlab_plugins.norms" in message and "duplicate_layer.py" in message
    assert "'layer'" in message


def test_misspelled_hook_is_caught():
    with pytest.raises(PluginLoadError) as info:
        vl.build_registry(extra=[fixture("misspelled_hook.py")], entry_points=False)
    assert "register_norm" in str(info.value) and "misspelled_hook.py" in str(info.value)


def test_failed_plugin_leaves_nothing_registered():
    reg = vl.build_registry(entry_points=False)
    with pytest.raises(DuplicateKindError):
        reg.load(fixture("duplicate_layer.py"))
    assert reg.get("norm", "layer").plugin == "variantlab_plugins.norms"
    assert fixture("duplicate_layer.py") not in dict(reg.plugins)


class FakeEntryPoint:
    def __init__(self, name: str, target):
        self.name, self.target = name, target
        self.dist = SimpleNamespace(name=f"fake-{name}")

    def load(self):
        if isinstance(self.target, Exception):
            raise self.target
        return self.target


def fake_entry_points(monkeypatch, *eps):
    def entry_points(group=None, **kw):
        assert group == "variantlab"
        return list(eps)

    monkeypatch.setattr(registry_mod.importlib.metadata, "entry_points", entry_points)


def load_fixture_module(name: str):
    return registry_mod.import_target(fixture(name))


def test_failing_entry_point_is_skipped_and_recorded(monkeypatch):
    monkeypatch.delenv("VARIANTLAB_STRICT_PLUGINS", raising=False)
    good = load_fixture_module("local_norm.py")
    fake_entry_points(monkeypatch, FakeEntryPoint("broken", ImportError("no module named zzz")),
                      FakeEntryPoint("centre", good))
    with pytest.warns(UserWarning, match="fake-broken:broken"):
        reg = vl.build_registry()
    assert reg.get("norm", "centre").plugin == "fake-centre:centre"
    assert dict(reg.plugins)["fake-centre:centre"] == "entry point"
    rows = failure_rows(reg)
    assert [(r["plugin"], r["source"]) for r in rows] == [("fake-broken:broken", "entry point")]
    assert rows[0]["error"] == "ImportError: no module named zzz"
    assert "Traceback" in rows[0]["traceback"]


def test_entry_point_failure_is_fatal_when_strict(monkeypatch):
    monkeypatch.setenv("VARIANTLAB_STRICT_PLUGINS", "1")
    fake_entry_points(monkeypatch, FakeEntryPoint("broken", ImportError("no module named zzz")))
    with pytest.raises(PluginLoadError, match="fake-broken:broken.*no module named zzz"):
        vl.build_registry()


def test_entry_point_duplicating_a_builtin_is_skipped(monkeypatch):
    monkeypatch.delenv("VARIANTLAB_STRICT_PLUGINS", raising=False)
    fake_entry_points(monkeypatch, FakeEntryPoint("dup", load_fixture_module("duplicate_layer.py")))
    with pytest.warns(UserWarning):
        reg = vl.build_registry()
    (row,) = failure_rows(reg)
    assert "variantlab_plugins.norms" in row["error"] and "fake-dup:dup" in row["error"]
    assert reg.get("norm", "layer").plugin == "variantlab_plugins.norms"


# -- the CLI parts (issue 5, "What it must show" 2) --------------------------------------
def cli(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "variantlab", *args], cwd=cwd,
                          capture_output=True, text=True, timeout=300)


def write_experiment(folder: Path, plugins: list[str], kinds: list[str]) -> Path:
    path = folder / "exp.yaml"
    path.write_text(textwrap.dedent(f"""\
        name: plugin-check
        seeds: [0]
        model: {{family: gpt, vocab_size: 64, context_length: 32, emb_dim: 32, n_heads: 4,
                n_layers: 2, drop_rate: 0.0}}
        grid:
          norm.kind: {json.dumps(kinds)}
        plugins: {json.dumps(plugins)}
        measure:
          params: {{}}
          gradients: {{batch_size: 2, seq_len: 8, batches: 1}}
        """))
    return path


def test_cli_exit_2_names_a_plugin_that_raises_on_import(tmp_path):
    shutil.copy(FIXTURES / "raises_on_import.py", tmp_path / "raises_on_import.py")
    write_experiment(tmp_path, ["raises_on_import.py"], ["layer"])
    result = cli("validate", "exp.yaml", cwd=tmp_path)
    assert result.returncode == 2, result.stdout + result.stderr
    assert "raises_on_import.py" in result.stderr
    assert "Traceback" not in result.stderr


def test_cli_plugins_lists_a_plugin_file(tmp_path):
    shutil.copy(FIXTURES / "local_norm.py", tmp_path / "local_norm.py")
    result = cli("plugins", "--slot", "norm", "--json", "--plugin", "local_norm.py", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    kinds = {r["kind"]: r for r in json.loads(result.stdout)["components"]}
    assert {"layer", "batch", "rms", "none", "centre"} <= set(kinds)
    assert kinds["centre"]["plugin"] == "local_norm.py"


@pytest.mark.slow
def test_cli_forward_that_raises_fails_only_its_own_variants(tmp_path):
    from variantlab.store import store
    shutil.copy(FIXTURES / "explodes.py", tmp_path / "explodes.py")
    write_experiment(tmp_path, ["explodes.py"], ["layer", "explodes"])
    result = cli("run", "exp.yaml", "--out", "runs", "--no-report", cwd=tmp_path)
    assert result.returncode == 1, result.stdout + result.stderr
    assert "explodes: forward fails on purpose" in result.stdout + result.stderr
    frame = store.results(tmp_path / "runs" / "plugin-check")
    variants = sorted(frame.variant.unique())
    (bad,) = [v for v in variants if "explodes" in v]
    (good,) = [v for v in variants if v != bad]
    failed = frame[frame.status == "failed"]
    assert set(failed.variant) == {bad} and set(failed.probe) == {"gradients"}
    assert failed.error.str.contains("explodes: forward fails on purpose").all()
    ok = frame[frame.status == "ok"]
    assert set(ok[ok.variant == good].probe) == {"params", "gradients"}
    assert set(ok[ok.variant == bad].probe) == {"params"}  # params never calls forward
    assert (ok[(ok.probe == "gradients") & (ok.metric == "loss")].value > 0).all()


def test_a_plugin_file_edited_within_the_same_second_runs_its_new_code(tmp_path):
    """Python trusts cached bytecode whose source has the same size and whole-second mtime;
    a plugin file is compiled from its source every time, and leaves no __pycache__."""
    import os

    plugin = tmp_path / "scale.py"
    plugin.write_text("SCALE = 1.0\n")
    stamp = (1_700_000_000, 1_700_000_000)
    os.utime(plugin, stamp)
    sys.dont_write_bytecode, before = False, sys.dont_write_bytecode
    try:
        first = registry_mod.import_target("scale.py", base_dir=tmp_path)
        plugin.write_text("SCALE = 2.0\n")  # the same size
        os.utime(plugin, stamp)  # and the same mtime
        second = registry_mod.import_target("scale.py", base_dir=tmp_path)
    finally:
        sys.dont_write_bytecode = before
    assert (first.SCALE, second.SCALE) == (1.0, 2.0)
    assert not (tmp_path / "__pycache__").exists()


def test_a_plugin_module_edited_within_the_same_second_runs_its_new_code(tmp_path):
    """The same for a plugin given by module name: every module of its package (whose
    ``.py`` files its unit keys hash) comes from its source as it is now."""
    import os

    package = tmp_path / "scalepkg_edit"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "parts.py").write_text("FACTOR = 1.0\n")
    (package / "comps.py").write_text("from .parts import FACTOR\nSCALE = 1.0 * FACTOR\n")
    stamp = (1_700_000_000, 1_700_000_000)
    for f in package.iterdir():
        os.utime(f, stamp)
    names = ["scalepkg_edit", "scalepkg_edit.parts", "scalepkg_edit.comps"]
    sys.dont_write_bytecode, before = False, sys.dont_write_bytecode
    try:
        first = registry_mod.import_target("scalepkg_edit.comps", base_dir=tmp_path)
        for name in names:
            sys.modules.pop(name)  # a new process, as the next run
        (package / "parts.py").write_text("FACTOR = 3.0\n")  # the same size
        (package / "comps.py").write_text("from .parts import FACTOR\nSCALE = 2.0 * FACTOR\n")
        for f in package.iterdir():
            os.utime(f, stamp)  # and the same mtimes
        second = registry_mod.import_target("scalepkg_edit.comps", base_dir=tmp_path)
    finally:
        sys.dont_write_bytecode = before
        for name in names:
            sys.modules.pop(name, None)
    assert (first.SCALE, second.SCALE) == (1.0, 6.0)
    assert not (package / "__pycache__").exists()
    assert "variantlab" not in registry_mod.SOURCE_ONLY.tops  # the core keeps its bytecode
