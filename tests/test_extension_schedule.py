"""Edge extension without waiting (issue 39, item 4): a group's extension unit is scheduled
as soon as that group's grid units are stored, inside the same run, and reaches the values
the round-by-round extension reaches."""

from __future__ import annotations

import pytest
from test_roles import fake_experiment, fake_training

import variantlab as vl
from variantlab.executors.base import Executor, RunContext
from variantlab.executors.inprocess import run_in_process
from variantlab.executors.runner import run_dir_for, run_experiment
from variantlab.report.fair.extension import EdgeFeed, run_extended

GRID = ("  activation.kind: [gelu, relu]\n"
        "  measure.training.lr: {values: [1.0e-3, 1.0e-2], extend: true}\n")


def growing_run(tmp_path, executor=None, order=None):
    e = fake_experiment(tmp_path, GRID)
    started = []
    feed = EdgeFeed(e, run_dir_for(e, tmp_path / "runs"), e.extensions())
    summary = run_experiment(e, tmp_path / "runs", probe_fn=fake_training, grow=feed,
                             executor=executor,
                             progress=lambda ev: ev.kind == "start" and started.append(
                                 (ev.unit.variant.name, ev.unit.seed)))
    return e, feed, summary, started


def test_a_groups_extension_runs_as_soon_as_its_grid_is_stored(tmp_path):
    _, feed, summary, started = growing_run(tmp_path)
    assert summary.ok and summary.done == summary.total == 8 + 3 * 2
    names = [n for n, _ in started]
    # the grid runs variant by variant (gelu's two rates, then relu's), two seeds each;
    # gelu's first extension (0.1) starts right after gelu's last grid unit, before relu's
    assert names[:4] == ["measure.training.lr=0.001"] * 2 + ["measure.training.lr=0.01"] * 2
    assert names[4:6] == ["activation.kind=gelu,measure.training.lr=0.1"] * 2
    # 0.1 is best and at the edge again: 1.0 comes next, still before relu's grid
    assert names[6:8] == ["activation.kind=gelu,measure.training.lr=1.0"] * 2
    assert names[8:12] == ["activation.kind=relu,measure.training.lr=0.001"] * 2 + \
        ["activation.kind=relu,measure.training.lr=0.01"] * 2
    assert names[12:] == ["activation.kind=relu,measure.training.lr=0.1"] * 2
    assert [[(a.group, a.value) for a in r] for r in feed.rounds] == \
        [[("activation=gelu", 0.1)], [("activation=gelu", 1.0)], [("activation=relu", 0.1)]]


def test_the_growing_run_stores_what_the_round_by_round_run_stores(tmp_path):
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    _, _, summary, _ = growing_run(tmp_path / "a")
    e = fake_experiment(tmp_path / "b", GRID)
    done = run_extended(e, lambda x: run_experiment(x, tmp_path / "b" / "runs",
                                                    probe_fn=fake_training), e.extensions())
    assert sum(s.done for s in done.summaries) == summary.done
    a = vl.results(tmp_path / "a" / "runs" / "roles")
    b = vl.results(tmp_path / "b" / "runs" / "roles")
    cols = ["variant", "seed", "metric", "value"]
    key = ["variant", "seed", "metric"]
    assert a[cols].sort_values(key).reset_index(drop=True).equals(
        b[cols].sort_values(key).reset_index(drop=True))
    # a rerun adds nothing: every extension is stored already, and found at the start
    again = growing_run(tmp_path / "a")[2]
    assert again.done == 0 and again.skipped == again.total == 14


class Recording(Executor):
    """A fake executor that computes in process and records the order it was handed units."""

    feeds = True

    def __init__(self) -> None:
        self.handed: list[str] = []

    def run(self, sink, units, experiment, context: RunContext) -> bool:
        feed = context.feed
        assert feed is not None  # the runner gives a feeding executor the run's feed

        class Spy:
            experiment = feed.experiment

            def __call__(spy, unit):
                new = feed(unit)
                self.handed += [f"after {unit.variant.name if unit else 'start'}: "
                                f"{u.variant.name}/{u.seed}" for _, u in new]
                return new

        return run_in_process(sink, units, experiment, context.probe_fn, context.fail_fast,
                              Spy())


def test_the_feed_hands_each_extension_when_its_group_is_stored(tmp_path):
    executor = Recording()
    _, _, summary, _ = growing_run(tmp_path, executor)
    assert summary.ok
    gelu, relu = "measure.training.lr=0.01", "activation.kind=relu,measure.training.lr=0.01"
    added = "activation.kind={},measure.training.lr={}/{}".format
    assert executor.handed == [
        f"after {gelu}: {added('gelu', 0.1, 0)}", f"after {gelu}: {added('gelu', 0.1, 1)}",
        f"after {added('gelu', 0.1, 1)[:-2]}: {added('gelu', 1.0, 0)}",
        f"after {added('gelu', 0.1, 1)[:-2]}: {added('gelu', 1.0, 1)}",
        f"after {relu}: {added('relu', 0.1, 0)}", f"after {relu}: {added('relu', 0.1, 1)}",
    ]


@pytest.mark.slow
def test_the_pool_runs_the_extension_inside_the_run_with_the_in_process_results(tmp_path):
    (tmp_path / "pool").mkdir()
    (tmp_path / "one").mkdir()
    e = fake_experiment(tmp_path / "pool", GRID)
    feed = EdgeFeed(e, run_dir_for(e, tmp_path / "pool" / "runs"), e.extensions())
    summary = run_experiment(e, tmp_path / "pool" / "runs", probe_fn=fake_training, grow=feed,
                             workers=2)
    assert summary.ok and summary.done == summary.total == 14
    # which group completes first depends on the workers' timing; what is added does not
    assert sorted((a.group, a.value) for r in feed.rounds for a in r) == \
        [("activation=gelu", 0.1), ("activation=gelu", 1.0), ("activation=relu", 0.1)]
    growing_run(tmp_path / "one")
    cols, key = ["variant", "seed", "metric", "value"], ["variant", "seed", "metric"]
    frames = [vl.results(tmp_path / f / "runs" / "roles")[cols].sort_values(key)
              .reset_index(drop=True) for f in ("pool", "one")]
    assert frames[0].equals(frames[1])


def test_a_group_half_stored_by_an_earlier_run_is_extended_when_this_run_completes_it(
        tmp_path, monkeypatch):
    from variantlab.report.fair import extension

    e = fake_experiment(tmp_path, GRID)
    gelu = [v.name for v in e.variants if "relu" not in v.name]
    run_experiment(e, tmp_path / "runs", probe_fn=fake_training, only=gelu[:1])  # half gelu
    reads = []
    original = extension.gather
    monkeypatch.setattr(extension, "gather", lambda runs: reads.append(1) or original(runs))
    _, feed, summary, _ = growing_run(tmp_path)
    assert summary.ok and summary.skipped == 2
    assert [[(a.group, a.value) for a in r] for r in feed.rounds] == \
        [[("activation=gelu", 0.1)], [("activation=gelu", 1.0)], [("activation=relu", 0.1)]]
    # the store is read at the start and each time a group is complete (gelu's grid, its
    # 0.1, its 1.0, relu's grid, its 0.1), not after every unit
    assert len(reads) == 1 + 5 < summary.done == 12


def test_a_read_that_misses_the_last_added_variant_neither_drops_nor_chooses_its_group(tmp_path):
    """The pool's feed decides in a thread of its own while the driver writes what the
    previous decision added to the store's plan: a read made in between finds the store
    without that variant. The feed must keep the variant in its group (its units, once
    stored, make the group complete again) and must not choose the group without it."""
    from variantlab.report.fair.extension import TRAINING
    from variantlab.sweep.units import plan_units

    e = fake_experiment(tmp_path, GRID)
    runs = tmp_path / "runs"
    names = [v.name for v in e.variants]
    gelu, relu = [n for n in names if "relu" not in n], [n for n in names if "relu" in n]
    run_experiment(e, runs, probe_fn=fake_training, only=[*gelu, relu[0]])
    feed = EdgeFeed(e, run_dir_for(e, runs), e.extensions())
    feed(None)  # gelu's grid is stored: its 0.1 is added, and not yet in the store's plan
    assert [(a.group, a.value) for a in feed.rounds[-1]] == [("activation=gelu", 0.1)]
    run_experiment(e, runs, probe_fn=fake_training, only=relu[1:])  # still without it

    def training(experiment, name):
        return [u for u in plan_units(experiment) if u.variant.name == name
                and u.probe == TRAINING]

    for unit in training(e, relu[1]):
        feed(unit)
    assert [(a.group, a.value) for a in feed.rounds[-1]] == [("activation=relu", 0.1)]
    assert not any("relu" not in v for v, _ in feed.tested)  # gelu's 0.1 has not run yet
    added = feed.rounds[0][0].name
    run_experiment(feed.experiment, runs, probe_fn=fake_training, only=[added])
    for unit in training(feed.experiment, added):
        feed(unit)
    # 0.1 is gelu's best and at the edge: 1.0 is added once its units are stored
    assert [(a.group, a.value) for a in feed.rounds[-1]] == [("activation=gelu", 1.0)]
    assert not any("relu" not in v for v, _ in feed.tested)
