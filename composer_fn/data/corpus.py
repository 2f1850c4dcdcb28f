"""A text corpus from local files for a causal language model: split by document, tokenized, packed into rows.

``load_text_corpus(source, sequence_length=...)`` reads ``source``, holds out whole documents, tokenizes both parts
with one tokenizer and packs each into rows of exactly ``sequence_length`` tokens (``packed_text``):

- **Sources** (nothing is downloaded): a folder of text files, each file one document named by its path in the
  folder (read as UTF-8; hidden files and folders are skipped); a folder or file of tables that ``datasets``
  reads (``.parquet``, ``.arrow``, ``.json``, ``.jsonl``, ``.csv``), each row one document named by its index; a
  ``.txt`` file, each line one document; a folder written by ``save_to_disk`` (a ``Dataset``, or a ``DatasetDict``
  whose ``validation`` or else ``test`` split is the held-out part); or ``python-docs``, the Python
  documentation's reStructuredText sources that Debian's ``python3-doc`` installs
  (``/usr/share/doc/python3.X/html/_sources``, the newest ``X`` found).
- **The split**: a document is held out when the first 8 bytes of the SHA-256 of its name, read as a big-endian
  integer, are below ``heldout_fraction * 2**64``. The rule depends on the name alone, so a document stays on its
  side when others are added or removed, and no held-out text is ever trained on.
- **The tokenizer**: ``"bpe"`` (the default) or ``"bpe:N"`` trains a byte-level BPE of ``N`` tokens (4096 by default)
  with the ``tokenizers`` library on the training documents only, its token 0 ``<|endoftext|>``; training is
  deterministic, so every process of a run trains the same one. A ``tokenizer.json`` file is read with
  ``tokenizers.Tokenizer.from_file``; a folder holding a ``transformers`` tokenizer with ``AutoTokenizer``
  (local files only); a tokenizer object is taken as it is.
- **Rows**: the documents of each part are joined by the end-of-text token (the tokenizer's ``<|endoftext|>`` or
  ``eos_token_id``) and cut into rows; ``labels`` are the row's own ids (the model shifts them).

``bytes_per_token`` (UTF-8 bytes of the held-out rows' decoded text per token) turns a held-out loss in nats per
token into bits per byte, a figure that does not depend on the tokenizer: ``loss / ln 2 / bytes_per_token``.

``datasets`` and ``tokenizers`` (or ``transformers``) are extras: ``pip install -e '.[datasets]'`` (``composer_fn.core.extras``).
"""

from __future__ import annotations

import contextlib
import hashlib
import math
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from composer_fn.core.extras import install_command
from composer_fn.core.validate import integer, real
from composer_fn.data.hf import _datasets, packed_text

__all__ = [
    "TextCorpus",
    "load_text_corpus",
    "python_docs_folder",
    "is_heldout",
    "train_bpe",
    "tokenizer_json",
    "tokenizer_from_json",
    "PYTHON_DOCS",
    "END_OF_TEXT",
    "TABLE_SUFFIXES",
]

PYTHON_DOCS = "python-docs"
"""The name of the Python documentation's sources as a corpus."""

END_OF_TEXT = "<|endoftext|>"
"""The token that joins documents; id 0 of a tokenizer trained here."""

TABLE_SUFFIXES = {".parquet": "parquet", ".arrow": "arrow", ".json": "json", ".jsonl": "json", ".csv": "csv"}
"""The table files ``datasets`` reads, by suffix, with the builder that reads them."""

_DOCS_ROOT = Path("/usr/share/doc")


@dataclass(frozen=True, eq=False)
class TextCorpus:
    """A corpus packed into rows: ``train`` and ``heldout`` are ``datasets.Dataset``s with the columns
    ``input_ids``, ``labels`` and ``attention_mask`` (``int64 [sequence_length]`` a row); ``documents`` counts the
    documents of each part; ``bytes_per_token`` is measured on the held-out rows (see the module docstring)."""

    name: str
    train: Any
    heldout: Any
    text_column: str
    tokenizer: Any
    vocab_size: int
    sequence_length: int
    end_of_text: int | None
    bytes_per_token: float
    documents: tuple[int, int]

    def bits_per_byte(self, loss: float) -> float:
        """Returns the held-out ``loss`` (nats per token) in bits per byte of text."""
        return loss / math.log(2) / self.bytes_per_token


def is_heldout(name: str, fraction: float) -> bool:
    """Returns whether the document ``name`` is held out (see the module docstring for the rule)."""
    digest = int.from_bytes(hashlib.sha256(name.encode("utf-8")).digest()[:8], "big")
    return digest < fraction * 2**64


def python_docs_folder() -> Path:
    """Returns the Python documentation's sources that Debian's ``python3-doc`` installs (the newest version's).

    Raises FileNotFoundError naming where it looked and the package to install.
    """
    found = []
    for folder in _DOCS_ROOT.glob("python3.*/html/_sources"):
        match = re.fullmatch(r"python3\.(\d+)", folder.parent.parent.name)
        if match and folder.is_dir():
            found.append((int(match.group(1)), folder))
    if not found:
        raise FileNotFoundError(
            f"{PYTHON_DOCS}: no {_DOCS_ROOT}/python3.X/html/_sources folder; install Debian's python3-doc "
            "(apt-get install python3-doc) or give the sources' folder (--data-dir)"
        )
    return max(found)[1]


def train_bpe(texts: list[str], vocab_size: int = 4096) -> Any:
    """Returns a byte-level BPE ``tokenizers.Tokenizer`` of ``vocab_size`` tokens trained on ``texts``, its token 0
    ``END_OF_TEXT``; the same texts give the same tokenizer."""
    integer("vocab_size", vocab_size, minimum=257)
    tokenizers = _tokenizers()
    tokenizer = tokenizers.Tokenizer(tokenizers.models.BPE())
    tokenizer.pre_tokenizer = tokenizers.pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = tokenizers.decoders.ByteLevel()
    trainer = tokenizers.trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=[END_OF_TEXT],
        initial_alphabet=tokenizers.pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(texts, trainer)
    return tokenizer


def tokenizer_json(tokenizer: Any) -> str | None:
    """Returns the tokenizer as the JSON ``tokenizers.Tokenizer.from_str`` reads (a ``transformers`` fast
    tokenizer's backend), or None for a tokenizer that has none."""
    backend = getattr(tokenizer, "backend_tokenizer", tokenizer)
    to_str = getattr(backend, "to_str", None)
    return str(to_str()) if callable(to_str) else None


def tokenizer_from_json(text: str) -> Any:
    """Returns the ``tokenizers.Tokenizer`` of ``tokenizer_json``'s text."""
    return _tokenizers().Tokenizer.from_str(text)


def load_text_corpus(
    source: str | Path,
    *,
    sequence_length: int,
    text_column: str = "text",
    tokenizer: Any = "bpe",
    heldout_fraction: float = 0.1,
    max_documents: int | None = None,
    cache_dir: str | Path | None = None,
) -> TextCorpus:
    """Returns ``source`` split by document, tokenized and packed into rows of ``sequence_length`` tokens.

    See the module docstring for the sources, the split and the tokenizer. ``max_documents`` keeps the first
    documents only (in the source's order, before the split; for small runs and tests); ``cache_dir`` is where
    ``datasets`` keeps what it reads from table files (its own cache if None).

    Raises FileNotFoundError for a source that is not a local file or folder, ValueError naming the argument for
    a column the data lacks, a tokenizer it cannot read, or too little text to fill one row of either part.
    """
    length = integer("sequence_length", sequence_length, minimum=2)
    real("heldout_fraction", heldout_fraction, minimum=0.0, maximum=1.0, open_below=True, open_above=True)
    if max_documents is not None:
        integer("max_documents", max_documents, minimum=2)
    name = str(source)
    folder = python_docs_folder() if name == PYTHON_DOCS else Path(source)
    with _quiet():
        train, heldout = _split(folder, text_column, heldout_fraction, max_documents, cache_dir, name)
    if train.num_rows == 0 or heldout.num_rows == 0:
        raise ValueError(
            f"source={name!r}: {train.num_rows} training and {heldout.num_rows} held-out documents; each part needs one "
            "at least (give more documents, or another heldout_fraction)"
        )
    model_tokenizer = _tokenizer(tokenizer, train[text_column])
    end = _end_of_text(model_tokenizer)
    with _quiet():
        rows = [packed_text(part, model_tokenizer, length, column=text_column, separator=end) for part in (train, heldout)]
    for part, packed in zip(("training", "held-out"), rows, strict=True):
        if packed.num_rows == 0:
            raise ValueError(
                f"sequence_length={length}: the {part} documents of {name!r} do not fill one row; give more text or a "
                "shorter sequence_length"
            )
    return TextCorpus(
        name=name,
        train=rows[0],
        heldout=rows[1],
        text_column=text_column,
        tokenizer=model_tokenizer,
        vocab_size=_vocab_size(model_tokenizer),
        sequence_length=length,
        end_of_text=end,
        bytes_per_token=_bytes_per_token(model_tokenizer, rows[1]),
        documents=(train.num_rows, heldout.num_rows),
    )


@contextlib.contextmanager
def _quiet() -> Iterator[None]:
    # datasets' progress bars off while the corpus is read (a run has its own), as they were afterwards.
    progress = _datasets()

    was_off = progress.are_progress_bars_disabled()
    progress.disable_progress_bars()
    try:
        yield
    finally:
        if not was_off:
            progress.enable_progress_bars()


def _split(
    source: Path, column: str, fraction: float, limit: int | None, cache_dir: str | Path | None, name: str
) -> tuple[Any, Any]:
    # The training and held-out documents, as datasets.Dataset with at least the text column.
    datasets = _datasets()
    cache = None if cache_dir is None else str(cache_dir)
    if source.suffix == ".py":
        raise ValueError(
            f"source={name!r}: a dataset loading script; datasets runs none (since its version 4): give the data "
            "files, or a folder written by save_to_disk"
        )
    if not source.exists():
        raise FileNotFoundError(f"source={name!r} is not a local file or folder (nothing is downloaded)")
    if source.is_dir() and ((source / "dataset_dict.json").is_file() or (source / "state.json").is_file()):
        saved = datasets.load_from_disk(str(source))
        if isinstance(saved, datasets.DatasetDict):
            return _saved_splits(saved, column, name, limit)
        return _by_name(_checked_column(saved, column, name), [str(i) for i in range(saved.num_rows)], fraction, limit)
    files = [source] if source.is_file() else _files(source)
    if not files:
        raise ValueError(f"source={name!r}: the folder holds no files")
    builders = {TABLE_SUFFIXES.get(path.suffix.lower()) for path in files}
    if builders == {None} and (source.is_dir() or source.suffix.lower() != ".txt"):
        # A folder of documents (or one document): each file is one, named by its path in the folder.
        if column != "text":
            raise ValueError(
                f"text_column={column!r}: {name!r} holds text documents, each file one document, whose text is the "
                f"column 'text'; a column is chosen only in tables ({', '.join(sorted(TABLE_SUFFIXES))})"
            )
        root = source if source.is_dir() else source.parent
        names = [path.relative_to(root).as_posix() for path in files]
        texts = [_read_text(path) for path in files]
        table = datasets.Dataset.from_dict({column: texts})
        return _by_name(table, names, fraction, limit)
    if len(builders) > 1:
        raise ValueError(
            f"source={name!r} mixes file kinds ({sorted({path.suffix for path in files})}); expected one kind: text "
            f"documents, or tables of one of {sorted(TABLE_SUFFIXES)}"
        )
    builder = builders.pop() or "text"
    table = datasets.load_dataset(builder, data_files=[str(path) for path in files], split="train", cache_dir=cache)
    return _by_name(_checked_column(table, column, name), [str(i) for i in range(table.num_rows)], fraction, limit)


def _files(folder: Path) -> list[Path]:
    # Every regular file under the folder, in the order of their paths; hidden files and folders are skipped.
    return sorted(
        path
        for path in folder.rglob("*")
        if path.is_file() and not any(part.startswith(".") for part in path.relative_to(folder).parts)
    )


def _read_text(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8")
    except UnicodeDecodeError as error:
        raise ValueError(f"{path}: not UTF-8 text ({error.reason} at byte {error.start}); a document must be UTF-8") from None


def _checked_column(table: Any, column: str, name: str) -> Any:
    if column not in table.column_names:
        raise ValueError(f"text_column={column!r}: {name!r} has no such column; it has {table.column_names}")
    return table


def _by_name(table: Any, names: list[str], fraction: float, limit: int | None) -> tuple[Any, Any]:
    if limit is not None:
        table, names = table.select(range(min(limit, table.num_rows))), names[:limit]
    held = [i for i, document in enumerate(names) if is_heldout(document, fraction)]
    kept = sorted(set(range(len(names))) - set(held))
    return table.select(kept), table.select(held)


def _saved_splits(saved: Any, column: str, name: str, limit: int | None) -> tuple[Any, Any]:
    heldout_split = next((split for split in ("validation", "test") if split in saved), None)
    if "train" not in saved or heldout_split is None:
        raise ValueError(
            f"source={name!r} holds the splits {sorted(saved)}; expected train and validation (or test)"
        )
    parts = [_checked_column(saved[split], column, name) for split in ("train", heldout_split)]
    if limit is not None:
        parts = [part.select(range(min(limit, part.num_rows))) for part in parts]
    return parts[0], parts[1]


def _tokenizers() -> Any:
    try:
        import tokenizers
    except ModuleNotFoundError:
        raise ModuleNotFoundError(f"training a tokenizer needs the tokenizers package: {install_command('datasets')}") from None
    return tokenizers


def _tokenizer(spec: Any, texts: list[str]) -> Any:
    # The tokenizer spec's tokenizer: trained on the training texts, read from a file or folder, or given.
    if not isinstance(spec, str | Path):
        return spec
    text = str(spec)
    match = re.fullmatch(r"bpe(?::(\d+))?", text)
    if match:
        return train_bpe(list(texts), int(match.group(1)) if match.group(1) else 4096)
    path = Path(text)
    if path.is_file():
        try:
            return _tokenizers().Tokenizer.from_file(str(path))
        except Exception as error:  # noqa: BLE001 (tokenizers raises its own exception type for a bad file)
            raise ValueError(f"tokenizer={text!r}: not a tokenizers JSON file ({str(error).splitlines()[0]})") from None
    if path.is_dir():
        try:
            import transformers
        except ModuleNotFoundError:
            raise ModuleNotFoundError(f"a tokenizer folder needs transformers: {install_command('hf')}") from None
        try:
            return transformers.AutoTokenizer.from_pretrained(str(path), local_files_only=True)
        except (OSError, ValueError) as error:
            raise ValueError(f"tokenizer={text!r}: the folder holds no tokenizer transformers reads ({str(error).splitlines()[0]})") from None
    raise ValueError(
        f"tokenizer={text!r}: expected bpe, bpe:N (a byte-level BPE of N tokens trained on the training documents), "
        "a tokenizer.json file, or a folder holding a transformers tokenizer"
    )


def _end_of_text(tokenizer: Any) -> int | None:
    token_to_id = getattr(tokenizer, "token_to_id", None)
    if callable(token_to_id) and not hasattr(tokenizer, "eos_token_id"):
        found = token_to_id(END_OF_TEXT)
        return None if found is None else int(found)
    end = getattr(tokenizer, "eos_token_id", None)
    return None if end is None else int(end)


def _vocab_size(tokenizer: Any) -> int:
    size = getattr(tokenizer, "get_vocab_size", None)
    return int(size()) if callable(size) else len(tokenizer)


def _bytes_per_token(tokenizer: Any, rows: Any) -> float:
    ids = [list(row) for row in rows["input_ids"]]
    decode = getattr(tokenizer, "decode_batch", None) or tokenizer.batch_decode
    texts = decode(ids, skip_special_tokens=True)
    tokens = sum(len(row) for row in ids)
    return sum(len(text.encode("utf-8")) for text in texts) / tokens
