"""Issue 9, "What it must show" 5: the four experiments that reproduce published findings run
end to end at small settings, and the finding's shape holds on every seed of those numbers
(qk-norm's bounded logit, sandwich's bounded residual stream, Llama's block at equal
parameters). The ``test_smoke_*`` runs are smoke runs of the tuned sweeps: their few steps
cannot show the finding, so they check that the sweep runs end to end and that its report
holds what the finding is read from (tuned rows, effects by size, curves, routing panels),
with numbers recomputed where they can be. The reading sentences the dynamics probe adds to
a report are checked on hand-made rows."""

import math
from pathlib import Path
from typing import Any

import pandas as pd
import pytest
import yaml
from click.testing import CliRunner
from conftest import ROOT, TINY

import variantlab as vl
from variantlab.cli.main import main
from variantlab.report.builtin.dynamics_findings import (
    at_step_max,
    depth_ratio,
    dynamics_reading,
    dynamics_rows,
    last_layer_at,
)
from variantlab.report.fair.tuned import find_sweep
from variantlab.report.frame import ReportData, gather
from variantlab.store.contract import RunMeta

SMALL_MODEL = {k: TINY[k] for k in ("context_length", "emb_dim", "n_layers")}
# the 97.5% points of Student's t for 1, 2 and 3 degrees of freedom as a t table prints them,
# written out so that the expected intervals below do not come from the code they check
T975 = {1: 12.706204736, 2: 4.302652730, 3: 3.182446305}  # Student t, 0.975


def run_small(tmp_path: Path, name: str, model: dict[str, Any],
              measure: dict[str, dict[str, Any]], report: bool = False,
              max_files: int = 4, grid: dict[str, list[Any]] | None = None,
              seeds: list[int] | None = None) -> pd.DataFrame:
    """experiments/NAME.yaml with the model and probe settings overridden (and its grid and
    seeds, when given, with its named variants dropped), run by the CLI on the first
    ``max_files`` stdlib sources with the experiment's tokenizer (0: the experiment's own
    data); its stored rows."""
    doc = yaml.safe_load((ROOT / "experiments" / f"{name}.yaml").read_text())
    doc["model"].update(model)
    tokenizer = doc["data"].get("tokenizer")
    if max_files:  # 0: keep the experiment's own (synthetic) data
        doc["data"] = {"source": "stdlib", "max_files": max_files}
        if tokenizer:
            doc["data"]["tokenizer"] = tokenizer
    if grid is not None:
        doc["grid"] = grid
        doc.pop("variants", None)
        doc.pop("baseline", None)
    if seeds is not None:
        doc["seeds"] = seeds
    for probe, settings in measure.items():
        doc["measure"][probe].update(settings)
        steps, warmup = doc["measure"][probe].get("steps"), doc["measure"][probe].get("warmup_steps")
        if isinstance(steps, int) and isinstance(warmup, int) and warmup > steps:
            doc["measure"][probe]["warmup_steps"] = steps // 5  # a short run keeps its shape
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    args = ["run", str(path), "--out", str(tmp_path / "runs")] + ([] if report else ["--no-report"])
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 0, result.output
    return vl.results(tmp_path / "runs" / name)


def by_seed(df: pd.DataFrame, probe: str, metric: str) -> pd.DataFrame:
    part = df[(df.probe == probe) & (df.metric == metric) & (df.scope == "model")]
    return part.pivot_table(index="seed", columns="variant", values="value")


@pytest.mark.slow
def test_qk_norm_keeps_the_attention_logit_bounded(tmp_path):
    short = {"steps": 30, "every": 10, "batch_size": 4, "seq_len": 32}
    df = run_small(tmp_path, "qk-norm-logits", SMALL_MODEL,
                   {"dynamics": short, "training": {"steps": 20, "batch_size": 4, "seq_len": 32}},
                   report=True)
    start = at_step_max(df, "max_attn_logit", last=False)
    end = at_step_max(df, "max_attn_logit", last=True)
    assert len(end) == 3  # every seed
    # without QK-norm the logit grows manyfold at lr 3e-2; with it, it stays near its start
    assert ((end["base"] / start["base"]) > 5).all(), end / start
    assert ((end["qk-norm"] / start["qk-norm"]) < 2.5).all(), end / start
    assert (end["base"] > 4 * end["qk-norm"]).all()
    # the reading's verdict: the 95% t-interval over the 3 seeds of log(qk-norm / base)
    # excludes 0 (computed here with the t table's 4.303), said with its numbers
    ratio = end["qk-norm"] / end["base"]
    logs = [math.log(r) for r in ratio]
    mean = sum(logs) / 3
    half = T975[2] * math.sqrt(sum((x - mean) ** 2 for x in logs) / 2) / math.sqrt(3)
    assert mean + half < 0, ratio
    g = "{:.4g}".format
    text = (tmp_path / "runs" / "qk-norm-logits" / "report" / "report.md").read_text()
    assert (f"qk-norm's step-29 max attention logit is lower than base's "
            f"({g(end['qk-norm'].mean())} vs {g(end['base'].mean())}; per-seed ratio "
            f"{g(ratio.min())} to {g(ratio.max())}, geometric mean {g(math.exp(mean))}, 95% "
            f"interval \\[{g(math.exp(mean - half))}, {g(math.exp(mean + half))}\\] over 3 "
            "seeds).") in text


@pytest.mark.slow
def test_sandwich_keeps_the_residual_stream_bounded(tmp_path):
    # seeds 0 and 1 of the file's three: this small run's shape was checked on those
    df = run_small(tmp_path, "peri-ln", {"n_layers": 4, "context_length": 32},
                   {"dynamics": {"steps": 40, "every": 10, "batch_size": 8, "seq_len": 32}},
                   seeds=[0, 1])
    start = last_layer_at(df, "residual_rms", last=False)
    end = last_layer_at(df, "residual_rms", last=True)
    pre, sandwich = "base", "residual.kind=sandwich"
    assert len(end) == 2
    # pre-LN at lr 2e-2: the stream after the last layer grows manyfold over training;
    # sandwich: every addition is normalised and it stays within a few times its start
    assert (end[pre] > 10 * start[pre]).all(), (start, end)
    assert (end[sandwich] < 4 * start[sandwich]).all(), (start, end)
    assert (end[pre] > 5 * end[sandwich]).all()
    # and the growth is with depth: each layer's stream above the one before, under pre-LN
    rms = df[(df.metric == "residual_rms") & (df.step == df.step.max()) & (df.variant == pre)]
    per_layer = rms.pivot_table(index="seed", columns="layer", values="value")
    assert (per_layer.diff(axis=1).iloc[:, 1:] > 0).all().all(), per_layer


@pytest.mark.slow
def test_llama_block_at_equal_parameters_against_gpt2(tmp_path):
    # 40 files: validation is 2 whole held-out documents (4 files would hold out the last 5%
    # of one file, too narrow a sample to rank the two on)
    df = run_small(tmp_path, "llama-vs-gpt2", {},
                   {"training": {"steps": 30, "batch_size": 4, "seq_len": 32}}, max_files=40,
                   seeds=[0, 1])  # two of the file's three seeds, as this small run was checked
    total = by_seed(df, "params", "total")
    assert abs(total["llama"] / total["base"] - 1).max() < 0.001  # near-equal counts
    loss = by_seed(df, "training", "eval_loss")
    assert loss.notna().all().all() and len(loss) == 2
    assert (loss["llama"] < loss["base"]).all(), loss


def tuned_of(tmp_path: Path, name: str, df: pd.DataFrame) -> pd.DataFrame:
    """The run's tuned.csv, each choice checked against the documented rule recomputed from
    ``results()``: within each condition, the lowest mean val_loss over seeds, reported on
    test_loss. Indexed by the compared variant's label (repeated across conditions)."""
    tuned = pd.read_csv(tmp_path / "runs" / name / "report" / "tuned.csv")
    rows = df[(df.probe == "training") & (df.scope == "model")]
    val = rows[rows.metric == "val_loss"].copy()
    # which compared variant each stored variant is, as tuned.csv labels it
    data = gather([tmp_path / "runs" / name])
    sweep = find_sweep(data, "training")
    assert sweep is not None
    shown = dict(zip(data.variants["stored_name"], data.variants["variant"]))  # report labels
    val["compared"] = val.variant.map(shown).map(sweep.cells.set_index("variant")["compared"])
    for _, row in tuned.iterrows():
        mine = val[val.compared == row["variant"]]
        for axis in sweep.condition_axes:  # the same condition only
            mine = mine[mine[axis] == row[axis]]
        assert len(mine), (row["variant"], sweep.cells)
        axes = [a for a in sweep.setting_axes if a in mine.columns]  # every tuned axis
        best = mine.groupby(axes, dropna=False)["value"].mean().idxmin()
        best = dict(zip(axes, best if len(axes) > 1 else [best]))
        assert math.isclose(row["measure.training.lr"], best["measure.training.lr"]), \
            (row["variant"], mine)
        for axis in axes:  # alpha0 where the variant has one
            if isinstance(best[axis], float) and not math.isnan(best[axis]):
                assert math.isclose(row[axis], best[axis]), (row["variant"], axis, mine)
        assert row["chosen_on"] == "val_loss" and row["reported_on"] == "test_loss"
    return tuned.set_index("variant")


@pytest.mark.slow
def test_smoke_dyt_and_layernorm_each_at_their_own_best_rate(tmp_path):
    # DyT's alpha0 is tuned beside the rate (tune: [norm.alpha0] in the file); LayerNorm has
    # no alpha0, so it runs once per rate
    grid = {"norm.kind": ["layer", "dyt"], "norm.alpha0": [0.5, 1.0],
            "measure.training.lr": [3.0e-3, 3.0e-2]}
    df = run_small(tmp_path, "dyt-vs-layernorm", SMALL_MODEL,
                   {"training": {"steps": 30, "batch_size": 4, "seq_len": 32, "eval_batches": 2},
                    "gradients": {"batch_size": 4, "seq_len": 32}},
                   report=True, grid=grid, seeds=[0, 1, 2])
    assert df[df.probe == "training"].variant.nunique() == 2 + 4
    tuned = tuned_of(tmp_path, "dyt-vs-layernorm", df)
    assert list(tuned.index) == ["norm=layer", "norm=dyt"]  # labels: the shortest unambiguous form
    assert (tuned["n"] == 3).all()
    assert math.isnan(tuned.loc["norm=layer", "norm.alpha0"])
    assert tuned.loc["norm=dyt", "norm.alpha0"] in (0.5, 1.0)
    first = df[(df.metric == "loss") & (df.step == 0)]["value"].mean()
    assert (tuned["test_loss"] < first - 1.0).all(), tuned  # both learn at their best rate


@pytest.mark.slow
def test_smoke_activations_tuned_at_two_widths(tmp_path):
    grid = {"emb_dim": [16, 32], "activation.kind": ["gelu", "relu2"],
            "measure.training.lr": [3.0e-3, 3.0e-2]}
    df = run_small(tmp_path, "gelu-vs-relu", {"context_length": 32, "n_layers": 1},
                   {"training": {"steps": 20, "batch_size": 4, "seq_len": 32, "eval_batches": 2},
                    "gradients": {"batch_size": 4, "seq_len": 32}},
                   report=True, grid=grid, seeds=[0, 1, 2])
    tuned = tuned_of(tmp_path, "gelu-vs-relu", df)
    assert len(tuned) == 4 and (tuned["n"] == 3).all()
    by_size = pd.read_csv(tmp_path / "runs" / "gelu-vs-relu" / "report" / "effects_by_size.csv")
    relu2 = by_size[(by_size.axis == "activation.kind") & (by_size.value == "relu2")]
    assert len(relu2) >= 2 and set(relu2["n"]) == {3}  # the effect at each width, 3 seeds


@pytest.mark.slow
def test_smoke_qk_norm_sensitivity_sweep_reports_each_curve(tmp_path):
    grid = {"attention.qk_norm": [None, {"kind": "rms"}],
            "measure.training.lr": [1.0e-3, 1.0e-2, 1.0e-1]}
    df = run_small(tmp_path, "qk-norm-lr-sensitivity", SMALL_MODEL,
                   {"training": {"steps": 20, "batch_size": 4, "seq_len": 32, "eval_batches": 2}},
                   report=True, grid=grid, seeds=[0, 1, 2])
    tuned = tuned_of(tmp_path, "qk-norm-lr-sensitivity", df)
    assert len(tuned) == 2 and tuned["lr_sensitivity"].notna().all()
    text = (tmp_path / "runs" / "qk-norm-lr-sensitivity" / "report" / "report.md").read_text()
    assert "Loss vs learning rate" in text


@pytest.mark.slow
def test_smoke_moe_balancing_small_run_reports_routing(tmp_path):
    grid = {"feedforward.aux_loss_coef": [0.0, 0.01], "feedforward.bias_update_rate": [0.0, 0.01],
            "measure.training.lr": [1.0e-2, 3.0e-2]}
    short = {"steps": 20, "batch_size": 4, "seq_len": 32}
    df = run_small(tmp_path, "moe-balancing", SMALL_MODEL,
                   {"training": {**short, "eval_batches": 2}, "dynamics": {**short, "every": 10}},
                   report=True, grid=grid, seeds=[0, 1, 2])
    tuned = tuned_of(tmp_path, "moe-balancing", df)
    assert len(tuned) == 4 and (tuned["n"] == 3).all()
    # each layer's imbalance is max / mean of that layer's expert loads at that step
    dyn = df[(df.probe == "dynamics") & (df.scope == "layer")]
    keys = ["variant", "seed", "step", "layer"]
    load = dyn[dyn.metric == "expert_load"].groupby(keys)["value"]
    want = load.max() / load.mean()
    got = dyn[dyn.metric == "load_imbalance"].set_index(keys)["value"]
    assert len(got) == len(want) > 0
    assert got.sort_index().to_numpy() == pytest.approx(want.sort_index().to_numpy(), rel=1e-6)
    text = (tmp_path / "runs" / "moe-balancing" / "report" / "report.md").read_text()
    assert "expert load" in text.lower()


@pytest.mark.slow
def test_smoke_moe_vs_dense_small_run_compares_at_each_width(tmp_path):
    doc = yaml.safe_load((ROOT / "experiments" / "moe-vs-dense.yaml").read_text())
    grid = {**doc["grid"], "emb_dim": [16, 32], "measure.training.lr": [1.0e-2, 3.0e-2]}
    df = run_small(tmp_path, "moe-vs-dense", {"context_length": 32},
                   {"training": {"steps": 20, "batch_size": 4, "seq_len": 32, "eval_batches": 2}},
                   report=True, grid=grid, seeds=[0, 1])
    tuned = tuned_of(tmp_path, "moe-vs-dense", df)
    assert len(tuned) == 6 and (tuned["n"] == 2).all()
    active = df[(df.probe == "params") & (df.metric == "active")]
    assert len(active) and active.variant.str.contains("moe").all()  # only the MoE has one
    assert (tmp_path / "runs" / "moe-vs-dense" / "report" / "effects_by_size.csv").exists()


@pytest.mark.slow
def test_local_global_small_run_keeps_less_cache_with_more_local_layers(tmp_path):
    doc = yaml.safe_load((ROOT / "experiments" / "local-global.yaml").read_text())
    grid = {**doc["grid"], "measure.training.lr": [1.0e-2]}
    df = run_small(tmp_path, "local-global", {"context_length": 32, "emb_dim": 32},
                   {"training": {"steps": 10, "batch_size": 4, "seq_len": 32, "eval_batches": 2},
                    "timing": {"batch_size": 2, "seq_len": 32, "repeats": 2}},
                   report=True, grid=grid, seeds=[0])
    state = df[(df.probe == "params") & (df.metric == "state_bytes") & (df.scope == "model")]
    kv = state.groupby("variant")["value"].first()
    # all-global keeps 12 layers x 32 positions; each local layer keeps only its 8-key window
    by_locals = {v: v.count("local") for v in kv.index}
    order = sorted(kv.index, key=lambda v: by_locals[v])
    assert list(kv[order]) == sorted(kv, reverse=True), kv
    assert kv[order[0]] / kv[order[-1]] == pytest.approx(12 * 32 / (2 * 32 + 10 * 8))


@pytest.mark.slow
def test_hybrid_ratio_small_run_state_grows_with_attention_layers(tmp_path):
    doc = yaml.safe_load((ROOT / "experiments" / "hybrid-ratio.yaml").read_text())
    grid = {**doc["grid"], "measure.training.lr": [1.0e-2]}
    df = run_small(tmp_path, "hybrid-ratio", {"context_length": 32},
                   {"training": {"steps": 10, "batch_size": 4, "seq_len": 32, "eval_batches": 2}},
                   report=True, grid=grid, seeds=[0])
    state = df[(df.probe == "params") & (df.metric == "state_bytes") & (df.scope == "model")]
    kv = state.groupby("variant")["value"].first()
    variants = gather([tmp_path / "runs" / "hybrid-ratio"]).variants
    pattern = {v: o["layout.pattern"]
               for v, o in zip(variants["stored_name"], variants["overrides"])}
    share = {v: pattern[v].count("attn") / len(pattern[v]) for v in kv.index}
    order = sorted(kv.index, key=lambda v: share[v])
    assert [share[v] for v in order] == [0, 1 / 8, 1 / 4, 1 / 2, 1]
    assert list(kv[order]) == sorted(kv), kv  # state grows with the share of attention
    loss = df[(df.probe == "training") & (df.metric == "test_loss")]
    assert len(loss) == 5 and loss["value"].notna().all()


@pytest.mark.slow
def test_smoke_zoology_small_run_reports_recall_per_mixer(tmp_path):
    doc = yaml.safe_load((ROOT / "experiments" / "zoology-mqar.yaml").read_text())
    grid = {"layout.pattern": doc["grid"]["layout.pattern"], "measure.training.lr": [1.0e-2]}
    df = run_small(tmp_path, "zoology-mqar", {"emb_dim": 32},
                   {"training": {"steps": 10, "batch_size": 8, "seq_len": 32, "eval_batches": 2,
                                 "warmup_steps": 2, "eval_every": 5}},
                   report=True, grid=grid, seeds=[0], max_files=0)
    recall = df[(df.probe == "training") & (df.metric == "recall_accuracy")]
    assert recall.variant.nunique() == 4 and recall["value"].notna().all()
    curve = df[(df.probe == "training") & (df.metric == "val_recall_accuracy_curve")]
    assert curve.groupby("variant")["step"].apply(sorted).tolist() == [[5, 10]] * 4


def _grid_at(name: str, **over: list[Any]) -> dict[str, Any]:
    """experiments/NAME.yaml's grid with ``over`` (dotted paths) replacing axes."""
    doc = yaml.safe_load((ROOT / "experiments" / f"{name}.yaml").read_text())
    return {**doc["grid"], **{k.replace("__", "."): v for k, v in over.items()}}


@pytest.mark.slow
def test_smoke_layernorm_batchnorm_rms_each_at_their_own_best_rate(tmp_path):
    grid = _grid_at("layernorm-vs-batchnorm", measure__training__lr=[3.0e-3, 3.0e-2])
    df = run_small(tmp_path, "layernorm-vs-batchnorm", SMALL_MODEL,
                   {"training": {"steps": 20, "batch_size": 4, "seq_len": 32, "eval_batches": 2},
                    "gradients": {"batch_size": 4, "seq_len": 32}},
                   report=True, grid=grid, seeds=[0, 1])
    tuned = tuned_of(tmp_path, "layernorm-vs-batchnorm", df)
    assert list(tuned.index) == ["norm=layer", "norm=batch", "norm=rms"] and (tuned["n"] == 2).all()


@pytest.mark.slow
def test_smoke_mla_keeps_the_cache_of_one_kv_head(tmp_path):
    grid = _grid_at("mla-vs-gqa", n_layers=[2], measure__training__lr=[1.0e-2])
    df = run_small(tmp_path, "mla-vs-gqa", {"context_length": 32},
                   {"training": {"steps": 5, "batch_size": 4, "seq_len": 32, "eval_batches": 2,
                                 "warmup_steps": 1},
                    "timing": {"batch_size": 2, "seq_len": 32, "repeats": 2}},
                   grid=grid, seeds=[0])
    assert set(df.status) == {"ok"}
    per_token = df[(df.metric == "state_bytes_per_token") & (df.scope == "model")]
    cache = {v.split("attention=")[1].split(",")[0]: x
             for v, x in zip(per_token.variant, per_token.value)}
    # 2 layers x 4 bytes x numbers per token and layer: mha 2*4*16, gqa2 2*2*16, gqa1 2*16,
    # mla kv_lora_rank 24 + the rotary key 8
    assert cache == {"mha": 2 * 4 * 128, "gqa2": 2 * 4 * 64, "gqa1": 2 * 4 * 32,
                     "mla": 2 * 4 * 32}


@pytest.mark.slow
def test_smoke_attention_sinks_record_the_mass_on_the_first_token_and_the_sink(tmp_path):
    grid = _grid_at("attention-sinks", emb_dim=[32], measure__training__lr=[1.0e-2])
    short = {"steps": 4, "batch_size": 4, "seq_len": 32, "warmup_steps": 1}
    df = run_small(tmp_path, "attention-sinks", {"context_length": 32},
                   {"training": {**short, "eval_batches": 2}, "dynamics": {**short, "every": 2}},
                   grid=grid, seeds=[0])
    layer = df[(df.probe == "dynamics") & (df.scope == "layer")]
    mass = layer[layer.metric == "first_token_mass"]
    assert mass.variant.nunique() == 4 and mass["value"].between(0, 1).all()
    sink = layer[layer.metric == "sink_mass"]
    assert set(sink.variant) == {v for v in set(mass.variant) if "sinks=sinks" in v}
    assert sink["value"].between(0, 1).all() and len(sink)


@pytest.mark.slow
def test_smoke_nope_interleave_scores_beyond_the_training_length(tmp_path):
    grid = _grid_at("nope-interleave", emb_dim=[32], measure__training__lr=[1.0e-2])
    df = run_small(tmp_path, "nope-interleave", {"n_layers": 4},
                   {"training": {"steps": 4, "batch_size": 4, "seq_len": 32, "eval_batches": 2,
                                 "warmup_steps": 1, "eval_lengths": [64, 128]}},
                   grid=grid, seeds=[0])
    rows = df[(df.probe == "training") & (df.scope == "model")]
    for metric in ("test_loss", "test_loss_at_64", "test_loss_at_128"):
        got = rows[rows.metric == metric]
        assert got.variant.nunique() == 3 and got["value"].notna().all(), metric


@pytest.mark.slow
def test_smoke_nope_recall_scores_recall_beyond_the_training_length(tmp_path):
    grid = _grid_at("nope-recall", emb_dim=[64], measure__training__lr=[3.0e-3])
    df = run_small(tmp_path, "nope-recall", {},
                   {"training": {"steps": 4, "batch_size": 4, "seq_len": 32, "warmup_steps": 1,
                                 "eval_every": 2, "eval_lengths": [64, 128]}},
                   max_files=0, grid=grid, seeds=[0])
    rows = df[(df.probe == "training") & (df.scope == "model")]
    for metric in ("test_recall_accuracy", "test_recall_accuracy_at_64",
                   "test_recall_accuracy_at_128"):
        got = rows[rows.metric == metric]
        assert got.variant.nunique() == 3 and got["value"].notna().all(), metric


def layer_rows(variant: str, seed: int, metric: str, values: dict[tuple[int, int], float]):
    return [{"variant": variant, "seed": seed, "probe": "dynamics", "metric": metric,
             "scope": "layer", "name": "", "layer": layer, "step": step, "value": v}
            for (step, layer), v in values.items()]


def report_data(rows: list[dict], baseline: str = "a") -> ReportData:
    frame = pd.DataFrame(rows)
    return ReportData(runs=[], variants=pd.DataFrame(), units=pd.DataFrame(), rows=frame,
                      baseline=baseline, order=["a", "b"])


def logit_rows(seeds: dict[int, float]) -> list[dict]:
    """a's largest logit at step 10 per seed as given (2 at step 0); b's 4 -> 5 on each."""
    rows = []
    for seed, end in seeds.items():
        rows += layer_rows("a", seed, "max_attn_logit",
                           {(0, 0): 2.0, (0, 1): 1.0, (10, 0): end, (10, 1): end / 2})
        rows += layer_rows("b", seed, "max_attn_logit",
                           {(0, 0): 2.0, (0, 1): 4.0, (10, 0): 5.0, (10, 1): 3.0})
    return rows


def test_reading_judges_the_logit_by_the_interval_of_its_log_ratio():
    rows = logit_rows({0: 250.0, 1: 125.0, 2: 62.5})
    text = dynamics_reading(report_data(rows))[0]
    # a: max over layers 2 -> 250, 125, 62.5 (mean 145.8), growth 125x, 62.5x, 31.25x;
    # b: 4 -> 5, 1.25x on each seed
    assert "step 10: a 2 → 145.8 (31.25 to 125x per seed); b 4 → 5 (1.25x per seed)." in text
    # b / a per seed 0.02, 0.04, 0.08: logs log 0.04 + (-log 2, 0, log 2), sd log 2; the
    # interval of the geometric mean 0.04 * exp(+-t(2) log 2 / sqrt 3) excludes 1: lower
    half = math.exp(T975[2] * math.log(2) / math.sqrt(3))
    assert f"{0.04 / half:.4g}, {0.04 * half:.4g}" == "0.007149, 0.2238"
    assert text.endswith("b's step-10 max attention logit is lower than a's (5 vs 145.8; "
                         "per-seed ratio 0.02 to 0.08, geometric mean 0.04, 95% interval "
                         "[0.007149, 0.2238] over 3 seeds).")
    # a fourth seed where a's logit ends at 0.5 (ratio 10): every seed but one agrees in
    # sign, and the interval includes 1
    logs = [math.log(r) for r in (0.02, 0.04, 0.08, 10.0)]
    mean = sum(logs) / 4
    half = T975[3] * math.sqrt(sum((x - mean) ** 2 for x in logs) / 3) / 2
    assert [f"{math.exp(x):.4g}" for x in (mean, mean - half, mean + half)] == \
        ["0.1591", "0.001795", "14.09"]
    text = dynamics_reading(report_data(logit_rows({0: 250.0, 1: 125.0, 2: 62.5, 3: 0.5})))[0]
    assert "a 2 → 109.5 (0.25 to 125x per seed)" in text
    assert text.endswith("b's step-10 max attention logit is not clearly different from a's "
                         "(5 vs 109.5; per-seed ratio 0.02 to 10, geometric mean 0.1591, 95% "
                         "interval [0.001795, 14.09] over 4 seeds includes 1).")
    # one seed: the numbers, no verdict word
    text = dynamics_reading(report_data(logit_rows({0: 250.0})))[0]
    assert text.endswith("step 10: a 2 → 250 (125x per seed); b 4 → 5 (1.25x per seed). "
                         "b's step-10 max attention logit 5 vs a's 250 (ratio 0.02; one seed: "
                         "no verdict).")
    assert "lower" not in text and "higher" not in text


def test_the_dynamics_verdicts_are_claims_rows_in_verdicts_csv():
    """Issue 37.1: the "lower than" of the dynamics reading is rendered from a ``dynamics``
    claims row, and the same row is in the report's verdicts (the probe's ``claims``
    piece)."""
    from variantlab.report.claims import compute_claims

    data = report_data(logit_rows({0: 250.0, 1: 125.0, 2: 62.5}))
    rows = dynamics_rows(data)
    assert [(r["kind"], r["a"], r["b"], r["metric"], r["n_seeds"], r["verdict"]) for r in rows] \
        == [("dynamics", "b", "a", "log max_attn_logit", 3, "lower")]
    half = T975[2] * math.log(2) / math.sqrt(3)
    assert rows[0]["estimate"] == pytest.approx(math.log(0.04))
    assert (rows[0]["low"], rows[0]["high"]) == pytest.approx(
        (math.log(0.04) - half, math.log(0.04) + half))
    assert (rows[0]["a_mean"], rows[0]["b_mean"]) == pytest.approx((5.0, 437.5 / 3))
    claims = compute_claims(data)
    mine = claims[claims["kind"] == "dynamics"]
    assert list(mine["verdict"]) == ["lower"] and list(mine["a"]) == ["b"]
    # a row made to say otherwise is said otherwise: the words come from the row
    from variantlab.report.words import dynamics_phrase

    flipped = pd.Series({**rows[0], "verdict": "higher"})
    assert dynamics_phrase(flipped, "logit", pd.Series([0.0, 0.0])).startswith(
        "b's logit is higher than a's (5 vs 145.8;")


def test_reading_residual_depth_ratio_at_the_last_step():
    rows = []
    for seed in (0, 1):
        rows += layer_rows("a", seed, "residual_rms",
                           {(0, 0): 1.0, (0, 2): 1.0, (5, 0): 1.0, (5, 1): 2.0, (5, 2): 4.0})
        rows += layer_rows("b", seed, "residual_rms",
                           {(0, 0): 1.0, (0, 2): 9.0, (5, 0): 2.0, (5, 2): 2.0 + seed})
    ratio = depth_ratio(pd.DataFrame(rows), "residual_rms")
    assert ratio.loc[0, "a"] == 4.0 and ratio.loc[1, "b"] == 1.5 and ratio.loc[0, "b"] == 1.0
    text = dynamics_reading(report_data(rows))[0]
    # after the last layer: a 1 -> 4, b 9 -> 2 and 3 (mean 2.5); b lower than a on each seed
    assert "from the first recorded step to step 5: a 1 → 4; b 9 → 2.5." in text
    # b / a per seed 0.5 and 0.75: both below 1, but two seeds' interval (t = 12.7) is wide
    logs = [math.log(0.5), math.log(0.75)]
    half = T975[1] * abs(logs[0] - logs[1]) / math.sqrt(2) / math.sqrt(2)
    mean = sum(logs) / 2
    assert [f"{math.exp(x):.4g}" for x in (mean, mean - half, mean + half)] == \
        ["0.6124", "0.04659", "8.049"]
    assert ("b's step-5 last-layer RMS is not clearly different from a's (2.5 vs 4; per-seed "
            "ratio 0.5 to 0.75, geometric mean 0.6124, 95% interval [0.04659, 8.049] over 2 "
            "seeds includes 1).") in text
    assert "over that after the first: a 4x (4 per seed); b 1.25x (1 to 1.5 per seed)." in text


def condition_data(losses: dict[tuple[str, int], list[float]]) -> ReportData:
    """A run over emb_dim (a condition) x norm.kind (compared) x measure.training.lr (the
    training probe's setting: the dynamics run is the same at both rates), with the
    dynamics eval loss per seed of each (norm, emb_dim) as given, at both rates."""
    meta = RunMeta(experiment="e", seeds=[0, 1, 2], run="e", measure={"dynamics": {"lr": 0.03}},
                   grid={"emb_dim": [32, 64], "norm.kind": ["layer", "rms"],
                         "measure.training.lr": [0.001, 0.01]})
    variants, rows = [], []
    for (norm, width), values in losses.items():
        for lr in (0.001, 0.01):
            name = f"{norm}{width}-{lr}"
            over = {"emb_dim": width, "norm.kind": norm, "measure.training.lr": lr}
            variants.append({"run": "e", "variant": name, "overrides": over, "spec": {}})
            rows += [{"variant": name, "seed": seed, "probe": "dynamics", "metric": "eval_loss",
                      "scope": "model", "name": "", "layer": None, "step": None, "value": v}
                     for seed, v in enumerate(values)]
    order = [v["variant"] for v in variants]
    return ReportData(runs=[meta], variants=pd.DataFrame(variants), units=pd.DataFrame(),
                      rows=pd.DataFrame(rows), baseline="layer32-0.001", order=order)


def test_reading_compares_the_dynamics_loss_within_each_condition():
    data = condition_data({("layer", 32): [3.0, 3.0, 3.0], ("rms", 32): [2.9, 2.85, 2.8],
                           ("layer", 64): [2.0, 2.0, 2.0], ("rms", 64): [2.1, 2.15, 2.2]})
    text = dynamics_reading(data)[0]
    # rms - layer per seed: -0.1, -0.15, -0.2 at width 32 and the opposite at 64; mean 0.15,
    # sd 0.05, half-width t(2) 0.05 / sqrt 3 = 0.1242
    half = T975[2] * 0.05 / math.sqrt(3)
    assert [f"{x:.4g}" for x in (0.15 - half, 0.15 + half)] == ["0.02579", "0.2742"]
    # one dynamics run per (norm, width): the training rate does not set it, so each is
    # said once; each rms against the layer of its own width, never across widths
    assert text == (
        "Eval loss after the dynamics run at lr 0.03 (mean over seeds): emb_dim=32: "
        "layer32-0.001 3; rms32-0.001 2.85; emb_dim=64: layer64-0.001 2; rms64-0.001 2.15. "
        "emb_dim=32: rms32-0.001's dynamics eval loss is lower than layer32-0.001's (2.85 vs 3; "
        "per-seed difference -0.2 to -0.1, mean -0.15, 95% interval [-0.2742, -0.02579] over "
        "3 seeds); emb_dim=64: rms64-0.001's dynamics eval loss is higher than "
        "layer64-0.001's (2.15 vs 2; per-seed difference 0.1 to 0.2, mean 0.15, 95% interval "
        "[0.02579, 0.2742] over 3 seeds).")


def test_reading_has_no_dynamics_sentences_without_its_rows():
    rows = [{"variant": "a", "seed": 0, "probe": "training", "metric": "eval_loss",
             "scope": "model", "name": "", "layer": None, "step": None, "value": 1.0}]
    assert dynamics_reading(report_data(rows)) == []
