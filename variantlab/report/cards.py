"""Verdict cards: the report's answer first, one card per condition (issue 40.1).

A card reads the ``pair`` rows of one condition of the claims (:mod:`.claims`) and says each
with :func:`.words.phrase`, the one renderer of verdict words: nothing here decides a
verdict. Its rows go clear first (``lower`` / ``higher``), then ``equal within ±δ``, ``not
clearly different``, ``unresolved`` and ``not estimated``, each with its caveats; past
:data:`.words.MAX_SAID` rows the card counts the rest (they are in verdicts.csv). A report
without a pair (one variant, or no headline value on shared seeds), or whose claims failed to
compute, gets one card that says so.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import pandas as pd

from .claims import CLEAR
from .words import MAX_SAID, pairs_of, phrase

#: a row's place on its card, by its verdict word (the HTML card's style class too)
ORDER = ("clear", "equal", "unsure", "unresolved", "none")


@dataclass(frozen=True)
class Entry:
    """One row on a card: its verdict word, its place (:data:`ORDER`), its sentence and its
    caveats."""

    verdict: str
    kind: str
    text: str
    caveats: str


@dataclass(frozen=True)
class Card:
    """One condition's verdicts: a title, what the rows measure, its entries and a count of
    the rows left off."""

    title: str
    about: str
    entries: tuple[Entry, ...]
    more: str = ""


def kind_of(verdict: str) -> str:
    """A verdict word's place on a card (:data:`ORDER`)."""
    if verdict in CLEAR:
        return "clear"
    if verdict.startswith("equal"):
        return "equal"
    return {"not clearly different": "unsure", "unresolved": "unresolved"}.get(verdict, "none")


def card_of(claims: pd.DataFrame, condition: str) -> Card:
    """The card of one ``condition`` of ``claims`` (module docstring)."""
    rows = pairs_of(claims, condition)
    entries = sorted((Entry(str(r.verdict), kind_of(str(r.verdict)), phrase(r),
                            r.caveats if isinstance(r.caveats, str) else "")
                      for r in rows.itertuples()),
                     key=lambda e: ORDER.index(e.kind))  # stable: the rows' order within a kind
    n = len(entries)
    metric = str(rows["metric"].iloc[0]) if n else ""
    about = (f"{metric}: a minus b, 95% interval; Holm over {n} pair{'s' if n != 1 else ''}"
             if n else "")
    more = (f"and {n - MAX_SAID} more pairs in verdicts.csv" if n > MAX_SAID else "")
    return Card(condition or "All variants", about, tuple(entries[:MAX_SAID]), more)


def verdict_cards(claims: pd.DataFrame, variants: Sequence[str] = (),
                  n_seeds: int = 0, failed: bool = False) -> list[Card]:
    """One card per condition of the claims' pair rows, in their order; without a pair, one
    card that says why there is no verdict (``variants``: the report's variants, ``n_seeds``:
    its seeds; ``failed``: computing the claims raised, and the report lists it)."""
    if failed:
        return [Card("No comparison", "", (Entry("no comparison", "none",
                     "The comparisons could not be computed (see Parts that failed), so this "
                     "report gives no verdict.", ""),))]
    pairs = pairs_of(claims)
    if len(pairs):
        return [card_of(claims, str(c)) for c in dict.fromkeys(pairs["condition"])]
    named = ", ".join(variants[:MAX_SAID]) + (", …" if len(variants) > MAX_SAID else "")
    ran = (f"{len(variants)} variant{'s' if len(variants) != 1 else ''}"
           + (f" ({named})" if named else "")
           + f", {n_seeds} seed{'s' if n_seeds != 1 else ''}")
    text = (f"{ran}: no pair was compared, so there is no verdict (a verdict needs two "
            "variants with a headline value on the same seeds).")
    return [Card("No comparison", "", (Entry("no comparison", "none", text, ""),))]


__all__ = ["ORDER", "Card", "Entry", "card_of", "kind_of", "verdict_cards"]
