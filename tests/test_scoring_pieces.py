"""Held-out scoring runs a scoring batch's forward in pieces on CPU (probes/heldout.py): the
same bits as one forward of the whole batch for a model whose rows do not meet, one forward
for a model whose rows do (mixture-of-experts routing, a plugin's ``couples_rows``)."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import variantlab as vl
from variantlab.data.heldout import in_parts
from variantlab.model.build import resolve_spec
from variantlab.model.tasks import task_for
from variantlab.probes import heldout, training

REG = vl.get_registry()
CPU = torch.device("cpu")


def scoring_set(spec, rows=10, seq_len=16, per_batch=10):
    gen = torch.Generator().manual_seed(3)
    whole = task_for(spec, REG).batch(spec, rows, seq_len, generator=gen)
    return in_parts(whole, per_batch)


def counted(model):
    """``model`` with a list that records the rows of each top-level forward."""
    seen: list[int] = []
    model.register_forward_pre_hook(lambda _m, args, kwargs: seen.append(
        (args[0] if args else kwargs["idx"]).shape[0]), with_kwargs=True)
    return model, seen


def whole_batch_scores(model, loss, batches):
    """The scores as one forward per batch gives them (what evaluate did before pieces)."""
    total, tokens = 0.0, 0
    model.eval()
    with torch.no_grad():
        for b in batches:
            n = int((b.target != -100).sum())
            total += float(loss(model(**b.inputs), b)) * n
            tokens += n
    return total / tokens, tokens


@pytest.mark.parametrize("extra", [{}, {"attention": {"kind": "mha", "impl": "sdpa"}},
                                   {"norm": {"kind": "rms"}, "positional": {"kind": "rotary"}}])
def test_pieces_give_the_whole_batch_bits(tiny, monkeypatch, extra):
    monkeypatch.setattr(heldout, "FORWARD_TOKENS", 64)  # 4 rows of 16 positions per forward
    spec = resolve_spec({**tiny, "vocab_size": 256, **extra}, REG)
    torch.manual_seed(0)
    model, seen = counted(vl.build_model(spec, REG))
    loss = training.Objective(task_for(spec, REG), spec)
    batches = scoring_set(spec, rows=13, per_batch=10)  # batches of 10 and 3 rows
    got = heldout.evaluate(model, loss, batches, CPU)
    assert seen == [4, 4, 2, 3]  # 10 rows in pieces of 4, 4, 2; the batch of 3 in one
    want_loss, want_tokens = whole_batch_scores(model, loss, batches)
    assert got.loss == want_loss  # bit for bit: the loss is taken over the whole batch
    assert got.tokens == want_tokens == 13 * 16


def test_piece_rows_follow_the_position_budget(tiny):
    spec = resolve_spec({**tiny, "vocab_size": 256}, REG)
    model = vl.build_model(spec, REG)
    (batch,) = scoring_set(spec, rows=300, seq_len=32, per_batch=300)
    assert heldout.piece_rows(model, batch, CPU, False) == heldout.FORWARD_TOKENS // 32 == 128
    (small,) = scoring_set(spec, rows=100, seq_len=32, per_batch=100)
    assert heldout.piece_rows(model, small, CPU, False) is None  # fits in one piece
    assert heldout.piece_rows(model, batch, torch.device("cuda"), False) is None
    assert heldout.piece_rows(model, batch, CPU, True) is None
    compiled = nn.Module()
    compiled._orig_mod = model  # what torch.compile's wrapper carries
    assert heldout.piece_rows(compiled, batch, CPU, False) is None


def test_a_model_whose_rows_meet_scores_each_batch_in_one_forward(monkeypatch):
    monkeypatch.setattr(heldout, "FORWARD_TOKENS", 64)
    spec = resolve_spec({"family": "gpt", "vocab_size": 256, "context_length": 16,
                         "emb_dim": 32, "n_heads": 4, "n_layers": 2, "drop_rate": 0.0,
                         "feedforward": {"kind": "moe", "n_experts": 4, "top_k": 1,
                                         "capacity_factor": 1.0}}, REG)
    torch.manual_seed(0)
    model, seen = counted(vl.build_model(spec, REG))
    assert heldout.couples_rows(model)  # its experts take the whole batch's tokens
    loss = training.Objective(task_for(spec, REG), spec)
    batches = scoring_set(spec, rows=10, per_batch=10)
    got = heldout.evaluate(model, loss, batches, CPU)
    assert seen == [10]
    assert got.loss == whole_batch_scores(model, loss, batches)[0]


def test_a_plugin_module_can_say_its_rows_meet(tiny):
    model = vl.build_model(resolve_spec(tiny, REG), REG)
    assert not heldout.couples_rows(model)
    mixer = nn.Identity()
    mixer.couples_rows = True
    model.add_module("mixer", mixer)
    assert heldout.couples_rows(model)


def test_an_output_without_a_row_per_input_row_comes_from_the_whole_batch():
    class Flat(nn.Module):  # (rows, T) -> (T, rows): rows on the second axis
        def forward(self, idx):
            return idx.float().t() * 2

    idx = torch.arange(12).view(6, 2)
    batch = vl.Batch({"idx": idx}, torch.zeros(6, 2, dtype=torch.long))
    assert torch.equal(heldout.forward(Flat(), batch, 4), idx.float().t() * 2)


def test_the_scoring_benchmark_measures_the_same_bits(tmp_path):
    """benchmarks/scoring_pieces.py on a tiny experiment: pieces of FORWARD_TOKENS // 16
    rows, outputs equal to one forward's."""
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parent.parent / "benchmarks" / "scoring_pieces.py"
    spec = importlib.util.spec_from_file_location("scoring_pieces_bench", path)
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    exp = tmp_path / "tiny.yaml"
    exp.write_text("name: tiny\nseeds: [0]\nmodel: {family: gpt, vocab_size: 256, "
                   "context_length: 16, emb_dim: 32, n_heads: 4, n_layers: 2, drop_rate: 0.0}\n"
                   "measure:\n  training: {steps: 2, batch_size: 4, seq_len: 16}\n")
    got = bench.measure(exp, repeats=1)
    assert got["rows"] == 2 ** 22 // (16 * 256) == 1024
    assert got["per"] == heldout.FORWARD_TOKENS // 16 == 256
    assert got["same"] is True and got["whole"] > 0 and got["pieces"] > 0
