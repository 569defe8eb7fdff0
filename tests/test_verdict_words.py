"""Issue 37.1: verdict words are rendered from the claims rows only.

The report package's string literals (docstrings aside) are scanned for the verdict words;
one may appear only in :mod:`variantlab.report.words` (the renderer) or in a module listed in
ALLOWED (each says why its words are no verdict). A listed module that no longer has such a
literal must leave the list.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

REPORT = Path(__file__).resolve().parent.parent / "variantlab" / "report"
WORDS = re.compile(r"\b(faster|slower|beats|loses|better|worse|best|matters|holds|flips|"
                   r"lower than|higher than)\b", re.IGNORECASE)

ALLOWED = {
    "words.py": "the one renderer: every sentence here says a claims row's verdict",
    "claims.py": "the rows themselves: 'best at an edge' is the caveat naming a chosen setting",
    "builtin/training.py": "'best loss' is a metric (the lowest step loss), not a comparison",
    "fair/conditions.py": "'at its best setting' names the chosen setting, not a verdict",
    "findings_table.py": "'holds' is the verb of an error message (which CSV holds a number)",
    "tables.py": "'better' is the summary column giving each metric's direction",
    "learned.py": "'no variant is named best' withholds a verdict when nothing was learned",
    "fair/compare.py": "'best setting' names each variant's chosen setting and '(lower) is "
                       "better' the metric's direction; its ranking sentences are rendered "
                       "from ranking rows (words.ranking_phrase)",
}
def verdict_literals(source: str) -> list[tuple[int, str]]:
    """``(line, word)`` for each verdict word in a string literal of ``source`` that is not
    a docstring (f-strings' literal parts included)."""
    tree = ast.parse(source)
    docs = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) \
                and node.body and isinstance(node.body[0], ast.Expr) \
                and isinstance(node.body[0].value, ast.Constant):
            docs.add(id(node.body[0].value))
    return sorted((node.lineno, m.group(0)) for node in ast.walk(tree)
            if isinstance(node, ast.Constant) and isinstance(node.value, str)
            and id(node) not in docs for m in WORDS.finditer(node.value))


def _hits() -> dict[str, list[tuple[int, str]]]:
    out = {}
    for path in sorted(REPORT.rglob("*.py")):
        found = verdict_literals(path.read_text(encoding="utf-8"))
        if found:
            out[path.relative_to(REPORT).as_posix()] = found
    return out


def test_the_scanner_finds_verdict_words_in_literals_only():
    source = ('"""A docstring: slower than, best."""\n'
              'def f(a, b):\n'
              '    """faster."""\n'
              '    x = "best"  # a comment: beats\n'
              '    return f"{a} is 2x faster than {b}; it holds", "lower thanks", "Lower than"\n')
    assert verdict_literals(source) == [(4, "best"), (5, "Lower than"), (5, "faster"),
                                        (5, "holds")]


def test_verdict_words_appear_only_where_rows_are_rendered():
    hits = _hits()
    stray = {m: h[:3] for m, h in hits.items() if m not in ALLOWED}
    assert not stray, f"verdict words outside words.py (render them from claims rows): {stray}"
    assert "findings.py" not in hits  # the speed words are rendered from timing rows
    ranked = {w.lower() for _, w in hits["fair/compare.py"]}
    assert ranked <= {"best", "better"}, ranked  # no beats/loses outside words.py


def test_every_listed_module_still_needs_its_place():
    hits = _hits()
    gone = sorted(m for m in ALLOWED if m not in hits)
    assert not gone, f"no verdict word left in {gone}: take them off the lists"
