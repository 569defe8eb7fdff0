"""A run's results logged to MLflow (offline: any tracking URI, e.g. ``sqlite:///mlflow.db``).

Each variant x seed becomes one MLflow run, nested under a parent run per variantlab run
that holds the report (report.md, report.html, the CSV tables and plots) as artifacts:

- params: ``variant``, ``label``, ``seed``, ``experiment``, the variant's axis values (its
  overrides, by dotted path: ``norm.kind``), each probe's settings (``training.steps``) and
  the data settings (``data.source``);
- metrics: every number of :func:`variantlab.results` under ``probe/metric[/scope][/name]
  [/layerN]`` (scope only for slot and parameter rows); a curve's rows (``step`` set) as the
  metric's history with those steps, the others at step 0;
- tags: ``variantlab.unit`` (``RUN/variant/seed``, what a rerun looks the run up by),
  ``variantlab.unit_keys`` (the unit keys of its probes), ``variantlab.digest`` (of all of the
  above), info rows (``info/timing/device``) and failed units' errors (``failed/PROBE``; the
  run's status is then FAILED); the model spec as the artifact ``spec.json``.

Exporting again is idempotent: a run whose digest is unchanged is left alone; one whose
results changed (``variantlab run --rerun``) is deleted and logged anew, so MLflow never holds
two runs for one variant x seed.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import tempfile
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field, replace
from datetime import datetime
from pathlib import Path
from typing import Any

import pandas as pd

from ..errors import SpecError
from ..plugin.registry import Registry
from ..store.contract import RunData
from ..store.runs import RunRef, find_runs
from ..store.store import load_run

UNIT_TAG, DIGEST_TAG, KIND_TAG = "variantlab.unit", "variantlab.digest", "variantlab.kind"
_BAD = re.compile(r"[^A-Za-z0-9_\-. /]")


@dataclass
class Logged:
    """What :func:`export_mlflow` did: MLflow run ids by ``RUN/variant/seed``, and how many
    runs it created, replaced (results changed) and left alone (unchanged)."""

    experiment_id: str = ""
    runs: dict[str, str] = field(default_factory=dict)
    created: int = 0
    replaced: int = 0
    unchanged: int = 0


def _mlflow() -> Any:
    try:
        import mlflow
    except ImportError:
        raise SpecError.at(["mlflow"], "mlflow is not installed; install the extra: pip "
                           "install 'variantlab[mlflow]' (or mlflow itself)") from None
    return mlflow


def metric_key(probe: str, metric: str, scope: str, name: str, layer: Any) -> str:
    """The MLflow metric key of one result row (characters MLflow refuses become ``_``)."""
    parts = [probe, metric] + ([scope] if scope in ("slot", "parameter") else [])
    parts += [name] if name else []
    parts += [] if pd.isna(layer) else [f"layer{int(layer)}"]
    return _BAD.sub("_", "/".join(parts))


def _flat(prefix: str, value: Any, out: dict[str, str]) -> dict[str, str]:
    if isinstance(value, Mapping):
        for k, v in value.items():
            _flat(f"{prefix}.{k}" if prefix else str(k), v, out)
    else:
        out[_BAD.sub("_", prefix)] = json.dumps(value) if not isinstance(value, str) else value
    return out


def _ms(text: Any) -> int | None:
    if not isinstance(text, str) or not text:
        return None
    return int(datetime.fromisoformat(text).timestamp() * 1000)


def unit_content(data: RunData, variant: str, seed: int) -> dict[str, Any]:
    """Params, metrics (key -> [(step, value)]), tags and status of one variant x seed."""
    rows = data.rows[(data.rows["variant"] == variant) & (data.rows["seed"] == seed)]
    units = data.units[data.units["key"].isin(set(rows["unit_key"]))]
    vrow = data.variants[data.variants["name"] == variant]
    overrides = vrow["overrides"].iloc[0] if len(vrow) else {}
    params = {"experiment": data.meta.experiment, "variant": variant, "seed": str(seed),
              "label": str(rows["label"].iloc[0]) if len(rows) else variant}
    params.update({_BAD.sub("_", k): v if isinstance(v, str) else json.dumps(v)
                   for k, v in overrides.items()})
    for _, unit in units.iterrows():
        _flat(unit["probe"], json.loads(unit["settings_json"] or "{}"), params)
    _flat("data", data.meta.data, params)
    metrics: dict[str, list[tuple[int, float]]] = {}
    tags = {UNIT_TAG: f"{data.meta.run}/{variant}/{seed}", KIND_TAG: "variant",
            "variantlab.unit_keys": ",".join(sorted(units["key"]))}
    failed = rows[rows["status"] == "failed"]
    for _, r in failed.iterrows():
        tags[f"failed/{r['probe']}"] = str(r["error"])[:4000]
    for _, r in rows[rows["status"] == "ok"].iterrows():
        if r["scope"] == "info":
            tags[metric_key("info/" + r["probe"], r["metric"], "", "", None)] = str(r["name"])
            continue
        step = 0 if pd.isna(r["step"]) else int(r["step"])
        key = metric_key(r["probe"], r["metric"], r["scope"], r["name"], r["layer"])
        metrics.setdefault(key, []).append((step, float(r["value"])))
    starts = [t for t in map(_ms, units["started_at"]) if t is not None]
    ends = [t for t in map(_ms, units["finished_at"]) if t is not None]
    return {"params": params, "metrics": metrics, "tags": tags,
            "status": "FAILED" if len(failed) else "FINISHED",
            "start": min(starts) if starts else None, "end": max(ends) if ends else None}


def _digest(content: Mapping[str, Any]) -> str:
    text = json.dumps({k: content[k] for k in ("params", "metrics", "tags", "status")},
                      sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()


def _existing(client: Any, experiment_id: str) -> dict[str, Any]:
    """Active runs of the experiment by their ``variantlab.unit`` tag."""
    found, token = {}, None
    while True:
        page = client.search_runs([experiment_id], max_results=1000, page_token=token)
        for run in page:
            unit = run.data.tags.get(UNIT_TAG)
            if unit is not None:
                found[unit] = run
        token = page.token
        if not token:
            return found


def _log(client: Any, mlflow: Any, experiment_id: str, content: dict[str, Any],
         spec: Any, parent: str | None, name: str) -> str:
    from mlflow.entities import Metric, Param

    tags = dict(content["tags"])
    if parent:
        tags["mlflow.parentRunId"] = parent
    run = client.create_run(experiment_id, start_time=content.get("start"), tags=tags,
                            run_name=name)
    run_id = run.info.run_id
    stamp = content.get("end") or run.info.start_time
    metrics = [Metric(k, v, stamp, step) for k, points in content["metrics"].items()
               for step, v in points]
    params = [Param(k, str(v)[:6000]) for k, v in content["params"].items()]
    for i in range(0, len(params), 100):  # MLflow takes at most 100 params per batch
        client.log_batch(run_id, params=params[i:i + 100])
    for i in range(0, len(metrics), 1000):  # and 1000 metrics
        client.log_batch(run_id, metrics=metrics[i:i + 1000])
    if spec is not None:
        client.log_dict(run_id, spec, "spec.json")
    client.set_terminated(run_id, status=content["status"], end_time=content.get("end"))
    return run_id


def _artifact_location(uri: str) -> str | None:
    """For an ``sqlite:///PATH`` store, artifacts beside the database (``mlartifacts/``),
    not in the working folder."""
    if uri.startswith("sqlite:///"):
        return (Path(uri.removeprefix("sqlite:///")).resolve().parent / "mlartifacts").as_uri()
    return None


def export_mlflow(runs: str | Path | Iterable[str | Path], tracking_uri: str,
                  experiment: str | None = None, *, registry: Registry | None = None,
                  report: bool = True) -> Logged:
    """Log every variant x seed of the runs ``runs`` names into the MLflow experiment
    ``experiment`` (default: the variantlab experiment's name) at ``tracking_uri``; with
    ``report``, the report as artifacts of a parent run per variantlab run."""
    mlflow = _mlflow()
    refs = find_runs(runs)  # every path checked before MLflow is touched
    problem = sqlite_problem(tracking_uri)
    if problem is not None:
        raise SpecError.at(["--tracking-uri"], f"{tracking_uri}: {problem}")
    remote = tracking_uri.lower().startswith(("http://", "https://"))
    try:
        with bounded_http() if remote else contextlib.nullcontext():
            return _export(mlflow, refs, tracking_uri, experiment, registry, report)
    except mlflow.exceptions.MlflowException as exc:  # e.g. a store it cannot open
        message = " ".join(str(exc.message).split())
        if remote and _unreachable(message):
            raise SpecError.at(["--tracking-uri"], _no_answer(tracking_uri, message)) from None
        raise SpecError.at(["--tracking-uri"], f"{tracking_uri}: MLflow says: {message}"
                           ) from None
    except OSError as exc:  # the HTTP library's connection errors
        raise SpecError.at(["--tracking-uri"], _no_answer(tracking_uri, str(exc))) from None
    except Exception as exc:  # the database layer under MLflow's store refused it
        if type(exc).__module__.split(".")[0] not in ("sqlalchemy", "alembic"):
            raise
        first = " ".join(str(getattr(exc, "orig", None) or exc).split())[:300]
        raise SpecError.at(["--tracking-uri"], f"{tracking_uri}: not a usable MLflow store "
                           f"({type(exc).__name__}: {first}); name another database file or "
                           "a tracking server") from None


#: the first bytes of every SQLite database file
SQLITE_HEADER = b"SQLite format 3\x00"


#: tables every MLflow SQLite store has
MLFLOW_TABLES = frozenset({"experiments", "runs", "metrics", "params", "alembic_version"})


def _tables(path: Path) -> set[str]:
    """The tables of the SQLite database ``path``, read without writing (empty when it
    cannot be read: MLflow then says why)."""
    import sqlite3

    try:
        db = sqlite3.connect(f"{path.resolve().as_uri()}?mode=ro", uri=True)
        try:
            return {name for (name,) in db.execute(
                "SELECT name FROM sqlite_master WHERE type = 'table'")}
        finally:
            db.close()
    except sqlite3.Error:
        return set()


def sqlite_problem(uri: str) -> str | None:
    """Why an ``sqlite:///PATH`` tracking URI cannot hold MLflow's store (None: it can, or
    the URI is not SQLite): a folder, a file that is not an SQLite database, a folder that
    does not exist."""
    if not uri.lower().startswith("sqlite:///"):
        return None
    path = Path(uri[len("sqlite:///"):].split("?")[0])
    if path.is_dir():
        return f"{path} is a folder; name a database file (it is made if missing)"
    if path.is_file() and path.stat().st_size:
        try:
            with open(path, "rb") as f:
                head = f.read(len(SQLITE_HEADER))
        except OSError as exc:
            return f"cannot read {path}: {exc.strerror or exc}"
        if head != SQLITE_HEADER:
            return (f"{path} is not an SQLite database; name an MLflow database or a new "
                    "file (it is made), or move this one away")
        tables = _tables(path)
        if tables and not MLFLOW_TABLES <= tables:
            return (f"{path} is another program's SQLite database (tables: "
                    f"{', '.join(sorted(tables)[:5])}), not MLflow's; MLflow would add its "
                    "tables to it: name an MLflow database or a new file")
    elif not path.exists() and not path.parent.is_dir():
        return f"the folder {path.parent} does not exist; make it or name another file"
    return None


#: MLflow's HTTP settings while exporting to a tracking server, unless already set in the
#: environment: a few quick retries, so an unreachable server fails in seconds (MLflow's own
#: defaults, 7 retries with backoff and a 120 s timeout, wait minutes)
HTTP_LIMITS = {"MLFLOW_HTTP_REQUEST_MAX_RETRIES": "2", "MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR": "1",
               "MLFLOW_HTTP_REQUEST_BACKOFF_JITTER": "0", "MLFLOW_HTTP_REQUEST_TIMEOUT": "10"}


@contextlib.contextmanager
def bounded_http() -> Iterator[None]:
    """:data:`HTTP_LIMITS` in ``os.environ`` for the block (variables already set win)."""
    added = {k: v for k, v in HTTP_LIMITS.items() if k not in os.environ}
    os.environ.update(added)
    try:
        yield
    finally:
        for key in added:
            os.environ.pop(key, None)


def _unreachable(message: str) -> bool:
    return any(s in message for s in ("Max retries exceeded", "Connection refused",
                                      "Failed to establish", "timed out", "Name or service",
                                      "ConnectionError", "ConnectTimeout"))


def _no_answer(uri: str, message: str) -> str:
    retries = os.environ.get("MLFLOW_HTTP_REQUEST_MAX_RETRIES",
                             HTTP_LIMITS["MLFLOW_HTTP_REQUEST_MAX_RETRIES"])
    timeout = os.environ.get("MLFLOW_HTTP_REQUEST_TIMEOUT",
                             HTTP_LIMITS["MLFLOW_HTTP_REQUEST_TIMEOUT"])
    reason = next((r for r in ("Connection refused", "timed out", "Name or service not known")
                   if r in message), message[:200])
    return (f"{uri}: the tracking server does not answer ({reason}; tried {int(retries) + 1} "
            f"time(s), {timeout} s timeout each; MLFLOW_HTTP_REQUEST_MAX_RETRIES and "
            "MLFLOW_HTTP_REQUEST_TIMEOUT change that); check the URI and that the server runs")


def _export(mlflow: Any, refs: list[RunRef], tracking_uri: str, experiment: str | None,
            registry: Registry | None, report: bool) -> Logged:
    client = mlflow.MlflowClient(tracking_uri=tracking_uri)
    logged = Logged()
    for ref in refs:
        data = load_run(ref.store)
        data.meta = replace(data.meta, run=ref.label)
        name = experiment or data.meta.experiment or ref.label
        found = client.get_experiment_by_name(name)
        logged.experiment_id = (found.experiment_id if found else client.create_experiment(
            name, artifact_location=_artifact_location(tracking_uri)))
        _export_run(client, mlflow, ref, data, logged, registry, report)
    return logged


def _export_run(client: Any, mlflow: Any, ref: RunRef, data: RunData, logged: Logged,
                registry: Registry | None, report: bool) -> None:
    existing = _existing(client, logged.experiment_id)
    parent_content = {"params": {"experiment": data.meta.experiment, "run": ref.label},
                      "metrics": {}, "status": "FINISHED",
                      "tags": {UNIT_TAG: ref.label, KIND_TAG: "run"}}
    parent = existing.get(ref.label)
    changed = parent is None
    if parent is None:
        parent_id = _log(client, mlflow, logged.experiment_id, parent_content, None, None,
                         ref.label)
    else:
        parent_id = parent.info.run_id
    specs = dict(zip(data.variants["name"], data.variants["spec"]))
    pairs = data.rows[["variant", "seed"]].drop_duplicates()
    for variant, seed in zip(pairs["variant"], pairs["seed"]):
        content = unit_content(data, variant, int(seed))
        content["tags"][DIGEST_TAG] = _digest(content)
        unit = content["tags"][UNIT_TAG]
        old = existing.get(unit)
        if old is not None and old.data.tags.get(DIGEST_TAG) == content["tags"][DIGEST_TAG]:
            logged.runs[unit] = old.info.run_id
            logged.unchanged += 1
            continue
        if old is not None:
            client.delete_run(old.info.run_id)
            logged.replaced += 1
        else:
            logged.created += 1
        changed = True
        logged.runs[unit] = _log(client, mlflow, logged.experiment_id, content,
                                 specs.get(variant), parent_id, f"{variant} seed {seed}")
    logged.runs[ref.label] = parent_id
    if report and changed:
        from ..plugin.registry import get_registry
        from ..report import write_report

        with tempfile.TemporaryDirectory() as tmp:
            write_report([ref.store], Path(tmp), registry=registry or get_registry())
            client.log_artifacts(parent_id, tmp, "report")
