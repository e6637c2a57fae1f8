"""A small decoder-only transformer language model over characters, from ``torch.nn`` building blocks.

The model of chapter 10's FP8 and block-scaling runs (:mod:`mpt_lab.experiments.fp8_recipes`), trained on
:func:`mpt_lab.data.kjv_characters`.  GPT-2's layout (Radford et al., 2019): token and learned position
embeddings, pre-LayerNorm blocks of causal self-attention and a GELU MLP, a final LayerNorm and a linear
output layer; its Linear layers are what FP8 recipes quantise.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as Fn
from torch import nn

__all__ = ["TransformerBlock", "CharTransformerLM"]


class TransformerBlock(nn.Module):
    """Pre-LayerNorm transformer block: x + proj(attention(ln1 x)), then x + fc2(gelu(fc1(ln2 x))).

    Causal multi-head self-attention with ``heads`` heads (``scaled_dot_product_attention``; ``dim`` divisible
    by ``heads``) and an MLP of width 4·dim.  Input and output float [batch, time, dim].
    """

    def __init__(self, dim: int, heads: int):
        super().__init__()
        self.heads = heads
        self.ln1, self.ln2 = nn.LayerNorm(dim), nn.LayerNorm(dim)
        self.qkv, self.proj = nn.Linear(dim, 3 * dim), nn.Linear(dim, dim)
        self.fc1, self.fc2 = nn.Linear(dim, 4 * dim), nn.Linear(4 * dim, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, c = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(c, -1)
        heads = [z.view(b, t, self.heads, c // self.heads).transpose(1, 2) for z in (q, k, v)]
        a = Fn.scaled_dot_product_attention(*heads, is_causal=True)
        x = x + self.proj(a.transpose(1, 2).reshape(b, t, c))
        return x + self.fc2(Fn.gelu(self.fc1(self.ln2(x))))


class CharTransformerLM(nn.Module):
    """A decoder-only transformer language model over characters.

    Token and learned position embeddings, ``layers`` :class:`TransformerBlock` s (causal multi-head
    self-attention with ``heads`` heads; an MLP of width 4·dim with GELU), a final LayerNorm and a linear output
    layer ``head`` (no bias, not tied).  Initialisation as GPT-2: weights N(0, 0.02²), the layers that write
    into the residual stream (``proj``, ``fc2``) N(0, (0.02/√(2·layers))²), biases zero.

    Input int64 [batch, time ≤ context]; output logits float32 [batch, time, vocab_size].  The Linear layers
    are ``blocks.i.qkv``, ``blocks.i.proj``, ``blocks.i.fc1``, ``blocks.i.fc2`` and ``head``.

    Raises ValueError for sizes < 1 or a ``dim`` not divisible by ``heads``.
    """

    def __init__(self, vocab_size: int, dim: int = 64, layers: int = 2, heads: int = 4, context: int = 64):
        super().__init__()
        for name, v in (
            ("vocab_size", vocab_size),
            ("dim", dim),
            ("layers", layers),
            ("heads", heads),
            ("context", context),
        ):
            if not isinstance(v, int) or isinstance(v, bool) or v < 1:
                raise ValueError(f"{name} must be an int ≥ 1, got {v!r}")
        if dim % heads:
            raise ValueError(f"dim ({dim}) must be divisible by heads ({heads})")
        self.vocab_size, self.context = vocab_size, context
        self.tok, self.pos = nn.Embedding(vocab_size, dim), nn.Embedding(context, dim)
        self.blocks = nn.ModuleList(TransformerBlock(dim, heads) for _ in range(layers))
        self.ln = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, vocab_size, bias=False)
        for name, p in self.named_parameters():
            if p.dim() == 2:
                small = name.endswith(("proj.weight", "fc2.weight"))
                nn.init.normal_(p, 0.0, 0.02 / math.sqrt(2 * layers) if small else 0.02)
            elif name.endswith("bias"):
                nn.init.zeros_(p)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        x = self.tok(ids) + self.pos(torch.arange(ids.shape[1], device=ids.device))
        for block in self.blocks:
            x = block(x)
        return self.head(self.ln(x))
