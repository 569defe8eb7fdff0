"""A tuned sweep scores its test split only at each group's chosen setting (issue 39): the
training units defer it and keep their final weights, and a test unit per chosen (variant,
seed) scores it once the group is complete, with the bits scoring in place gives."""

from __future__ import annotations

import math

import pytest
import torch
from conftest import TINY_MODEL
from test_roles import fake_experiment, fake_training

import variantlab as vl
from variantlab.config.experiment import experiment_from_text
from variantlab.errors import InputError
from variantlab.executors.runner import run_dir_for, run_experiment
from variantlab.probes import checkpoint, run_probe
from variantlab.report.fair.extension import EdgeFeed
from variantlab.sweep.units import TEST, plan_units

SWEEP = f"""name: deferred
seeds: [0, 1]
model: {TINY_MODEL}
grid:
  activation.kind: [gelu, relu]
  measure.training.lr: [1.0e-3, 3.0e-2]
data: {{source: synthetic}}
measure:
  training: {{steps: 6, batch_size: 4, seq_len: 16, warmup_steps: 1, eval_tokens: 256}}
"""


def sweep(tmp_path, text: str = SWEEP):
    path = tmp_path / "deferred.yaml"
    path.write_text(text)
    return experiment_from_text(text, path)


def deferring(e, out, **kw):
    """``run_experiment`` as ``variantlab run`` calls it: a feed makes each group's choice,
    and the test split is scored there alone."""
    return run_experiment(e, out, grow=EdgeFeed(e, run_dir_for(e, out), {}, defer=True), **kw)


def scores(run_dir) -> dict[tuple[str, int, str], float]:
    rows = vl.results(run_dir)
    rows = rows[rows["metric"].isin(["val_loss", "test_loss", "test_tokens"])]
    return {(v, int(s), m): float(x) for v, s, m, x in
            zip(rows["variant"], rows["seed"], rows["metric"], rows["value"])}


def chosen_of(run_dir) -> set[str]:
    from variantlab.report.fair.tuned import choose, find_sweep
    from variantlab.report.frame import gather

    data = gather([run_dir])
    found = find_sweep(data, "training")
    stored = dict(zip(data.variants["variant"], data.variants["stored_name"]))
    return {str(stored[choose(found, g)["variant"]]) for g in found.archs}


def test_only_the_chosen_settings_are_tested_with_the_bits_of_scoring_in_place(tmp_path):
    e = sweep(tmp_path)
    deferred = deferring(e, tmp_path / "a")
    inline = run_experiment(e, tmp_path / "b")
    assert deferred.ok and inline.ok
    # 4 variants x 2 seeds, then one test unit per chosen variant (2 groups) and seed
    assert inline.total == 8 and deferred.total == 8 + 2 * 2
    a, b = scores(run_dir_for(e, tmp_path / "a")), scores(run_dir_for(e, tmp_path / "b"))
    chosen = chosen_of(run_dir_for(e, tmp_path / "a"))
    assert chosen == chosen_of(run_dir_for(e, tmp_path / "b")) and len(chosen) == 2
    for (variant, seed, metric), value in b.items():
        if metric == "val_loss" or variant in chosen:
            assert a[(variant, seed, metric)] == value  # bit for bit
        else:
            assert (variant, seed, metric) not in a  # not scored: not chosen
    assert {k for k in a if k[2] == "test_loss"} == {(v, s, "test_loss") for v in chosen
                                                     for s in (0, 1)}
    # the kept weights are gone once their test units are stored, the others with them
    folder = run_dir_for(e, tmp_path / "a") / "checkpoints"
    assert not list(folder.glob("*.weights")) if folder.is_dir() else True


def test_the_test_unit_scores_the_kept_weights_or_trains_again(tmp_path, monkeypatch):
    e = sweep(tmp_path)
    monkeypatch.setenv(checkpoint.DIR_VAR, str(tmp_path / "ck"))
    plan = plan_units(e, defer=True, tested={("measure.training.lr=0.03", 1)})
    test = next(u for u in plan if u.probe == TEST)
    trained = next(u for u in plan if u.key == test.settings.trained)
    assert trained.settings.test_split == "deferred" and trained.seed == test.seed == 1
    assert test.variant.name == trained.variant.name and test.measures == "training"

    def run(unit):
        with checkpoint.for_unit(unit.key):
            return run_probe(unit.measures, unit.variant.spec, unit.settings, seed=unit.seed,
                             data=e.data, base_dir=e.base_dir, registry=e.registry)

    rows = run(trained)
    assert {r["metric"] for r in rows} >= {"val_loss", "final_loss", "init_loss"}
    assert not {r["metric"] for r in rows} & {"test_loss", "test_tokens"}
    kept = checkpoint.weights_path(trained.key)
    assert kept is not None and kept.is_file()
    from_weights = run(test)
    assert {r["metric"] for r in from_weights} == {"test_loss", "test_tokens"}
    inline = run_probe("training", trained.variant.spec,
                       trained.settings.model_copy(update={"test_split": "scored"}),
                       seed=1, data=e.data, base_dir=e.base_dir, registry=e.registry)
    want = {r["metric"]: r["value"] for r in inline}
    assert {r["metric"]: r["value"] for r in from_weights} == {
        "test_loss": want["test_loss"], "test_tokens": want["test_tokens"]}
    # weights that are missing, or are another model's, are trained again: the same bits
    state = torch.load(kept, weights_only=True)
    state["model"] = {k: v[..., :1] for k, v in state["model"].items()}
    torch.save(state, kept)
    assert {r["metric"]: r["value"] for r in run(test)} == {
        "test_loss": want["test_loss"], "test_tokens": want["test_tokens"]}
    kept.unlink()
    assert {r["metric"]: r["value"] for r in run(test)}["test_loss"] == want["test_loss"]


def test_a_run_killed_before_its_test_units_scores_them_on_the_rerun(tmp_path):
    e = sweep(tmp_path)
    started = []

    def stop_at_tests(name, spec, settings, **kw):
        if settings.test_split == "only":
            raise KeyboardInterrupt  # as Ctrl-C would stop it, before the test unit ends
        return run_probe(name, spec, settings, **kw)

    first = deferring(e, tmp_path / "a", probe_fn=stop_at_tests)
    # the first group's (gelu's) test units come as soon as its 4 training units are stored
    assert first.interrupted and first.done == 4
    folder = run_dir_for(e, tmp_path / "a") / "checkpoints"
    assert len(list(folder.glob("*.weights"))) == 4  # every deferred unit's, kept
    again = deferring(e, tmp_path / "a", progress=lambda ev: ev.kind == "start"
                      and started.append(ev.unit.probe))
    # relu's group, and the test units of both groups (gelu's from the kept weights)
    assert again.ok and again.done == 8 and again.skipped == 4
    assert sorted(started) == [TEST] * 4 + ["training"] * 4
    assert not list(folder.glob("*.weights"))
    inline = run_experiment(e, tmp_path / "b")
    b = scores(run_dir_for(e, tmp_path / "b"))
    a = scores(run_dir_for(e, tmp_path / "a"))
    assert all(b[k] == v for k, v in a.items())
    # and a third run has nothing left to do
    assert deferring(e, tmp_path / "a").done == 0 and inline.ok


@pytest.mark.slow  # a subprocess, a real pool or a browser: end to end
def test_the_pool_tests_the_same_settings_with_the_same_bits(tmp_path):
    e = sweep(tmp_path)
    pooled = deferring(e, tmp_path / "a", workers=2)
    alone = deferring(e, tmp_path / "b")
    assert pooled.ok and alone.ok and pooled.total == alone.total == 12
    assert scores(run_dir_for(e, tmp_path / "a")) == scores(run_dir_for(e, tmp_path / "b"))


def test_the_yaml_cannot_set_what_the_run_sets(tmp_path):
    with pytest.raises(InputError) as err:
        sweep(tmp_path, SWEEP.replace("eval_tokens: 256", "eval_tokens: 256, "
                                      "test_split: deferred"))
    assert "test_split is set by variantlab run itself" in str(err.value)


def test_an_untuned_experiment_scores_its_test_split_in_place(tmp_path):
    e = sweep(tmp_path, SWEEP.replace("  measure.training.lr: [1.0e-3, 3.0e-2]\n", ""))
    assert all(getattr(u.settings, "test_split", "scored") == "scored"
               for u in plan_units(e, defer=True))


def as_split(rows: list, settings) -> list:
    """``rows`` of a training run as its unit keeps them: without the test split's rows when
    it defers it, only those in a test unit (``settings.test_split``)."""
    if settings.test_split == "deferred":
        return [r for r in rows if not r["metric"].startswith("test_")]
    if settings.test_split == "only":
        return [r for r in rows if r["metric"].startswith("test_")]
    return rows


def only_tested(name, spec, settings, *, seed, data=None, **kw):
    """fake_training, scoring its test split as ``settings.test_split`` says."""
    return as_split(fake_training(name, spec, settings, seed=seed, data=data, **kw), settings)


def test_the_choice_is_tested_after_the_groups_extension(tmp_path):
    grid = ("  activation.kind: [gelu, relu]\n"
            "  measure.training.lr: {values: [1.0e-3, 1.0e-2], extend: true}\n")
    e = fake_experiment(tmp_path, grid)
    started = []
    feed = EdgeFeed(e, run_dir_for(e, tmp_path / "runs"), e.extensions(), defer=True)
    summary = run_experiment(e, tmp_path / "runs", probe_fn=only_tested, grow=feed,
                             progress=lambda ev: ev.kind == "start" and started.append(
                                 (ev.unit.variant.name, ev.unit.probe)))
    assert summary.ok
    # gelu's best moves to the extension 0.1 (its best, fake_training's BEST_LR), relu's
    # stays at 1e-2: each is tested there, on both seeds, after its group's last unit
    assert feed.tested == {("activation.kind=gelu,measure.training.lr=0.1", 0),
                           ("activation.kind=gelu,measure.training.lr=0.1", 1),
                           ("activation.kind=relu,measure.training.lr=0.01", 0),
                           ("activation.kind=relu,measure.training.lr=0.01", 1)}
    tests = [i for i, (_, probe) in enumerate(started) if probe == TEST]
    gelu_last = max(i for i, (n, p) in enumerate(started)
                    if p == "training" and "relu" not in n)
    assert len(tests) == 4 and min(tests) > gelu_last
    rows = vl.results(run_dir_for(e, tmp_path / "runs"))
    test = rows[rows["metric"] == "test_loss"]
    assert set(test["variant"]) == {"activation.kind=gelu,measure.training.lr=0.1",
                                    "activation.kind=relu,measure.training.lr=0.01"}
    assert all(math.isfinite(v) for v in test["value"])


def test_only_on_part_of_a_group_says_its_test_waits_and_the_full_run_scores_it(tmp_path):
    from conftest import invoke

    path = tmp_path / "deferred.yaml"
    path.write_text(SWEEP)
    out = tmp_path / "runs"
    part = invoke("run", path, "--out", out, "--no-report", "--only", "measure.training.lr=0.001")
    assert part.exit_code == 0, part.output
    assert "note: --only: 1 variant(s) (measure.training.lr=0.001) belong to tuned groups " \
           "with settings not stored yet" in part.output
    assert not any(m == "test_loss" for (_, _, m) in scores(out / "deferred"))
    full = invoke("run", path, "--out", out, "--no-report")
    assert full.exit_code == 0 and "note: --only" not in full.output, full.output
    tested = {v for (v, _, m) in scores(out / "deferred") if m == "test_loss"}
    assert tested == chosen_of(out / "deferred") and len(tested) == 2
    again = invoke("run", path, "--out", out, "--no-report", "--only", "measure.training.lr=0.001")
    assert again.exit_code == 0 and "note: --only" not in again.output, again.output


def recall_inside_loss_at_edge(name, spec, settings, *, seed, data=None, **kw):
    """A training run whose validation recall peaks at lr 1e-2 and whose validation loss is
    lowest at 0.1, its test split scored as ``settings.test_split`` says."""
    from variantlab.plugin.rows import row

    gap = {best: (math.log10(settings.lr) - math.log10(best)) ** 2 for best in (1e-2, 0.1)}
    rows = [row(name, "loss", 4.0, step=0), row(name, "diverged", 0.0),
            row(name, "val_loss", 2.0 + gap[0.1] + 0.01 * seed),
            row(name, "eval_loss", 2.0 + gap[0.1] + 0.01 * seed),
            row(name, "val_recall_accuracy", 1.0 - 0.2 * gap[1e-2] - 0.01 * seed),
            row(name, "test_loss", 2.1 + gap[0.1]),
            row(name, "test_recall_accuracy", 1.0 - 0.2 * gap[1e-2] - 0.02 * seed)]
    return as_split(rows, settings)


def test_the_feed_chooses_on_compare_on_before_any_test_split_is_scored(tmp_path):
    """Until a group's choice is tested, the store holds no test rows; the feed's choice,
    and the extension that follows it, is on the validation recall (compare_on) even so,
    not on the loss, which would put the best at the edge 0.1 and extend it to 1.0."""
    e = fake_experiment(tmp_path, "  activation.kind: [gelu, relu]\n"
                                  "  measure.training.lr: {values: [1.0e-3, 1.0e-2, 0.1], "
                                  "extend: true}\n",
                        head="compare_on: recall_accuracy\n"
                             "data: {source: synthetic, task: recall, n_pairs: 2}\n")
    feed = EdgeFeed(e, run_dir_for(e, tmp_path / "runs"), e.extensions(), defer=True)
    summary = run_experiment(e, tmp_path / "runs", probe_fn=recall_inside_loss_at_edge,
                             grow=feed)
    assert summary.ok and feed.rounds == []
    assert feed.tested == {(f"{kind}measure.training.lr=0.01", seed)
                           for kind in ("", "activation.kind=relu,") for seed in (0, 1)}
    assert chosen_of(run_dir_for(e, tmp_path / "runs")) == {
        "measure.training.lr=0.01", "activation.kind=relu,measure.training.lr=0.01"}
    # a rerun starts with no test unit in its plan: the same choices, nothing computed again
    again = EdgeFeed(e, run_dir_for(e, tmp_path / "runs"), e.extensions(), defer=True)
    rerun = run_experiment(e, tmp_path / "runs", probe_fn=recall_inside_loss_at_edge,
                           grow=again)
    assert rerun.ok and rerun.done == 0 and again.rounds == [] and again.tested == feed.tested


def test_the_grid_averages_of_a_deferred_recall_sweep_are_on_its_validation_recall(tmp_path):
    """The test split is scored at the chosen settings only, so the grid's averages over
    every setting are on the headline metric's validation column (val_recall_accuracy
    here), which every setting has: not on the loss, whose best rate is another one."""
    import pandas as pd

    from variantlab.report import write_report

    e = fake_experiment(tmp_path, "  activation.kind: [gelu, relu]\n"
                                  "  measure.training.lr: [1.0e-3, 1.0e-2, 0.1]\n",
                        head="compare_on: recall_accuracy\n"
                             "data: {source: synthetic, task: recall, n_pairs: 2}\n")
    feed = EdgeFeed(e, run_dir_for(e, tmp_path / "runs"), e.extensions(), defer=True)
    assert run_experiment(e, tmp_path / "runs", probe_fn=recall_inside_loss_at_edge,
                          grow=feed).ok
    files = write_report([run_dir_for(e, tmp_path / "runs")], tmp_path / "rep",
                         registry=vl.get_registry())
    verdicts = pd.read_csv(files.verdicts)
    average = verdicts[verdicts["kind"] == "average"].set_index("a")
    assert set(average["metric"]) == {"val_recall_accuracy"}
    # validation recall 1 - 0.2 (log10 lr + 2)^2 - 0.01 seed: lr 1e-2 against the baseline
    # 1e-3 gains 0.2 on every seed, lr 0.1 nothing; the activation moves nothing
    lr = average.loc["measure.training.lr=0.01"]
    assert lr["estimate"] == pytest.approx(0.2, abs=1e-9) and lr["verdict"] == "higher"
    assert average.loc["measure.training.lr=0.1", "estimate"] == pytest.approx(0.0, abs=1e-9)
    assert average.loc["activation.kind=relu", "estimate"] == pytest.approx(0.0, abs=1e-9)
    assert "| val\\_recall\\_accuracy | measure.training.lr | 0.01 vs 0.001 | +0.2 |" in \
        files.markdown.read_text()


class KilledBeforeTheFeedAnswers:
    """A feed whose first question is met by Ctrl-C: a resumed run killed before its feed
    re-added what it added before."""

    defer = True

    def __call__(self, unit):
        raise KeyboardInterrupt


def _tables(run_dir) -> tuple[list[str], set[tuple]]:
    import sqlite3

    with sqlite3.connect(run_dir / "results.sqlite") as db:
        names = [n for (n,) in db.execute("SELECT name FROM variants ORDER BY position")]
        plan = set(db.execute("SELECT key, variant, seed, probe FROM plan"))
    return names, plan


def test_a_resume_killed_before_its_feed_answers_leaves_the_extensions_reported(tmp_path):
    """A resume writes the YAML's variants first; its feed re-adds the extensions and test
    units. Killed in between, the store still plans them (the report reads what it did
    before), and a resume that runs writes the exact tables again."""
    from variantlab.report import write_report

    grid = ("  activation.kind: [gelu, relu]\n"
            "  measure.training.lr: {values: [1.0e-3, 1.0e-2], extend: true}\n")
    e = fake_experiment(tmp_path, grid)
    out, run_dir = tmp_path / "runs", run_dir_for(e, tmp_path / "runs")
    feed = EdgeFeed(e, run_dir, e.extensions(), defer=True)
    assert run_experiment(e, out, probe_fn=only_tested, grow=feed).ok
    names, plan = _tables(run_dir)
    assert "activation.kind=gelu,measure.training.lr=0.1" in names  # the extension
    before = write_report([run_dir], tmp_path / "before", registry=vl.get_registry())

    killed = run_experiment(e, out, probe_fn=only_tested, grow=KilledBeforeTheFeedAnswers())
    assert killed.interrupted and killed.done == 0
    assert _tables(run_dir) == (names, plan)  # nothing the feed added is dropped
    after = write_report([run_dir], tmp_path / "after", registry=vl.get_registry())
    assert after.tuned.read_text() == before.tuned.read_text()
    assert after.verdicts.read_text() == before.verdicts.read_text()

    again = EdgeFeed(e, run_dir, e.extensions(), defer=True)
    resumed = run_experiment(e, out, probe_fn=only_tested, grow=again)
    assert resumed.ok and resumed.done == 0
    now, now_plan = _tables(run_dir)  # the feed re-added the extensions (in its own order)
    assert sorted(now) == sorted(names) and now_plan == plan

    # the exact tables, not a union, once the feed has answered: a variant dropped from
    # the YAML leaves them (its units stay stored)
    fewer = fake_experiment(tmp_path, "  activation.kind: [gelu]\n"
                                      "  measure.training.lr: {values: [1.0e-3, 1.0e-2], "
                                      "extend: true}\n")
    assert run_experiment(fewer, out, probe_fn=only_tested,
                          grow=EdgeFeed(fewer, run_dir, fewer.extensions(), defer=True)).ok
    left, left_plan = _tables(run_dir)
    assert left == [n for n in names if "relu" not in n] and left
    assert {p[1] for p in left_plan} == set(left)
