"""Issue 2, "What it must show" 3: every registered kind of every slot, in every family it
fits, builds a tiny model, runs forward and backward, gives every parameter a gradient,
produces no NaN, and its spec round-trips through plain data (via the conformance kit)."""

import pytest

import variantlab as vl
from variantlab.plugin.registry import ALL_SLOTS
from variantlab.testing import check_component

REGISTRY = vl.build_registry()
CASES = [(slot, kind) for slot in ALL_SLOTS for kind in REGISTRY.kinds(slot)]
# option combinations a kind's spec lists in ``walk_examples`` (e.g. mha's n_kv_heads, qk_norm)
EXAMPLES = [(c.slot, example) for c in REGISTRY.components()
            for example in getattr(c.spec_cls, "walk_examples", ())]


def test_walk_covers_every_slot():
    slots = {slot for slot, _ in CASES}
    assert slots == set(ALL_SLOTS)
    assert len(CASES) >= 21  # the built-ins alone: 4 + 3 + 2 + 1 + 2 + 3 norms.. families


@pytest.mark.parametrize(("slot", "kind"), CASES, ids=[f"{s}-{k}" for s, k in CASES])
def test_registered_kind_conforms(slot, kind):
    spec = {"family": kind} if slot == "family" else {"kind": kind}
    check_component(slot, spec, registry=REGISTRY)


@pytest.mark.parametrize(("slot", "spec"), EXAMPLES, ids=[f"{s}-{e}" for s, e in EXAMPLES])
def test_listed_option_combinations_conform(slot, spec):
    check_component(slot, spec, registry=REGISTRY)


def test_walk_covers_the_attention_and_position_options():
    options = {key for slot, spec in EXAMPLES for key in spec if slot in ("attention", "positional")}
    assert {"n_kv_heads", "head_dim", "qk_norm", "qk_norm_scope", "window", "impl", "theta",
            "fraction"} <= options
