"""The report's figures drawn by two processes at once (``plots.draw_all``): the same SVG
text as drawing them one by one, a figure that fails to draw said in plot order, and a
helper that dies costing nothing but its share of the time."""

from __future__ import annotations

import os
import sys
import time

import pytest
from matplotlib.artist import Artist

from variantlab.report import plots
from variantlab.report.plots import draw_all, new_axes, to_svg

needs_fork = pytest.mark.skipif(not sys.platform.startswith("linux"),
                                reason="the helper is forked on Linux only")


class Raises(Artist):
    """An artist whose drawing raises (a plugin's plot that breaks only when drawn)."""

    def draw(self, renderer):
        raise RuntimeError("no drawing today")


class ExitsInHelper(Artist):
    """An artist that ends any process but the test's own when drawn (a helper that dies)."""

    def __init__(self, parent: int):
        super().__init__()
        self.parent = parent

    def draw(self, renderer):
        if os.getpid() != self.parent:
            os._exit(3)


def _figure(i: int, extra: Artist | None = None):
    fig, (ax,) = new_axes()
    ax.plot(range(5), [i * x for x in range(5)], label=f"line {i}")
    ax.set_title(f"figure {i}")
    if extra is not None:
        fig.add_artist(extra)
    return fig


def _slow_here(figures, calls):
    def draw(i):
        calls.append(i)
        time.sleep(0.3)  # the helper takes figures meanwhile
        try:
            return to_svg(figures[i])
        except RuntimeError:
            return None
    return draw


@needs_fork
def test_shared_drawing_gives_the_svgs_of_drawing_one_by_one():
    figures = [_figure(i) for i in range(5)]
    alone = [to_svg(f) for f in figures]
    calls: list[int] = []
    shared = draw_all(figures, _slow_here(figures, calls), share=True)
    assert shared == alone
    assert all(s and s.startswith("<?xml") for s in shared)
    assert len(calls) < len(figures)  # the helper drew the others
    assert sorted(set(calls)) == sorted(calls)  # none drawn twice here


@needs_fork
def test_a_figure_that_fails_in_the_helper_is_drawn_here_to_say_why():
    figures = [_figure(0), _figure(1, Raises()), _figure(2), _figure(3, Raises()),
               _figure(4)]
    calls: list[int] = []
    out = draw_all(figures, _slow_here(figures, calls), share=True)
    assert out[1] is None and out[3] is None
    assert {1, 3} <= set(calls)  # drawn here, whoever took them first
    assert out[0] == to_svg(figures[0]) and out[4] == to_svg(figures[4])


@needs_fork
def test_a_helper_that_dies_leaves_its_figures_to_this_process():
    parent = os.getpid()
    figures = [_figure(i, ExitsInHelper(parent)) for i in range(4)]
    calls: list[int] = []
    out = draw_all(figures, _slow_here(figures, calls), share=True)
    assert out == [to_svg(f) for f in figures]
    assert sorted(calls) == [0, 1, 2, 3]  # the helper sent nothing back


def test_drawing_is_not_shared_where_it_cannot_fork_safely(monkeypatch):
    figures = [_figure(i) for i in range(3)]
    calls: list[int] = []
    monkeypatch.setattr(plots.sys, "platform", "darwin")
    assert not plots.can_share()
    out = draw_all(figures, lambda i: calls.append(i) or to_svg(figures[i]))
    assert calls == [0, 1, 2] and out == [to_svg(f) for f in figures]
    monkeypatch.setattr(plots.sys, "platform", "linux")
    monkeypatch.setattr(plots.threading, "active_count", lambda: 2)  # another thread
    assert not plots.can_share()


def test_a_plot_that_fails_to_draw_is_a_notice_in_plot_order(tmp_path, monkeypatch):
    """Through write_report, shared or not: each failed drawing is a notice, in the order of
    the plots, and the other plots are written."""
    from variantlab.report import write_report
    from variantlab.testing.sample import sample_run

    real = plots.build_plots

    def with_broken(*args, **kwargs):
        made = real(*args, **kwargs)
        for plot in made[:2]:
            if plot.figure is not None:
                plot.figure.add_artist(Raises())
        return made

    import variantlab.report.writer as report

    monkeypatch.setattr(report, "build_plots", with_broken)
    files = write_report([sample_run()], tmp_path / "report")
    broken = [f.part for f in files.failed]
    made = [p.key for p in real(report.gather([sample_run()]))][:2]
    assert broken == [f"plot {key}: drawing" for key in made]
    md = files.markdown.read_text()
    for key in made:
        assert f"plot {key}: drawing failed: RuntimeError: no drawing today" in md
        assert not (tmp_path / "report" / f"{key}.svg").exists()
    assert len(files.plots) >= 1
