"""Transformer blocks assembled from slots; shared by the model families."""

import torch
from torch import nn

from variantlab.model.positions import Positions
from variantlab.model.roles import mark


class TransformerBlock(nn.Module):
    """Self-attention then feed-forward, each inside the residual slot (seed 000's block).

    A block-scope residual kind (e.g. ``parallel``) instead wraps both sublayers at once, as
    ``res``; a per-sublayer kind wraps each, as ``att`` and ``ff``.
    """

    def __init__(self, parts, causal: bool):
        super().__init__()
        if parts.block_residual:
            self.res = parts.block(parts.attention(causal=causal), parts.feedforward())
        else:
            self.res = None
            self.att = parts.residual(parts.attention(causal=causal))
            ff = parts.feedforward()  # feedforward none: no sublayer, no residual, no norm
            self.ff = None if getattr(ff, "absent", False) else parts.residual(ff)

    def forward(self, x, key_padding_mask=None, **attention_kw):  # (B, T, D)
        if self.res is not None:
            return self.res(x, key_padding_mask=key_padding_mask, **attention_kw)
        x = self.att(x, key_padding_mask=key_padding_mask, **attention_kw)
        return x if self.ff is None else self.ff(x)


class DecoderBlock(nn.Module):
    """Masked self-attention, cross-attention over the encoder output, feed-forward
    (Vaswani et al. 2017, fig. 1, right; seed 001's decoder layer)."""

    def __init__(self, parts):
        super().__init__()
        if parts.block_residual:  # the family specs refuse this first; kept for direct use
            raise ValueError(f"residual {parts.spec.residual.kind!r} wraps a whole block; "
                             "a decoder layer has three sublayers: use a per-sublayer kind")
        self.self_att = parts.residual(parts.attention(causal=True))
        self.cross_att = parts.residual(parts.attention(causal=False))
        self.ff = parts.residual(parts.feedforward())

    def forward(self, x, memory, memory_padding_mask=None, tgt_padding_mask=None):
        x = self.self_att(x, key_padding_mask=tgt_padding_mask)  # (B, T, D)
        x = self.cross_att(x, memory=memory, key_padding_mask=memory_padding_mask)
        return self.ff(x)


def numbered(blocks, start: int = 0):
    """Tag each block with its layer index (probes read per-layer numbers from the tags)."""
    for i, block in enumerate(blocks):
        mark(block, layer=start + i)
    return blocks


class TokenEmbedding(nn.Module):
    """Token embedding followed by the positional slot and dropout; ``share`` reuses another
    embedding's matrix (encoder-decoder three-way sharing)."""

    def __init__(self, parts, vocab_size: int, emb_dim: int, drop_rate: float,
                 share: nn.Embedding | None = None, scale: float | None = None,
                 token_dim: int | None = None, multiplier: float | None = None):
        super().__init__()
        self.scale = scale  # Gemma: sqrt(emb_dim), cast to the embeddings' dtype
        self.multiplier = multiplier  # Granite's embedding_multiplier
        self.tok_emb = nn.Embedding(vocab_size, token_dim or emb_dim)
        if share is not None:
            self.tok_emb.weight = share.weight  # one tensor, counted once
        mark(self.tok_emb, slot="embedding")
        # OPT-350m: token embeddings of their own width, projected to the model's
        self.project_in = (nn.Linear(token_dim, emb_dim, bias=False)
                           if token_dim not in (None, emb_dim) else None)
        self.pos_emb = parts.positional()
        self.drop_emb = nn.Dropout(drop_rate)

    def forward(self, idx, position_ids=None):  # (B, T); position_ids (B, T) or None
        x = self.tok_emb(idx)  # (B, T, token_dim)
        if self.scale is not None:
            x = x * torch.tensor(self.scale, dtype=x.dtype)
        if self.multiplier is not None:
            x = x * self.multiplier
        if self.project_in is not None:
            x = self.project_in(x)  # (B, T, D)
        if position_ids is not None and isinstance(self.pos_emb, Positions):
            x = self.pos_emb(x, position_ids=position_ids)
        else:
            x = self.pos_emb(x)
        return self.drop_emb(x)  # (B, T, D)


def final_norm(parts, spec) -> nn.Module:
    """The norm after the last block, or the identity when ``final_norm`` is off."""
    return parts.norm() if spec.final_norm else nn.Identity()


def lm_head(emb_dim: int, vocab_size: int, tie_to: nn.Embedding | None,
            bias: bool = False) -> nn.Linear:
    head = nn.Linear(emb_dim, vocab_size, bias=bias)  # bias: head_bias (GPT-J, Phi-1/2)
    mark(head, slot="head")
    if tie_to is not None:
        head.weight = tie_to.weight  # one tensor, counted once
    return head
