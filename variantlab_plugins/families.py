"""Model families: a spec class (ModelSpec plus the family's own fields), a build (the
modules in :mod:`variantlab_plugins.models`) and a task: how the models are fed and scored."""

from typing import ClassVar, Literal

import torch
import torch.nn.functional as F
from pydantic import Field, PositiveFloat, PositiveInt, model_validator

from variantlab import ModelSpec, hookimpl
from variantlab.model.build import block_scope
from variantlab.model.tasks import NEXT_TOKEN, Batch, Task
from variantlab_plugins import models


def sublayer_residual_only(spec: ModelSpec, why: str) -> ModelSpec:
    """Refuse a block-scope residual kind (e.g. ``parallel``) in a family that cannot use one."""
    if block_scope(spec.residual):
        raise ValueError(
            f"residual {spec.residual.kind!r} wraps a whole attention + feed-forward block, but "
            f"family {spec.family!r} {why}; choose a per-sublayer residual kind such as pre_norm")
    return spec


class FloatsToZero(Task):
    """Random float inputs (B, T, emb_dim) scored by MSE to zero (seed 004's print_gradients)."""

    inputs = "floats"

    def batch(self, spec, batch_size, seq_len, *, tokens=None, generator=None) -> Batch:
        x = torch.rand(self.input_shape(spec, batch_size, seq_len), generator=generator)
        target = torch.zeros(self.target_shape(spec, tuple(x.shape)))
        return Batch({"x": x}, target, n_tokens=batch_size * seq_len)

    def input_shape(self, spec, batch_size: int, seq_len: int) -> tuple[int, ...]:
        return (batch_size, seq_len, spec.emb_dim)

    def target_shape(self, spec, in_shape: tuple[int, ...]) -> tuple[int, ...]:
        return in_shape

    def loss(self, spec, output, batch):
        return F.mse_loss(output, batch.target)

    def output_shape(self, spec, batch):
        return tuple(batch.target.shape)


class MLPRows(FloatsToZero):
    """Rows of ``layer_sizes[0]`` floats (the spec's fixed ``inputs``, else random), scored by
    MSE to zero at the last width."""

    def batch(self, spec, batch_size, seq_len, *, tokens=None, generator=None) -> Batch:
        if spec.inputs is None:
            return super().batch(spec, batch_size, seq_len, generator=generator)
        x = torch.tensor(spec.inputs)  # (rows, layer_sizes[0])
        target = torch.zeros(len(spec.inputs), spec.layer_sizes[-1])
        return Batch({"x": x}, target, n_tokens=len(spec.inputs))

    def input_shape(self, spec, batch_size, seq_len):
        return (batch_size, spec.layer_sizes[0])

    def target_shape(self, spec, in_shape):
        return (in_shape[0], spec.layer_sizes[-1])


class MaskedTokens(Task):
    """Masked-token prediction (BERT, Devlin et al. 2019): a ``mask_prob`` share of the
    positions (position 0 always) get token ``vocab_size - 1`` and only they are scored."""

    def batch(self, spec, batch_size, seq_len, *, tokens=None, generator=None) -> Batch:
        base = super().batch(spec, batch_size, seq_len, tokens=tokens, generator=generator)
        idx = base.inputs["idx"]  # (B, T)
        masked = torch.rand(idx.shape, generator=generator) < spec.mask_prob
        masked[:, 0] = True  # at least one scored position per row
        target = torch.where(masked, idx, torch.full_like(idx, -100))
        idx = torch.where(masked, torch.full_like(idx, spec.vocab_size - 1), idx)
        return Batch({"idx": idx}, target, n_tokens=idx.numel())


class NextTokenOverMemory(Task):
    """Next-token prediction with a random memory (B, S, emb_dim) to cross-attend to."""

    def batch(self, spec, batch_size, seq_len, *, tokens=None, generator=None) -> Batch:
        base = super().batch(spec, batch_size, seq_len, tokens=tokens, generator=generator)
        memory = torch.randn(batch_size, seq_len, spec.emb_dim, generator=generator)
        return Batch({**base.inputs, "memory": memory}, base.target, base.n_tokens)


class Reverse(Task):
    """Reverse the source sequence (a task that needs cross-attention), teacher-forced: the
    decoder reads the reversed target shifted right behind a token 0."""

    def batch(self, spec, batch_size, seq_len, *, tokens=None, generator=None) -> Batch:
        base = super().batch(spec, batch_size, seq_len, tokens=tokens, generator=generator)
        src = base.inputs["idx"]  # (B, T)
        target = src.flip(1)  # (B, T)
        bos = torch.zeros_like(target[:, :1])
        tgt = torch.cat([bos, target[:, :-1]], dim=1)  # (B, T) shifted right
        return Batch({"src": src, "tgt": tgt}, target, n_tokens=2 * src.numel())


class BlockSpec(ModelSpec):
    """One transformer block on float input (B, T, emb_dim), as seed 000 runs it."""

    family: Literal["block"] = "block"
    layered: ClassVar[bool] = False  # one block: nothing for a layout to vary
    causal_attention: bool = Field(
        True, description="mask future positions in the block's attention (the seed's block does)")

    @property
    def causal(self) -> bool:
        return self.causal_attention


class MLPFamilySpec(ModelSpec):
    """Deep MLP of seed 004's shortcut experiment: Linear -> activation per layer, in residuals."""

    family: Literal["mlp"] = "mlp"
    layered: ClassVar[bool] = False  # Linear layers, no slots per layer
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


class GPTSpec(ModelSpec):
    """Decoder-only language model (GPT-2, Radford et al. 2019; seed 004's GPTModel)."""

    family: Literal["gpt"] = "gpt"
    added_options: ClassVar[tuple[str, ...]] = ModelSpec.added_options + (
        "scale_embeddings", "logit_softcap", "embedding_norm", "head_bias", "token_dim",
        "emb_multiplier", "logit_scale")
    scale_embeddings: bool = Field(
        False, description="token embeddings times sqrt(emb_dim) before the first block "
        "(Gemma)")
    logit_softcap: PositiveFloat | None = Field(
        None, description="soft-cap the output logits to (-cap, cap) with cap * tanh(logit / "
        "cap) (Gemma 2); unset: none")
    embedding_norm: bool = Field(
        False, description="a norm of the model's kind on the embeddings, after the "
        "positional and before the first block (BLOOM's word_embeddings_layernorm)")
    head_bias: bool = Field(
        False, description="a bias on the output projection (GPT-J's and Phi-1/2's lm_head)")
    token_dim: PositiveInt | None = Field(
        None, description="width of the token embeddings and the output head when it differs "
        "from emb_dim: projected to emb_dim before the positional and back after the final "
        "norm, bias-free (OPT-350m's project_in / project_out); unset: emb_dim")
    emb_multiplier: PositiveFloat | None = Field(
        None, description="token embeddings times this before the first block (Granite's "
        "embedding_multiplier); unset: none")
    logit_scale: PositiveFloat | None = Field(
        None, description="output logits times this, before any soft-cap (Cohere's "
        "logit_scale, Granite's 1 / logits_scaling); unset: none")


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


class DecoderSpec(ModelSpec):
    """Seed 001's decoder stack (self- and cross-attention) over a given memory (B, S, D).

    The memory is an input of the forward; random here.
    """

    family: Literal["decoder"] = "decoder"
    cross_attention: ClassVar[bool] = True  # no causal-only mixer in its slot

    @model_validator(mode="after")
    def _sublayer_residual(self):
        return sublayer_residual_only(self, "has three sublayers per layer (cross-attention)")


class EncoderDecoderSpec(ModelSpec):
    """Encoder-decoder Transformer (Vaswani et al. 2017; seed 001), trained to reverse its input.

    Reversing the source sequence is a task that needs cross-attention.
    """

    family: Literal["encoder_decoder"] = "encoder_decoder"
    cross_attention: ClassVar[bool] = True  # no causal-only mixer in its slot
    share_embeddings: bool = Field(
        False, description="encoder embedding, decoder embedding and output projection are one "
        "matrix (Vaswani et al. 2017, sec. 3.4); needs one vocabulary for source and target")

    @model_validator(mode="after")
    def _sublayer_residual(self):
        return sublayer_residual_only(
            self, "has three sublayers per decoder layer (cross-attention)")


@hookimpl
def register_families(register):
    register("block", BlockSpec, models.BlockModel, task=FloatsToZero())
    register("gpt", GPTSpec, models.GPTModel, task=NEXT_TOKEN)
    register("encoder", EncoderSpec, models.EncoderModel, task=MaskedTokens())
    register("decoder", DecoderSpec, models.DecoderModel, task=NextTokenOverMemory())
    register("encoder_decoder", EncoderDecoderSpec, models.EncoderDecoderModel, task=Reverse())
    register("mlp", MLPFamilySpec, models.DeepMLP, task=MLPRows())
