"""A tiny Vision Transformer for the FSDPv2 cases, written here so that nothing is downloaded.

Imported only inside case bodies (child processes): it imports torch at module level, which the
parent pytest process must never do. Sizes are tiny so that a compile on the CPU backend takes
well under a second; the structure is the one the upstream issue (pytorch/xla#8607, a timm
VisionTransformer) exercised: patch embedding, class token and position embedding, pre-norm
attention blocks, an MLP head. `Block` is the unit `transformer_auto_wrap_policy` wraps.
"""

from __future__ import annotations

import dataclasses
import functools

import torch
from torch import nn


@dataclasses.dataclass(frozen=True)
class ViTConfig:
    image_size: int = 8
    patch_size: int = 4
    channels: int = 3
    dim: int = 32
    depth: int = 2
    heads: int = 4
    mlp_ratio: int = 2
    classes: int = 8

    @property
    def patches(self) -> int:
        return (self.image_size // self.patch_size) ** 2


class PatchEmbed(nn.Module):
    """(B, C, H, W) -> (B, patches, dim) with a strided convolution, as timm does."""

    def __init__(self, cfg: ViTConfig) -> None:
        super().__init__()
        self.proj = nn.Conv2d(cfg.channels, cfg.dim, kernel_size=cfg.patch_size, stride=cfg.patch_size)

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        return self.proj(images).flatten(2).transpose(1, 2)


class Attention(nn.Module):
    def __init__(self, cfg: ViTConfig) -> None:
        super().__init__()
        self.heads = cfg.heads
        self.qkv = nn.Linear(cfg.dim, cfg.dim * 3)
        self.proj = nn.Linear(cfg.dim, cfg.dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, tokens, dim = x.shape
        qkv = self.qkv(x).reshape(batch, tokens, 3, self.heads, dim // self.heads).permute(2, 0, 3, 1, 4)
        q, k, v = qkv.unbind(0)
        weights = (q @ k.transpose(-2, -1)) * (dim // self.heads) ** -0.5
        mixed = weights.softmax(dim=-1) @ v
        # The head merge is a transpose + reshape: views, which is what bug 2a is about.
        return self.proj(mixed.transpose(1, 2).reshape(batch, tokens, dim))


class Mlp(nn.Module):
    def __init__(self, cfg: ViTConfig) -> None:
        super().__init__()
        self.fc1 = nn.Linear(cfg.dim, cfg.dim * cfg.mlp_ratio)
        self.fc2 = nn.Linear(cfg.dim * cfg.mlp_ratio, cfg.dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(nn.functional.gelu(self.fc1(x)))


class Block(nn.Module):
    """One pre-norm transformer block; the FSDPv2 auto-wrap unit."""

    def __init__(self, cfg: ViTConfig) -> None:
        super().__init__()
        self.norm1 = nn.LayerNorm(cfg.dim)
        self.attn = Attention(cfg)
        self.norm2 = nn.LayerNorm(cfg.dim)
        self.mlp = Mlp(cfg)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.norm1(x))
        return x + self.mlp(self.norm2(x))


class ViT(nn.Module):
    def __init__(self, cfg: ViTConfig = ViTConfig()) -> None:
        super().__init__()
        self.cfg = cfg
        self.patch_embed = PatchEmbed(cfg)
        self.cls_token = nn.Parameter(torch.randn(1, 1, cfg.dim) * 0.02)
        self.pos_embed = nn.Parameter(torch.randn(1, cfg.patches + 1, cfg.dim) * 0.02)
        self.blocks = nn.Sequential(*(Block(cfg) for _ in range(cfg.depth)))
        self.norm = nn.LayerNorm(cfg.dim)
        self.head = nn.Linear(cfg.dim, cfg.classes)

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        x = self.patch_embed(images)
        cls = self.cls_token.expand(x.shape[0], -1, -1)
        x = torch.cat([cls, x], dim=1) + self.pos_embed
        x = self.norm(self.blocks(x))
        return self.head(x[:, 0])


def block_wrap_policy():
    """`transformer_auto_wrap_policy` bound to `Block`: each block becomes its own FSDPv2 unit."""
    from torch_xla.distributed.fsdp.wrap import transformer_auto_wrap_policy

    return functools.partial(transformer_auto_wrap_policy, transformer_layer_cls={Block})


def build_vit(seed: int, cfg: ViTConfig = ViTConfig()) -> ViT:
    """A ViT on CPU with weights fixed by `seed` (same seed, same weights, in any process)."""
    torch.manual_seed(seed)
    return ViT(cfg)


def random_batch(seed: int, batch: int, cfg: ViTConfig = ViTConfig()) -> tuple[torch.Tensor, torch.Tensor]:
    """(images, labels) on CPU, fixed by `seed`."""
    generator = torch.Generator().manual_seed(seed)
    images = torch.randn(batch, cfg.channels, cfg.image_size, cfg.image_size, generator=generator)
    labels = torch.randint(0, cfg.classes, (batch,), generator=generator)
    return images, labels


# --------------------------------------------------------------------------------------------
# A tiny decoder-only language model for the scan_layers and shard_as cases
# --------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class DecoderConfig:
    vocab: int = 64
    dim: int = 32
    heads: int = 4
    hidden: int = 64
    depth: int = 3
    tokens: int = 8


class DecoderLayer(nn.Module):
    """Pre-norm causal self-attention and an MLP: the unit `scan_layers` repeats. Everything it
    computes comes from its input (the causal mask too), so one traced layer serves every layer."""

    def __init__(self, cfg: DecoderConfig) -> None:
        super().__init__()
        self.heads = cfg.heads
        self.norm1 = nn.LayerNorm(cfg.dim)
        self.qkv = nn.Linear(cfg.dim, 3 * cfg.dim)
        self.proj = nn.Linear(cfg.dim, cfg.dim)
        self.norm2 = nn.LayerNorm(cfg.dim)
        self.fc1 = nn.Linear(cfg.dim, cfg.hidden)
        self.fc2 = nn.Linear(cfg.hidden, cfg.dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, tokens, dim = x.shape
        head = dim // self.heads
        qkv = self.qkv(self.norm1(x)).reshape(batch, tokens, 3, self.heads, head).permute(2, 0, 3, 1, 4)
        q, k, v = qkv.unbind(0)
        scores = (q @ k.transpose(-2, -1)) * head**-0.5
        future = torch.ones_like(scores[0, 0]).triu(1).bool()
        mixed = scores.masked_fill(future, float("-inf")).softmax(dim=-1) @ v
        x = x + self.proj(mixed.transpose(1, 2).reshape(batch, tokens, dim))
        return x + self.fc2(nn.functional.gelu(self.fc1(self.norm2(x))))


class Decoder(nn.Module):
    """Embedding, `depth` decoder layers, a final norm and the vocabulary head. `use_scan`: run
    the layers with torch_xla's scan_layers (one traced layer for all), else one after another
    (the CPU reference)."""

    def __init__(self, cfg: DecoderConfig = DecoderConfig(), use_scan: bool = True) -> None:
        super().__init__()
        self.use_scan = use_scan
        self.embed = nn.Embedding(cfg.vocab, cfg.dim)
        self.layers = nn.ModuleList(DecoderLayer(cfg) for _ in range(cfg.depth))
        self.norm = nn.LayerNorm(cfg.dim)
        self.head = nn.Linear(cfg.dim, cfg.vocab)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.embed(tokens)
        if self.use_scan:
            from torch_xla.experimental.scan_layers import scan_layers

            x = scan_layers(self.layers, x)
        else:
            for layer in self.layers:
                x = layer(x)
        return self.head(self.norm(x))


def build_decoder(seed: int, cfg: DecoderConfig = DecoderConfig()) -> Decoder:
    torch.manual_seed(seed)
    return Decoder(cfg)


def random_tokens(seed: int, batch: int, cfg: DecoderConfig = DecoderConfig()) -> torch.Tensor:
    """(batch, tokens + 1) token ids on CPU, fixed by `seed`: inputs [:, :-1], targets [:, 1:]."""
    generator = torch.Generator().manual_seed(seed)
    return torch.randint(0, cfg.vocab, (batch, cfg.tokens + 1), generator=generator)
