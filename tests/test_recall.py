"""Recall accuracy (issue 20.5): the recall mask, exact-match accuracy, data.n_pairs and
data.seq_len as data settings and as grid paths."""

import pytest
import torch

import variantlab as vl
from variantlab.config.experiment import experiment_from_text
from variantlab.data.sources import DataError, SyntheticData, batches, recall_tokens
from variantlab.errors import InputError
from variantlab.probes import run_probe
from variantlab.probes.recall import recall_accuracy
from variantlab.sweep.preflight import data_problems
from variantlab.sweep.units import plan_units

REG = vl.get_registry()
TINY = {"vocab_size": 32, "context_length": 32, "emb_dim": 32, "n_heads": 4, "n_layers": 2}
SPEC = vl.parse_model_spec(TINY, REG)


def test_recall_mask_marks_the_queried_keys():
    data = SyntheticData(task="recall", n_pairs=3, seq_len=12)
    b = batches(data, SPEC, 2, 128, 1, seed=0, registry=REG)[0]
    idx, target, mask = b.inputs["idx"], b.target, b.extra["recall_mask"]
    assert idx.shape == (2, 12) and mask.shape == (2, 12)
    assert mask[0].nonzero().flatten().tolist() == [6, 8, 10]  # 3 pairs = 6 tokens, then q v
    for row in range(2):
        pairs = dict(zip(idx[row, 0:6:2].tolist(), idx[row, 1:6:2].tolist()))
        for i in mask[row].nonzero().flatten().tolist():
            assert idx[row, i].item() < 16 <= target[row, i].item()
            assert pairs[idx[row, i].item()] == target[row, i].item()


class Oracle(torch.nn.Module):
    """Logits that put the answer first where ``right`` is set, else the input token."""

    def __init__(self, batch, right):
        super().__init__()
        self.batch, self.right = batch, right

    def forward(self, idx):
        pick = torch.where(self.right, self.batch.target, idx)  # (B, T)
        return torch.nn.functional.one_hot(pick, 32).float()  # (B, T, V)


def test_recall_accuracy_counts_exact_answers():
    b = batches(SyntheticData(task="recall", n_pairs=3, seq_len=12), SPEC, 2, 12, 1, seed=0,
                registry=REG)[0]
    mask = b.extra["recall_mask"]
    assert recall_accuracy(Oracle(b, torch.ones_like(mask)), [b], torch.device("cpu")) == 1.0
    assert recall_accuracy(Oracle(b, torch.zeros_like(mask)), [b], torch.device("cpu")) == 0.0
    half = mask.clone()
    half[1] = False  # row 0 answered, row 1 echoes the key
    assert recall_accuracy(Oracle(b, half), [b], torch.device("cpu")) == 0.5
    plain = batches(SyntheticData(), SPEC, 2, 12, 1, seed=0, registry=REG)
    assert recall_accuracy(Oracle(b, half), plain, torch.device("cpu")) is None


def test_training_reports_recall_accuracy_on_recall_data_only():
    settings = {"steps": 2, "seq_len": 16, "batch_size": 2, "eval_batches": 1}
    rows = run_probe("training", TINY, settings, seed=0, registry=REG,
                     data=SyntheticData(task="recall", n_pairs=4))
    acc = [r["value"] for r in rows if r["metric"] == "recall_accuracy"]
    assert len(acc) == 1 and 0.0 <= acc[0] <= 1.0
    rows = run_probe("training", TINY, settings, seed=0, registry=REG, data=SyntheticData())
    assert not [r for r in rows if r["metric"] == "recall_accuracy"]


def test_unset_keys_keep_the_old_data_and_defaults():
    assert SyntheticData(task="recall").model_dump() == {"source": "synthetic", "task": "recall"}
    g = torch.Generator().manual_seed(0)
    old = recall_tokens(2, 17, 32, generator=torch.Generator().manual_seed(0))
    assert torch.equal(recall_tokens(2, 17, 32, generator=g, n_pairs=4), old)  # 17 // 4 = 4
    with pytest.raises(DataError, match="leaving no query"):
        recall_tokens(1, 9, 32, n_pairs=4)
    with pytest.raises(DataError, match="distinct keys"):
        recall_tokens(1, 64, 32, n_pairs=17)


GRID = """
name: mqar
model: {family: gpt, vocab_size: 64, context_length: 64, emb_dim: 32, n_heads: 4, n_layers: 2}
data: {source: synthetic, task: recall}
grid:
  attention.kind: [mha, retention]
  data.n_pairs: [4, 8]
measure: {training: {steps: 2, seq_len: 32, batch_size: 2}}
"""


def test_grid_sweeps_data_settings():
    exp = experiment_from_text(GRID)
    assert [(v.name, v.data.n_pairs) for v in exp.variants] == [
        ("data.n_pairs=4", 4), ("data.n_pairs=8", 8),
        ("attention.kind=retention,data.n_pairs=4", 4),
        ("attention.kind=retention,data.n_pairs=8", 8)]
    assert len({u.key for u in plan_units(exp)}) == 4
    base = experiment_from_text(GRID.replace("  data.n_pairs: [4, 8]\n", ""))
    again = experiment_from_text(GRID.replace("  data.n_pairs: [4, 8]\n", "").replace(
        "task: recall}", "task: recall, n_pairs: 4}"))
    keys = {u.variant.name: u.key for u in plan_units(exp)}
    # the same data written under data: or set by the grid gives the same unit key
    assert keys["data.n_pairs=4"] == plan_units(again)[0].key != plan_units(base)[0].key


@pytest.mark.parametrize("axis, words", [
    ("data.n_pairs: [4, 40]", "grid.data.n_pairs[1]: data.n_pairs=40 needs 40 distinct keys"),
    ("data.n_pair: [4]", "grid.data.n_pair: unknown key 'data.n_pair'"),
    ("data.seq_len: [128]", "grid.data.seq_len[0]: data.seq_len=128 is above context_length"),
    ("data.n_pairs: [0]", "grid.data.n_pairs[0]: data.n_pairs: Input should be greater than 0"),
])
def test_bad_data_axes_are_located(axis, words):
    text = GRID.replace("data.n_pairs: [4, 8]", axis)
    if "40" in axis:
        text = text.replace("task: recall}", "task: recall, seq_len: 60}")
    with pytest.raises(InputError) as err:
        experiment_from_text(text)
    assert words in str(err.value)


def test_preflight_refuses_pairs_that_fill_the_probes_rows():
    exp = experiment_from_text(GRID.replace("[4, 8]", "[4, 16]"))  # 16 pairs: 32 of 33 tokens
    errors, _ = data_problems(exp, exp.doc)
    assert len(errors) == 2 and all("leaving no query" in e and "grid.data.n_pairs" in e
                                    for e in errors)


def test_recall_accuracy_reads_every_recall_batch_after_a_plain_one():
    """A batch without a mask is skipped, not the end of the list: [plain, recall] scores
    the recall batch (3 of its 6 queries right: 0.5)."""
    b = batches(SyntheticData(task="recall", n_pairs=3, seq_len=12), SPEC, 2, 12, 1, seed=0,
                registry=REG)[0]
    plain = batches(SyntheticData(), SPEC, 2, 12, 1, seed=0, registry=REG)[0]
    half = b.extra["recall_mask"].clone()
    half[1] = False
    assert recall_accuracy(Oracle(b, half), [plain, b], torch.device("cpu")) == 0.5


def test_an_answer_above_the_value_is_wrong():
    """recall_hits counts exact matches only: predicting value + 1 (or value - 1 at the top of
    the vocabulary) at every queried key scores 0 of the 6 queries, whatever side it errs on."""
    from variantlab.probes.recall import recall_hits

    b = batches(SyntheticData(task="recall", n_pairs=3, seq_len=12), SPEC, 2, 12, 1, seed=0,
                registry=REG)[0]
    off = torch.where(b.target < 31, b.target + 1, b.target - 1)  # (B, T), never the value
    logits = torch.nn.functional.one_hot(off, 32).float()  # (B, T, V)
    assert recall_hits(logits, b) == (0, 6)
    right = torch.nn.functional.one_hot(b.target, 32).float()
    assert recall_hits(right, b) == (6, 6)
