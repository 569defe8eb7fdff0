"""What every ``variantlab`` command shares: exit codes, the bad-input wrapper (messages on
stderr, exit 2, never a traceback) and the common options."""

from __future__ import annotations

import functools
import sys
from collections.abc import Callable
from typing import Any

import click
from rich.markup import escape

from ..errors import PluginLoadError, SpecError, format_loc
from .fmt import consoles

EXIT_OK, EXIT_FAILED, EXIT_INPUT, EXIT_WRITE = 0, 1, 2, 3  # 130 (interrupted): RunSummary.exit_code


def input_messages(exc: BaseException) -> list[str]:
    """One line per problem for InputError / SpecError / PluginLoadError / missing files."""
    messages = getattr(exc, "messages", None)
    if messages:
        return [str(m) for m in messages]
    if isinstance(exc, SpecError):
        return [f"{format_loc(i.loc)}: {i.message}" for i in exc.issues]
    if isinstance(exc, FileNotFoundError) and exc.filename:
        return [f"{exc.filename}: no such file"]
    return [str(exc)]


def _input_error_types() -> tuple[type[BaseException], ...]:
    from ..errors import InputError  # not from config.experiment: torch (SystemExit
    from ..store.store import StoreError  # passes through here too)

    return (SpecError, PluginLoadError, FileNotFoundError, InputError, StoreError)


def bad_input_exits(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Turn bad input into its messages on stderr and exit code 2."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except _input_error_types() as exc:
            _, err = consoles()
            for line in input_messages(exc):
                err.print(escape(line), soft_wrap=True)
            sys.exit(EXIT_INPUT)

    return wrapper


max_variants_option = click.option(
    "--max-variants", type=click.IntRange(min=1), default=10_000, show_default=True,
    metavar="N", help="Refuse a grid of more variants than N (counted before expanding).",
)
plugin_option = click.option(
    "--plugin", "plugins", multiple=True, metavar="MODULE_OR_FILE.py",
    help="Extra plugin module (import name or .py file); repeatable.",
)
