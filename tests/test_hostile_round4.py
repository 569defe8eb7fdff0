"""The hostile cases of issue 27 (B2-B7 and the "acceptable but worth mending" ones), each run
as the repro was: the right exit code, one line, no traceback, no run folder on bad input."""

from __future__ import annotations

import json
import time
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from variantlab.cli.main import main
from variantlab.data import cache as cachelib
from variantlab.data import sources as datalib

MODEL = ("model: {family: gpt, vocab_size: 64, context_length: 32, emb_dim: 32, n_heads: 4, "
         "n_layers: 2, drop_rate: 0.0")
TRAIN = "  training: {steps: 2, batch_size: 2, seq_len: 8, eval_batches: 1}\n"


def experiment(tmp: Path, *, model_extra: str = "", grid: str = "", data: str = "",
               measure: str = TRAIN) -> Path:
    exp = tmp / "exp.yaml"
    exp.write_text(f"name: demo\nseeds: [0]\n{MODEL}{model_extra}}}\n{data}{grid}"
                   f"measure:\n{measure}")
    return exp


def cli(*args: object) -> tuple[int, list[str]]:
    result = CliRunner().invoke(main, [str(a) for a in args])
    assert not (result.exception and not isinstance(result.exception, SystemExit)), result.output
    assert "Traceback (most recent" not in result.output
    return result.exit_code, [x for x in result.output.splitlines() if x.strip()]


def refused(tmp: Path, exp: Path, where: str, text: str) -> None:
    """``validate`` and ``run`` both exit 2 with one line at ``where``, and no run folder."""
    for command in ("validate", "run"):
        args = [command, exp] + (["--out", tmp / "runs"] if command == "run" else [])
        code, lines = cli(*args)
        assert code == 2, lines
        assert len(lines) == 1 and lines[0].startswith(f"{exp}:{where}: "), lines
        assert text in lines[0], lines
    assert not (tmp / "runs").exists()


def final_losses(run: Path) -> dict[str, float]:
    import variantlab as vl

    frame = vl.results(run)
    rows = frame[frame["metric"] == "final_loss"]
    return dict(zip(rows["variant"], rows["value"]))


# -- B2: token-budget axes ---------------------------------------------------------------------
@pytest.mark.parametrize("axis", ["tokens: [64, 128]", "tokens_per_param: [0.001, 0.002]"])
def test_b2_a_token_budget_axis_replaces_the_base_budget(tmp_path, axis):
    exp = experiment(tmp_path, grid=f"grid: {{measure.training.{axis}}}\n")
    code, lines = cli("run", exp, "--out", tmp_path / "runs", "--no-report")
    assert code == 0, lines
    import variantlab as vl

    frame = vl.results(tmp_path / "runs" / "demo")
    steps = frame[frame["metric"] == "loss"].groupby("variant")["step"].max() + 1
    tokens = frame[frame["metric"] == "tokens"].set_index("variant")["value"]
    if axis.startswith("tokens:"):  # 64 and 128 tokens over 16 tokens per step
        assert sorted(steps) == [4, 8] and sorted(tokens) == [64.0, 128.0]
    else:  # 27,328 non-embedding parameters x 0.001 or 0.002, over 16 tokens per step
        assert sorted(steps) == [2, 4]


def test_b2_a_named_variant_sets_a_token_budget(tmp_path):
    exp = experiment(tmp_path, grid="variants:\n  - {name: by-tokens, set: "
                                    "{measure.training.tokens: 48}}\n")
    code, lines = cli("run", exp, "--out", tmp_path / "runs", "--no-report")
    assert code == 0, lines
    import variantlab as vl

    frame = vl.results(tmp_path / "runs" / "demo")
    loss = frame[frame["metric"] == "loss"]
    assert loss.groupby("variant")["step"].max().to_dict() == {"base": 1, "by-tokens": 2}


# -- B3: a misspelt layer kind -----------------------------------------------------------------
def test_b3_a_grid_path_naming_no_layer_kind_is_refused(tmp_path):
    exp = experiment(tmp_path, model_extra=",\n        layout: {pattern: [glob, local], kinds: "
                     "{glob: {}, local: {norm: {kind: rms}}}}",
                     grid="grid: {layout.kinds.lcal.norm.kind: [rms, layer]}\n",
                     measure="  params: {}\n")
    refused(tmp_path, exp, "5:8: grid.layout.kinds.lcal.norm.kind",
            "'layout.kinds.lcal.norm.kind' names no layer kind: 'lcal' is not one; did you mean "
            "'layout.kinds.local.norm.kind'? kinds: glob, local")


# -- B4: a damaged token cache -----------------------------------------------------------------
@pytest.mark.parametrize("tokenizer", ["gpt2", "bytes"])
def test_b4_a_damaged_token_cache_is_rebuilt_with_a_warning(tmp_path, monkeypatch, tokenizer):
    monkeypatch.setenv("VARIANTLAB_CACHE", str(tmp_path / "cache"))
    docs = tmp_path / "docs"
    docs.mkdir()
    words = ["alpha", "beta", "gamma", "delta", "the", "a", "of"]
    for i in range(30):
        (docs / f"d{i:02d}.txt").write_text(" ".join(words[(i * j) % 7] for j in range(120)))
    vocab = ", vocab_size: 300" if tokenizer == "bytes" else ""
    exp = experiment(tmp_path, model_extra=vocab,
                     data=f"data: {{source: text, path: 'docs/*.txt', tokenizer: {tokenizer}}}\n")
    exp.write_text(exp.read_text().replace("vocab_size: 64, ", "") if vocab else exp.read_text())
    datalib._SPLITS.clear()
    code, lines = cli("run", exp, "--out", tmp_path / "clean", "--no-report")
    assert code == 0, lines
    (ids_file,) = (tmp_path / "cache" / "tokens").glob("*.tokens.npy")
    good = ids_file.read_bytes()
    array = np.load(ids_file)
    damaged = np.where(array > 0, array - 1, array).astype(array.dtype)  # same size, other ids
    damaged[::7] = 255 if tokenizer == "bytes" else 50000
    np.save(ids_file, damaged)
    assert len(ids_file.read_bytes()) == len(good)
    time.sleep(0.01)
    datalib._SPLITS.clear()  # a new process would not have the corpus in memory
    code, lines = cli("run", exp, "--out", tmp_path / "again", "--no-report")
    assert code == 0, lines
    warning = [line for line in lines if line.startswith("warning: data: token cache entry")]
    assert len(warning) == 1 and str(ids_file) in warning[0], lines
    assert "is damaged (its contents do not match the sha256" in warning[0]
    assert ids_file.read_bytes() == good  # rebuilt
    assert final_losses(tmp_path / "again" / "demo") == final_losses(tmp_path / "clean" / "demo")


def test_b4_the_cache_digest_covers_ids_and_offsets(tmp_path):
    tokens = cachelib.corpus_tokens("h", "bytes", lambda: ["abc", "de"], tmp_path)
    (digest_file,) = tmp_path.glob("*.sha256")
    assert digest_file.read_text().strip() == cachelib.digest(tokens.ids, tokens.offsets)
    off_file = next(tmp_path.glob("*.offsets.npy"))
    np.save(off_file, np.array([0, 2, 7], dtype=np.int64))  # moved boundary, same length
    with pytest.warns(cachelib.CacheWarning, match=str(next(tmp_path.glob("*.tokens.npy")))):
        again = cachelib.corpus_tokens("h", "bytes", lambda: ["abc", "de"], tmp_path)
    assert again.offsets.tolist() == [0, 4, 7]


# -- B5: an export seed out of range, and an export folder that holds files ---------------------
def test_b5_export_refuses_a_seed_out_of_range_and_a_folder_that_holds_files(tmp_path):
    exp = experiment(tmp_path, measure="  params: {}\n")
    code, _ = cli("run", exp, "--out", tmp_path / "runs", "--no-report")
    assert code == 0
    run = tmp_path / "runs" / "demo"
    code, lines = cli("export", run, "--variant", "base", "--seed", "99999999999999999999",
                      "--to", tmp_path / "hf")
    assert code == 2 and len(lines) == 1, lines
    assert lines[0].startswith("--seed: 99999999999999999999 is outside the seeds a run takes")
    assert not (tmp_path / "hf").exists()
    (tmp_path / "hf").mkdir()
    (tmp_path / "hf" / "notes.txt").write_text("mine")
    code, lines = cli("export", run, "--variant", "base", "--to", tmp_path / "hf")
    assert code == 2 and len(lines) == 1, lines
    assert f"--to: {tmp_path / 'hf'} already holds files (notes.txt)" in lines[0]
    assert "pass --overwrite" in lines[0]
    assert sorted(p.name for p in (tmp_path / "hf").iterdir()) == ["notes.txt"]
    code, lines = cli("export", run, "--variant", "base", "--to", tmp_path / "hf", "--overwrite")
    assert code == 0, lines
    assert json.loads((tmp_path / "hf" / "variantlab.json").read_text())["seed"] == 0


# -- B6: an unreachable tracking server --------------------------------------------------------
def test_b6_an_unreachable_tracking_server_fails_in_seconds_in_one_line(tmp_path, monkeypatch):
    pytest.importorskip("mlflow")
    for key in ("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "MLFLOW_HTTP_REQUEST_TIMEOUT",
                "MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR", "MLFLOW_HTTP_REQUEST_BACKOFF_JITTER"):
        monkeypatch.delenv(key, raising=False)
    exp = experiment(tmp_path, measure="  params: {}\n")
    code, _ = cli("run", exp, "--out", tmp_path / "runs", "--no-report")
    assert code == 0
    import mlflow  # imported before the clock starts: its import is not the retries

    assert mlflow
    start = time.monotonic()
    code, lines = cli("export-mlflow", tmp_path / "runs" / "demo", "--tracking-uri",
                      "http://127.0.0.1:9/")
    took = time.monotonic() - start
    assert code == 2 and len(lines) == 1, lines
    assert lines[0].startswith("--tracking-uri: http://127.0.0.1:9/: the tracking server does "
                               "not answer (Connection refused; tried 3 time(s), 10 s timeout")
    assert took < 30, took  # 2 retries with backoff 1: about 3 s, not minutes
    import os

    assert "MLFLOW_HTTP_REQUEST_MAX_RETRIES" not in os.environ  # set for the call only


# -- B7: a grid's bytes tokenizer with a small vocabulary --------------------------------------
def test_b7_a_grid_over_the_tokenizer_is_checked_before_the_run(tmp_path):
    (tmp_path / "t.txt").write_text("hello world " * 200)
    exp = experiment(tmp_path, data="data: {source: text, path: t.txt}\n",
                     grid="grid: {data.tokenizer: [gpt2, bytes]}\n")
    refused(tmp_path, exp, "5:31: grid.data.tokenizer[1]",
            "bytes gives ids 0-255 and is never folded: vocab_size must be >= 256; too small in "
            "['data.tokenizer=bytes']")


# -- acceptable, mended ------------------------------------------------------------------------
def test_warmup_above_the_steps_is_refused(tmp_path):
    exp = experiment(tmp_path, measure="  training: {steps: 2, warmup_steps: 5, batch_size: 2, "
                                       "seq_len: 8}\n")
    refused(tmp_path, exp, "5:38: measure.training.warmup_steps",
            "warmup_steps=5 is above the 2 steps of the run: the learning rate would never "
            "reach lr")
    grid = experiment(tmp_path, grid="grid: {measure.training.steps: [3, 20]}\n",
                      measure="  training: {steps: 10, warmup_steps: 5, batch_size: 2, "
                              "seq_len: 8}\n")
    refused(tmp_path, grid, "4:33: grid.measure.training.steps[0]",
            "variant 'measure.training.steps=3': warmup_steps=5 is above the 3 steps")


def test_mamba_dt_min_above_dt_max_is_refused(tmp_path):
    exp = experiment(tmp_path, model_extra=",\n        attention: {kind: mamba, dt_min: 0.5, "
                                           "dt_max: 0.1}", measure="  params: {}\n")
    refused(tmp_path, exp, "4:55: model.attention.dt_max",
            "dt_max=0.1 is below dt_min=0.5: the step's init range [dt_min, dt_max] is empty")


def test_the_size_guard_takes_the_smallest_memory_limit(tmp_path, monkeypatch):
    import resource

    from variantlab.sweep import sizeguard

    info = tmp_path / "meminfo"
    info.write_text("MemTotal: 9000000 kB\nMemAvailable: 4000000 kB\n")
    status = tmp_path / "status"
    status.write_text("Name: python\nVmSize: 1000000 kB\n")
    v2 = tmp_path / "v2"
    v2.mkdir()
    (v2 / "memory.max").write_text("3000000000\n")
    (v2 / "memory.current").write_text("1000000000\n")
    monkeypatch.setattr(resource, "getrlimit", lambda _which: (
        resource.RLIM_INFINITY, resource.RLIM_INFINITY))
    assert sizeguard.available_bytes("cpu", info, v2, status) == 2_000_000_000  # the cgroup
    (v2 / "memory.max").write_text("max\n")
    assert sizeguard.available_bytes("cpu", info, v2, status) == 4_000_000 * 1024  # MemAvailable
    v1 = tmp_path / "v1" / "memory"
    v1.mkdir(parents=True)
    (v1 / "memory.limit_in_bytes").write_text("2500000000\n")
    (v1 / "memory.usage_in_bytes").write_text("500000000\n")
    assert sizeguard.available_bytes("cpu", info, v1.parent, status) == 2_000_000_000
    (v1 / "memory.limit_in_bytes").write_text("9223372036854771712\n")  # v1's "no limit"
    assert sizeguard.available_bytes("cpu", info, v1.parent, status) == 4_000_000 * 1024
    monkeypatch.setattr(resource, "getrlimit", lambda _which: (
        3 * 1024**3, resource.RLIM_INFINITY))  # ulimit -v 3 GiB, 1,000,000 kB used
    assert sizeguard.available_bytes("cpu", info, v1.parent, status) == \
        3 * 1024**3 - 1_000_000 * 1024
    names = sizeguard.memory_limits("cpu", info, v1.parent, status)
    assert min(names)[1] == "under ulimit -v (RLIMIT_AS)"


def test_a_moe_model_too_large_points_at_its_experts(tmp_path):
    exp = experiment(tmp_path, model_extra=",\n        feedforward: {kind: moe, n_experts: 4096, "
                                           "top_k: 2}", measure=TRAIN)
    exp.write_text(exp.read_text().replace("emb_dim: 32", "emb_dim: 1024"))
    code, lines = cli("validate", exp)
    assert code == 2 and len(lines) == 1, lines
    assert lines[0].startswith(f"{exp}:4:45: model.feedforward.n_experts: variant 'base': "
                               "training needs about "), lines
    assert " TiB (parameters " in lines[0]
    assert "the largest feedforward.n_experts that fits is" in lines[0]


def test_the_most_experts_that_fit_is_exact():
    import variantlab as vl
    from variantlab.model.specs import parse_model_spec
    from variantlab.probes.training import TrainingSettings
    from variantlab.sweep.sizeguard import footprint, largest_fit

    registry = vl.get_registry()
    spec = parse_model_spec({"family": "gpt", "vocab_size": 64, "context_length": 32,
                             "emb_dim": 32, "n_heads": 4, "n_layers": 2,
                             "feedforward": {"kind": "moe", "n_experts": 64, "top_k": 2}},
                            registry)
    settings = TrainingSettings(batch_size=1, seq_len=4)

    def total(n):
        ff = spec.feedforward.model_copy(update={"n_experts": n})
        return footprint(spec.model_copy(update={"feedforward": ff}), registry, "training",
                         settings, "cpu").total

    fp = footprint(spec, registry, "training", settings, "cpu")
    room = total(9) + 10  # nine experts fit, ten do not
    assert total(10) > room
    assert largest_fit(spec, registry, fp, room, settings) == ("feedforward.n_experts", 9)


def test_layout_layers_errors_point_at_the_grid_value(tmp_path):
    exp = experiment(tmp_path, model_extra=",\n        layout: {kinds: {a: {norm: {kind: rms}}}}",
                     grid="grid: {layout.layers.5: [a], layout.layers.1: [b]}\n",
                     measure="  params: {}\n")
    code, lines = cli("validate", exp)
    assert code == 2, lines
    assert lines == [f"{exp}:5:26: grid.layout.layers.5[0]: layer 5 is outside the stack "
                     "(0 .. 1)",
                     f"{exp}:5:48: grid.layout.layers.1[0]: 'b' is not a layer kind; kinds: a"]


# -- --checkpoint-dir (issue 27.3): a bad folder is refused before Ray starts ------------------
def test_a_checkpoint_dir_that_is_a_file_is_refused_before_ray_starts(tmp_path):
    exp = experiment(tmp_path, measure="  params: {}\n")
    (tmp_path / "ckpt").write_text("not a folder")
    code, lines = cli("run", exp, "--out", tmp_path / "runs", "--executor", "ray",
                      "--checkpoint-dir", tmp_path / "ckpt")
    assert code == 2, lines
    assert lines[-1] == (f"--checkpoint-dir: {tmp_path / 'ckpt'} is a file, not a folder: name "
                         "a folder every worker can write (shared storage), or leave the flag "
                         "out"), lines
    assert not (tmp_path / "runs" / "demo" / "results.sqlite").exists()  # nothing computed
