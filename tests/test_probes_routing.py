"""variantlab/probes/routing.py on hand-written statistics: the snapshot of each routed layer,
the per-layer rows and their units, and the training rows' means (per step, over the last
tenth of the steps, per layer over all steps) computed by hand (issue 30, item 4)."""

import math

import pytest
import torch
from torch import nn

from variantlab.probes.routing import layer_rows, snapshot, training_rows


class Routed(nn.Module):
    """A module that reports fixed routing statistics."""

    def __init__(self, stats):
        super().__init__()
        self.stats = stats

    def routing_stats(self):
        return self.stats


class RoutedWithTerms(Routed):
    def __init__(self, stats, terms):
        super().__init__(stats)
        self.terms = terms

    def aux_terms(self):
        return self.terms


def test_snapshot_reads_each_layer_with_a_load():
    layers = [
        ("", 0, Routed({})),  # no forward yet: no load, no record; the next layers still read
        ("", 1, RoutedWithTerms(
            {"load": torch.tensor([0.5, 0.25, 0.25, 0.0]), "router_entropy": torch.tensor(1.25),
             "capacity": 3, "dropped_fraction": torch.tensor(0.125)},
            {"aux_loss": torch.tensor(1.5), "z_loss": torch.tensor(0.25)})),
        ("decoder", 2, Routed({"load": torch.tensor([0.0, 0.0]),
                               "router_entropy": torch.tensor(0.0), "capacity": None})),
    ]
    rec = snapshot(layers)
    assert list(rec) == [("", 1), ("decoder", 2)]
    assert rec[("", 1)] == {"load": [0.5, 0.25, 0.25, 0.0], "load_imbalance": 2.0,
                            "router_entropy": 1.25, "dropped_fraction": 0.125,
                            "aux_loss": 1.5, "z_loss": 0.25}
    zero = rec[("decoder", 2)]  # no assignment at all: imbalance undefined, not a crash
    assert zero["load"] == [0.0, 0.0] and math.isnan(zero["load_imbalance"])
    assert set(zero) == {"load", "load_imbalance", "router_entropy"}


def rows_by(rows, scope):
    return {(r["metric"], r["name"], r["step"]): (r["value"], r["unit"]) for r in rows
            if r["scope"] == scope}


def test_layer_rows_name_the_experts_and_give_ratios_their_unit():
    record = {("decoder", 2): {"load": [0.75, 0.25], "load_imbalance": 1.5,
                               "router_entropy": 0.5, "aux_loss": 2.0}}
    got = rows_by(layer_rows("dynamics", record, 7), "layer")
    assert got == {
        ("expert_load", "decoder/expert 0", 7): (0.75, "ratio"),
        ("expert_load", "decoder/expert 1", 7): (0.25, "ratio"),
        ("load_imbalance", "decoder", 7): (1.5, "ratio"),
        ("router_entropy", "decoder", 7): (0.5, ""),
        ("aux_loss", "decoder", 7): (2.0, ""),
    }


def log_of(n: int) -> list:
    """``n`` steps of one routed layer of 3 experts: even steps send everything to expert 0,
    odd steps to expert 2 (imbalance 3 each step); step s has entropy s, aux loss 2s,
    z loss 1 and dropped fraction 0.5."""
    out = []
    for s in range(n):
        load = [1.0, 0.0, 0.0] if s % 2 == 0 else [0.0, 0.0, 1.0]
        out.append({("", 0): {"load": load, "load_imbalance": 3.0, "router_entropy": float(s),
                              "dropped_fraction": 0.5, "aux_loss": 2.0 * s, "z_loss": 1.0}})
    return out


def test_training_rows_by_hand():
    rows = training_rows(log_of(90))
    model = rows_by(rows, "model")
    assert model[("router_entropy", "", 5)] == (5.0, "")
    assert model[("load_imbalance", "", 5)] == (3.0, "ratio")
    assert model[("aux_loss", "", 5)] == (10.0, "")
    assert model[("dropped_fraction", "", 5)] == (0.5, "")
    # final_: the mean over the last tenth, steps 81..89
    assert model[("final_router_entropy", "", None)] == (85.0, "")
    assert model[("final_aux_loss", "", None)] == (170.0, "")
    assert model[("final_load_imbalance", "", None)] == (3.0, "ratio")
    assert model[("final_z_loss", "", None)] == (1.0, "")
    # per layer over all 90 steps: the mean load is [0.5, 0, 0.5], so its imbalance is 1.5
    # (not the mean of the steps' imbalances, 3); the other metrics are means of the steps
    layer = rows_by(rows, "layer")
    assert layer == {
        ("expert_load", "expert 0", None): (0.5, "ratio"),
        ("expert_load", "expert 1", None): (0.0, "ratio"),
        ("expert_load", "expert 2", None): (0.5, "ratio"),
        ("load_imbalance", "", None): (pytest.approx(1.5), "ratio"),
        ("router_entropy", "", None): (44.5, ""),
        ("dropped_fraction", "", None): (0.5, ""),
        ("aux_loss", "", None): (89.0, ""),
        ("z_loss", "", None): (1.0, ""),
    }


def test_final_rows_average_a_tenth_of_the_steps_rounded_down_at_least_one():
    for n, tail in ((18, [17]), (20, [18, 19]), (5, [4])):
        model = rows_by(training_rows(log_of(n)), "model")
        assert model[("final_router_entropy", "", None)] == (sum(tail) / len(tail), "")


def test_a_layer_that_routed_nothing_has_no_imbalance():
    log = [{("", 0): {"load": [0.0, 0.0], "load_imbalance": math.nan, "router_entropy": 0.0}}]
    layer = rows_by(training_rows(log), "layer")
    assert math.isnan(layer[("load_imbalance", "", None)][0])
    assert layer[("router_entropy", "", None)] == (0.0, "")
    assert training_rows([]) == []
