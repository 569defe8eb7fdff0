"""report.html's table layout (issue 40.3): answer columns beside the labels, short headers
with a legend, words that never break inside. The browser test measures the result."""

from variantlab.report.render import fitted, short_name, table_html, unbroken_words
from variantlab.report.tables import Table

EFFECTS = Table("Effects", ["metric", "axis", "value", "effect", "95% interval", "n seeds",
                            "clear"], [["eval loss", "norm", "rms vs layer", "-0.1",
                                        "[-0.2, 0.0]", "3", "no"]])
TUNED = Table("Tuned comparison",
              ["variant", "data.n_pairs", "measure.training.lr", "val_loss (chose)", "test_loss",
               "95% interval", "n seeds", "vs pattern=[attn]", "at edge", "lr sensitivity",
               "diverged", "still improving", "rank"],
              [["pattern=[attn]", "4", "0.003", "1.2", "1.3", "[1.2, 1.4]", "3", "", "no", "0.1",
                "0/6", "0/3", "1"]])


def test_effects_put_the_verdict_beside_the_labels_and_spell_out_short_headers():
    fit = fitted(EFFECTS)
    assert fit.columns == ["metric", "axis", "value", "clear", "effect", "95% CI", "n"]
    assert fit.rows == [["eval loss", "norm", "rms vs layer", "no", "-0.1", "[-0.2, 0.0]", "3"]]
    assert fit.legend == "95% CI: 95% interval; n: n seeds"


def test_tuned_table_answers_first_then_the_numbers():
    fit = fitted(TUNED)
    assert fit.columns == ["variant", "n_pairs", "lr", "vs base", "at edge", "diverged",
                           "improving", "rank", "val (chose)", "test", "95% CI", "n",
                           "lr sens."]
    assert fit.rows[0][:8] == ["pattern=[attn]", "4", "0.003", "", "no", "0/6", "0/3", "1"]
    assert fit.legend.startswith("n_pairs: data.n_pairs; lr: measure.training.lr; "
                                 "vs base: vs pattern=[attn]; improving: still improving; ")
    assert fitted(Table("t", fit.columns, fit.rows)).columns == fit.columns  # idempotent


def test_a_dotted_axis_keeps_its_path_when_its_last_key_is_shared():
    columns = ["variant", "attention.window", "ffn.window"]
    assert [short_name(c, columns) for c in columns] == columns
    assert short_name("measure.training.lr", ["measure.training.lr"]) == "lr"


def test_words_are_escaped_and_unbreakable_and_a_number_wraps_before_its_interval():
    assert unbroken_words("<b>a&b</b> x=[y]") == (
        '<span class="w">&lt;b&gt;a&amp;b&lt;/b&gt;</span> <span class="w">x=[y]</span>')
    assert unbroken_words("-0.68 [-0.70, -0.66]", number=True) == (
        '<span class="w">-0.68</span> <span class="w">[-0.70, -0.66]</span>')
    assert unbroken_words("1.4 ± 0.1 (×1.02)", number=True).count('class="w"') == 2


def test_a_fitted_table_renders_its_legend_and_marks_the_baseline_row():
    fit = fitted(TUNED)
    html = str(table_html(fit, "fair", "pattern=[attn]", fit.legend))
    assert '<tr class="baseline"><td><span class="w">pattern=[attn]</span></td>' in html
    assert '<p class="legend">Columns: n_pairs: data.n_pairs;' in html
    plain = str(table_html(EFFECTS, "summary", "x"))
    assert "span" not in plain and "legend" not in plain
