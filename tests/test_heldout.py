"""Held-out scoring (issue 28.1, 28.4): one fixed set of windows per held-out split for every
seed and variant, val_tokens/test_tokens, eval_tokens, held-out fractions sized for scoring,
curves every eval_every steps, still_improving and steps_to_solve."""

import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import variantlab as vl
from variantlab.data import cache as cachelib
from variantlab.data import sources as datalib
from variantlab.data.heldout import SYNTHETIC_SEEDS, held_out_set
from variantlab.data.sources import SyntheticData, TextData
from variantlab.data.splits import held_count, shortfalls, split_tokens
from variantlab.model.build import resolve_spec
from variantlab.model.tasks import Batch, task_for
from variantlab.probes import heldout, training
from variantlab.probes.heldout import HeldOut, Scores, final_rows, still_improving
from variantlab.probes.training import TrainingSettings

REG = vl.get_registry()


@pytest.fixture(autouse=True)
def _own_cache(own_token_cache):
    """Each test tokenises into its own cache (conftest.own_token_cache)."""


@pytest.fixture
def spec(tiny):
    return resolve_spec({**tiny, "vocab_size": 256}, REG)


def corpus(folder, n=40, size=300):
    """``n`` files of ``size`` bytes each, document i made of bytes 40 + i and 41 + i."""
    folder.mkdir(exist_ok=True)
    for i in range(n):
        (folder / f"d{i:02d}.txt").write_text((chr(40 + i) + chr(41 + i)) * (size // 2))
    return TextData(path="docs/*.txt", tokenizer="bytes")


def model_rows(rows):
    return {r["metric"]: r["value"] for r in rows if r["step"] is None}


# -- the windows: fixed, contiguous, the same for every seed and variant --------------------
def test_corpus_windows_are_the_split_in_order_for_every_seed_and_variant(tmp_path, spec):
    data = corpus(tmp_path / "docs")
    val = datalib.corpus_splits(data, tmp_path)[0].val
    settings = TrainingSettings(steps=2, batch_size=4, seq_len=16, device="cpu")
    got = HeldOut(data, spec, settings, tmp_path, REG).batches("val")
    rows = torch.cat([b.inputs["idx"] for b in got])  # (n, 16)
    targets = torch.cat([b.target for b in got])
    n = len(val) // 17  # non-overlapping windows of seq_len + 1, the tail left out
    want = torch.from_numpy(np.asarray(val[:n * 17], dtype=np.int64)).view(n, 17)
    assert torch.equal(rows, want[:, :16]) and torch.equal(targets, want[:, 1:])
    other = resolve_spec({**spec.to_data(), "activation": {"kind": "relu"}}, REG)
    again = HeldOut(data, other, settings, tmp_path, REG).batches("val")
    assert all(torch.equal(a.inputs["idx"], b.inputs["idx"]) for a, b in zip(got, again))
    # two seeds of a run score exactly those windows
    for seed in (0, 1):
        m = model_rows(training.run(spec, settings, seed=seed, data=data, base_dir=tmp_path,
                                    registry=REG))
        assert m["val_tokens"] == n * 16
        assert m["test_tokens"] == (len(datalib.corpus_splits(data, tmp_path)[0].test)
                                    // 17) * 16


def test_eval_tokens_and_eval_batches_cap_the_windows(tmp_path, spec):
    data = corpus(tmp_path / "docs")
    capped = TrainingSettings(steps=2, batch_size=4, seq_len=16, eval_tokens=50)
    got = HeldOut(data, spec, capped, tmp_path, REG).batches("test")
    assert sum(b.target.numel() for b in got) == 48  # 50 // 16 = 3 windows
    old = TrainingSettings(steps=2, batch_size=4, seq_len=16, eval_batches=1)
    assert sum(b.target.shape[0] for b in HeldOut(data, spec, old, tmp_path, REG)
               .batches("test")) == 4  # one batch of batch_size windows
    every = HeldOut(data, spec, TrainingSettings(seq_len=16), tmp_path, REG).batches("test")
    n = every[0].target.shape[0]  # all windows, one scoring batch
    spread = [0, n // 3, 2 * n // 3]  # 3 windows spread evenly over the split
    assert torch.equal(got[0].inputs["idx"], every[0].inputs["idx"][spread])


def test_synthetic_sets_have_their_own_seeds(spec):
    data = SyntheticData(task="recall", n_pairs=3)
    settings = TrainingSettings(batch_size=4, seq_len=16, eval_tokens=160)
    held = HeldOut(data, spec, settings, ".", REG)
    val, test = held.batches("val"), held.batches("test")
    (want,) = datalib.batches(data, spec, 10, 16, 1, seed=SYNTHETIC_SEEDS["val"], registry=REG)
    assert torch.equal(torch.cat([b.inputs["idx"] for b in val]), want.inputs["idx"])
    assert torch.equal(torch.cat([b.extra["recall_mask"] for b in val]),
                       want.extra["recall_mask"])
    assert not torch.equal(val[0].inputs["idx"], test[0].inputs["idx"])
    runs = [model_rows(training.run(spec, TrainingSettings(steps=1, batch_size=4, seq_len=16,
                                                           eval_tokens=160),
                                    seed=seed, data=data, registry=REG)) for seed in (0, 1)]
    assert runs[0]["val_tokens"] == runs[1]["val_tokens"] == 160


def test_the_score_weights_each_batch_by_its_targets(spec):
    """Batches of 3 and 1 rows, one target ignored: the mean over every scored target."""
    torch.manual_seed(0)
    model = vl.build_model(spec, REG).eval()
    idx = torch.randint(0, 256, (4, 8))
    target = torch.randint(0, 256, (4, 8))
    target[3, 5] = -100
    parts = [Batch({"idx": idx[:3]}, target[:3]), Batch({"idx": idx[3:]}, target[3:])]
    with torch.no_grad():
        logits = model(idx)  # (4, 8, 256)
    want = F.cross_entropy(logits.flatten(0, 1), target.flatten(), ignore_index=-100)
    got = heldout.evaluate(model, lambda out, b: F.cross_entropy(out.flatten(0, 1),
                                                                 b.target.flatten()),
                           parts, torch.device("cpu"))
    assert got.loss == pytest.approx(float(want), rel=1e-6) and got.tokens == 31
    assert got.recall is None


# -- held-out fractions sized for scoring ----------------------------------------------------
def test_unset_fractions_grow_until_the_split_has_enough(tmp_path):
    sizes = np.array([500] * 1000)  # 1,000 documents of 500 tokens
    assert held_count(sizes, 1000, None) == 132  # 50 (5%) -> 132: 66,000 >= 65,536 tokens
    assert held_count(sizes, 1000, 0.05) == 50  # a fraction given is taken as it is
    assert held_count(np.array([100_000] * 400), 400, None) == 20  # 5% already enough
    assert held_count(np.array([10] * 100), 100, None) == 15  # at most 15%
    ids = np.arange(40 * 50, dtype=np.uint16) % 200
    tokens = cachelib.Tokens(ids, np.arange(0, 40 * 50 + 1, 50), "k")
    parts = split_tokens(tokens, None, None)
    assert (len(parts.documents["val"]), len(parts.documents["test"])) == (6, 6)
    lines = shortfalls(parts, "the corpus")
    assert lines[0].startswith("the validation split of the corpus has 6 documents and 300 "
                               "tokens, fewer than the 10 documents and 65,536 tokens")
    assert "test split" in lines[1] and len(lines) == 2


def test_held_out_sizes_stop_exactly_at_each_bound():
    # the documents bound: 5 documents of 10,000 tokens (5%) hold 50,000 tokens; the
    # tokens bound is met at 7, the documents bound only at 10
    assert held_count(np.array([10_000] * 100), 100, None) == 10
    # the tokens bound, met exactly: 64 documents of 1,024 tokens are 65,536 tokens
    assert held_count(np.array([1_024] * 1000), 1000, None) == 64
    # by position: 5% of the corpus, raised to 65,536 tokens, at most 15%
    from variantlab.data.splits import held_positions
    assert held_positions(1_000_000, None) == 65_536  # 5% = 50,000 is raised
    assert held_positions(2_000_000, None) == 100_000  # 5% is enough
    assert held_positions(200_000, None) == 30_000  # 65,536 would pass the 15% cap
    assert held_positions(1_000, 0.1) == 100  # a fraction given is taken as it is


def test_a_shortfall_is_named_exactly_at_the_bounds_for_each_split():
    from variantlab.data.splits import HELD_DOCUMENTS, HELD_TOKENS, Splits

    def docs(n_docs: int, n_tokens: int) -> tuple[np.ndarray, list[int]]:
        return np.zeros(n_tokens, dtype=np.uint16), list(range(n_docs))

    def by_documents(val: tuple, test: tuple) -> Splits:
        (v, vd), (t, td) = docs(*val), docs(*test)
        return Splits(np.zeros(1, np.uint16), v, t, "documents",
                      {"train": [0], "val": vd, "test": td})

    enough, more = (HELD_DOCUMENTS, HELD_TOKENS), (HELD_DOCUMENTS + 1, HELD_TOKENS + 1)
    assert shortfalls(by_documents(enough, enough), "c") == []
    assert shortfalls(by_documents(more, more), "c") == []  # more than enough is enough
    # the validation split has enough, the test split one document or one token short
    for short in ((HELD_DOCUMENTS - 1, HELD_TOKENS), (HELD_DOCUMENTS, HELD_TOKENS - 1)):
        lines = shortfalls(by_documents(enough, short), "c")
        assert len(lines) == 1 and lines[0].startswith(
            f"the test split of c has {short[0]} documents and {short[1]:,} tokens"), lines
    assert [ln.split(" split")[0] for ln in shortfalls(
        by_documents((HELD_DOCUMENTS - 1, HELD_TOKENS), enough), "c")] == ["the validation"]
    # split by position: tokens only
    def by_positions(n_val: int, n_test: int) -> Splits:
        return Splits(np.zeros(1, np.uint16), np.zeros(n_val, np.uint16),
                      np.zeros(n_test, np.uint16), "positions", {})

    assert shortfalls(by_positions(HELD_TOKENS, HELD_TOKENS), "c") == []
    assert shortfalls(by_positions(HELD_TOKENS + 1, HELD_TOKENS + 1), "c") == []
    lines = shortfalls(by_positions(HELD_TOKENS, HELD_TOKENS - 1), "c")
    assert lines == [f"the test split of c has {HELD_TOKENS - 1:,} tokens (split by position), "
                     f"fewer than the {HELD_DOCUMENTS} documents and {HELD_TOKENS:,} tokens "
                     "held-out scoring asks for, so its losses are noisier; use a larger "
                     "corpus or a larger test_fraction"]


def test_a_small_corpus_is_warned_about_with_its_numbers(tmp_path):
    from variantlab.config.experiment import experiment_from_text
    from variantlab.sweep.preflight import data_problems

    corpus(tmp_path / "docs")
    text = ("name: w\nmodel: {family: gpt, vocab_size: 256, context_length: 32, emb_dim: 32, "
            "n_heads: 4, n_layers: 2}\ndata: {source: text, path: 'docs/*.txt', tokenizer: "
            "bytes}\nmeasure:\n  training: {steps: 1, batch_size: 2, seq_len: 16}\n")
    path = tmp_path / "w.yaml"
    path.write_text(text)
    exp = experiment_from_text(text, path)
    errors, warns = data_problems(exp, exp.doc)
    assert not errors
    assert any("validation split of data.path 'docs/*.txt' has 6 documents and 1,806 tokens"
               in w for w in warns)


# -- curves, still_improving, steps_to_solve -------------------------------------------------
def test_eval_every_records_curves_without_changing_training(tiny):
    data = SyntheticData(task="recall", n_pairs=3)
    base = {"steps": 6, "lr": 3e-3, "batch_size": 4, "seq_len": 16, "device": "cpu",
            "eval_tokens": 128}
    spec = resolve_spec(tiny, REG)
    plain = training.run(spec, TrainingSettings(**base), seed=0, data=data, registry=REG)
    every = training.run(spec, TrainingSettings(**base, eval_every=4), seed=0, data=data,
                         registry=REG)
    loss = [[r["value"] for r in rows if r["metric"] == "loss"] for rows in (plain, every)]
    assert loss[0] == loss[1]  # scoring in eval mode leaves the run alone
    curve = {r["step"]: r["value"] for r in every if r["metric"] == "val_loss_curve"}
    assert sorted(curve) == [4, 6]  # every 4th step, and the end
    assert curve[6] == model_rows(every)["val_loss"] == model_rows(plain)["val_loss"]
    acc = {r["step"] for r in every if r["metric"] == "val_recall_accuracy_curve"}
    assert acc == {4, 6}
    assert not [r for r in plain if r["metric"].endswith("_curve")]
    m = model_rows(every)
    assert m["recall_accuracy"] == m["test_recall_accuracy"]
    assert {"val_recall_accuracy", "still_improving"} <= set(m)


def test_steps_to_solve_is_the_first_evaluation_at_the_threshold():
    s = [Scores(2.0, 10, 0.5), Scores(1.0, 10, 0.99), Scores(0.5, 10, 1.0)]
    rows = final_rows("training", s[2], [(10, s[0]), (20, s[1]), (30, s[2])], 30)
    got = {r["metric"]: r["value"] for r in rows if r["step"] is None}
    assert got["steps_to_solve"] == 20.0
    never = final_rows("training", s[0], [(10, s[0])], 15)  # the end at 15 counts
    assert "steps_to_solve" not in {r["metric"] for r in never}
    assert [r["step"] for r in never if r["metric"] == "val_loss_curve"] == [10, 15]
    late = final_rows("training", s[1], [], 40)  # no curve: the final evaluation
    assert {r["metric"]: r["value"] for r in late}["steps_to_solve"] == 40.0


def noisy(values, sd, seed=0):
    gen = np.random.default_rng(seed)
    return [float(v + gen.normal(0, sd)) for v in values]


def test_still_improving_on_constructed_curves():
    steps = np.arange(200)
    # a falling line, 0.2 over the last 40 steps, noise sd 0.05 per step: still improving
    assert still_improving(noisy(3.0 - 0.005 * steps, 0.05))
    # flat at the end (exponential approach, time constant 10 steps), same noise: converged
    assert not still_improving(noisy(2.0 + np.exp(-steps / 10), 0.05))
    # flat noise: the rule fires about 2% of the time, so rarely over seeds
    assert sum(still_improving(noisy(np.full(200, 2.0), 0.05, seed=s)) for s in range(50)) <= 3
    # a fall smaller than the noise's standard error is not evidence (SE here ~0.017)
    assert not still_improving(noisy(3.0 - 0.0001 * steps, 0.05, seed=1))
    # rising, too short, or non-finite: no
    assert not still_improving(noisy(2.0 + 0.005 * steps, 0.05))
    assert not still_improving([3.0, 2.0, 1.0, 0.5])
    assert not still_improving([*noisy(3.0 - 0.005 * steps, 0.01)[:-1], math.nan])
    # noiseless and falling: yes; noiseless and flat: no
    assert still_improving(list(3.0 - 0.001 * steps))
    assert not still_improving([1.0] * 50)


def test_loss_on_answers_takes_the_cross_entropy_over_the_answers_only(spec):
    data = SyntheticData(task="recall", n_pairs=3, seq_len=12, loss_on="answers")
    (b,) = datalib.batches(data, spec, 2, 12, 1, seed=5, registry=REG)
    (plain,) = datalib.batches(data.model_copy(update={"loss_on": "all"}), spec, 2, 12, 1,
                               seed=5, registry=REG)
    assert torch.equal(b.inputs["idx"], plain.inputs["idx"])
    torch.manual_seed(0)
    model = vl.build_model(spec, REG).eval()
    with torch.no_grad():
        logits = model(b.inputs["idx"]).double()  # (2, 12, 256)
    # by hand: 3 pairs fill positions 0-5, then key/value queries; the input at positions
    # 6, 8, 10 is a queried key and the target there its value
    terms = []
    for r in range(2):
        for t in (6, 8, 10):
            row = logits[r, t]
            value = int(plain.target[r, t])
            terms.append(math.log(sum(math.exp(x) for x in row.tolist())) - float(row[value]))
    want = sum(terms) / len(terms)
    task = task_for(spec, REG)
    assert float(task.loss(spec, logits, b)) == pytest.approx(want, rel=1e-9)
    assert int((b.target != -100).sum()) == 6
    assert float(task.loss(spec, logits, plain)) != pytest.approx(want, rel=1e-3)
    assert SyntheticData(task="recall").model_dump() == {"source": "synthetic", "task": "recall"}
    with pytest.raises(ValueError, match="needs task: recall"):
        SyntheticData(loss_on="answers")


def test_held_out_set_of_a_too_short_split_says_which(tmp_path, spec):
    (tmp_path / "t.txt").write_text("ab" * 120)  # one document: split by position
    with pytest.raises(datalib.DataError, match="the validation split .* one window"):
        held_out_set(TextData(path="t.txt", tokenizer="bytes", val_fraction=0.05), spec, 2, 32,
                     "val", max_tokens=None, registry=REG, base_dir=tmp_path)


@pytest.mark.parametrize("change", [
    ("training: {steps: 1,", "training: {steps: 1, eval_tokens: 1024,"),
    ("training: {steps: 1,", "training: {steps: 1, eval_every: 5,"),
    ("task: recall}", "task: recall, loss_on: answers}"),
])
def test_what_changes_a_held_out_number_changes_the_unit_key(change):
    from variantlab.config.experiment import experiment_from_text
    from variantlab.sweep.units import plan_units

    text = ("name: k\nmodel: {family: gpt, vocab_size: 64, context_length: 32, emb_dim: 32, "
            "n_heads: 4, n_layers: 2}\ndata: {source: synthetic, task: recall}\n"
            "measure:\n  training: {steps: 1, seq_len: 16}\n")
    before = plan_units(experiment_from_text(text))
    after = plan_units(experiment_from_text(text.replace(*change)))
    assert before[0].key != after[0].key


@pytest.mark.slow
def test_fixed_windows_shrink_the_seed_spread_of_test_loss(monkeypatch):
    """benchmarks/heldout_spread.py at 4 seeds: the sd over seeds of test loss over the fixed
    windows is well below that over each seed's own random windows (measured at 6 seeds:
    0.034 vs 0.068; benchmarks/RESULTS.md)."""
    import importlib.util
    import sys
    from pathlib import Path

    path = Path(__file__).resolve().parent.parent / "benchmarks" / "heldout_spread.py"
    module_spec = importlib.util.spec_from_file_location("heldout_spread", path)
    bench = importlib.util.module_from_spec(module_spec)
    monkeypatch.setitem(sys.modules, "heldout_spread", bench)  # its dataclass looks itself up
    module_spec.loader.exec_module(bench)
    got = bench.measure([0, 1, 2, 3], steps=60)
    print(f"sd over seeds: random windows {got.sd('random'):.4f}, fixed {got.sd('fixed'):.4f}")
    assert got.fixed_tokens == 65_536
    assert got.sd("fixed") < 0.75 * got.sd("random")


def test_the_training_report_draws_the_validation_curves():
    from dataclasses import replace

    import pandas as pd

    from variantlab.report.builtin.training import val_curve_plot
    from variantlab.report.frame import gather
    from variantlab.testing.sample import sample_run

    data = gather([sample_run()])
    assert val_curve_plot(data) is None  # no run recorded a curve
    curve = data.rows[(data.rows.metric == "loss") & data.rows.step.isin([4, 9])].copy()
    curve["metric"] = "val_loss_curve"
    plot = val_curve_plot(replace(data, rows=pd.concat([data.rows, curve])))
    assert plot is not None and plot.title == "Validation loss during training"
    lines = {line.get_label(): line for line in plot.figure.axes[0].get_lines()}
    assert list(lines) == ["pre_norm", "post_norm", "batch"]
    # sample losses 4.2 - 0.1 x step x (1 - 0.1 i) + 0.01 x seed, mean over seeds 0 and 1
    for name, i in (("pre_norm", 0), ("post_norm", 1)):
        assert list(lines[name].get_xdata()) == [4, 9]
        assert list(lines[name].get_ydata()) == pytest.approx(
            [4.2 - 0.1 * step * (1 - 0.1 * i) + 0.005 for step in (4, 9)])


# -- cheaper scoring (issue 39, item 3) -------------------------------------------------------
def old_eval_rows(spec, batch_size, seq_len):
    """The grouping before issue 39: at most 8,192 tokens and 2^22 logits per batch."""
    per_row = seq_len * spec.vocab_size
    return max(batch_size, min(8192 // seq_len, 2 ** 22 // per_row))


@pytest.mark.parametrize("kind", ["corpus", "recall"])
def test_final_scores_equal_the_old_grouping_on_the_same_windows(tmp_path, spec, kind):
    from variantlab.data.heldout import in_parts, joined

    data = corpus(tmp_path / "docs", n=80, size=2000) if kind == "corpus" else \
        SyntheticData(task="recall", n_pairs=3)
    settings = TrainingSettings(steps=2, batch_size=4, seq_len=16, device="cpu",
                                eval_tokens=32768)
    held = HeldOut(data, spec, settings, tmp_path, REG)
    torch.manual_seed(0)
    model = vl.build_model(spec, REG)
    loss = training.Objective(task_for(spec, REG), spec)
    dev = torch.device("cpu")
    for split in ("val", "test"):
        new = held.batches(split)
        old = in_parts(joined(new), old_eval_rows(spec, 4, 16))
        assert len(new) < len(old)  # larger batches now: fewer of them
        assert torch.equal(joined(new).inputs["idx"], joined(old).inputs["idx"])
        assert torch.equal(joined(new).target, joined(old).target)  # the same windows
        got = held.score(split, model, loss, dev)
        want = heldout.evaluate(model, loss, old, dev)
        assert got.tokens == want.tokens > 0
        assert got.loss == pytest.approx(want.loss, rel=1e-6, abs=1e-6)
        assert got.recall == want.recall  # counts: exact
        assert (got.recall is None) == (kind == "corpus")


def test_each_set_is_made_and_moved_once_per_unit(tmp_path, spec, monkeypatch):
    data = corpus(tmp_path / "docs", n=60, size=600)
    made = []
    original = heldout.held_out_set
    monkeypatch.setattr(heldout, "held_out_set",
                        lambda *a, **kw: made.append(a[4]) or original(*a, **kw))
    settings = TrainingSettings(steps=8, batch_size=4, seq_len=16, device="cpu", eval_every=2,
                                lr=3e-3)
    rows = training.run(spec, settings, seed=0, data=data, base_dir=tmp_path, registry=REG)
    assert sorted(made) == ["test", "val"]  # once per split, not once per curve point
    curve = [r for r in rows if r["metric"] == "val_loss_curve"]
    assert [r["step"] for r in curve] == [2, 4, 6, 8]
    held = HeldOut(data, spec, settings, tmp_path, REG)
    cpu = torch.device("cpu")
    first = held.ready("val", cpu, curve=True)
    assert held.ready("val", cpu, curve=True) is first  # placed on the device once
    assert held.ready("val", cpu) is held.ready("val", cpu)
    assert len(made) == 3  # the second HeldOut made its validation set once


def test_curve_points_score_a_stated_subset_and_the_last_point_the_whole_set(tmp_path, spec,
                                                                           monkeypatch):
    from variantlab.data import heldout as sets

    data = corpus(tmp_path / "docs", n=60, size=600)
    monkeypatch.setattr(sets, "CURVE_TOKENS", 64)  # 4 windows of 16 targets per curve point
    settings = TrainingSettings(steps=6, batch_size=4, seq_len=16, device="cpu", eval_every=2,
                                lr=3e-3)
    rows = training.run(spec, settings, seed=0, data=data, base_dir=tmp_path, registry=REG)
    m = model_rows(rows)
    assert m["val_curve_tokens"] == 64.0 and m["val_tokens"] > 64
    curve = {r["step"]: r["value"] for r in rows if r["metric"] == "val_loss_curve"}
    assert sorted(curve) == [2, 4, 6]
    assert curve[6] == m["val_loss"]  # the last point: the whole set
    # a point before it is the model's loss on the 4 windows spread over the set
    held = HeldOut(data, spec, settings, tmp_path, REG)
    subset = sets.spread(held.batches("val"))
    whole = sets.joined(held.batches("val")).target
    n = whole.shape[0]
    assert torch.equal(sets.joined(subset).target, whole[torch.arange(4) * n // 4])
    plain = training.run(spec, TrainingSettings(**{**settings.model_dump(), "eval_every": None}),
                         seed=0, data=data, base_dir=tmp_path, registry=REG)
    assert model_rows(plain)["val_loss"] == m["val_loss"]  # curves leave the run alone
