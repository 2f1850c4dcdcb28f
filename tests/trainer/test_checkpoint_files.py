"""Checkpoint files in a save folder: the newest few kept, weights-only files, stale temporary files removed,
autoresume after a crash continuing bit for bit, starting a new run from a checkpoint's weights, and a resume
with another run length said out loud."""

from __future__ import annotations

import warnings
from pathlib import Path

import pytest
import torch

from composer_fn import MixUp, Trainer, optim
from composer_fn import random as R
from composer_fn.data import TensorLoader
from composer_fn.models import MLP
from composer_fn.trainer.checkpoint import newest_checkpoint, prune_checkpoints, remove_stale_temporaries
from composer_fn.trainer.sharded_files import INFO
from tests.crashing import Crash

DATA = (R.normal(R.key(0), (32, 6)), R.randint(R.key(1), 0, 2, (32,)))


def _trainer(folder: Path | None = None, max_duration: str = "12ba", **options) -> Trainer:
    # Eight batches an epoch: a 12-batch run resumes mid-epoch.
    arguments = {
        "max_duration": max_duration,
        "optimizer": optim.sgd(0.1, momentum=0.9),
        "progress_bar": False,
        "save_folder": folder,
        "save_interval": "1ba" if folder is not None else None,
        **options,
    }
    model = arguments.pop("model", MLP(6, 2, hidden=(8,)))
    return Trainer(model, TensorLoader(DATA, batch_size=4, seed=3), **arguments)


def _checkpoints(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir() if p.name.endswith(".pt") and p.name != "latest.pt")


def _same_state(ours: Trainer, theirs: Trainer) -> bool:
    pairs = [
        *zip(ours.state.params.values(), theirs.state.params.values(), strict=True),
        *zip(ours.state.buffers.values(), theirs.state.buffers.values(), strict=True),
        *zip(
            torch.utils._pytree.tree_leaves(ours.state.opt),
            torch.utils._pytree.tree_leaves(theirs.state.opt),
            strict=True,
        ),
    ]
    return all(torch.equal(a, b) for a, b in pairs) and ours.timestamp.batch == theirs.timestamp.batch


def test_only_the_newest_checkpoints_are_kept_and_latest_points_at_the_newest(tmp_path: Path) -> None:
    trainer = _trainer(tmp_path, max_duration="6ba", save_num_checkpoints_to_keep=2)
    trainer.fit()
    assert _checkpoints(tmp_path) == ["ep0-ba5.pt", "ep0-ba6.pt"]
    assert (tmp_path / "latest.pt").resolve() == (tmp_path / "ep0-ba6.pt").resolve()


def test_temporary_files_of_an_interrupted_write_are_removed_and_never_resumed_from(tmp_path: Path) -> None:
    _trainer(tmp_path, max_duration="2ba").fit()
    stale = [tmp_path / ".ep0-ba9.pt.k2j4x.tmp", tmp_path / ".latest.pt.tmp"]
    for path in stale:
        path.write_bytes(b"half a checkpoint")
    with pytest.warns(UserWarning, match="the schedule's length changed"):
        resumed = _trainer(tmp_path, max_duration="3ba", autoresume=True)
    assert not any(path.exists() for path in stale)
    assert resumed.timestamp.batch == 2


def test_autoresume_after_a_crash_continues_the_uninterrupted_run_bit_for_bit(tmp_path: Path) -> None:
    uninterrupted = _trainer(tmp_path / "whole")
    uninterrupted.fit()
    folder = tmp_path / "crashed"
    with pytest.raises(KeyboardInterrupt, match="crash at batch 5"):
        _trainer(folder, callbacks=(Crash(5),)).fit()
    assert newest_checkpoint(folder) == folder / "ep0-ba5.pt"
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        rerun = _trainer(folder, autoresume=True)
    assert rerun.timestamp.batch == 5
    rerun.fit()
    assert _same_state(rerun, uninterrupted)


def test_autoresume_in_an_empty_folder_starts_fresh(tmp_path: Path) -> None:
    fresh = _trainer(tmp_path / "new", autoresume=True)
    assert fresh.timestamp.batch == 0
    fresh.fit()
    plain = _trainer(tmp_path / "plain")
    plain.fit()
    assert _same_state(fresh, plain)


def test_a_weights_only_checkpoint_starts_a_new_run_with_another_optimizer_and_algorithms(tmp_path: Path) -> None:
    source = _trainer(tmp_path, max_duration="3ba", save_weights_only=True)
    source.fit()
    path = tmp_path / "ep0-ba3.pt"
    assert set(torch.load(path, weights_only=True)) >= {"params", "buffers"}
    assert "opt" not in torch.load(path, weights_only=True)
    with pytest.raises(ValueError, match="holds weights only .* pass load_weights_only=True"):
        _trainer(load_path=path)
    tuned = _trainer(load_path=path, load_weights_only=True, optimizer=optim.adamw(1e-3), algorithms=[MixUp()])
    assert tuned.timestamp.batch == 0 and tuned.state.step == 0
    assert all(torch.equal(tuned.state.params[n], p) for n, p in source.state.params.items())


def test_weights_load_into_another_head_when_its_names_are_ignored(tmp_path: Path) -> None:
    _trainer(tmp_path, max_duration="2ba").fit()
    path = tmp_path / "latest.pt"
    saved = torch.load(path, weights_only=True)["params"]
    three_classes = MLP(6, 3, hidden=(8,))
    with pytest.raises(ValueError, match="latest.pt': its parameter '3.weight' has shape \\(2, 8\\); the model expects \\(3, 8\\)"):
        _trainer(model=three_classes, load_path=path, load_weights_only=True)
    tuned = _trainer(model=three_classes, load_path=path, load_weights_only=True, load_ignore_keys=["3.*"])
    assert torch.equal(tuned.state.params["1.weight"], saved["1.weight"])
    assert tuned.state.params["3.weight"].shape == (3, 8)
    wider = MLP(6, 2, hidden=(8, 8))
    with pytest.raises(ValueError, match=r"latest.pt': its parameters do not match the model's: 2 of the model's are not in it \(5.bias, 5.weight\), and 0 of its"):
        _trainer(model=wider, load_path=path, load_weights_only=True, load_ignore_keys=["3.*"])
    loose = _trainer(
        model=wider, load_path=path, load_weights_only=True, load_strict_model_weights=False, load_ignore_keys=["3.*"]
    )
    assert torch.equal(loose.state.params["1.weight"], saved["1.weight"])
    assert loose.state.params["5.weight"].shape == (2, 8)


def test_resuming_with_another_run_length_says_the_schedule_changed(tmp_path: Path) -> None:
    _trainer(tmp_path, max_duration="4ba").fit()
    with pytest.warns(UserWarning, match=r"a run of 4ba; this run has max_duration=1ep \(8ba\): the schedule's length"):
        _trainer(load_path=tmp_path / "latest.pt", max_duration="1ep")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        # The same length in other units is the same schedule.
        _trainer(tmp_path / "epochs", max_duration="1ep").fit()
        _trainer(load_path=tmp_path / "epochs" / "ep0-ba4.pt", max_duration="8ba")


@pytest.mark.parametrize(
    ("options", "error", "message"),
    [
        ({"save_num_checkpoints_to_keep": 0}, ValueError, "save_num_checkpoints_to_keep=0 must be an int >= 1, or -1"),
        ({"save_weights_only": "yes"}, TypeError, "save_weights_only='yes' must be True or False"),
        ({"load_ignore_keys": "head"}, TypeError, "load_ignore_keys='head': expected a list of name patterns"),
        ({"autoresume": True, "save_folder": None}, ValueError, "autoresume=True needs a save_folder"),
        ({"autoresume": True, "save_weights_only": True}, ValueError, "save_weights_only=True saves weights only"),
    ],
)
def test_bad_checkpoint_options_are_refused_naming_them(tmp_path: Path, options, error, message) -> None:
    with pytest.raises(error, match=message):
        _trainer(options.pop("save_folder", tmp_path), **options)


def test_weights_saved_channels_last_load_in_the_layout_of_the_run_that_loads_them(tmp_path: Path) -> None:
    # A contiguous run's optimizer state is laid out like its contiguous parameters; weights saved by a
    # ChannelsLast run must join it in that layout, with their values, and train as the same weights would.
    from composer_fn.algorithms import ChannelsLast
    from composer_fn.models import SmallCNN
    from composer_fn.trainer.checkpoint import load_weights

    torch.manual_seed(0)
    images = torch.rand(8, 3, 8, 8)
    batches = [(images, torch.arange(8) % 4)]
    source = Trainer(SmallCNN(3, 4, width=8), batches, max_duration="1ba", algorithms=[ChannelsLast()],
                     optimizer=optim.sgd(0.1, momentum=0.9), progress_bar=False)  # fmt: skip
    source.fit()
    path = source.save_checkpoint(tmp_path / "weights.pt")
    target = Trainer(SmallCNN(3, 4, width=8), batches, max_duration="1ba", optimizer=optim.sgd(0.1, momentum=0.9),
                     progress_bar=False)  # fmt: skip
    loaded = load_weights(path, target.state)
    for name, tensor in loaded.params.items():
        assert torch.equal(tensor, source.state.params[name])
        assert tensor.stride() == target.state.params[name].stride()


def _sharded_folder(folder: Path, complete: bool = True, index: bool = True) -> Path:
    # A sharded checkpoint's folder as DCP and the trainer leave it: shards, DCP's index, the run's facts.
    folder.mkdir(parents=True)
    (folder / "__0_0.distcp").write_bytes(b"shard")
    if index:
        (folder / ".metadata").write_bytes(b"index")
    if complete:
        (folder / INFO).write_text("{}")
    return folder


def test_the_newest_complete_checkpoint_is_a_file_or_a_sharded_folder_and_stale_ones_go(tmp_path: Path) -> None:
    (tmp_path / "ep0-ba2.pt").write_bytes(b"file")
    sharded = _sharded_folder(tmp_path / "ep0-ba4")
    _sharded_folder(tmp_path / "ep0-ba6", complete=False)  # its facts not written: not a checkpoint
    _sharded_folder(tmp_path / "ep0-ba7", index=False)  # DCP's index not written
    stale = _sharded_folder(tmp_path / ".ep1-ba8.tmp")  # a save killed before its rename
    assert newest_checkpoint(tmp_path) == sharded
    assert remove_stale_temporaries(tmp_path) == [stale] and not stale.exists()
    assert prune_checkpoints(tmp_path, 1) == [tmp_path / "ep0-ba2.pt"] and sharded.is_dir()
    newer = _sharded_folder(tmp_path / "ep1-ba9")
    assert prune_checkpoints(tmp_path, 1) == [sharded] and not sharded.exists() and newest_checkpoint(tmp_path) == newer
