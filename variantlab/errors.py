"""Errors that point at the input: every issue carries the key path it is about."""

from __future__ import annotations

import difflib
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

Loc = tuple  # key path: str keys and int list indices


def format_loc(loc: Sequence[object]) -> str:
    """``("model", "layers", 0, "eps")`` -> ``model.layers[0].eps``."""
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += ("." if out else "") + str(part)
    return out or "(top level)"


@dataclass(frozen=True)
class SpecIssue:
    loc: Loc
    message: str

    def __str__(self) -> str:
        return f"{format_loc(self.loc)}: {self.message}"


class SpecError(ValueError):
    """Bad input: one or more issues, each with the key path it is about."""

    def __init__(self, issues: Iterable[SpecIssue]):
        self.issues = list(issues)
        super().__init__("\n".join(str(i) for i in self.issues))

    @classmethod
    def at(cls, loc: Sequence[object], message: str) -> SpecError:
        return cls([SpecIssue(tuple(loc), message)])


def unknown_name_message(what: str, name: object, choices: Sequence[str]) -> str:
    """``unknown norm 'layr'; did you mean 'layer'? Registered: batch, layer, none, rms``."""
    close = difflib.get_close_matches(str(name), list(choices), n=1, cutoff=0.5)
    hint = f"; did you mean {close[0]!r}?" if close else "."
    listed = ", ".join(sorted(choices)) or "(none)"
    return f"unknown {what} {name!r}{hint} Registered: {listed}"


#: Strict specs refuse what pydantic would otherwise coerce; say what was written and how.
_COERCE_HINTS = {
    "int_type": "write a whole number without quotes or a decimal point (16, not \"16\", "
                "16.0 or true)",
    "float_type": "write a number without quotes (0.001 or 1.0e-3, not \"1e-3\" or true)",
    "bool_type": "write true or false without quotes",
    "string_type": "write text (quote it if it looks like a number or a date)",
}


def _yaml_repr(value: object) -> str:
    """How a YAML value reads: true/false/null, quoted strings, numbers as written."""
    if isinstance(value, bool):
        return f"{str(value).lower()} (a boolean)"
    if value is None:
        return "null"
    if isinstance(value, str):
        return f"{value!r} (a string)"
    kind = type(value).__name__
    return f"{value!r} (a {'number' if kind in ('int', 'float') else kind})"


def pydantic_issues(
    exc, prefix: Sequence[object] = (), known: Sequence[str] = ()
) -> list[SpecIssue]:
    """Turn a pydantic ``ValidationError`` into key-path issues; ``known`` are the valid
    top-level keys, used to suggest a spelling for an unknown one."""
    issues = []
    for err in exc.errors(include_url=False):
        loc = tuple(prefix) + tuple(err["loc"])
        raised = (err.get("ctx") or {}).get("error")
        if isinstance(raised, SpecError):  # a validator's own key paths, below this one
            issues += [SpecIssue(loc + i.loc, i.message) for i in raised.issues]
            continue
        msg = err["msg"].removeprefix("Value error, ")
        if err["type"] == "extra_forbidden":
            key = err["loc"][-1]
            valid = list(known) if len(err["loc"]) == 1 else []
            close = difflib.get_close_matches(str(key), valid, n=1, cutoff=0.6)
            hint = f"did you mean {close[0]!r}?" if close else "remove it or check its spelling."
            msg = f"unknown key {key!r}; {hint}"
            if valid:
                msg += f" Valid keys: {', '.join(valid)}"
        elif err["type"] == "string_pattern_mismatch":
            msg += f", got {err.get('input')!r}"
        elif err["type"] in _COERCE_HINTS:
            msg += f", got {_yaml_repr(err.get('input'))}; {_COERCE_HINTS[err['type']]}"
        issues.append(SpecIssue(loc, msg))
    return issues


class PluginLoadError(RuntimeError):
    """A plugin that could not be imported or registered, named explicitly or in strict mode."""


class DuplicateKindError(PluginLoadError):
    """The same kind registered twice in one slot."""


class InputError(Exception):
    """Bad input (exit code 2 in the CLI); each message is ``FILE:LINE:COL: key.path: ...``."""

    def __init__(self, messages: Sequence[str]):
        self.messages = list(dict.fromkeys(messages))
        super().__init__("\n".join(self.messages))
