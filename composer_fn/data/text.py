"""A character-level language-modelling task built from the Python standard library's own source files.

Every Python installation carries its standard library as source, so the corpus needs no download. The text
is the files of ``STDLIB_FILES``, read as UTF-8 from ``sysconfig.get_paths()["stdlib"]`` in that fixed order
and joined with a newline, then cut to its first ``max_chars`` characters. The files' text differs between
CPython versions, so the corpus does too; everything built from the text is a pure function of it:

- the vocabulary is the sorted set of the characters of the (cut) text, so id ``i`` is ``vocab[i]``;
- the text is cut into consecutive, non-overlapping windows of ``seq_len + 1`` characters (the tail that does
  not fill a window is dropped); window ``w`` gives the row ``input_ids = window[:-1]``,
  ``labels = window[1:]``, so each label is the character that follows its input;
- window ``w`` is held out if and only if ``floor((w + 1) * eval_fraction) > floor(w * eval_fraction)``,
  which spreads the held-out windows evenly over the text (every tenth window for 0.1) so that evaluation
  samples every file rather than the last one. No character position belongs to both parts.

``seed`` decides only the order in which the training loader visits its rows.
"""

from __future__ import annotations

import functools
import sysconfig
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from torch import Tensor

from composer_fn.core.validate import integer, real
from composer_fn.data.loader import TensorLoader

__all__ = ["TextTask", "load_stdlib_text_task", "stdlib_text", "STDLIB_FILES", "MAX_CHARS"]

STDLIB_FILES: tuple[str, ...] = (
    "textwrap.py",
    "difflib.py",
    "argparse.py",
    "functools.py",
    "dataclasses.py",
    "statistics.py",
    "fractions.py",
    "random.py",
    "heapq.py",
    "calendar.py",
    "contextlib.py",
    "enum.py",
    "inspect.py",
    "typing.py",
    "shlex.py",
    "string.py",
    "queue.py",
    "copy.py",
    "operator.py",
    "types.py",
    "abc.py",
    "bisect.py",
    "colorsys.py",
    "fnmatch.py",
    "glob.py",
    "csv.py",
    "pprint.py",
    "keyword.py",
)
"""The standard-library modules whose source makes the corpus, in order (single files in CPython 3.11+)."""

MAX_CHARS = 1_000_000
"""The largest accepted ``max_chars``; the files above hold somewhat less than this."""


@dataclass(frozen=True, eq=False)
class TextTask:
    """A character-level task: loaders of ``(input_ids, labels)`` rows and the vocabulary.

    ``train`` shuffles its rows each epoch (keyed by ``seed``) and drops the last incomplete batch, so every
    training batch has the same shape; ``eval`` visits the held-out rows in order, all of them. Both yield
    tuples ``(input_ids int64 [B, seq_len], labels int64 [B, seq_len])``. ``vocab[i]`` is the character of id
    ``i``; ``num_chars`` is the length of the text the rows were cut from.
    """

    train: TensorLoader
    eval: TensorLoader
    vocab: str
    vocab_size: int
    num_chars: int

    def encode(self, text: str) -> Tensor:
        """Returns the ids ``int64 [len(text)]`` of ``text``, whose characters must all be in ``vocab``."""
        missing = sorted(set(text) - set(self.vocab))
        if missing:
            raise ValueError(f"text holds characters {missing[:10]!r} that are not in the vocabulary")
        index = {character: i for i, character in enumerate(self.vocab)}
        return torch.tensor([index[character] for character in text], dtype=torch.int64)

    def decode(self, ids: Tensor) -> str:
        """Returns the text of the ids ``ids`` (any shape, read in row-major order)."""
        return "".join(self.vocab[i] for i in ids.flatten().tolist())


@functools.lru_cache(maxsize=1)
def stdlib_text() -> str:
    """Returns the whole corpus: the ``STDLIB_FILES`` of this interpreter's standard library, newline-joined."""
    folder = Path(sysconfig.get_paths()["stdlib"])
    parts = []
    for name in STDLIB_FILES:
        path = folder / name
        if not path.is_file():
            raise FileNotFoundError(
                f"the standard-library source file {path} is missing; the text task needs it"
            )
        parts.append(path.read_text(encoding="utf-8"))
    return "\n".join(parts)


def load_stdlib_text_task(
    *,
    seq_len: int = 64,
    batch_size: int = 32,
    max_chars: int = 200_000,
    seed: int = 0,
    eval_fraction: float = 0.1,
) -> TextTask:
    """Returns the character-level task cut from the first ``max_chars`` characters of ``stdlib_text()``.

    See the module docstring for the vocabulary, the rows and the split; they depend on the text alone.
    """
    for name, value, low in (
        ("seq_len", seq_len, 1),
        ("batch_size", batch_size, 1),
        ("max_chars", max_chars, 2),
    ):
        integer(name, value, minimum=low)
    if max_chars > MAX_CHARS:
        raise ValueError(f"max_chars={max_chars!r} must be at most {MAX_CHARS} (the task stays small)")
    real("eval_fraction", eval_fraction, minimum=0.0, maximum=1.0, open_below=True, open_above=True)
    text = stdlib_text()[:max_chars]
    # Code points through numpy: a vectorised sort and search instead of a Python loop over every character.
    points = np.frombuffer(text.encode("utf-32-le"), dtype=np.uint32)
    alphabet = np.unique(points)
    ids = torch.from_numpy(np.searchsorted(alphabet, points).astype(np.int64))
    window = seq_len + 1
    num_windows = len(text) // window
    windows = ids[: num_windows * window].view(num_windows, window)
    index = torch.arange(num_windows, dtype=torch.float64)
    held_out = torch.floor((index + 1) * eval_fraction) > torch.floor(index * eval_fraction)
    train_rows, eval_rows = windows[~held_out], windows[held_out]
    if train_rows.shape[0] < batch_size or eval_rows.shape[0] < 1:
        raise ValueError(
            f"max_chars={max_chars} gives {train_rows.shape[0]} training and {eval_rows.shape[0]} held-out rows of "
            f"{window} characters: expected at least batch_size={batch_size} and 1; raise max_chars"
        )
    return TextTask(
        train=TensorLoader(
            (train_rows[:, :-1].contiguous(), train_rows[:, 1:].contiguous()),
            batch_size,
            shuffle=True,
            drop_last=True,
            seed=seed,
        ),
        eval=TensorLoader(
            (eval_rows[:, :-1].contiguous(), eval_rows[:, 1:].contiguous()), batch_size, shuffle=False
        ),
        vocab="".join(map(chr, alphabet.tolist())),
        vocab_size=len(alphabet),
        num_chars=len(text),
    )
