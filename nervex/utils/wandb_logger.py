"""Weights & Biases beside TensorBoard: the run's scalars, its resolved config and its evaluation videos.

The ``logger.wandb`` section of a config turns it on (``mode: online | offline | disabled``). Nothing here imports
``wandb`` unless that section asks for it, so the package stays an optional extra (``pip install nervex[wandb]``).

One W&B run belongs to one run directory: its id is kept in ``<run_dir>/wandb_id.txt``, so a run resumed from its
checkpoints (``learner.hook.load_ckpt``) and ``nervex -m eval --video`` on one of its checkpoints continue the same
W&B run. Scalars keep their TensorBoard names and their x-axis, the env step: every ``log`` carries ``env_step`` and
every metric is plotted against it (``define_metric('*', step_metric='env_step')``) rather than against W&B's own
``step``, which must grow with every call: figures of one env step arrive in several calls (the evaluation, the
learner's hook, the loop's scalars), and a resumed run starts again from its checkpoint's env step, which may lie
before the last one W&B saw.

A W&B failure never stops training: it is logged once as a warning and W&B is off for the rest of the run, while
TensorBoard, ``eval.csv`` and the checkpoints go on.
"""

from __future__ import annotations

import logging
import os
import secrets
import string
from typing import Any, Dict, List, Mapping, Optional, Tuple

from nervex.config import ConfigError, Field, to_plain

WANDB_MODES = ("online", "offline", "disabled")
LOGGER_CONFIG: Dict[str, Any] = dict(
    wandb=dict(
        project=Field(None, kind="str"),  # W&B project; None: W&B's default ('uncategorized')
        entity=Field(None, kind="str"),  # team or user; None: the logged-in user's default entity
        mode=Field("disabled", choices=WANDB_MODES),
        tags=[],
        group=Field(None, kind="str"),
        name=Field(None, kind="str"),  # None: the run directory's name
        dir=Field(None, kind="str"),  # where W&B's files go (a wandb/ folder in it); None: the run directory
        resume=True,  # a run started from learner.hook.load_ckpt continues the W&B run of the checkpoint's run
    )
)
"""The top-level ``logger`` section's defaults (``nervex.entry.config_parts`` validates it)."""

ID_FILE = "wandb_id.txt"
INIT_TIMEOUT_S = 60.0  # an online start that cannot reach the server gives up after this long (and W&B goes off)
FINISH_TIMEOUT_S = 60.0  # an online run's last upload is waited for this long at close
MAX_TAG_LEN = 64  # W&B refuses longer tags
INSTALL_HINT = "pip install nervex[wandb]"
_ID_CHARS = string.ascii_lowercase + string.digits


def check_logger_config(out: Dict[str, Any], where: str) -> None:
    """A ``ConfigParts`` check of ``logger.wandb.tags``: strings of 1 to 64 characters."""
    tags = out["logger"]["wandb"]["tags"]
    for i, tag in enumerate(tags):
        if not isinstance(tag, str) or not 0 < len(tag) <= MAX_TAG_LEN:
            raise ConfigError(
                f"key 'logger.wandb.tags[{i}]'{where} must be a string of 1 to {MAX_TAG_LEN} characters, got {tag!r}"
            )


def wandb_settings(cfg: Optional[Mapping[str, Any]]) -> Optional[Dict[str, Any]]:
    """The ``logger.wandb`` section of a compiled config when it turns W&B on, else None (nothing imported)."""
    section = ((cfg or {}).get("logger") or {}).get("wandb") or {}
    mode = section.get("mode", "disabled")
    return None if mode == "disabled" else dict(to_plain(section))


def import_wandb(mode: str) -> Any:
    """``import wandb``, or an ImportError that says which key asked for it and how to install it.

    Raises:
        ImportError: the package is not installed (or fails to import).
    """
    try:
        import wandb
    except ImportError as error:
        raise ImportError(
            f"logger.wandb.mode is '{mode}' but the wandb package cannot be imported ({error}); install it with "
            f"`{INSTALL_HINT}`, or set logger.wandb.mode: disabled"
        ) from error
    return wandb


def run_id(run_dir: str, create: bool = True) -> Optional[str]:
    """The W&B run id of a run directory (``wandb_id.txt``), made and stored on first use when ``create``."""
    path = os.path.join(run_dir, ID_FILE)
    if os.path.exists(path):
        with open(path, encoding="utf-8") as f:
            stored = f.read().strip()
        if stored:
            return stored
    if not create:
        return None
    return _store_id(run_dir, "".join(secrets.choice(_ID_CHARS) for _ in range(12)))


def _store_id(run_dir: str, value: str) -> str:
    os.makedirs(run_dir, exist_ok=True)
    with open(os.path.join(run_dir, ID_FILE), "w", encoding="utf-8") as f:
        f.write(value + "\n")
    return value


def choose_run_id(settings: Mapping[str, Any], run_dir: str, config: Mapping[str, Any]) -> Tuple[str, bool]:
    """The W&B run a training run logs to, stored in ``run_dir/wandb_id.txt``: the one stored there already (a
    restart in the same run directory); else, with ``logger.wandb.resume``, the one of the run directory that
    ``learner.hook.load_ckpt`` loads from (the training goes on from its counters); else a new one.

    Returns:
        ``(id, continued)``: ``continued`` is False for a new W&B run.
    """
    own = run_id(run_dir, create=False)
    if own is not None:
        return own, True
    checkpoint = ((config.get("learner") or {}).get("hook") or {}).get("load_ckpt")
    if checkpoint and settings.get("resume", True):
        inherited = run_id(os.path.dirname(os.path.dirname(os.path.abspath(checkpoint))), create=False)
        if inherited is not None:
            return _store_id(run_dir, inherited), True
    return run_id(run_dir), False


class WandbRun:
    """The W&B run of one run directory: started on first use, finished by ``close``; a failure turns it off.

    Args:
        settings: The ``logger.wandb`` section (mode online or offline; see ``wandb_settings``).
        run_dir: The run directory: the W&B run's default name and ``dir``, and where its id is kept.
        config: The resolved config, logged as the W&B run's config.
        logger: Where the one warning about a W&B failure goes.
        job_type: W&B's ``job_type`` of a run this creates (``train``, ``eval``).
        keep_id: Log to the run ``choose_run_id`` picks (kept in ``run_dir/wandb_id.txt``); False: a new run of its
            own, whose id is not stored.

    Raises:
        ImportError: the wandb package is missing (checked here, so a trainer fails when it is built).
    """

    _open_runs = 0  # runs of this module not yet finished in this process (see ``_teardown``)

    def __init__(
        self,
        settings: Mapping[str, Any],
        run_dir: str,
        config: Optional[Mapping[str, Any]] = None,
        logger: Optional[logging.Logger] = None,
        job_type: str = "train",
        keep_id: bool = True,
    ) -> None:
        self.settings = dict(settings)
        self._wandb = import_wandb(self.settings["mode"])
        self.run_dir = run_dir
        self._config = to_plain(dict(config or {}))
        self._logger = logger or logging.getLogger(__name__)
        self._job_type = job_type
        self._keep_id = keep_id
        self._run: Any = None
        self._closed = False
        self.failed = False

    def _start(self) -> Any:
        if self._closed:
            return None
        if self._run is None and not self.failed:
            try:
                self._run = self._init()
                WandbRun._open_runs += 1
                self._run.define_metric("env_step")
                self._run.define_metric("*", step_metric="env_step")
            except Exception as error:  # a W&B start that fails (no network, no API key) must not stop training
                self._fail("start", error)
        return None if self.failed else self._run

    def _init(self) -> Any:
        wandb, s = self._wandb, self.settings
        directory = os.path.abspath(s.get("dir") or self.run_dir)
        os.makedirs(directory, exist_ok=True)
        offline = s["mode"] == "offline"
        run_settings = wandb.Settings(
            silent=True,
            console="off",  # log.txt keeps the run's text; W&B would wrap stdout/stderr
            init_timeout=INIT_TIMEOUT_S,
            finish_timeout=FINISH_TIMEOUT_S,
            x_disable_stats=offline,  # system metrics may probe cloud metadata endpoints: nothing of the network
        )
        kwargs: Dict[str, Any] = dict(
            project=s.get("project"),
            entity=s.get("entity"),
            mode=s["mode"],
            tags=list(s.get("tags") or []),
            group=s.get("group"),
            name=s.get("name") or os.path.basename(os.path.abspath(self.run_dir)),
            dir=directory,
            config=self._config or None,
            reinit="create_new",  # a user's own W&B run in the process is neither finished nor written to
            settings=run_settings,
        )
        continued = False
        if self._keep_id:
            kwargs["id"], continued = choose_run_id(s, self.run_dir, self._config)
            kwargs["resume"] = "allow"
        if not continued:  # a continued run keeps the job type it was started with
            kwargs["job_type"] = self._job_type
        return wandb.init(**kwargs)

    def _fail(self, what: str, error: BaseException) -> None:
        if not self.failed:
            self.failed = True
            self._logger.warning(
                "W&B %s failed (%s: %s); W&B logging is off for the rest of this run, TensorBoard goes on",
                what,
                type(error).__name__,
                error,
            )

    def log(self, scalars: Mapping[str, float], env_step: int) -> None:
        """Log ``scalars`` (TensorBoard's names) at x = ``env_step``."""
        run = self._start()
        if run is None or not scalars:
            return
        try:
            run.log({**scalars, "env_step": int(env_step)})
        except Exception as error:
            self._fail("log", error)

    def log_videos(self, paths: List[str], key: str, caption: str, env_step: Optional[int] = None) -> int:
        """Log each mp4 of ``paths`` as a ``wandb.Video`` under ``key`` (captioned ``<caption>: <file name>``);
        returns how many were logged."""
        run = self._start()
        logged = 0
        for path in paths if run is not None else []:
            try:
                video = self._wandb.Video(path, caption=f"{caption}: {os.path.basename(path)}", format="mp4")
                row: Dict[str, Any] = {key: video}
                if env_step is not None:
                    row["env_step"] = int(env_step)
                run.log(row)
                logged += 1
            except Exception as error:
                self._fail(f"video upload of {path}", error)
                break
        return logged

    def close(self) -> None:
        """Finish the W&B run (an online run's last upload is waited for at most ``FINISH_TIMEOUT_S``)."""
        run, self._run = self._run, None
        self._closed = True
        if run is None:
            return
        WandbRun._open_runs -= 1
        try:
            run.finish(exit_code=1 if self.failed else 0)
        except Exception as error:
            self._fail("finish", error)
        self._teardown()

    def _teardown(self) -> None:
        """Stop W&B's service process once no run is left, so an offline run's file is whole when ``close``
        returns (``finish`` alone returns before wandb-core has written it); kept while any other run is open."""
        if WandbRun._open_runs == 0 and self._wandb.run is None:
            try:
                self._wandb.teardown()
            except Exception as error:
                self._logger.warning("W&B teardown failed: %s", error)


def log_eval_videos(
    cfg: Mapping[str, Any],
    video_paths: List[str],
    checkpoint: str,
    env_step: Optional[int] = None,
    logger: Optional[logging.Logger] = None,
) -> int:
    """Log the videos ``nervex -m eval --video`` recorded to W&B, as ``eval/video`` (no-op when W&B is disabled).

    They go to the W&B run of the checkpoint's run directory when it has one (``wandb_id.txt``: next to the training
    curves), else to a new run with ``job_type='eval'``.

    Args:
        cfg: The compiled config (its ``logger.wandb`` section decides).
        video_paths: The mp4 files.
        checkpoint: The evaluated checkpoint (``runs/<name>/ckpt/x.pt``): its run directory, and each video's caption.
        env_step: The checkpoint's env step, the videos' x (default: none given).
        logger: Where a W&B failure's warning goes.

    Returns:
        How many videos were logged.

    Raises:
        ImportError: W&B is enabled but the wandb package is missing.
    """
    settings = wandb_settings(cfg)
    if settings is None or not video_paths:
        return 0
    run_dir = os.path.dirname(os.path.dirname(os.path.abspath(checkpoint)))
    if not os.path.isfile(os.path.join(run_dir, "config.yaml")):  # a checkpoint kept outside its run directory
        run_dir = os.path.dirname(os.path.abspath(video_paths[0]))
    has_run = run_id(run_dir, create=False) is not None
    if not has_run and not settings.get("name"):
        settings["name"] = f"eval-{os.path.basename(run_dir)}"
    # the training run keeps its own config; a run of its own gets the evaluation's
    config = None if has_run else cfg
    run = WandbRun(settings, run_dir, config=config, logger=logger, job_type="eval", keep_id=has_run)
    try:
        return run.log_videos(list(video_paths), "eval/video", os.path.basename(checkpoint), env_step)
    finally:
        run.close()


__all__ = [
    "LOGGER_CONFIG",
    "WANDB_MODES",
    "WandbRun",
    "check_logger_config",
    "choose_run_id",
    "import_wandb",
    "log_eval_videos",
    "run_id",
    "wandb_settings",
]
