"""One table of weight names per family, read both ways.

A family's table is a list of :class:`Pair`: our parameter name(s), the Hugging Face name,
and the transform each way (``load``: theirs to ours, ``save``: ours to theirs, its exact
inverse). The table is built from a transformers config: on import the model's own, on
export the config built from the spec, so both directions read one table.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

import torch

from .common import warn_zero_biases

Tensors = tuple[torch.Tensor, ...]


def _one(t: torch.Tensor) -> Tensors:
    return (t,)


def _first(ts: Tensors) -> torch.Tensor:
    return ts[0]


@dataclass(frozen=True)
class Pair:
    """``ours`` (one name or several a fused HF tensor splits into) <-> ``theirs``."""

    ours: tuple[str, ...]
    theirs: str
    load: Callable[[torch.Tensor], Tensors] = _one
    save: Callable[[Tensors], torch.Tensor] = _first
    #: on export, a bias the variant may lack: its description (exported as zeros, warned
    #: unless ``quiet``: a buffer no optimizer moves)
    zeros: str | None = field(default=None)
    quiet: bool = False


def same(ours: str, theirs: str, zeros: str | None = None, quiet: bool = False) -> Pair:
    return Pair((ours,), theirs, zeros=zeros, quiet=quiet)


def linear(ours: str, theirs: str, bias: bool, zeros: str | None = None) -> list[Pair]:
    """A Linear's weight, and its bias when ``bias`` (``zeros``: what to call a bias the
    variant lacks, exported as zeros)."""
    pairs = [same(f"{ours}.weight", f"{theirs}.weight")]
    if bias:
        pairs.append(same(f"{ours}.bias", f"{theirs}.bias", zeros))
    return pairs


def scaled(ours: str, theirs: str, factor: float | torch.Tensor,
           zeros: str | None = None) -> Pair:
    """Ours = theirs * ``factor`` (a scalar, or one per row): a multiplier folded in."""
    def view(t: torch.Tensor) -> float | torch.Tensor:
        if isinstance(factor, torch.Tensor):
            return factor.reshape(-1, *[1] * (t.dim() - 1)).to(t.dtype)
        return factor

    return Pair((ours,), theirs, load=lambda t: (t * view(t),),
                save=lambda ts: ts[0] / view(ts[0]), zeros=zeros)


def permuted(ours: str, theirs: str, order: torch.Tensor | None,
             zeros: str | None = None) -> Pair:
    """Ours = theirs' rows in ``order`` (None: as they are); saved back through the inverse
    permutation."""
    if order is None:
        return same(ours, theirs, zeros)
    back = torch.argsort(order)
    return Pair((ours,), theirs, load=lambda t: (t[order],), save=lambda ts: ts[0][back],
                zeros=zeros)


def interleaved_rows(rows: int, start: int, width: int, period: int) -> torch.Tensor:
    """The row order that takes the rows ``start .. start + width`` of every block of
    ``period`` rows from interleaved pairs (x0, x1, x2, x3, ...) to halves (x0, x2, ...,
    x1, x3, ...), the others staying: rotary pairs in complex form to rotate-half form."""
    block = torch.arange(period)
    part = block[start:start + width]
    block[start:start + width] = torch.cat([part[0::2], part[1::2]])
    return (torch.arange(0, rows, period)[:, None] + block).reshape(-1)


def halves(ours: tuple[str, str], theirs: str, dim: int, transposed: bool = False,
           interleaved: bool = False, zeros: str | None = None) -> Pair:
    """A fused tensor split in two along ``dim`` (after swapping its last two dims when
    ``transposed``): the first half and the second, or with ``interleaved`` the even and the
    odd entries."""
    def load(t: torch.Tensor) -> Tensors:
        t = t.transpose(-1, -2) if transposed else t
        if interleaved:
            d = dim % t.dim()
            pairs = t.unflatten(d, (-1, 2))  # (..., n / 2, 2, ...)
            return pairs.select(d + 1, 0), pairs.select(d + 1, 1)
        return tuple(t.chunk(2, dim=dim))

    def save(ts: Tensors) -> torch.Tensor:
        if interleaved:
            d = dim % ts[0].dim()
            t = torch.stack(ts, dim=d + 1).flatten(d, d + 1)
        else:
            t = torch.cat(ts, dim=dim)
        return t.transpose(-1, -2) if transposed else t

    return Pair(ours, theirs, load=load, save=save, zeros=zeros)


def stacked(ours: tuple[str, ...], theirs: str, rows: tuple[int, ...]) -> Pair:
    """A fused tensor whose rows are ours one after another (``rows`` each): Phi-3's
    ``qkv_proj`` (query, key, value) and ``gate_up_proj`` (gate, up)."""
    return Pair(ours, theirs, load=lambda t: tuple(t.split(list(rows), dim=0)),
                save=lambda ts: torch.cat(ts, dim=0))


def transposed(ours: str, theirs: str) -> Pair:
    """Ours = theirs with its last two dims swapped (stacked experts stored (E, in, out))."""
    return Pair((ours,), theirs, load=lambda t: (t.transpose(-1, -2),),
                save=lambda ts: ts[0].transpose(-1, -2))


def load_state(pairs: Iterable[Pair], sd: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Our state dict from the HF one (``sd``)."""
    out: dict[str, torch.Tensor] = {}
    for pair in pairs:
        out.update(zip(pair.ours, (t.contiguous() for t in pair.load(sd[pair.theirs]))))
    return out


def save_state(pairs: Iterable[Pair], sd: dict[str, torch.Tensor], cls: str,
               sizes: dict[str, torch.Size]) -> dict[str, torch.Tensor]:
    """The HF state dict from ours (``sd``); ``sizes``: the HF model's tensor shapes, for a
    bias the variant lacks (exported as zeros with an ``ExportWarning``)."""
    out: dict[str, torch.Tensor] = {}
    zeros: list[str] = []
    for pair in pairs:
        if pair.zeros is not None and pair.ours[0] not in sd:
            out[pair.theirs] = torch.zeros(sizes[pair.theirs])
            if not pair.quiet and pair.zeros not in zeros:
                zeros.append(pair.zeros)
            continue
        out[pair.theirs] = pair.save(tuple(sd[name] for name in pair.ours)).contiguous()
    warn_zero_biases(cls, zeros)
    return out


def ends(final_norm: str = "model.norm") -> list[Pair]:
    """Token embedding, final norm (HF's ``final_norm``) and output head."""
    return [same("embed.tok_emb.weight", "model.embed_tokens.weight"),
            same("final_norm.scale", f"{final_norm}.weight"),
            same("out_head.weight", "lm_head.weight")]


def norms(i: int, att: str, ff: str) -> list[Pair]:
    """Layer ``i``'s two pre-norms: HF's ``att`` before the attention, ``ff`` before the
    feed-forward."""
    return [same(f"trf_blocks.{i}.att.norm.scale", f"model.layers.{i}.{att}.weight"),
            same(f"trf_blocks.{i}.ff.norm.scale", f"model.layers.{i}.{ff}.weight")]


#: our SwiGLU projections -> the Llama-like HF names
GLU = {"W_gate": "gate_proj", "W_up": "up_proj", "W_down": "down_proj"}


def glu(ours: str, theirs: str, names: dict[str, str] = GLU) -> list[Pair]:
    """A bias-free SwiGLU's three projections (``names``: ours -> theirs)."""
    return [same(f"{ours}.{mine}.weight", f"{theirs}.{name}.weight")
            for mine, name in names.items()]


def fused_experts(ours: str, theirs: str) -> list[Pair]:
    """Transformers' fused experts at ``theirs`` (``gate_up_proj`` (E, 2 hidden, D), gate
    rows first; ``down_proj`` (E, D, hidden)) <-> our stacked ``W_gate``, ``W_up``,
    ``W_down``."""
    return [halves((f"{ours}.W_gate", f"{ours}.W_up"), f"{theirs}.gate_up_proj", dim=1),
            same(f"{ours}.W_down", f"{theirs}.down_proj")]


def tied(sd: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """``sd`` with the output head present (a tied model's is its embedding)."""
    return {"out_head.weight": sd["embed.tok_emb.weight"], **sd}


#: our attention projections -> the Llama-like HF names under ``self_attn``
ATTENTION = {"W_query": "q_proj", "W_key": "k_proj", "W_value": "v_proj", "out_proj": "o_proj"}


def attention(ours: str, theirs: str, bias: bool, names: dict[str, str] = ATTENTION,
              ) -> list[Pair]:
    """Separate q/k/v/o projections (``names``: ours -> theirs), biased when ``bias`` (a bias
    the variant lacks exported as zeros)."""
    return [p for mine, name in names.items()
            for p in linear(f"{ours}.{mine}", f"{theirs}.{name}", bias, "attention biases")]


def qkv_rows(heads: int, kv_heads: int, head_dim: int, layout: str,
             ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The rows of a fused q/k/v output holding the queries, the keys and the values:
    ``per_head`` lays them out per head as (q_h, k_h, v_h) (BLOOM, Persimmon, GPT-NeoX);
    otherwise per key/value group, each group's query heads, then its key, then its value
    (Falcon's new architecture; one group of every head: multi-query, Falcon, GPTBigCode)."""
    if layout == "per_head":  # (heads, 3, head_dim)
        rows = torch.arange(3 * heads * head_dim).view(heads, 3, head_dim)
        return rows[:, 0].reshape(-1), rows[:, 1].reshape(-1), rows[:, 2].reshape(-1)
    group = heads // kv_heads
    rows = torch.arange((heads + 2 * kv_heads) * head_dim).view(kv_heads, group + 2, head_dim)
    return rows[:, :group].reshape(-1), rows[:, group].reshape(-1), rows[:, group + 1].reshape(-1)


def split_rows(ours: tuple[str, ...], theirs: str, rows: tuple[torch.Tensor, ...],
               zeros: str | None = None) -> Pair:
    """A fused tensor whose first dim is split by ``rows`` (one index tensor per name in
    ``ours``; together every row once): a fused q/k/v projection's weight or bias, in
    whatever order its class lays the heads out."""
    def save(ts: Tensors) -> torch.Tensor:
        out = ts[0].new_empty(sum(len(r) for r in rows), *ts[0].shape[1:])
        for index, t in zip(rows, ts):
            out[index] = t
        return out

    return Pair(ours, theirs, load=lambda t: tuple(t[index] for index in rows), save=save,
                zeros=zeros)


def fused_qkv(ours: str, theirs: str, rows: tuple[torch.Tensor, ...], bias: bool,
              zeros: str | None = None) -> list[Pair]:
    """A fused q/k/v Linear at ``theirs`` <-> our ``W_query``, ``W_key``, ``W_value`` under
    ``ours`` (``rows``: each one's rows of the fused output)."""
    names = ("W_query", "W_key", "W_value")
    pairs = [split_rows(tuple(f"{ours}.{n}.weight" for n in names), f"{theirs}.weight", rows)]
    if bias:
        pairs.append(split_rows(tuple(f"{ours}.{n}.bias" for n in names), f"{theirs}.bias",
                                rows, zeros))
    return pairs


def layer_norm(ours: str, theirs: str, shift: bool = True) -> list[Pair]:
    """A LayerNorm's scale and, with ``shift``, its shift (a shift the variant lacks exported
    as zeros)."""
    scale = same(f"{ours}.scale", f"{theirs}.weight")
    return [scale, same(f"{ours}.shift", f"{theirs}.bias", "norm shifts")] if shift else [scale]
