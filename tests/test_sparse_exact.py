"""``variantlab.model.sparse`` on hand-made routed modules whose terms, weights, statistics
and hooks are literal numbers: the weighted auxiliary loss (mean over routed modules of
``sum(weight * term)``), the unweighted averages, the after-step hooks, the inactive
parameters and the statistics, each written out by hand (docs/mutation.md, sparse.py)."""

import pytest
import torch
from torch import nn

from variantlab.model import sparse


class Routed(nn.Module):
    """A routed module with fixed terms (0-d tensors that carry gradients) and weights."""

    def __init__(self, terms: dict[str, float], weights: dict[str, float],
                 inactive: int = 0, stats: dict | None = None) -> None:
        super().__init__()
        self.values = nn.ParameterDict(
            {k: nn.Parameter(torch.tensor(v, dtype=torch.float64)) for k, v in terms.items()})
        self.weights = weights
        self.inactive = inactive
        self.stats = stats
        self.steps = 0

    def aux_terms(self) -> dict[str, torch.Tensor]:
        return {k: v * 1.0 for k, v in self.values.items()}

    def aux_weights(self) -> dict[str, float]:
        return dict(self.weights)

    def routing_stats(self) -> dict:
        return dict(self.stats or {})

    def after_step(self) -> None:
        self.steps += 1

    def inactive_params(self) -> int:
        return self.inactive


class NotCallable(nn.Module):
    """Attributes with the hooks' names that are not callables: no routed module."""

    aux_terms = {"aux_loss": 1.0}
    after_step = 3
    inactive_params = 7
    routing_stats = None


def model_of(*modules: nn.Module) -> nn.Module:
    return nn.Sequential(nn.Linear(2, 2), *modules)


def test_aux_loss_is_the_mean_over_routed_modules_of_the_weighted_terms():
    a = Routed({"aux_loss": 2.0, "z_loss": 3.0}, {"aux_loss": 0.5, "z_loss": 0.0})
    b = Routed({"aux_loss": 4.0, "z_loss": 1.0}, {"aux_loss": 0.25, "z_loss": 2.0})
    c = Routed({"aux_loss": 5.0}, {})  # counted in the mean, contributes no term
    model = model_of(a, NotCallable(), b, c)
    assert [m for m in sparse.routed_modules(model)] == [a, b, c]
    total = sparse.aux_loss(model)
    # (0.5 * 2 + 0.25 * 4 + 2 * 1) / 3 routed modules; the z_loss of a (weight 0) left out
    assert total.item() == 4 / 3
    total.backward()
    assert float(a.values["aux_loss"].grad) == 0.5 / 3 and a.values["z_loss"].grad is None
    assert float(b.values["aux_loss"].grad) == 0.25 / 3
    assert float(b.values["z_loss"].grad) == 2 / 3 and c.values["aux_loss"].grad is None


def test_one_weighted_term_alone_and_none_without_weights_or_routed_modules():
    only = Routed({"aux_loss": 3.0, "z_loss": 5.0}, {"z_loss": 0.5})
    assert sparse.aux_loss(model_of(only)).item() == 2.5
    two = model_of(Routed({"z_loss": 5.0}, {"z_loss": 1.0}), Routed({"z_loss": 1.0}, {"z_loss": 1.0}))
    assert sparse.aux_loss(two).item() == 3.0
    assert sparse.aux_loss(model_of(Routed({"aux_loss": 3.0}, {"aux_loss": 0.0}))) is None
    assert sparse.aux_loss(model_of(NotCallable())) is None
    assert sparse.aux_loss(nn.Linear(2, 2)) is None


def test_aux_values_average_each_term_over_the_modules_that_report_it():
    model = model_of(Routed({"aux_loss": 2.0, "z_loss": 3.0}, {}),
                     Routed({"aux_loss": 4.0, "z_loss": 1.0}, {"aux_loss": 1.0}),
                     Routed({"aux_loss": 6.0}, {}), NotCallable())
    assert sparse.aux_values(model) == {"aux_loss": 4.0, "z_loss": 2.0}
    assert sparse.aux_values(model_of(NotCallable())) == {}


def test_after_step_calls_every_hook_once_and_inactive_params_add_up():
    a, b = Routed({}, {}, inactive=10), Routed({}, {}, inactive=32)
    model = model_of(a, NotCallable(), nn.Sequential(b))
    sparse.after_step(model)
    assert (a.steps, b.steps) == (1, 1)
    sparse.after_step(model)
    assert (a.steps, b.steps) == (2, 2)
    assert sparse.inactive_params(model) == 42
    assert sparse.inactive_params(model_of(NotCallable())) == 0


def test_stats_of_a_routed_module_and_of_any_other():
    stats = {"load": [0.25, 0.75], "router_entropy": 0.5}
    assert sparse.stats_of(Routed({}, {}, stats=stats)) == stats
    assert sparse.stats_of(NotCallable()) is None
    assert sparse.stats_of(nn.Linear(2, 2)) is None


@pytest.mark.parametrize("weight", [1.0, 0.125])
def test_a_single_routed_module_is_its_own_mean(weight):
    module = Routed({"aux_loss": 8.0}, {"aux_loss": weight})
    assert sparse.aux_loss(module).item() == 8.0 * weight
