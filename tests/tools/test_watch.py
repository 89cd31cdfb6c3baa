"""``nervex -m eval --video``: recorded episodes decode with the episode's frame count; envs that cannot render and a
missing moviepy are one-line errors; ``--stochastic`` acts with the collect mode's setting at the checkpoint."""

from __future__ import annotations

import ctypes.util
import os
import sys
from typing import List

import gymnasium as gym
import numpy as np
import pytest
from gymnasium.envs.classic_control import CartPoleEnv as GymCartPole

from nervex.config import apply_overrides, read_config
from nervex.entry import SerialTrainer
from nervex.entry.builder import EVAL_SEED_OFFSET, compile_config
from nervex.entry.cli import main
from nervex.entry.serial_entry import serial_eval
from nervex.tools.watch import make_acting, watch
from nervex.torch_utils import load_checkpoint, save_checkpoint

iio = pytest.importorskip("imageio.v3")
pytest.importorskip("moviepy")
pytest.importorskip("imageio_ffmpeg")

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CARTPOLE_DQN = os.path.join(ROOT, "app_zoo/classic_control/cartpole/config/cartpole_dqn.yaml")
PONG_DQN = os.path.join(ROOT, "app_zoo/atari/config/pong_dqn.yaml")
PENDULUM_PPO = os.path.join(ROOT, "app_zoo/mujoco/config/inverted_pendulum_ppo.yaml")


class NoRgbCartPole(GymCartPole):
    """CartPole that declares only human rendering."""

    metadata = {"render_modes": ["human"], "render_fps": 50}


gym.register("NoRgbCartPole-v0", entry_point=NoRgbCartPole, max_episode_steps=500)


def untrained_checkpoint(path: str, run_root: str, name: str, overrides: List[str]) -> str:
    """``SerialTrainer.save_checkpoint()`` of an untrained run of a shipped config."""
    cfg = apply_overrides(read_config(path), overrides)
    with SerialTrainer(cfg, seed=0, exp_name=name, run_root=run_root) as trainer:
        return trainer.save_checkpoint()


def decode(path: str) -> np.ndarray:
    """Every frame of an mp4 file, ``(n, height, width, 3)``."""
    return iio.imread(path, plugin="FFMPEG")


@pytest.fixture(scope="module")
def cartpole_ckpt(tmp_path_factory: pytest.TempPathFactory) -> str:
    return untrained_checkpoint(CARTPOLE_DQN, str(tmp_path_factory.mktemp("runs")), "cp", ["env.evaluator_env_num=1"])


@pytest.fixture(autouse=True)
def offscreen(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SDL_VIDEODRIVER", "dummy")  # what watch sets on a machine without a display


def test_cartpole_videos_decode_with_the_reset_frame_and_one_frame_per_step(cartpole_ckpt, tmp_path, capsys):
    video_dir = tmp_path / "videos"
    assert main(["-m", "eval", "--ckpt", cartpole_ckpt, "--episodes", "2", "--video", str(video_dir)]) == 0
    out = capsys.readouterr().out
    names = [f"cp-iteration_0-episode-{k}.mp4" for k in range(2)]
    assert sorted(os.listdir(video_dir)) == names
    assert f"videos: 2 mp4 file(s) in {video_dir}" in out

    result = watch(cartpole_ckpt, episodes=2, video_dir=str(tmp_path / "again"))
    assert result["videos"] == [str(tmp_path / "again" / name) for name in names]
    for k, name in enumerate(names):
        length = result["episode_lengths"][k]
        assert f"episode {k}: return={result['episode_returns'][k]:.2f} length={length}" in out
        frames = decode(str(video_dir / name))
        # RecordVideo keeps the frame of the reset and one per step: the last one shows the pole down
        assert frames.shape == (length + 1, 400, 600, 3)
        assert result["video_frames"][k] == length + 1
    # the evaluator's other figures are printed too: the mean episode length of the two episodes played
    assert f"eval figures: mean_ep_len={sum(result['episode_lengths']) / 2:.4g}" in out
    # the first frame is the seeded reset's (evaluator env 0's seed); H.264 blurs it a little
    env = gym.make("CartPole-v1", render_mode="rgb_array")
    env.reset(seed=EVAL_SEED_OFFSET)
    reset_frame = env.render().astype(np.int64)
    env.close()
    frames = decode(str(video_dir / names[0])).astype(np.int64)
    assert np.abs(frames[0] - reset_frame).mean() < 0.5 * np.abs(frames[-1] - reset_frame).mean()


def test_deterministic_watch_plays_the_evaluators_episodes(cartpole_ckpt):
    first = watch(cartpole_ckpt, episodes=3)
    assert watch(cartpole_ckpt, episodes=3)["episode_returns"] == first["episode_returns"]
    assert first["videos"] == [] and first["eval/n_episode"] == 3
    # one evaluator env plays its episodes one after the other from the same seed: the same games
    evaluated = serial_eval(cartpole_ckpt, n_episode=3)
    for key in ("eval/mean_reward", "eval/min_reward", "eval/max_reward", "eval/mean_ep_len"):
        assert first[key] == pytest.approx(evaluated[key])


def test_stochastic_acts_with_the_collect_setting_at_the_checkpoints_env_step(cartpole_ckpt, tmp_path, capsys):
    cfg = compile_config(read_config(CARTPOLE_DQN))
    assert make_acting(cartpole_ckpt, cfg, deterministic=True).setting == {}
    assert make_acting(cartpole_ckpt, cfg, deterministic=False).setting == {
        "eps": 1.0
    }  # env_step 0: the schedule's start
    late = str(tmp_path / "late.pt")
    save_checkpoint({**load_checkpoint(cartpole_ckpt), "env_step": 20_000}, late)
    assert make_acting(late, cfg, deterministic=False).setting == {"eps": pytest.approx(0.04)}  # past decay: the end

    greedy = watch(cartpole_ckpt, episodes=4)
    sampled = watch(cartpole_ckpt, episodes=4, deterministic=False)
    assert sampled["episode_returns"] == watch(cartpole_ckpt, episodes=4, deterministic=False)["episode_returns"]
    assert sampled["episode_returns"] != greedy["episode_returns"]
    video_dir = str(tmp_path / "videos")
    assert main(["-m", "eval", "--ckpt", cartpole_ckpt, "--episodes", "4", "--stochastic", "--video", video_dir]) == 0
    assert "(stochastic)" in capsys.readouterr().out
    assert sorted(os.listdir(video_dir)) == [f"cp-iteration_0-stochastic-episode-{k}.mp4" for k in range(4)]


def test_an_env_without_rgb_array_is_a_one_line_error(cartpole_ckpt, tmp_path, capsys):
    argv = ["-m", "eval", "--ckpt", cartpole_ckpt, "--set", "env.env_id=NoRgbCartPole-v0", "--video", str(tmp_path)]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err
    assert "NoRgbCartPole-v0" in err and "render modes are ['human']" in err and "needs 'rgb_array'" in err
    assert os.listdir(tmp_path) == []


def test_a_multi_agent_env_cannot_be_recorded(tmp_path, capsys):
    path = os.path.join(ROOT, "app_zoo/multiagent/two_step/config/two_step_qmix.yaml")
    ckpt = untrained_checkpoint(path, str(tmp_path), "two_step", [])
    assert main(["-m", "eval", "--ckpt", ckpt, "--video", str(tmp_path / "videos")]) == 2
    err = capsys.readouterr().err
    assert "env 'two_step_game'" in err and "has no rgb_array rendering" in err and "TwoStepGameEnv is not one" in err


def test_missing_moviepy_names_the_extra(cartpole_ckpt, tmp_path, capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, "moviepy", None)  # import moviepy raises ImportError
    assert main(["-m", "eval", "--ckpt", cartpole_ckpt, "--video", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert "moviepy" in err and "pip install nervex[video]" in err and "Traceback" not in err


def test_pong_records_every_emulator_frame_in_colour(tmp_path):
    pytest.importorskip("ale_py")
    # no random no-ops and no FIRE at the reset: the video is the reset frame and 4 emulator frames per step
    overrides = ["env.manager_type=base", "env.collector_env_num=1", "env.evaluator_env_num=1"]
    overrides += ["replay_buffer.maxlen=1000", "env.max_episode_steps=50", "env.noop_max=0", "env.fire_reset=false"]
    ckpt = untrained_checkpoint(PONG_DQN, str(tmp_path), "pong", overrides)
    result = watch(ckpt, episodes=1, video_dir=str(tmp_path / "videos"))
    assert result["episode_lengths"] == [50]
    frames = decode(result["videos"][0])
    assert frames.shape == (1 + 4 * 50, 210, 160, 3)  # ALE's RGB screen, not the 84x84 grayscale observation
    assert iio.immeta(result["videos"][0], plugin="FFMPEG")["fps"] == 60.0  # the console's real-time speed
    assert np.ptp(frames[-1].astype(int), axis=-1).max() > 50  # colour: the channels differ


@pytest.mark.skipif(not ctypes.util.find_library("EGL"), reason="MuJoCo renders off screen through EGL")
def test_inverted_pendulum_records_offscreen(tmp_path, monkeypatch):
    pytest.importorskip("mujoco")
    monkeypatch.setenv("MUJOCO_GL", "")  # unset: MujocoEnv picks EGL without a display (restored after the test)
    monkeypatch.delenv("DISPLAY", raising=False)
    monkeypatch.delenv("WAYLAND_DISPLAY", raising=False)
    ckpt = untrained_checkpoint(PENDULUM_PPO, str(tmp_path), "pendulum", ["env.max_episode_steps=20"])
    result = watch(ckpt, episodes=1, video_dir=str(tmp_path / "videos"), deterministic=False)
    assert os.environ["MUJOCO_GL"] == "egl"
    frames = decode(result["videos"][0])
    assert frames.shape == (result["episode_lengths"][0] + 1, 480, 480, 3)
    assert frames[-1].max() > 100  # drawn, not a black frame


def test_videos_go_to_wandb_only_when_the_config_turns_it_on(cartpole_ckpt, tmp_path, monkeypatch):
    import nervex.utils.wandb_logger as wandb_logger

    calls = []
    monkeypatch.setattr(wandb_logger, "log_eval_videos", lambda *args, **kwargs: calls.append((args, kwargs)))
    argv = ["-m", "eval", "--ckpt", cartpole_ckpt, "--episodes", "1", "--video", str(tmp_path)]
    assert main(argv) == 0 and calls == []  # logger.wandb.mode: disabled, the default
    assert main([*argv, "--set", "logger.wandb.mode=offline"]) == 0
    (cfg, videos, checkpoint), kwargs = calls[0]
    assert cfg.logger.wandb.mode == "offline" and checkpoint == cartpole_ckpt and kwargs == {"env_step": 0}
    assert videos == [str(tmp_path / "cp-iteration_0-episode-0.mp4")]
