"""The ``variantlab`` commands that look, not compute: describe, plugins, schema, families."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import click
from rich.markup import escape

from ..errors import SpecError
from ..plugin.registry import LISTED
from .base import bad_input_exits, max_variants_option, plugin_option
from .fmt import consoles, module_tree, param_table, plugins_table

if TYPE_CHECKING:
    from torch import nn

    from ..model.specs import ModelSpec
    from ..plugin.registry import Registry

MAX_TREE_LAYERS = 1000  # describe prints no module tree for deeper models


# -- describe ----------------------------------------------------------------------------
@click.command()
@click.argument("path", type=click.Path(dir_okay=False))
@max_variants_option
@plugin_option
@click.option("--yaml", "as_yaml", is_flag=True,
              help="print each variant's spec as experiment YAML instead")
@bad_input_exits
def describe(path: str, max_variants: int, plugins: Sequence[str], as_yaml: bool = False) -> None:
    """Print each variant's memory estimate, module tree and parameter breakdown
    (EXPERIMENT or bare model). Models are built on the meta device: nothing is allocated."""
    import warnings

    from ..config.experiment import load_model_doc
    from ..model.layout import layer_rows
    from ..probes.params import count_rows
    from .fmt import layer_table, memory_lines

    stdout, _ = consoles()
    variants, registry, exp = load_model_doc(path, extra_plugins=plugins,
                                             max_variants=max_variants)
    if as_yaml:
        from ..config.yamlio import spec_yaml

        for v in variants:
            click.echo(spec_yaml(v.spec, name=v.name), nl=False)
            click.echo("---" if v is not variants[-1] else "", nl=v is not variants[-1])
        return
    for v in variants:
        title = escape(f"{v.name} ({v.label})")
        if stdout.is_terminal:
            stdout.rule(title, align="left")
        else:
            stdout.print(f"== {title} ==")
        for w in v.warnings:
            stdout.print(f"warning: {escape(w)}", soft_wrap=True)
        for line in memory_lines(v.spec, registry, exp.measure if exp else None):
            stdout.print(escape(line), soft_wrap=True)
        if v.spec.layout is not None and v.spec.n_layers <= MAX_TREE_LAYERS:
            stdout.print(layer_table(layer_rows(v.spec)))
        if v.spec.n_layers > MAX_TREE_LAYERS:
            stdout.print(f"(module tree left out: n_layers {v.spec.n_layers:,} > "
                         f"{MAX_TREE_LAYERS})")
            continue
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            model = _build_on_meta(v.spec, registry)
        stdout.print(module_tree(model))
        stdout.print(param_table(list(map(dict, count_rows(model)))))


def _build_on_meta(spec: ModelSpec, registry: Registry) -> nn.Module:
    """The model on the meta device (no memory); on CPU when a plugin cannot build on meta."""
    import torch

    from ..model.build import build_model

    try:
        with torch.device("meta"):
            return build_model(spec, registry)
    except Exception:
        torch.manual_seed(0)
        return build_model(spec, registry)


# -- plugins -----------------------------------------------------------------------------
@click.command("plugins")
@click.option("--slot", type=click.Choice(LISTED), default=None,
              help="Only this slot (or probe, executor).")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@plugin_option
@bad_input_exits
def plugins_cmd(slot: str | None, as_json: bool, plugins: Sequence[str]) -> None:
    """List registered components, probes and executors with their parameters, and plugins
    that failed to load.

    Each kind shows what it is (its spec's docstring) and one line per parameter:
    ``name: type = default — description``.
    """
    from ..config.catalog import failure_rows, plugin_rows
    from ..plugin.registry import build_registry

    stdout, _ = consoles()
    registry = build_registry(extra=plugins, base_dir=Path.cwd())
    rows, failures = plugin_rows(registry, slot), failure_rows(registry)
    if as_json:
        click.echo(json.dumps({"components": rows, "failures": failures}, indent=2,
                              default=str))
        return

    stdout.print(plugins_table(rows))
    if failures:
        stdout.print("[bold]plugins that failed to load[/]")
        for f in failures:
            stdout.print(f"{escape(f['plugin'])} ({escape(f['source'])}): {escape(f['error'])}",
                         soft_wrap=True)


# -- schema ------------------------------------------------------------------------------
@click.command("schema")
@click.option("--out", type=click.Path(dir_okay=False), default=None, metavar="FILE",
              help="Write the schema to FILE instead of printing it.")
@plugin_option
@bad_input_exits
def schema_cmd(out: str | None, plugins: Sequence[str]) -> None:
    """Print the JSON Schema of the experiment file, registered kinds included.

    Editors use it for completion and checks (yaml-language-server: see docs/experiments.md).
    Installed plugins are included; pass those that experiments name in `plugins:` with
    --plugin.
    """
    from ..config.schema import schema_json, write_schema
    from ..plugin.registry import build_registry

    registry = build_registry(extra=plugins, base_dir=Path.cwd())
    if out is None:
        click.echo(schema_json(registry), nl=False)
        return
    try:
        path = write_schema(out, registry)
    except OSError as exc:
        raise SpecError.at(("--out",), f"cannot write {out}: {exc.strerror or exc}; "
                                       "choose a writable file path") from None
    consoles()[0].print(f"schema: {escape(str(path))}")


# -- families ----------------------------------------------------------------------------
@click.command("families")
@click.option("--markdown", "as_markdown", is_flag=True,
              help="The Markdown table docs/transformers.md shows.")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@bad_input_exits
def families_cmd(as_markdown: bool, as_json: bool) -> None:
    """List every causal-LM class of the installed transformers: converts both ways
    (from_transformers and to_transformers), import only, or refused with the reason
    (a transformers older than the one the conversions are checked against: none converts)."""
    try:
        import transformers  # noqa: F401
    except ImportError:
        raise SpecError.at(("transformers",), "transformers is not installed; install the "
                                              "hf extra (pip install 'variantlab[hf]')") from None
    from rich.table import Table

    from ..hf.families import families, markdown

    rows = families()
    if as_json:
        click.echo(json.dumps([{"class": r.cls, "converts": r.status, "reason": r.reason}
                               for r in rows], indent=2))
        return
    if as_markdown:
        click.echo(markdown(rows), nl=False)
        return
    table = Table("class", "converts", "why not")
    for r in rows:
        table.add_row(escape(r.cls), r.status, escape(r.reason))
    stdout = consoles()[0]
    stdout.print(table)
    stdout.print(markdown(rows).splitlines()[0])
    from ..hf.common import ConversionError, check_transformers

    try:
        check_transformers()
    except ConversionError as err:  # the listing still says what this release has
        stdout.print(f"[bold red]No class converts here:[/] {escape(str(err))}")
