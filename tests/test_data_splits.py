"""Held-out data: document splits, disjointness, the token cache, bytes, hf_disk."""

import dataclasses
import hashlib
import sys
import threading

import numpy as np
import pytest
import torch

import variantlab as vl
from variantlab.data import cache as cachelib
from variantlab.data import sources as datalib
from variantlab.data.sources import HFDiskData, SyntheticData, TextData
from variantlab.data.splits import split_tokens, windows
from variantlab.data.tokenizer import encode_documents
from variantlab.model.build import resolve_spec
from variantlab.probes import training
from variantlab.probes.heldout import HeldOut
from variantlab.probes.training import TrainingSettings

REG = vl.get_registry()
N_DOCS = 40


@pytest.fixture(autouse=True)
def _own_cache(own_token_cache):
    """Each test tokenises into its own cache (conftest.own_token_cache)."""


@pytest.fixture
def spec(tiny):
    return resolve_spec({**tiny, "vocab_size": 256}, REG)


def corpus(folder, n=N_DOCS):
    """``n`` files, file i made of one character (code 40 + i) only: every byte id names
    the document it came from."""
    folder.mkdir(exist_ok=True)
    for i in range(n):
        (folder / f"d{i:02d}.txt").write_text(chr(40 + i) * (60 + i))
    return TextData(path="docs/*.txt", tokenizer="bytes")


def docs_of(batches):
    ids = torch.cat([b.inputs["idx"].flatten() for b in batches] +
                    [b.target.flatten() for b in batches])
    return {int(t) - 40 for t in ids.unique()} - {-40}  # 0 ends a document


def test_documents_are_split_and_windows_stay_inside_their_split(tmp_path, spec):
    data = corpus(tmp_path / "docs")
    parts, _ = datalib.corpus_splits(data, tmp_path)
    assert parts.by == "documents"
    docs = parts.documents
    # unset fractions: 5% of 40 documents grows to the 15% cap (6), as these tiny documents
    # hold far fewer than 65,536 tokens
    assert (len(docs["val"]), len(docs["test"]), len(docs["train"])) == (6, 6, 28)
    assert set(docs["train"]) | set(docs["val"]) | set(docs["test"]) == set(range(N_DOCS))
    assert not set(docs["train"]) & (set(docs["val"]) | set(docs["test"]))
    assert not set(docs["val"]) & set(docs["test"])
    seen = {}
    for split in ("train", "val", "test"):
        got = datalib.batches(data, spec, 8, 16, 20, seed=0, registry=REG, base_dir=tmp_path,
                              split=split)
        seen[split] = docs_of(got)
        assert seen[split] <= set(docs[split]), split
    assert len(seen["train"]) > 10
    assert seen["val"] == set(docs["val"]) and seen["test"] == set(docs["test"])  # not empty
    # the training probe's own batches read training documents only
    settings = TrainingSettings(steps=30, batch_size=8, seq_len=16, device="cpu")
    _, _, _, batches, _ = training.setup(spec, settings, 0, data, tmp_path, "cpu", REG)
    trained = docs_of(batches)  # a stream: drawn once
    assert 10 < len(trained) and trained <= set(docs["train"])
    held = HeldOut(data, spec, settings, tmp_path, REG)
    assert docs_of(held.batches("val")) == set(docs["val"])  # all of it, nothing else
    assert docs_of(held.batches("test")) == set(docs["test"])


def test_the_held_out_documents_are_the_documented_ones(tmp_path, spec):
    """docs/experiments.md: documents ranked by the sha256 of their token ids, the first
    ones the test split, the next ones validation (unset fractions: 5% grows to the 15% cap,
    6 of 40, for documents this short).
    Recomputed here from the texts: document i is byte 40 + i, 60 + i times, then 0."""
    data = corpus(tmp_path / "docs")
    parts, _ = datalib.corpus_splits(data, tmp_path)
    texts = [np.array([40 + i] * (60 + i) + [0], dtype=np.uint16) for i in range(N_DOCS)]
    ranked = sorted(range(N_DOCS), key=lambda i: hashlib.sha256(texts[i].tobytes()).digest())
    want = {"test": sorted(ranked[:6]), "val": sorted(ranked[6:12])}
    want["train"] = [i for i in range(N_DOCS) if i not in want["test"] + want["val"]]
    assert parts.documents == want
    for split in ("train", "val", "test"):
        assert np.array_equal(parts.of(split), np.concatenate([texts[i] for i in want[split]]))
    # the held-out windows read every document of their split, and nothing else
    settings = TrainingSettings(steps=1, batch_size=8, seq_len=16, device="cpu")
    held = HeldOut(data, spec, settings, tmp_path, REG)
    assert docs_of(held.batches("val")) == set(want["val"])
    assert docs_of(held.batches("test")) == set(want["test"])


def test_the_split_depends_on_contents_not_on_file_names(tmp_path):
    a = corpus(tmp_path / "docs")
    first = datalib.corpus_splits(a, tmp_path)[0]
    for f in sorted((tmp_path / "docs").iterdir()):  # same texts, other names and order
        f.rename(tmp_path / "docs" / f"z{99 - int(f.stem[1:]):02d}.txt")
    datalib._SPLITS.clear()
    second = datalib.corpus_splits(a, tmp_path)[0]
    assert np.array_equal(np.sort(first.test), np.sort(second.test))
    assert np.array_equal(np.sort(first.val), np.sort(second.val))


def test_fractions_are_overridable(tmp_path):
    data = corpus(tmp_path / "docs").model_copy(update={"val_fraction": 0.25,
                                                        "test_fraction": 0.1})
    docs = datalib.corpus_splits(data, tmp_path)[0].documents
    assert (len(docs["val"]), len(docs["test"]), len(docs["train"])) == (10, 4, 26)


def test_a_corpus_of_few_documents_is_split_by_position():
    ids = np.arange(1000, dtype=np.uint16)
    tokens = cachelib.Tokens(ids, np.array([0, 600, 1000]), "k")
    parts = split_tokens(tokens, 0.05, 0.1)
    assert parts.by == "positions"
    assert (len(parts.train), len(parts.val), len(parts.test)) == (850, 50, 100)
    assert parts.train.tolist() == list(range(850)) and parts.documents == {}
    assert parts.val.tolist() == list(range(850, 900))
    assert parts.test.tolist() == list(range(900, 1000))


@pytest.mark.parametrize(("n_docs", "val", "test", "by", "sizes"), [
    (20, 0.05, 0.05, "documents", (18, 1, 1)),  # one document each held out: enough
    (3, 0.34, 0.34, "documents", (1, 1, 1)),  # training keeps one document: enough
    (2, 0.5, 0.5, "positions", None),  # nothing left to train on: by position
    (19, 0.05, 0.05, "positions", None),  # floor(19 x 0.05) = 0 held-out documents
    (10, 0.1, 0.05, "positions", None),  # one validation document, no test document
    (10, 0.05, 0.1, "positions", None),  # one test document, no validation document
])
def test_documents_or_positions_at_the_edges(n_docs, val, test, by, sizes):
    lengths = [5 + i for i in range(n_docs)]
    offsets = np.concatenate([[0], np.cumsum(lengths)])
    ids = np.concatenate([np.full(n, i + 1, dtype=np.uint16) for i, n in enumerate(lengths)])
    parts = split_tokens(cachelib.Tokens(ids, offsets, "k"), val, test)
    assert parts.by == by
    if sizes is not None:
        got = tuple(len(parts.documents[s]) for s in ("train", "val", "test"))
        assert got == sizes and all(len(parts.of(s)) for s in ("train", "val", "test"))
    else:
        n = int(offsets[-1])
        test_start = n - int(n * test)
        assert (len(parts.train), len(parts.val), len(parts.test)) == (
            test_start - int(n * val), int(n * val), n - test_start)
    with pytest.raises(dataclasses.FrozenInstanceError):  # cached and shared by every variant
        parts.train = ids  # type: ignore[misc]


def test_windows_are_consecutive_and_start_anywhere_a_window_fits():
    stream = np.arange(10, dtype=np.uint16)
    got = windows(stream, 200, 4, torch.Generator().manual_seed(0))
    assert got.shape == (200, 4) and got.dtype == torch.int64
    assert (got[:, 1:] - got[:, :-1] == 1).all()  # consecutive ids, forward
    assert set(got[:, 0].tolist()) == set(range(6))  # starts 0 .. len - length - 1


def test_held_out_batches_are_the_same_for_every_variant(tmp_path, spec):
    other = resolve_spec({**spec.to_data(), "activation": {"kind": "relu"}}, REG)
    settings = TrainingSettings(steps=2, batch_size=4, seq_len=16, eval_batches=3, device="cpu")
    for data in (corpus(tmp_path / "docs"), SyntheticData(task="recall")):
        a = HeldOut(data, spec, settings, tmp_path, REG)
        b = HeldOut(data, other, settings, tmp_path, REG)
        for split in ("val", "test"):
            assert sum(x.target.shape[0] for x in a.batches(split)) == 12  # 3 batches of 4
            assert all(torch.equal(x.inputs["idx"], y.inputs["idx"])
                       for x, y in zip(a.batches(split), b.batches(split)))
        assert not torch.equal(a.batches("val")[0].inputs["idx"],
                               a.batches("test")[0].inputs["idx"])


def test_training_rows_hold_val_and_test_loss(tmp_path, spec):
    settings = TrainingSettings(steps=3, batch_size=4, seq_len=16, eval_batches=2, device="cpu")
    rows = training.run(spec, settings, seed=0, data=corpus(tmp_path / "docs"),
                        base_dir=tmp_path, registry=REG)
    m = {r["metric"]: r["value"] for r in rows if r["step"] is None}
    assert {"val_loss", "test_loss", "eval_loss", "val_tokens", "test_tokens"} <= set(m)
    assert m["eval_loss"] == m["val_loss"] and m["val_loss"] != m["test_loss"]


def test_a_second_run_reads_the_cache_and_does_not_tokenise(tmp_path, spec, monkeypatch):
    data = corpus(tmp_path / "docs")
    first = datalib.batches(data, spec, 4, 16, 2, seed=1, registry=REG, base_dir=tmp_path)
    files = sorted(p.name for p in cachelib.cache_dir().iterdir())
    assert [f.split(".", 1)[1] for f in files] == ["offsets.npy", "sha256", "tokens.npy"]
    datalib._SPLITS.clear()

    def refuse(*_a, **_k):
        raise AssertionError("tokenised again")

    monkeypatch.setattr(cachelib, "encode_documents", refuse)
    second = datalib.batches(data, spec, 4, 16, 2, seed=1, registry=REG, base_dir=tmp_path)
    assert all(torch.equal(a.inputs["idx"], b.inputs["idx"]) for a, b in zip(first, second))
    (tmp_path / "docs" / "d00.txt").write_text("changed")  # new content: a new entry
    datalib._SPLITS.clear()
    with pytest.raises(AssertionError, match="tokenised again"):
        datalib.batches(data, spec, 4, 16, 2, seed=1, registry=REG, base_dir=tmp_path)


def test_cache_files_are_memmaps_of_the_narrow_type(tmp_path):
    texts = ["Every effort moves you", "forward"]
    gpt2 = cachelib.corpus_tokens("h", "gpt2", lambda: texts, tmp_path)
    assert isinstance(gpt2.ids, np.memmap) and gpt2.ids.dtype == np.uint16
    assert gpt2.ids[:4].tolist() == [6109, 3626, 6100, 345]
    assert gpt2.offsets.tolist() == [0, 5, 7] and gpt2.ids[4] == 50256
    raw = cachelib.corpus_tokens("h", "bytes", lambda: texts, tmp_path)
    assert raw.key != gpt2.key
    assert bytes(raw.ids[:5].tolist()) == b"Every" and raw.ids[22] == 0
    assert cachelib.id_dtype("gpt2") == np.uint16


def test_incomplete_entries_and_racing_writers(tmp_path):
    key = cachelib.entry_key("h", "bytes")
    np.save(tmp_path / f"{key}.tokens.npy", np.zeros(3, np.uint16))  # no offsets: a miss
    assert cachelib.load(key, tmp_path) is None
    out = []
    threads = [threading.Thread(target=lambda: out.append(
        cachelib.corpus_tokens("h", "bytes", lambda: ["abc", "de"], tmp_path)))
        for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert [bytes(t.ids.tolist()) for t in out] == [b"abc\0de\0"] * 4
    assert not list(tmp_path.glob(".*tmp"))  # temporary files renamed into place


def test_bytes_tokenizer_has_256_ids_and_is_never_folded(tmp_path, tiny):
    assert encode_documents("bytes", ["é"]) == [[0xC3, 0xA9, 0]]
    small = resolve_spec(tiny, REG)  # vocab_size 64
    with pytest.raises(datalib.DataError, match="vocab_size >= 256"):
        datalib.batches(corpus(tmp_path / "docs"), small, 2, 8, 1, seed=0, registry=REG,
                        base_dir=tmp_path)


def test_a_too_small_held_out_split_says_which(tmp_path, spec):
    (tmp_path / "t.txt").write_text("word " * 200)  # one document: split by position
    with pytest.raises(datalib.DataError, match="the validation split"):
        datalib.batches(TextData(path="t.txt"), spec, 2, 32, 1, seed=0, registry=REG,
                        base_dir=tmp_path, split="val")


def test_hf_disk_reads_a_saved_dataset_and_files(tmp_path, spec):
    datasets = pytest.importorskip("datasets")
    rows = [chr(40 + i) * (60 + i) for i in range(N_DOCS)]
    datasets.Dataset.from_dict({"body": rows, "n": list(range(N_DOCS))}).save_to_disk(
        str(tmp_path / "ds"))
    saved = HFDiskData(path="ds", column="body", tokenizer="bytes")
    parts, where = datalib.corpus_splits(saved, tmp_path)
    assert parts.by == "documents" and "column 'body'" in where
    # the same documents as text files give the same splits
    from_files, _ = datalib.corpus_splits(corpus(tmp_path / "docs"), tmp_path)
    assert parts.documents == from_files.documents
    assert np.array_equal(parts.test, from_files.test)
    got = datalib.batches(saved, spec, 4, 16, 3, seed=0, registry=REG, base_dir=tmp_path)
    assert docs_of(got) and docs_of(got) <= set(parts.documents["train"])
    datasets.Dataset.from_dict({"text": rows}).to_parquet(str(tmp_path / "rows.parquet"))
    pq, _ = datalib.corpus_splits(HFDiskData(path="*.parquet", tokenizer="bytes"), tmp_path)
    assert np.array_equal(pq.val, parts.val)
    with pytest.raises(datalib.DataError, match="no column 'text'; its columns"):
        datalib.corpus_splits(HFDiskData(path="ds"), tmp_path)


def test_hf_disk_without_datasets_says_how_to_install(tmp_path, monkeypatch):
    (tmp_path / "rows.jsonl").write_text('{"text": "hello"}\n')
    monkeypatch.setitem(sys.modules, "datasets", None)
    with pytest.raises(datalib.DataError, match=r"pip install 'variantlab\[datasets\]'"):
        datalib.corpus_splits(HFDiskData(path="rows.jsonl"), tmp_path)


@pytest.mark.parametrize("data,expected", [
    ("{source: text, path: 'docs/*.txt', tokenizer: bytes}", "vocab_size must be >= 256"),
    ("{source: text, path: 'docs/*.txt', val_fraction: 0.01}", "the validation split of"),
    ("{source: hf_disk, path: 'docs/*.txt'}", "give files of one kind"),
])
def test_bad_corpus_is_located_exit_2_and_nothing_runs(tmp_path, data, expected):
    from click.testing import CliRunner
    from conftest import exp

    from variantlab.cli.main import main

    corpus(tmp_path / "docs")
    path = tmp_path / "exp.yaml"
    path.write_text(exp(f"data: {data}\nmeasure:\n  training: {{steps: 1, batch_size: 2, "
                        "seq_len: 16, eval_batches: 1}\n"))
    out = tmp_path / "runs"
    result = CliRunner().invoke(main, ["run", str(path), "--out", str(out)])
    assert result.exit_code == 2, result.output
    line = next(x for x in result.output.splitlines() if expected in x)
    assert line.startswith(f"{path}:") and "Traceback" not in result.output
    assert not out.exists()


@pytest.mark.slow
def test_an_hf_disk_experiment_runs_end_to_end(tmp_path):
    datasets = pytest.importorskip("datasets")
    from click.testing import CliRunner
    from conftest import exp

    from variantlab.cli.main import main

    rows = [f"document {i}: " + "the quick brown fox jumps over the lazy dog " * (3 + i % 5)
            for i in range(N_DOCS)]
    datasets.Dataset.from_dict({"text": rows}).save_to_disk(str(tmp_path / "ds"))
    path = tmp_path / "exp.yaml"
    path.write_text(exp("data: {source: hf_disk, path: ds}\nmeasure:\n  training: {steps: 2, "
                        "batch_size: 2, seq_len: 16, eval_batches: 1, device: cpu}\n"))
    result = CliRunner().invoke(main, ["run", str(path), "--out", str(tmp_path / "runs"),
                                       "--no-report"])
    assert result.exit_code == 0, result.output
    got = vl.results(tmp_path / "runs" / "demo")
    held = got[got.metric.isin(["val_loss", "test_loss"])]
    assert len(held) == 2 and held.value.notna().all()
