"""The variantlab command end to end: exit codes, messages, resume, SIGKILL, examples."""

import json
import os
import signal
import sqlite3
import subprocess
import sys
import time
from contextlib import closing
from pathlib import Path

import pandas as pd
import pytest
from conftest import BROKEN_PLUGIN, TINY_MODEL, invoke

ROOT = Path(__file__).resolve().parents[1]
EXPERIMENTS = ROOT / "experiments"
VARIANTLAB = [sys.executable, "-m", "variantlab"]

def write_exp(tmp_path: Path, name="clitest", seeds="[0, 1]", grid=None, extra="",
              gradients="{batch_size: 2, seq_len: 16, batches: 1}") -> Path:
    grid = grid or "  norm.kind: [layer, rms]\n  residual.kind: [pre_norm, post_norm]\n"
    text = (f"name: {name}\nseeds: {seeds}\nmodel: {TINY_MODEL}\ngrid:\n{grid}{extra}"
            f"measure:\n  params: {{}}\n  gradients: {gradients}\n")
    path = tmp_path / f"{name}.yaml"
    path.write_text(text)
    return path


def sorted_rows(run_dir: Path) -> pd.DataFrame:
    with closing(sqlite3.connect(run_dir / "results.sqlite")) as conn:
        df = pd.read_sql_query(
            "SELECT r.*, u.variant, u.seed FROM rows r JOIN units u ON u.key = r.unit_key", conn)
    cols = ["variant", "seed", "probe", "metric", "scope", "name", "layer", "step"]
    return df.sort_values(cols, na_position="first").reset_index(drop=True)


def count_units(db: Path) -> int:
    with closing(sqlite3.connect(db)) as conn:
        return conn.execute("SELECT COUNT(*) FROM units").fetchone()[0]


# -- validate ----------------------------------------------------------------------------
def test_validate_prints_variant_table(tmp_path):
    result = invoke("validate", write_exp(tmp_path))
    assert result.exit_code == 0, result.output
    assert "clitest: 4 variant(s)" in result.output
    assert "norm.kind=rms,residual.kind=post_norm" in result.output.replace(" ", "") or \
        "residual.kind=post_norm,norm.kind=rms" in result.output.replace(" ", "")
    assert "units: 16" in result.output


def test_validate_bad_input_exit_2_with_location(tmp_path):
    path = write_exp(tmp_path, grid="  norm.kind: [layer, rmss]\n")
    result = invoke("validate", path)
    assert result.exit_code == 2
    assert f"{path}:" in result.output and "did you mean 'rms'" in result.output
    assert "Traceback" not in result.output
    line = next(x for x in result.output.splitlines() if "rmss" in x)
    file, lineno, col = line.split(":")[:3]
    assert file == str(path) and lineno.isdigit() and col.isdigit()


def test_missing_file_and_bad_plugin_exit_2(tmp_path):
    result = invoke("validate", tmp_path / "nope.yaml")
    assert result.exit_code == 2 and "nope.yaml" in result.output
    result = invoke("validate", write_exp(tmp_path), "--plugin", tmp_path / "absent.py")
    assert result.exit_code == 2 and "absent.py" in result.output
    assert "Traceback" not in result.output


# -- run ---------------------------------------------------------------------------------
def test_run_then_rerun_computes_nothing(tmp_path):
    exp = write_exp(tmp_path, seeds="[0]")
    out = tmp_path / "runs"
    result = invoke("run", exp, "--out", out, "--no-report")
    assert result.exit_code == 0, result.output
    assert "8 unit(s): 8 computed, 0 stored already, 0 failed" in result.output
    rows = sorted_rows(out / "clitest")
    assert set(rows.probe) == {"params", "gradients"}
    total = rows[(rows.metric == "total") & (rows.variant == rows.variant.iloc[0])]
    assert total["value"].iloc[0] > 0
    assert "[1/8] base seed=0 params: ok" in result.output  # plain lines, not a terminal
    result = invoke("run", exp, "--out", out)
    assert result.exit_code == 0
    assert "8 unit(s): 0 computed, 8 stored already, 0 failed" in result.output
    pd.testing.assert_frame_equal(sorted_rows(out / "clitest"), rows)
    report_dir = out / "clitest" / "report"
    assert (report_dir / "report.html").is_file() and (report_dir / "report.md").is_file()
    result = invoke("report", out / "clitest", "--out", tmp_path / "r2")
    assert result.exit_code == 0 and (tmp_path / "r2" / "report.html").is_file()
    result = invoke("report", out / "clitest", "--baseline", "nope")
    assert result.exit_code == 2 and "nope" in result.output


def test_failing_component_fails_only_its_variant(tmp_path):
    (tmp_path / "broken_norm.py").write_text(BROKEN_PLUGIN)
    exp = write_exp(tmp_path, grid="  norm.kind: [layer, broken]\n")
    out = tmp_path / "runs"
    result = invoke("run", exp, "--out", out, "--no-report", "--plugin", tmp_path / "broken_norm.py")
    assert result.exit_code == 1, result.output
    assert "8 unit(s): 6 computed, 0 stored already, 2 failed" in result.output
    assert "broken norm: forward is not implemented" in result.output
    import variantlab

    df = variantlab.results(out / "clitest")
    failed = df[df.status == "failed"]
    assert len(failed) == 2 and set(failed.probe) == {"gradients"}
    assert all("broken" in v for v in failed.variant)
    ok = df[df.status == "ok"]
    assert set(ok.variant) == set(df.variant)  # params of the broken variant stored too
    assert len(ok[(ok.probe == "gradients")].drop_duplicates(["variant", "seed"])) == 2


def test_fail_fast_and_unknown_only(tmp_path):
    (tmp_path / "broken_norm.py").write_text(BROKEN_PLUGIN)
    exp = write_exp(tmp_path, grid="  norm.kind: [broken, layer]\n")
    out = tmp_path / "runs"
    result = invoke("run", exp, "--out", out, "--no-report", "--fail-fast",
                    "--plugin", tmp_path / "broken_norm.py")
    assert result.exit_code == 1
    assert "1 computed, 0 stored already, 1 failed, 6 not run" in result.output
    result = invoke("run", exp, "--out", out, "--only", "nope", "--plugin", tmp_path / "broken_norm.py")
    assert result.exit_code == 2 and "--only: no variant named 'nope'" in result.output


@pytest.mark.slow
def test_sigkill_midway_then_rerun_equals_clean_run(tmp_path):
    exp = write_exp(tmp_path, seeds="[0, 1, 2, 3]",
                    gradients="{batch_size: 4, seq_len: 32, batches: 2}")
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    killed, clean = tmp_path / "killed", tmp_path / "clean"
    proc = subprocess.Popen([*VARIANTLAB, "run", str(exp), "--out", str(killed), "--no-report"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)
    db = killed / "clitest" / "results.sqlite"
    deadline = time.monotonic() + 120
    stored = 0
    while time.monotonic() < deadline and proc.poll() is None:
        if db.exists():
            try:
                stored = count_units(db)
            except sqlite3.OperationalError:
                stored = 0
            if stored >= 5:
                break
        time.sleep(0.02)
    assert proc.poll() is None, "the run finished before it could be killed; make it longer"
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    partial = count_units(db)
    assert 5 <= partial < 32
    resumed = subprocess.run([*VARIANTLAB, "run", str(exp), "--out", str(killed), "--no-report"],
                             capture_output=True, text=True, env=env)
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    assert f"{32 - partial} computed, {partial} stored already" in resumed.stdout
    fresh = subprocess.run([*VARIANTLAB, "run", str(exp), "--out", str(clean), "--no-report"],
                           capture_output=True, text=True, env=env)
    assert fresh.returncode == 0, fresh.stdout + fresh.stderr
    a, b = sorted_rows(killed / "clitest"), sorted_rows(clean / "clitest")
    assert len(a) == len(b) and not a.duplicated().any()
    pd.testing.assert_frame_equal(a, b)


# -- describe, plugins, report -----------------------------------------------------------
def test_describe_model_file(tmp_path):
    path = tmp_path / "model.yaml"
    path.write_text("family: gpt\nvocab_size: 64\ncontext_length: 32\nemb_dim: 32\n"
                    "n_heads: 4\nn_layers: 2\ndrop_rate: 0.0\ntie_weights: true\n")
    result = invoke("describe", path)
    assert result.exit_code == 0, result.output
    assert "GPTModel" in result.output and "2 x TransformerBlock" in result.output
    # tied head: embedding 64*32 + positions 32*32 + 2 blocks + final norm
    per_block = 2 * 64 + 4 * 32 * 32 + 32 + (32 * 128 + 128 + 128 * 32 + 32)
    total = 64 * 32 + 32 * 32 + 2 * per_block + 64
    line = next(x for x in result.output.splitlines() if " total " in f" {x} ")
    assert f"{total:,}" in line


def test_plugins_lists_and_json(tmp_path):
    result = invoke("plugins", "--slot", "norm")
    assert result.exit_code == 0 and "rms" in result.output and "attention" not in result.output
    data = json.loads(invoke("plugins", "--json").output)
    kinds = {(r["slot"], r["kind"]) for r in data["components"]}
    assert ("norm", "layer") in kinds and ("family", "gpt") in kinds
    assert {("probe", "dynamics"), ("executor", "ray"), ("executor", "pool")} <= kinds
    result = invoke("plugins", "--slot", "executor")
    assert result.exit_code == 0 and "--retries" in result.output and "mha" not in result.output
    (tmp_path / "broken_norm.py").write_text(BROKEN_PLUGIN)
    result = invoke("plugins", "--slot", "norm", "--plugin", tmp_path / "broken_norm.py")
    assert "broken" in result.output
    result = invoke("plugins", "--plugin", "no_such_module_xyz")
    assert result.exit_code == 2 and "no_such_module_xyz" in result.output


def test_report_without_store_exit_2(tmp_path):
    result = invoke("report", tmp_path / "nothing")
    assert result.exit_code == 2 and "no results store" in result.output


# -- the example experiments -------------------------------------------------------------
SEED_NO_SHORTCUT = [2.0174e-04, 1.2011e-04, 7.1520e-04, 1.3989e-03, 5.0496e-03]
SEED_SHORTCUT = [0.22170, 0.20694, 0.32897, 0.26657, 1.32585]


def example(name: str) -> Path:
    path = EXPERIMENTS / name
    assert path.is_file(), f"{path} is missing"
    return path


def test_seed_shortcut_experiment_stores_the_seed_gradients(tmp_path):
    from variantlab.store.store import load_run

    result = invoke("run", example("seed-shortcut.yaml"), "--out", tmp_path, "--no-report")
    assert result.exit_code == 0, result.output
    run = load_run(next(tmp_path.iterdir()))
    shortcut = {row.name: row.spec["residual"]["shortcut"]
                for row in run.variants.itertuples()}
    assert sorted(shortcut.values()) == [False, True]
    df = run.rows
    grads = df[(df.probe == "gradients") & (df.metric == "mean_abs_grad")
               & (df.scope == "parameter") & df.name.str.endswith("weight")]
    for variant, expected in ((v, SEED_SHORTCUT if s else SEED_NO_SHORTCUT)
                              for v, s in shortcut.items()):
        for seed, got in grads[grads.variant == variant].groupby("seed"):
            values = got.sort_values("layer")["value"].tolist()
            assert values == pytest.approx(expected, rel=1e-4), (variant, seed)
    # each layer's "weights" row (what the report's first-layer column reads) is the same
    weights = df[(df.probe == "gradients") & (df.metric == "mean_abs_grad")
                 & (df.scope == "layer") & (df.name == "weights")]
    for variant, s in shortcut.items():
        values = weights[weights.variant == variant].sort_values("layer")["value"].tolist()
        assert values == pytest.approx(SEED_SHORTCUT if s else SEED_NO_SHORTCUT, rel=1e-4)


def test_gpt2_124m_stores_the_seed_parameter_count(tmp_path):
    from variantlab.config.experiment import load_experiment

    path = example("gpt2-124m.yaml")
    exp = load_experiment(path)
    untied = [v.name for v in exp.variants if not v.spec.tie_weights]
    tied = [v.name for v in exp.variants if v.spec.tie_weights]
    assert untied, "the experiment should hold the seed's untied configuration"
    # the params probe alone: a copy of the experiment with measure: {params: {}}
    import yaml

    data = yaml.safe_load(path.read_text())
    data["measure"] = {"params": {}}
    data["seeds"] = data.get("seeds", [0])[:1]
    small = tmp_path / "gpt2-params.yaml"
    small.write_text(yaml.safe_dump(data))
    only = [untied[0]] + tied[:1]
    result = invoke("run", small, "--out", tmp_path / "runs", "--no-report",
                    *[arg for name in only for arg in ("--only", name)])
    assert result.exit_code == 0, result.output
    df = __import__("variantlab").results(tmp_path / "runs" / exp.name)
    total = df[(df.metric == "total") & (df.variant == untied[0])]["value"].tolist()
    assert total == [163_009_536.0]
    if tied:  # the output head shares the token embedding: counted once
        total = df[(df.metric == "total") & (df.variant == tied[0])]["value"].tolist()
        assert total == [124_412_160.0]


# seed-shortcut and xiong-fig3 take seconds; the others train and time, so they are marked
# slow (deselect with -m "not slow")
SMALL_EXAMPLES = {"seed-shortcut", "xiong-fig3"}


# these run end to end at small settings in test_published_findings.py, which also asserts
# their findings; their full runs (minutes each) are what reports/ holds
SMALL_SETTINGS_ELSEWHERE = {"qk-norm-logits", "peri-ln", "llama-vs-gpt2", "dyt-vs-layernorm",
                            "gelu-vs-relu", "qk-norm-lr-sensitivity", "moe-vs-dense",
                            "moe-balancing", "local-global", "hybrid-ratio",
                            "zoology-mqar", "layernorm-vs-batchnorm", "mla-vs-gqa",
                            "attention-sinks", "nope-interleave", "nope-recall"}


def _example_params() -> list:
    paths = sorted(p for p in EXPERIMENTS.glob("*.yaml") if p.stem not in SMALL_SETTINGS_ELSEWHERE)
    return [pytest.param(p, id=p.stem, marks=() if p.stem in SMALL_EXAMPLES
                         else (pytest.mark.slow,)) for p in paths]


@pytest.mark.parametrize("path", _example_params())
def test_example_experiment_runs_end_to_end(path, tmp_path):
    result = invoke("run", path, "--out", tmp_path, "--no-report")
    assert result.exit_code == 0, result.output
    df = __import__("variantlab").results(next(tmp_path.iterdir()))
    assert len(df) > 0 and set(df.status) == {"ok"}
