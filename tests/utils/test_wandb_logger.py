"""W&B beside TensorBoard (``logger.wandb``): offline runs are read back from their ``run-<id>.wandb`` file.

Offline mode needs no network: every test sets ``WANDB_MODE=offline`` and carries a timeout, so an attempt to reach
a server shows up as a failure instead of a hang.
"""

from __future__ import annotations

import builtins
import copy
import csv
import glob
import importlib.util
import json
import os
import struct
import sys
import time
from typing import Any, Dict, List

import numpy as np
import pytest
import yaml

from nervex.config import ConfigError
from nervex.entry import SerialTrainer, compile_config, compile_parallel_config
from nervex.utils.log_helper import ScalarWriter
from nervex.utils.wandb_logger import ID_FILE, choose_run_id, log_eval_videos

pytestmark = pytest.mark.timeout(180)
needs_wandb = pytest.mark.skipif(importlib.util.find_spec("wandb") is None, reason="the [wandb] extra is not installed")

BASE = {
    "seed": 0,
    "env": {"env_type": "cartpole", "manager_type": "base", "collector_env_num": 2, "evaluator_env_num": 2},
    "policy": {
        "policy_type": "dqn",
        "model": {"hidden_sizes": [16]},
        "nstep": 1,
        "learn": {"batch_size": 16, "learning_starts": 32, "target_update_freq": 10, "update_per_collect": 2},
        "collect": {"n_sample": 16},
    },
    "replay_buffer": {"maxlen": 1000},
    "learner": {"hook": {"log_show_after_iter": 5}},
    "evaluator": {"n_episode": 2, "eval_freq": 100, "stop_val": 10000},
    "max_env_step": 320,
}


def with_wandb(tmp_path: Any, **wandb: Any) -> Dict[str, Any]:
    cfg = copy.deepcopy(BASE)
    cfg["logger"] = {"wandb": dict({"mode": "offline", "project": "nervex-test", "tags": ["ci"]}, **wandb)}
    return cfg


@pytest.fixture(autouse=True)
def offline_env(monkeypatch: Any, tmp_path: Any) -> None:
    """No network, no user settings: W&B's own files of this test go to tmp_path."""
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    monkeypatch.setenv("WANDB_CONFIG_DIR", str(tmp_path / "wandb_config"))
    monkeypatch.setenv("WANDB_CACHE_DIR", str(tmp_path / "wandb_cache"))
    monkeypatch.delenv("WANDB_API_KEY", raising=False)


# ---- reading an offline run ------------------------------------------------------------------------------------------
def wandb_records(path: str) -> List[Any]:
    """The protobuf records of a ``run-<id>.wandb`` file (W&B's LevelDB-style log: 7-byte header, 32 KiB blocks of
    records ``crc32 | length u16 | type u8 | data``, a record split across blocks as FIRST/MIDDLE/LAST)."""
    from wandb.proto import wandb_internal_pb2

    with open(path, "rb") as f:
        data = f.read()
    assert data[:4] == b":W&B", f"{path} is not a W&B run file"
    block, pos, pending, records = 32768, 7, b"", []
    while pos + 7 <= len(data):
        if block - pos % block < 7:  # a block's tail too short for a header is padding
            pos += block - pos % block
            continue
        _, length, kind = struct.unpack("<IHB", data[pos : pos + 7])
        payload, pos = data[pos + 7 : pos + 7 + length], pos + 7 + length
        if kind in (1, 2):  # FULL, FIRST
            pending = payload
        elif kind in (3, 4):  # MIDDLE, LAST
            pending += payload
        if kind in (1, 4):
            record = wandb_internal_pb2.Record()
            record.ParseFromString(pending)
            records.append(record)
    return records


def offline_runs(directory: str) -> List[str]:
    return sorted(glob.glob(os.path.join(directory, "wandb", "offline-run-*")))


def read_run(run_path: str) -> Dict[str, Any]:
    """History rows, config and run settings of one offline run directory."""
    (path,) = glob.glob(os.path.join(run_path, "run-*.wandb"))
    history: List[Dict[str, Any]] = []
    config: Dict[str, Any] = {}
    run: Dict[str, Any] = {}
    for record in wandb_records(path):
        kind = record.WhichOneof("record_type")
        if kind == "history":
            history.append(
                {item.key or "/".join(item.nested_key): json.loads(item.value_json) for item in record.history.item}
            )
        elif kind == "run":
            run = {"id": record.run.run_id, "project": record.run.project, "tags": list(record.run.tags)}
            run.update(name=record.run.display_name, group=record.run.run_group, job_type=record.run.job_type)
            config.update({i.key: json.loads(i.value_json) for i in record.run.config.update})
        elif kind == "config":
            config.update({i.key: json.loads(i.value_json) for i in record.config.update})
        elif kind == "metric":
            run.setdefault("metrics", {})[record.metric.name or record.metric.glob_name] = record.metric.step_metric
    return {"history": history, "config": config, "run": run}


def last_values(history: List[Dict[str, Any]]) -> Dict[str, Any]:
    out: Dict[str, Any] = {}
    for row in history:
        out.update(row)
    return out


# ---- the serial trainer ------------------------------------------------------------------------------------------------
@needs_wandb
def test_serial_run_logs_the_tensorboard_scalars_against_env_steps_offline(tmp_path):
    start = time.monotonic()
    with SerialTrainer(with_wandb(tmp_path), exp_name="wb", run_root=str(tmp_path)) as trainer:
        trainer.run(progress=False)
        assert trainer.scalar_writer.wandb is not None and not trainer.scalar_writer.wandb.failed
        tensorboard = dict(trainer.scalar_writer.latest)
    assert time.monotonic() - start < 120
    run_dir = tmp_path / "wb"
    (run_path,) = offline_runs(str(run_dir))  # dir defaults to the run directory
    run = read_run(run_path)
    assert run["run"]["id"] == (run_dir / ID_FILE).read_text().strip()
    assert run["run"]["name"] == "wb" and run["run"]["project"] == "nervex-test" and run["run"]["tags"] == ["ci"]
    assert run["run"]["metrics"] == {"env_step": "", "*": "env_step"}  # every key plotted against env_step
    with open(os.path.join(run_path, "logs", "debug-internal.log"), encoding="utf-8") as f:
        core_log = f.read()
    assert "http" not in core_log.lower() and "dial tcp" not in core_log  # offline: no request was even tried

    keys = set().union(*run["history"])
    assert {"eval/mean_reward", "train/loss", "rollout/ep_rew_mean", "time/fps", "env_step"} <= keys
    assert keys - {"env_step", "_step", "_runtime", "_timestamp"} == set(tensorboard)  # TensorBoard's names, all
    steps = [row["env_step"] for row in run["history"]]
    assert steps == sorted(steps) and steps[-1] == 320  # the env step, not W&B's call counter

    with open(run_dir / "eval.csv", encoding="utf-8") as f:
        evals = list(csv.DictReader(f))
    eval_rows = [row for row in run["history"] if "eval/mean_reward" in row]
    assert [row["env_step"] for row in eval_rows] == [int(row["env_step"]) for row in evals]
    assert last_values(run["history"])["eval/mean_reward"] == pytest.approx(float(evals[-1]["mean_reward"]))
    assert last_values(run["history"])["train/loss"] == pytest.approx(tensorboard["train/loss"])

    resolved = yaml.safe_load((run_dir / "config.yaml").read_text())
    assert run["config"]["policy"] == resolved["policy"]  # the resolved config, defaults filled in
    assert run["config"]["logger"]["wandb"]["mode"] == "offline"
    assert run["config"]["replay_buffer"]["maxlen"] == 1000


@needs_wandb
def test_a_resumed_run_continues_the_same_wandb_run(tmp_path):
    cfg = with_wandb(tmp_path)
    with SerialTrainer(cfg, exp_name="first", run_root=str(tmp_path)) as trainer:
        trainer.run(progress=False)
    first_id = (tmp_path / "first" / ID_FILE).read_text().strip()
    cfg["max_env_step"] = 480
    cfg["learner"]["hook"]["load_ckpt"] = str(tmp_path / "first" / "ckpt" / "final.pt")
    with SerialTrainer(cfg, exp_name="second", run_root=str(tmp_path)) as trainer:
        assert trainer.env_step == 320
        trainer.run(progress=False)
    assert (tmp_path / "second" / ID_FILE).read_text().strip() == first_id
    (first,) = [read_run(path) for path in offline_runs(str(tmp_path / "first"))]
    (second,) = [read_run(path) for path in offline_runs(str(tmp_path / "second"))]
    assert first["run"]["job_type"] == "train" and second["run"]["job_type"] == ""  # continued, as it was started
    assert second["run"]["id"] == first_id  # `wandb sync` of both folders makes one W&B run
    assert second["history"][0]["env_step"] > 320 and second["history"][-1]["env_step"] == 480


def test_which_wandb_run_a_training_run_logs_to(tmp_path):
    on = {"mode": "offline", "resume": True}
    (tmp_path / "old").mkdir()
    (tmp_path / "old" / ID_FILE).write_text("oldrun000001\n")
    from_old = {"learner": {"hook": {"load_ckpt": str(tmp_path / "old" / "ckpt" / "final.pt")}}}
    assert choose_run_id(on, str(tmp_path / "new"), from_old) == ("oldrun000001", True)
    assert (tmp_path / "new" / ID_FILE).read_text() == "oldrun000001\n"  # kept: a restart of 'new' continues it
    fresh, continued = choose_run_id(dict(on, resume=False), str(tmp_path / "other"), from_old)
    assert not continued and fresh != "oldrun000001" and len(fresh) == 12 and fresh.isalnum()
    assert choose_run_id(on, str(tmp_path / "other"), from_old) == (fresh, True)  # its own id comes first
    assert choose_run_id(on, str(tmp_path / "plain"), {"learner": {"hook": {"load_ckpt": ""}}})[1] is False


def test_disabled_wandb_imports_nothing(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "wandb", None)  # `import wandb` would raise
    cfg = with_wandb(tmp_path, mode="disabled")
    with SerialTrainer(cfg, exp_name="off", run_root=str(tmp_path)) as trainer:
        trainer.train()
        assert trainer.scalar_writer.wandb is None
    assert not (tmp_path / "off" / "wandb").exists() and not (tmp_path / "off" / ID_FILE).exists()
    assert compile_config(BASE).logger.wandb.mode == "disabled"  # the default


def test_missing_package_is_a_clear_import_error_when_the_trainer_is_built(tmp_path, monkeypatch):
    real_import = builtins.__import__

    def no_wandb(name: str, *args: Any, **kwargs: Any) -> Any:
        if name == "wandb" or name.startswith("wandb."):
            raise ImportError("No module named 'wandb'")
        return real_import(name, *args, **kwargs)

    monkeypatch.delitem(sys.modules, "wandb", raising=False)
    monkeypatch.setattr(builtins, "__import__", no_wandb)
    cfg = compile_config(with_wandb(tmp_path))  # the config itself is valid without the package
    with pytest.raises(ImportError) as info:
        SerialTrainer(cfg, exp_name="missing", run_root=str(tmp_path))
    message = str(info.value)
    assert "logger.wandb.mode is 'offline'" in message and "pip install nervex[wandb]" in message


@pytest.mark.parametrize(
    "wandb, message",
    [
        ({"projet": "x"}, "unknown key 'logger.wandb.projet'; did you mean 'logger.wandb.project'?"),
        ({"mode": "onlin"}, "key 'logger.wandb.mode' must be one of 'online', 'offline', 'disabled', got 'onlin'"),
        ({"tags": ["ok", 3]}, "key 'logger.wandb.tags[1]' must be a string of 1 to 64 characters, got 3"),
        ({"tags": "ci"}, "key 'logger.wandb.tags' expects a list, got str 'ci'"),
        ({"project": 7}, "key 'logger.wandb.project' expects a string, got int 7"),
    ],
)
def test_logger_section_errors_name_the_key(tmp_path, wandb, message):
    cfg = with_wandb(tmp_path, **wandb)
    for compile_fn in (compile_config, compile_parallel_config):
        with pytest.raises(ConfigError) as info:
            compile_fn(cfg)
        assert str(info.value) == message


def test_unknown_logger_key_suggests_wandb():
    cfg = dict(copy.deepcopy(BASE), logger={"wandbb": {}})
    with pytest.raises(ConfigError, match=r"unknown key 'logger.wandbb'; did you mean 'logger.wandb'\?"):
        compile_config(cfg)


# ---- the scalar writer (the parallel learner's, on rank 0) ---------------------------------------------------------
@needs_wandb
def test_scalar_writer_logs_every_call_at_its_env_step(tmp_path):
    cfg = compile_parallel_config(with_wandb(tmp_path, name="learner-run", group="g", dir=str(tmp_path / "wbdir")))
    writer = ScalarWriter(str(tmp_path / "run"), cfg)
    writer.add_scalars({"eval/mean_reward": 10.0, "eval/n_episode": 2}, 100)
    writer.add_scalars({"train/loss": 0.5, "flag": True, "note": "text"}, 100)  # same env step, another call
    writer.add_scalars({"train/loss": 0.25}, 90)  # an earlier env step (a resumed run) is not dropped
    writer.close()
    writer.close()
    (run_path,) = offline_runs(str(tmp_path / "wbdir"))
    run = read_run(run_path)
    rows = [{k: v for k, v in row.items() if not k.startswith("_")} for row in run["history"]]
    assert rows == [
        {"eval/mean_reward": 10.0, "eval/n_episode": 2.0, "env_step": 100},
        {"train/loss": 0.5, "env_step": 100},
        {"train/loss": 0.25, "env_step": 90},
    ]
    assert run["run"]["name"] == "learner-run" and run["run"]["group"] == "g" and run["run"]["job_type"] == "train"
    assert run["config"]["system"]["coordinator"] == dict(cfg.system.coordinator)


@needs_wandb
def test_the_parallel_learner_logs_through_wandb(tmp_path):
    import logging
    import secrets

    from nervex.system.coordinator import Coordinator
    from nervex.system.learner import LearnerRole

    token = secrets.token_bytes(32)
    cfg = dict(with_wandb(tmp_path), system={"coordinator": {"tick_s": 3600.0, "min_free_bytes": 0}})
    cfg["evaluator"]["eval_freq"] = 10**9
    raw = compile_parallel_config(cfg)
    run_dir = tmp_path / "parallel"
    coordinator = Coordinator(raw, str(run_dir), token=token, logger=logging.getLogger("test_wandb.coordinator"))
    coordinator.start()
    learner = None
    try:
        learner = LearnerRole(raw, str(run_dir), "learner0", url=coordinator.url, token=token)
        assert learner.scalar_writer.wandb is not None
        learner.loop.evaluate()  # eval/* at env step 0, as a due evaluation writes them
    finally:
        if learner is not None:
            learner.close()  # its last scalars (time/*, data/*), then the W&B run is finished
        coordinator.stop()
    (run_path,) = offline_runs(str(run_dir))
    run = read_run(run_path)
    keys = set().union(*run["history"])
    assert {"eval/mean_reward", "data/results", "time/fps", "train/train_iter"} <= keys
    assert run["run"]["name"] == "parallel" and run["run"]["id"] == (run_dir / ID_FILE).read_text().strip()
    assert run["config"]["system"]["coordinator"]["tick_s"] == 3600.0


def test_scalar_writer_without_run_dir_never_starts_wandb(tmp_path):
    writer = ScalarWriter(None, compile_config(with_wandb(tmp_path)))  # a learner rank other than 0
    writer.add_scalars({"train/loss": 1.0}, 5)
    writer.close()
    assert writer.wandb is None and writer.latest == {"train/loss": 1.0}


@needs_wandb
def test_a_wandb_failure_warns_once_and_tensorboard_goes_on(tmp_path, caplog):
    import logging

    import wandb

    calls = []

    def broken_init(**kwargs: Any) -> Any:
        calls.append(kwargs)
        raise wandb.errors.CommError("network is unreachable")

    logger = logging.getLogger("test_wandb_failure")
    cfg = compile_config(with_wandb(tmp_path, mode="online"))
    writer = ScalarWriter(str(tmp_path / "run"), cfg, logger)
    original, wandb.init = wandb.init, broken_init
    try:
        with caplog.at_level(logging.WARNING, logger="test_wandb_failure"):
            for step in (10, 20, 30):
                writer.add_scalars({"train/loss": float(step)}, step)
    finally:
        wandb.init = original
    writer.close()
    assert len(calls) == 1 and calls[0]["mode"] == "online" and calls[0]["resume"] == "allow"
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and "W&B start failed (CommError: network is unreachable)" in warnings[0]
    assert writer.latest == {"train/loss": 30.0} and glob.glob(str(tmp_path / "run" / "events.out.tfevents.*"))


# ---- evaluation videos -------------------------------------------------------------------------------------------------
def write_mp4(path: str, frames: int = 6) -> str:
    import imageio

    with imageio.get_writer(path, fps=10, macro_block_size=1) as writer:
        for i in range(frames):
            writer.append_data(np.full((32, 32, 3), 40 * i, dtype=np.uint8))
    return path


@needs_wandb
def test_eval_videos_land_in_the_training_runs_wandb_run(tmp_path):
    cfg = compile_config(with_wandb(tmp_path))
    run_dir = tmp_path / "trained"
    (run_dir / "ckpt").mkdir(parents=True)
    (run_dir / "config.yaml").write_text("{}")
    (run_dir / ID_FILE).write_text("abcdef123456\n")
    videos = [write_mp4(str(tmp_path / f"episode_{i}.mp4"), frames=4 + i) for i in range(2)]
    assert log_eval_videos(cfg, videos, str(run_dir / "ckpt" / "best.pt"), env_step=320) == 2
    (run_path,) = offline_runs(str(run_dir))
    run = read_run(run_path)
    assert run["run"]["id"] == "abcdef123456" and run["run"]["job_type"] == ""  # the training run, unchanged
    rows = [row for row in run["history"] if "eval/video/_type" in row]  # a media value is stored as its fields
    assert [(row["eval/video/_type"], row["eval/video/caption"], row["env_step"]) for row in rows] == [
        ("video-file", "best.pt: episode_0.mp4", 320),
        ("video-file", "best.pt: episode_1.mp4", 320),
    ]
    for row, video in zip(rows, videos):
        with open(os.path.join(run_path, "files", row["eval/video/path"]), "rb") as stored, open(video, "rb") as f:
            assert stored.read() == f.read()


@needs_wandb
def test_eval_videos_of_a_run_without_wandb_get_an_eval_run(tmp_path):
    cfg = compile_config(with_wandb(tmp_path))
    run_dir = tmp_path / "plain"
    (run_dir / "ckpt").mkdir(parents=True)
    (run_dir / "config.yaml").write_text("{}")
    video = write_mp4(str(tmp_path / "episode.mp4"))
    assert log_eval_videos(cfg, [video], str(run_dir / "ckpt" / "final.pt")) == 1
    assert not (run_dir / ID_FILE).exists()  # a later resumed training must not continue the eval run
    (run_path,) = offline_runs(str(run_dir))
    run = read_run(run_path)["run"]
    assert run["job_type"] == "eval" and run["name"] == "eval-plain"
    disabled = compile_config(with_wandb(tmp_path, mode="disabled"))
    assert log_eval_videos(disabled, [video], str(run_dir / "ckpt" / "final.pt")) == 0
