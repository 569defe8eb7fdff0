"""Data settings as grid axes: ``data.*`` paths in ``grid:`` and in named variants' ``set:``
(``data.n_pairs``, ``data.seq_len`` of the recall task) give a variant its own data spec,
validated like ``data:`` and located at the override that set it."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from pydantic import TypeAdapter, ValidationError

from ..data.sources import DataError, DataSpec, SyntheticData, recall_pairs

DATA_ADAPTER: TypeAdapter = TypeAdapter(DataSpec)
Add = Callable[[tuple, str, str], None]  # (YAML loc, message, at)


def split_data(overrides: Mapping[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """(model overrides, ``data.*`` overrides)."""
    data = {p: v for p, v in overrides.items() if p.startswith("data.")}
    return {p: v for p, v in overrides.items() if p not in data}, data


def variant_data(base: Any, data_over: Mapping[str, Any], where: Mapping[str, tuple],
                 grid: bool, add: Add) -> Any:
    """The data spec ``base`` with ``data_over`` applied; None (after ``add``-ing a located
    message for each problem) when it does not validate."""
    merged = {**base.model_dump(mode="json"), **{p[5:]: v for p, v in data_over.items()}}
    try:
        return DATA_ADAPTER.validate_python(merged)
    except ValidationError as exc:
        for err in exc.errors():
            names = [str(x) for x in err["loc"]]
            path = next((f"data.{n}" for n in reversed(names) if f"data.{n}" in data_over),
                        next(iter(data_over)))
            if err["type"] == "extra_forbidden":
                keys = ", ".join(f"data.{k}" for k in SyntheticData.model_fields
                                 if k != "source")
                add(where[path][:-1] if grid else where[path],
                    f"unknown key {path!r} for data source {merged.get('source')!r}; the "
                    f"synthetic source's keys: {keys}", "key")
            else:
                add(where[path], f"{path}: {err['msg']}", "auto")
        return None


def data_fit(data: Any, context_length: int, vocab_size: int, where: Mapping[str, tuple],
             name: str, add: Add) -> None:
    """A synthetic ``data.seq_len`` within the variant's context and, for the recall task,
    pairs that fit the row (:func:`variantlab.data.sources.recall_pairs`)."""
    if not isinstance(data, SyntheticData) or data.seq_len is None:
        return
    if data.seq_len > context_length:
        add(where.get("data.seq_len", ("data", "seq_len")),
            f"data.seq_len={data.seq_len} is above context_length={context_length} of "
            f"variant {name!r}; use data.seq_len <= {context_length} or raise "
            "context_length", "auto")
    elif data.task == "recall" and data.n_pairs is not None:
        try:
            recall_pairs(data.seq_len + 1, vocab_size, data.n_pairs)
        except DataError as exc:
            add(where.get("data.n_pairs", ("data", "n_pairs")),
                f"{exc} (variant {name!r})", "auto")


__all__ = ["DATA_ADAPTER", "data_fit", "split_data", "variant_data"]
