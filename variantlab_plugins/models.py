"""Model families' modules: gpt (seed 004), block (seed 000), encoder, decoder,
encoder_decoder (seed 001) and the deep mlp of seed 004's shortcut experiment."""

import torch
from torch import nn

from variantlab.model.positions import position_ids_from_mask
from variantlab_plugins.blocks import (
    DecoderBlock,
    TokenEmbedding,
    TransformerBlock,
    final_norm,
    lm_head,
    numbered,
)


class BlockModel(nn.Module):
    """One transformer block on float input (B, T, emb_dim), as seed 000 runs it."""

    def __init__(self, spec, parts):
        super().__init__()
        self.block = numbered([TransformerBlock(parts, causal=spec.causal_attention)])[0]

    def forward(self, x):  # (B, T, D)
        return self.block(x)


class GPTModel(nn.Module):
    """Decoder-only language model (GPT-2, Radford et al. 2019; seed 004's GPTModel)."""

    def __init__(self, spec, parts):
        super().__init__()
        # a plugin family may reuse this module with a spec that lacks Gemma's options
        scaled = getattr(spec, "scale_embeddings", False)
        token_dim = getattr(spec, "token_dim", None)
        self.embed = TokenEmbedding(parts, spec.vocab_size, spec.emb_dim, spec.drop("emb"),
                                    scale=spec.emb_dim ** 0.5 if scaled else None,
                                    token_dim=token_dim,
                                    multiplier=getattr(spec, "emb_multiplier", None))
        self.logit_softcap = getattr(spec, "logit_softcap", None)
        self.logit_scale = getattr(spec, "logit_scale", None)
        # BLOOM: a norm on the embeddings before the first block
        self.embed_norm = parts.norm() if getattr(spec, "embedding_norm", False) else None
        self.trf_blocks = nn.Sequential(
            *numbered([TransformerBlock(parts.layer(i), causal=True) for i in range(spec.n_layers)])
        )
        self.final_norm = final_norm(parts, spec)
        # OPT-350m: the last hidden states projected back to the token embeddings' width
        self.project_out = (nn.Linear(spec.emb_dim, token_dim, bias=False)
                            if token_dim not in (None, spec.emb_dim) else None)
        self.out_head = lm_head(
            token_dim or spec.emb_dim, spec.vocab_size,
            self.embed.tok_emb if spec.tie_weights else None,
            bias=getattr(spec, "head_bias", False),
        )

    def forward(self, idx, attention_mask=None):  # (B, T)
        """Logits (B, T, vocab_size). ``attention_mask`` (B, T), as in Hugging Face: 1 at
        tokens, 0 at padding; padded keys get no attention, and positions count real tokens
        only (:func:`variantlab.model.positions.position_ids_from_mask`), so a left-padded row's
        tokens get the outputs of the unpadded sequence. Outputs at pads are meaningless."""
        if attention_mask is None:
            x = self.trf_blocks(self.embedded(self.embed(idx)))  # (B, T, D)
            return self.logits(x)  # (B, T, vocab_size)
        position_ids = position_ids_from_mask(attention_mask)  # (B, T)
        extra = {}
        if getattr(self.embed.pos_emb, "rotates", False):
            extra["position_ids"] = position_ids  # the attentions rotate by them
        x = self.embedded(self.embed(idx, position_ids=position_ids))  # (B, T, D)
        for block in self.trf_blocks:
            x = block(x, key_padding_mask=attention_mask == 0, **extra)
        return self.logits(x)  # (B, T, vocab_size)

    def embedded(self, x):  # (B, T, D): the embeddings, normed when embedding_norm is set
        return x if self.embed_norm is None else self.embed_norm(x)

    def logits(self, x):  # (B, T, D) -> (B, T, vocab_size)
        x = self.final_norm(x)
        if self.project_out is not None:
            x = self.project_out(x)  # (B, T, token_dim)
        logits = self.out_head(x)
        if self.logit_scale is not None:  # Cohere, Granite: a fixed multiplier
            logits = logits * self.logit_scale
        if self.logit_softcap is not None:  # Gemma 2: cap * tanh(logits / cap)
            logits = torch.tanh(logits / self.logit_softcap) * self.logit_softcap
        return logits


class Encoder(nn.Module):
    """Bidirectional stack with key padding masks and a final norm."""

    def __init__(self, spec, parts, start_layer: int = 0):
        super().__init__()
        self.embed = TokenEmbedding(parts, spec.vocab_size, spec.emb_dim, spec.drop("emb"))
        self.layers = nn.ModuleList(numbered(
            [TransformerBlock(parts.layer(i), causal=False) for i in range(spec.n_layers)],
            start_layer
        ))
        self.norm = final_norm(parts, spec)

    def forward(self, src, padding_mask=None):  # (B, S)
        x = self.embed(src)  # (B, S, D)
        for layer in self.layers:
            x = layer(x, key_padding_mask=padding_mask)
        return self.norm(x)


class Decoder(nn.Module):
    """Masked self-attention and cross-attention layers, then a final norm (seed 001)."""

    def __init__(self, spec, parts, start_layer: int = 0, share: nn.Embedding | None = None):
        super().__init__()
        self.embed = TokenEmbedding(
            parts, spec.vocab_size, spec.emb_dim, spec.drop("emb"), share=share)
        self.layers = nn.ModuleList(
            numbered([DecoderBlock(parts.layer(i)) for i in range(spec.n_layers)], start_layer)
        )
        self.norm = final_norm(parts, spec)

    def forward(self, tgt, memory, memory_padding_mask=None, tgt_padding_mask=None):
        x = self.embed(tgt)  # (B, T, D)
        for layer in self.layers:
            x = layer(x, memory, memory_padding_mask, tgt_padding_mask)
        return self.norm(x)


class EncoderModel(nn.Module):
    """Encoder with a projection to the vocabulary (masked-token prediction)."""

    def __init__(self, spec, parts):
        super().__init__()
        self.encoder = Encoder(spec, parts)
        tie = self.encoder.embed.tok_emb if spec.tie_weights else None
        self.out_head = lm_head(spec.emb_dim, spec.vocab_size, tie)

    def forward(self, idx, padding_mask=None):  # (B, T)
        return self.out_head(self.encoder(idx, padding_mask))  # (B, T, vocab_size)


class DecoderModel(nn.Module):
    """Decoder over a given memory (B, S, D), projected to the vocabulary."""

    def __init__(self, spec, parts):
        super().__init__()
        self.decoder = Decoder(spec, parts)
        tie = self.decoder.embed.tok_emb if spec.tie_weights else None
        self.out_head = lm_head(spec.emb_dim, spec.vocab_size, tie)

    def forward(self, idx, memory, memory_padding_mask=None, padding_mask=None):
        h = self.decoder(idx, memory, memory_padding_mask, padding_mask)  # (B, T, D)
        return self.out_head(h)  # (B, T, vocab_size)


class EncoderDecoderModel(nn.Module):
    """The original Transformer (Vaswani et al. 2017; seed 001): encoder, decoder with
    cross-attention over the encoder output, projection to the vocabulary. With
    ``share_embeddings`` the encoder's embedding, the decoder's and the output projection are
    one matrix (Vaswani et al. 2017, sec. 3.4)."""

    def __init__(self, spec, parts):
        super().__init__()
        self.encoder = Encoder(spec, parts)
        shared = self.encoder.embed.tok_emb if spec.share_embeddings else None
        self.decoder = Decoder(spec, parts, start_layer=spec.n_layers, share=shared)
        tie = self.decoder.embed.tok_emb if spec.tie_weights or spec.share_embeddings else None
        self.out_head = lm_head(spec.emb_dim, spec.vocab_size, tie)

    def forward(self, src, tgt, src_padding_mask=None, tgt_padding_mask=None):
        memory = self.encoder(src, src_padding_mask)  # (B, S, D)
        h = self.decoder(tgt, memory, src_padding_mask, tgt_padding_mask)  # (B, T, D)
        return self.out_head(h)  # (B, T, vocab_size)


class DeepMLP(nn.Module):
    """Seed 004's shortcut experiment: Linear -> activation per layer, each in the residual
    slot; the shortcut is applied only where a layer keeps its width."""

    def __init__(self, spec, parts):
        super().__init__()
        sizes = spec.layer_sizes
        layers = []
        for d_in, d_out in zip(sizes[:-1], sizes[1:]):
            sublayer = nn.Sequential(nn.Linear(d_in, d_out), parts.activation())
            residual = spec.residual
            if d_in != d_out and "shortcut" in type(residual).model_fields:
                residual = residual.model_copy(update={"shortcut": False})
            layers.append(parts.residual(sublayer, d_in, d_out, spec=residual))
        self.layers = nn.ModuleList(numbered(layers))

    def forward(self, x):  # (B, layer_sizes[0])
        for layer in self.layers:
            x = layer(x)
        return x  # (B, layer_sizes[-1])
