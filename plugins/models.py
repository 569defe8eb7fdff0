"""Model families: a spec class (ModelSpec plus the family's own fields) and a build."""

from typing import Literal

import torch
import torch.nn.functional as F
from pydantic import Field, PositiveInt, model_validator
from variantlab_plugins import families

from variantlab import Batch, ModelSpec, hookimpl
from variantlab.build import block_scope


def sublayer_residual_only(spec: ModelSpec, why: str) -> ModelSpec:
    """Refuse a block-scope residual kind (e.g. ``parallel``) in a family that cannot use one."""
    if block_scope(spec.residual):
        raise ValueError(
            f"residual {spec.residual.kind!r} wraps a whole attention + feed-forward block, but "
            f"family {spec.family!r} {why}; choose a per-sublayer residual kind such as pre_norm")
    return spec


class FloatInputSpec(ModelSpec):
    """Families fed float tensors, scored by MSE to zero (seed 004's print_gradients)."""

    input_kind = "floats"

    def input_shape(self, batch_size: int, seq_len: int) -> tuple[int, ...]:
        return (batch_size, seq_len, self.emb_dim)

    def make_batch(self, batch_size, seq_len, *, tokens=None, generator=None) -> Batch:
        x = torch.rand(self.input_shape(batch_size, seq_len), generator=generator)
        with torch.no_grad():
            out_shape = self.output_shape(x.shape)
        return Batch({"x": x}, torch.zeros(out_shape), n_tokens=batch_size * seq_len)

    def output_shape(self, in_shape) -> tuple[int, ...]:
        return tuple(in_shape)

    def loss(self, output, batch):
        return F.mse_loss(output, batch.target)


class BlockSpec(FloatInputSpec):
    """One transformer block on float input (B, T, emb_dim), as seed 000 runs it."""

    family: Literal["block"] = "block"
    causal_attention: bool = Field(
        True, description="mask future positions in the block's attention (the seed's block does)")

    @property
    def causal(self) -> bool:
        return self.causal_attention


class MLPFamilySpec(FloatInputSpec):
    """Deep MLP of seed 004's shortcut experiment: Linear -> activation per layer, in residuals."""

    family: Literal["mlp"] = "mlp"
    layer_sizes: list[PositiveInt] = Field(
        [3, 3, 3, 3, 3, 1], min_length=2, description="widths from input to output: one layer "
        "per consecutive pair; a width change turns that layer's shortcut off")
    drop_rate: float = Field(
        0.0, ge=0.0, lt=1.0, description="dropout on each layer's output in its residual wrapper")
    inputs: list[list[float]] | None = Field(
        None, description="fixed input rows (the seed feeds [[1, 0, -1]]); random if unset"
    )

    @property
    def causal(self) -> bool:
        return False

    @model_validator(mode="after")
    def _sublayer_residual(self):
        return sublayer_residual_only(self, "has no attention, only Linear layers")

    @model_validator(mode="after")
    def _shortcut_switchable(self):
        sizes = self.layer_sizes
        widths_change = any(a != b for a, b in zip(sizes[:-1], sizes[1:]))
        if widths_change and "shortcut" not in type(self.residual).model_fields:
            raise ValueError(
                f"residual {self.residual.kind!r} has no 'shortcut' option, which layer_sizes "
                "that change width need; use pre_norm or post_norm"
            )
        return self

    @model_validator(mode="after")
    def _inputs_fit(self):
        if self.inputs is not None and any(len(r) != self.layer_sizes[0] for r in self.inputs):
            raise ValueError(f"every row of inputs needs layer_sizes[0]={self.layer_sizes[0]} values")
        return self

    def input_shape(self, batch_size, seq_len):
        return (batch_size, self.layer_sizes[0])

    def make_batch(self, batch_size, seq_len, *, tokens=None, generator=None) -> Batch:
        if self.inputs is None:
            return super().make_batch(batch_size, seq_len, tokens=tokens, generator=generator)
        x = torch.tensor(self.inputs)  # (rows, layer_sizes[0])
        target = torch.zeros(len(self.inputs), self.layer_sizes[-1])
        return Batch({"x": x}, target, n_tokens=len(self.inputs))

    def output_shape(self, in_shape):
        return (in_shape[0], self.layer_sizes[-1])


class GPTSpec(ModelSpec):
    """Decoder-only language model (GPT-2, Radford et al. 2019; seed 004's GPTModel)."""

    family: Literal["gpt"] = "gpt"


class EncoderSpec(ModelSpec):
    """Bidirectional encoder scored by masked-token prediction (BERT-style, Devlin et al. 2019).

    Masked positions get token ``vocab_size - 1``; only they are scored.
    """

    family: Literal["encoder"] = "encoder"
    mask_prob: float = Field(
        0.15, gt=0.0, lt=1.0, description="fraction of positions masked and scored (position 0 "
        "always is)")

    @property
    def causal(self) -> bool:
        return False

    def make_batch(self, batch_size, seq_len, *, tokens=None, generator=None) -> Batch:
        base = super().make_batch(batch_size, seq_len, tokens=tokens, generator=generator)
        idx = base.inputs["idx"]  # (B, T)
        masked = torch.rand(idx.shape, generator=generator) < self.mask_prob
        masked[:, 0] = True  # at least one scored position per row
        target = torch.where(masked, idx, torch.full_like(idx, -100))
        idx = torch.where(masked, torch.full_like(idx, self.vocab_size - 1), idx)
        return Batch({"idx": idx}, target, n_tokens=idx.numel())


class DecoderSpec(ModelSpec):
    """Seed 001's decoder stack (self- and cross-attention) over a given memory (B, S, D).

    The memory is an input of the forward; random here.
    """

    family: Literal["decoder"] = "decoder"

    @model_validator(mode="after")
    def _sublayer_residual(self):
        return sublayer_residual_only(self, "has three sublayers per layer (cross-attention)")

    def make_batch(self, batch_size, seq_len, *, tokens=None, generator=None) -> Batch:
        base = super().make_batch(batch_size, seq_len, tokens=tokens, generator=generator)
        memory = torch.randn(batch_size, seq_len, self.emb_dim, generator=generator)
        return Batch({**base.inputs, "memory": memory}, base.target, base.n_tokens)


class EncoderDecoderSpec(ModelSpec):
    """Encoder-decoder Transformer (Vaswani et al. 2017; seed 001), trained to reverse its input.

    Reversing the source sequence is a task that needs cross-attention.
    """

    family: Literal["encoder_decoder"] = "encoder_decoder"
    share_embeddings: bool = Field(
        False, description="encoder embedding, decoder embedding and output projection are one "
        "matrix (Vaswani et al. 2017, sec. 3.4); needs one vocabulary for source and target")

    @model_validator(mode="after")
    def _sublayer_residual(self):
        return sublayer_residual_only(
            self, "has three sublayers per decoder layer (cross-attention)")

    def make_batch(self, batch_size, seq_len, *, tokens=None, generator=None) -> Batch:
        base = super().make_batch(batch_size, seq_len, tokens=tokens, generator=generator)
        src = base.inputs["idx"]  # (B, T)
        target = src.flip(1)  # (B, T)
        bos = torch.zeros_like(target[:, :1])
        tgt = torch.cat([bos, target[:, :-1]], dim=1)  # teacher forcing, shifted right
        return Batch({"src": src, "tgt": tgt}, target, n_tokens=2 * src.numel())


@hookimpl
def register_models(register):
    register("block", BlockSpec, families.BlockModel)
    register("gpt", GPTSpec, families.GPTModel)
    register("encoder", EncoderSpec, families.EncoderModel)
    register("decoder", DecoderSpec, families.DecoderModel)
    register("encoder_decoder", EncoderDecoderSpec, families.EncoderDecoderModel)
    register("mlp", MLPFamilySpec, families.DeepMLP)
