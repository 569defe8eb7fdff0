"""The training probe's ``eval_lengths``: the test split scored at lengths beyond the training
``seq_len`` (length generalisation; Kazemnejad et al. 2023, NoPE), checked against windows
cut and scored by hand with the trained model."""

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import variantlab as vl
from variantlab.config.metrics import direction
from variantlab.data import sources as datalib
from variantlab.data.sources import SyntheticData, TextData
from variantlab.errors import InputError
from variantlab.model.build import resolve_spec
from variantlab.probes import training
from variantlab.probes.training import TrainingSettings

REG = vl.get_registry()


@pytest.fixture(autouse=True)
def _own_cache(own_token_cache):
    """Each test tokenises into its own cache (conftest.own_token_cache)."""


def trained_model(monkeypatch):
    """Keeps the model the training probe builds (left as training leaves it)."""
    kept = {}
    real = training.setup

    def setup(*args, **kwargs):
        got = real(*args, **kwargs)
        kept["model"] = got[1]
        return got
    monkeypatch.setattr(training, "setup", setup)
    return kept


def values(rows):
    return {r["metric"]: r["value"] for r in rows if r["step"] is None}


def test_each_length_scores_the_test_split_windows_of_that_length(tmp_path, tiny, monkeypatch):
    folder = tmp_path / "docs"
    folder.mkdir()
    for i in range(40):
        (folder / f"d{i:02d}.txt").write_text("".join(chr(40 + (i * 7 + j * j) % 80)
                                                      for j in range(300)))
    data = TextData(path="docs/*.txt", tokenizer="bytes")
    spec = resolve_spec({**tiny, "vocab_size": 256, "context_length": 64,
                         "positional": {"kind": "rotary"}}, REG)
    cap = 400
    settings = TrainingSettings(steps=2, lr=1e-2, batch_size=4, seq_len=16, device="cpu",
                                eval_tokens=cap, eval_lengths=[64, 32, 64])
    assert settings.eval_lengths == [32, 64]
    kept = trained_model(monkeypatch)
    got = values(training.run(spec, settings, seed=0, data=data, base_dir=tmp_path,
                              registry=REG))
    model = kept["model"].eval()
    test = np.asarray(datalib.corpus_splits(data, tmp_path)[0].test, dtype=np.int64)
    for length in (32, 64):
        n = len(test) // (length + 1)  # non-overlapping windows of length + 1 tokens
        m = min(n, cap // length)  # spread evenly: window i * n // m
        ids = torch.from_numpy(test[:n * (length + 1)]).view(n, length + 1)
        ids = ids[[i * n // m for i in range(m)]]
        with torch.no_grad():
            logits = model(ids[:, :-1])  # (m, length, vocab)
        want = F.cross_entropy(logits.reshape(-1, 256), ids[:, 1:].reshape(-1))
        assert got[f"test_tokens_at_{length}"] == m * length
        assert got[f"test_loss_at_{length}"] == pytest.approx(float(want), rel=1e-5)
    assert "test_loss_at_16" not in got and got["test_tokens"] == min(
        len(test) // 17, cap // 16) * 16


def test_recall_is_scored_on_rows_of_each_length(tiny):
    data = SyntheticData(task="recall", n_pairs=3, seq_len=16)
    spec = resolve_spec({**tiny, "positional": {"kind": "rotary"}}, REG)
    settings = TrainingSettings(steps=2, batch_size=4, seq_len=16, device="cpu",
                                eval_tokens=256, eval_lengths=[32])
    got = values(training.run(spec, settings, seed=0, data=data, registry=REG))
    assert got["test_tokens_at_32"] == (256 // 32) * 32  # rows of 32 tokens, not data.seq_len
    assert 0 <= got["test_recall_accuracy_at_32"] <= 1
    assert got["test_tokens"] == 256


def test_unset_eval_lengths_leave_the_unit_key_alone_and_directions_follow_the_metric():
    assert "eval_lengths" not in TrainingSettings().model_dump()
    assert TrainingSettings(eval_lengths=[256]).model_dump()["eval_lengths"] == [256]
    assert direction("test_loss_at_256") == "lower"
    assert direction("test_recall_accuracy_at_128") == "higher"
    assert direction("test_tokens_at_128") is None


def test_a_length_above_the_context_is_refused_before_anything_runs(tiny):
    from variantlab.config.experiment import experiment_from_text

    text = ("name: k\nmodel: {family: gpt, vocab_size: 64, context_length: 32, emb_dim: 32, "
            "n_heads: 4, n_layers: 2}\ndata: {source: synthetic}\n"
            "measure:\n  training: {steps: 1, seq_len: 16, eval_lengths: [32, 64]}\n")
    with pytest.raises(InputError, match=r"measure\.training\.eval_lengths: eval_lengths: 64 "
                       r"is above context_length=32 of variant\(s\) 'base'; score at most 32"):
        experiment_from_text(text)
    with pytest.raises(ValueError, match="eval_lengths: 64 is above context_length=32"):
        training.run(resolve_spec(tiny, REG), TrainingSettings(eval_lengths=[64], seq_len=16),
                     seed=0, registry=REG)
