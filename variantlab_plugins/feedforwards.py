"""Position-wise feed-forward sublayers: (B, T, emb_dim) -> (B, T, emb_dim)."""

from typing import ClassVar, Literal

from pydantic import Field, PositiveFloat, PositiveInt
from torch import nn

from variantlab import ComponentSpec, hookimpl
from variantlab.model.roles import declare_role


class MLPSpec(ComponentSpec):
    """Position-wise MLP (Vaswani et al. 2017, sec. 3.3): Linear -> activation -> Linear."""

    kind: Literal["mlp"] = "mlp"
    hidden_mult: PositiveFloat = Field(4, description="hidden width = hidden_mult * emb_dim")
    hidden_dim: PositiveInt | None = Field(
        None, description="hidden width; overrides hidden_mult when set")


class MLP(nn.Module):
    """Linear(D, hidden) -> activation -> Linear(hidden, D) (Vaswani et al. 2017, sec. 3.3)."""

    def __init__(self, emb_dim: int, hidden: int, activation: nn.Module, bias: bool = True):
        super().__init__()
        self.layers = nn.Sequential(
            nn.Linear(emb_dim, hidden, bias=bias), activation, nn.Linear(hidden, emb_dim, bias=bias)
        )
        declare_role(self.layers[0], "ffn_in")
        declare_role(self.layers[2], "ffn_out")

    def forward(self, x):  # (B, T, emb_dim)
        return self.layers(x)


class GLUSpec(ComponentSpec):
    """Gated feed-forward (Shazeer 2020): W_down(act(W_gate x) * W_up x); SwiGLU with silu."""

    kind: Literal["glu"] = "glu"
    walk_examples: ClassVar[tuple[dict, ...]] = (  # tests/test_registry_walk.py tries these
        {"kind": "glu", "bias": True},)
    hidden_mult: PositiveFloat = Field(
        8 / 3, description="hidden width = hidden_mult * emb_dim; 8/3 keeps the mlp's "
        "parameter count")
    hidden_dim: PositiveInt | None = Field(
        None, description="hidden width; overrides hidden_mult when set")
    bias: bool = Field(
        False, description="biases in W_gate, W_up and W_down (Llama's mlp_bias); the model's "
        "ffn_bias does not reach glu")


class GLU(nn.Module):
    """Gated FFN (Shazeer 2020): W_down(act(W_gate x) * W_up x); SwiGLU with silu."""

    def __init__(self, emb_dim: int, hidden: int, activation: nn.Module, bias: bool = False):
        super().__init__()
        self.W_gate = nn.Linear(emb_dim, hidden, bias=bias)
        self.W_up = nn.Linear(emb_dim, hidden, bias=bias)
        self.W_down = nn.Linear(hidden, emb_dim, bias=bias)
        self.activation = activation
        declare_role(self.W_gate, "ffn_gate")
        declare_role(self.W_up, "ffn_in")
        declare_role(self.W_down, "ffn_out")

    def forward(self, x):  # (B, T, emb_dim)
        hidden = self.activation(self.W_gate(x)) * self.W_up(x)  # (B, T, hidden)
        return self.W_down(hidden)


class NoFeedForwardSpec(ComponentSpec):
    """No feed-forward sublayer: the block is its mixer alone (Mamba and Mamba-2 blocks,
    Gu & Dao 2023; Dao & Gu 2024: norm, mixer, residual). The block leaves out the
    feed-forward's residual and norm too, so no parameter is added."""

    kind: Literal["none"] = "none"


class NoFeedForward(nn.Module):
    """Zeros of the input's shape; ``absent`` tells the transformer block to skip the
    feed-forward sublayer (and its residual and norm) altogether."""

    absent = True

    def forward(self, x):  # (B, T, emb_dim)
        return x * 0.0


def hidden_size(spec, emb_dim: int) -> int:
    return spec.hidden_dim or max(1, round(spec.hidden_mult * emb_dim))


@hookimpl
def register_feedforwards(register):
    register("mlp", MLPSpec, lambda spec, emb_dim, make_activation, bias=True: MLP(
        emb_dim, hidden_size(spec, emb_dim), make_activation(), bias))
    register("none", NoFeedForwardSpec, lambda spec, emb_dim, make_activation: NoFeedForward())
    register("glu", GLUSpec, lambda spec, emb_dim, make_activation: GLU(
        emb_dim, hidden_size(spec, emb_dim), make_activation(), spec.bias))
