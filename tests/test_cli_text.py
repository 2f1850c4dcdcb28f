"""The command line on text: a causal language model trained on a local corpus (``--data hf:PATH``), its held-out
perplexity and bits per byte, its checkpoint exported and its rows' losses predicted; each process's share of a
global batch; the text flags' errors."""

from __future__ import annotations

import argparse
import csv
import re
from pathlib import Path

import pytest
import torch

from composer_fn.app.cli import _prepare, main
from tests.data.test_corpus import write_documents

pytest.importorskip("datasets")
pytest.importorskip("transformers")

TINY = ["--model-kwargs", "n_layer=1,n_embd=32,n_head=2", "--tokenizer", "bpe:300", "--sequence-length", "32"]


@pytest.fixture(autouse=True)
def _offline(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_DATASETS_CACHE", str(tmp_path / "hf-cache"))


def test_a_language_model_trains_on_a_local_corpus_and_its_checkpoint_exports_and_predicts(capsys, tmp_path) -> None:
    write_documents(tmp_path / "docs")
    folder = tmp_path / "runs"
    argv = ["train", "--data", f"hf:{tmp_path / 'docs'}", *TINY, "--batch-size", "8", "--max-duration", "6ba"]
    assert main([*argv, "--eval-interval", "6ba", "--save-folder", str(folder), "--no-progress"]) == 0
    out = capsys.readouterr().out
    assert "model gpt2" in out and "6 steps" in out
    found = re.search(r"held-out loss ([\d.]+) \| perplexity ([\d.]+) \| bits per byte ([\d.]+)", out)
    assert found, out
    loss, perplexity = float(found.group(1)), float(found.group(2))
    assert perplexity == pytest.approx(torch.tensor(loss).exp().item(), rel=1e-3) and loss < torch.tensor(300.0).log()
    # Predictions read the corpus again with the recorded tokenizer: each row's loss, averaging to the run's.
    output = tmp_path / "rows.csv"
    assert main(["predict", str(folder / "latest.pt"), "--output", str(output)]) == 0
    assert f"(loss {loss:.4f}" in capsys.readouterr().out
    rows = list(csv.DictReader(output.open()))
    assert rows and {int(row["tokens"]) for row in rows} == {31}
    assert sum(float(row["loss"]) for row in rows) / len(rows) == pytest.approx(loss, abs=1e-4)
    # The exported program takes token ids and gives the model's logits (export_model checks it on held-out rows).
    assert main(["export", str(folder / "latest.pt"), "--format", "pt2", "--output", str(tmp_path / "lm.pt2")]) == 0
    assert "held-out rows" in capsys.readouterr().out
    program = torch.export.load(str(tmp_path / "lm.pt2")).module()
    assert program(torch.zeros(3, 32, dtype=torch.int64)).shape == (3, 32, 300)
    # --inputs chooses what an image model's program takes: refused by name, nothing written.
    for given in ("unit", "standardized"):
        assert main(["export", str(folder / "latest.pt"), "--inputs", given, "--output", str(tmp_path / "x.pt2")]) == 2
        err = capsys.readouterr().err.splitlines()
        assert len(err) == 1 and f"--inputs {given}" in err[0] and "token ids" in err[0], err
    assert not (tmp_path / "x.pt2").exists()
    # Rows longer than the model's learned position table are refused by name, before any row is read.
    assert main(["predict", str(folder / "latest.pt"), "--sequence-length", "64", "--output", str(output)]) == 2
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and "--sequence-length=64" in err[0] and "32 positions" in err[0]
    # A language model's checkpoint is not read against image data.
    assert main(["predict", str(folder / "latest.pt"), "--data", "mnist"]) == 2
    assert "--data mnist is not text" in capsys.readouterr().err


def test_each_process_takes_its_share_of_the_one_process_batch(monkeypatch, tmp_path) -> None:
    write_documents(tmp_path / "docs")
    args = argparse.Namespace(
        data=f"hf:{tmp_path / 'docs'}", task=None, data_dir=None, batch_size=8, seed=3, text_column="text",
        tokenizer="bpe:300", sequence_length=16,
    )  # fmt: skip
    whole = _prepare(args, False).train
    whole.set_epoch(1)
    shares = []
    for rank in (0, 1):
        monkeypatch.setenv("RANK", str(rank))
        monkeypatch.setenv("WORLD_SIZE", "2")
        loader = _prepare(args, False, world_size=2).train
        loader.set_epoch(1)
        shares.append(list(loader))
    expected = list(whole)
    assert len(expected) == len(shares[0]) == len(shares[1]) > 2
    for batch, first, second in zip(expected, *shares, strict=True):
        assert torch.equal(batch["input_ids"], torch.cat([first["input_ids"], second["input_ids"]]))


@pytest.mark.parametrize(
    ("argv", "flag", "value"),
    [
        (["train", "--data", "hf:"], "--data", "'hf:'"),
        (["train", "--data", "wikitext"], "--data", "'wikitext'"),
        (["train", "--tokenizer", "bpe:10"], "--tokenizer", "'bpe:10'"),
        (["train", "--tokenizer", "missing.json"], "--tokenizer", "'missing.json'"),
        (["plan", "--sequence-length", "1"], "--sequence-length", "'1'"),
    ],
)
def test_a_bad_text_flag_is_one_line_naming_it(capsys, argv, flag, value) -> None:
    with pytest.raises(SystemExit) as exited:
        main(argv)
    assert exited.value.code == 2
    lines = capsys.readouterr().err.splitlines()
    assert len(lines) == 1 and f"argument {flag}: invalid value {value}" in lines[0]


@pytest.mark.parametrize(
    ("extra", "words"),
    [
        (["--model", "resnet18"], ["model='resnet18' is not a causal language model type"]),
        (["--model-kwargs", "n_layers=1"], ["has no field 'n_layers'", "n_layer"]),
        (["--algorithms", "mixup"], ["MixUp", "not token sequences"]),
    ],
)
def test_a_text_run_its_set_up_refuses_is_one_line(capsys, tmp_path, extra, words) -> None:
    write_documents(tmp_path / "docs")
    argv = ["train", "--data", f"hf:{tmp_path / 'docs'}", *TINY, "--batch-size", "8", "--max-duration", "1ba", "--no-progress"]
    if "--model-kwargs" in extra:
        argv = argv[:3] + argv[5:]
    assert main([*argv, *extra]) == 2
    lines = capsys.readouterr().err.splitlines()
    assert len(lines) == 1 and all(word in lines[0] for word in words), lines


def test_an_alibi_model_trained_on_short_rows_is_evaluated_on_longer_ones(capsys, tmp_path) -> None:
    # ALiBi removes the position table: a checkpoint trained on rows of 32 (in rows of 8 during training) takes
    # held-out rows of 64, which is how its extrapolation is measured.
    write_documents(tmp_path / "docs")
    folder = tmp_path / "runs"
    argv = ["train", "--data", f"hf:{tmp_path / 'docs'}", *TINY, "--batch-size", "8", "--max-duration", "4ba"]
    assert main([*argv, "--algorithms", "alibi", "--save-folder", str(folder), "--no-progress"]) == 0
    capsys.readouterr()
    for length in (32, 64):
        output = tmp_path / f"rows{length}.csv"
        argv = ["predict", str(folder / "latest.pt"), "--sequence-length", str(length), "--output", str(output)]
        assert main(argv) == 0
        assert "perplexity" in capsys.readouterr().out
        assert {int(row["tokens"]) for row in csv.DictReader(output.open())} == {length - 1}


def test_an_image_checkpoint_refuses_a_row_length(capsys, tmp_path) -> None:
    folder = tmp_path / "runs"
    assert main(["train", "--task", "digits-mlp", "--max-duration", "1ba", "--save-folder", str(folder), "--no-progress"]) == 0
    capsys.readouterr()
    assert main(["predict", str(folder / "latest.pt"), "--sequence-length", "64"]) == 2
    assert "--sequence-length=64" in capsys.readouterr().err
