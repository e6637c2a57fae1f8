"""A word-level LSTM language model shaped like bigLSTM (LSTM with a projection layer).

bigLSTM (Jozefowicz et al. 2016, "Exploring the Limits of Language Modeling", §2–4; the "BIG LSTM" of
Micikevicius et al. 2018, §4.4 and Figure 1): a word embedding, a stack of LSTM layers whose hidden state is
projected to a smaller size after every step (LSTMP, Sak et al. 2014: 8192 cells projected to 1024 in the
paper's 2-layer model), and a softmax over the vocabulary (sampled during training in the paper), trained with
Adagrad.  Here the same architecture is built from ``torch.nn.LSTM(..., proj_size=...)``, sized by
:data:`CONFIGS`, with a full softmax (our vocabularies are ≈ 10⁴ words, not 800 k); the loss is the mean
cross-entropy over all batch × time tokens, in nats per token.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

__all__ = ["LSTMLanguageModel", "build_lstm_lm", "CONFIGS"]

#: Named sizes.  "lean", "tiny" and "small" train on one CPU core ("lean" keeps a step with tens of thousands of
#: tokens cheap: its LSTM and softmax layer cost half of "tiny"'s per token); "big" is the paper's bigLSTM for
#: reference (2 × 8192 cells projected to 1024, embedding 1024; ≈ 1.8 G parameters with its 793 k vocabulary).
CONFIGS: dict[str, dict] = {
    "lean": dict(embed_dim=32, hidden_size=128, proj_size=32, num_layers=1),
    "tiny": dict(embed_dim=64, hidden_size=256, proj_size=64, num_layers=1),
    "small": dict(embed_dim=128, hidden_size=512, proj_size=128, num_layers=2),
    "medium": dict(embed_dim=256, hidden_size=2048, proj_size=256, num_layers=2),
    "big": dict(embed_dim=1024, hidden_size=8192, proj_size=1024, num_layers=2),
}


class LSTMLanguageModel(nn.Module):
    """Embedding → ``num_layers`` LSTM layers with projection → dropout → linear softmax layer.

    Parameters
    ----------
    vocab_size : int ≥ 2
    embed_dim : int ≥ 1, word-embedding size
    hidden_size : int ≥ 1, LSTM cells per layer
    proj_size : int, 0 (no projection) or 1 ≤ proj_size < hidden_size: the projected recurrent state, the
        input of the next layer and of the softmax layer
    num_layers : int ≥ 1
    dropout : float in [0, 1), applied to the embedding, between layers and before the softmax layer

    Shapes
    ------
    ``forward(tokens [T, B] int64, state=None) -> (logits [T, B, vocab_size] float, state)``; ``state`` is
    nn.LSTM's ``(h [L, B, proj_size or hidden], c [L, B, hidden])``.

    Raises
    ------
    TypeError / ValueError
        For sizes that are not positive ints, ``proj_size`` ≥ ``hidden_size``, or ``dropout`` outside [0, 1).
    """

    def __init__(
        self,
        vocab_size: int,
        embed_dim: int = 128,
        hidden_size: int = 512,
        proj_size: int = 128,
        num_layers: int = 2,
        dropout: float = 0.0,
    ):
        super().__init__()
        for name, v, lo in (
            ("vocab_size", vocab_size, 2),
            ("embed_dim", embed_dim, 1),
            ("hidden_size", hidden_size, 1),
            ("num_layers", num_layers, 1),
            ("proj_size", proj_size, 0),
        ):
            if not isinstance(v, int) or isinstance(v, bool):
                raise TypeError(f"{name} must be an int, got {type(v).__name__}")
            if v < lo:
                raise ValueError(f"{name} must be ≥ {lo}, got {v}")
        if proj_size >= hidden_size:
            raise ValueError(f"proj_size must be smaller than hidden_size ({hidden_size}), got {proj_size}")
        if not 0.0 <= float(dropout) < 1.0:
            raise ValueError(f"dropout must be in [0, 1), got {dropout!r}")
        self.vocab_size = vocab_size
        self.embedding = nn.Embedding(vocab_size, embed_dim)
        self.drop = nn.Dropout(dropout)
        self.lstm = nn.LSTM(
            embed_dim,
            hidden_size,
            num_layers=num_layers,
            proj_size=proj_size,
            dropout=dropout if num_layers > 1 else 0.0,
        )
        self.decoder = nn.Linear(proj_size or hidden_size, vocab_size)
        nn.init.uniform_(self.embedding.weight, -0.1, 0.1)
        nn.init.zeros_(self.decoder.bias)

    def forward(
        self, tokens: torch.Tensor, state: tuple[torch.Tensor, torch.Tensor] | None = None
    ) -> tuple[torch.Tensor, tuple[torch.Tensor, torch.Tensor]]:
        if not isinstance(tokens, torch.Tensor) or tokens.dim() != 2 or tokens.is_floating_point():
            raise TypeError("tokens must be an integer tensor [T, B]")
        out, state = self.lstm(self.drop(self.embedding(tokens)), state)
        return self.decoder(self.drop(out)), state

    def loss(
        self, tokens: torch.Tensor, targets: torch.Tensor, state: tuple[torch.Tensor, torch.Tensor] | None = None
    ) -> tuple[torch.Tensor, tuple[torch.Tensor, torch.Tensor]]:
        """Mean cross-entropy (nats per token, float32) of predicting ``targets`` [T, B]; returns (loss, state)."""
        logits, state = self(tokens, state)
        return nn.functional.cross_entropy(logits.reshape(-1, self.vocab_size).float(), targets.reshape(-1)), state


def build_lstm_lm(config: str, vocab_size: int, **overrides: Any) -> LSTMLanguageModel:
    """An :class:`LSTMLanguageModel` of a named size in :data:`CONFIGS`, with keyword overrides.

    Raises ValueError for an unknown ``config``.
    """
    if config not in CONFIGS:
        raise ValueError(f"config must be one of {tuple(CONFIGS)}, got {config!r}")
    return LSTMLanguageModel(vocab_size, **{**CONFIGS[config], **overrides})
