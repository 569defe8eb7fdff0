"""Words rendered from the claims (:mod:`.claims`): the reading's verdict sentences, the
group letters of the tuned table, "holds" and "flips" across conditions.

Nothing here decides a verdict: each sentence says a row's ``verdict`` with its numbers.

- **Groups** (compact letter display, Piepho 2004's insert-and-absorb): two variants of a
  condition share a letter unless their row says ``lower`` or ``higher``; letters go in
  order of the reported mean, best first. A variant whose best setting is unresolved has
  no group.
- **Across conditions**, a pair *holds* when its row says the same clear verdict in every
  condition, and *flips* only when one condition's row says ``lower`` and another's
  ``higher`` (both intervals exclude 0, with opposite signs).
"""

from __future__ import annotations

import math
import string
from collections.abc import Sequence
from typing import Any

import pandas as pd

from ..config.metrics import finite as _finite
from .claims import AVERAGED, CLEAR, MAX_ARMS, seeds_frame, stored_doc
from .frame import ReportData
from .tables import apart, fmt

MAX_READING = 10  # bullets in a reading, at most
MAX_SAID = 6  # conditions (or pairs) named in one sentence


def pairs_of(claims: pd.DataFrame, condition: str | None = None, kind: str = "pair"
             ) -> pd.DataFrame:
    """The ``pair`` rows (or those of ``kind``; of one ``condition`` when given)."""
    mine = claims[claims["kind"] == kind]
    return mine if condition is None else mine[mine["condition"] == condition]


def groups(claims: pd.DataFrame, condition: str, order: Sequence[str]) -> dict[str, str]:
    """Variant -> its group letters within ``condition`` (module docstring); ``order``:
    the variants, best mean first."""
    if not order:
        return {}
    rows = pairs_of(claims, condition)
    rank = {v: k for k, v in enumerate(order)}
    apart = sorted({tuple(sorted((r.a, r.b), key=lambda v: rank.get(v, len(rank))))
                    for r in rows.itertuples() if r.verdict in CLEAR
                    and r.a in rank and r.b in rank}, key=lambda p: (rank[p[0]], rank[p[1]]))
    columns: list[set[str]] = [set(order)]
    for i, j in apart:
        grown: list[set[str]] = []
        for col in columns:
            if i in col and j in col:
                grown += [col - {i}, col - {j}]
            else:
                grown.append(col)
        columns = [c for c in grown if c and not any(c < d for d in grown)]
        columns = [c for k, c in enumerate(columns) if c not in columns[:k]]
    columns.sort(key=lambda c: sorted(rank[v] for v in c))
    letters = string.ascii_lowercase
    return {v: "".join(letters[k % 26] for k, c in enumerate(columns) if v in c)
            for v in order}


def _num(x: float) -> str:
    return fmt(float(x)) if _finite(x) else "—"


def up_to(row: Any) -> float:
    """The largest difference a row's 95% interval does not rule out."""
    low, high = row.low, row.high
    return max(abs(low), abs(high)) if _finite(low) and _finite(high) else math.nan


def phrase(row: Any) -> str:
    """One row said in words, with its numbers."""
    a, b, verdict = row.a, row.b, row.verdict
    est, low, high, n = row.estimate, row.low, row.high, row.n_seeds
    span = f"{_num(est)} [{_num(low)}, {_num(high)}]"
    solved = row.solved_share
    solved = f"; solved {solved}" if isinstance(solved, str) and solved else ""
    if verdict in CLEAR:
        return f"{a} {verdict} than {b} ({span}{solved})"
    if verdict.startswith("equal"):
        return (f"{a} and {b} {verdict} (90% interval [{_num(row.low90)}, "
                f"{_num(row.high90)}])")
    if verdict == "not clearly different":
        holm = getattr(row, "holm_p", math.nan)
        # an interval that excludes 0 on its own, undone by the correction for several pairs
        held = (f"; Holm-adjusted p {_num(holm)} over the condition's pairs"
                if _finite(low) and _finite(high) and (low > 0 or high < 0) and _finite(holm)
                else "")
        return (f"{a} and {b} not clearly different ({span}{held}; a difference up to "
                f"{_num(up_to(row))} is not ruled out{solved})")
    if verdict == "unresolved":
        return f"{a} vs {b} unresolved (a best setting at an edge of the sweep)"
    if n == 1:
        return (f"{a} {_num(row.a_mean)}, {b} {_num(row.b_mean)} (one seed: no interval, so "
                "no verdict)")
    return f"{a} vs {b} not estimated (no paired seeds)"


def condition_phrase(claims: pd.DataFrame, condition: str) -> str:
    """A condition's verdicts: clear and equal pairs named, the rest counted (``claims``:
    one family of rows, e.g. one metric's)."""
    rows = claims[claims["condition"] == condition]
    named = [r for r in rows.itertuples() if r.verdict in CLEAR or r.verdict.startswith("equal")
             or r.verdict == "unresolved"]
    unsure = [r for r in rows.itertuples() if r.verdict == "not clearly different"]
    missing = [r for r in rows.itertuples() if r.verdict == "not estimated"]
    said = [phrase(r) for r in named[:MAX_SAID]]
    if len(unsure) == 1 or (unsure and not said):
        shown = unsure[:max(1, MAX_SAID - len(said))]
        said += [phrase(r) for r in shown]
        if len(unsure) > len(shown):
            said.append(f"{len(unsure) - len(shown)} more pairs not clearly different "
                        "(verdicts.csv)")
    elif unsure:
        worst = max((up_to(r) for r in unsure if _finite(up_to(r))), default=math.nan)
        said.append(f"the other {len(unsure)} pairs not clearly different (differences up "
                    f"to {_num(worst)} not ruled out)")
    if len(missing) <= 3:
        said += [phrase(r) for r in missing]
    else:
        said.append(f"{len(missing)} pairs not estimated (one seed or no paired seeds)")
    where = f"{condition}: " if condition else ""
    return where + "; ".join(said)


def _by_condition(rows: pd.DataFrame) -> tuple[str, str]:
    """One family of rows (one metric's pairs) said condition by condition (at most
    MAX_SAID, the rest counted), and the Holm family they were adjusted over."""
    conds = list(dict.fromkeys(rows["condition"]))
    parts = [condition_phrase(rows, c) for c in conds[:MAX_SAID]]
    more = f"; and {len(conds) - MAX_SAID} more conditions in verdicts.csv" \
        if len(conds) > MAX_SAID else ""
    family = "Holm over each condition's pairs" if any(conds) else "Holm over all pairs"
    return " — ".join(parts) + more, family


def verdict_lines(claims: pd.DataFrame, question: str = "") -> list[str]:
    """The answer: every condition's pair verdicts in one sentence (with the question
    first when the experiment states one), then holds/flips across conditions."""
    pairs = pairs_of(claims)
    if not len(pairs):
        return []
    metric = str(pairs["metric"].iloc[0])
    conds = list(dict.fromkeys(pairs["condition"]))
    said, family = _by_condition(pairs)
    lead = f"{question.strip()} Answer: " if question else ""
    within = " within each condition" if any(conds) else ""
    arms = [len(set(p["a"]) | set(p["b"])) for _, p in pairs.groupby("condition", sort=False)]
    complete = all(len(pairs_of(claims, c)) == n * (n - 1) // 2 for c, n in zip(conds, arms))
    what = "every pair compared" if complete else (
        f"each variant against the baseline (more than {MAX_ARMS} compared)")
    line = f"{lead}On {metric}, {what}{within} (a minus b, 95% interval; {family}): {said}."
    return [line, *across_lines(claims)]


def length_lines(claims: pd.DataFrame) -> list[str]:
    """The ``length`` rows, one sentence per length: the pairs again on the metric scored
    beyond (or below) the training length, each at the setting chosen there."""
    rows = pairs_of(claims, kind="length")
    out = []
    for metric, mine in rows.groupby("metric", sort=False):
        said, family = _by_condition(mine)
        out.append(f"On {metric} (the same models, each at the setting chosen at the "
                   f"training length; {family}): {said}.")
    return out


def across_word(verdicts: Sequence[str]) -> str:
    """``flips`` when one verdict is ``lower`` and another ``higher``; ``holds`` when every
    one is the same clear verdict; else ``unclear`` (module docstring)."""
    said = set(verdicts)
    return ("flips" if set(CLEAR) <= said else
            "holds" if len(said) == 1 and said <= set(CLEAR) else "unclear")


def across_sizes_sentence(by_size: pd.DataFrame) -> str:
    """The reading's sentence on the effects-by-size rows whose ``across_sizes`` says
    ``flips`` (:func:`across_word`); empty when none does."""
    rows = by_size[by_size["across_sizes"] == "flips"] if len(by_size) else by_size
    said = list(dict.fromkeys(f"{r.axis}={r.value}" for r in rows.itertuples()))
    if not said:
        return ""
    return ("The sign of an effect flips across sizes for " + ", ".join(said[:4])
            + " (two sizes' intervals exclude 0 with opposite signs; averaged over the other "
            "axes, see Effects by size).")


def across_note(over: str) -> str:
    """The note under the Effects by size (``over="condition"``: condition) table: what its
    last column's words mean (:func:`across_word`)."""
    return (f"effect of each architecture axis value against its baseline value at each {over} "
            "(paired per seed, averaged within a seed over the other axes, 95% t-interval over "
            "seeds); 'holds' when every interval excludes 0 with one sign, 'flips' when two "
            f"exclude 0 with opposite signs, else 'unclear'. All rows are in "
            f"effects_by_{over}.csv.")


def across(claims: pd.DataFrame) -> dict[tuple[str, str], str]:
    """``(a, b)`` -> ``holds`` / ``flips`` / ``unclear`` for each pair compared in two or
    more conditions (module docstring)."""
    out = {}
    pairs = pairs_of(claims)
    for (a, b), part in pairs.groupby(["a", "b"], sort=False):
        if part["condition"].nunique() < 2:
            continue
        out[(str(a), str(b))] = across_word(list(part["verdict"]))
    return out


def across_lines(claims: pd.DataFrame) -> list[str]:
    """Whether each pair's verdict holds across conditions, in one sentence."""
    found = across(claims)
    if not found or not pairs_of(claims)["verdict"].isin(CLEAR).any():
        return []
    pairs = pairs_of(claims)
    said = []
    for (a, b), how in found.items():
        part = pairs[(pairs["a"] == a) & (pairs["b"] == b)]
        if how == "holds":
            said.append(f"{a} {part['verdict'].iloc[0]} than {b} in every condition (holds)")
        elif how == "flips":
            where = {v: ", ".join(part.loc[part["verdict"] == v, "condition"]) for v in CLEAR}
            said.append(f"{a} vs {b} flips: lower at {where['lower']}, higher at "
                        f"{where['higher']}")
    unclear = sum(1 for how in found.values() if how == "unclear")
    if unclear:
        said.append(f"{unclear} pair(s) without one clear verdict in every condition, so "
                    "nothing holds across conditions for them")
    return ["Across conditions: " + "; ".join(said[:MAX_SAID]) + "."]


def power_line(claims: pd.DataFrame) -> str | None:
    """Per condition, the smallest difference its seeds detect at 80% power (from the
    pooled spread of its pairs' paired differences) and the seeds that would detect δ."""
    from .stats import detectable, seeds_for

    pairs = pairs_of(claims)
    pairs = pairs[pairs["sd"].map(_finite)]
    if not len(pairs):
        return None
    said = []
    for cond, part in pairs.groupby("condition", sort=False):
        sd = math.sqrt(float((part["sd"] ** 2).mean()))
        n = int(part["n_seeds"].min())
        delta = float(part["delta"].iloc[0])
        need = seeds_for(sd, delta)
        needs = (f", ±{delta:g} would need {need:.0f}" if _finite(need) else
                 "" if not _finite(delta) else f", ±{delta:g} needs more than 1000")
        where = f"{cond}: " if cond else ""
        said.append(f"{where}{_num(detectable(sd, n))} with {n} seeds{needs}")
    return ("Smallest difference the seeds could detect (80% power, paired seed spread): "
            + "; ".join(said[:MAX_SAID]) + ".")


def seed_lines(data: ReportData, claims: pd.DataFrame) -> list[str]:
    """Compared variants (at their chosen settings) with a seed that did not learn while a
    sibling did: named with the seed's number."""
    seeds = seeds_frame(data)
    if "learned" not in seeds or not len(seeds):
        return []
    value = next((c for c in ("test_recall_accuracy", "test_loss", "eval_loss", "final_loss")
                  if c in seeds), None)
    said = []
    for (compared, cond), part in seeds[seeds["chosen"].astype(bool)].groupby(
            ["compared", "condition"], sort=False):
        known = part[part["learned"].notna()]
        stuck = known[~known["learned"].astype(bool)]
        if not len(stuck) or len(stuck) == len(known):
            continue
        where = f" ({cond})" if cond else ""
        nums = ", ".join(_num(v) for v in stuck[value]) if value else ""
        label = value.replace("_", " ").replace("accuracy", "").strip() if value else ""
        said.append(f"{compared}{where}: {len(stuck)} of {len(known)} seeds did not learn"
                    + (f": {label} {nums}" if value else ""))
    if not said:
        return []
    more = f"; and {len(said) - 4} more" if len(said) > 4 else ""
    return ["Seeds that did not learn (gain within 3x the seed's own noise of its start, "
            "diverged, or on recall left nearer chance than a sibling seed that solved it): "
            + "; ".join(said[:4]) + more
            + "; each is a caveat on its verdicts (verdicts.csv, seeds.csv)."]


def question_of(data: ReportData) -> str:
    """The experiment's ``question:`` (from its stored text), else its description's first
    line."""
    asked = stored_doc(data).get("question")
    if isinstance(asked, str) and asked.strip():
        return asked.strip()
    described = (data.runs[0].description or "").strip() if data.runs else ""
    return described.splitlines()[0] if described else ""


def compose(data: ReportData, claims: pd.DataFrame, lines: Sequence[str],
            first: Sequence[str] = ()) -> list[str]:
    """The reading: ``first`` (nothing learned), the answer from the claims (the pairs,
    then the pairs at other lengths), the seeds
    that did not learn, what the seeds could detect, then ``lines`` (the other sentences,
    none a verdict), at most MAX_READING."""
    answer = verdict_lines(claims, question_of(data)) if len(pairs_of(claims)) else []
    answer += length_lines(claims)
    power = power_line(claims)
    head = [*first, *answer, *seed_lines(data, claims), *([power] if power else [])]
    rest = [line for line in lines if line not in head]
    return (head + rest)[:MAX_READING]


def average_lines(claims: pd.DataFrame) -> list[str]:
    """The ``average`` rows (a grid's main effects over its other axes) in one sentence:
    each value against its axis's baseline value, its row's verdict with its interval."""
    rows = claims[claims["kind"] == "average"]
    if not len(rows):
        return []
    clear = [r for r in rows.itertuples() if r.verdict in CLEAR]
    said = [f"{r.a} {r.verdict} than {r.b} ({_num(r.estimate)} [{_num(r.low)}, "
            f"{_num(r.high)}])" for r in clear[:MAX_SAID]]
    one = sorted({str(r.a).split("=", 1)[0] for r in rows.itertuples()
                  if r.verdict == "not estimated"})
    rest = sorted({str(r.a).split("=", 1)[0] for r in rows.itertuples()
                   if r.verdict == "not clearly different"})
    if one:
        said.append("one seed, so no interval: " + ", ".join(one[:4]))
    if rest:
        said.append("not clearly different from the baseline value: " + ", ".join(rest[:4]))
    metric = str(rows["metric"].iloc[0])
    return [f"Averaged over the grid's other axes (on {metric}; averages, not verdicts on one "
            "combination): " + "; ".join(said) + "."]


def averages_note(claims: pd.DataFrame) -> str:
    """What the averaged rows are, for the table that shows them."""
    rows = claims[claims["condition"] == AVERAGED]
    over = sorted({c for c in rows["caveats"]})
    return ("averages of each axis value's paired effect over the other axes "
            f"({'; '.join(over[:3])}): descriptions, not verdicts on any one condition; "
            "the verdicts are per condition, in verdicts.csv")


BUSY = "timed on a busy machine"
APART = "timed apart"


def _caveat_names(row: Any, caveat: str) -> str:
    """What a row's caveat names in its parentheses (``timed apart (seeds 0, 1)``: ``0, 1``),
    empty when the row does not carry it."""
    caveats = row.caveats if isinstance(row.caveats, str) else ""
    for part in caveats.split("; "):
        if part.startswith(caveat + " ("):
            return part[len(caveat) + 2:-1]
    return ""


def busy_text(which: str) -> str:
    """The note beside a timing verdict when ``which`` variants were timed on a busy machine."""
    if not which:
        return ""
    return (f" (but {which} was timed while the machine was busy: its load average was above "
            "the cores the run could use, so the times read slow by an unknown factor; "
            "rerun on an idle machine)")


def timing_notes(row: Any) -> str:
    """A ``timing`` row's caveats said in full: timed apart, then timed on a busy machine."""
    seeds = _caveat_names(row, APART).removeprefix("seeds ")
    apart = (f" (but timed in different invocations of `variantlab run` on seed(s) {seeds}, "
             "not side by side: rerun both together to compare)") if seeds else ""
    return apart + busy_text(_caveat_names(row, BUSY))


def speed_phrase(row: Any, ratios: Sequence[float]) -> str:
    """A ``timing`` row (:func:`.claims.timing_rows`) said in words with its caveats:
    ``lower`` / ``higher`` (the log time ratio's 95% interval excludes 0) as faster /
    slower by the geometric mean ratio, with how many seeds agree; ``equal within ±δ`` as
    "as fast as" (within 2%); otherwise not clearly different in speed, or the one timing
    unit's ratio and no verdict. ``ratios``: the variant's time over the baseline's per
    seed (numbers to show, not to judge)."""
    a, b, n = row.a, row.b, int(row.n_seeds)
    notes = timing_notes(row)
    if n == 0:
        return f"{a} vs {b} not estimated (no seed timed both)" + notes
    ratio = math.exp(row.estimate)
    if row.verdict in CLEAR:
        faster = row.verdict == "lower"
        speed = f"{1 / ratio:.2f}x faster" if faster else f"{ratio:.2f}x slower"
        shown = sorted(1 / r if faster else r for r in ratios)
        agree = sum(1 for r in ratios if (r < 1) == faster)
        span = f"n={n}, per-seed {shown[0]:.2f}x to {shown[-1]:.2f}x"
        how = (f" on every seed ({span})" if agree == n else
               f" on {agree} of {n} seeds ({span}; 95% interval {math.exp(-row.high):.2f}x to "
               f"{math.exp(-row.low):.2f}x speed-up)")
        return f"{a} is {speed} than {b}{how}" + notes
    if row.verdict.startswith("equal"):
        return (f"{a} is as fast as {b} (within 2%: n={n}, 90% interval of its time "
                f"{math.exp(row.low90):.2f}x to {math.exp(row.high90):.2f}x {b}'s)" + notes)
    if n == 1:
        return (f"{a} took {ratio:.2f}x {b}'s time (one timing unit each: no interval, so no "
                "verdict; more seeds would show the run-to-run spread)" + notes)
    ups = [1 / r for r in ratios]
    return (f"{a} and {b} are not clearly different in speed (n={n}, per-seed "
            f"{min(ups):.2f}x to {max(ups):.2f}x, 95% interval {math.exp(-row.high):.2f}x to "
            f"{math.exp(-row.low):.2f}x faster: includes 1)" + notes)


def span_text(values: Sequence[float] | pd.Series) -> str:
    """``0.5 to 2``: the smallest and largest of ``values`` (one number when they agree)."""
    lo, hi = float(min(values)), float(max(values))
    return fmt(lo) if math.isclose(lo, hi) else f"{fmt(lo)} to {fmt(hi)}"


def dynamics_phrase(row: Any, what: str, diffs: pd.Series) -> str:
    """A ``dynamics`` row (:func:`.builtin.dynamics_findings.dynamics_row`) said in words:
    ``a``'s ``what`` against ``b``'s with both means, the per-seed ratio (a ``log`` metric)
    or difference ``diffs`` (in the row's scale) and the 95% interval; ``lower`` /
    ``higher`` as "is lower / higher than", otherwise not clearly different; one seed:
    the numbers and no verdict."""
    ratio = str(row.metric).startswith("log ")
    shown = (lambda d: fmt(math.exp(d))) if ratio else fmt
    x, y = apart(float(row.a_mean), float(row.b_mean))
    how = "ratio" if ratio else "difference"
    if int(row.n_seeds) < 2:
        return (f"{row.a}'s {what} {x} vs {row.b}'s {y} ({how} {shown(row.estimate)}; one "
                "seed: no verdict)")
    change = [math.exp(d) for d in diffs] if ratio else list(diffs)
    spread = (f"per-seed {how} {span_text(change)}, {'geometric mean' if ratio else 'mean'} "
              f"{shown(row.estimate)}, 95% interval [{shown(row.low)}, {shown(row.high)}] over "
              f"{int(row.n_seeds)} seeds")
    if row.verdict in CLEAR:
        return f"{row.a}'s {what} is {row.verdict} than {row.b}'s ({x} vs {y}; {spread})"
    return (f"{row.a}'s {what} is not clearly different from {row.b}'s ({x} vs {y}; {spread} "
            f"includes {1 if ratio else 0})")


def ranking_phrase(at_lr: Any, at_best: Any, lr: float, shown: Sequence[float]) -> str:
    """Two ``ranking`` rows of one pair (``a`` minus ``b`` on the choice metric, at learning
    rate ``lr`` and at each one's best, both clear the opposite ways round:
    :func:`.fair.compare.ranking_rows` keeps no other) said in words: ``a`` beats ``b`` at
    ``lr`` and loses at each one's best. Only the choice metric is said: the verdict on the
    reported metric is the pair's own row. ``shown``: the means to print (choice metric at
    ``lr``, then at the best; ``a``'s first)."""
    a, b, name = at_lr.a, at_lr.b, at_lr.metric
    yl, xw = apart(shown[0], shown[1])
    vl, vw = apart(shown[2], shown[3])
    return (f"The ranking on {name} depends on the learning rate: {a} beats {b} at lr "
            f"{fmt(lr)} ({yl} vs {xw}) and loses at each one's best lr ({vl} vs {vw}); both "
            f"orders hold over {int(at_best.n_seeds)} seeds.")


def lead_phrase(label: str, found: Any, unit: str = "") -> str:
    """A :class:`.verdict.Lead` said from its row: ``Best variant by <label>: ...`` when
    the row's verdict puts the first ahead; with one seed the numbers and no verdict; else
    that the first two are not clearly different."""
    a, b = apart(found.first_mean, found.second_mean, unit)
    if found.clear:
        return (f"Best variant by {label}: {found.first} ({a}), ahead of {found.second} "
                f"({b}) by {fmt(found.margin)} [{fmt(found.low)}, {fmt(found.high)}] over "
                f"{found.n} seeds")
    label = label[:1].upper() + label[1:]
    if found.n < 2:
        return (f"{label}: {found.first} {a}, {found.second} {b} (one seed: no interval, so "
                "no verdict)")
    if found.row.get("verdict") in CLEAR:  # the better mean, yet behind on the paired seeds
        return (f"{label}: on the seeds both ran, {found.first} ({a}) {found.row['verdict']} "
                f"than {found.second} ({b}) (paired difference {fmt(found.margin)}, 95% "
                f"interval [{fmt(found.low)}, {fmt(found.high)}] over {found.n} seeds)")
    return (f"{label}: {found.first} ({a}) and {found.second} ({b}) are not clearly different "
            f"(paired difference {fmt(found.margin)}, 95% interval [{fmt(found.low)}, "
            f"{fmt(found.high)}] over {found.n} seeds includes 0)")


def disagreement_phrase(label: str, top: Any, other: str, theirs: Any) -> str:
    """``By test loss, B leads ...``: another metric's leader whose row is clear
    (:class:`.verdict.Lead`), where the headline metric (``label``) has another leader or
    none."""
    a, b = apart(theirs.first_mean, theirs.second_mean)
    where = (f"where by {label} {top.first} leads" if top.clear else
             f"where by {label} no variant clearly leads")
    return (f"By {other}, {theirs.first} leads ({a} vs {b} for "
            f"{theirs.second}, ahead by {fmt(theirs.margin)} [{fmt(theirs.low)}, "
            f"{fmt(theirs.high)}] over {theirs.n} seeds), {where}.")


__all__ = ["APART", "BUSY", "MAX_READING", "across", "across_lines", "across_word",
           "average_lines", "averages_note", "busy_text", "compose", "condition_phrase",
           "disagreement_phrase", "lead_phrase", "dynamics_phrase", "groups", "length_lines",
           "pairs_of", "phrase", "power_line", "question_of", "ranking_phrase",
           "seed_lines", "span_text", "speed_phrase", "timing_notes", "up_to", "verdict_lines"]
