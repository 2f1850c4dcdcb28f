"""Hugging Face datasets as training data: a text corpus read from local files, tokenized by a tokenizer trained on
it and packed into rows; the loader's keyed order, its ranks' shares making one process's batches, its O(1) start
mid-epoch, a streamed dataset, and a run resumed mid-epoch from its checkpoint continuing bit for bit."""

from __future__ import annotations

import sysconfig
from pathlib import Path
from typing import Any

import pytest
import torch

from composer_fn.data.hf import DatasetLoader, packed_text

datasets = pytest.importorskip("datasets")
tokenizers = pytest.importorskip("tokenizers")

FILES = ("textwrap.py", "shlex.py", "fnmatch.py", "colorsys.py")
LENGTH = 16


def write_corpus(folder: Path) -> list[str]:
    """Writes a few of the standard library's source files as text files into ``folder``; returns their paths."""
    folder.mkdir(parents=True, exist_ok=True)
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    paths = []
    for name in FILES:
        target = folder / f"{name}.txt"
        target.write_text((stdlib / name).read_text(encoding="utf-8"), encoding="utf-8")
        paths.append(str(target))
    return paths


def train_tokenizer(files: list[str]) -> Any:
    """Returns a small BPE tokenizer trained on ``files`` (``tokenizers``, nothing downloaded)."""
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    tokenizer = Tokenizer(models.BPE(unk_token="[UNK]"))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    trainer = trainers.BpeTrainer(vocab_size=160, special_tokens=["[UNK]", "<|endoftext|>"], limit_alphabet=80, show_progress=False)
    tokenizer.train(files, trainer)
    return tokenizer


def packed_corpus(folder: Path) -> tuple[Any, Any]:
    """Returns the corpus of ``write_corpus`` read by ``datasets`` (one row per line) and packed into rows of
    ``LENGTH`` tokens, and the tokenizer."""
    files = write_corpus(folder / "text")
    tokenizer = train_tokenizer(files)
    lines = datasets.load_dataset("text", data_files=files, split="train", cache_dir=str(folder / "cache"))
    return packed_text(lines, tokenizer, LENGTH, separator=tokenizer.token_to_id("<|endoftext|>")), tokenizer


@pytest.fixture(scope="module")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> tuple[Any, Any]:
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("HF_DATASETS_OFFLINE", "1")
        patch.setenv("HF_HUB_OFFLINE", "1")
        return packed_corpus(tmp_path_factory.mktemp("corpus"))


def _batches(loader: DatasetLoader, epoch: int = 0, start: int = 0) -> list[dict[str, torch.Tensor]]:
    return list(loader.iter_from(epoch, start))


def test_packed_rows_are_the_corpus_tokens_in_order_cut_to_the_length(corpus: tuple[Any, Any]) -> None:
    packed, tokenizer = corpus
    assert packed.column_names == ["input_ids", "labels", "attention_mask"]
    rows = packed.with_format("torch")[:]
    assert rows["input_ids"].shape == (packed.num_rows, LENGTH) and rows["input_ids"].dtype == torch.int64
    assert torch.equal(rows["labels"], rows["input_ids"]) and bool((rows["attention_mask"] == 1).all())
    # The first rows are the first lines' tokens, each line followed by the end-of-text id.
    end = tokenizer.token_to_id("<|endoftext|>")
    lines = (Path(sysconfig.get_paths()["stdlib"]) / FILES[0]).read_text(encoding="utf-8").splitlines()
    expected: list[int] = []
    for line in lines[:40]:
        expected += [*tokenizer.encode(line).ids, end]
    flat = rows["input_ids"].flatten().tolist()
    assert flat[: len(expected) - LENGTH] == expected[: len(expected) - LENGTH]


def test_the_ranks_shares_make_one_process_s_batches_in_a_keyed_order(corpus: tuple[Any, Any]) -> None:
    packed, _ = corpus
    one = DatasetLoader(packed, 6, seed=4)
    ranks = [DatasetLoader(packed, 2, seed=4, rank=r, world_size=3) for r in range(3)]
    assert len(one) == len(ranks[0]) == -(-packed.num_rows // 6)
    for epoch in (0, 1):
        whole = _batches(one, epoch)
        shares = [_batches(loader, epoch) for loader in ranks]
        for step, batch in enumerate(whole):
            for column in ("input_ids", "labels", "attention_mask"):
                joined = torch.cat([share[step][column] for share in shares])
                assert torch.equal(joined, batch[column]), (epoch, step, column)
            assert one.global_samples(step) == len(batch["input_ids"])
    # Every row once an epoch; another epoch, another order; the same seed, the same order.
    rows = torch.cat([b["input_ids"] for b in _batches(one, 0)])
    assert len(rows) == packed.num_rows
    assert len({tuple(r) for r in rows.tolist()}) == len({tuple(r) for r in packed.with_format("torch")[:]["input_ids"].tolist()})
    assert not torch.equal(rows, torch.cat([b["input_ids"] for b in _batches(one, 1)]))
    again = DatasetLoader(packed, 6, seed=4)
    assert all(torch.equal(a["input_ids"], b["input_ids"]) for a, b in zip(_batches(again, 0), _batches(one, 0), strict=True))


def test_starting_mid_epoch_gives_the_epoch_s_remaining_batches(corpus: tuple[Any, Any]) -> None:
    packed, _ = corpus
    loader = DatasetLoader(packed, 5, seed=2, rank=1, world_size=2)
    whole = _batches(loader, 1)
    for start in (1, len(whole) - 1, len(whole)):
        tail = _batches(loader, 1, start)
        assert len(tail) == len(whole) - start
        assert all(torch.equal(a["input_ids"], b["input_ids"]) for a, b in zip(tail, whole[start:], strict=True))


def test_a_streamed_dataset_s_ranks_share_each_global_batch_and_start_mid_epoch(corpus: tuple[Any, Any]) -> None:
    packed, _ = corpus
    stream = packed.to_iterable_dataset(num_shards=2)
    one = DatasetLoader(stream, 6, seed=4, buffer_size=32)
    ranks = [DatasetLoader(stream, 3, seed=4, buffer_size=32, rank=r, world_size=2) for r in range(2)]
    assert one.dataset_size == packed.num_rows and len(one) == len(ranks[0])
    whole = _batches(one, 1)
    shares = [_batches(loader, 1) for loader in ranks]
    for step, batch in enumerate(whole):
        assert torch.equal(torch.cat([share[step]["input_ids"] for share in shares]), batch["input_ids"])
    assert all(torch.equal(a["input_ids"], b["input_ids"]) for a, b in zip(_batches(one, 1, 3), whole[3:], strict=True))
    assert not torch.equal(whole[0]["input_ids"], _batches(one, 0)[0]["input_ids"])  # shuffled per epoch


def test_bad_inputs_name_the_argument(corpus: tuple[Any, Any]) -> None:
    packed, _ = corpus
    with pytest.raises(ValueError, match=r"columns=\['input_ids', 'tokens'\]: the dataset has no column 'tokens'"):
        DatasetLoader(packed, 4, columns=["input_ids", "tokens"])
    with pytest.raises(ValueError, match=r"buffer_size=64 applies to a datasets.IterableDataset's shuffle buffer"):
        DatasetLoader(packed, 4, buffer_size=64)
    with pytest.raises(TypeError, match="not a DatasetDict: pick a split"):
        DatasetLoader(datasets.DatasetDict({"train": packed}), 4)
    ragged = datasets.Dataset.from_dict({"input_ids": [[1, 2, 3], [4, 5]]})
    with pytest.raises(ValueError, match="column 'input_ids' holds rows of different lengths"):
        next(iter(DatasetLoader(ragged, 2)))
    with pytest.raises(ValueError, match="column='body': the dataset has no such column"):
        packed_text(datasets.Dataset.from_dict({"text": ["a b"]}), train_tokenizer([]), 4, column="body")
    with pytest.raises(TypeError, match="tokenizer of type int"):
        packed_text(datasets.Dataset.from_dict({"text": ["a b"]}), 3, 4)


def gpt2_for(vocab: int) -> Any:
    """Returns a small Hugging Face GPT-2 for ``vocab`` token ids, its weights from a fixed seed."""
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    config = transformers.GPT2Config(n_layer=2, n_head=4, n_embd=32, vocab_size=vocab, n_positions=LENGTH, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
    return transformers.GPT2LMHeadModel(config)


def test_a_run_resumed_mid_epoch_from_its_checkpoint_ends_where_the_uninterrupted_run_ends(
    corpus: tuple[Any, Any], tmp_path: Path
) -> None:
    from composer_fn import Trainer, optim

    packed, tokenizer = corpus

    def trainer(**arguments: Any) -> Trainer:
        loader = DatasetLoader(packed, 8, seed=1)
        assert len(loader) > 6  # batch 5 is mid-epoch
        return Trainer(
            gpt2_for(tokenizer.get_vocab_size()), loader, max_duration="6ba", optimizer=optim.adamw(0.01),
            progress_bar=False, seed=3, **arguments,
        )  # fmt: skip

    uninterrupted = trainer(save_folder=str(tmp_path), save_interval="5ba")
    uninterrupted.fit()
    resumed = trainer(load_path=str(tmp_path / "ep0-ba5.pt"))
    assert resumed.timestamp.batch == 5
    resumed.fit()
    for name, value in uninterrupted.state.params.items():
        assert torch.equal(resumed.state.params[name], value), name
