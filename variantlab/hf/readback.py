"""The export check of the families around :mod:`variantlab.hf.decoder`: a class's config
built from a spec, read back through the class's import, must give the spec again; the
first spec path where they differ is refused by name."""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from typing import Any

from ..model.specs import parse_model_spec
from ..plugin.registry import get_registry
from .common import ConversionError, Spec, refuse


def _differences(mine: Any, theirs: Any, path: str) -> Iterator[tuple[str, Any, Any]]:
    if isinstance(mine, dict) and isinstance(theirs, dict):
        for key in [*mine, *(k for k in theirs if k not in mine)]:
            yield from _differences(mine.get(key), theirs.get(key),
                                    f"{path}.{key}" if path else key)
    elif isinstance(mine, float) and isinstance(theirs, float):
        if not math.isclose(mine, theirs, rel_tol=1e-9):  # e.g. 1 / (1 / x)
            yield path, mine, theirs
    elif mine != theirs:
        yield path, mine, theirs


#: spec keys an export may change without changing a logit: dropout (warned of) and the
#: attention's implementation
_FREE = ("drop_rate", "emb_drop_rate", "attn_drop_rate", "resid_drop_rate", "impl")


#: biases a class may have where the variant has none (exported as zeros, warned of)
_BIASES = ("qkv_bias", "attn_out_bias", "ffn_bias", "feedforward.bias", "norm_bias")


def _canonical(spec: Spec) -> dict[str, Any]:
    """``spec``'s data with what it leaves implicit spelled out (the feed-forward width,
    ``n_kv_heads``, ``head_dim``, the score scale) and without the model keys no component reads: ``ffn_bias``
    beside a feed-forward other than ``mlp`` (a glu has its own ``bias``), ``norm_bias``
    beside a norm without a shift."""
    out = spec.to_data()
    ff, att, norm = dict(out["feedforward"]), dict(out["attention"]), out["norm"]
    if ff.get("kind") in ("mlp", "glu"):
        ff["hidden_dim"] = spec.feedforward.hidden_dim or max(
            1, round(spec.feedforward.hidden_mult * spec.emb_dim))
        ff.pop("hidden_mult", None)
    if att.get("kind") == "mha":
        att["n_kv_heads"] = att.get("n_kv_heads") or spec.n_heads
        att["head_dim"] = att.get("head_dim") or spec.emb_dim // spec.n_heads
        if att.get("scale") is None:
            att["scale"] = att["head_dim"] ** -0.5
    out["feedforward"], out["attention"] = ff, att
    if out.pop("layout", None) is not None:  # compared layer by layer, whatever the kinds' names
        out.pop("attention")
        out["layers"] = [{slot: comp.model_dump(mode="json") for slot, comp in
                          spec.layer_spec(i).components().items()} for i in range(spec.n_layers)]
    if ff.get("kind") != "mlp":
        out.pop("ffn_bias", None)
    if norm.get("kind") not in ("layer", "dyt") or norm.get("affine") is False:
        out.pop("norm_bias", None)
    return out


def expressed(spec: Spec, cls: str, config: Any, make_spec: Callable[[Any], dict[str, Any]],
              ) -> None:
    """Refuse unless ``config`` (the config of ``cls`` built from ``spec``) reads back through
    the import as ``spec``: the first spec path where they differ is named. A bias the class
    has and the variant lacks is allowed (the table exports it as zeros and warns)."""
    try:
        back = parse_model_spec(make_spec(config), get_registry())
    except ConversionError as err:  # the config holds an option the import refuses
        refuse("model", cls, f"{cls} cannot hold this spec: {err}")
    for path, mine, theirs in _differences(_canonical(spec), _canonical(back), ""):
        if path.rsplit(".", 1)[-1] in _FREE or (path in _BIASES and theirs and not mine):
            continue  # a bias the variant lacks: exported as zeros, with a warning
        refuse(path or "model", cls, f"{path}={mine!r}: {cls} holds {theirs!r} here")
