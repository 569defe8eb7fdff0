"""Tuned comparisons (issue 23.3) and size as an axis (23.6): each architecture at its own
best setting, chosen on val_loss and reported on test_loss; effects at each size."""

from __future__ import annotations

import math
import re
from dataclasses import replace

import pandas as pd
import pytest

import variantlab as vl
from variantlab.report import build_context, gather, write_report
from variantlab.report.effects import interval
from variantlab.report.fair.compare import ranking_flips
from variantlab.report.fair.scaling import effects_by_size, power_law
from variantlab.report.fair.tuned import find_sweep, tuned_frame
from variantlab.testing.sample import sample_grid

REG = vl.get_registry()
LRS = [1e-3, 3e-3, 1e-2]
# val loss per (activation, lr): relu beats gelu at 1e-3 but gelu's best (3e-3) beats relu's
VAL = {("gelu", 1e-3): 3.0, ("gelu", 3e-3): 2.5, ("gelu", 1e-2): 2.8,
       ("relu", 1e-3): 2.9, ("relu", 3e-3): 2.95, ("relu", 1e-2): 3.3}


def tuning_run(grid, val, test, seeds=(0, 1, 2), init=4.0, drop=()):
    """A synthetic run over ``grid`` whose variants' training rows have ``val(over, seed)``
    and ``test(over, seed)`` as val_loss and test_loss (None: no such rows), the loss at
    init ``init``; ``drop``: (variant, seed) without val/test rows, marked diverged."""
    run = sample_grid(grid, seeds=seeds)
    run.variants["spec"] = [{k: v for k, v in s.items() if k != "measure"}
                            for s in run.variants["spec"]]
    run.meta = replace(run.meta, measure={"training": {"lr": 1e-3, "steps": 10,
                                                       "batch_size": 4, "seq_len": 16}})
    overs = dict(zip(run.variants["name"], run.variants["overrides"]))
    rows = run.rows
    rows.loc[(rows["metric"] == "loss") & (rows["step"] == 0), "value"] = init
    template = rows[rows["metric"] == "final_loss"]
    extra = []
    for metric, fn in (("val_loss", val), ("test_loss", test)):
        if fn is None:
            continue
        part = template.copy()
        part["metric"] = metric
        part["value"] = [fn(overs[v], int(s)) for v, s in zip(part["variant"], part["seed"])]
        extra.append(part)
    rows = pd.concat([rows, *extra], ignore_index=True)
    for variant, seed in drop:
        mine = (rows["variant"] == variant) & (rows["seed"] == seed)
        rows = rows[~(mine & rows["metric"].isin(["val_loss", "test_loss", "eval_loss"]))]
        rows.loc[mine & (rows["metric"] == "diverged"), "value"] = 1.0
    run.rows = rows.reset_index(drop=True)
    return run


def val_of(over, seed):
    return VAL[(over["activation.kind"], over["measure.training.lr"])] + 0.01 * seed


def held_out(over, seed):
    if (over["activation.kind"], over["measure.training.lr"]) == ("gelu", 1e-2):
        return 1.0  # the lowest test loss: chosen on test, 1e-2 would win; it must not
    return val_of(over, seed) + 0.1 + 0.02 * seed * (over["activation.kind"] == "relu")


GRID = {"activation.kind": ["gelu", "relu"], "measure.training.lr": LRS}


def test_each_architecture_is_chosen_on_val_and_reported_on_test(tmp_path):
    run = tuning_run(GRID, val_of, held_out)
    files = write_report([run], tmp_path, registry=REG)
    tuned = pd.read_csv(files.tuned).set_index("variant")
    assert list(tuned.index) == ["activation=gelu", "activation=relu"]
    gelu, relu = tuned.loc["activation=gelu"], tuned.loc["activation=relu"]
    assert gelu["measure.training.lr"] == 3e-3 and relu["measure.training.lr"] == 1e-3
    assert gelu["val_loss"] == pytest.approx(2.51) and relu["val_loss"] == pytest.approx(2.91)
    assert (gelu["chosen_on"], gelu["reported_on"]) == ("val_loss", "test_loss")
    mean, low, high, n = interval(pd.Series([2.6, 2.61, 2.62]))  # gelu at 3e-3: val + 0.1
    assert (gelu["test_loss"], gelu["low"], gelu["high"]) == pytest.approx((mean, low, high), rel=1e-5)
    assert gelu["n"] == 3 and relu["n"] == 3
    # relu at its best minus gelu at its best, per seed: 0.4 + 0.02 s -> t over 3 seeds
    vs = interval(pd.Series([0.4, 0.42, 0.44]))
    assert (relu["vs_baseline"], relu["vs_low"], relu["vs_high"]) == pytest.approx(vs[:3], rel=1e-5)
    assert not gelu["at_edge"] and relu["at_edge"]  # 1e-3 is the smallest lr tried
    assert relu["edge_axes"] == "measure.training.lr"
    # Wortsman 2023: mean over lrs of min(loss, init=4) - best; seed 0: gelu 3.0, 2.5, 2.8
    assert gelu["lr_sensitivity"] == pytest.approx((3.0 + 2.5 + 2.8) / 3 - 2.5, rel=1e-5)
    assert relu["lr_sensitivity"] == pytest.approx((2.9 + 2.95 + 3.3) / 3 - 2.9, rel=1e-5)
    assert gelu["diverged"] == 0 and gelu["runs"] == 9
    md = files.markdown.read_text()
    assert "## Tuned comparison" in md and "loss\\_vs\\_lr" not in md
    # relu's best sits at the edge: unresolved, so no ranking is drawn from it (issue 28.6)
    assert "loses at each one's best lr" not in md
    assert relu["unresolved"] and not gelu["unresolved"]
    assert gelu["group"] == "a" and math.isnan(relu["group"])  # relu: no group
    verdicts = pd.read_csv(files.verdicts, keep_default_na=False)
    averaged = verdicts[verdicts["kind"] == "average"]  # the effects over the other axis
    assert set(averaged["condition"]) == {"averaged"} and set(averaged["caveats"]) == {
        "averaged over (measure.training.lr)", "averaged over (activation.kind)"}
    verdicts = verdicts[verdicts["kind"] == "pair"]
    assert list(verdicts["verdict"]) == ["unresolved"]  # gelu vs relu: relu at an edge
    assert verdicts["caveats"].iloc[0] == ("best at an edge (measure.training.lr) "
                                           "[b: activation=relu]")
    assert "Unresolved: the best setting sits at the edge of the sweep for activation=" \
        "relu (measure.training.lr)" in md and "widen the sweep" in md
    table = [line for line in md.splitlines()
             if line.startswith("| activation=") and "| 0/9 |" in line]
    cells = [[c.strip() for c in line.strip("|").split("|")] for line in table]
    assert [c[7] for c in cells] == ["no", "yes"]  # at edge
    assert [c[-1] for c in cells] == ["a", "unresolved"]  # group
    assert (tmp_path / "loss_vs_lr.svg").exists()


# one more rate below: relu's best (1e-3) is inside the sweep, so the flip is a ranking
LRS4 = [3e-4, *LRS]
VAL4 = {**VAL, ("gelu", 3e-4): 3.05, ("relu", 3e-4): 3.04}
GRID4 = {"activation.kind": ["gelu", "relu"], "measure.training.lr": LRS4}


def val4(over, seed):
    return VAL4[(over["activation.kind"], over["measure.training.lr"])] + 0.01 * seed


def test_a_ranking_that_depends_on_the_lr_is_said_when_both_bests_are_inside(tmp_path):
    run = tuning_run(GRID4, val4, lambda over, seed: val4(over, seed) + 0.1)
    files = write_report([run], tmp_path, registry=REG)
    tuned = pd.read_csv(files.tuned).set_index("variant")
    # relu - gelu at each one's best: +0.4 on every seed, so two groups, gelu's first
    assert not tuned["unresolved"].any() and list(tuned["group"]) == ["a", "b"]
    md = files.markdown.read_text()
    # both orders hold on every seed (the seeds are shifted alike): a clear flip
    assert "The ranking on val\\_loss depends on the learning rate: activation=relu beats " \
        "activation=gelu at lr 0.001 (2.91 vs 3.01) and loses at each one's best lr " \
        "(2.91 vs 2.51); both orders hold over 3 seeds." in md
    assert "Unresolved" not in md
    # issue 37.1: the sentence is rendered from two ranking rows, which verdicts.csv holds
    rows = pd.read_csv(files.verdicts)
    ranking = rows[rows["kind"] == "ranking"]
    assert ranking[["a", "b", "metric", "a_setting", "n_seeds", "verdict"]].values.tolist() == [
        ["activation=relu", "activation=gelu", "val_loss", "lr=0.001", 3, "lower"],
        ["activation=relu", "activation=gelu", "val_loss", "its best", 3, "higher"]]
    assert ranking["estimate"].tolist() == pytest.approx([-0.1, 0.4])


def test_the_ranking_words_follow_the_rows():
    from variantlab.report.words import ranking_phrase

    row = {"a": "relu", "b": "gelu", "metric": "val_loss", "n_seeds": 3}
    said = ranking_phrase(pd.Series({**row, "verdict": "lower"}),
                          pd.Series({**row, "verdict": "higher"}), 1e-3, (2.9, 3.0, 2.95, 2.5))
    assert said == (
        "The ranking on val_loss depends on the learning rate: relu beats gelu at lr 0.001 "
        "(2.9 vs 3) and loses at each one's best lr (2.95 vs 2.5); both orders hold over 3 "
        "seeds.")


def test_an_order_that_is_not_clear_at_both_ends_is_no_flip():
    # relu is ahead of gelu at 1e-3 on every seed, but at each one's best the two are a
    # seed-noise apart: the order "changes" only in the means, so no ranking row and no
    # sentence (the pair verdict on test_loss is the only word said about them)
    def val(over, seed):
        lr, act = over["measure.training.lr"], over["activation.kind"]
        base = {1e-3: 3.0, 3e-3: 2.5, 1e-2: 2.9}[lr]
        if act == "relu":
            return base + (-0.2 + 0.01 * seed if lr == 1e-3 else 0.01 + 0.05 * (seed - 1))
        return base

    grid = {"activation.kind": ["gelu", "relu"], "measure.training.lr": [1e-3, 3e-3, 1e-2]}
    run = tuning_run(grid, val, lambda over, seed: val(over, seed) + 0.3)
    sweep = find_sweep(gather([run]), "training")
    assert ranking_flips(sweep, tuned_frame(sweep)) == []


def test_a_diverged_seed_keeps_its_setting_from_being_chosen_and_is_counted(tmp_path):
    def val(over, seed):
        return 2.0 if over["measure.training.lr"] == 1e-2 else val_of(over, seed)

    gelu_hi = "activation.kind=gelu,measure.training.lr=0.01"
    run = tuning_run(GRID, val, val, drop=[(gelu_hi, 1)])
    tuned = pd.read_csv(write_report([run], tmp_path, registry=REG).tuned).set_index("variant")
    gelu, relu = tuned.loc["activation=gelu"], tuned.loc["activation=relu"]
    assert gelu["measure.training.lr"] == 3e-3  # 1e-2 is lower on seeds 0 and 2, not on 1
    assert relu["measure.training.lr"] == 1e-2
    assert gelu["diverged"] == 1 and relu["diverged"] == 0
    # seed 1 of gelu: 1e-2 diverged counts as the loss at init (4.0)
    seeds = [(3.0 + 2.5 + 2.0) / 3 - 2.0, (3.01 + 2.51 + 4.0) / 3 - 2.51,
             (3.02 + 2.52 + 2.0) / 3 - 2.0]
    assert gelu["lr_sensitivity"] == pytest.approx(sum(seeds) / 3, rel=1e-5)


def test_without_held_out_losses_it_falls_back_and_says_it_is_optimistic(tmp_path):
    run = tuning_run(GRID, None, None)
    files = write_report([run], tmp_path, registry=REG)
    tuned = pd.read_csv(files.tuned)
    assert set(tuned["chosen_on"]) == {"eval_loss"} == set(tuned["reported_on"])
    assert "so the tuned numbers are optimistic" in files.markdown.read_text()


def test_no_setting_axes_no_tuned_file(tmp_path):
    first = write_report([tuning_run(GRID, val_of, held_out)], tmp_path, registry=REG)
    assert first.tuned is not None and first.tuned.exists()
    plain = sample_grid({"activation.kind": ["gelu", "relu"]})
    files = write_report([plain], tmp_path, registry=REG)
    assert files.tuned is None and not (tmp_path / "tuned.csv").exists()
    assert files.by_size is None


def test_size_axis_gives_power_laws_and_effects_by_size(tmp_path):
    dims = [32, 64, 128]

    def loss(over, seed):  # gelu: exactly 10 * N^-0.1; relu better small, worse large
        n = 1000.0 * (over["emb_dim"] / 32) ** 2
        shift = {32: -0.2, 64: 0.05, 128: 0.1}[over["emb_dim"]]
        return 10 * n ** -0.1 + (shift + 0.01 * seed if over["activation.kind"] == "relu"
                                 else 0.0)

    run = tuning_run({"activation.kind": ["gelu", "relu"], "emb_dim": dims}, loss, loss)
    nonemb = run.rows["metric"].eq("non_embedding")
    dim = run.rows["variant"].str.extract(r"emb_dim=(\d+)")[0].astype(float)
    run.rows.loc[nonemb, "value"] = 1000.0 * (dim[nonemb] / 32) ** 2
    files = write_report([run], tmp_path, registry=REG)
    assert files.tuned is None  # no setting axis
    by = pd.read_csv(files.by_size)
    relu = by[(by["axis"] == "activation.kind") & (by["value"] == "relu")]
    assert list(relu["size"]) == ["emb_dim=32", "emb_dim=64", "emb_dim=128"]
    assert list(relu["effect"]) == pytest.approx([-0.19, 0.06, 0.11])
    assert list(relu["n"]) == [3, 3, 3] and set(relu["across_sizes"]) == {"flips"}
    assert list(relu["sign"]) == ["negative", "positive", "positive"]
    md = files.markdown.read_text()
    assert "activation=gelu: test\\_loss ∝ N^-0.1;" in md
    assert "flips across sizes for activation.kind=relu" in md
    assert (tmp_path / "loss_vs_size.svg").exists()
    n = pd.Series([1e3, 4e3, 1.6e4])
    a, b = power_law(n, 10 * n ** -0.1)
    assert (a, b) == pytest.approx((10.0, 0.1))
    assert power_law(n[:2], n[:2]) is None  # two sizes: no fit


def test_effects_n_is_the_number_of_seeds_with_setting_axes():
    run = tuning_run(GRID, val_of, held_out)
    context, _ = build_context(gather([run]), registry=REG)
    main = context["effects_frame"].main
    assert set(main["n"]) == {3}
    assert math.isnan(main["low"].iloc[0]) is False


def test_ranking_flips_compare_only_architectures_of_one_size():
    # at each width relu beats gelu at 1e-3 and loses at each one's best; the width-16 and
    # width-32 architectures would "flip" against each other too, but differ in size
    grid = {"emb_dim": [16, 32], **GRID4}

    def val(over, seed):  # width 32: better at its best, worse than width 16 at 1e-2
        shift = {3e-4: -0.3, 1e-3: -0.3, 3e-3: -0.3, 1e-2: 0.5}[over["measure.training.lr"]]
        return val4(over, seed) + (shift if over["emb_dim"] == 32 else 0.0)

    run = tuning_run(grid, val, lambda over, seed: val(over, seed) + 0.1)
    data = gather([run], baseline=None)
    sweep = find_sweep(data, "training")
    lines = ranking_flips(sweep, tuned_frame(sweep))
    assert len(lines) == 2, lines
    for line in lines:
        assert len(set(re.findall(r"emb_dim=(\d+)", line))) == 1, line


def test_effects_by_size_say_one_size_when_a_value_has_one():
    rows = pd.DataFrame([{"seed": s, "size": size, "value": v, "activation.kind": act}
                         for s in (0, 1, 2)
                         for size, act, v in (("emb_dim=16", "gelu", 3.0), ("emb_dim=16", "relu", 3.1),
                                              ("emb_dim=32", "gelu", 2.8), ("emb_dim=32", "relu", 2.85),
                                              ("emb_dim=16", "silu", 3.2))])
    out = effects_by_size(rows, ["activation.kind"], {"activation.kind": "gelu"}, "test_loss")
    across = dict(zip(out["value"], out["across_sizes"]))
    assert across == {"relu": "holds", "silu": "one size"}
