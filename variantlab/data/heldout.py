"""The held-out scoring sets: one fixed set of windows per held-out split, the same for every
seed and every variant, so that two runs differ in what they learned and never in what they
were scored on.

- A corpus (text, stdlib, hf_disk): the validation / test split (:mod:`.splits`) cut into
  contiguous, non-overlapping windows of ``seq_len + 1`` tokens from its first token on, in
  order (a window's first ``seq_len`` tokens are the input, its last ``seq_len`` the targets;
  the tail shorter than a window is left out): all ``n`` of them when they hold at most
  ``max_tokens`` targets, else ``m = max_tokens // seq_len`` of them (at least one) spread
  evenly over the split, windows ``i * n // m`` for ``i < m``, so that a cap still samples
  every part of the split rather than its first documents; ``max_tokens`` unset:
  ``HELD_TOKENS`` (65,536).
- Synthetic data (random tokens, associative recall) and tasks that make their own inputs:
  ``max_tokens // seq_len`` rows (at least one), drawn in one go from a generator seeded
  with ``SYNTHETIC_SEEDS[split]`` (never a unit's seed); ``max_tokens`` unset:
  ``SYNTHETIC_TOKENS`` (8,192: the rows of a synthetic task are independent draws of one
  distribution, so fewer of them give a steady score).

The windows are scored without gradients in batches of :func:`eval_rows` rows, as large as
the memory bound on a scoring batch allows (``EVAL_LOGITS`` logits, the bound the scoring
had before; at least ``batch_size`` rows; the last may be smaller); a score over them
weights every batch by the targets it scores (:func:`scored`), so the grouping changes a
score only in float rounding. (On CPU a batch's forward runs in pieces whose outputs are
joined before its loss: :func:`variantlab.probes.heldout.forward`.)
A validation curve point scores :func:`spread` rows of the set (``CURVE_TOKENS`` targets at
most, spread evenly over it); the final scores take the whole set.
"""

from __future__ import annotations

from pathlib import Path

import torch

from ..model.specs import ModelSpec
from ..model.tasks import Batch, task_for
from ..plugin.registry import Registry
from .errors import DataError
from .sources import AnyData, SyntheticData, batches, corpus_splits
from .splits import HELD_TOKENS, SPLIT_NAMES, Split

#: Generator seeds of the synthetic validation and test sets.
SYNTHETIC_SEEDS: dict[Split, int] = {"val": 1_000_003, "test": 2_000_029}
#: Targets of a synthetic scoring set when no cap is given.
SYNTHETIC_TOKENS = 8_192
#: A scoring batch holds at most this many logits (:func:`eval_rows`; 16 MiB at float32);
#: its no-grad forward keeps no activations for backward
EVAL_LOGITS = 2 ** 22
#: Targets a validation curve point scores at most (:func:`spread`)
CURVE_TOKENS = 8_192


def held_out_set(data: AnyData | None, spec: ModelSpec, batch_size: int, seq_len: int,
                 split: Split, *, max_tokens: int | None, registry: Registry,
                 base_dir: Path | str = ".") -> list[Batch]:
    """The fixed scoring batches of ``split`` (``"val"`` or ``"test"``) for ``spec``'s
    family, by the rule of the module docstring, in batches of :func:`eval_rows` rows."""
    data = data if data is not None else SyntheticData()
    task = task_for(spec, registry)
    if task.inputs == "floats" or isinstance(data, SyntheticData):
        length = data.seq_len or seq_len if isinstance(data, SyntheticData) else seq_len
        rows = max(1, (max_tokens or SYNTHETIC_TOKENS) // length)
        (whole,) = batches(data, spec, rows, seq_len, 1, seed=SYNTHETIC_SEEDS[split],
                           registry=registry, base_dir=base_dir)
        return in_parts(whole, eval_rows(spec, batch_size, length))
    if data.tokenizer == "bytes" and spec.vocab_size < 256:
        raise DataError(f"tokenizer bytes gives ids 0-255 and is never folded: it needs "
                        f"vocab_size >= 256, got {spec.vocab_size}; raise vocab_size or use gpt2")
    parts, where = corpus_splits(data, base_dir)
    stream = parts.of(split)
    n = len(stream) // (seq_len + 1)
    if n == 0:
        raise DataError(f"the {SPLIT_NAMES[split]} split of {where} has {len(stream)} tokens, "
                        f"fewer than one window of seq_len + 1 = {seq_len + 1}; use more text, "
                        "a shorter seq_len or a larger val_fraction / test_fraction")
    m = min(n, max(1, (max_tokens or HELD_TOKENS) // seq_len))
    ids = torch.from_numpy(stream[:n * (seq_len + 1)].astype("int64"))
    windows = ids.view(n, seq_len + 1)[torch.arange(m) * n // m]  # (m, seq_len + 1)
    if data.tokenizer == "gpt2":
        windows = windows % spec.vocab_size  # fold ids above the model's vocabulary
    gen = torch.Generator().manual_seed(SYNTHETIC_SEEDS[split])  # tasks that draw (masks)
    whole = task.batch(spec, m, seq_len, tokens=windows, generator=gen)
    return in_parts(whole, eval_rows(spec, batch_size, seq_len))


def eval_rows(spec: ModelSpec, batch_size: int, seq_len: int) -> int:
    """Rows per scoring batch: as many as fit ``EVAL_LOGITS`` logits (``seq_len x
    vocab_size`` per row), never fewer than the training batch's ``batch_size`` (what is
    scored is the same whatever the grouping)."""
    per_row = seq_len * max(1, getattr(spec, "vocab_size", 1))
    return max(batch_size, EVAL_LOGITS // per_row)


def joined(parts: list[Batch]) -> Batch:
    """The batches of a scoring set as one batch (inverse of :func:`in_parts`)."""
    first = parts[0]
    inputs = {k: torch.cat([p.inputs[k] for p in parts]) for k in first.inputs}
    extra = {k: torch.cat([p.extra[k] for p in parts]) if isinstance(v, torch.Tensor) else v
             for k, v in first.extra.items()}
    return Batch(inputs, torch.cat([p.target for p in parts]),
                 n_tokens=sum(p.n_tokens for p in parts), extra=extra)


def spread(parts: list[Batch], max_tokens: int | None = None) -> list[Batch]:
    """At most ``max_tokens // seq_len`` rows (unset: ``CURVE_TOKENS``) of a scoring set (at least one), rows
    ``i * n // m`` of its ``n`` (spread evenly, as a capped corpus set picks its windows),
    in batches of the set's own size; the set itself when it is that small already."""
    whole = joined(parts)
    n, length = whole.target.shape[0], max(1, whole.target[0].numel())
    m = min(n, max(1, (max_tokens or CURVE_TOKENS) // length))
    if m == n:
        return parts
    pick = torch.arange(m) * n // m
    inputs = {k: v[pick] for k, v in whole.inputs.items()}
    extra = {k: v[pick] if isinstance(v, torch.Tensor) else v for k, v in whole.extra.items()}
    chosen = Batch(inputs, whole.target[pick], n_tokens=whole.n_tokens * m // n, extra=extra)
    return in_parts(chosen, parts[0].target.shape[0])


def in_parts(batch: Batch, rows: int) -> list[Batch]:
    """``batch`` cut into batches of ``rows`` rows (the last may have fewer): inputs,
    target and every tensor of ``extra`` sliced along the first dimension."""
    total = batch.target.shape[0]
    out = []
    for start in range(0, total, rows):
        stop = min(start + rows, total)
        inputs = {k: v[start:stop] for k, v in batch.inputs.items()}
        extra = {k: v[start:stop] if isinstance(v, torch.Tensor) else v
                 for k, v in batch.extra.items()}
        out.append(Batch(inputs, batch.target[start:stop],
                         n_tokens=batch.n_tokens * (stop - start) // total, extra=extra))
    return out


def scored(batch: Batch) -> int:
    """Targets a batch's loss averages over: integer targets other than -100 (the ignore
    index of the task's cross-entropy); every element of a float target."""
    target = batch.target
    if target.is_floating_point():
        return int(target.numel())
    return int((target != -100).sum())


__all__ = ["SYNTHETIC_SEEDS", "SYNTHETIC_TOKENS", "eval_rows", "held_out_set", "in_parts", "scored"]
