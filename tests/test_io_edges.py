"""What a run writes and the command line read: a bad path, stream or file is refused before training, naming the
argument, the value and what is accepted; a setting that makes a tool do nothing says so; help says what each
flag takes and its default."""

from __future__ import annotations

import argparse
import io
import json
import math
import sys
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from composer_fn import Trainer, optim
from composer_fn import random as R
from composer_fn.app.cli import ALGORITHMS, _parser, main
from composer_fn.app.report import read_run, write_report
from composer_fn.core.dry_run import dry_run
from composer_fn.data import TensorLoader
from composer_fn.loggers import ConsoleLogger, JSONLLogger, TensorBoardLogger
from composer_fn.models import MLP
from composer_fn.profiler import Profiler, summarize

DATA = (R.normal(R.key(0), (16, 2)), R.randint(R.key(1), 0, 2, (16,)))


def _trainer(**arguments: Any) -> Trainer:
    settings: dict[str, Any] = {"max_duration": "2ba", "optimizer": optim.sgd(0.1), "progress_bar": False, **arguments}
    return Trainer(MLP(2, 2), TensorLoader(DATA, batch_size=8), **settings)


def _file(folder: Path) -> Path:
    path = folder / "file"
    path.write_text("x")
    return path


# (build from a folder holding the file "file", error type, message) -- checked at construction.
BAD_PATHS: list[tuple[str, Callable[[Path], object], type[Exception], str]] = [
    ("jsonl folder", lambda d: JSONLLogger(d), ValueError, r"path='.*' is a folder: expected a file path"),
    ("jsonl None", lambda d: JSONLLogger(None), TypeError, r"path=None must be a file path \(a str or os.PathLike\)"),  # type: ignore[arg-type]
    ("jsonl empty", lambda d: JSONLLogger(""), ValueError, r"path='' is empty: expected a file path"),
    ("jsonl number", lambda d: JSONLLogger(3), TypeError, r"path=3 must be a file path"),  # type: ignore[arg-type]
    ("jsonl under a file", lambda d: JSONLLogger(_file(d) / "log.jsonl"), ValueError, r"path='.*file/log.jsonl' cannot be created: '.*file' is a file"),
    ("jsonl overwrite", lambda d: JSONLLogger(d / "log.jsonl", overwrite="yes"), TypeError, r"overwrite='yes' must be True or False"),  # type: ignore[arg-type]
    ("tensorboard file", lambda d: TensorBoardLogger(_file(d)), ValueError, r"log_dir='.*file' is a file: expected a folder path"),
    ("tensorboard None", lambda d: TensorBoardLogger(None), TypeError, r"log_dir=None must be a folder path"),  # type: ignore[arg-type]
    ("tensorboard empty", lambda d: TensorBoardLogger(""), ValueError, r"log_dir='' is empty: expected a folder path"),
    ("tensorboard under a file", lambda d: TensorBoardLogger(_file(d) / "tb"), ValueError, r"log_dir='.*file/tb' cannot be created: '.*file' is a file"),
    ("profiler file", lambda d: Profiler(_file(d)), ValueError, r"trace_folder='.*file' is a file: expected a folder path"),
    ("profiler None", lambda d: Profiler(None), TypeError, r"trace_folder=None must be a folder path"),  # type: ignore[arg-type]
    ("profiler empty", lambda d: Profiler(""), ValueError, r"trace_folder='' is empty: expected a folder path"),
    ("profiler under a file", lambda d: Profiler(_file(d) / "p"), ValueError, r"trace_folder='.*file/p' cannot be created: '.*file' is a file"),
    ("console number", lambda d: ConsoleLogger(3), TypeError, r"stream=3 of type int must be None, 'stdout', 'stderr' or an open text stream"),  # type: ignore[arg-type]
    ("console path", lambda d: ConsoleLogger("out.txt"), ValueError, r"stream='out.txt' must be None, 'stdout', 'stderr'.*JSONLLogger"),
    ("console binary", lambda d: ConsoleLogger(io.BytesIO()), TypeError, r"stream=.* is a binary stream"),  # type: ignore[arg-type]
    ("console closed", lambda d: ConsoleLogger(_closed()), ValueError, r"stream=.* is closed"),
]


def _closed() -> io.StringIO:
    stream = io.StringIO()
    stream.close()
    return stream


@pytest.mark.parametrize(("case", "build", "kind", "message"), BAD_PATHS, ids=[case[0] for case in BAD_PATHS])
def test_a_bad_destination_is_refused_at_construction_naming_it(tmp_path: Path, case, build, kind, message) -> None:
    with pytest.raises(kind, match=message):
        build(tmp_path)


@pytest.mark.parametrize(
    ("path", "kind", "message"),
    [
        ("{file}/model.ts", ValueError, r"path='.*file/model.ts' cannot be created: '.*file' is a file"),
        ("", ValueError, r"path='' is empty: expected a file path, e.g. 'model.ts'"),
        ("{folder}", ValueError, r"path='.*' is a folder: expected a file path"),
        (None, TypeError, r"path=None must be a file path"),
    ],
)
def test_an_export_to_a_path_that_cannot_be_a_file_is_refused_before_exporting(tmp_path: Path, path, kind, message) -> None:
    from composer_fn.export import export_model

    file = _file(tmp_path)
    given = path.format(file=file, folder=tmp_path) if isinstance(path, str) else path
    with pytest.raises(kind, match=message):
        export_model(MLP(2, 2), torch.randn(4, 2), given)
    assert [p.name for p in tmp_path.iterdir()] == ["file"]  # nothing written


def test_an_export_takes_a_numpy_tolerance(tmp_path: Path) -> None:
    from composer_fn.export import export_model

    check = export_model(MLP(2, 2), torch.randn(4, 2), tmp_path / "model.ts", tolerance=np.float32(1e-4))
    assert check.path.is_file() and check.tolerance == pytest.approx(1e-4)


@pytest.mark.parametrize("name", ["stdout", "stderr"])
def test_the_console_takes_a_streams_name(capsys, name: str) -> None:
    _trainer(loggers=[ConsoleLogger(name)], log_interval="1ba").fit()
    captured = capsys.readouterr()
    assert "[epoch 0 | batch 2] loss" in getattr(captured, "err" if name == "stderr" else "out")
    assert "[epoch 0 | batch 2] loss" not in getattr(captured, "out" if name == "stderr" else "err")


def test_a_fresh_run_refuses_a_log_holding_an_earlier_runs_records_and_a_resumed_run_appends(tmp_path: Path) -> None:
    log, folder = tmp_path / "log.jsonl", tmp_path / "checkpoints"
    _trainer(loggers=[JSONLLogger(log)], log_interval="1ba", save_folder=folder, save_interval="2ba").fit()
    first = log.read_text()
    with pytest.raises(ValueError, match=r"path='.*log.jsonl' already holds \d+ lines .* overwrite=True"):
        _trainer(loggers=[JSONLLogger(log)]).fit()
    assert log.read_text() == first  # nothing written
    checkpoint = next(folder.glob("*.pt"))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the run is longer than the checkpoint's
        resumed = _trainer(loggers=[JSONLLogger(log)], log_interval="1ba", load_path=checkpoint, max_duration="4ba")
    resumed.fit()
    steps = [r["step"] for r in map(json.loads, log.read_text().splitlines()) if r["kind"] == "train"]
    assert steps == [1, 2, 3, 4]
    _trainer(loggers=[JSONLLogger(log, overwrite=True)], log_interval="1ba").fit()
    steps = [r["step"] for r in map(json.loads, log.read_text().splitlines()) if r["kind"] == "train"]
    assert steps == [1, 2]


def test_a_fresh_command_line_run_refuses_its_old_log_in_one_line_unless_told_to_overwrite(capsys, tmp_path: Path) -> None:
    log = tmp_path / "log.jsonl"
    log.write_text('{"kind": "train", "step": 1}\n')
    argv = ["train", "--task", "digits-mlp", "--max-duration", "1ba", "--no-progress", "--log-file", str(log)]
    assert main(argv) == 2
    lines = capsys.readouterr().err.splitlines()
    assert len(lines) == 1 and "already holds 1 lines" in lines[0] and "--overwrite-log" in lines[0]
    assert main([*argv, "--overwrite-log"]) == 0
    assert '"step": 1' in log.read_text() and '"kind": "fit"' in log.read_text()


@pytest.mark.skipif(torch.cuda.is_available(), reason="the noise is a CPU machine's")
def test_profiling_on_a_cpu_prints_nothing_of_the_tracing_library(tmp_path: Path, capfd) -> None:
    # The tracing library reports once a process: this test comes before the others that profile.
    _trainer(profiler=Profiler(tmp_path, schedule=(0, 1, 1, 1)), max_duration="3ba").fit()
    err = capfd.readouterr().err
    assert "gpuGetDeviceCount" not in err and "profiler_start" not in err


def test_a_profiler_schedule_of_numpy_ints_is_taken_and_one_longer_than_the_run_warns_once(tmp_path: Path) -> None:
    profiler = Profiler(tmp_path, schedule=(np.int64(1), np.int64(1), np.int64(2), np.int64(1)))
    assert profiler.schedule == (1, 1, 2, 1) and all(type(n) is int for n in profiler.schedule)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        _trainer(profiler=profiler).fit()
    messages = [str(w.message) for w in caught if "records nothing" in str(w.message)]
    assert messages == [
        "Profiler schedule=(1, 1, 2, 1) records nothing in this run of 2 steps: it skips 1 (wait) and warms up 1 "
        "steps before recording; lower wait and warmup, or train longer"
    ]


def test_summarize_shows_operator_names_whole_and_names_a_file_that_is_not_a_trace(tmp_path: Path) -> None:
    name = "autograd::engine::evaluate_function: ConvolutionBackward0"
    trace = tmp_path / "rank0.1.pt.trace.json"
    trace.write_text(json.dumps({"traceEvents": [{"ph": "X", "cat": "cpu_op", "name": name, "dur": 5.0}]}))
    assert f"\n{name} " in summarize([trace]) and f"\n{name} " in summarize(trace)
    binary = tmp_path / "model.pt"
    binary.write_bytes(b"PK\x03\x04\xff\xfe")
    with pytest.raises(ValueError, match=r"trace '.*model.pt' is not JSON: expected a Chrome trace"):
        summarize([binary])
    with pytest.raises(ValueError, match=r"top=0 must be an int >= 1"):
        summarize([trace], top=0)


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (b"PK\x03\x04" + bytes(range(128, 256)), r"model.pt is not a JSON-lines log: it is a zip archive, such as a checkpoint"),
        (bytes(range(128, 256)), r"model.pt is not a JSON-lines log: it is binary, not text"),
        (b'{"kind": "train", "step": 1, "loss": 1.0}\n{"kind": "tr', r"model.pt:2 is not a JSON record"),
    ],
)
def test_a_file_that_is_not_a_log_is_refused_naming_it(tmp_path: Path, content: bytes, message: str) -> None:
    path = tmp_path / "model.pt"
    path.write_bytes(content)
    with pytest.raises(ValueError, match=message):
        read_run(path)


@pytest.mark.parametrize(
    ("call", "kind", "message"),
    [
        (lambda: write_report("runs/digits"), TypeError, r"runs='runs/digits' must be a list of run folders .* e.g. \['runs/digits'\]"),
        (lambda: write_report(["a"], labels="a"), TypeError, r"labels='a' must be a list of names"),
        (lambda: read_run(None), TypeError, r"run=None must be a run folder or its JSON-lines log"),  # type: ignore[arg-type]
    ],
)
def test_report_arguments_of_the_wrong_kind_are_refused_naming_them(call, kind, message) -> None:
    with pytest.raises(kind, match=message):
        call()


def test_report_of_a_log_without_finite_values_says_which_metrics_have_none(tmp_path: Path, capsys) -> None:
    log = tmp_path / "nan.jsonl"
    nan = math.nan
    records = [
        {"kind": "train", "step": 1, "loss": nan, "lr_multiplier": 1.0, "samples_per_second": 10.0, "wall_time": 0.1},
        {"kind": "eval", "step": 1, "eval/eval/accuracy": nan, "wall_time": 0.2},
    ]
    log.write_text("".join(json.dumps(r) + "\n" for r in records))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        write_report([log], tmp_path / "report.png")
    assert [str(w.message).split(" has no finite value")[0] for w in caught] == [
        "run 'nan': loss",
        "run 'nan': eval/eval/accuracy",
    ]
    assert "(all 1 logged are NaN or infinite); the training loss panel has no line for it" in str(caught[0].message)
    assert main(["report", str(log), "--output", str(tmp_path / "again.png")]) == 0
    err = capsys.readouterr().err.splitlines()
    assert err == [f"composer-fn: warning: {w.message}" for w in caught]


def test_report_refuses_a_binary_file_and_an_output_it_cannot_write_in_one_line(tmp_path: Path, capsys) -> None:
    checkpoint = tmp_path / "latest.pt"
    checkpoint.write_bytes(b"PK\x03\x04" + bytes(range(128, 256)))
    assert main(["report", str(checkpoint)]) == 2
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and str(checkpoint) in err[0] and "not a JSON-lines log" in err[0]
    log = tmp_path / "log.jsonl"
    log.write_text('{"kind": "train", "step": 1, "loss": 1.0}\n')
    assert main(["report", str(log), "--output", str(checkpoint / "report.png")]) == 2
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and "output='" in err[0] and "cannot be created" in err[0]
    for compare in ([], ["--compare", str(log)]):  # the PNG over the log it reads
        other = tmp_path / "other.jsonl"
        other.write_text(log.read_text())
        assert main(["report", str(other), *compare, "--output", str(log if compare else other)]) == 2
        err = capsys.readouterr().err.splitlines()
        assert len(err) == 1 and "writing it would replace its input" in err[0]
    assert log.read_text().startswith('{"kind"')
    # What is not the PNG a report is, and labels that do not name each run once, are refused by their flags.
    assert main(["report", str(log), "--output", str(tmp_path / "report.txt")]) == 2
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and "--output" in err[0] and "report.txt" in err[0] and "ending in .png" in err[0]
    assert main(["report", str(log), "--compare", str(log), "--labels", "a,b,c", "--output", str(tmp_path / "r.png")]) == 2
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and "--labels a,b,c names 3 runs, and 2 are given" in err[0]
    assert not (tmp_path / "report.txt").exists() and not (tmp_path / "r.png").exists()


@pytest.mark.parametrize("command", ["train", "plan"])
def test_a_binary_config_is_one_line_naming_it(tmp_path: Path, capsys, command: str) -> None:
    config = tmp_path / "latest.pt"
    config.write_bytes(bytes(range(128, 256)))
    assert main([command, "--config", str(config), "--max-duration", "1ba"]) == 2
    err = capsys.readouterr().err.splitlines()
    assert err == [f"composer-fn: --config={str(config)!r}: is not text (not UTF-8); expected a TOML file, e.g. recipes/digits-baseline.toml"]


@pytest.mark.parametrize(("content", "message"), [(None, "is a folder"), (bytes(range(128, 256)), "is not text")])
def test_a_sweep_file_that_is_a_folder_or_binary_is_one_line_naming_it(tmp_path: Path, capsys, content, message) -> None:
    sweep = tmp_path / "sweep.toml"
    if content is None:
        sweep.mkdir()
    else:
        sweep.write_bytes(content)
    assert main(["pareto", "--config", str(sweep)]) == 2
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and f"sweep file {str(sweep)!r}: {message}" in err[0]


def test_a_sweep_file_that_is_not_toml_is_one_line_naming_it_and_where(tmp_path: Path, capsys) -> None:
    sweep = tmp_path / "sweep.toml"
    sweep.write_text("seeds = [1]\nrecipes = = 2\n")
    assert main(["pareto", "--config", str(sweep)]) == 2
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and err[0].startswith(f"composer-fn: {sweep}: not TOML (") and "line" in err[0], err


def test_a_recipes_unknown_field_lists_each_accepted_name_once(tmp_path: Path, capsys) -> None:
    recipe = tmp_path / "recipe.toml"
    recipe.write_text("epochs = 3\n")
    assert main(["plan", "--config", str(recipe)]) == 2
    err = capsys.readouterr().err
    accepted = err.split("accepted: ", 1)[1].strip().split(", ")
    assert "optimizer" in accepted and len(accepted) == len(set(accepted)) and accepted == sorted(accepted)


def _options(command: argparse.ArgumentParser) -> list[argparse.Action]:
    return [a for a in command._actions if a.option_strings and a.dest != "help"]


def test_every_option_of_every_command_has_help_that_states_its_default() -> None:
    _, commands = _parser()
    assert set(commands) == {"train", "plan", "profile", "export", "predict", "convert", "pareto", "report", "algorithms"}
    for name, command in commands.items():
        formatter = command._get_formatter()
        for action in _options(command):
            assert action.help, f"{name} {action.option_strings[0]} has no help"
            text = formatter._expand_help(action)
            required = getattr(action, "required", False)
            assert required or "default" in text or "if omitted" in text, f"{name} {action.option_strings[0]}: {text}"


@pytest.mark.parametrize("command", ["train", "plan", "profile"])
def test_help_lists_every_algorithm_name(capsys, command: str) -> None:
    import composer_fn.algorithms  # noqa: F401
    from composer_fn.core.algorithm import REGISTRY

    with pytest.raises(SystemExit) as exited:
        main([command, "--help"])
    assert exited.value.code == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "--seed SEED the run's seed" in out and "(default: 0)" in out
    listed = out.split("accepted: ", 1)[1]
    assert all(f"{name}," in listed or f"{name} " in listed for name in REGISTRY)
    assert ALGORITHMS == tuple(sorted(REGISTRY))  # help lists them without loading the registry (torch)


def test_a_plan_without_rows_says_why(capsys) -> None:
    assert main(["plan", "--algorithms", "layer_freezing", "--max-duration", "1ep"]) == 0
    out = capsys.readouterr().out
    assert "note: layer_freezing has no row: it freezes layers as training goes" in out
    assert "note: no algorithm given" in dry_run((), "2ba", 1).format()


@pytest.mark.parametrize(("precision", "check"), [("bf16-mixed", "_is_mkldnn_bf16_supported"), ("fp16-mixed", "_is_mkldnn_fp16_supported")])
def test_low_precision_on_a_cpu_without_its_instructions_warns_once_and_fp32_does_not(monkeypatch, precision, check) -> None:
    monkeypatch.setattr(torch.ops.mkldnn, check, lambda: False)
    with pytest.warns(UserWarning, match=rf"precision='{precision}' on this CPU.*slower than 'fp32'") as caught:
        _trainer(precision=precision, device="cpu")
    assert sum("on this CPU" in str(w.message) for w in caught) == 1
    monkeypatch.setattr(torch.ops.mkldnn, check, lambda: True)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        _trainer(precision=precision, device="cpu")
        _trainer(precision="fp32", device="cpu")


def test_the_console_writes_to_the_stream_of_the_moment(monkeypatch) -> None:
    console = ConsoleLogger("stdout")
    replaced = io.StringIO()
    monkeypatch.setattr(sys, "stdout", replaced)
    console.log({"kind": "fit", "step": 3, "wall_time": 1.0})
    assert replaced.getvalue().startswith("[done at batch 3]")


def test_numpy_numbers_in_a_record_are_shown_not_dropped(tmp_path: Path) -> None:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    stream = io.StringIO()
    console, board = ConsoleLogger(stream), TensorBoardLogger(tmp_path)
    record = {"kind": "eval", "step": 1, "epoch": 0, "eval/eval/accuracy": np.float32(0.5), "eval/eval/loss": np.float64(2.0)}
    for logger in (console, board):
        logger.log(record)
        logger.close()
    assert "eval/eval/accuracy 50.00%" in stream.getvalue() and "eval/eval/loss 2.0000" in stream.getvalue()
    events = EventAccumulator(str(tmp_path), size_guidance={"scalars": 0})
    events.Reload()
    assert {"eval/eval/accuracy", "eval/eval/loss"} <= set(events.Tags()["scalars"])


def test_report_names_records_it_cannot_draw_rather_than_dropping_them_without_a_word(tmp_path: Path, capsys) -> None:
    log = tmp_path / "log.jsonl"
    log.write_text(
        '{"kind": "train", "step": 1, "loss": 1.0}\n'
        '{"kind": "train", "loss": 0.9}\n'
        '{"kind": "train", "step": "3", "loss": 0.8}\n'
        '{"kind": "train", "step": 4, "loss": "0.7"}\n'
        '{"kind": "train", "step": 5, "loss": 0.6}\n'
        '{"kind": "eval", "step": 5, "eval/eval/accuracy": 0.5}\n'
    )
    assert main(["report", str(log), "--output", str(tmp_path / "r.png")]) == 0
    err = capsys.readouterr().err
    assert "2 training or evaluation record(s) have no numeric step (line 2, 3); they are left out" in err
    assert "1 of its train records hold loss as something other than a number (e.g. '0.7')" in err
