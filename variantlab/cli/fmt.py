"""Rich formatting for the CLI: consoles, progress, run summaries, module trees, tables.

Everything here turns the library's data (events, summaries, rows, modules) into text; none
of it computes a number.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from rich.console import Console
from rich.markup import escape
from rich.table import Table
from rich.tree import Tree

if TYPE_CHECKING:
    from rich.progress import Progress

    from ..config.measure import MeasureSpec
    from ..model.specs import ModelSpec
    from ..plugin.registry import Registry


def consoles() -> tuple[Console, Console]:
    """stdout and stderr consoles; wide and plain when not writing to a terminal."""
    out = Console(highlight=False)
    err = Console(stderr=True, highlight=False)
    for c in (out, err):
        if not c.is_terminal:
            c.width = 200
    return out, err


class ProgressReporter:
    """A rich progress bar on a terminal, one plain line per unit otherwise."""

    def __init__(self, console: Console) -> None:
        self.console = console
        self.progress: Progress | None = None
        self.task: Any = None

    def __enter__(self) -> Callable[[Any], None]:
        if self.console.is_terminal:
            from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

            self.progress = Progress(TextColumn("{task.description}"), BarColumn(),
                                     MofNCompleteColumn(), TimeElapsedColumn(),
                                     console=self.console)
            self.progress.start()
        return self.on_event

    def __exit__(self, *exc: object) -> None:
        if self.progress is not None:
            self.progress.stop()

    def on_event(self, event: Any) -> None:
        title = escape(event.unit.title)
        if self.progress is not None:
            if self.task is None:
                self.task = self.progress.add_task("", total=event.total)
            if event.kind == "start":
                self.progress.update(self.task, description=title)
            else:
                self.progress.advance(self.task)
            if event.kind == "failed":
                self.progress.console.print(f"[red]failed[/] {title}: {escape(event.error or '')}")
            return
        if event.kind == "start":
            return
        where = f"[{event.index + 1}/{event.total}]"
        if event.kind == "skipped" and event.shared_with is not None:
            self.console.print(f"{where} {title}: shared with variant "
                               f"{escape(event.shared_with)} (same unit key)")
        elif event.kind == "skipped":
            self.console.print(f"{where} {title}: stored already")
        elif event.kind == "ok":
            self.console.print(f"{where} {title}: ok ({event.duration_s:.2f}s)")
        else:
            self.console.print(f"{where} {title}: FAILED {escape(event.error or '')}",
                               soft_wrap=True)


def print_summary(stdout: Console, err: Console, summary: Any) -> None:
    shared = getattr(summary, "shared", 0)
    parts = [f"{summary.done} computed"] + (
        [f"{shared} shared with another variant"] if shared else []) + [
        f"{summary.skipped - shared} stored already", f"{len(summary.failed)} failed"]
    if summary.not_run:
        parts.append(f"{summary.not_run} not run")
    stdout.print(f"{summary.total} unit(s): " + ", ".join(parts))
    for note in getattr(summary, "warnings", ()):
        err.print(f"warning: {escape(note)}", soft_wrap=True)
    for unit, error in summary.failed:
        err.print(f"failed: {escape(unit.title)}: {escape(error)}", soft_wrap=True)
    if summary.failed:
        err.print("Tracebacks are in the store (units.traceback); rerun to retry failed units.")
    if summary.interrupted:
        err.print("interrupted: finished units are stored; run again to continue.")
    if getattr(summary, "write_error", None):
        err.print(f"stopped: {escape(summary.write_error)}; the units stored before are intact. "
                  "Free some space (or fix the permissions) or choose another --out, then run "
                  "again: only the missing units are computed.", soft_wrap=True)
    stdout.print(f"results: {summary.store}")


def unique_count(module: Any) -> int:
    return sum(p.numel() for p in {id(p): p for p in module.parameters()}.values())


def module_tree(model: Any) -> Any:
    """Modules with their slot tags and parameter counts; identical siblings folded."""
    def text(name: str, m: Any, n: int) -> str:
        slot, kind = getattr(m, "variantlab_slot", None), getattr(m, "variantlab_kind", None)
        tag = f" [{slot}={kind}]" if slot and kind else (f" [{slot}]" if slot else "")
        times = f"{n} x " if n > 1 else ""
        each = " each" if n > 1 else ""
        return escape(f"{name}: {times}{type(m).__name__}{tag}  {unique_count(m):,} params{each}")

    def add(node: Any, module: Any) -> None:
        children = list(module.named_children())
        i = 0
        while i < len(children):
            name, child = children[i]
            sig, j = repr(child), i + 1
            while j < len(children) and repr(children[j][1]) == sig:
                j += 1
            shown = name if j - i == 1 else f"{name}-{children[j - 1][0]}"
            add(node.add(text(shown, child, j - i)), child)
            i = j

    root = Tree(text("model", model, 1))
    add(root, model)
    return root


def param_table(rows: Sequence[dict]) -> Table:
    table = Table()
    for col in ("scope", "what", "count"):
        table.add_column(col, justify="right" if col == "count" else "left")
    for r in rows:
        if r["scope"] == "model":
            what = r["metric"]
        elif r["scope"] == "layer":
            what = f"layer {r['layer']}" + (f" {r['name']}" if r.get("name") else "")
        else:
            what = r.get("name") or r["metric"]
        table.add_row(escape(r["scope"]), escape(str(what)), f"{int(r['value']):,}")
    return table


def layer_table(rows: Sequence[dict]) -> Table:
    """The layer table of a model with a layout (:func:`variantlab.model.layout.layer_rows`)."""
    table = Table()
    for col in rows[0]:
        table.add_column(col, justify="right" if col == "layer" else "left")
    for r in rows:
        table.add_row(*(escape(str(v)) for v in r.values()))
    return table


def param_line(p: dict) -> str:
    """``name: type = default — description`` of one parameter row."""
    line = f"{p['name']}: {p.get('type', '')}"
    if p.get("default") is not None:
        line += f" = {p['default']!r}"
    if p.get("description"):
        line += f" \N{EM DASH} {p['description']}"
    return line


def plugins_table(rows: Sequence[dict]) -> Table:
    """One row per registered kind: what it is and one line per parameter."""
    table = Table(show_lines=True)
    table.add_column("slot", no_wrap=True)
    table.add_column("kind", no_wrap=True)
    table.add_column("description", overflow="fold", ratio=2)
    table.add_column("parameters", overflow="fold", ratio=3)
    table.add_column("plugin", overflow="fold")
    for r in rows:
        params = "\n".join(param_line(p) for p in r.get("params", []))
        table.add_row(escape(r["slot"]), escape(r["kind"]), escape(r.get("doc", "")),
                      escape(params), escape(r["plugin"]))
    return table


def memory_lines(spec: ModelSpec, registry: Registry, measure: MeasureSpec | None) -> list[str]:
    """``describe``'s estimate: parameters, then the memory each probe needs on its device
    (:mod:`variantlab.sweep.sizeguard`, nothing allocated)."""
    from ..sweep.sizeguard import EstimateError

    try:
        return _memory_lines(spec, registry, measure)
    except EstimateError as exc:
        return [f"memory: no estimate ({exc})"]


def _memory_lines(spec: ModelSpec, registry: Registry, measure: MeasureSpec | None) -> list[str]:
    from ..sweep.sizeguard import available_bytes, footprint, model_cost
    from ..sweep.units import resolve_device

    cost = model_cost(spec, registry)
    lines = [f"parameters: {cost.params:,} ({human_bytes(cost.param_bytes)})"]
    for probe, settings in (measure.probes().items() if measure is not None else ()):
        device = resolve_device(probe, settings, None) or "cpu"
        fp = footprint(spec, registry, probe, settings, device)
        free = available_bytes(device)
        short = f"; does not fit: {device} has {human_bytes(free)} available" if (
            free is not None and fp.total > free) else ""
        lines.append(f"memory {probe} on {device}: {fp.describe()}{short}")
    return lines


def human_bytes(n: int) -> str:
    from ..sweep.sizeguard import human

    return human(n)
