"""Issue 2, "What it must show" 3: every registered kind of every slot, in every family it
fits, builds a tiny model, runs forward and backward, gives every parameter a gradient,
produces no NaN, and its spec round-trips through plain data (via the conformance kit)."""

import pytest

import variantlab as vl
from variantlab.registry import ALL_SLOTS
from variantlab.testing import check_component

REGISTRY = vl.build_registry()
CASES = [(slot, kind) for slot in ALL_SLOTS for kind in REGISTRY.kinds(slot)]


def test_walk_covers_every_slot():
    slots = {slot for slot, _ in CASES}
    assert slots == set(ALL_SLOTS)
    assert len(CASES) >= 21  # the built-ins alone: 4 + 3 + 2 + 1 + 2 + 3 norms.. families


@pytest.mark.parametrize(("slot", "kind"), CASES, ids=[f"{s}-{k}" for s, k in CASES])
def test_registered_kind_conforms(slot, kind):
    spec = {"family": kind} if slot == "model" else {"kind": kind}
    check_component(slot, spec, registry=REGISTRY)
