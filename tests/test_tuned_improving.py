"""Convergence in the tuned comparison (issue 28.4): tuned.csv and the Tuned comparison
table count the chosen setting's seeds still improving, by the report's judgement, and the
reading names the verdicts' variants that were. A fake training probe; nothing trains."""

from __future__ import annotations

import math

import pandas as pd
import pytest
from conftest import TINY_MODEL

import variantlab as vl
from variantlab.config.experiment import experiment_from_text
from variantlab.executors.runner import run_experiment
from variantlab.plugin.rows import row
from variantlab.report import gather, write_report
from variantlab.report.fair.compare import fair_of

REG = vl.get_registry()
BASE = {"gelu": 2.0, "relu": 2.3, "silu": 2.6}  # validation loss at the best lr, 3e-3
BEST = 3e-3
#: still_improving at the best lr, per seed: gelu 2 of 3, relu none, silu all (third, in
#: no verdict); at the other lrs the opposite of relu's, so only the chosen setting counts
AT_BEST = {"gelu": (1, 1, 0), "relu": (0, 0, 0), "silu": (1, 1, 1)}
STILL = "Still improving at the end of training"


def loss_training(name, spec, settings, *, seed, data=None, **_):
    """A validation loss (log10 lr - log10 3e-3)^2 above its variant's base: every variant
    is best at 3e-3 (inside the sweep), gelu ahead of relu ahead of silu at every lr."""
    kind, lr = spec.activation.kind, settings.lr
    val = BASE[kind] + (math.log10(lr) - math.log10(BEST)) ** 2 + 0.01 * seed
    still = AT_BEST[kind][seed] if lr == BEST else 1 - AT_BEST["relu"][seed]
    return [row(name, "loss", 4.0, step=0), row(name, "diverged", 0.0),
            row(name, "val_loss", val), row(name, "test_loss", val + 0.1),
            row(name, "still_improving", float(still))]


def run(tmp_path, grid: str, probe, head: str = "", seeds: str = "[0, 1, 2]") -> object:
    text = (f"name: conv\nseeds: {seeds}\nmodel: {TINY_MODEL}\n{head}grid:\n{grid}"
            "measure:\n  training: {steps: 10, batch_size: 2, seq_len: 16, eval_every: 4}\n")
    path = tmp_path / "conv.yaml"
    path.write_text(text)
    run_experiment(experiment_from_text(text, path), tmp_path / "runs", probe_fn=probe)
    return tmp_path / "runs" / "conv"


def reading_line(lines: list[str], start: str) -> str:
    found = [line for line in lines if start in line]
    assert len(found) <= 1, found
    return found[0] if found else ""


def test_the_tuned_rows_count_seeds_still_improving_and_the_reading_names_the_verdicts(
        tmp_path):
    store = run(tmp_path, "  activation.kind: [gelu, relu, silu]\n"
                          "  measure.training.lr: [1.0e-3, 3.0e-3, 1.0e-2]\n", loss_training)
    files = write_report([store], tmp_path / "rep", registry=REG)
    tuned = pd.read_csv(files.tuned).set_index("variant")
    assert list(tuned["measure.training.lr"]) == [BEST] * 3
    assert tuned["still_improving"].to_dict() == {"activation=gelu": 2, "activation=relu": 0,
                                                  "activation=silu": 3}
    assert list(tuned["seeds_judged"]) == [3, 3, 3]
    md = files.markdown.read_text()
    head = next(line for line in md.splitlines() if line.startswith("| variant |")
                and "group" in line)
    col = [c.strip() for c in head.strip("|").split("|")].index("still improving")
    cells = {c[0]: c[col] for line in md.splitlines() if line.startswith("| activation=")
             and "| 0/9 |" in line
             for c in [[x.strip() for x in line.strip("|").split("|")]]}
    assert cells == {"activation=gelu": "2/3", "activation=relu": "0/3",
                     "activation=silu": "3/3"}
    # every pair is a verdict: gelu and silu (still improving) are named, relu (stopped)
    # is not
    line = reading_line(md.splitlines(), STILL)
    assert line == (f"- {STILL} (seeds of the chosen setting): activation=gelu: 2 of 3 "
                    "seeds; activation=silu: 3 of 3 seeds; verdicts involving them may change "
                    "with more steps (docs/fair-comparisons.md\\#still-improving).")
    # the headline's leader is not restated beside the pair verdicts that name it
    assert "(the headline metric)" not in md
    assert "activation=gelu lower than activation=relu (-0.3" in md
    # a seed without a still_improving row is unknown, not stopped
    data = gather([store])
    rows = data.rows
    relu = data.variants.loc[data.variants["variant"].str.contains("relu")
                             & data.variants["variant"].str.contains("0.003"), "variant"]
    (relu_best,) = list(relu)
    data.rows = rows[~((rows["variant"] == relu_best) & (rows["seed"] == 2)
                       & (rows["metric"] == "still_improving"))].reset_index(drop=True)
    fair = fair_of(data, REG)
    frame = fair.tuned.set_index("variant")
    assert frame.loc["activation=relu", ["still_improving", "seeds_judged"]].tolist() == [0, 2]
    table = next(t for t in fair.tables if t.title == "Tuned comparison")
    got = {r[0]: r[table.columns.index("still improving")] for r in table.rows}
    assert got["activation=relu"] == "0/2 (1 unknown)"
    line = reading_line(fair.lines, STILL)
    assert line.endswith(" Not known whether still improving (no still_improving row): "
                         "activation=relu: 1 of 3 seeds; verdicts involving them may rest on "
                         "runs that had not converged.")


CHANCE = 1 / 32
RECALL = {"chance_recall_accuracy": CHANCE,
          "recall_noise": math.sqrt(CHANCE * (1 - CHANCE) / 1000)}
CURVES = {"gelu": (0.5, 1.0, 1.0), "relu": (0.3, 0.5, 0.8)}  # at steps 4, 8 and 10


def recall_training(name, spec, settings, *, seed, data=None, **_):
    """A falling training loss (stored still_improving 1 for gelu, 0 for relu) and a
    validation recall curve: gelu solved at 1.00, relu still rising beyond its noise."""
    kind = spec.activation.kind
    curve = CURVES[kind]
    rows = [row(name, "loss", 4.0 - 0.3 * step, step=step) for step in range(10)]
    rows += [row(name, "val_recall_accuracy_curve", acc, unit="fraction", step=at)
             for at, acc in zip((4, 8, 10), curve)]
    return rows + [row(name, "still_improving", 1.0 if kind == "gelu" else 0.0),
                   row(name, "diverged", 0.0), row(name, "val_loss", 1.0),
                   row(name, "test_loss", 1.1), row(name, "val_recall_accuracy", curve[-1]),
                   row(name, "test_recall_accuracy", curve[-1] - 0.01 * seed),
                   *[row(name, k, v) for k, v in RECALL.items()]]


def test_the_tuned_count_is_the_reports_judgement_on_the_headline_curve(tmp_path):
    store = run(tmp_path, "  activation.kind: [gelu, relu]\n"
                          "  measure.training.lr: [1.0e-3, 1.0e-2]\n", recall_training,
                head="compare_on: recall_accuracy\ndata: {source: synthetic, task: recall}\n",
                seeds="[0, 1]")
    stored = vl.results(store)
    stored = stored[stored["metric"] == "still_improving"]
    assert stored.groupby("activation.kind")["value"].mean().to_dict() == {"gelu": 1.0,
                                                                          "relu": 0.0}
    files = write_report([store], tmp_path / "rep", registry=REG)
    tuned = pd.read_csv(files.tuned).set_index("variant")
    assert tuned["chosen_on"].iloc[0] == "val_recall_accuracy"
    # gelu's curve ends at 1.00: not improving, whatever its loss did; relu's rises 0.3
    assert tuned["still_improving"].to_dict() == {"activation=gelu": 0, "activation=relu": 2}
    assert list(tuned["seeds_judged"]) == [2, 2]
    md = files.markdown.read_text()
    assert "activation=relu: 2 of 2 seeds; verdicts involving them may change" in md
    assert "activation=gelu: " not in md.split(STILL, 1)[1].split("\n", 1)[0]


@pytest.mark.parametrize("n, tail", [(4, ""), (6, "; and 2 more")])
def test_the_sentence_names_at_most_four_groups(n, tail):
    from variantlab.report.fair.improving import MAX_NAMED, improving_lines
    from variantlab.report.fair.tuned import Sweep

    groups = [f"g{i}" for i in range(n)]
    frame = pd.DataFrame({"variant": groups, "still_improving": [1.0] * n,
                          "seeds_judged": [2.0] * n})
    per_seed = pd.DataFrame({"seed": [0, 1]})
    sweep = Sweep("r", [], [], {}, pd.DataFrame(), per_seed, "val_loss", "test_loss", "g0",
                  archs=groups)
    (line,) = improving_lines(sweep, frame, set(groups))
    named = "; ".join(f"g{i}: 1 of 2 seeds" for i in range(MAX_NAMED))
    assert f"setting): {named}{tail}; verdicts involving" in line
    assert improving_lines(sweep, frame.assign(still_improving=0.0), set(groups)) == []
    assert improving_lines(sweep, frame, set()) == []
