"""A DeepSpeed config becomes the Trainer's options: each ZeRO stage its sharding, bf16/fp16 the precision, the
clipping and batch keys theirs; what the project cannot honour exactly is refused naming the key and its value;
``composer-fn train --deepspeed`` (and a recipe's ``deepspeed`` field) hands the options to the Trainer."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from composer_fn.algorithms import GradientClipping
from composer_fn.trainer import FSDP, DeepSpeedSettings, deepspeed_options

# --- the mapping -------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("stage", "sharding"),
    [
        (0, None),
        (1, FSDP(reshard_after_forward=False)),
        (2, FSDP(reshard_after_forward=False)),
        (3, FSDP(reshard_after_forward=True)),
    ],
)
def test_each_zero_stage_is_its_sharding(stage: int, sharding: FSDP | None) -> None:
    settings = deepspeed_options({"zero_optimization": {"stage": stage}})
    assert settings.zero_stage == stage and settings.parallelism == sharding


def test_a_config_without_keys_sets_nothing() -> None:
    assert deepspeed_options({}) == DeepSpeedSettings()
    assert deepspeed_options({"zero_optimization": {}}).zero_stage is None


_TUNING = {
    "allgather_partitions": st.booleans(),
    "allgather_bucket_size": st.integers(0, 10**9) | st.just(5e8) | st.just("auto"),
    "overlap_comm": st.booleans(),
    "reduce_scatter": st.booleans(),
    "reduce_bucket_size": st.integers(0, 10**9) | st.just("auto"),
    "contiguous_gradients": st.booleans(),
    "round_robin_gradients": st.booleans(),
    "sub_group_size": st.integers(0, 10**12),
    "stage3_max_live_parameters": st.integers(0, 10**9),
    "stage3_max_reuse_distance": st.integers(0, 10**9),
    "stage3_prefetch_bucket_size": st.integers(0, 10**9) | st.just("auto"),
    "stage3_param_persistence_threshold": st.integers(0, 10**6) | st.just("auto"),
    "stage3_gather_16bit_weights_on_model_save": st.booleans(),
    "ignore_unused_parameters": st.booleans(),
    "offload_optimizer": st.just({"device": "none", "pin_memory": True}),
    "offload_param": st.just({"device": "none"}),
}


@given(
    stage=st.sampled_from([0, 1, 2, 3]),
    tuning=st.fixed_dictionaries({}, optional=_TUNING),
    reporting=st.fixed_dictionaries(
        {},
        optional={
            "steps_per_print": st.integers(0, 1000),
            "wall_clock_breakdown": st.booleans(),
            "zero_allow_untested_optimizer": st.booleans(),
            "prescale_gradients": st.just(False),
            "tensorboard": st.just({"enabled": False, "output_path": "runs/tb"}),
            "activation_checkpointing": st.just({"partition_activations": False, "cpu_checkpointing": False}),
        },
    ),
)
def test_tuning_and_reporting_keys_change_no_option(stage: int, tuning: dict[str, Any], reporting: dict[str, Any]) -> None:
    plain = deepspeed_options({"zero_optimization": {"stage": stage}})
    assert deepspeed_options({"zero_optimization": {"stage": stage, **tuning}, **reporting}) == plain


@pytest.mark.parametrize(
    ("config", "precision"),
    [
        ({"bf16": {"enabled": True}}, "bf16-mixed"),
        ({"fp16": {"enabled": True}}, "fp16-mixed"),
        ({"bf16": {"enabled": False}, "fp16": {"enabled": False}}, None),
        ({"fp16": {"enabled": True, "loss_scale": 0, "initial_scale_power": 16, "loss_scale_window": 2000}}, "fp16-mixed"),
        ({"fp16": {"enabled": True, "hysteresis": 1, "consecutive_hysteresis": False}}, "fp16-mixed"),
        # A block that is off is not read further: its loss-scaling keys do not apply.
        ({"fp16": {"enabled": False, "loss_scale_window": 1000, "min_loss_scale": 1}}, None),
    ],
)
def test_the_enabled_block_is_the_precision(config: dict[str, Any], precision: str | None) -> None:
    assert deepspeed_options(config).precision == precision


@pytest.mark.parametrize("run", [None, "fp32", "bf16-mixed", "fp16-mixed"])
def test_an_auto_block_follows_the_runs_precision(run: str | None) -> None:
    config = {"bf16": {"enabled": "auto"}, "fp16": {"enabled": "auto"}}
    expected = run if run in ("bf16-mixed", "fp16-mixed") else None
    assert deepspeed_options(config, precision=run).precision == expected


def test_an_auto_fp16_block_is_held_to_the_loss_scale_rule_when_the_run_is_fp16() -> None:
    config = {"fp16": {"enabled": "auto", "loss_scale_window": 1000}}
    assert deepspeed_options(config, precision="bf16-mixed").precision is None
    with pytest.raises(ValueError, match="fp16.loss_scale_window=1000: expected 2000"):
        deepspeed_options(config, precision="fp16-mixed")


@pytest.mark.parametrize(("value", "threshold"), [(1.0, 1.0), (0.5, 0.5), (2, 2.0), (0, None), (0.0, None)])
def test_gradient_clipping_is_the_global_norm_threshold_and_zero_clips_nothing(value: float, threshold: float | None) -> None:
    assert deepspeed_options({"gradient_clipping": value}).gradient_clipping == threshold


def test_communication_data_type_is_the_dtype_sharded_gradients_are_reduced_in() -> None:
    settings = deepspeed_options({"zero_optimization": {"stage": 3}, "communication_data_type": "bf16"})
    assert settings.parallelism == FSDP(reshard_after_forward=True, reduce_dtype="bf16")
    assert deepspeed_options({"communication_data_type": "fp32"}).parallelism is None


# --- the batch keys ----------------------------------------------------------------------------------------------


def test_the_batch_keys_are_kept_and_auto_is_as_if_left_out() -> None:
    given_ = {"train_micro_batch_size_per_gpu": 8, "gradient_accumulation_steps": 2, "train_batch_size": 64}
    settings = deepspeed_options(given_)
    assert (settings.microbatch_size, settings.gradient_accumulation_steps, settings.train_batch_size) == (8, 2, 64)
    auto = deepspeed_options(dict.fromkeys(given_, "auto"))
    assert (auto.microbatch_size, auto.gradient_accumulation_steps, auto.train_batch_size) == (None, None, None)


@given(
    micro=st.integers(1, 16),
    steps=st.integers(1, 8),
    world=st.integers(1, 8),
    keys=st.sets(st.sampled_from(["micro", "steps", "train"]), min_size=1),
)
def test_deepspeeds_batch_rule_gives_the_microbatch_of_a_consistent_run(micro: int, steps: int, world: int, keys: set[str]) -> None:
    # train_batch_size = micro × accumulation steps × processes: any keys of a consistent triple give the microbatch.
    batch = micro * steps * world
    values = {"micro": ("train_micro_batch_size_per_gpu", micro), "steps": ("gradient_accumulation_steps", steps)}
    values["train"] = ("train_batch_size", batch)
    settings = deepspeed_options(dict(values[key] for key in keys))
    # The global batch alone says nothing about accumulation; one microbatch a process is None.
    expected = None if keys == {"train"} or steps == 1 else micro
    assert settings.microbatch_size_for(batch, world) == expected
    implied = {frozenset({"micro"}): micro * world, frozenset({"steps"}): None}
    assert settings.batch_size(world) == implied.get(frozenset(keys), batch)


@pytest.mark.parametrize(
    ("config", "batch", "world", "named"),
    [
        ({"train_batch_size": 64}, 128, 2, "train_batch_size=64, but the run's global batch is 128 (2 processes × 64)"),
        (
            {"train_micro_batch_size_per_gpu": 8, "gradient_accumulation_steps": 2},
            64,
            2,
            "train_micro_batch_size_per_gpu=8 × gradient_accumulation_steps=2 = 16",
        ),
        ({"train_micro_batch_size_per_gpu": 24}, 64, 1, "train_micro_batch_size_per_gpu=24 does not divide each process's batch, 64"),
        ({"gradient_accumulation_steps": 3}, 64, 1, "gradient_accumulation_steps=3 does not divide each process's batch, 64"),
    ],
)
def test_a_batch_that_breaks_deepspeeds_rule_is_refused_naming_the_keys_and_values(
    config: dict[str, int], batch: int, world: int, named: str
) -> None:
    with pytest.raises(ValueError) as raised:
        deepspeed_options(config).microbatch_size_for(batch, world)
    assert named in str(raised.value)


def test_train_batch_size_must_be_a_multiple_of_micro_times_steps() -> None:
    config = {"train_batch_size": 30, "train_micro_batch_size_per_gpu": 4, "gradient_accumulation_steps": 2}
    with pytest.raises(ValueError, match=r"train_batch_size=30: expected a multiple of .*= 8"):
        deepspeed_options(config)


# --- what is refused ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("config", "named", "instead"),
    [
        ({"zero_optimization": {"stage": 4}}, "zero_optimization.stage=4", "0, 1, 2 or 3"),
        ({"zero_optimization": {"stage": "auto"}}, 'zero_optimization.stage="auto"', "placeholder"),
        (
            {"zero_optimization": {"stage": 3, "offload_optimizer": {"device": "cpu", "pin_memory": True}}},
            'zero_optimization.offload_optimizer.device="cpu"',
            "offload to CPU is not supported",
        ),
        (
            {"zero_optimization": {"stage": 3, "offload_param": {"device": "nvme", "nvme_path": "/nvme"}}},
            'zero_optimization.offload_param.device="nvme"',
            "offload to NVMe is not supported",
        ),
        ({"zero_optimization": {"cpu_offload": True}}, "zero_optimization.cpu_offload=true", "CPU offload"),
        ({"zero_optimization": {"zero_quantized_gradients": True}}, "zero_optimization.zero_quantized_gradients=true", "false"),
        ({"zero_optimization": {"reduce_bucket_szie": 5}}, "zero_optimization.reduce_bucket_szie=5", "zero_optimization.reduce_bucket_size"),
        ({"optimizer": {"type": "OneBitAdam", "params": {"lr": 1e-3}}}, 'optimizer={"type": "OneBitAdam"', "optimizer="),
        ({"optimizer": {"type": "Lamb"}}, 'optimizer={"type": "Lamb"}', "recipe's [optimizer] table"),
        ({"scheduler": {"type": "WarmupLR"}}, 'scheduler={"type": "WarmupLR"}', "[schedule] table"),
        ({"pipeline": {"stages": 2}}, 'pipeline={"stages": 2}', "sharded over every process by FSDP"),
        ({"tensor_parallel": {"autotp_size": 2}}, 'tensor_parallel={"autotp_size": 2}', "FSDP"),
        (
            {"activation_checkpointing": {"cpu_checkpointing": True}},
            "activation_checkpointing.cpu_checkpointing=true",
            "FSDP(activation_checkpointing=True)",
        ),
        (
            {"activation_checkpointing": {"partition_activations": True}},
            "activation_checkpointing.partition_activations=true",
            "FSDP(activation_checkpointing=True)",
        ),
        ({"bf16": {"enabled": True}, "fp16": {"enabled": True}}, "fp16.enabled=true", "one mixed precision"),
        ({"bf16": {"enabled": "yes"}}, 'bf16.enabled="yes"', "true or false"),
        ({"fp16": {"enabled": True, "loss_scale": 128}}, "fp16.loss_scale=128", "a static scale is not supported"),
        ({"fp16": {"enabled": True, "initial_scale_power": 12}}, "fp16.initial_scale_power=12", "expected 16"),
        ({"fp16": {"enabled": True, "loss_scale_window": 1000}}, "fp16.loss_scale_window=1000", "expected 2000"),
        ({"fp16": {"enabled": True, "hysteresis": 2}}, "fp16.hysteresis=2", "expected 1"),
        ({"fp16": {"enabled": True, "min_loss_scale": 1}}, "fp16.min_loss_scale=1", "no floor"),
        ({"gradient_clipping": -1.0}, "gradient_clipping=-1.0", ">= 0"),
        ({"gradient_clipping": "auto"}, 'gradient_clipping="auto"', "give the value"),
        ({"train_micro_batch_size_per_gpu": 0}, "train_micro_batch_size_per_gpu=0", ">= 1"),
        ({"communication_data_type": "bf16"}, 'communication_data_type="bf16"', "unsharded run"),
        ({"communication_data_type": "fp8"}, 'communication_data_type="fp8"', '"fp32", "bf16", "fp16"'),
        ({"prescale_gradients": True}, "prescale_gradients=true", "false"),
        ({"amp": {"enabled": True, "opt_level": "O1"}}, "amp.enabled=true", "--precision"),
        ({"flops_profiler": {"enabled": True}}, "flops_profiler.enabled=true", "composer_fn.profiler.Profiler"),
        ({"wandb": {"enabled": True}}, "wandb.enabled=true", "loggers="),
        ({"zero_optimisation": {"stage": 2}}, 'zero_optimisation={"stage": 2}', "did you mean zero_optimization?"),
        ({"curriculum_learning": {"enabled": True}}, "curriculum_learning=", "not a DeepSpeed key this project maps"),
    ],
)
def test_what_cannot_be_honoured_is_refused_naming_the_key_its_value_and_what_instead(
    config: dict[str, Any], named: str, instead: str
) -> None:
    with pytest.raises(ValueError) as raised:
        deepspeed_options(config)
    message = str(raised.value)
    assert message.startswith("DeepSpeed config: ") and named in message and instead in message, message


# --- files ---------------------------------------------------------------------------------------------------


def _file(folder: Path, content: object, name: str = "ds_config.json") -> Path:
    path = folder / name
    path.write_text(content if isinstance(content, str) else json.dumps(content))
    return path


def test_a_file_reads_as_its_mapping_and_errors_name_the_path(tmp_path: Path) -> None:
    config = {"zero_optimization": {"stage": 2}, "bf16": {"enabled": True}, "gradient_clipping": 1.0}
    assert deepspeed_options(_file(tmp_path, config)) == deepspeed_options(config)
    assert deepspeed_options(str(_file(tmp_path, config))) == deepspeed_options(config)
    bad = _file(tmp_path, {"zero_optimization": {"stage": 3, "offload_param": {"device": "cpu"}}}, "offload.json")
    with pytest.raises(ValueError, match=rf"^DeepSpeed config '{bad}': zero_optimization.offload_param.device=\"cpu\""):
        deepspeed_options(bad)


@pytest.mark.parametrize(
    ("content", "says"),
    [
        (None, "cannot be read"),
        ("{'stage': 2}", "not JSON (Expecting property name enclosed in double quotes at line 1, column 2)"),
        ("[1, 2]", "holds a JSON list, not an object"),
        (b"\xff\xfe{}", "is not text"),
    ],
)
def test_a_bad_file_is_refused_naming_its_path(tmp_path: Path, content: str | bytes | None, says: str) -> None:
    path = tmp_path / "ds.json"
    if isinstance(content, bytes):
        path.write_bytes(content)
    elif content is not None:
        path.write_text(content)
    with pytest.raises(ValueError) as raised:
        deepspeed_options(path)
    assert str(raised.value).startswith(f"DeepSpeed config '{path}': {says}")


def test_a_config_that_is_neither_a_mapping_nor_a_path_is_a_type_error() -> None:
    with pytest.raises(TypeError, match=r"config=2: expected a mapping of DeepSpeed keys or the path"):
        deepspeed_options(2)  # type: ignore[arg-type]


# --- the command line ---------------------------------------------------------------------------------------


class _Built(Exception):
    """Stops a command once it has built its Trainer: its arguments are what the tests read."""


@pytest.fixture
def trainer_arguments(monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    import composer_fn.trainer

    arguments: dict[str, Any] = {}

    def recorded(model: Any, train: Any, *rest: Any, **options: Any) -> None:
        arguments.update(options, train=train)
        raise _Built

    monkeypatch.delenv("WORLD_SIZE", raising=False)
    monkeypatch.setattr(composer_fn.trainer, "Trainer", recorded)
    return arguments


def test_deepspeed_sets_the_trainers_precision_clipping_and_microbatch(tmp_path: Path, trainer_arguments: dict[str, Any]) -> None:
    from composer_fn.app.cli import main

    config = _file(
        tmp_path,
        {"train_batch_size": 32, "train_micro_batch_size_per_gpu": 8, "bf16": {"enabled": True}, "gradient_clipping": 0.5},
    )
    with pytest.raises(_Built):
        main(["train", "--task", "digits-mlp", "--deepspeed", str(config), "--algorithms", "label_smoothing"])
    assert trainer_arguments["precision"] == "bf16-mixed"
    assert trainer_arguments["device_train_microbatch_size"] == 8
    assert trainer_arguments["parallelism"] is None
    assert trainer_arguments["train"].batch_size == 32  # the config's global batch, on one process
    assert [a.name for a in trainer_arguments["algorithms"]] == ["label_smoothing", "gradient_clipping"]
    assert trainer_arguments["algorithms"][-1] == GradientClipping(clipping_type="norm", clipping_threshold=0.5)


def test_a_recipes_deepspeed_field_is_relative_to_the_recipe(tmp_path: Path, trainer_arguments: dict[str, Any], monkeypatch) -> None:
    from composer_fn.app.cli import main

    (tmp_path / "recipes").mkdir()
    _file(tmp_path / "recipes", {"gradient_accumulation_steps": 4})
    recipe = tmp_path / "recipes" / "run.toml"
    recipe.write_text('task = "digits-mlp"\nbatch_size = 64\ndeepspeed = "ds_config.json"\n')
    monkeypatch.chdir(tmp_path)
    with pytest.raises(_Built):
        main(["train", "--config", "recipes/run.toml"])
    assert trainer_arguments["device_train_microbatch_size"] == 16 and trainer_arguments["precision"] == "fp32"


def test_a_recipes_refused_deepspeed_config_names_the_field_and_the_key(tmp_path: Path, capsys) -> None:
    from composer_fn.app.cli import main

    _file(tmp_path, {"optimizer": {"type": "Adam"}})
    recipe = tmp_path / "run.toml"
    recipe.write_text('deepspeed = "ds_config.json"\n')
    assert main(["train", "--config", str(recipe)]) == 2
    err = capsys.readouterr().err
    assert "field deepspeed: DeepSpeed config" in err and 'optimizer={"type": "Adam"}' in err


@pytest.mark.parametrize(
    ("config", "flags", "named"),
    [
        ({"bf16": {"enabled": True}}, ["--precision", "fp32"], "--precision=fp32 and --deepspeed "),
        ({"zero_optimization": {"stage": 2}}, ["--fsdp"], "--fsdp (ZeRO-3: the parameters sharded too) and --deepspeed"),
        ({"train_batch_size": 128}, ["--batch-size", "64"], "--batch-size=64 and --deepspeed "),
        ({"train_micro_batch_size_per_gpu": 16}, ["--batch-size", "64", "--microbatch-size", "8"], "--microbatch-size=8 and --deepspeed"),
        ({"gradient_clipping": 1.0}, ["--algorithms", "gradient_clipping"], "the algorithm gradient_clipping and --deepspeed"),
        ({"zero_optimization": {"stage": 2}}, [], "zero_optimization.stage=2 shards over the processes of a process group: add --nproc N"),
        ({"train_micro_batch_size_per_gpu": 24}, ["--batch-size", "64"], "train_micro_batch_size_per_gpu=24 does not divide"),
    ],
)
def test_a_flag_that_disagrees_with_the_config_is_one_line_naming_both(
    tmp_path: Path, trainer_arguments: dict[str, Any], capsys, config: dict[str, Any], flags: list[str], named: str
) -> None:
    from composer_fn.app.cli import main

    path = _file(tmp_path, config)
    assert main(["train", "--task", "digits-mlp", "--deepspeed", str(path), *flags]) == 2
    lines = capsys.readouterr().err.splitlines()
    assert len(lines) == 1 and lines[0].startswith("composer-fn: ") and named in lines[0], lines
    assert str(path) in lines[0]


def test_flags_that_agree_with_the_config_are_taken(tmp_path: Path, trainer_arguments: dict[str, Any]) -> None:
    from composer_fn.app.cli import main

    path = _file(tmp_path, {"bf16": {"enabled": True}, "train_batch_size": 64, "train_micro_batch_size_per_gpu": 64})
    with pytest.raises(_Built):
        main(["train", "--task", "digits-mlp", "--deepspeed", str(path), "--precision", "bf16-mixed", "--batch-size", "64"])
    assert trainer_arguments["precision"] == "bf16-mixed" and trainer_arguments["device_train_microbatch_size"] is None


def test_a_refused_config_is_a_flag_error_naming_the_key(tmp_path: Path, capsys) -> None:
    from composer_fn.app.cli import main

    path = _file(tmp_path, {"zero_optimization": {"stage": 3, "offload_optimizer": {"device": "nvme"}}})
    with pytest.raises(SystemExit) as exited:
        main(["train", "--deepspeed", str(path)])
    assert exited.value.code == 2
    line = capsys.readouterr().err.strip()
    assert line.startswith("composer-fn train: error: argument --deepspeed: ")
    assert 'zero_optimization.offload_optimizer.device="nvme"' in line


def test_a_stage_0_bf16_clipped_run_trains_from_the_command_line(tmp_path: Path, capsys) -> None:
    from composer_fn.app.cli import main

    path = _file(tmp_path, {"zero_optimization": {"stage": 0}, "bf16": {"enabled": True}, "gradient_clipping": 1.0})
    argv = ["train", "--task", "digits-mlp", "--deepspeed", str(path), "--max-duration", "2ba", "--no-progress"]
    assert main([*argv, "--threads", "1"]) == 0
    out = capsys.readouterr().out
    assert "algorithms gradient_clipping" in out and "2 steps" in out
