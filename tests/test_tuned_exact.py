"""variantlab.report.fair.tuned function by function on small hand-made runs (issue 30.4):
the sweep a report reads, the choice of each group's setting, its edges and extensions,
the reported interval and paired difference, the still-improving count, Wortsman et al.'s
LR sensitivity and the ranking, each against numbers worked out by hand in the test. No
report is built: each test runs in milliseconds, so the mutation runner
(docs/mutation.md) can afford them per mutant."""

from __future__ import annotations

import dataclasses
import itertools
import math
import statistics
from collections.abc import Callable
from typing import Any

import pandas as pd
import pytest

from variantlab.config.metrics import headline
from variantlab.report.claims import sweep_claims
from variantlab.report.fair.compare import with_groups
from variantlab.report.fair.tuned import (
    Sweep,
    added,
    arch_name,
    at_chosen,
    at_edge,
    choose,
    find_sweep,
    group_name,
    improving,
    lr_curves,
    lr_sensitivity,
    scores,
    tie_broken,
    tried,
    tuned_frame,
)
from variantlab.report.frame import ReportData
from variantlab.report.labels import GridLabels
from variantlab.store.contract import RunMeta

T1 = 12.706204736  # the two-sided 95% critical value of t with 1 degree of freedom (tan 0.475 pi)
LR = "measure.training.lr"
ACT = "activation.kind"
Fn = Callable[[dict, int], Any]


def _t_interval(values: list[float], t: float = T1) -> tuple[float, float, float]:
    mean = statistics.fmean(values)
    half = t * statistics.stdev(values) / math.sqrt(len(values))
    return mean, mean - half, mean + half


def _data(grid: dict, metrics: dict[str, Fn], *, seeds=(0, 1), extra=(), compare_on="",
          init: float | None = 4.0, improving: Fn | None = None, baseline="",
          meta_seeds=True, roles=None, other_run="", head_probe="training",
          names: list[str] | None = None) -> ReportData:
    """A run over ``grid`` (plus ``extra`` variants' overrides): per variant and seed the
    ``head_probe``'s model rows ``metrics[m](overrides, seed)`` (None: no row), and the
    training probe's ``diverged`` (1 where the first metric is NaN), loss at step 0 ``init``
    and ``still_improving`` ``improving(overrides, seed)`` (None: no row). Rows that must
    never be read beside them: other probes', other scopes', other metrics', other runs'."""
    combos = [dict(zip(grid, vals)) for vals in itertools.product(*grid.values())]
    overs = [*combos, *extra]
    names = names or [f"v{i}" for i in range(len(overs))]
    meta = RunMeta(experiment="e", run="r", grid=grid, seeds=list(seeds) if meta_seeds else [],
                   compare_on=compare_on, roles=roles,
                   measure={"training": {"lr": 0.05, "steps": 10}}, data={"n_pairs": 4})
    rows: list[dict] = []

    def row(variant: str, seed: int, metric: str, value: float, step: float = math.nan,
            probe: str = "training", run: str = "r", scope: str = "model") -> None:
        rows.append({"run": run, "variant": variant, "seed": seed, "probe": probe,
                     "scope": scope, "metric": metric, "step": step, "value": value})

    first = next(iter(metrics))
    for name, over in zip(names, overs):
        for s in seeds:
            for metric, fn in metrics.items():
                v = fn(over, s)
                if v is not None:
                    row(name, s, metric, v, probe=head_probe)
            lead = metrics[first](over, s)
            row(name, s, "diverged", float(lead is not None and math.isnan(lead)))
            if init is not None:
                row(name, s, "loss", init, step=0)
                row(name, s, "loss", init - 1.0, step=5)  # not the loss at init
            if improving is not None and (imp := improving(over, s)) is not None:
                row(name, s, "still_improving", imp)
                row(name, s, "still_improving", 1 - imp, step=3)  # a curve's point: not it
            for metric in [*metrics, "diverged", "still_improving"]:  # never read
                for probe, scope, v in (("gradients", "model", -50.0), ("zz_probe", "model", -60.0),
                                        (head_probe, "layer", -90.0), ("training", "slot", -95.0)):
                    row(name, s, metric, v, probe=probe, scope=scope)
                    row(name, s, "loss", v, step=0, probe=probe, scope=scope)
                if other_run:
                    row(name, s, metric, -70.0, run=other_run)
            for metric in ("aa_junk", "zz_junk"):  # metrics that sort either side of them
                row(name, s, metric, -80.0, probe=head_probe)
                row(name, s, metric, -85.0, step=0)  # curves at step 0 beside the loss
    variants = pd.DataFrame({"run": "r", "variant": names, "overrides": overs,
                             "spec": [{"emb_dim": 32, "activation": {"kind": "gelu"}}] * len(names)})
    runs = [meta]
    if other_run:  # an earlier run without a tuned axis comes first
        runs.insert(0, RunMeta(experiment="e", run=other_run, grid={ACT: ["gelu", "relu"]}))
        old = pd.DataFrame({"run": other_run, "variant": ["v0", "v1"],
                            "overrides": [{ACT: "gelu"}, {ACT: "relu"}], "spec": [{}, {}]})
        variants = pd.concat([old, variants], ignore_index=True)
    return ReportData(runs=runs, variants=variants, units=pd.DataFrame(), rows=pd.DataFrame(rows),
                      baseline=baseline)


# --- one compared axis, one lr axis, loss ---------------------------------------------------

GRID = {ACT: ["gelu", "relu"], LR: [0.001, 0.01, 0.1]}
VAL = {("gelu", 0.001): 3.0, ("gelu", 0.01): 2.5, ("gelu", 0.1): 2.8,
       ("relu", 0.001): 2.9, ("relu", 0.01): 2.95, ("relu", 0.1): 2.6}


def _val(over: dict, s: int) -> float:
    if (over[ACT], over[LR], s) == ("relu", 0.1, 1):
        return math.nan  # relu diverged at 0.1 on seed 1: 0.1 is never its choice
    return VAL[(over[ACT], over[LR])] + 0.01 * s


def _test(over: dict, s: int) -> float:
    if (over[ACT], over[LR]) == ("gelu", 0.1):
        return 1.0  # the lowest test loss: a choice made on test would take it
    return _val(over, s) + 0.1 + 0.02 * s * (over[ACT] == "relu")


def _improving(over: dict, s: int) -> float | None:
    if over[ACT] == "relu" and s == 1:
        return None
    return float(s == 0)


def _sweep(**kw: Any) -> Sweep:
    sweep = find_sweep(_data(GRID, {"val_loss": _val, "test_loss": _test},
                             improving=_improving, **kw), "training")
    assert sweep is not None
    return sweep


def _grouped(data: ReportData, sweep: Sweep | None = None) -> pd.DataFrame:
    """tuned.csv as the report writes it: with each condition's group letters from the
    claims (:mod:`variantlab.report.claims`)."""
    sweep = sweep or find_sweep(data, "training") or find_sweep(data, "training", untuned=True)
    assert sweep is not None
    return with_groups(tuned_frame(sweep), sweep, sweep_claims(data, sweep))


@pytest.mark.parametrize("other", ["old", "zzz"])
def test_the_sweep_holds_each_variant_and_seed_of_the_tuned_run(other):
    sweep = _sweep(other_run=other, baseline="v4")
    assert sweep.run == "r" and sweep.setting_axes == [LR] and sweep.arch_axes == [ACT]
    assert sweep.archs == ["activation=gelu", "activation=relu"]
    assert sweep.baseline == "activation=relu"  # the baseline variant's compared variant
    assert (sweep.chosen_on, sweep.reported_on, sweep.wanted) == ("val_loss", "test_loss", "")
    assert sweep.values == {LR: [0.001, 0.01, 0.1]} and sweep.grid == {LR: [0.001, 0.01, 0.1]}
    assert sweep.sizes == {"activation=gelu": "", "activation=relu": ""}
    assert sweep.compared == {"activation=gelu": "activation=gelu",
                              "activation=relu": "activation=relu"}
    ps = sweep.per_seed.set_index(["variant", "seed"])
    assert len(ps) == 12
    assert ps.loc[("v1", 1), "val"] == pytest.approx(2.51)
    assert ps.loc[("v1", 1), "test"] == pytest.approx(2.61)
    assert ps.loc[("v5", 0), "val"] == pytest.approx(2.6) and math.isnan(ps.loc[("v5", 1), "val"])
    assert ps.loc[("v5", 1), "diverged"] == 1.0 and ps.loc[("v5", 0), "diverged"] == 0.0
    assert (ps["init"] == 4.0).all()  # the step-0 loss, not step 5's
    assert ps.loc[("v0", 0), "improving"] == 1.0 and ps.loc[("v0", 1), "improving"] == 0.0
    assert math.isnan(ps.loc[("v3", 1), "improving"])
    assert ps["tie"].isna().all()  # the loss chooses: no tie column
    assert list(ps.loc[("v3", 0), ["arch", "compared", "condition", LR, ACT]]) == [
        "activation=relu", "activation=relu", "", 0.001, "relu"]
    assert _sweep().baseline == "activation=gelu"  # no baseline variant: the first group
    # relu the baseline: gelu's row is paired with it (gelu's 2.6, 2.61 minus relu's 3.0, 3.03)
    gelu = tuned_frame(sweep).set_index("variant").loc["activation=gelu"]
    assert (gelu["vs_baseline"], gelu["vs_low"], gelu["vs_high"]) == pytest.approx(
        _t_interval([-0.4, -0.42]), rel=1e-9)
    assert sweep.optimistic is False and sweep.metric_columns == ("val_loss", "test_loss")
    assert sweep.lr_axis == LR and sweep.same_size("activation=gelu", "activation=relu")
    assert sweep.groups_of("") == sweep.archs and sweep.groups_of("x") == []


def test_each_group_is_chosen_on_val_and_a_diverged_seed_rules_a_setting_out():
    sweep = _sweep()
    table = scores(sweep, "activation=relu")
    assert list(table["variant"]) == ["v3", "v4", "v5"]
    assert list(table["score"][:2]) == pytest.approx([2.905, 2.955])
    assert math.isnan(table["score"][2]) and table["key"][2] == math.inf
    assert list(table[LR]) == [0.001, 0.01, 0.1] and (table["tie"] == math.inf).all()
    gelu, relu = choose(sweep, "activation=gelu"), choose(sweep, "activation=relu")
    assert gelu is not None and relu is not None
    assert (gelu["variant"], gelu[LR], gelu["score"]) == ("v1", 0.01, pytest.approx(2.505))
    assert (relu["variant"], relu[LR]) == ("v3", 0.001)
    assert tried(sweep, "activation=relu", LR) == [0.001, 0.01, 0.1]
    assert at_edge(sweep, gelu) == [] and at_edge(sweep, relu) == [LR]
    assert added(sweep, "activation=relu") == {}


def test_the_tuned_rows_report_on_test_with_intervals_over_seeds():
    frame = _grouped(_data(GRID, {"val_loss": _val, "test_loss": _test},
                           improving=_improving)).set_index("variant")
    assert list(frame.columns) == [LR, "val_loss", "test_loss", "low", "high", "n",
                                   "vs_baseline", "vs_low", "vs_high", "group", "unresolved",
                                   "at_edge", "edge_axes", "extended", "lr_sensitivity",
                                   "diverged", "runs", "still_improving", "seeds_judged",
                                   "chosen_on", "reported_on"]
    gelu, relu = frame.loc["activation=gelu"], frame.loc["activation=relu"]
    assert (gelu[LR], relu[LR]) == (0.01, 0.001)
    assert (gelu["val_loss"], relu["val_loss"]) == pytest.approx((2.505, 2.905))
    # gelu at 0.01: test = val + 0.1 = 2.6, 2.61
    assert (gelu["test_loss"], gelu["low"], gelu["high"]) == pytest.approx(
        _t_interval([2.6, 2.61]), rel=1e-9)
    assert gelu["n"] == 2 and relu["n"] == 2
    # relu at 0.001 minus gelu at 0.01, per seed: 3.0 - 2.6, 3.03 - 2.61
    assert (relu["vs_baseline"], relu["vs_low"], relu["vs_high"]) == pytest.approx(
        _t_interval([0.4, 0.42]), rel=1e-9)
    assert math.isnan(gelu["vs_baseline"]) and math.isnan(gelu["vs_low"])
    assert not gelu["at_edge"] and relu["at_edge"] and relu["edge_axes"] == LR
    assert gelu["edge_axes"] == "" and relu["unresolved"] and not gelu["unresolved"]
    # relu unresolved: no group; its pair with gelu says unresolved, so gelu is alone
    assert (gelu["group"], relu["group"]) == ("a", "")
    assert (gelu["diverged"], relu["diverged"]) == (0, 1)
    assert (gelu["runs"], relu["runs"]) == (6, 6)
    assert (gelu["still_improving"], gelu["seeds_judged"]) == (1, 2)
    assert (relu["still_improving"], relu["seeds_judged"]) == (1, 1)
    # Wortsman et al.: per seed, the mean over lrs of min(loss, init 4) minus the best;
    # relu's seed 1 diverged at 0.1 and counts as the loss at init
    assert gelu["lr_sensitivity"] == pytest.approx((3.0 + 2.5 + 2.8) / 3 - 2.5)
    relu_seeds = [(2.9 + 2.95 + 2.6) / 3 - 2.6, (2.91 + 2.96 + 4.0) / 3 - 2.91]
    assert relu["lr_sensitivity"] == pytest.approx(statistics.fmean(relu_seeds))
    assert set(frame["chosen_on"]) == {"val_loss"} and set(frame["reported_on"]) == {"test_loss"}
    assert set(frame["extended"]) == {""}


def test_lr_curves_are_the_choice_metric_at_each_lr():
    sweep = _sweep()
    curves = lr_curves(sweep, "activation=relu", choose(sweep, "activation=relu"))
    assert list(curves.columns) == ["lr", "mean", "low", "high", "diverged", "init"]
    assert list(curves["lr"]) == [0.001, 0.01, 0.1]
    assert list(curves["mean"]) == pytest.approx([2.905, 2.955, 2.6])
    assert list(curves["low"]) == pytest.approx([2.9, 2.95, 2.6])
    assert list(curves["high"]) == pytest.approx([2.91, 2.96, 2.6])
    assert list(curves["diverged"]) == [0, 0, 1] and list(curves["init"]) == [4.0] * 3


def test_a_run_without_held_out_rows_is_chosen_and_reported_on_eval_loss():
    def ev(over: dict, s: int) -> float:
        return VAL[(over[ACT], over.get(LR, 0.01))]

    sweep = find_sweep(_data(GRID, {"eval_loss": ev, "final_loss": ev}), "training")
    assert sweep is not None and (sweep.chosen_on, sweep.reported_on) == ("eval_loss",
                                                                          "eval_loss")
    assert sweep.optimistic
    # chosen on eval_loss (no val_loss), reported on test_loss: not the same column
    sweep = find_sweep(_data(GRID, {"eval_loss": ev, "test_loss": ev}), "training")
    assert sweep is not None and (sweep.chosen_on, sweep.reported_on) == ("eval_loss",
                                                                          "test_loss")
    assert not sweep.optimistic
    assert find_sweep(_data(GRID, {"best_loss": ev}), "training") is None
    no_tuned = {ACT: ["gelu", "relu"], "emb_dim": [32, 64]}
    assert find_sweep(_data(no_tuned, {"val_loss": ev, "test_loss": ev}), "training") is None


# --- conditions, a second tuned axis, ranks -----------------------------------------------


def test_an_untuned_sweep_is_the_first_run_with_conditions_and_no_tuned_axis():
    grid = {ACT: ["gelu", "relu"], "emb_dim": [32, 64]}

    def v(over: dict, s: int) -> float:
        return {"gelu": 3.0, "relu": 2.9}[over[ACT]] - over.get("emb_dim", 32) / 320 + 0.01 * s

    data = _data(grid, {"val_loss": v, "test_loss": v})
    assert find_sweep(data, "training") is None
    sweep = find_sweep(data, "training", untuned=True)
    assert sweep is not None and sweep.setting_axes == [] and sweep.condition_axes == ["emb_dim"]
    assert sweep.archs == ["activation=gelu (emb_dim=32)", "activation=gelu (emb_dim=64)",
                           "activation=relu (emb_dim=32)", "activation=relu (emb_dim=64)"]
    assert sweep.conditions == {"emb_dim=32": {"emb_dim": 32}, "emb_dim=64": {"emb_dim": 64}}
    assert not sweep.same_size("activation=gelu (emb_dim=32)", "activation=gelu (emb_dim=64)")
    assert not sweep.same_size("activation=gelu (emb_dim=64)", "activation=gelu (emb_dim=32)")
    assert sweep.same_size("activation=gelu (emb_dim=64)", "activation=relu (emb_dim=64)")
    assert sweep.groups_of("emb_dim=32") == ["activation=gelu (emb_dim=32)",
                                             "activation=relu (emb_dim=32)"]
    frame = _grouped(data, sweep)
    assert list(frame["variant"]) == ["activation=gelu", "activation=gelu", "activation=relu",
                                      "activation=relu"]
    assert list(frame["emb_dim"]) == [32, 64, 32, 64]
    # relu - gelu is -0.1 on every seed (p = 0): separated, relu (lower loss) first
    assert list(frame["group"]) == ["b", "b", "a", "a"]
    assert not frame["unresolved"].any() and frame["lr_sensitivity"].isna().all()
    assert list(frame["vs_baseline"][2:]) == pytest.approx([-0.1, -0.1])
    tuned = _data({ACT: ["gelu"], LR: [0.01, 0.1]}, {"val_loss": v, "test_loss": v})
    assert find_sweep(tuned, "training", untuned=True) is None
    bare = _data({ACT: ["gelu", "relu"]}, {"val_loss": v, "test_loss": v})
    assert find_sweep(bare, "training", untuned=True) is None


def test_an_untuned_group_without_a_finite_value_is_reported_as_it_ran():
    grid = {ACT: ["gelu", "relu"], "emb_dim": [32]}

    def v(over: dict, s: int) -> float:
        return math.nan if over[ACT] == "relu" and s == 0 else 3.0 + s

    again = [{ACT: "relu", "emb_dim": 32}]  # a named variant repeating relu: the same group
    sweep = find_sweep(_data(grid, {"val_loss": v, "test_loss": v}, extra=again), "training",
                       untuned=True)
    assert sweep is not None
    relu = choose(sweep, "activation=relu (emb_dim=32)")
    assert relu is not None and relu["variant"] == "v1" and math.isnan(relu["score"])
    row = tuned_frame(sweep).set_index("variant").loc["activation=relu"]
    assert row["test_loss"] == 4.0 and row["n"] == 1 and row["diverged"] == 2
    assert row["runs"] == 4


def _recall_data(pairs: tuple[int, ...] = (4, 8), **kw: Any) -> ReportData:
    grid = {"norm.kind": ["layer", "rms"], "data.n_pairs": list(pairs), LR: [0.001, 0.01, 0.1]}
    acc = {("layer", 0.001): 0.5, ("layer", 0.01): 1.0, ("layer", 0.1): 1.0,
           ("rms", 0.001): 0.6, ("rms", 0.01): 0.9, ("rms", 0.1): 0.8}
    loss = {0.001: 2.0, 0.01: 1.5, 0.1: 1.2}

    def a(over: dict, s: int) -> float:
        return acc[(over["norm.kind"], over[LR])] - 0.1 * (over["data.n_pairs"] == 8) * (s + 1)

    def v(over: dict, s: int) -> float:
        return loss[over[LR]]

    return _data(grid, {"val_recall_accuracy": a, "test_recall_accuracy": a, "val_loss": v},
                 compare_on="recall_accuracy", **kw)


def test_higher_is_better_ties_go_to_the_lower_val_loss_and_groups_are_per_condition():
    data = _recall_data()
    sweep = find_sweep(data, "training")
    assert sweep is not None and sweep.head.name == "recall_accuracy"
    assert sweep.condition_axes == ["data.n_pairs"]
    layer4 = "norm=layer (n_pairs=4)"
    table = scores(sweep, layer4)
    assert list(table["key"]) == [-0.5, -1.0, -1.0] and list(table["tie"]) == [2.0, 1.5, 1.2]
    chosen = choose(sweep, layer4)
    assert chosen is not None and chosen[LR] == 0.1  # 1.00 at 0.01 and 0.1: the lower val loss
    assert at_edge(sweep, chosen) == []  # at the metric's ceiling: nothing beyond can beat it
    rms8 = choose(sweep, "norm=rms (n_pairs=8)")
    assert rms8 is not None and rms8[LR] == 0.01 and rms8["score"] == pytest.approx(0.75)
    frame = _grouped(data, sweep)
    assert list(frame.columns[:4]) == ["variant", "data.n_pairs", LR, "val_recall_accuracy"]
    got = {(v, n): (g, u) for v, n, g, u in zip(frame["variant"], frame["data.n_pairs"],
                                                frame["group"], frame["unresolved"])}
    # n_pairs 4: layer 1.0 vs rms 0.9 on both seeds (a difference of 0.1, sd 0): separated
    assert got[("norm=layer", 4)] == ("a", False) and got[("norm=rms", 4)] == ("b", False)
    # n_pairs 8: layer ties at 0.85 (0.9, 0.8) at 0.01 and 0.1; 0.1 has the lower val loss
    # and is the largest rate, but it ties with 0.01 inside the sweep: resolved (issue 37.6)
    layer8 = choose(sweep, "norm=layer (n_pairs=8)")
    assert layer8 is not None and layer8[LR] == 0.1 and at_edge(sweep, layer8) == []
    assert tie_broken(sweep, "norm=layer (n_pairs=8)") == ["v4"]  # layer, 8, lr 0.01
    assert tie_broken(sweep, layer4) == ["v1"] and tie_broken(sweep, "norm=rms (n_pairs=8)") == []
    assert got[("norm=layer", 8)] == ("a", False) and got[("norm=rms", 8)] == ("b", False)
    claims = sweep_claims(data, sweep).set_index("condition")
    assert claims.loc["n_pairs=8", "verdict"] == "higher"  # layer - rms: +0.1 on both seeds
    assert claims.loc["n_pairs=8", "caveats"] == "tie-broken [a: norm=layer]"  # layer tied
    assert claims.loc["n_pairs=8", "a_setting"] == "lr=0.1"
    # higher is better: the best value minus the mean over rates, per seed
    layer = frame.set_index(["variant", "data.n_pairs"]).loc[("norm=layer", 4)]
    assert layer["lr_sensitivity"] == pytest.approx(1.0 - (0.5 + 1.0 + 1.0) / 3)
    assert layer["val_recall_accuracy"] == 1.0 and layer["test_recall_accuracy"] == 1.0


def test_each_condition_gets_its_own_groups_in_any_order():
    data = _recall_data(pairs=(8, 4))
    sweep = find_sweep(data, "training")
    assert sweep is not None and list(sweep.conditions) == ["n_pairs=8", "n_pairs=4"]
    frame = _grouped(data, sweep).set_index(["variant", "data.n_pairs"])
    assert not frame.loc[("norm=layer", 8), "unresolved"]  # tied with an inner rate
    assert frame.loc[("norm=layer", 8), "group"] == "a" and frame.loc[("norm=rms", 8), "group"] == "b"
    assert frame.loc[("norm=layer", 4), "group"] == "a" and frame.loc[("norm=rms", 4), "group"] == "b"


def test_a_run_marked_diverged_counts_even_with_a_finite_value():
    sweep = _sweep()
    late = (sweep.per_seed["variant"] == "v1") & (sweep.per_seed["seed"] == 0)
    sweep.per_seed.loc[late, "diverged"] = 1.0  # gelu at 0.01 diverged after its val loss
    frame = tuned_frame(sweep).set_index("variant")
    assert frame.loc["activation=gelu", "diverged"] == 1
    assert list(lr_curves(sweep, "activation=gelu", choose(sweep, "activation=gelu"))[
        "diverged"]) == [0, 1, 0]


def test_a_seed_without_any_finite_value_drops_out_of_the_lr_sensitivity():
    def v(over: dict, s: int) -> float:
        return math.nan if s == 0 else VAL[(over[ACT], over[LR])]

    sweep = find_sweep(_data(GRID, {"val_loss": v, "test_loss": v}), "training")
    assert sweep is not None
    assert choose(sweep, "activation=gelu") is None
    grid_lr = pd.Series({LR: 0.01, "variant": "v1"})  # gelu's rates all at the other axes
    assert lr_sensitivity(sweep, "activation=gelu", grid_lr) == pytest.approx(
        (3.0 + 2.5 + 2.8) / 3 - 2.5)  # seed 1 alone


def test_equal_reported_means_share_a_group():
    data = _recall_data()
    sweep = find_sweep(data, "training")
    assert sweep is not None
    sweep.per_seed.loc[sweep.per_seed["variant"] == "v8", "test"] = 1.0  # rms, n_pairs 4, 0.1
    sweep.per_seed.loc[sweep.per_seed["variant"] == "v8", "val"] = 1.0  # rms 4 chooses 0.1
    frame = with_groups(tuned_frame(sweep), sweep, sweep_claims(data, sweep)).set_index(
        ["variant", "data.n_pairs"])
    assert frame.loc[("norm=rms", 4), LR] == 0.1
    assert frame.loc[("norm=layer", 4), "group"] == "a" and frame.loc[("norm=rms", 4), "group"] == "a"
    row = sweep_claims(data, sweep).set_index("condition").loc["n_pairs=4"]
    assert row["verdict"] == "equal within ±0.02"  # 1.0 - 1.0 on both seeds, inside ±δ


def test_a_compare_on_metric_not_recorded_falls_back_to_the_loss():
    def v(over: dict, s: int) -> float:
        return VAL[(over[ACT], over[LR])]

    sweep = find_sweep(_data(GRID, {"val_loss": v, "test_loss": v},
                             compare_on="recall_accuracy"), "training")
    assert sweep is not None and sweep.wanted == "recall_accuracy"
    assert sweep.head.name == "loss" and sweep.chosen_on == "val_loss"


def test_a_compare_on_metric_half_recorded_falls_back_to_the_loss():
    def v(over: dict, s: int) -> float:
        return VAL[(over[ACT], over[LR])]

    sweep = find_sweep(_data(GRID, {"val_loss": v, "test_loss": v, "test_recall_accuracy": v},
                             compare_on="recall_accuracy"), "training")
    assert sweep is not None and sweep.wanted == "recall_accuracy"
    assert (sweep.chosen_on, sweep.reported_on) == ("val_loss", "test_loss")
    want = [VAL[(a, lr)] for a, lr in zip(sweep.per_seed[ACT], sweep.per_seed[LR])]
    assert list(sweep.per_seed["val"]) == want and list(sweep.per_seed["test"]) == want
    # the loss itself half recorded: nothing to choose on
    assert find_sweep(_data(GRID, {"test_loss": v}), "training") is None


class _Probe:
    name = "scorer"
    metrics = (("accuracy", "higher"),)


class _Registry:
    def probes(self) -> list:
        return [_Probe()]


def test_a_test_split_not_yet_scored_leaves_the_choice_on_the_headline():
    """A tuned sweep's test split is scored at each group's choice once the choice is
    made (deferred): until then its rows hold the validation recall and loss only. The
    choice, and so the edge extension that follows it, is on the validation recall all the
    same, not on the loss (rms at 4 pairs: recall 0.6, 0.9, 0.8 chooses 0.01, inside the
    sweep; the loss, lowest at 0.1, would put it at the edge). The test values are missing
    until they are scored."""
    full = _recall_data(pairs=(4,))
    rows = full.rows[full.rows["metric"] != "test_recall_accuracy"]
    held = rows[(rows["metric"] == "val_loss") & (rows["probe"] == "training")
                & (rows["scope"] == "model")].assign(metric="eval_loss")  # as training writes
    data = dataclasses.replace(full, rows=pd.concat([rows, held], ignore_index=True))
    sweep = find_sweep(data, "training")
    assert sweep is not None and sweep.head.name == "recall_accuracy" and sweep.wanted == ""
    assert (sweep.chosen_on, sweep.reported_on) == ("val_recall_accuracy", "test_recall_accuracy")
    chosen = choose(sweep, "norm=rms (n_pairs=4)")
    assert chosen is not None and chosen[LR] == 0.01 and at_edge(sweep, chosen) == []
    assert sweep.per_seed["test"].isna().all()
    scored = find_sweep(full, "training")
    assert scored is not None and choose(scored, "norm=rms (n_pairs=4)")[LR] == 0.01


def test_a_plugin_headline_not_recorded_falls_back_to_the_loss():
    def v(over: dict, s: int) -> float:
        return VAL[(over[ACT], over[LR])]

    data = _data(GRID, {"val_loss": v, "test_loss": v}, compare_on="accuracy")
    data.registry = _Registry()
    sweep = find_sweep(data, "training")
    assert sweep is not None and sweep.wanted == "accuracy" and sweep.head.name == "loss"
    want = [VAL[(a, lr)] for a, lr in zip(sweep.per_seed[ACT], sweep.per_seed[LR])]
    assert list(sweep.per_seed["val"]) == want


def test_a_plugin_headline_breaks_ties_on_the_val_loss_of_its_probe():
    acc = {0.001: 0.5, 0.01: 0.9, 0.1: 0.9}

    def a(over: dict, s: int) -> float:
        return acc[over[LR]]

    def loss(over: dict, s: int) -> float:
        return 1.0 / over[LR]  # 0.1 has the lowest

    data = _data(GRID, {"val_accuracy": a, "test_accuracy": a, "val_loss": loss},
                 compare_on="accuracy", head_probe="scorer")
    data.registry = _Registry()
    sweep = find_sweep(data, "training")
    assert sweep is not None and sweep.head.name == "accuracy" and sweep.wanted == ""
    assert (sweep.chosen_on, sweep.reported_on) == ("val_accuracy", "test_accuracy")
    chosen = choose(sweep, "activation=gelu")
    assert chosen is not None and chosen[LR] == 0.1 and chosen["score"] == 0.9


def test_a_tuned_model_key_without_a_dot_is_no_lr_axis():
    grid = {ACT: ["gelu", "relu"], "drop_rate": [0.0, 0.1], LR: [0.01, 0.1]}

    def v(over: dict, s: int) -> float:
        return 3.0 - over["drop_rate"] - over.get(LR, 0.0)

    sweep = find_sweep(_data(grid, {"val_loss": v, "test_loss": v},
                             roles={"drop_rate": "tuned"}), "training")
    assert sweep is not None and sweep.setting_axes == ["drop_rate", LR]
    assert sweep.lr_axis == LR
    chosen = choose(sweep, "activation=gelu")
    assert chosen is not None and (chosen["drop_rate"], chosen[LR]) == (0.1, 0.1)
    # two rates at the chosen drop_rate 0.1: 2.89 and 2.8 (a tuned axis sorting before lr)
    assert lr_sensitivity(sweep, "activation=gelu", chosen) == pytest.approx((2.89 + 2.8) / 2
                                                                             - 2.8)
    curves = lr_curves(sweep, "activation=gelu", chosen)
    assert list(curves["mean"]) == pytest.approx([2.89, 2.8])
    alone = {ACT: ["gelu", "relu"], "drop_rate": [0.0, 0.1]}
    sweep = find_sweep(_data(alone, {"val_loss": v, "test_loss": v},
                             roles={"drop_rate": "tuned"}), "training")
    assert sweep is not None and sweep.lr_axis is None


def test_names_that_sort_against_the_grid_change_no_choice():
    names = ["f", "e", "d", "c", "b", "a"]  # gelu: f, e, d; relu: c, b, a
    flat = {0.001: 3.0, 0.01: 2.5, 0.1: 2.5}  # a tie: the first in sweep order, 0.01

    def v(over: dict, s: int) -> float:
        return flat[over[LR]] + (over[ACT] == "relu")

    sweep = find_sweep(_data(GRID, {"val_loss": v, "test_loss": v}, names=names, baseline="c"),
                       "training")
    assert sweep is not None and sweep.baseline == "activation=relu"
    chosen = choose(sweep, "activation=gelu")
    assert chosen is not None and (chosen["variant"], chosen[LR]) == ("e", 0.01)
    assert list(scores(sweep, "activation=gelu")["variant"]) == ["f", "e", "d"]
    # both inside the sweep, in one condition: relu - gelu is +1 on both seeds, separated
    data = _data(GRID, {"val_loss": v, "test_loss": v}, names=names, baseline="c")
    assert list(_grouped(data)["group"]) == ["a", "b"]
    # the variants stored in another order: the grid's order still rules values and edges
    data = _data(GRID, {"val_loss": v, "test_loss": v})
    data.variants = data.variants.iloc[::-1].reset_index(drop=True)
    sweep = find_sweep(data, "training")
    assert sweep is not None and sweep.values == {LR: [0.001, 0.01, 0.1]}
    assert tried(sweep, "activation=gelu", LR) == [0.001, 0.01, 0.1]
    curves = lr_curves(sweep, "activation=gelu", choose(sweep, "activation=gelu"))
    assert list(curves["lr"]) == [0.001, 0.01, 0.1]  # by rate, not as stored


def test_a_seed_at_minus_infinity_is_no_finite_score():
    def v(over: dict, s: int) -> float:
        if (over[ACT], over[LR], s) == ("gelu", 0.001, 1):
            return -math.inf
        return VAL[(over[ACT], over[LR])]

    sweep = find_sweep(_data(GRID, {"val_loss": v, "test_loss": v}), "training")
    assert sweep is not None
    table = scores(sweep, "activation=gelu")
    assert math.isnan(table["score"][0]) and table["key"][0] == math.inf
    chosen = choose(sweep, "activation=gelu")
    assert chosen is not None and chosen[LR] == 0.01


def test_seeds_come_from_the_rows_when_the_meta_has_none():
    sweep = find_sweep(_data(GRID, {"val_loss": _val, "test_loss": _test}, seeds=(3, 1),
                             meta_seeds=False), "training")
    assert sweep is not None and sorted(set(sweep.per_seed["seed"])) == [1, 3]
    assert len(sweep.per_seed) == 12
    one = find_sweep(_data(GRID, {"val_loss": _val, "test_loss": _test}, seeds=(0,)),
                     "training")
    assert one is not None
    assert list(scores(one, "activation=gelu")[LR]) == [0.001, 0.01, 0.1]
    row = tuned_frame(one).set_index("variant").loc["activation=gelu"]
    assert row["test_loss"] == pytest.approx(2.6) and row["n"] == 1 and math.isnan(row["low"])


@pytest.mark.parametrize("reverse", [False, True])  # variant names that sort against the grid
def test_an_extension_beyond_the_grid_is_tried_added_and_moves_the_edge(reverse):
    # relu: below the grid, and lr by default; gelu: above it
    extra = [{ACT: "relu", LR: 0.0001}, {ACT: "relu"}, {ACT: "gelu", LR: 1.0}]
    relu = {0.0001: 2.95, 0.001: 2.9, 0.01: 2.95, 0.1: 3.3, 0.05: 3.5}

    def v(over: dict, s: int) -> float:
        lr = over.get(LR, 0.05)
        return relu[lr] if over[ACT] == "relu" else VAL.get((over[ACT], lr), 3.9)

    names = [chr(ord("a") + 8 - i) for i in range(9)] if reverse else None
    data = _data(GRID, {"val_loss": v, "test_loss": v}, extra=extra, names=names)
    sweep = find_sweep(data, "training")
    assert sweep is not None
    assert sweep.values == {LR: [0.001, 0.01, 0.1, 0.0001, 0.05, 1.0]}
    name = "activation=relu"
    assert tried(sweep, name, LR) == [0.001, 0.01, 0.1, 0.0001, 0.05]
    assert tried(sweep, "activation=gelu", LR) == [0.001, 0.01, 0.1, 1.0]
    assert added(sweep, name) == {LR: [0.0001, 0.05]}
    assert added(sweep, "activation=gelu") == {LR: [1.0]}
    chosen = choose(sweep, name)
    assert chosen is not None and chosen[LR] == 0.001
    assert at_edge(sweep, chosen) == []  # the grid's smallest rate, inside once 1e-4 ran
    frame = tuned_frame(sweep).set_index("variant")
    assert frame.loc[name, "extended"] == f"{LR}: 0.0001, 0.05"
    assert not frame.loc[name, "unresolved"] and frame.loc[name, "runs"] == 10


def test_the_edge_is_the_smallest_or_largest_value_tried_on_each_tuned_axis():
    # steps (one value: no edge) listed before the axes that have one
    grid = {ACT: ["gelu"], "measure.training.steps": [10], LR: [0.001, 0.01, 0.1],
            "measure.training.warmup": ["none", "lin", "cos"]}
    loss = {(0.01, "none"): 2.0, (0.001, "lin"): 1.0}

    def v(over: dict, s: int) -> float:
        return loss.get((over[LR], over["measure.training.warmup"]), 3.0)

    sweep = find_sweep(_data(grid, {"val_loss": v, "test_loss": v}), "training")
    assert sweep is not None and sweep.archs == ["base"]  # one compared value: no name
    chosen = choose(sweep, "base")
    assert chosen is not None and (chosen[LR], chosen["measure.training.warmup"]) == (0.001, "lin")
    assert at_edge(sweep, chosen) == [LR]  # "lin" is neither the first nor the last listed
    loss[(0.01, "cos")] = 0.5
    sweep = find_sweep(_data(grid, {"val_loss": v, "test_loss": v}), "training")
    assert sweep is not None
    chosen = choose(sweep, "base")
    assert chosen is not None
    assert at_edge(sweep, chosen) == ["measure.training.warmup"]
    # the lr sensitivity is over the rates at the chosen warmup (cos): 3.0, 0.5, 3.0
    assert lr_sensitivity(sweep, "base", chosen) == pytest.approx(
        (3.0 + 0.5 + 3.0) / 3 - 0.5)
    mine = at_chosen(sweep, "base", chosen, LR)
    assert set(mine["measure.training.warmup"]) == {"cos"} and set(mine[LR]) == {0.001, 0.01,
                                                                                   0.1}
    loss[(0.01, "none")] = 0.1  # the first listed warmup: an edge too
    sweep = find_sweep(_data(grid, {"val_loss": v, "test_loss": v}), "training")
    assert sweep is not None
    chosen = choose(sweep, "base")
    assert chosen is not None and chosen["measure.training.warmup"] == "none"
    assert at_edge(sweep, chosen) == ["measure.training.warmup"]


def test_lr_sensitivity_needs_two_rates_and_the_loss_at_init():
    sweep = _sweep()
    chosen = choose(sweep, "activation=gelu")
    assert chosen is not None
    no_init = find_sweep(_data(GRID, {"val_loss": _val, "test_loss": _test}, init=None),
                         "training")
    assert no_init is not None
    assert math.isnan(lr_sensitivity(no_init, "activation=gelu", chosen))
    one = {ACT: ["gelu", "relu"], LR: [0.01], "measure.training.steps": [10, 20]}

    def v(over: dict, s: int) -> float:
        return 3.0 - over["measure.training.steps"] / 100

    sweep1 = find_sweep(_data(one, {"val_loss": v, "test_loss": v}), "training")
    assert sweep1 is not None
    c1 = choose(sweep1, "activation=gelu")
    assert c1 is not None and math.isnan(lr_sensitivity(sweep1, "activation=gelu", c1))
    no_lr = {ACT: ["gelu", "relu"], "measure.training.steps": [10, 20]}
    sweep2 = find_sweep(_data(no_lr, {"val_loss": v, "test_loss": v}), "training")
    assert sweep2 is not None and sweep2.lr_axis is None
    c2 = choose(sweep2, "activation=gelu")
    assert c2 is not None and math.isnan(lr_sensitivity(sweep2, "activation=gelu", c2))
    assert c2["measure.training.steps"] == 20 and at_edge(sweep2, c2) == [
        "measure.training.steps"]


def test_a_group_that_diverged_everywhere_has_no_choice():
    def v(over: dict, s: int) -> float:
        return math.nan if over[ACT] == "relu" else VAL[(over[ACT], over[LR])]

    sweep = find_sweep(_data(GRID, {"val_loss": v, "test_loss": v}), "training")
    assert sweep is not None and choose(sweep, "activation=relu") is None
    data = _data(GRID, {"val_loss": v, "test_loss": v})
    frame = _grouped(data, sweep).set_index("variant")
    relu = frame.loc["activation=relu"]
    assert relu["unresolved"] and math.isnan(relu["test_loss"]) and relu["diverged"] == 6
    assert math.isnan(relu[LR]) and relu["runs"] == 6
    assert frame.loc["activation=gelu", "group"] == "a" and relu["group"] == ""
    row = sweep_claims(data, sweep).iloc[0]  # no pair of seeds: nothing estimated
    assert (row["verdict"], row["n_seeds"]) == ("not estimated", 0)
    assert row["caveats"] == "no setting finished on every seed [b: activation=relu]"
    assert choose(sweep, "nobody") is None
    # the group without a choice listed first: the groups after it still get their rows
    def w(over: dict, s: int) -> float:
        return math.nan if over[ACT] == "gelu" else VAL[(over[ACT], over[LR])]

    first = find_sweep(_data(GRID, {"val_loss": w, "test_loss": w}), "training")
    assert first is not None
    frame = tuned_frame(first).set_index("variant")
    assert frame.loc["activation=relu", LR] == 0.1 and frame.loc["activation=relu", "n"] == 2


def test_improving_counts_the_seeds_judged_at_one():
    got = improving(pd.Series([1.0, 0.0, math.nan, 1.0]))
    assert got == {"still_improving": 2.0, "seeds_judged": 3.0}
    none = improving(pd.Series([math.nan, math.nan]))
    assert math.isnan(none["still_improving"]) and none["seeds_judged"] == 0.0
    assert improving(pd.Series([0.5, 0.75]))["still_improving"] == 1.0


def test_names_of_compared_variants_and_groups():
    over = {"norm.kind": "rms", "emb_dim": 64, LR: 0.01}
    assert arch_name(over) == "norm.kind=rms,emb_dim=64"
    assert arch_name({LR: 0.01}) == "base" and arch_name({}, []) == "base"
    assert arch_name(over, ["norm.kind"]) == "norm.kind=rms"
    assert arch_name({"ffn": {"kind": "glu"}, "flag": True}) == "ffn=glu,flag=true"
    labels = GridLabels.of(RunMeta(grid={"norm.kind": ["layer", "rms"], "emb_dim": [64]}))
    assert arch_name(over, ["norm.kind", "emb_dim"], labels) == "norm=rms"
    assert arch_name({"norm.kind": "rms", "x.y": 1}, None, labels) == "norm=rms, x.y=1"
    assert arch_name({"emb_dim": 64}, None, labels) == "base"
    assert group_name("norm=rms", "emb_dim=64") == "norm=rms (emb_dim=64)"
    assert group_name("norm=rms", "") == "norm=rms"


def test_a_tuned_axis_a_group_lacks_is_not_filtered_and_never_its_edge():
    per_seed = pd.DataFrame({
        "variant": ["a", "a", "b", "b", "c", "c"], "seed": [0, 1] * 3,
        "arch": ["g"] * 6, "measure.training.lr": [0.1, 0.1, 0.2, 0.2, 0.3, 0.3],
        "alpha": [math.nan] * 6, "val": [2.0, 2.0, 1.0, 1.2, 3.0, 3.0],
        "test": [2.0] * 6, "tie": [math.nan] * 6, "init": [4.0] * 6, "diverged": [0.0] * 6,
        "improving": [math.nan] * 6})
    cells = per_seed.drop_duplicates("variant")[["variant", "arch", LR, "alpha"]]
    sweep = Sweep("r", [], [LR, "alpha"], {LR: [0.1, 0.2, 0.3], "alpha": []}, cells,
                  per_seed, "val_loss", "test_loss", "g", archs=["g"], head=headline())
    chosen = choose(sweep, "g")
    assert chosen is not None and chosen["variant"] == "b" and chosen["score"] == 1.1
    assert len(at_chosen(sweep, "g", chosen, LR)) == 6
    assert at_edge(sweep, chosen) == []
    assert lr_sensitivity(sweep, "g", chosen) == pytest.approx(
        statistics.fmean([(2.0 + 1.0 + 3.0) / 3 - 1.0, (2.0 + 1.2 + 3.0) / 3 - 1.2]))
    assert len(at_chosen(sweep, "g", None, LR)) == 6
