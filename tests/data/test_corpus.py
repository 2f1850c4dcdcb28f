"""A text corpus from local files: held out by document name, tokenized by a BPE trained on the training part only,
packed into rows; every kind of source, and the errors for what cannot be read."""

from __future__ import annotations

import json
import sysconfig
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from composer_fn.data.corpus import (
    END_OF_TEXT,
    PYTHON_DOCS,
    is_heldout,
    load_text_corpus,
    python_docs_folder,
    tokenizer_from_json,
    tokenizer_json,
    train_bpe,
)

datasets = pytest.importorskip("datasets")
pytest.importorskip("tokenizers")

MODULES = ("textwrap", "shlex", "fnmatch", "colorsys", "glob", "bisect", "copy", "keyword", "queue", "string")


def write_documents(folder: Path, names: tuple[str, ...] = MODULES) -> dict[str, str]:
    """Writes standard-library sources as text documents ``<name>.txt``; returns their text by file name."""
    folder.mkdir(parents=True, exist_ok=True)
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    texts = {}
    for name in names:
        text = (stdlib / f"{name}.py").read_text(encoding="utf-8")
        (folder / f"{name}.txt").write_text(text, encoding="utf-8")
        texts[f"{name}.txt"] = text
    return texts


@pytest.fixture(autouse=True)
def _offline(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_DATASETS_CACHE", str(tmp_path / "hf-cache"))


@given(st.text(max_size=40), st.floats(0.0, 1.0), st.floats(0.0, 1.0))
def test_a_document_held_out_at_a_fraction_is_held_out_at_every_larger_one(name: str, low: float, high: float) -> None:
    # Growing the held-out part only moves documents into it: none held out before is trained on after.
    low, high = min(low, high), max(low, high)
    assert not is_heldout(name, low) or is_heldout(name, high)
    assert not is_heldout(name, 0.0)


def test_the_split_holds_out_the_fraction_of_many_names() -> None:
    held = sum(is_heldout(f"doc-{i}.txt", 0.1) for i in range(20_000))
    assert abs(held / 20_000 - 0.1) < 0.01


def test_held_out_documents_are_never_trained_on_and_the_tokenizer_is_learnt_from_the_training_part(tmp_path: Path) -> None:
    texts = write_documents(tmp_path / "docs")
    corpus = load_text_corpus(tmp_path / "docs", sequence_length=32, tokenizer="bpe:300", heldout_fraction=0.3)
    heldout_names = [name for name in sorted(texts) if is_heldout(name, 0.3)]
    train_names = [name for name in sorted(texts) if name not in heldout_names]
    assert heldout_names and corpus.documents == (len(train_names), len(heldout_names))
    # The tokenizer is the BPE trained on the training documents, in their order, and nothing else.
    expected = train_bpe([texts[name] for name in train_names], 300)
    assert tokenizer_json(corpus.tokenizer) == tokenizer_json(expected)
    assert corpus.tokenizer.token_to_id(END_OF_TEXT) == 0 == corpus.end_of_text and corpus.vocab_size == 300
    # The training rows are the training documents' tokens joined by end-of-text, in order, cut to the length.
    stream: list[int] = []
    for name in train_names:
        stream += [*corpus.tokenizer.encode(texts[name]).ids, 0]
    train_ids = [token for row in corpus.train["input_ids"] for token in row]
    assert train_ids == stream[: len(train_ids)] and len(stream) - len(train_ids) < 32
    assert corpus.train["labels"] == corpus.train["input_ids"]
    # Held-out rows decode to held-out text only.
    heldout_text = corpus.tokenizer.decode([t for row in corpus.heldout["input_ids"] for t in row], skip_special_tokens=True)
    assert heldout_text[:200] in "".join(texts[name] for name in heldout_names)
    # Bytes per token are the held-out rows' own.
    rows = list(corpus.heldout["input_ids"])
    decoded = corpus.tokenizer.decode_batch(rows, skip_special_tokens=True)
    assert corpus.bytes_per_token == pytest.approx(sum(len(t.encode()) for t in decoded) / (32 * len(rows)))
    assert corpus.bits_per_byte(2.0) == pytest.approx(2.0 / 0.6931471805599453 / corpus.bytes_per_token)


def test_the_same_files_give_the_same_rows_and_tokenizer(tmp_path: Path) -> None:
    write_documents(tmp_path / "docs")
    first, second = (load_text_corpus(tmp_path / "docs", sequence_length=16, tokenizer="bpe:280") for _ in range(2))
    assert tokenizer_json(first.tokenizer) == tokenizer_json(second.tokenizer)
    assert first.train["input_ids"] == second.train["input_ids"] and first.heldout["input_ids"] == second.heldout["input_ids"]
    # A saved tokenizer (JSON, as a checkpoint records it) reads the corpus into the same rows.
    saved = tmp_path / "tokenizer.json"
    first.tokenizer.save(str(saved))
    again = load_text_corpus(tmp_path / "docs", sequence_length=16, tokenizer=str(saved))
    recorded = load_text_corpus(tmp_path / "docs", sequence_length=16, tokenizer=tokenizer_from_json(tokenizer_json(first.tokenizer)))
    assert again.train["input_ids"] == first.train["input_ids"] == recorded.train["input_ids"]


def test_tables_lines_and_saved_splits_are_read(tmp_path: Path) -> None:
    texts = list(write_documents(tmp_path / "docs").values())
    records = [{"body": text, "id": i} for i, text in enumerate(texts)]
    jsonl = tmp_path / "corpus.jsonl"
    jsonl.write_text("\n".join(json.dumps(record) for record in records), encoding="utf-8")
    from_jsonl = load_text_corpus(jsonl, sequence_length=16, text_column="body", tokenizer="bpe:280", cache_dir=tmp_path / "c")
    table = datasets.Dataset.from_list(records)
    table.to_parquet(str(tmp_path / "corpus.parquet"))
    from_parquet = load_text_corpus(tmp_path / "corpus.parquet", sequence_length=16, text_column="body", tokenizer="bpe:280")
    # Rows of a table are named by their index: the same documents on the same sides, whatever the file kind.
    assert from_jsonl.documents == from_parquet.documents == (
        sum(not is_heldout(str(i), 0.1) for i in range(len(texts))),
        sum(is_heldout(str(i), 0.1) for i in range(len(texts))),
    )
    assert from_jsonl.train["input_ids"] == from_parquet.train["input_ids"]
    # A DatasetDict saved to disk: its validation split is the held-out part, every row of it.
    saved = datasets.DatasetDict({"train": table.select(range(7)), "validation": table.select(range(7, 10))})
    saved.save_to_disk(str(tmp_path / "saved"))
    from_saved = load_text_corpus(tmp_path / "saved", sequence_length=16, text_column="body", tokenizer="bpe:280")
    assert from_saved.documents == (7, 3)
    # One text file: each line a document.
    lines = tmp_path / "lines.txt"
    lines.write_text("\n".join(texts), encoding="utf-8")
    from_lines = load_text_corpus(lines, sequence_length=16, tokenizer="bpe:280")
    assert sum(from_lines.documents) == len(lines.read_text(encoding="utf-8").splitlines())


@pytest.mark.parametrize(
    ("make", "arguments", "error", "words"),
    [
        (lambda root: root / "missing", {}, FileNotFoundError, ["missing", "nothing is downloaded"]),
        (lambda root: _write(root / "load.py", "x = 1"), {}, ValueError, ["load.py", "script", "save_to_disk"]),
        (lambda root: _jsonl(root), {"text_column": "text"}, ValueError, ["text_column='text'", "['body']"]),
        (lambda root: _docs(root), {"text_column": "body"}, ValueError, ["text_column='body'", "text documents", ".jsonl"]),
        (lambda root: _mixed(root), {}, ValueError, ["mixes file kinds", ".csv", ".txt"]),
        (lambda root: _binary(root), {}, ValueError, ["bad.txt", "not UTF-8"]),
        (lambda root: _docs(root), {"sequence_length": 10**7}, ValueError, ["sequence_length=10000000", "do not fill one row"]),
        (lambda root: _docs(root), {"tokenizer": "wordpiece"}, ValueError, ["tokenizer='wordpiece'", "bpe:N"]),
        (lambda root: _docs(root), {"tokenizer": lambda root: str(_write(root / "t.json", "{}"))}, ValueError, ["t.json", "not a tokenizers JSON"]),
        (lambda root: _docs(root), {"heldout_fraction": 1.5}, ValueError, ["heldout_fraction", "1.5"]),
        (lambda root: _docs(root, MODULES[:1]), {}, ValueError, ["training", "held-out documents"]),
    ],
)
def test_what_cannot_be_read_is_one_error_naming_it(tmp_path: Path, make, arguments, error, words) -> None:
    source = make(tmp_path)
    given = {name: value(tmp_path) if callable(value) else value for name, value in arguments.items()}
    with pytest.raises(error) as caught:
        load_text_corpus(source, **{"sequence_length": 16, "tokenizer": "bpe:280", **given})
    for word in words:
        assert word in str(caught.value)


def _write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")
    return path


def _jsonl(root: Path) -> Path:
    return _write(root / "c.jsonl", "\n".join(json.dumps({"body": f"line {i}"}) for i in range(20)))


def _mixed(root: Path) -> Path:
    _write(root / "m" / "a.csv", "text\nhello\n")
    _write(root / "m" / "b.txt", "hello")
    return root / "m"


def _binary(root: Path) -> Path:
    write_documents(root / "b", MODULES[:3])
    (root / "b" / "bad.txt").write_bytes(b"\xff\xfe\x00bad")
    return root / "b"


def _docs(root: Path, names: tuple[str, ...] = MODULES) -> Path:
    write_documents(root / "d", names)
    return root / "d"


def test_the_python_documentation_is_found_where_debian_installs_it() -> None:
    try:
        folder = python_docs_folder()
    except FileNotFoundError as error:
        assert "python3-doc" in str(error)
        pytest.skip(f"Debian's python3-doc is not installed: {error}")
    assert folder.name == "_sources" and any(folder.rglob("*.rst.txt"))
    corpus = load_text_corpus(PYTHON_DOCS, sequence_length=64, tokenizer="bpe:512", max_documents=40)
    assert corpus.name == PYTHON_DOCS and sum(corpus.documents) == 40 and corpus.train.num_rows > corpus.heldout.num_rows > 0
