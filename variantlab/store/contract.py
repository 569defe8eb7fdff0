"""What a results store hands its readers, defined once.

:func:`variantlab.store.store.load_run` returns a :class:`RunData`: the run's :class:`RunMeta`
(decoded from the store's text here, once) and three frames whose columns and dtypes are the
tuples below. :func:`variantlab.results` is the ``rows`` frame; the report
(:func:`variantlab.report.frame.gather`) reads exactly these and decodes nothing again.

- :data:`RESULTS`: one row per stored number (a failed unit: one ``error`` row);
- :data:`VARIANTS`: one row per variant, its spec, overrides and warnings as Python data;
- :data:`UNITS`: one row per stored unit (variant x seed x probe).

Each column has a *kind*: ``text`` (the dtype pandas gives text: ``str`` from pandas 3,
``object`` before; missing is NaN or None), ``int`` (nullable ``Int64``), ``float``, ``bool``
or ``data`` (Python objects: dicts, lists). :func:`conform` turns a frame into one of these
shapes or says which columns it lacks; :func:`empty` is the shape with no rows.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, fields
from typing import TYPE_CHECKING, Any, Literal

from ..plugin.rows import SCOPES

if TYPE_CHECKING:  # pandas is imported when a frame is made, not by the commands that only write
    import pandas as pd

Kind = Literal["text", "int", "float", "bool", "data"]


@dataclass(frozen=True)
class Column:
    """One column of a frame: its name, kind (see the module docstring) and meaning."""

    name: str
    kind: Kind
    meaning: str


RESULTS: tuple[Column, ...] = (
    Column("experiment", "text", "the experiment's name"),
    Column("variant", "text", "the variant's name"),
    Column("label", "text", "the variant's label (its overrides, or its name)"),
    Column("seed", "int", "the seed"),
    Column("probe", "text", "the probe that measured it"),
    Column("metric", "text", "what was measured (``error`` on a failed unit's row)"),
    Column("scope", "text", f"one of {', '.join(SCOPES)}"),
    Column("name", "text", "the slot or parameter, or an info row's text; '' at model scope"),
    Column("layer", "int", "the layer of a per-layer row, else missing"),
    Column("step", "int", "the training step of a curve's row, else missing"),
    Column("value", "float", "the number; NaN for an info row, a diverged loss, a failed unit"),
    Column("unit", "text", "count, s, tokens/s, bytes, FLOP/s, ratio ... or ''"),
    Column("unit_key", "text", "the key of the unit that stored the row"),
    Column("status", "text", "ok, or failed"),
    Column("error", "text", "a failed unit's message, else missing"),
    Column("run", "text", "the run folder's name (several runs: a label unique among them)"),
)

VARIANTS: tuple[Column, ...] = (
    Column("name", "text", "the variant's name"),
    Column("label", "text", "the variant's label"),
    Column("position", "int", "its place in the experiment, from 0"),
    Column("spec", "data", "the resolved model spec as plain data (nested dicts)"),
    Column("overrides", "data", "dotted path -> value: what the variant sets on the base"),
    Column("warnings", "data", "list of the warnings its build gave"),
)

UNITS: tuple[Column, ...] = (
    Column("key", "text", "the unit key (variant spec, seed, probe, settings, code)"),
    Column("variant", "text", "the variant that first stored it"),
    Column("seed", "int", "the seed"),
    Column("probe", "text", "the probe"),
    Column("settings_json", "text", "the probe's settings as canonical JSON (part of the key)"),
    Column("status", "text", "ok, or failed"),
    Column("error", "text", "a failed unit's message, else missing"),
    Column("traceback", "text", "a failed unit's traceback, else missing"),
    Column("started_at", "text", "UTC start time (ISO 8601)"),
    Column("finished_at", "text", "UTC end time (ISO 8601)"),
    Column("duration_s", "float", "seconds it took"),
    Column("version", "text", "the variantlab version that computed it"),
    Column("device", "text", "the device it ran on"),
    Column("invocation", "text", "which `variantlab run` stored it (missing in older stores)"),
    Column("cpu_s", "float", "CPU seconds of the process that computed it, all threads "
                             "(missing in older stores)"),
    Column("load_start", "float", "the machine's 1-minute load average when it started"),
    Column("load_end", "float", "the machine's 1-minute load average when it ended"),
    Column("torch_threads", "int", "torch's threads while it ran"),
    Column("cores", "int", "the CPUs the computing process could use"),
    Column("machine", "text", "the processor (and GPU) that computed it, e.g. `AMD EPYC "
                              "(AuthenticAMD 25/1/1), AVX2` (missing in older stores)"),
    Column("current", "bool", "whether the experiment as last run plans it"),
)


def names(columns: Sequence[Column]) -> tuple[str, ...]:
    """The columns' names, in order."""
    return tuple(c.name for c in columns)


def describe(columns: Sequence[Column]) -> str:
    """One line per column, ``name (kind): meaning``: for docstrings and help."""
    return "\n".join(f"- ``{c.name}`` ({c.kind}): {c.meaning}" for c in columns)


def dtype(kind: Kind) -> Any:
    """The pandas dtype of a kind."""
    if kind == "text":
        import pandas as pd

        return pd.Series(["text"]).dtype  # str from pandas 3 on, object before
    return {"int": "Int64", "float": "float64", "bool": "bool", "data": object}[kind]


class ContractError(ValueError):
    """A frame or meta that is not the shape :mod:`variantlab.store.contract` defines."""


def conform(frame: pd.DataFrame, columns: Sequence[Column], where: str) -> pd.DataFrame:
    """``frame`` with exactly ``columns``, in order, in their dtypes (other columns are left
    out); :class:`ContractError` naming ``where`` and the columns it lacks or cannot cast."""
    missing = [c.name for c in columns if c.name not in frame.columns]
    if missing:
        raise ContractError(f"{where} lacks the column(s) {', '.join(missing)}; build it with "
                            "the columns of variantlab.store.contract (as store.load_run does)")
    out = frame.loc[:, list(names(columns))]
    for col in columns:
        want = dtype(col.kind)
        if out[col.name].dtype != want:
            try:
                out[col.name] = out[col.name].astype(want)
            except (TypeError, ValueError) as exc:
                raise ContractError(f"{where}: column {col.name!r} is not {col.kind} "
                                    f"({exc})") from None
    return out.reset_index(drop=True)


def empty(columns: Sequence[Column]) -> pd.DataFrame:
    """A frame of ``columns`` with no rows (a run that stored nothing yet)."""
    import pandas as pd

    return pd.DataFrame({c.name: pd.Series(dtype=dtype(c.kind)) for c in columns})


def _json_value(key: str, text: Any) -> Any:
    if not isinstance(text, str):
        return text  # given as data already (a RunMeta built in memory)
    try:
        return json.loads(text)
    except ValueError:
        raise ContractError(f"meta {key!r} is not JSON ({text[:60]!r})") from None


def _seeds(text: Any) -> list[int]:
    value = _json_value("seeds", text)
    if not isinstance(value, list) or not all(
            isinstance(s, int) and not isinstance(s, bool) for s in value):
        raise ContractError(f"meta 'seeds' is not a list of integers ({value!r})")
    return value


def _mapping(key: str, text: Any) -> dict[str, Any] | None:
    value = _json_value(key, text)
    if value is not None and not isinstance(value, dict):
        raise ContractError(f"meta {key!r} is not a mapping ({value!r})")
    return value


@dataclass(frozen=True)
class RunMeta:
    """What a run stored about itself (its ``meta`` table), decoded.

    Keys a store lacks (written by an older version) take the defaults; ``grid`` is None
    when the store predates it (the report then reads the grid from ``yaml``). ``run`` is not
    stored: the reader sets it to the run's label (its folder's name). ``extra`` keeps keys
    this version does not know, as stored text.
    """

    experiment: str = ""
    description: str = ""
    yaml: str = ""  # the experiment file's text as run
    created: str = ""  # UTC time of the first run into this folder
    updated: str = ""  # UTC time of the latest
    experiment_file: str = ""
    variantlab_version: str = ""
    torch_version: str = ""
    seeds: list[int] = field(default_factory=list)
    baseline: str = ""
    data: dict[str, Any] = field(default_factory=dict)
    measure: dict[str, Any] = field(default_factory=dict)  # probe -> its settings
    grid: dict[str, list[Any]] | None = None  # dotted path -> values
    compare_on: str = ""  # the headline metric (variantlab.config.metrics); "": loss
    roles: dict[str, str] | None = None  # axis -> compared / tuned / condition
    run: str = ""
    extra: dict[str, str] = field(default_factory=dict)

    @classmethod
    def decode(cls, stored: Mapping[str, Any], run: str = "") -> RunMeta:
        """The meta table's ``key -> text`` as a RunMeta; ContractError naming a key whose
        text is not what that key holds."""
        known = {f.name for f in fields(cls)} - {"run", "extra"}
        text = {k: ("" if v is None else str(v)) for k, v in stored.items()
                if k in known and k not in ("seeds", "data", "measure", "grid", "roles")}
        return cls(
            **text,
            seeds=_seeds(stored["seeds"]) if "seeds" in stored else [],
            data=_mapping("data", stored.get("data")) or {},
            measure=_mapping("measure", stored.get("measure")) or {},
            grid=_mapping("grid", stored.get("grid")),
            roles=_mapping("roles", stored.get("roles")),
            run=run,
            extra={k: str(v) for k, v in stored.items() if k not in known},
        )

    def stored(self) -> dict[str, Any]:
        """What :meth:`variantlab.store.store.Store.write_experiment` writes: every key but
        ``run`` (``grid`` only when known), with ``extra``'s keys."""
        out = {f.name: getattr(self, f.name) for f in fields(self)
               if f.name not in ("run", "extra")}
        for key in ("grid", "roles"):
            if out[key] is None:
                del out[key]
        return {**self.extra, **out}


@dataclass
class RunData:
    """One run as :func:`variantlab.store.store.load_run` reads it: the frames have the columns of
    :data:`VARIANTS`, :data:`UNITS` and :data:`RESULTS` (``rows``, the results() frame)."""

    meta: RunMeta
    variants: pd.DataFrame
    units: pd.DataFrame
    rows: pd.DataFrame
