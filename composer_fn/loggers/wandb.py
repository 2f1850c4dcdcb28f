"""Weights & Biases destination for the trainer's records (``pip install -e '.[wandb]'``).

``WandBLogger`` sends, on rank 0 only: the run's settings as the W&B run's config; each training, evaluation and
end-of-run record's numbers at its step, named as ``TensorBoardLogger`` names its scalars (``train/loss``,
``eval/eval/accuracy``, ``fit/wall_time``), so the history's rows are the JSON-lines log's; the plan of the run
(as ``composer-fn plan`` prints it, and where algorithms switched on and off) as the file ``plan.txt``; each
checkpoint as an artifact when ``log_artifacts``; and any file through ``upload_file``. ``wandb`` is imported
when a logger is made, never by ``import composer_fn``.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from composer_fn.core.extras import install_command
from composer_fn.loggers._paths import folder_path
from composer_fn.loggers._tracking import TrackerLogger, artifact_name

__all__ = ["WandBLogger"]

MODES = ("online", "offline", "disabled")
_PROJECT_REFUSED = "/\\#?%:"


class WandBLogger(TrackerLogger):
    """Sends records to a Weights & Biases run, opened as ``fit`` starts and finished as it ends (rank 0 only).

    A run resumed from a checkpoint continues the W&B run it was logging to (W&B's ``id`` with
    ``resume="allow"``) when this logger did that run's first ``fit`` or ``run_id_file`` names it: put the file
    beside the checkpoints (the command line uses ``<save_folder>/wandb-run-id``). W&B takes steps in order
    only: the steps a resumed run logs again (the run went on past its checkpoint before it stopped) keep the
    values the run first logged there.

    Misconfiguration is refused here, not as the run starts: ``mode="online"`` with no W&B credentials (the
    ``WANDB_API_KEY`` environment variable, ``wandb login``'s ``.netrc`` entry or settings file), a mode W&B does
    not have, a project name W&B refuses. ``mode="offline"`` writes the run under ``dir`` without credentials or
    network (``wandb sync <dir>/wandb/offline-run-*`` uploads it later); ``"disabled"`` sends nothing.

    Args:
        project: the W&B project (None: ``WANDB_PROJECT``, else W&B's default).
        name: the run's display name (None: one W&B makes up).
        entity: the team or user the project belongs to (None: the account's default).
        group: the group of runs this one belongs to (several processes' or trials' runs shown together).
        tags: labels of the run, each 1 to 64 characters.
        mode: ``'online'``, ``'offline'`` or ``'disabled'`` (None: ``WANDB_MODE``, else ``'online'``).
        dir: the folder W&B writes its files under, in ``<dir>/wandb`` (created if missing; None: ``WANDB_DIR``,
            else the working folder).
        run_id_file: the file that keeps the W&B run's id for a resumed run (its folder is created if missing):
            a fresh run writes its new run's id there, a resumed one continues the run it names. None: a resumed
            run continues only the run this logger logged to in this process, else starts a new one.
        log_artifacts: store each checkpoint the trainer writes as a W&B artifact (type ``checkpoint``, named
            after its file, e.g. ``ep1-ba16.pt``; each new checkpoint of a name is a new version).
    """

    _tracker = "W&B"

    def __init__(
        self,
        project: str | None = None,
        *,
        name: str | None = None,
        entity: str | None = None,
        group: str | None = None,
        tags: Sequence[str] = (),
        mode: str | None = None,
        dir: str | os.PathLike[str] | None = None,
        run_id_file: str | os.PathLike[str] | None = None,
        log_artifacts: bool = False,
    ) -> None:
        try:
            import wandb
        except ImportError as error:
            raise ImportError(f"WandBLogger needs the wandb package ({error}): {install_command('wandb')}") from None
        super().__init__(run_id_file, log_artifacts)
        self.project = _text("project", project, "'digits'")
        if self.project is not None and any(c in _PROJECT_REFUSED for c in self.project):
            raise ValueError(f"project={project!r}: W&B project names may not hold any of {_PROJECT_REFUSED!r}")
        self.name = _text("name", name, "'mixup-0.2'")
        self.entity = _text("entity", entity, "'my-team'")
        self.group = _text("group", group, "'sweep-1'")
        self.tags = _tags(tags)
        self.mode = _mode(mode)
        if dir is None and os.environ.get("WANDB_DIR"):
            dir = os.environ["WANDB_DIR"]
        self.dir = None if dir is None else folder_path("dir", dir, "runs/wandb")
        if self.main and self.mode == "online" and not _credentials(wandb):
            given = "mode='online'" if mode is not None else "mode=None (WANDB_MODE unset: 'online')"
            raise ValueError(
                f"{given} needs W&B credentials, and none are set: set WANDB_API_KEY (or run `wandb login`), or pass "
                "mode='offline' (written locally, uploaded later by `wandb sync`) or mode='disabled'"
            )
        self._wandb: Any = wandb
        self._run: Any = None

    def _init(self, run_id: str | None) -> Any:
        if self.dir is not None:
            self.dir.mkdir(parents=True, exist_ok=True)
        return self._wandb.init(
            project=self.project,
            entity=self.entity,
            name=self.name,
            group=self.group,
            tags=list(self.tags) or None,
            mode=self.mode,
            dir=None if self.dir is None else str(self.dir),
            id=run_id,
            resume="allow" if run_id is not None else None,
        )

    def _open(self, run_id: str | None) -> str:
        self._run = self._init(run_id)
        return str(self._run.id)

    def _metrics(self, step: int, metrics: dict[str, float], training: bool) -> None:
        if metrics:
            self._run.log(metrics, step=step)

    def _settings(self, settings: dict[str, Any]) -> None:
        # A resumed run may change a setting (its max_duration, say): the config shows the latest.
        self._run.config.update(settings, allow_val_change=True)

    def _text(self, name: str, text: str) -> None:
        if self.mode == "disabled":  # a disabled run has no folder
            return
        path = Path(self._run.dir) / name
        path.write_text(text, encoding="utf-8")
        self._run.save(str(path), base_path=str(path.parent), policy="now")

    def _file(self, path: Path, checkpoint: bool) -> None:
        if self.mode == "disabled":
            return
        artifact = self._wandb.Artifact(artifact_name(path), type="checkpoint" if checkpoint else "file")
        if path.is_dir():
            artifact.add_dir(str(path))
        else:
            artifact.add_file(str(path))
        self._run.log_artifact(artifact)

    def _file_after(self, run_id: str, path: Path) -> None:
        self._run = self._init(run_id)
        try:
            self._file(path, checkpoint=False)
        finally:
            self._close()

    def _close(self) -> None:
        run, self._run = self._run, None
        if run is not None:
            run.finish()


def _text(argument: str, value: object, example: str) -> str | None:
    if value is None:
        return None
    if not isinstance(value, str):
        raise TypeError(f"{argument}={value!r} must be a str (e.g. {example}) or None")
    if not value.strip():
        raise ValueError(f"{argument}={value!r} is empty: expected a name, e.g. {example}, or None")
    return value


def _tags(tags: object) -> tuple[str, ...]:
    if isinstance(tags, str) or not isinstance(tags, Sequence):
        raise TypeError(f"tags={tags!r} must be a sequence of str, e.g. ['baseline', 'mixup']")
    for tag in tags:
        if not isinstance(tag, str) or not 1 <= len(tag) <= 64:
            raise ValueError(f"tags={list(tags)!r}: the tag {tag!r} must be a str of 1 to 64 characters")
    return tuple(tags)


def _mode(mode: object) -> str:
    if mode is None:
        environment = os.environ.get("WANDB_MODE", "").strip()
        if not environment:
            return "online"
        if environment == "dryrun":  # W&B's old name of offline
            return "offline"
        if environment not in MODES:
            raise ValueError(
                f"mode=None, and the environment's WANDB_MODE={environment!r} is not a mode: expected one of "
                f"{', '.join(MODES)}"
            )
        return environment
    if not isinstance(mode, str) or mode not in MODES:
        raise ValueError(f"mode={mode!r} must be one of {', '.join(repr(m) for m in MODES)} or None (WANDB_MODE)")
    return mode


def _credentials(wandb: Any) -> bool:
    """Returns whether W&B has credentials to go online with, asking no one and no server; raises ValueError for
    credentials W&B refuses as they are written (a malformed ``WANDB_API_KEY``)."""
    try:
        return bool(wandb.login(prompt=False, verify=False))
    except TypeError:  # a wandb older than login's ``prompt``
        return bool(os.environ.get("WANDB_API_KEY") or getattr(getattr(wandb, "api", None), "api_key", None))
    except wandb.errors.Error as error:
        raise ValueError(f"mode='online': W&B refuses the credentials it found ({error}); fix WANDB_API_KEY or run `wandb login`") from None
