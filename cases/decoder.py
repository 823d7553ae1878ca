"""A tiny decoder of the shape torchprime trains (Llama's), for the training-job cases.

Imported only inside case bodies (child processes): it imports torch at module level. The parts
are Llama's: a token embedding, pre-norm layers of RMSNorm, rotary causal self-attention (q, k,
v, o projections without bias) and a gated MLP (SiLU(gate) * up, then down), a final RMSNorm and
a vocabulary head. Sizes are tiny so that a compile on the CPU backend takes well under a second.

`Decoder.remat`: a function that runs each layer (`remat(layer, x)`), as torchprime's
`add_activation_checkpointing_and_scan` wraps its layers with torch_xla's checkpoint; None runs
them one after another. `Decoder.scan`: a function that runs all of them (`scan(layers, x)`), as
that function does with scan on: torch_xla's scan_layers, rematerializing inside the scan.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn


@dataclasses.dataclass(frozen=True)
class DecoderConfig:
    """Its defaults are cases.jobsize's `tiny`."""

    vocab: int = 64
    dim: int = 32
    heads: int = 4
    hidden: int = 64
    depth: int = 2
    tokens: int = 8


def config_of(size: str) -> DecoderConfig:
    """The decoder of a named size (cases.jobsize.SIZES, --spmd-job-size)."""
    from cases.jobsize import SIZES

    if size not in SIZES:
        raise ValueError(f"unknown job size {size!r}; known: {', '.join(SIZES)}")
    return DecoderConfig(**SIZES[size])


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


def rotate(x: torch.Tensor) -> torch.Tensor:
    """Rotary position embedding of (batch, heads, tokens, head_dim), angles made from the shape
    (no buffer: nothing the sharding of a parameter could miss)."""
    tokens, half = x.shape[-2], x.shape[-1] // 2
    frequencies = 10000.0 ** (-torch.arange(half, device=x.device, dtype=x.dtype) / half)
    angles = torch.arange(tokens, device=x.device, dtype=x.dtype)[:, None] * frequencies[None, :]
    cos, sin = angles.cos(), angles.sin()
    first, second = x[..., :half], x[..., half:]
    return torch.cat([first * cos - second * sin, first * sin + second * cos], dim=-1)


class Attention(nn.Module):
    def __init__(self, cfg: DecoderConfig) -> None:
        super().__init__()
        self.heads = cfg.heads
        self.q_proj = nn.Linear(cfg.dim, cfg.dim, bias=False)
        self.k_proj = nn.Linear(cfg.dim, cfg.dim, bias=False)
        self.v_proj = nn.Linear(cfg.dim, cfg.dim, bias=False)
        self.o_proj = nn.Linear(cfg.dim, cfg.dim, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, tokens, dim = x.shape
        head = dim // self.heads

        def split(t: torch.Tensor) -> torch.Tensor:
            return t.reshape(batch, tokens, self.heads, head).transpose(1, 2)

        q, k, v = rotate(split(self.q_proj(x))), rotate(split(self.k_proj(x))), split(self.v_proj(x))
        scores = (q @ k.transpose(-2, -1)) * head**-0.5
        future = torch.ones(tokens, tokens, device=x.device, dtype=torch.bool).triu(1)
        mixed = scores.masked_fill(future, float("-inf")).softmax(dim=-1) @ v
        return self.o_proj(mixed.transpose(1, 2).reshape(batch, tokens, dim))


class GatedMlp(nn.Module):
    def __init__(self, cfg: DecoderConfig) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(cfg.dim, cfg.hidden, bias=False)
        self.up_proj = nn.Linear(cfg.dim, cfg.hidden, bias=False)
        self.down_proj = nn.Linear(cfg.hidden, cfg.dim, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class DecoderLayer(nn.Module):
    def __init__(self, cfg: DecoderConfig) -> None:
        super().__init__()
        self.input_norm = RMSNorm(cfg.dim)
        self.attn = Attention(cfg)
        self.post_attention_norm = RMSNorm(cfg.dim)
        self.mlp = GatedMlp(cfg)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.input_norm(x))
        return x + self.mlp(self.post_attention_norm(x))


class Decoder(nn.Module):
    def __init__(self, cfg: DecoderConfig = DecoderConfig()) -> None:
        super().__init__()
        self.embed = nn.Embedding(cfg.vocab, cfg.dim)
        self.layers = nn.ModuleList(DecoderLayer(cfg) for _ in range(cfg.depth))
        self.norm = RMSNorm(cfg.dim)
        self.head = nn.Linear(cfg.dim, cfg.vocab, bias=False)
        self.remat: Callable[[nn.Module, torch.Tensor], torch.Tensor] | None = None
        self.scan: Callable[[nn.ModuleList, torch.Tensor], torch.Tensor] | None = None

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.embed(tokens)
        if self.scan is not None:  # all layers as one traced layer (torch_xla's scan_layers)
            x = self.scan(self.layers, x)
        else:
            for layer in self.layers:
                x = self.remat(layer, x) if self.remat is not None else layer(x)
        return self.head(self.norm(x))


# RMSNorms a layer computes (input_norm, post_attention_norm): what a rematerialized layer's
# backward computes again, each an rsqrt in the step graph.
NORMS_PER_LAYER = 2

# torchprime's Llama fsdp x tensor sharding config (llama-fsdp-tp), by parameter name suffix:
# the column-parallel projections cut their output rows over tensor, the row-parallel ones their
# input columns, each also cut over fsdp; norms over fsdp.
TENSOR_PARALLEL_SPECS: dict[str, tuple[str, ...]] = {
    "embed.weight": ("tensor", "fsdp"),
    "q_proj.weight": ("tensor", "fsdp"),
    "k_proj.weight": ("tensor", "fsdp"),
    "v_proj.weight": ("tensor", "fsdp"),
    "o_proj.weight": ("fsdp", "tensor"),
    "gate_proj.weight": ("tensor", "fsdp"),
    "up_proj.weight": ("tensor", "fsdp"),
    "down_proj.weight": ("fsdp", "tensor"),
    "norm.weight": ("fsdp",),
    "head.weight": ("tensor", "fsdp"),
}


def tensor_parallel_spec(name: str) -> tuple[str, ...]:
    for suffix, spec in TENSOR_PARALLEL_SPECS.items():
        if name.endswith(suffix):
            return spec
    raise KeyError(f"no fsdp x tensor spec for parameter {name!r}")


def build_decoder(seed: int, cfg: DecoderConfig = DecoderConfig()) -> Decoder:
    """A decoder on CPU with weights fixed by `seed` (same seed, same weights, in any process)."""
    torch.manual_seed(seed)
    return Decoder(cfg)


def token_batches(seed: int, count: int, rows: int, cfg: DecoderConfig = DecoderConfig()) -> torch.Tensor:
    """(count * rows, tokens + 1) token ids on CPU, fixed by `seed`: batch i is rows [i*rows, (i+1)*rows);
    inputs [:, :-1], targets [:, 1:]."""
    generator = torch.Generator().manual_seed(seed)
    return torch.randint(0, cfg.vocab, (count * rows, cfg.tokens + 1), generator=generator)


def next_token_loss(model: Any, tokens: torch.Tensor) -> torch.Tensor:
    logits = model(tokens[:, :-1])
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), tokens[:, 1:].reshape(-1))
