"""``variantlab findings REPORTS``: the findings table rendered from the committed reports
(:mod:`variantlab.report.findings_table`), printed or written between the markers of
README.md and docs/findings.md."""

from __future__ import annotations

import sys
from collections.abc import Sequence
from pathlib import Path

import click
from rich.markup import escape

from .base import EXIT_WRITE, bad_input_exits
from .fmt import consoles


@click.command("findings")
@click.argument("reports", type=click.Path())
@click.option("--experiments", type=click.Path(file_okay=False), default=None, metavar="DIR",
              help="The experiment YAML files, NAME.yaml per report folder NAME (default: "
                   "experiments/ beside REPORTS).")
@click.option("--write", "targets", multiple=True, type=click.Path(dir_okay=False),
              metavar="FILE", help="Replace the table between <!-- findings:start --> and "
                                   "<!-- findings:end --> in FILE (repeatable) instead of "
                                   "printing it.")
@bad_input_exits
def findings_cmd(reports: str, experiments: str | None, targets: Sequence[str]) -> None:
    """Render the findings table of the reports in REPORTS (one row per report folder).

    Each row: the experiment's question, the verdicts of its verdicts.csv on the headline
    test metric per condition, sizes, budget and running time (docs/findings.md).
    """
    from ..config.yamlio import YamlError
    from ..errors import InputError
    from ..report.findings_table import findings, findings_markdown, replace_table

    stdout, err = consoles()
    try:
        table = findings_markdown(findings(reports, experiments))
    except YamlError as exc:
        raise InputError(exc.messages) from None
    if not targets:
        click.echo(table, nl=False)
        return
    texts = {}
    for target in targets:
        try:
            texts[target] = replace_table(Path(target).read_text(encoding="utf-8"), table, target)
        except OSError as exc:
            raise InputError([f"{target}: cannot read it ({exc.strerror}); give a Markdown "
                              "file with the findings markers"]) from None
    for target, text in texts.items():
        try:
            Path(target).write_text(text, encoding="utf-8")
        except OSError as exc:
            err.print(f"{escape(target)}: cannot write it ({escape(exc.strerror or str(exc))})",
                      soft_wrap=True)
            sys.exit(EXIT_WRITE)
        stdout.print(f"wrote the findings table into {escape(target)}", soft_wrap=True)
