"""The hostile and careless-user cases of issue 38 (C1-C10 and the two new-user findings),
each run as the repro was: a warning and the right numbers, or one line and exit 2; never a
traceback, a wrong number stored, or something computed lost."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch
from test_hostile_round4 import cli  # CliRunner: the exit code and the lines, no traceback

from variantlab.probes import checkpoint

MODEL = ("model: {family: gpt, vocab_size: 64, context_length: 32, emb_dim: 32, n_heads: 4, "
         "n_layers: 2, drop_rate: 0.0")
TRAIN = "  training: {steps: 6, batch_size: 2, seq_len: 8, eval_batches: 1}\n"


def experiment(tmp: Path, *, model_extra: str = "", grid: str = "", data: str = "",
               measure: str = TRAIN, name: str = "demo") -> Path:
    exp = tmp / f"{name}.yaml"
    exp.write_text(f"name: {name}\nseeds: [0]\n{MODEL}{model_extra}}}\n{data}{grid}"
                   f"measure:\n{measure}")
    return exp


def rows_of(run: Path) -> dict[str, list[float]]:
    """Each variant's training loss per step and its final loss, as stored."""
    import variantlab as vl

    frame = vl.results(run)
    out: dict[str, list[float]] = {}
    for variant, part in frame.groupby("variant"):
        loss = part[part["metric"] == "loss"].sort_values("step")
        out[str(variant)] = [*loss["value"], *part[part["metric"] == "final_loss"]["value"]]
    return out


def unit_key(exp: Path) -> str:
    from variantlab.config.experiment import load_experiment
    from variantlab.sweep.units import plan_units

    (unit,) = plan_units(load_experiment(exp))
    return unit.key


# -- C1, C2: a checkpoint that does not fit its unit -------------------------------------------
@pytest.fixture(scope="module")
def real_checkpoint(tmp_path_factory) -> tuple[Path, dict[str, list[float]]]:
    """A checkpoint a 6-step unit left after 4 steps (of another model: emb_dim 48), and the
    stored rows of a clean run of the experiment the tests resume."""
    tmp = tmp_path_factory.mktemp("ckpt")
    mp = pytest.MonkeyPatch()
    try:
        mp.setenv(checkpoint.STEPS_VAR, "2")
        mp.setattr(checkpoint, "remove", lambda key: None)  # kept although stored ok
        other = experiment(tmp, name="other")
        other.write_text(other.read_text().replace("emb_dim: 32", "emb_dim: 48"))
        code, lines = cli("run", other, "--out", tmp / "runs", "--no-report")
        assert code == 0, lines
        (found,) = (tmp / "runs" / "other" / "checkpoints").glob("*.pt")
        mp.delenv(checkpoint.STEPS_VAR)
        code, lines = cli("run", experiment(tmp), "--out", tmp / "clean", "--no-report")
        assert code == 0, lines
    finally:
        mp.undo()
    return found, rows_of(tmp / "clean" / "demo")


def _edit(state: dict, **changes: object) -> dict:
    return {**state, **changes}


CASES = {
    "another-units": (None, "it belongs to unit"),
    "another-model": ("model", "its embed.tok_emb.weight is [64, 48], this model's is [64, 32]"),
    "empty": ("empty", "it holds no step count ('done')"),
    "negative-done": (-5, "its step -5 is not inside this unit's 6 steps"),
    "done-past-the-end": (1000, "its step 1000 is not inside this unit's 6 steps"),
    "garbage": ("garbage", "it cannot be read: "),
    "losses-short": ("losses", "it holds 2 losses for 4 steps"),
}


@pytest.mark.parametrize("case", list(CASES))
def test_c1_c2_a_checkpoint_that_does_not_fit_is_set_aside_and_the_unit_starts_over(
        tmp_path, monkeypatch, real_checkpoint, case):
    found, clean = real_checkpoint
    edit, why = CASES[case]
    exp = experiment(tmp_path)
    key = unit_key(exp)
    folder = tmp_path / "runs" / "demo" / "checkpoints"
    folder.mkdir(parents=True)
    planted = folder / f"{key}.pt"
    state = torch.load(found, weights_only=True)
    if edit == "empty":
        torch.save({}, planted)
    elif edit == "garbage":
        planted.write_bytes(b"\x00not a checkpoint" * 10)
    elif edit == "model":  # its key and steps made to fit: only the tensors give it away
        torch.save(_edit(state, key=key), planted)
    elif edit == "losses":  # its key, steps and tensors fit; its records do not
        records = {**state["records"], "losses": state["records"]["losses"][:2]}
        torch.save(_edit(state, key=key, records=records, model={}), planted)
    elif isinstance(edit, int):  # this unit's own key, a step outside the run
        torch.save(_edit(state, key=key, done=edit, model={}), planted)
    else:
        shutil.copy(found, planted)
    monkeypatch.setenv(checkpoint.STEPS_VAR, "2")
    for attempt in range(2):  # never sticky: the rerun finds the unit stored
        code, lines = cli("run", exp, "--out", tmp_path / "runs", "--no-report")
        assert code == 0, lines
        warned = [line for line in lines if line.startswith("warning: checkpoint:")]
        if attempt == 0:
            assert len(warned) == 1, lines
            assert f"checkpoint {planted} does not fit its unit ({why}" in warned[0]
            assert f"set aside as {planted}.unusable" in warned[0]
            assert "the unit starts over from step 0" in warned[0]
        else:
            assert not warned and any("stored already" in line for line in lines), lines
    assert (folder / f"{key}.pt.unusable").exists()  # renamed, not deleted
    assert not planted.exists()  # the unit finished: its own checkpoints were removed
    assert rows_of(tmp_path / "runs" / "demo") == clean  # 6 loss rows, the clean final loss


@pytest.mark.slow
def test_c1_a_pool_worker_sets_a_checkpoint_aside_and_the_driver_says_so(tmp_path, monkeypatch,
                                                                         real_checkpoint):
    """The warning comes back from a worker process with its unit (``--workers 2``)."""
    found, clean = real_checkpoint
    exp = experiment(tmp_path)
    folder = tmp_path / "runs" / "demo" / "checkpoints"
    folder.mkdir(parents=True)
    planted = folder / f"{unit_key(exp)}.pt"
    shutil.copy(found, planted)  # another unit's
    monkeypatch.setenv(checkpoint.STEPS_VAR, "2")
    code, lines = cli("run", exp, "--out", tmp_path / "runs", "--no-report", "--workers", "2")
    assert code == 0, lines
    warned = [line for line in lines if line.startswith("warning: checkpoint:")]
    assert len(warned) == 1 and f"checkpoint {planted} does not fit its unit (it belongs to " \
        "unit" in warned[0], lines
    assert rows_of(tmp_path / "runs" / "demo") == clean


def test_c2_a_checkpoint_of_the_unit_itself_resumes_as_before(tmp_path, monkeypatch,
                                                              real_checkpoint):
    """The checks keep a real checkpoint: killed after 4 steps, the unit resumes from it."""
    _, clean = real_checkpoint
    exp = experiment(tmp_path)
    monkeypatch.setenv(checkpoint.STEPS_VAR, "2")
    monkeypatch.setattr(checkpoint, "remove", lambda key: None)
    code, lines = cli("run", exp, "--out", tmp_path / "first", "--no-report")
    assert code == 0, lines
    (own,) = (tmp_path / "first" / "demo" / "checkpoints").glob("*.pt")
    assert torch.load(own, weights_only=True)["done"] == 4
    folder = tmp_path / "runs" / "demo" / "checkpoints"
    folder.mkdir(parents=True)
    shutil.copy(own, folder / own.name)
    drawn: list[int] = []
    from variantlab.data.sources import BatchStream

    original = BatchStream.next
    monkeypatch.setattr(BatchStream, "next", lambda self: (
        drawn.append(self.drawn) if self.n == 6 else None) or original(self))
    code, lines = cli("run", exp, "--out", tmp_path / "runs", "--no-report")
    assert code == 0 and not any("warning" in line for line in lines), lines
    assert drawn == [4, 5]  # resumed after step 4
    assert rows_of(tmp_path / "runs" / "demo") == clean


# -- C3: a checkpoint folder that cannot be written --------------------------------------------
@pytest.mark.parametrize("how", ["file-in-its-place", "disk-full"])
def test_c3_an_unwritable_checkpoint_folder_is_one_warning_and_the_run_finishes(
        tmp_path, monkeypatch, real_checkpoint, how):
    _, clean = real_checkpoint
    exp = experiment(tmp_path)
    folder = tmp_path / "runs" / "demo" / "checkpoints"
    if how == "file-in-its-place":
        folder.parent.mkdir(parents=True)
        folder.write_text("a file where the checkpoint folder goes")
        reason = "File exists"
    else:
        def full(*args: object, **kwargs: object) -> None:
            raise OSError(28, "No space left on device")
        monkeypatch.setattr(checkpoint.torch, "save", full)
        reason = "No space left on device"
    monkeypatch.setenv(checkpoint.STEPS_VAR, "1")  # five checkpoints due: one warning
    code, lines = cli("run", exp, "--out", tmp_path / "runs", "--no-report")
    assert code == 0, lines
    warned = [line for line in lines if line.startswith("warning: checkpoint:")]
    assert warned == [f"warning: checkpoint: cannot write checkpoints in {folder} ({reason}); "
                      "units go on without them (one killed now would start over)"], lines
    assert rows_of(tmp_path / "runs" / "demo") == clean
    if folder.is_dir():  # no temporary left behind by the refused writes
        assert not list(folder.iterdir())


# -- C4: checkpoint settings from the environment ----------------------------------------------
@pytest.mark.parametrize(("variable", "value"), [
    (checkpoint.STEPS_VAR, "abc"), (checkpoint.STEPS_VAR, "1.5"), (checkpoint.STEPS_VAR, "-3"),
    (checkpoint.SECONDS_VAR, "soon"), (checkpoint.SECONDS_VAR, "nan")])
def test_c4_a_bad_checkpoint_setting_is_refused_before_anything_runs(tmp_path, monkeypatch,
                                                                     variable, value):
    exp = experiment(tmp_path)
    monkeypatch.setenv(variable, value)
    for command in ("validate", "run"):
        args = [command, exp] + (["--out", tmp_path / "runs"] if command == "run" else [])
        code, lines = cli(*args)
        assert code == 2 and len(lines) == 1, lines
        assert lines[0].startswith(f"{variable}: {value!r} is not a number of "), lines
        assert "or unset it" in lines[0]
    assert not (tmp_path / "runs").exists()


# -- C5: a token cache folder that cannot be used ----------------------------------------------
def text_experiment(tmp: Path) -> Path:
    docs = tmp / "docs"
    docs.mkdir(exist_ok=True)
    words = ["alpha", "beta", "gamma", "delta", "the", "a", "of"]
    for i in range(12):
        (docs / f"d{i:02d}.txt").write_text(" ".join(words[(i * j) % 7] for j in range(80)))
    return experiment(tmp, data="data: {source: text, path: 'docs/*.txt', tokenizer: gpt2}\n")


@pytest.mark.parametrize("how", ["file-in-its-place", "read-only", "disk-full",
                                 "entry-replaced-by-a-folder"])
def test_c5_an_unusable_token_cache_falls_back_to_memory_with_one_warning(tmp_path, monkeypatch,
                                                                          how):
    from variantlab.data import cache as cachelib
    from variantlab.data import sources as datalib

    exp = text_experiment(tmp_path)
    monkeypatch.setenv("VARIANTLAB_CACHE", str(tmp_path / "good"))
    datalib._SPLITS.clear()
    code, lines = cli("run", exp, "--out", tmp_path / "clean", "--no-report")
    assert code == 0, lines
    folder = tmp_path / "cache" / "tokens"
    monkeypatch.setenv("VARIANTLAB_CACHE", str(tmp_path / "cache"))
    if how == "file-in-its-place":
        folder.parent.mkdir()
        folder.write_text("not a folder")
        reason = "File exists"
    elif how == "read-only":  # root writes anywhere: the refusal is simulated
        def read_only(path: Path, write: object) -> None:
            raise OSError(30, "Read-only file system", str(path))
        monkeypatch.setattr(cachelib, "_replace", read_only)
        reason = "Read-only file system at "
    elif how == "disk-full":  # the offsets are written, the tokens are not
        original = cachelib._write_atomic

        def full(path: Path, array: object) -> None:
            if path.name.endswith(".tokens.npy"):
                raise OSError(28, "No space left on device", str(path))
            original(path, array)  # type: ignore[arg-type]
        monkeypatch.setattr(cachelib, "_write_atomic", full)
        reason = "No space left on device at "
    else:
        (entry,) = (tmp_path / "good" / "tokens").glob("*.tokens.npy")
        (folder / entry.name).mkdir(parents=True)
        reason = "Is a directory"
    for command in ("validate", "run"):
        datalib._SPLITS.clear()  # a new process would not have the corpus in memory
        args = [command, exp] + (["--out", tmp_path / "runs", "--no-report"]
                                 if command == "run" else [])
        code, lines = cli(*args)
        assert code == 0, lines
        warned = [line for line in lines if line.startswith("warning: data: token cache")]
        assert len(warned) == 1, lines
        assert warned[0].startswith(f"warning: data: token cache folder {folder} cannot be "
                                    f"used ({reason}"), warned
        assert "the corpus is tokenised in memory for this run" in warned[0]
    assert rows_of(tmp_path / "runs" / "demo") == rows_of(tmp_path / "clean" / "demo")
    if folder.is_dir():  # no partial entry: no file of an entry without its digest
        assert not [p for p in folder.iterdir() if p.is_file()], list(folder.iterdir())


# -- C6: edge extension inside the rules -------------------------------------------------------
def steps_training(name, spec, settings, *, seed, data=None, **_):
    """A training run without compute whose validation loss is lowest at the fewest steps
    when warmup is set (the low edge is best) and at the most steps otherwise."""
    from variantlab.plugin.rows import row

    steps = settings.steps
    loss = 2.0 + (steps / 1000 if settings.warmup_steps else 1 / steps) + 0.01 * seed
    return [row(name, "loss", 4.0, step=0), row(name, "diverged", 0.0),
            row(name, "val_loss", loss), row(name, "eval_loss", loss),
            row(name, "test_loss", loss + 0.1)]


@pytest.mark.parametrize(("measure", "axis", "why"), [
    ("  training: {steps: 10, warmup_steps: 15, batch_size: 2, seq_len: 8, eval_batches: 1}\n",
     "{values: [20, 40], extend: 1}",
     "measure.training.steps=10: warmup_steps=15 is above the 10 steps of the run: the "
     "learning rate would never reach lr"),
    (TRAIN, "{values: [1, 2000], extend: 1}",
     "measure.training.steps=4000000: the budget works out to 4,000,000 steps, more than "
     "the bound of 1,000,000 steps a run may take"),
], ids=["warmup-above-the-steps", "steps-past-the-bound"])
def test_c6_an_extended_value_that_fails_a_grid_check_is_not_added(tmp_path, monkeypatch,
                                                                   measure, axis, why):
    import functools

    from variantlab.executors import runner

    monkeypatch.setattr(runner, "run_experiment", functools.partial(
        runner.run_experiment, probe_fn=steps_training))
    exp = experiment(tmp_path, measure=measure,
                     grid=f"grid:\n  activation.kind: [gelu, relu]\n"
                          f"  measure.training.steps: {axis}\n")
    code, lines = cli("run", exp, "--out", tmp_path / "runs", "--no-report")
    assert code == 0, lines
    skipped = [line for line in lines if line.startswith("warning: edge extension: not added:")]
    assert len(skipped) == 2, lines  # gelu's and relu's
    assert skipped[0].startswith(f"warning: edge extension: not added: activation.kind=gelu,"
                                 f"{why}"), skipped
    assert not any(line.startswith("edge extension, round") for line in lines), lines
    import variantlab as vl

    steps = set(vl.results(tmp_path / "runs" / "demo")["measure.training.steps"])
    assert steps == set(yaml_values(axis))  # nothing beyond the grid was run


def yaml_values(axis: str) -> list[int]:
    import yaml

    return yaml.safe_load(axis)["values"]


def test_c6_the_size_guard_refuses_an_extended_batch_size(tmp_path, monkeypatch):
    from variantlab.config.experiment import load_experiment
    from variantlab.report.fair.extension import Extension, extension_problems, with_variants
    from variantlab.sweep import sizeguard

    exp = load_experiment(experiment(tmp_path, grid="grid:\n  measure.training.batch_size: "
                                                    "{values: [2, 4], extend: 1}\n"))
    added = Extension("base", "measure.training.batch_size", "high", 1 << 24,
                      {"measure.training.batch_size": 1 << 24})
    bigger = with_variants(exp, [added])
    monkeypatch.setattr(sizeguard, "available_bytes", lambda device: 8 << 30)  # 8 GiB
    (problem,) = extension_problems(bigger, added.name)
    assert problem.startswith("training needs about "), problem
    assert extension_problems(bigger, "measure.training.batch_size=4") == []


# -- C7: a norm that pools over positions, wherever it sits -----------------------------------
@pytest.mark.parametrize(("extra", "where"), [
    (",\n        norm: {kind: batch}", "norm"),
    (",\n        attention: {kind: mha, qk_norm: {kind: batch}}", "attention.qk_norm"),
    (",\n        layout: {pattern: [a, b], kinds: {a: {}, b: {norm: {kind: batch}}}}",
     "layout.kinds.b.norm"),
    (",\n        layout: {pattern: [a, b], kinds: {a: {}, b: {attention: {kind: mha, qk_norm: "
     "{kind: batch}}}}}", "layout.kinds.b.attention.qk_norm"),
], ids=["norm", "qk-norm", "layer-kind-norm", "layer-kind-qk-norm"])
def test_c7_a_norm_pooling_over_positions_warns_wherever_it_sits(tmp_path, extra, where):
    exp = experiment(tmp_path, model_extra=extra, measure="  params: {}\n")
    code, lines = cli("run", exp, "--out", tmp_path / "runs", "--no-report")
    assert code == 0, lines
    warned = [line for line in lines if line.startswith("warning: base:")]
    assert warned == [f"warning: base: {where} 'batch' in causal family 'gpt': its batch "
                      "statistics pool over future positions, so in training each token's "
                      "output depends on later tokens"], lines


def test_c7_the_warning_is_true_a_qk_batch_norm_leaks_the_future(tiny):
    """The leak itself: in training mode, changing token 7 changes the logits at 3."""
    import variantlab as vl
    from variantlab.model.build import VariantWarning

    torch.manual_seed(0)
    with pytest.warns(VariantWarning, match="attention.qk_norm 'batch'"):
        model = vl.build_model({**tiny, "attention": {"kind": "mha",
                                                      "qk_norm": {"kind": "batch"}}})
    model.train()
    ids = torch.randint(0, tiny["vocab_size"], (2, 8))
    other = ids.clone()
    other[:, 7] = (other[:, 7] + 1) % tiny["vocab_size"]
    gap = (model(ids)[:, 3] - model(other)[:, 3]).abs().max().item()
    assert gap > 1e-4


# -- C8: a setting that turns off what another asks for ----------------------------------------
@pytest.mark.parametrize(("extra", "where", "asks"), [
    ("eval_every: 2", "5:80: measure.training.eval_every", "validation curves"),
    ("eval_lengths: [16]", "5:68: measure.training.eval_lengths", "test scores at other lengths"),
], ids=["eval_every", "eval_lengths"])
def test_c8_eval_every_without_held_out_batches_is_refused(tmp_path, extra, where, asks):
    exp = experiment(tmp_path, measure="  training: {steps: 6, batch_size: 2, seq_len: 8, "
                                       f"eval_batches: 0, {extra}}}\n")
    for command in ("validate", "run"):
        args = [command, exp] + (["--out", tmp_path / "runs"] if command == "run" else [])
        code, lines = cli(*args)
        assert code == 2 and len(lines) == 1, lines
        name = extra.split(":")[0]
        assert lines[0] == (f"{exp}:{where}: {name} asks for {asks}, but eval_batches: 0 "
                            "turns held-out scoring off, so nothing would be recorded; remove "
                            f"{name} or eval_batches: 0"), lines
    assert not (tmp_path / "runs").exists()


# -- C9: control and bidirectional characters written as YAML escapes ---------------------------
def test_c9_escaped_control_and_bidi_characters_are_refused_with_their_place(tmp_path):
    exp = tmp_path / "exp.yaml"
    exp.write_text(
        'name: "demo\\u0000"\nseeds: [0]\n'
        f"{MODEL}}}\n"
        "variants:\n"
        '  - {name: "red\\u001b[31m", set: {norm.kind: rms}}\n'
        '  - {name: ok, label: "exe.\\u202egnp", set: {norm.kind: layer}}\n'
        "measure:\n  params: {}\n")
    for command in ("validate", "run"):
        args = [command, exp] + (["--out", tmp_path / "runs"] if command == "run" else [])
        code, lines = cli(*args)
        assert code == 2, lines
        assert lines == [
            f"{exp}:1:7: name: 'demo\\x00' holds U+0000, a control character; names, labels "
            "and values are plain text: remove it",
            f"{exp}:5:12: variants[0].name: 'red\\x1b[31m' holds U+001B, a control character; "
            "names, labels and values are plain text: remove it",
            f"{exp}:6:23: variants[1].label: 'exe.\\u202egnp' holds U+202E, a bidirectional "
            "formatting character: it makes text read other than it is; names, labels and "
            "values are plain text: remove it"], lines
    assert not (tmp_path / "runs").exists()


def test_c9_a_description_may_span_lines_but_a_name_may_not(tmp_path):
    exp = experiment(tmp_path, measure="  params: {}\n")
    exp.write_text(exp.read_text().replace("seeds: [0]", 'seeds: [0]\ndescription: "a\\n\\tb"'))
    code, lines = cli("validate", exp)
    assert code == 0, lines
    exp.write_text(exp.read_text().replace("name: demo", 'name: "de\\tmo"'))
    code, lines = cli("validate", exp)
    assert code == 2 and "holds U+0009, a control character" in lines[0], lines


def test_c9_the_report_writers_escape_them_anyway(tmp_path):
    """A store written another way (an older version, the API) may hold them: every report
    file shows them as escapes, never raw."""
    import sqlite3

    exp = experiment(tmp_path, measure="  params: {}\n",
                     grid="variants:\n  - {name: evil, set: {norm.kind: rms}}\n")
    code, lines = cli("run", exp, "--out", tmp_path / "runs", "--no-report")
    assert code == 0, lines
    run = tmp_path / "runs" / "demo"
    bad_name, bad_label = "e\x1b[31mvil\u202e", "mi\x00ne"
    with sqlite3.connect(run / "results.sqlite") as db:
        db.execute("UPDATE variants SET name = ?, label = ? WHERE name = 'evil'",
                   (bad_name, bad_label))
        for table in ("units", "plan"):
            db.execute(f"UPDATE {table} SET variant = ? WHERE variant = 'evil'", (bad_name,))
    code, lines = cli("report", run)
    assert code == 0, lines
    written = {p.name: p.read_text() for p in (run / "report").iterdir() if p.is_file()}
    assert {"report.md", "report.html", "summary.csv"} <= set(written)
    for name, text in written.items():
        for raw in ("\x1b", "\x00", "\u202e"):
            assert raw not in text, (name, raw)
    assert "e\\x1b[31mvil\\u202e" in written["summary.csv"]
    assert r"e\\x1b\[31mvil\\u202e" in written["report.md"]  # Markdown's own escapes too
    assert "e\\x1b[31mvil\\u202e" in written["report.html"]


# -- C10: export-mlflow to a tracking URI that is not a usable store ---------------------------
@pytest.mark.parametrize("case", ["text-file", "folder", "no-folder", "another-database",
                                  "broken-mlflow-database"])
def test_c10_a_tracking_uri_that_is_not_a_store_is_one_line(tmp_path, case):
    pytest.importorskip("mlflow")
    import sqlite3

    exp = experiment(tmp_path, measure="  params: {}\n")
    code, _ = cli("run", exp, "--out", tmp_path / "runs", "--no-report")
    assert code == 0
    target = tmp_path / "mlflow.db"
    if case == "text-file":
        target.write_text("these are my notes, not a database\n" * 20)
        why = f"{target} is not an SQLite database; name an MLflow database or a new file"
    elif case == "folder":
        target.mkdir()
        why = f"{target} is a folder; name a database file"
    elif case == "no-folder":
        target = tmp_path / "missing" / "mlflow.db"
        why = f"the folder {target.parent} does not exist"
    elif case == "another-database":  # refused before MLflow adds its tables to it
        with sqlite3.connect(target) as db:
            db.execute("CREATE TABLE notes (id TEXT)")
        why = (f"{target} is another program's SQLite database (tables: notes), not "
               "MLflow's; MLflow would add its tables to it")
    else:  # MLflow's tables at a revision its migrations do not know
        with sqlite3.connect(target) as db:
            for table in ("experiments", "runs", "metrics", "params", "alembic_version"):
                db.execute(f"CREATE TABLE {table} (version_num TEXT)")
            db.execute("INSERT INTO alembic_version VALUES ('not-a-revision')")
        why = ("not a usable MLflow store (CommandError: Can't locate revision identified by "
               "'not-a-revision')")
    before = target.read_bytes() if target.is_file() and case != "broken-mlflow-database" \
        else None
    code, lines = cli("export-mlflow", tmp_path / "runs" / "demo", "--tracking-uri",
                      f"sqlite:///{target}")
    lines = [line for line in lines if " INFO mlflow" not in line]  # MLflow's own logging
    assert code == 2 and len(lines) == 1, lines
    assert lines[0].startswith(f"--tracking-uri: sqlite:///{target}: {why}"), lines
    if before is not None:
        assert target.read_bytes() == before  # left as it was


# -- a new user: from_transformers keeps the HF model's mode -----------------------------------
def test_from_transformers_returns_the_model_in_the_hf_models_mode():
    transformers = pytest.importorskip("transformers")
    import variantlab as vl

    torch.manual_seed(0)
    config = transformers.GPT2Config(n_embd=32, n_head=4, n_layer=2, vocab_size=64,
                                     n_positions=32, resid_pdrop=0.2, embd_pdrop=0.2,
                                     attn_pdrop=0.2, attn_implementation="eager")
    hf = transformers.GPT2LMHeadModel(config).eval()
    ids = torch.randint(0, 64, (2, 12))
    _, model = vl.from_transformers(hf)
    assert not model.training and not any(m.training for m in model.modules())
    with torch.no_grad():  # dropout off on both sides: the same logits at once
        assert torch.allclose(model(ids), hf(ids).logits, atol=1e-5)
    _, trained = vl.from_transformers(hf.train())
    assert trained.training


# -- a new user: a plugin whose build cannot work fails validate, not every unit ---------------
BAD_ACTIVATION = '''
from typing import Literal

import torch
from torch import nn

from variantlab import ComponentSpec, hookimpl


class SquashSpec(ComponentSpec):
    """tanh, under another name."""

    kind: Literal["squash"] = "squash"


class Squash(nn.Module):
    def __init__(self, spec, extra):
        super().__init__()

    def forward(self, x):
        return torch.tanh(x)


@hookimpl
def register_activations(register):
    register("squash", SquashSpec, lambda spec, extra: Squash(spec, extra))  # one too many
'''


def test_a_plugin_that_cannot_build_fails_validate_naming_it(tmp_path):
    plugin = tmp_path / "squash.py"
    plugin.write_text(BAD_ACTIVATION)
    exp = experiment(tmp_path, grid="grid: {activation.kind: [gelu, squash]}\n")
    for command in ("validate", "run"):
        args = [command, exp, "--plugin", plugin] + (
            ["--out", tmp_path / "runs"] if command == "run" else [])
        code, lines = cli(*args)
        assert code == 2 and len(lines) == 1, lines
        assert lines[0].startswith(
            f"{exp}:4:32: grid.activation.kind[1]: variant 'activation.kind=squash': "
            f"activation 'squash' (registered by {plugin}) cannot be built: TypeError: "), lines
        assert "missing 1 required positional argument: 'extra'" in lines[0]
    assert not (tmp_path / "runs").exists()
