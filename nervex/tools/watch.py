"""Watch a checkpoint: play its episodes in this process on one env and record each to an mp4 file.

``nervex -m eval --ckpt PATH --video DIR [--episodes N] [--deterministic|--stochastic]`` calls :func:`watch`. The env
is the evaluator's (the config's env with the class's ``eval_overrides``: Atari plays whole games), built once with
``render_mode='rgb_array'``; Gymnasium's ``RecordVideo`` wraps the bare Gymnasium env, inside every other wrapper,
so a video shows what the game draws (Atari: every emulator frame in colour, not the 84x84 grayscale stack the
network sees) at the game's real-time speed.

Acting (what ``--deterministic`` and ``--stochastic`` mean):

- deterministic (the default): the policy's eval mode, as the evaluator plays (greedy Q, the Gaussian's mean,
  the most likely discrete action).
- stochastic: the policy's collect mode with the command mode's collect setting at the checkpoint's ``env_step``,
  i.e. the actions the policy trained with at that point, as rl-baselines3-zoo's ``enjoy --stochastic``: PPO, A2C,
  SAC sample from their distribution; DQN-like policies act epsilon-greedily with the schedule's epsilon at the
  checkpoint's ``env_step`` (the final epsilon for a finished run, 1.0 for an untrained one); TD3/DDPG add their
  exploration noise. With observation normalization, the collect mode updates the running statistics as it does
  while collecting; each episode restarts from the checkpoint's statistics.

Videos are named ``DIR/<run>-<checkpoint>[-stochastic]-episode-<k>.mp4`` (``k`` from 0; a file of that name is
overwritten), where ``<run>`` is the run directory's name when the checkpoint is in one (``runs/<run>/ckpt/``), else
the config's ``exp_name``, else ``<env>__<policy>``. A video holds the reset frame and one frame per frame the bare
env renders: ``episode_len + 1`` frames for CartPole or MuJoCo, ``1 + emulator frames`` for Atari (4 per step with
``frame_skip: 4``, plus the no-op and FIRE frames of the reset).
"""

from __future__ import annotations

import copy
import os
import sys
import warnings
from typing import Any, Callable, Dict, List, Mapping, NamedTuple, Optional, Sequence, Tuple

import gymnasium as gym
import numpy as np
from easydict import EasyDict
from gymnasium.wrappers import RecordVideo

VIDEO_INSTALL_HINT = "pip install nervex[video]"
RENDER_MODE = "rgb_array"


class CannotRenderError(ValueError):
    """The env cannot give the RGB frames a video needs; the message names the env and what it supports."""


class VideoDependencyError(ImportError):
    """moviepy or imageio's ffmpeg is missing; the message names the extra that installs them."""


def require_video_packages() -> None:
    """Check that the packages ``RecordVideo`` writes mp4 files with can be imported.

    Raises:
        VideoDependencyError: moviepy or imageio-ffmpeg is missing (``pip install nervex[video]``).
    """
    for module in ("moviepy", "imageio_ffmpeg"):
        try:
            __import__(module)
        except ImportError as e:
            raise VideoDependencyError(
                f"recording videos (--video) needs moviepy and imageio's ffmpeg, and {module} cannot be imported "
                f"({e}): {VIDEO_INSTALL_HINT}"
            ) from None


class Mp4Stream:
    """Where ``RecordVideo`` puts its frames (``recorded_frames``), streamed to an H.264 mp4 file as they come.

    ``RecordVideo`` keeps every frame of a recording in a list until it stops, then writes them through moviepy's
    ``ImageSequenceClip``: a full Pong game is ~4,000 frames (400 MB), a 1,000-step MuJoCo episode 690 MB, and that
    clip's duration (a float sum of ``1 / fps``) floors to ``n - 1`` frames for about half the lengths, dropping the
    episode's last frame. This stand-in takes ``append``/``+=``/``len`` as the list does, and hands each frame to
    moviepy's ffmpeg writer (which encodes in its own process) at once: one video frame per frame, in constant memory.

    Args:
        path: The mp4 file (opened at the first frame: a recording without frames writes no file).
        fps: Frames per second of the video.
    """

    def __init__(self, path: str, fps: float) -> None:
        self.path = path
        self.fps = fps
        self._writer: Any = None
        self._shape: Optional[Tuple[int, ...]] = None
        self._count = 0

    def append(self, frame: np.ndarray) -> None:
        frame = np.asarray(frame)
        if self._writer is None:
            from moviepy.video.io.ffmpeg_writer import FFMPEG_VideoWriter

            if frame.ndim != 3 or frame.shape[2] != 3:
                raise ValueError(f"{self.path}: a video frame must be (height, width, 3) RGB, got {frame.shape}")
            self._shape = frame.shape
            self._writer = FFMPEG_VideoWriter(self.path, (frame.shape[1], frame.shape[0]), self.fps, codec="libx264")
        elif frame.shape != self._shape:
            raise ValueError(f"{self.path}: frame {self._count} is {frame.shape}, the video's frames are {self._shape}")
        self._writer.write_frame(np.ascontiguousarray(frame, dtype=np.uint8))
        self._count += 1

    def __iadd__(self, frames: Sequence[np.ndarray]) -> Mp4Stream:
        for frame in frames:
            self.append(frame)
        return self

    def __len__(self) -> int:
        return self._count

    def close(self) -> None:
        """Finish the file; safe to call twice."""
        writer, self._writer = self._writer, None
        if writer is not None:
            writer.close()


class EpisodeRecorder(RecordVideo):
    """Gymnasium's ``RecordVideo``, driven by nervex's episodes instead of the wrapped env's resets.

    ``arm(name)`` before the reset that starts an episode, ``finish()`` after its last step: it writes
    ``video_folder/name.mp4`` and returns that path. A reset in between (Atari's no-op start restarting a game, a
    lost life with episodic lives) does not cut the video: every reset and step in between is one more frame.

    Args:
        env: The bare Gymnasium env, built with ``render_mode='rgb_array'``.
        video_folder: Where the mp4 files go (created if missing).
        fps: Frames per second of the videos (default: the env's ``metadata['render_fps']``).
    """

    def __init__(self, env: gym.Env, video_folder: str, fps: Optional[float] = None) -> None:
        self._next_name: Optional[str] = None
        self.video_name: Optional[str] = None
        with warnings.catch_warnings():
            # the names are predictable on purpose: a second watch of the same checkpoint replaces its videos
            warnings.filterwarnings("ignore", message=".*Overwriting existing videos")
            super().__init__(
                env,
                video_folder,
                episode_trigger=self._armed,
                video_length=sys.maxsize,  # finite: RecordVideo stops an unbounded recording at every reset
                fps=fps,
                disable_logger=True,
            )

    def _armed(self, episode_id: int) -> bool:
        return self._next_name is not None

    def arm(self, name: str) -> None:
        """Start a video called ``name`` at the next reset."""
        self._next_name = name

    def start_recording(self, video_name: str) -> None:
        name, self._next_name = self._next_name or video_name, None
        super().start_recording(name)
        self.video_name = name
        self.recorded_frames = Mp4Stream(os.path.join(self.video_folder, f"{name}.mp4"), self.frames_per_sec)

    def stop_recording(self) -> None:
        """Close the video's file, then end the recording as ``RecordVideo`` does (with no frames left to write)."""
        if isinstance(self.recorded_frames, Mp4Stream):
            self.recorded_frames.close()
        self.recorded_frames = []
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=".*zero frames")  # they are in the file already
            super().stop_recording()

    def finish(self) -> Tuple[Optional[str], int]:
        """End the video being recorded; ``(its path, its frame count)``, or ``(None, 0)`` when nothing was."""
        if not self.recording or not self.recorded_frames:
            return None, 0
        path, frames = self.recorded_frames.path, len(self.recorded_frames)
        self.stop_recording()
        return path, frames


def video_prefix(checkpoint: str, cfg: Mapping[str, Any], deterministic: bool = True) -> str:
    """``<run>-<checkpoint file stem>[-stochastic]``: the start of the checkpoint's video names (module docstring)."""
    from nervex.entry.serial_entry import run_config_of

    if os.path.isfile(run_config_of(checkpoint)):
        run = os.path.basename(os.path.dirname(os.path.dirname(os.path.abspath(checkpoint))))
    elif cfg.get("exp_name"):
        run = str(cfg["exp_name"]).replace(os.sep, "_")
    else:
        run = f"{cfg['env'].get('env_id') or cfg['env']['env_type']}__{cfg['policy']['policy_type']}"
    stem = os.path.splitext(os.path.basename(checkpoint))[0]
    return f"{run}-{stem}" + ("" if deterministic else "-stochastic")


# ---- the env --------------------------------------------------------------------------------------------------------
def make_watch_env(cfg: Mapping[str, Any]) -> Any:
    """The evaluator's env of a compiled config: the env class with the config's keys and its ``eval_overrides``."""
    from nervex.entry.builder import resolve_env_classes
    from nervex.envs import ENV_PIPELINE_KEYS

    env_cls, _ = resolve_env_classes(cfg["env"])
    env_cfg = {k: copy.deepcopy(v) for k, v in cfg["env"].items() if k not in ENV_PIPELINE_KEYS}
    return env_cls({**env_cfg, **getattr(env_cls, "eval_overrides", {})})


def _env_name(cfg: Mapping[str, Any], env: Any) -> str:
    return f"env '{cfg['env'].get('env_type', 'gym')}' ({env!r})"


def attach_recorder(env: Any, cfg: Mapping[str, Any], video_dir: str) -> EpisodeRecorder:
    """Rebuild ``env`` with ``rgb_array`` rendering and an :class:`EpisodeRecorder` around its bare Gymnasium env.

    Raises:
        CannotRenderError: the env is not a Gymnasium env (``GymEnv``), or does not declare ``rgb_array`` among its
            render modes, or builds its Gymnasium env without ``GymEnv._make_bare_env``.
    """
    from nervex.envs import GymEnv

    name = _env_name(cfg, env)
    if not isinstance(env, GymEnv):
        raise CannotRenderError(
            f"{name} cannot be recorded: it has no rgb_array rendering; --video records Gymnasium envs (GymEnv and "
            f"its subclasses: env_type gym, cartpole, atari, mujoco...), and {type(env).__name__} is not one"
        )
    modes = env.render_modes()
    if RENDER_MODE not in modes:
        raise CannotRenderError(
            f"{name} cannot render frames to record: its render modes are {list(modes) or 'none'} "
            f"(metadata['render_modes']), and --video needs '{RENDER_MODE}'"
        )
    if not (os.environ.get("DISPLAY") or os.environ.get("WAYLAND_DISPLAY")):
        # pygame-drawn envs (classic control, Box2D) draw off screen; without this SDL complains about the display
        os.environ.setdefault("SDL_VIDEODRIVER", "dummy")
    fps = env.video_fps()
    recorders: List[EpisodeRecorder] = []

    def wrap(bare: gym.Env) -> gym.Env:
        recorders.append(EpisodeRecorder(bare, video_dir, fps=fps))
        return recorders[-1]

    env.enable_rendering(RENDER_MODE, wrap)
    env.gym_env  # noqa: B018 - builds the env now, so the recorder exists before the first reset arms it
    if not recorders:
        raise CannotRenderError(
            f"{name} cannot be recorded: {type(env).__name__}._make_gym_env builds its Gymnasium env without "
            "GymEnv._make_bare_env, which adds the render mode and the recorder"
        )
    return recorders[-1]


# ---- acting ---------------------------------------------------------------------------------------------------------
class Acting(NamedTuple):
    """How the checkpoint acts: ``mode`` (the policy's eval mode, or its collect mode when stochastic), the command
    mode's ``setting`` for it at the checkpoint's progress, ``restart`` (restores the checkpoint's policy state before
    an episode) and that progress (``env_step``, ``train_iter``)."""

    mode: Any
    setting: Dict[str, Any]
    restart: Callable[[], None]
    env_step: int
    train_iter: int


def make_acting(checkpoint: str, cfg: EasyDict, deterministic: bool) -> Acting:
    """The policy of ``cfg`` loaded from ``checkpoint``, acting as ``deterministic`` says (module docstring)."""
    from nervex.entry.serial_entry import load_policy
    from nervex.torch_utils import load_checkpoint

    mode_name = "eval" if deterministic else "collect"
    policy = load_policy(checkpoint, cfg, enable_field=(mode_name, "command"))
    state = load_checkpoint(checkpoint)
    env_step, train_iter = int(state.get("env_step", 0)), int(state.get("train_iter", 0))
    progress = {
        "env_step": env_step,
        "train_iter": train_iter,
        "learner_step": train_iter,
        "max_env_step": cfg.max_env_step,
        "max_train_iter": cfg.max_train_iter,
    }
    command = policy.command_mode
    setting = command.get_setting_eval(progress) if deterministic else command.get_setting_collect(progress)
    mode = getattr(policy, f"{mode_name}_mode")

    def restart() -> None:
        # a stochastic collect mode may update running statistics: every episode starts from the checkpoint's
        if not deterministic:
            mode.load_state_dict(state["policy"])

    return Acting(mode, setting, restart, env_step, train_iter)


def _figures(returns: List[float], lengths: List[int]) -> Dict[str, Any]:
    """The evaluator's ``eval/*`` figures of the episodes played."""
    if not returns:
        nan = float("nan")
        return {f"eval/{k}": nan for k in ("mean_reward", "std_reward", "min_reward", "max_reward", "mean_ep_len")}
    return {
        "eval/mean_reward": float(np.mean(returns)),
        "eval/std_reward": float(np.std(returns)),
        "eval/min_reward": float(np.min(returns)),
        "eval/max_reward": float(np.max(returns)),
        "eval/mean_ep_len": float(np.mean(lengths)),
    }


def _first_reset(env: Any, cfg: Mapping[str, Any], recording: bool) -> Any:
    """``env.reset()``; when recording, a failure there (the first frame rendered) becomes a ``CannotRenderError``."""
    if not recording:
        return env.reset()
    try:
        return env.reset()
    except Exception as e:  # noqa: BLE001 - whatever the renderer raises (an OpenGL context, a missing library)
        hint = ""
        if "MUJOCO_GL" in os.environ or "mujoco" in type(e).__module__:
            hint = f" (MUJOCO_GL={os.environ.get('MUJOCO_GL')!r}; headless machines need egl or osmesa)"
        raise CannotRenderError(
            f"{_env_name(cfg, env)} failed to render its first frame: {type(e).__name__}: {e}{hint}"
        ) from e


def _play_episode(env: Any, mode: Any, setting: Dict[str, Any], clip: Callable[[Any], Any], obs: Any) -> Dict:
    """Act until the episode's end (a ``done`` that carries ``episode_return``); return that step's info."""
    while True:
        output = mode.forward([0], {0: obs}, **setting)[0]
        timestep = env.step(clip(output["action"]))
        obs = timestep.obs
        if not timestep.done:
            continue
        if "episode_return" in timestep.info:
            return timestep.info
        mode.reset([0])  # a life lost inside a game that goes on, as the evaluator plays it
        obs = env.reset()


def watch(
    checkpoint: str,
    cfg: Optional[Mapping[str, Any]] = None,
    episodes: Optional[int] = None,
    video_dir: Optional[str] = None,
    deterministic: bool = True,
    seed: int = 0,
) -> Dict[str, Any]:
    """Play ``episodes`` episodes of a checkpoint on one env in this process, recording each to mp4 if asked.

    Args:
        checkpoint: A checkpoint a learner or ``SerialTrainer.save_checkpoint`` wrote.
        cfg: The run's config (default: ``config.yaml`` of the run directory the checkpoint is in).
        episodes: Episodes to play (default: ``evaluator.n_episode``).
        video_dir: Folder of the mp4 files (one per episode, named as the module docstring says); None: no video.
        deterministic: The eval mode (greedy) if true, else the collect mode's sampling (module docstring).
        seed: Seeds torch/NumPy and the env's first reset (``seed + EVAL_SEED_OFFSET``, as evaluator env 0).

    Returns:
        The evaluator's ``eval/mean_reward``, ``eval/std_reward``, ``eval/min_reward``, ``eval/max_reward``,
        ``eval/mean_ep_len`` and ``eval/n_episode``, the checkpoint's ``env_step`` and ``train_iter``, with
        ``episode_returns``, ``episode_lengths``, ``videos``
        (paths, in episode order; empty without ``video_dir``) and ``video_frames`` (each video's frame count).

    Raises:
        CannotRenderError: ``video_dir`` is given and the env cannot render ``rgb_array`` frames.
        VideoDependencyError: ``video_dir`` is given and moviepy or imageio-ffmpeg is missing.
        ValueError: ``episodes < 1``, or the env has several agents.
    """
    import torch

    from nervex.entry.builder import EVAL_SEED_OFFSET
    from nervex.policy import set_seed

    cfg, episodes = _watch_config(checkpoint, cfg, episodes)
    if video_dir is not None:
        require_video_packages()
    set_seed(seed)
    if cfg.get("num_threads"):
        torch.set_num_threads(int(cfg.num_threads))
    env = make_watch_env(cfg)
    try:
        recorder = attach_recorder(env, cfg, video_dir) if video_dir is not None else None
        if env.info().agent_num != 1:
            raise ValueError(
                f"{_env_name(cfg, env)} has {env.info().agent_num} agents, and --video and --stochastic play one-agent "
                "envs; `nervex -m eval --ckpt PATH` without them evaluates it with the evaluator"
            )
        acting = make_acting(checkpoint, cfg, deterministic)
        env.seed(seed + EVAL_SEED_OFFSET)
        played = _play_episodes(env, cfg, acting, recorder, video_prefix(checkpoint, cfg, deterministic), episodes)
    finally:
        env.close()
    result = _figures(played["episode_returns"], played["episode_lengths"])
    result.update(played)
    result.update(
        {"eval/n_episode": len(played["episode_returns"]), "env_step": acting.env_step, "train_iter": acting.train_iter}
    )
    return result


def _watch_config(checkpoint: str, cfg: Optional[Mapping[str, Any]], episodes: Optional[int]) -> Tuple[EasyDict, int]:
    """The compiled config (the checkpoint's run's by default) and the number of episodes, checked."""
    from nervex.config import is_compiled, read_config
    from nervex.entry.builder import compile_config
    from nervex.entry.serial_entry import run_config_of

    cfg = cfg if cfg is not None else read_config(run_config_of(checkpoint))
    cfg = EasyDict(cfg if is_compiled(cfg) else compile_config(cfg))
    episodes = int(cfg.evaluator.n_episode if episodes is None else episodes)
    if episodes < 1:
        raise ValueError(f"--episodes must be >= 1, got {episodes}")
    return cfg, episodes


def _play_episodes(env: Any, cfg: EasyDict, acting: Any, recorder: Any, prefix: str, episodes: int) -> Dict[str, list]:
    """Play ``episodes`` episodes, each recorded to ``<prefix>-episode-<k>.mp4`` when there is a recorder."""
    from nervex.worker.actor.serial_actor import action_clipper

    mode, setting = acting.mode, acting.setting
    clip = action_clipper(env.info().act_space)
    played: Dict[str, list] = dict(episode_returns=[], episode_lengths=[], videos=[], video_frames=[])
    for k in range(episodes):
        if recorder is not None:
            recorder.arm(f"{prefix}-episode-{k}")
        acting.restart()
        mode.reset([0])
        obs = _first_reset(env, cfg, recorder is not None) if k == 0 else env.reset()
        info = _play_episode(env, mode, setting, clip, obs)
        played["episode_returns"].append(float(info["episode_return"]))
        played["episode_lengths"].append(int(info["episode_len"]))
        if recorder is not None:
            path, n_frames = recorder.finish()
            if path is not None:
                played["videos"].append(path)
                played["video_frames"].append(n_frames)
    return played


def describe(result: Mapping[str, Any]) -> List[str]:
    """One line per episode played: its return, length and video (for the command line)."""
    lines = []
    for k, (ret, length) in enumerate(zip(result["episode_returns"], result["episode_lengths"])):
        video = result["videos"][k] if k < len(result["videos"]) else None
        lines.append(f"episode {k}: return={ret:.2f} length={length}" + (f" video={video}" if video else ""))
    return lines


__all__ = [
    "watch",
    "attach_recorder",
    "make_watch_env",
    "video_prefix",
    "describe",
    "EpisodeRecorder",
    "CannotRenderError",
    "VideoDependencyError",
    "require_video_packages",
]
