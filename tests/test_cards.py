"""Issue 40.1, the answer first: report.md and report.html open with the experiment's question
and one verdict card per condition, rendered from the claims' pair rows, before the run's
metadata. Synthetic runs give exact numbers; nothing trains."""

from __future__ import annotations

import math
import re
from dataclasses import replace

import pandas as pd
import pytest
from test_report_tuned import tuning_run

import variantlab as vl
from variantlab.report import build_context, gather, write_report
from variantlab.report.cards import card_of, kind_of, verdict_cards
from variantlab.report.claims import COLUMNS, Arm, pair_rows, verdict_of
from variantlab.report.render import render_html, render_markdown
from variantlab.report.words import MAX_SAID, phrase
from variantlab.testing.sample import sample_run

REG = vl.get_registry()
T2 = 4.302652730  # Student t, 0.975, 2 degrees of freedom
EVIL = "<img src=x onerror=alert(1)>"
QUESTION = "Does relu lower the test loss against gelu?"


def gap(over, seed):
    """Test (and validation) loss: relu 0.1 + 0.02 a seed above gelu, seeds 0, 1, 2."""
    relu = over["activation.kind"] == "relu"
    return 3.0 + 0.01 * seed + ((0.1 + 0.02 * seed) if relu else 0.0)


def by_width(over, seed):
    """relu 0.1 lower at width 32 and 0.2 higher at 64, its seeds spread twice gelu's."""
    relu = over["activation.kind"] == "relu"
    shift = {32: -0.1, 64: 0.2}[over["emb_dim"]] if relu else 0.0
    lr = over.get("measure.training.lr", 3e-3)
    return 3.0 + abs(lr - 3e-3) * 50 + shift + 0.01 * seed * (1 + relu)


def asked(run, question: str = QUESTION):
    run.meta = replace(run.meta, yaml=f"name: grid\nquestion: {question!r}\n")
    return run


def written(tmp_path, run) -> tuple[str, str]:
    """report.md and report.html as write_report writes them."""
    files = write_report([run], tmp_path, registry=REG)
    return files.markdown.read_text(encoding="utf-8"), files.html.read_text(encoding="utf-8")


def rendered(run) -> tuple[str, str]:
    """report.md and report.html from the templates, the plots left undrawn (faster)."""
    context, plots = build_context(gather([run]), REG)
    return render_markdown(context), render_html(context, {p.key: "" for p in plots})


def test_a_clear_gap_on_three_seeds_is_one_card_with_its_interval(tmp_path):
    md, html = written(tmp_path, asked(tuning_run({"activation.kind": ["gelu", "relu"]},
                                                  gap, gap)))
    # gelu - relu per seed: -0.10, -0.12, -0.14: mean -0.12, sd 0.02
    half = T2 * 0.02 / math.sqrt(3)
    assert (-0.12 - half, -0.12 + half) == (pytest.approx(-0.1697, abs=5e-5),
                                            pytest.approx(-0.07032, abs=5e-6))
    assert md.startswith(
        "# variantlab report: grid\n\n"
        "**Question:** Does relu lower the test loss against gelu?\n\n"
        "## Answer\n\n"
        "### All variants\n\n"
        "test\\_loss: a minus b, 95% interval; Holm over 1 pair\n\n"
        "- **lower**: activation=gelu lower than activation=relu (-0.12 \\[-0.1697, "
        "-0.07032\\]) — caveats: one rate only (not tuned)\n\n"
        "## Details\n\n")
    card = re.search(r'<article class="card">(.*?)</article>', html, re.S).group(1)
    text = " ".join(re.sub(r"<[^>]+>", " ", card).split())
    assert text == ("All variants test_loss: a minus b, 95% interval; Holm over 1 pair lower "
                    "activation=gelu lower than activation=relu (-0.12 [-0.1697, -0.07032]) "
                    "caveats: one rate only (not tuned)")
    assert '<li class="v-clear"><span class="verdict">lower</span>' in card


def test_a_tuned_run_with_two_conditions_gives_two_cards():
    run = tuning_run({"activation.kind": ["gelu", "relu"], "emb_dim": [32, 64],
                      "measure.training.lr": [1e-3, 3e-3, 1e-2]}, by_width, by_width)
    md, html = rendered(run)
    answer = md[md.index("## Answer"):md.index("## Details")]
    assert re.findall(r"^### (.*)$", answer, re.M) == ["emb\\_dim=32", "emb\\_dim=64"]
    # 3e-3 is inside the sweep: chosen, resolved; relu higher at 32 (lower loss), lower at 64
    assert ("- **higher**: activation=gelu higher than activation=relu (0.09 \\[0.06516, "
            "0.1148\\])\n") in answer
    assert ("- **lower**: activation=gelu lower than activation=relu (-0.21 \\[-0.2348, "
            "-0.1852\\])\n") in answer
    assert html.count('<article class="card">') == 2
    assert re.findall(r'<article class="card">\s*<h3>(.*?)</h3>', html) == ["emb_dim=32",
                                                                          "emb_dim=64"]


def test_a_hostile_variant_name_and_question_are_escaped(tmp_path):
    run = asked(sample_run(((EVIL, {}, 1.05), ("post_norm", {"residual.kind": "post_norm"}, 2.0)),
                           (0, 1, 2), fail=None, diverge=None), question=f"Is {EVIL} better?")
    md, html = written(tmp_path, run)
    top = html[html.index("<h1>"):html.index("</details>")]
    assert "<img" not in top and top.count("&lt;img src=x onerror=alert(1)&gt;") == 2
    answer = md[:md.index("## Details")]
    assert "<img" not in answer
    assert "**Question:** Is &lt;img src=x onerror=alert(1)&gt; better?" in answer
    assert "- **lower**: &lt;img src=x onerror=alert(1)&gt; lower than post\\_norm" in answer


def test_the_question_and_the_cards_come_before_the_metadata():
    md, html = rendered(asked(tuning_run({"activation.kind": ["gelu", "relu"]},
                                                  gap, gap)))
    marks = [md.index("**Question:**"), md.index("### All variants"), md.index("- **lower**"),
             md.index("- date: "), md.index("- seeds: "), md.index("## Reading")]
    assert marks == sorted(marks)
    marks = [html.index('<p class="question">'), html.index('<article class="card">'),
             html.index("<details"), html.index("<dt>date</dt>"), html.index("<dt>seeds</dt>"),
             html.index("<h2>Reading</h2>")]
    assert marks == sorted(marks)


def test_a_report_without_comparisons_has_a_card_that_says_so():
    run = sample_run((("solo", {}, 1.0),), (0,), fail=None, diverge=None)
    md, html = rendered(run)
    said = ("1 variant (solo), 1 seed: no pair was compared, so there is no verdict (a verdict "
            "needs two variants with a headline value on the same seeds).")
    assert f"### No comparison\n\n- **no comparison**: {said}\n\n## Details" in md
    assert html.count('<article class="card">') == 1 and said in html


def _claims(values: dict[str, list[float]], cond: str = "") -> pd.DataFrame:
    arms = [Arm(v, cond, "", pd.Series(dict(enumerate(xs)))) for v, xs in values.items()]
    rows = pair_rows(arms, "test_loss", 0.02)
    for r in rows:
        r["verdict"] = verdict_of(r)
        r["caveats"] = f"caveat of {r['a']}-{r['b']}"
    return pd.DataFrame(rows, columns=list(COLUMNS))


def test_a_card_says_each_row_with_its_phrase_clear_verdicts_first():
    # a, b: equal; c 1.0 above both (clear); d: noisy, not clearly different from any
    claims = _claims({"a": [3.0, 3.5, 4.0], "b": [3.001, 3.499, 4.002],
                      "c": [4.0, 4.51, 5.0], "d": [3.2, 3.4, 4.3]})
    card = card_of(claims, "")
    rows = {(r.a, r.b): r for r in claims.itertuples()}
    verdicts = [e.verdict for e in card.entries]
    assert sorted(verdicts) == sorted(claims["verdict"])  # every row, nothing else
    assert [kind_of(v) for v in verdicts] == sorted(map(kind_of, verdicts),
                                                    key=("clear", "equal", "unsure").index)
    assert verdicts == ["lower", "lower", "equal within ±0.02"] + ["not clearly different"] * 3
    assert [e.text.split(" ", 1)[0] for e in card.entries[:2]] == ["a", "b"]  # rows' order
    for e in card.entries:
        row = next(r for r in rows.values() if phrase(r) == e.text)
        assert (e.verdict, e.caveats) == (row.verdict, row.caveats)
    assert card.about == "test_loss: a minus b, 95% interval; Holm over 6 pairs"
    assert card.more == ""


def test_a_card_of_many_pairs_counts_those_it_leaves_off():
    claims = _claims({f"v{i}": [3.0 + i, 3.5 + i, 4.0 + 1.01 * i] for i in range(5)}, "x")
    (card,) = verdict_cards(claims)
    assert card.title == "x" and len(card.entries) == MAX_SAID
    assert card.more == f"and {10 - MAX_SAID} more pairs in verdicts.csv"


def test_the_context_cards_are_those_of_the_claims():
    run = tuning_run({"activation.kind": ["gelu", "relu"], "emb_dim": [32, 64]}, by_width,
                     by_width)
    context = build_context(gather([run]), REG)[0]
    assert context["cards"] == verdict_cards(context["claims"])
    assert context["question"] == "A fixed synthetic run for tests."


def test_claims_that_fail_leave_a_card_that_says_so(monkeypatch):
    import variantlab.report.writer as report

    def broken(*_, **__):
        raise RuntimeError("claims broke")

    monkeypatch.setattr(report, "claims_table", broken)
    run = tuning_run({"activation.kind": ["gelu", "relu"]}, gap, gap)
    md, html = rendered(run)
    assert ("### No comparison\n\n- **no comparison**: The comparisons could not be computed "
            "(see Parts that failed), so this report gives no verdict.\n") in md
    assert "- **claims**: RuntimeError: claims broke" in md
