"""Batches for the probes: synthetic tokens, text files, the Python stdlib sources, or a
Hugging Face ``datasets`` dataset on disk.

Every source is deterministic for a seed (a private ``torch.Generator``; the global RNG is
left alone so model initialisation stays the seeds'). A corpus is tokenised with GPT-2 BPE
or as UTF-8 bytes (:mod:`variantlab.data.tokenizer`), once: the ids are kept in the token
cache (:mod:`variantlab.data.cache`), and split by document into train / validation / test
(:mod:`variantlab.data.splits`). GPT-2 ids at or above the model's ``vocab_size`` are folded
with ``id % vocab_size`` so a small model can read a real corpus (folding merges unrelated
tokens, so a small-vocabulary model sees a harder, noisier language than GPT-2 does); byte
ids are never folded.
Every batch is made by the family's task (:mod:`variantlab.model.tasks`) from token rows; a task
whose ``inputs`` is ``"floats"`` ignores the source and makes its own float inputs.
"""

from __future__ import annotations

import functools
import glob
import os
import sysconfig
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Annotated, Any, Literal

import numpy as np
import torch
from pydantic import Field, PositiveInt, model_serializer, model_validator

from ..model.specs import ModelSpec
from ..model.tasks import Batch, task_for
from ..plugin.registry import Registry
from ..plugin.settings import Strict
from .cache import corpus_tokens, files_hash
from .errors import DataError
from .splits import SPLIT_NAMES, Split, Splits, split_tokens, windows


class SyntheticData(Strict):
    """Random tokens, or associative recall (key-value pairs, then a queried key)."""

    source: Literal["synthetic"] = "synthetic"
    task: Literal["random", "recall"] = "random"
    n_pairs: PositiveInt | None = Field(
        default=None, description="recall: key-value pairs per row (unset: a quarter of the row); "
        "the rest of the row asks queries")
    seq_len: PositiveInt | None = Field(
        default=None, description="positions per row, in place of the probe's seq_len (so that a "
        "grid can sweep it with data.seq_len); unset: the probe's")
    loss_on: Literal["all", "answers"] = Field(
        default="all", description="recall: the positions the loss is taken over: all (every "
        "next token) or answers (the queried values only, as Zoology trains)")

    @model_validator(mode="after")
    def _answers_need_recall(self) -> SyntheticData:
        if self.loss_on == "answers" and self.task != "recall":
            raise ValueError("loss_on: answers needs task: recall (random tokens have no "
                             "answers)")
        return self

    @model_serializer(mode="wrap")
    def _omit_unset(self, handler):  # data written before these keys keeps its unit keys
        data = handler(self)
        unset = {"n_pairs": None, "seq_len": None, "loss_on": "all"}
        for key, default in unset.items():
            if isinstance(data, dict) and key in data and data[key] == default:
                data.pop(key)
        return data


Fraction = Annotated[float, Field(gt=0, lt=0.5)]


class CorpusData(Strict):
    """What every real corpus takes: the tokenizer and the held-out fractions."""

    tokenizer: Literal["gpt2", "bytes"] = "gpt2"
    #: unset: sized for held-out scoring (:func:`variantlab.data.splits.held_count`)
    val_fraction: Fraction | None = None
    test_fraction: Fraction | None = None


class TextData(CorpusData):
    """Text files (a path or glob, relative to the experiment file), one document each."""

    source: Literal["text"] = "text"
    path: str


class StdlibData(CorpusData):
    """The running Python's standard-library sources: a real corpus present everywhere."""

    source: Literal["stdlib"] = "stdlib"
    max_files: PositiveInt | None = 200


class HFDiskData(CorpusData):
    """A Hugging Face ``datasets`` dataset: a folder written by ``save_to_disk``, or parquet /
    jsonl / json / csv files (a path or glob); one document per row of ``column``."""

    source: Literal["hf_disk"] = "hf_disk"
    path: str
    column: str = "text"


AnyData = SyntheticData | TextData | StdlibData | HFDiskData
DataSpec = Annotated[AnyData, Field(discriminator="source")]

__all__ = ["BatchStream", "DataError", "batches", "corpus_splits", "recall_pairs", "recall_tokens",
           "stdlib_files", "text_files", "token_stream", "with_recall_mask"]


def batches(
    data: AnyData | None,
    spec: ModelSpec,
    batch_size: int,
    seq_len: int,
    n: int,
    *,
    seed: int,
    registry: Registry,
    base_dir: Path | str = ".",
    split: Split = "train",
) -> list[Batch]:
    """``n`` batches of ``batch_size`` rows of ``seq_len`` positions for ``spec``'s family,
    made by the family's task in ``registry``, all at once (:class:`BatchStream` draws the
    same batches one at a time). A corpus gives windows of its ``split`` only
    (:mod:`variantlab.data.splits`); synthetic data has no splits (the held-out batches of a
    probe come from generators with other seeds)."""
    return list(BatchStream(data, spec, batch_size, seq_len, n, seed=seed, registry=registry,
                            base_dir=base_dir, split=split))


class BatchStream:
    """The ``n`` batches of :func:`batches`, drawn one at a time when asked for (iteration or
    :meth:`next`), from one ``torch.Generator`` seeded with ``seed``: the same batches in the
    same order, but only one is held at a time, so memory does not grow with ``n`` (a
    training run's steps). :meth:`state` / :meth:`load_state` save and restore the position
    and the generator, so a resumed run draws the batches it would have drawn. Bad data
    (too few tokens, a vocabulary too small for ``bytes``) raises :class:`DataError` here,
    before any batch is drawn."""

    def __init__(self, data: AnyData | None, spec: ModelSpec, batch_size: int, seq_len: int,
                 n: int, *, seed: int, registry: Registry, base_dir: Path | str = ".",
                 split: Split = "train") -> None:
        self.n = n
        self.drawn = 0  # batches drawn so far
        self.tokens = 0  # their ``n_tokens``, summed
        self.generator = torch.Generator().manual_seed(int(seed))
        self._draw = _drawer(data if data is not None else SyntheticData(), spec, batch_size,
                             seq_len, self.generator, registry, base_dir, split)

    def __len__(self) -> int:
        return self.n

    def __iter__(self) -> Iterator[Batch]:
        while self.drawn < self.n:
            yield self.next()

    def next(self) -> Batch:
        """The next batch (at most ``n`` in all: then ``IndexError``)."""
        if self.drawn >= self.n:
            raise IndexError(f"all {self.n} batches of the stream were drawn")
        batch = self._draw()
        self.drawn += 1
        self.tokens += batch.n_tokens
        return batch

    def state(self) -> dict[str, Any]:
        """Where the stream is: batches and tokens drawn and the generator's state."""
        return {"drawn": self.drawn, "tokens": self.tokens,
                "generator": self.generator.get_state()}

    def load_state(self, state: dict[str, Any]) -> None:
        """Continue from a :meth:`state` of a stream made with the same arguments."""
        self.drawn, self.tokens = int(state["drawn"]), int(state["tokens"])
        self.generator.set_state(state["generator"])


def _drawer(data: AnyData, spec: ModelSpec, batch_size: int, seq_len: int,
            gen: torch.Generator, registry: Registry, base_dir: Path | str,
            split: Split) -> Callable[[], Batch]:
    """A function drawing one batch from ``gen`` (checks the data first)."""
    task = task_for(spec, registry)
    if task.inputs == "floats":
        return lambda: task.batch(spec, batch_size, seq_len, generator=gen)
    vocab = spec.vocab_size
    if isinstance(data, SyntheticData):
        length = data.seq_len or seq_len

        def synthetic() -> Batch:
            if data.task == "recall":
                tokens = recall_tokens(batch_size, length + 1, vocab, generator=gen,
                                       n_pairs=data.n_pairs)
                return with_recall_mask(
                    task.batch(spec, batch_size, length, tokens=tokens, generator=gen),
                    tokens, vocab, data.n_pairs, answers_only=data.loss_on == "answers")
            tokens = torch.randint(0, vocab, (batch_size, length + 1), generator=gen)
            return task.batch(spec, batch_size, length, tokens=tokens, generator=gen)
        return synthetic
    if data.tokenizer == "bytes" and vocab < 256:
        raise DataError(f"tokenizer bytes gives ids 0-255 and is never folded: it needs "
                        f"vocab_size >= 256, got {vocab}; raise vocab_size or use gpt2")
    parts, where = corpus_splits(data, base_dir)
    stream = parts.of(split)
    if len(stream) < seq_len + 2:
        raise DataError(
            f"the {SPLIT_NAMES[split]} split of {where} has {len(stream)} tokens, fewer than "
            f"seq_len + 2 = {seq_len + 2}; use more text, a shorter seq_len or other "
            "val_fraction / test_fraction"
        )

    def corpus() -> Batch:
        tokens = windows(stream, batch_size, seq_len + 1, gen)  # (B, seq_len + 1)
        if data.tokenizer == "gpt2":
            tokens = tokens % vocab  # fold ids above the model's vocabulary
        return task.batch(spec, batch_size, seq_len, tokens=tokens, generator=gen)
    return corpus


def corpus_splits(data: TextData | StdlibData | HFDiskData,
                  base_dir: Path | str = ".") -> tuple[Splits, str]:
    """The corpus's train / validation / test splits (from the token cache) and a phrase
    naming the corpus for messages."""
    if isinstance(data, HFDiskData):
        from .hfdisk import hf_corpus

        content, documents, where = hf_corpus(data.path, data.column, base_dir)
    else:
        if isinstance(data, TextData):
            files = text_files(data.path, base_dir)
            where = f"data.path {data.path!r}"
        else:
            files = stdlib_files(data.max_files)
            where = f"the Python stdlib ({len(files)} files)"
        content = "files:" + files_hash(files)
        documents = functools.partial(read_texts, tuple(str(f) for f in files))
    key = (content, data.tokenizer, data.val_fraction, data.test_fraction)
    if key not in _SPLITS:
        if len(_SPLITS) >= 8:  # keep the last few corpora of this process in memory
            _SPLITS.pop(next(iter(_SPLITS)))
        tokens = corpus_tokens(content, data.tokenizer, documents)
        _SPLITS[key] = split_tokens(tokens, data.val_fraction, data.test_fraction)
    return _SPLITS[key], where


_SPLITS: dict[tuple[str, str, float | None, float | None], Splits] = {}


def read_texts(paths: tuple[str, ...]) -> list[str]:
    """The files' text (UTF-8; undecodable bytes read as U+FFFD)."""
    return [Path(p).read_text(encoding="utf-8", errors="replace") for p in paths]
def recall_pairs(length: int, vocab_size: int, n_pairs: int | None = None) -> int:
    """Key-value pairs per row of ``length`` tokens: ``n_pairs``, or a quarter of the row
    (at most half the vocabulary); a :class:`DataError` when they do not fit."""
    half = vocab_size // 2
    if n_pairs is None:
        return max(1, min(length // 4, half))
    if n_pairs > half:
        raise DataError(f"data.n_pairs={n_pairs} needs {n_pairs} distinct keys, but the lower "
                        f"half of vocab_size={vocab_size} has {half}; use at most {half}")
    if 2 * n_pairs + 2 > length:
        raise DataError(f"data.n_pairs={n_pairs} fills {2 * n_pairs} of the row's {length} "
                        f"tokens, leaving no query; use at most {(length - 2) // 2} pairs or "
                        "a longer seq_len")
    return n_pairs


def with_recall_mask(batch: Batch, tokens: torch.Tensor, vocab_size: int,
                     n_pairs: int | None, answers_only: bool = False) -> Batch:
    """``batch`` with ``extra["recall_mask"]`` (B, T) True where the target is a queried value
    (the probes' ``recall_accuracy``), when the batch's target is the next token; else as is.
    ``answers_only`` (``data.loss_on: answers``): every other target becomes -100, so the
    task's cross-entropy is taken over the answers alone."""
    if batch.target.shape != tokens[:, 1:].shape or not torch.equal(batch.target, tokens[:, 1:]):
        if answers_only:
            raise DataError("data.loss_on: answers needs a family whose target is the next "
                            "token (gpt, decoder); use loss_on: all with this family")
        return batch
    length = tokens.shape[1]
    pairs = recall_pairs(length, vocab_size, n_pairs)
    t = torch.arange(length - 1)  # target index i predicts token i + 1
    asked = (t >= 2 * pairs) & ((t - 2 * pairs) % 2 == 0)  # (T,): inputs that are queried keys
    batch.extra["recall_mask"] = asked[None, :].expand(tokens.shape[0], -1)  # (B, T)
    if answers_only:
        batch.target = torch.where(batch.extra["recall_mask"], batch.target, -100)  # (B, T)
    return batch


def recall_tokens(
    batch_size: int, length: int, vocab_size: int, *, generator: torch.Generator | None = None,
    n_pairs: int | None = None,
) -> torch.Tensor:
    """Associative recall (multi-query, as in Zoology / H3): each row first lists key-value
    pairs ``k1 v1 k2 v2 ...`` (distinct keys from the lower half of the vocabulary, values
    from the upper half), then asks ``q v q v ...`` with keys drawn from those pairs; the
    token after a queried key is its value. Only a model that looks back at the pairs
    (attention with working positions) predicts the answers; a bag-of-tokens model cannot.
    ``n_pairs`` pairs per row (default a quarter of the row). Returns (batch_size, length)
    int64.
    """
    if vocab_size < 4:
        raise DataError(f"the recall task needs vocab_size >= 4, got {vocab_size}")
    half = vocab_size // 2
    n_pairs = recall_pairs(length, vocab_size, n_pairs)
    n_queries = (length - 2 * n_pairs + 1) // 2
    rows = []
    for _ in range(batch_size):
        keys = torch.randperm(half, generator=generator)[:n_pairs]  # (P,)
        values = torch.randint(half, vocab_size, (n_pairs,), generator=generator)  # (P,)
        context = torch.stack([keys, values], dim=1).flatten()  # (2P,)
        pick = torch.randint(0, n_pairs, (n_queries,), generator=generator)  # (Q,)
        queries = torch.stack([keys[pick], values[pick]], dim=1).flatten()  # (2Q,)
        rows.append(torch.cat([context, queries])[:length])
    return torch.stack(rows)  # (B, length)


def text_files(pattern: str, base_dir: Path | str = ".") -> list[Path]:
    """Files matching ``pattern`` (a path or glob, ``**`` allowed), relative to ``base_dir``."""
    full = Path(os.path.expanduser(pattern))
    if not full.is_absolute():
        full = Path(base_dir) / full
    matches = sorted(Path(p) for p in glob.glob(str(full), recursive=True) if Path(p).is_file())
    if not matches:
        raise DataError(
            f"data.path {pattern!r}: no file matches {str(full)!r} (relative paths start at "
            f"the experiment's folder {str(base_dir)!r}); fix the path or glob"
        )
    return matches


def stdlib_files(max_files: int | None = None) -> list[Path]:
    """The running Python's standard-library ``.py`` sources, sorted, at most ``max_files``
    (installed packages under site-/dist-packages are left out)."""
    files = _stdlib_files()
    if not files:
        raise DataError(f"no .py sources under the stdlib folder {_stdlib_root()}")
    return list(files[:max_files] if max_files else files)


def _stdlib_root() -> Path:
    return Path(sysconfig.get_paths()["stdlib"])


@functools.lru_cache(maxsize=1)
def _stdlib_files() -> tuple[Path, ...]:
    """Every stdlib source, listed once per process. The walk never enters a
    site-packages or dist-packages folder (installed packages can be far larger than the
    stdlib: walking them took 0.36 s of the 0.38 here)."""
    root = _stdlib_root()
    found = []
    for folder, subfolders, names in os.walk(root):
        subfolders[:] = [d for d in subfolders if d not in ("site-packages", "dist-packages")]
        found += [Path(folder) / name for name in names if name.endswith(".py")]
    return tuple(sorted(found))


def token_stream(paths: tuple[str, ...], tokenizer: str = "gpt2") -> torch.Tensor:
    """The ids of the files, in order, each followed by its end-of-document id (GPT-2's
    ``<|endoftext|>``): (N,) int64, read through the token cache."""
    files = [Path(p) for p in paths]
    tokens = corpus_tokens("files:" + files_hash(files), tokenizer,
                           functools.partial(read_texts, paths))
    return torch.from_numpy(tokens.ids.astype(np.int64))
