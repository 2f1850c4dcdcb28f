"""The command line: plans print, a bad flag value is refused in one line, a short run trains."""

from __future__ import annotations

from pathlib import Path

import pytest

from composer_fn.app.cli import main


def test_plan_prints_the_schedule_table(capsys) -> None:
    assert main(["plan", "--algorithms", "mixup,label_smoothing", "--max-duration", "2ep"]) == 0
    out = capsys.readouterr().out
    assert "BEFORE_LOSS" in out and "mixup, label_smoothing" in out and "46 steps" in out


@pytest.mark.parametrize(
    ("argv", "flag", "value", "accepted"),
    [
        (["plan", "--batch-size", "0"], "--batch-size", "'0'", "a whole number >= 1"),
        (["train", "--batch-size", "-3"], "--batch-size", "'-3'", "a whole number >= 1"),
        (["plan", "--batch-size", "1.5"], "--batch-size", "'1.5'", "a whole number >= 1"),
        (["train", "--lr", "0"], "--lr", "'0'", "a finite number > 0"),
        (["train", "--lr", "-0.1"], "--lr", "'-0.1'", "a finite number > 0"),
        (["train", "--lr", "nan"], "--lr", "'nan'", "a finite number > 0"),
        (["train", "--lr", "fast"], "--lr", "'fast'", "a finite number > 0"),
        (["plan", "--seed", "-1"], "--seed", "'-1'", "a whole number in [0, 2**64)"),
        (["plan", "--seed", str(2**64)], "--seed", f"'{2**64}'", "a whole number in [0, 2**64)"),
        (["train", "--threads", "0"], "--threads", "'0'", "a whole number >= 1"),
        (["plan", "--max-duration", "0ep"], "--max-duration", "'0ep'", "epochs or batches, e.g. 10ep or 500ba"),
        (["plan", "--max-duration", "0.5dur"], "--max-duration", "'0.5dur'", "epochs or batches"),
        (["train", "--max-duration", "ten"], "--max-duration", "'ten'", "epochs or batches"),
        (["train", "--max-duration=-2ba"], "--max-duration", "'-2ba'", "epochs or batches"),
        (["train", "--algorithms", "mixup,blurpoool"], "--algorithms", "'blurpoool'", "names among alibi, "),
        (["plan", "--algorithms", "mixup,mixup"], "--algorithms", "'mixup'", "each name once"),
        (["plan", "--algorithms", "ema(halflife=50ba)"], "--algorithms", "'halflife'", "accepted: half_life (default '1000ba'), "),
        (["plan", "--algorithms", "mixup(alpha=-1)"], "--algorithms", "mixup(alpha=-1): alpha", ">= 0"),
        (["plan", "--algorithms", "ema(half_life=50ba"], "--algorithms", "'ema(half_life=50ba'", "closing parenthesis"),
        (["plan", "--algorithms", "ema(50ba)"], "--algorithms", "ema(50ba)", "expected name=value"),
        (["plan", "--task", "cifar"], "--task", "'cifar'", "choose from 'digits', 'digits-mlp', 'synthetic'"),
        (["train", "--precision", "fp16"], "--precision", "'fp16'", "choose from 'fp32', 'bf16-mixed'"),
        (["train", "--load-path", "missing/latest.pt"], "--load-path", "'missing/latest.pt'", "an existing checkpoint"),
        (["train", "--load-path", "pyproject.toml"], "--load-path", "'pyproject.toml'", "an existing checkpoint file (torch.save's zip archive)"),
        (["export", "README.md"], "checkpoint", "'README.md'", "an existing checkpoint file"),
        (["train", "--save-folder", "pyproject.toml"], "--save-folder", "'pyproject.toml'", "a folder"),
        (["train", "--log-file", "tests"], "--log-file", "'tests'", "a file (created if missing), not a folder"),
        # A value starting with a minus is the flag's value, named with what is accepted.
        (["train", "--save-interval", "-1ba"], "--save-interval", "'-1ba'", "a whole number >= 1 of batches or epochs"),
        (["train", "--eval-interval", "-2ep"], "--eval-interval", "'-2ep'", "a whole number >= 1 of batches or epochs"),
        (["train", "--max-duration", "-3"], "--max-duration", "'-3'", "a bare number counts epochs"),
        (["train", "--lr", "-.5"], "--lr", "'-.5'", "a finite number > 0"),
    ],
)
def test_a_bad_flag_value_exits_with_one_line_naming_flag_value_and_what_is_accepted(
    capsys, monkeypatch, argv, flag, value, accepted
) -> None:
    monkeypatch.chdir(Path(__file__).resolve().parents[1])
    with pytest.raises(SystemExit) as exited:
        main(argv)
    assert exited.value.code == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    lines = captured.err.splitlines()
    assert len(lines) == 1, captured.err
    assert lines[0].startswith(f"composer-fn {argv[0]}: error: argument {flag}: ")
    assert value in lines[0] and accepted in lines[0]


@pytest.mark.parametrize(
    ("argv", "names"),
    [
        (["--save-folder", "pyproject.toml/runs"], "save_folder='pyproject.toml/runs' cannot be created"),
        (["--log-file", "pyproject.toml/log.jsonl"], "pyproject.toml/log.jsonl"),
    ],
)
def test_a_run_its_set_up_refuses_exits_with_one_line(capsys, monkeypatch, argv, names) -> None:
    # Paths that pass the flags' own checks but cannot be written: a folder or a file under a file.
    monkeypatch.chdir(Path(__file__).resolve().parents[1])
    assert main(["train", "--max-duration", "1ba", "--no-progress", *argv]) == 2
    captured = capsys.readouterr()
    lines = captured.err.splitlines()
    assert len(lines) == 1, captured.err
    assert lines[0].startswith("composer-fn: ") and names in lines[0]


@pytest.mark.parametrize(
    ("argv", "named"),
    [
        (["plan", "--task", "digits", "--data-dir", "tests"], ["--data-dir=tests", "--task digits"]),
        (["plan", "--image-size", "32"], ["--image-size=32"]),
        (["train", "--num-workers", "2"], ["--num-workers=2", "in memory"]),
        (["train", "--overwrite-log"], ["--overwrite-log", "--log-file"]),
        (["plan", "--sequence-length", "64", "--tokenizer", "bpe:300"], ["--sequence-length=64", "--tokenizer=bpe:300"]),
        (["train", "--text-column", "body", "--nproc", "2"], ["--text-column=body"]),
    ],
)
def test_a_flag_that_would_do_nothing_with_the_others_is_refused_by_name(capsys, monkeypatch, argv, named) -> None:
    monkeypatch.chdir(Path(__file__).resolve().parents[1])
    assert main([*argv, "--max-duration", "1ba"]) == 2
    lines = capsys.readouterr().err.splitlines()
    assert len(lines) == 1 and "would do nothing" in lines[0] and all(word in lines[0] for word in named), lines


def test_a_bare_max_duration_counts_epochs_as_the_trainer_does(capsys) -> None:
    # digits: 23 steps an epoch at the task's batch of 64.
    assert main(["plan", "--max-duration", "3"]) == 0
    assert "69 steps" in capsys.readouterr().out


def test_a_given_batch_size_is_used_rather_than_the_tasks(capsys) -> None:
    # digits: 1437 training samples; 100 per batch gives 15 steps an epoch, the task's 64 would give 23.
    assert main(["plan", "--batch-size", "100", "--max-duration", "2ep"]) == 0
    assert "30 steps" in capsys.readouterr().out


def test_train_runs_and_reports_accuracy_and_time(capsys, tmp_path) -> None:
    log = tmp_path / "log.jsonl"
    status = main(
        ["train", "--task", "digits-mlp", "--algorithms", "label_smoothing", "--max-duration", "2ep",
         "--no-progress", "--log-file", str(log)]
    )
    assert status == 0
    out = capsys.readouterr().out
    assert "held-out accuracy" in out and "wall time" in out
    assert log.read_text().count('"kind": "eval"') == 2


@pytest.mark.parametrize("task", ["digits", "synthetic"])
def test_an_augmentation_of_unit_pixels_trains_on_unit_pixels(capsys, task) -> None:
    status = main(
        ["train", "--task", task, "--algorithms", "randaugment", "--max-duration", "1ep", "--no-progress"]
    )
    assert status == 0
    assert "held-out accuracy" in capsys.readouterr().out


def test_autoresume_continues_an_interrupted_run_from_its_save_folder(capsys, tmp_path) -> None:
    folder = str(tmp_path / "runs")
    common = ["train", "--task", "digits-mlp", "--save-folder", folder, "--no-progress", "--autoresume"]
    assert main([*common, "--max-duration", "1ep"]) == 0
    assert "23 steps, 1 epochs" in capsys.readouterr().out
    with pytest.warns(UserWarning, match="the schedule's length changed"):
        assert main([*common, "--max-duration", "2ep"]) == 0
    # Resumed after the first epoch (saved at its end): the run reports both epochs' steps.
    assert "46 steps, 2 epochs" in capsys.readouterr().out
    assert main(["train", "--autoresume", "--no-progress"]) == 2
    assert "--autoresume (it resumes from the newest checkpoint in --save-folder, and none is given)" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("flags", "words"),
    [
        (["--save-interval", "1ba"], "--save-interval=1ba (it sets how often checkpoints go to --save-folder, and none is given)"),
        (["--fsdp"], "--fsdp (it shards the model over the --nproc processes, and none is given)"),
        (["--microbatch-size", "100", "--batch-size", "64"], "--microbatch-size=100 is larger than a process's batch (--batch-size=64)"),
        (["--microbatch-size", "24", "--batch-size", "32", "--nproc", "2"], "(--batch-size=32 over --nproc=2 processes, 16 each)"),
    ],
)
def test_a_flag_without_the_one_it_works_with_is_refused_naming_both(capsys, flags, words) -> None:
    assert main(["train", "--max-duration", "1ba", "--no-progress", *flags]) == 2
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and words in err[0], err


@pytest.mark.parametrize("duration", ["3ba", "1ep"])
def test_a_run_shorter_than_two_epochs_trains_with_a_warm_up_of_a_tenth(capsys, duration) -> None:
    assert main(["train", "--task", "digits-mlp", "--max-duration", duration, "--no-progress"]) == 0
    assert "held-out accuracy" in capsys.readouterr().out


def test_plan_leaves_out_a_surgery_that_finds_nothing_in_the_tasks_model(capsys) -> None:
    assert main(["plan", "--algorithms", "alibi,mixup", "--max-duration", "2ep"]) == 0
    out = capsys.readouterr().out
    table, warnings = out.split("warning:", 1)
    assert "alibi" not in table and "mixup" in table
    assert "alibi is left out: it finds nothing to rewrite in the task's model (SmallCNN)" in warnings


def test_a_trained_checkpoint_exports_and_predicts_from_the_command_line(capsys, tmp_path) -> None:
    folder = tmp_path / "run"
    common = ["--max-duration", "8ba", "--no-progress", "--save-folder", str(folder), "--save-interval", "4ba"]
    assert main(["train", "--algorithms", "blurpool,ema", *common]) == 0
    out = capsys.readouterr().out
    assert "model small_cnn" in out and "held-out accuracy" in out
    assert sorted(path.name for path in folder.glob("*.pt")) == ["ep0-ba4.pt", "ep0-ba8.pt", "latest.pt"]
    assert main(["export", str(folder / "latest.pt"), "--format", "pt2", "--output", str(tmp_path / "m.pt2")]) == 0
    out = capsys.readouterr().out
    assert "on 101 held-out images of digits, in batches of 64 and 37" in out and (tmp_path / "m.pt2").is_file()
    predictions = tmp_path / "predictions.csv"
    assert main(["predict", str(folder / "latest.pt"), "--output", str(predictions)]) == 0
    printed = capsys.readouterr().out
    rows = predictions.read_text().splitlines()
    assert rows[0] == "index,label,prediction,probability,label_name,prediction_name" and len(rows) == 361
    # The accuracy it prints is the one the run's final evaluation measured.
    accuracy = printed.split("accuracy ")[1].rstrip(")\n")
    correct = sum(row.split(",")[1] == row.split(",")[2] for row in rows[1:])
    assert accuracy == f"{correct / 360:.2%}"
    # The exported program takes images in [0, 1], as a user has them, and predicts what predict wrote; the card
    # beside it says so and names the classes.
    import json

    import torch

    from composer_fn.data import load_digits_task
    from composer_fn.export import run_exported

    card = json.loads((tmp_path / "m.pt2.json").read_text())
    assert card["input"].startswith("images: float32 ['N', 1, 8, 8] in [0, 1]") and card["standardised_inside"]
    assert card["classes"] == list("0123456789") and card["output"].startswith("logits: float32 [N, 10]")
    raw = load_digits_task(standardize=False)
    assert card["mean"] == [pytest.approx(raw.mean[0])] and card["std"] == [pytest.approx(raw.std[0])]
    logits = run_exported(tmp_path / "m.pt2", "pt2", raw.heldout[0])
    assert logits.argmax(dim=1).tolist() == [int(row.split(",")[2]) for row in rows[1:]]
    # --inputs standardized: the model as it is, on images standardised as in training.
    assert main(["export", str(folder / "latest.pt"), "--format", "torchscript", "--inputs", "standardized", "--output", str(tmp_path / "s.ts")]) == 0
    capsys.readouterr()
    standardised = load_digits_task().heldout[0]
    torch.testing.assert_close(run_exported(tmp_path / "s.ts", "torchscript", standardised), logits, rtol=0, atol=1e-4)
    assert not json.loads((tmp_path / "s.ts.json").read_text())["standardised_inside"]
    # In Python: the model rebuilt from the checkpoint's record, as the command line rebuilds it.
    from composer_fn.app.cli import load_trained

    model, record = load_trained(folder / "latest.pt")
    assert record["model"] == "small_cnn" and record["classes"] == list("0123456789") and not model.training
    with torch.no_grad():
        torch.testing.assert_close(model(standardised), logits, rtol=0, atol=1e-4)
    # An output that is the command's input is refused in one line, and the checkpoint is kept as it was.
    checkpoint = str(folder / "latest.pt")
    before = (folder / "latest.pt").read_bytes()
    for argv in (
        ["export", checkpoint, "--output", checkpoint],
        ["predict", checkpoint, "--output", checkpoint],
        ["convert", checkpoint, "--output", checkpoint, "--format", "safetensors"],
    ):
        assert main(argv) == 2
        err = capsys.readouterr().err.splitlines()
        assert len(err) == 1 and f"--output={checkpoint!r} is the checkpoint this command reads" in err[0], argv
    # An output that cannot be written is named by its flag and path, before any work.
    inside_a_file = str(tmp_path / "m.pt2" / "out")
    for argv in (["predict", checkpoint, "--output", inside_a_file], ["export", checkpoint, "--output", inside_a_file]):
        assert main(argv) == 2
        err = capsys.readouterr().err.splitlines()
        assert len(err) == 1 and f"--output={inside_a_file!r} cannot be written" in err[0] and ".tmp" not in err[0], argv
    # A log file that is a checkpoint is neither appended to nor replaced, even told to overwrite.
    for overwrite in ([], ["--overwrite-log"]):
        assert main(["train", "--max-duration", "1ba", "--no-progress", "--log-file", checkpoint, *overwrite]) == 2
        err = capsys.readouterr().err.splitlines()
        assert len(err) == 1 and "holds something other than a JSON-lines log" in err[0] and "--overwrite-log" not in err[0]
    assert (folder / "latest.pt").read_bytes() == before


def test_a_torchvision_model_by_name_trains_fitted_to_the_task(capsys) -> None:
    assert main(["train", "--model", "mobilenet_v3_small", "--max-duration", "2ba", "--no-progress"]) == 0
    assert "model mobilenet_v3_small" in capsys.readouterr().out
    assert main(["train", "--model", "vit_b_16", "--max-duration", "1ba", "--no-progress"]) == 2
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and "model='vit_b_16' does not take 1x8x8 images" in err[0]


def test_a_missing_dataset_is_one_line_naming_where_it_looked_and_how_to_get_it(capsys, tmp_path) -> None:
    assert main(["train", "--data", "kmnist", "--data-dir", str(tmp_path), "--max-duration", "1ba", "--no-progress"]) == 2
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and str(tmp_path) in err[0] and "download=True" in err[0]
    assert main(["train", "--task", "digits", "--data", "mnist", "--no-progress"]) == 2
    assert "--task=digits and --data=mnist both name the data" in capsys.readouterr().err


def test_the_data_names_are_the_readers() -> None:
    from composer_fn.app.cli import DATA
    from composer_fn.data import DATASETS

    assert sorted(DATA) == sorted(DATASETS)


def test_an_image_folder_trains_exports_and_predicts_from_the_command_line(capsys, tmp_path) -> None:
    import warnings

    import torch
    from torchvision.io import write_png

    from composer_fn import random as R

    images = R.randint(R.key(0), 0, 256, (30, 3, 12, 10)).to(torch.uint8)
    for index, image in enumerate(images):
        folder = tmp_path / "photos" / ("cat", "dog", "owl")[index % 3]
        folder.mkdir(parents=True, exist_ok=True)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            write_png(image, str(folder / f"{index:02d}.png"))
    run = tmp_path / "run"
    data = ["--data", "imagefolder", "--data-dir", str(tmp_path / "photos")]
    assert main(["train", *data, "--model", "small_cnn", "--batch-size", "8", "--max-duration", "2ba", "--no-progress",
                 "--save-folder", str(run)]) == 0
    assert "data imagefolder | model small_cnn" in capsys.readouterr().out
    assert main(["export", str(run / "latest.pt"), "--format", "torchscript", "--data-dir", str(tmp_path / "photos")]) == 0
    assert "held-out images of imagefolder" in capsys.readouterr().out
    # Without its folder, an image folder's checkpoint exports, checked on keyed random images of its shape.
    assert main(["export", str(run / "latest.pt"), "--format", "torchscript", "--output", str(tmp_path / "nofolder.ts")]) == 0
    assert "13 keyed random images in batches of 8 and 5 (the data was not found: no --data-dir" in capsys.readouterr().out
    output = tmp_path / "train.csv"
    assert main(["predict", str(run / "latest.pt"), *data, "--split", "train", "--output", str(output)]) == 0
    rows = output.read_text().splitlines()
    # Every training image once, in the folder's order: 24 of the 30 (every fifth is held out).
    assert len(rows) == 25 and [row.split(",")[0] for row in rows[1:]] == [str(i) for i in range(24)]
    assert {row.split(",")[4] for row in rows[1:]} == {"cat", "dog", "owl"}
    # A folder of other classes (as many) is refused, not scored across two label sets.
    import shutil

    shutil.copytree(tmp_path / "photos", tmp_path / "zoo")
    (tmp_path / "zoo" / "owl").rename(tmp_path / "zoo" / "emu")
    other = ["--data", "imagefolder", "--data-dir", str(tmp_path / "zoo")]
    assert main(["predict", str(run / "latest.pt"), *other, "--output", str(tmp_path / "zoo.csv")]) == 2
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and "names its classes otherwise than the checkpoint's run did (label: checkpoint / data: 2: 'owl' / 'emu'" in err[0]


def test_model_kwargs_reach_the_constructor_and_the_checkpoint_rebuilds_them(capsys, tmp_path) -> None:
    run = tmp_path / "run"
    flags = ["--max-duration", "3ba", "--no-progress", "--save-folder", str(run)]
    assert main(["train", "--model-kwargs", "width=8,norm=group", *flags]) == 0
    capsys.readouterr()
    # The export rebuilds SmallCNN(width=8, norm="group"): another width would not fit the checkpoint's tensors.
    assert main(["export", str(run / "latest.pt"), "--format", "torchscript", "--output", str(tmp_path / "m.ts")]) == 0
    assert "differ from the module's by at most 0" in capsys.readouterr().out
    assert main(["train", "--model-kwargs", "width=8,depth=3", "--max-duration", "1ba", "--no-progress"]) == 2
    assert "model='small_cnn' does not take the options {'width': 8, 'depth': 3}" in capsys.readouterr().err
    # What the data sets is not an option: another class count would train a head the labels do not fit.
    assert main(["train", "--model", "resnet18", "--model-kwargs", "num_classes=3", "--max-duration", "1ba", "--no-progress"]) == 2
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and "model options ['num_classes'] of 'resnet18': they come from the data" in err[0]


def test_algorithms_take_hyperparameters_on_the_command_line_as_python_takes_them() -> None:
    from composer_fn.algorithms import EMA, CutMix, LabelSmoothing, MixUp, SelectiveBackprop
    from composer_fn.app.cli import parse_algorithms

    given = "ema(half_life=50ba, ema_start=0.1dur),mixup(alpha=0.4, per_sample=true),label_smoothing,cutmix(alpha=1)"
    expected = (EMA(half_life="50ba", ema_start="0.1dur"), MixUp(alpha=0.4, per_sample=True), LabelSmoothing(), CutMix(alpha=1))
    assert parse_algorithms(given) == expected
    assert parse_algorithms("ema(half_life=none, smoothing=0.99)") == (EMA(half_life=None, smoothing=0.99),)
    keys = parse_algorithms("selective_backprop(input_key=input_ids, target_key=labels, keep=0.5)")
    assert keys == (SelectiveBackprop(input_key="input_ids", target_key="labels", keep=0.5),)


def _train_converters() -> dict:
    from composer_fn.app.cli import _converters, _parser

    return _converters(_parser()[1]["train"])


def test_set_gives_every_recipe_field_a_command_line_form_equal_to_the_file(tmp_path: Path) -> None:
    from composer_fn.app.recipes import load_recipe

    file = tmp_path / "recipe.toml"
    file.write_text(
        'max_duration = "3ep"\nbatch_size = 16\ncallbacks = ["speed", "lr"]\n'
        '[algorithms.ema]\nhalf_life = "50ba"\n[algorithms.mixup]\nalpha = 0.4\n[algorithms.label_smoothing]\n'
        '[optimizer]\nname = "adamw"\nlearning_rate = 0.002\nbetas = [0.9, 0.95]\n'
        '[schedule]\nname = "cosine_warmup"\nt_warmup = "0.1dur"\n'
        '[loggers]\ntensorboard = "runs/tb"\nwandb = {project = "digits", mode = "offline"}\n'
        "[execution]\nprecision = \"bf16-mixed\"\n"
    )
    settings = [
        "max_duration=3ep", "batch_size=16", 'callbacks=["speed", "lr"]',
        "algorithms.ema.half_life=50ba", "algorithms.mixup.alpha=0.4", "algorithms.label_smoothing={}",
        "optimizer.name=adamw", "optimizer.learning_rate=0.002", "optimizer.betas=[0.9, 0.95]",
        "schedule.name=cosine_warmup", "schedule.t_warmup=0.1dur",
        "loggers.tensorboard=runs/tb", 'loggers.wandb={project = "digits", mode = "offline"}',
        "execution.precision=bf16-mixed",
    ]  # fmt: skip
    from_file, from_flags = load_recipe(file, _train_converters()), load_recipe(None, _train_converters(), settings)
    for field in ("flags", "algorithms", "optimizer", "schedule", "loggers", "callbacks", "evaluators"):
        assert getattr(from_flags, field) == getattr(from_file, field), field
    assert from_flags.build_algorithms() == from_file.build_algorithms()
    # Over a file: a setting replaces the file's value and leaves the rest; a new table adds an algorithm after.
    over = load_recipe(file, _train_converters(), ["algorithms.ema.half_life=20ba", "algorithms.cutout={}", "batch_size=8"])
    assert [name for name, _ in over.algorithms] == ["ema", "mixup", "label_smoothing", "cutout"]
    assert dict(over.algorithms)["ema"] == {"half_life": "20ba"} and over.flags["batch_size"] == 8
    assert over.optimizer == from_file.optimizer


@pytest.mark.parametrize(
    ("setting", "message"),
    [
        ("batch_size", "--set 'batch_size': expected FIELD=VALUE"),
        ("algorithms..alpha=1", "expected FIELD=VALUE"),
        ("batch_sise=8", "field batch_sise: unknown field; accepted: "),
        ("batch_size=0", "field batch_size: invalid value '0'"),
        ("execution.precison=fp32", "field execution.precison: unknown field; accepted: precision, "),
    ],
)
def test_a_bad_setting_is_refused_naming_it(setting: str, message: str) -> None:
    from composer_fn.app.recipes import RecipeError, load_recipe

    with pytest.raises(RecipeError) as refused:
        load_recipe(None, _train_converters(), [setting])
    assert message in str(refused.value)


def test_set_on_the_command_line_trains_what_the_recipe_file_trains(capsys, tmp_path: Path) -> None:
    common = ["train", "--task", "digits-mlp", "--max-duration", "3ba", "--no-progress", "--threads", "1"]
    file = tmp_path / "r.toml"
    file.write_text('[algorithms.ema]\nhalf_life = "1ba"\n[optimizer]\nname = "adamw"\nlearning_rate = 0.01\n')
    def held_out() -> str:
        return next(line for line in capsys.readouterr().out.splitlines() if "held-out" in line)

    assert main([*common, "--config", str(file)]) == 0
    from_file = held_out()
    assert main([*common, "--set", "algorithms.ema.half_life=1ba", "--set", "optimizer.name=adamw", "--set", "optimizer.learning_rate=0.01"]) == 0
    from_flags = held_out()
    assert main([*common, "--algorithms", "ema(half_life=1ba)", "--optimizer", "adamw", "--lr", "0.01"]) == 0
    assert from_flags == from_file == held_out()
    # A wrong one is refused by name before training.
    assert main([*common, "--set", "algorithms.ema.halflife=1ba"]) == 2
    assert "algorithms.ema" in capsys.readouterr().err


def test_the_algorithms_command_lists_each_algorithm_and_each_hyperparameter_with_its_default_and_meaning(capsys) -> None:
    import composer_fn.algorithms  # noqa: F401
    from composer_fn.app.catalog import options_of
    from composer_fn.core.algorithm import REGISTRY

    assert main(["algorithms"]) == 0
    listing = capsys.readouterr().out
    for name in REGISTRY:
        assert f"\n{name} " in f"\n{listing}", name
    for name, cls in REGISTRY.items():
        assert main(["algorithms", name]) == 0
        page = capsys.readouterr().out
        for option in options_of(cls):
            assert option.meaning, f"{name}.{option.name} has no meaning in its class docstring's Args"
            assert f"{option.name} " in page and option.default_text() in page
    assert main(["algorithms", "ema"]) == 0
    assert "half_life        '1000ba'" in capsys.readouterr().out
    assert main(["algorithms", "emma"]) == 2
    assert "unknown algorithm 'emma'; accepted: alibi," in capsys.readouterr().err


def test_the_top_help_lists_every_command(capsys) -> None:
    from composer_fn.app.cli import _parser

    with pytest.raises(SystemExit):
        main(["--help"])
    top = capsys.readouterr().out
    for command in _parser()[1]:
        assert f"    {command}" in top and f"``{command}``" in top, command


def test_the_command_line_reference_page_is_the_parser_s() -> None:
    from composer_fn.app.cli_docs import cli_reference

    page = Path(__file__).resolve().parents[1] / "docs" / "reference" / "cli.md"
    assert page.read_text(encoding="utf-8") == cli_reference(), (
        "docs/reference/cli.md is out of date: python -m composer_fn.app.cli_docs > docs/reference/cli.md"
    )


def test_a_recipe_gives_model_kwargs_as_a_table_or_as_the_flag_s_text(tmp_path: Path) -> None:
    from composer_fn.app.recipes import RecipeError, load_recipe

    table, text = tmp_path / "table.toml", tmp_path / "text.toml"
    table.write_text('model_kwargs = {width = 16, dropout = 0.1, norm = "group", bias = true}\n')
    text.write_text('model_kwargs = "width=16,dropout=0.1,norm=group,bias=true"\n')
    expected = {"width": 16, "dropout": 0.1, "norm": "group", "bias": True}
    assert load_recipe(table, _train_converters()).flags["model_kwargs"] == expected
    assert load_recipe(text, _train_converters()).flags["model_kwargs"] == expected
    assert load_recipe(None, _train_converters(), ["model_kwargs={width = 16, dropout = 0.1, norm = 'group', bias = true}"]).flags["model_kwargs"] == expected
    table.write_text("batch_size = {width = 16}\n")
    with pytest.raises(RecipeError, match="field batch_size: "):
        load_recipe(table, _train_converters())


def test_a_batch_that_the_processes_do_not_divide_is_refused_before_any_process_starts(capsys) -> None:
    assert main(["train", "--task", "digits", "--nproc", "3", "--batch-size", "64", "--max-duration", "1ba"]) == 2
    err = capsys.readouterr().err.splitlines()
    assert err == ["composer-fn: --batch-size=64 must be a multiple of --nproc=3 (the global batch is split evenly over the processes); expected e.g. --batch-size=63"]
    assert main(["train", "--task", "digits", "--nproc", "5", "--max-duration", "1ba"]) == 2
    assert "the default batch of " in capsys.readouterr().err


def test_a_missing_extra_is_one_line_with_the_command_that_installs_it(capsys, monkeypatch, tmp_path: Path) -> None:
    import builtins

    import tomllib

    from composer_fn.core.extras import EXTRAS, install_command
    from composer_fn.models import hf_lm

    declared = tomllib.loads((Path(__file__).resolve().parents[1] / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    assert set(EXTRAS) == set(declared)
    real_import = builtins.__import__

    def without_transformers(name: str, *args, **kwargs):  # type: ignore[no-untyped-def]
        if name == "transformers":
            raise ModuleNotFoundError(f"No module named {name!r}")
        return real_import(name, *args, **kwargs)

    with monkeypatch.context() as patch:
        patch.setattr(builtins, "__import__", without_transformers)
        with pytest.raises(ModuleNotFoundError) as missing:
            hf_lm._transformers()
    assert str(missing.value) == f"language models need transformers: {install_command('hf')}"
    assert "pip install -e '.[hf]'" in str(missing.value)

    def absent() -> None:
        raise missing.value

    # The command line says it in one line, before any training.
    monkeypatch.setattr(hf_lm, "_transformers", absent)
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    for index in range(12):
        (corpus / f"doc{index}.txt").write_text(f"document {index} says hello world " * 40)
    assert main(["train", "--data", f"hf:{corpus}", "--max-duration", "1ba", "--no-progress"]) == 2
    assert capsys.readouterr().err.splitlines() == [f"composer-fn: {missing.value}"]


def test_a_setting_of_an_optimizer_or_schedule_argument_changes_the_defaults_not_replaces_them(capsys, tmp_path: Path) -> None:
    common = ["train", "--task", "digits-mlp", "--max-duration", "3ba", "--no-progress", "--threads", "1"]

    def held_out() -> str:
        return next(line for line in capsys.readouterr().out.splitlines() if "held-out" in line)

    # The task's optimizer (SGD, 0.1, Nesterov momentum 0.9, decay 5e-4) with momentum 0.5, written out in full.
    file = tmp_path / "r.toml"
    file.write_text(
        '[optimizer]\nname = "sgd"\nlearning_rate = 0.1\nmomentum = 0.5\nnesterov = true\nweight_decay = 5e-4\n'
        '[schedule]\nname = "cosine_warmup"\nt_warmup = "0.3dur"\n'
    )
    assert main([*common, "--config", str(file)]) == 0
    written = held_out()
    assert main([*common, "--set", "optimizer.momentum=0.5", "--set", "schedule.t_warmup=0.3dur"]) == 0
    assert held_out() == written
    # A named optimizer stands alone and takes the task's learning rate when it gives none.
    assert main([*common, "--set", "optimizer.name=adamw"]) == 0
    named = held_out()
    assert main([*common, "--optimizer", "adamw"]) == 0
    assert held_out() == named != written
