"""The DeepMind Atari preprocessing (Mnih et al. 2015), one small Gymnasium wrapper per step.

Applied innermost first by :func:`wrap_deepmind` (the order of OpenAI baselines' ``make_atari`` + ``wrap_deepmind``):

1. :class:`NoopResetWrapper` - up to ``noop_max`` random no-ops after a real reset (a varied start state).
2. :class:`MaxAndSkipWrapper` - repeat the action ``skip`` times, sum the rewards, max-pool the last two frames
   (Atari sprites flicker: some are drawn only on every other frame).
3. :class:`EpisodicLifeWrapper` - a lost life ends the *learning* episode (``terminated``); the game goes on.
4. :class:`FireResetWrapper` - press FIRE at every episode start in games that wait for it (Breakout).
5. :class:`WarpFrameWrapper` - 84x84 (grayscale) frames.
6. :class:`ClipRewardWrapper` - reward -> its sign; the unclipped one stays in ``info['raw_reward']``.
7. :class:`FrameStackWrapper` - the last ``k`` frames, channel-first ``uint8``.

The wrappers only need the standard Gymnasium API plus, where named, the ALE interface at ``env.unwrapped.ale``
(``lives()``) and ``env.unwrapped.get_action_meanings()``.
"""

from __future__ import annotations

from collections import deque
from typing import Any, Deque, Dict, SupportsFloat, Tuple

import gymnasium as gym
import numpy as np

try:  # OpenCV's INTER_AREA resize is the reference implementation and ~3x faster than PIL's
    import cv2

    cv2.ocl.setUseOpenCL(False)
    RESIZE_BACKEND = "cv2"
except ImportError:  # pragma: no cover - depends on the install
    cv2 = None
    RESIZE_BACKEND = "PIL"

StepResult = Tuple[Any, SupportsFloat, bool, bool, Dict[str, Any]]
NOOP_ACTION = 0
FIRE_ACTION = 1


def _check_action_meaning(env: gym.Env, index: int, meaning: str) -> None:
    meanings = env.unwrapped.get_action_meanings()
    if len(meanings) <= index or meanings[index] != meaning:
        raise ValueError(f"{env.spec.id if env.spec else env}: action {index} must be {meaning}, got {meanings}")


class NoopResetWrapper(gym.Wrapper):
    """After a real reset, play a random number of no-ops in ``[1, noop_max]``.

    The count is drawn from ``env.unwrapped.np_random``, which ``reset(seed=...)`` seeds, so it is reproducible.
    ``last_noop_count`` keeps the count of the latest reset (for tests and logging).
    """

    def __init__(self, env: gym.Env, noop_max: int = 30) -> None:
        super().__init__(env)
        if noop_max < 1:
            raise ValueError(f"NoopResetWrapper: noop_max must be >= 1, got {noop_max}")
        _check_action_meaning(env, NOOP_ACTION, "NOOP")
        self.noop_max = noop_max
        self.last_noop_count = 0

    def reset(self, **kwargs: Any) -> Tuple[Any, Dict[str, Any]]:
        obs, info = self.env.reset(**kwargs)
        self.last_noop_count = int(self.env.unwrapped.np_random.integers(1, self.noop_max + 1))
        for _ in range(self.last_noop_count):
            obs, _, terminated, truncated, info = self.env.step(NOOP_ACTION)
            if terminated or truncated:  # a game cannot end in 30 no-ops in practice; start over if it does
                obs, info = self.env.reset()
        return obs, info


class MaxAndSkipWrapper(gym.Wrapper):
    """Repeat each action ``skip`` times; return the summed reward and the max of the last two frames.

    If the episode ends before the second-to-last frame, the last frame is returned as it is (no stale frame from
    the previous step is pooled in).
    """

    def __init__(self, env: gym.Env, skip: int = 4) -> None:
        super().__init__(env)
        if skip < 2:
            raise ValueError(f"MaxAndSkipWrapper: skip must be >= 2 (1 means: leave the wrapper out), got {skip}")
        self.skip = skip
        self._buffer = np.zeros((2, *env.observation_space.shape), dtype=env.observation_space.dtype)

    def step(self, action: Any) -> StepResult:
        total_reward = 0.0
        terminated = truncated = False
        info: Dict[str, Any] = {}
        for t in range(self.skip):
            obs, reward, terminated, truncated, info = self.env.step(action)
            total_reward += float(reward)
            if t >= self.skip - 2:
                self._buffer[t - (self.skip - 2)] = obs
            if terminated or truncated:
                break
        if t == self.skip - 1:
            obs = np.maximum(self._buffer[0], self._buffer[1])
        return obs, total_reward, terminated, truncated, info


class EpisodicLifeWrapper(gym.Wrapper):
    """Make a lost life the end of a *learning* episode, while the game itself goes on.

    - A step that loses a life (but not the last one) returns ``terminated=True``: the value of a state after a
      lost life is not bootstrapped, which speeds up learning (DQN, Mnih et al. 2015).
    - ``info['game_over']`` tells the real end of the game (terminated or truncated by the game) apart from a lost
      life; ``info['life_loss']`` is true on a lost life.
    - ``reset()`` right after a lost life does not restart the game: it plays one no-op and continues from there.
      Any other reset (after the game's end, in the middle of a life, or ``reset(seed=...)``) is a real one.
      An outer time limit that cuts the game short sets ``game_over = True`` so that the next reset is real.
    """

    def __init__(self, env: gym.Env) -> None:
        super().__init__(env)
        self.lives = 0
        self.game_over = True
        self._continue = False  # the last step lost a life and the game goes on

    def step(self, action: Any) -> StepResult:
        obs, reward, terminated, truncated, info = self.env.step(action)
        self.game_over = bool(terminated or truncated)
        lives = self.env.unwrapped.ale.lives()
        life_loss = 0 < lives < self.lives
        self.lives = lives
        info = dict(info, game_over=self.game_over, life_loss=life_loss)
        # a life lost in the step that ends the game anyway is the game's end, nothing to continue
        self._continue = life_loss and not self.game_over
        return obs, reward, bool(terminated or life_loss), truncated, info

    def reset(self, **kwargs: Any) -> Tuple[Any, Dict[str, Any]]:
        if self._continue and not self.game_over and kwargs.get("seed") is None:
            obs, _, terminated, truncated, info = self.env.step(NOOP_ACTION)
            if terminated or truncated:  # the game ended in that no-op: start a new one
                obs, info = self.env.reset()
        else:
            obs, info = self.env.reset(**kwargs)
        self._continue = False
        self.game_over = False
        self.lives = self.env.unwrapped.ale.lives()
        return obs, info


class FireResetWrapper(gym.Wrapper):
    """Press FIRE (then UP/RIGHT, action 2) at every episode start, for games that wait for FIRE to begin.

    Placed outside :class:`EpisodicLifeWrapper`, it also relaunches the ball after a lost life in Breakout.
    Like every step played inside a reset (no-ops included), the rewards of these two are dropped; they are 0 in
    the games that need FIRE.
    """

    def __init__(self, env: gym.Env) -> None:
        super().__init__(env)
        _check_action_meaning(env, FIRE_ACTION, "FIRE")
        if len(env.unwrapped.get_action_meanings()) < 3:
            raise ValueError(f"FireResetWrapper needs at least 3 actions, got {env.unwrapped.get_action_meanings()}")

    def reset(self, **kwargs: Any) -> Tuple[Any, Dict[str, Any]]:
        self.env.reset(**kwargs)
        obs, info = None, {}
        for action in (FIRE_ACTION, 2):
            obs, _, terminated, truncated, info = self.env.step(action)
            if terminated or truncated:
                obs, info = self.env.reset()
        return obs, info


def resize(frame: np.ndarray, size: int) -> np.ndarray:
    """Area-interpolated resize of an ``(H, W)`` or ``(H, W, 3)`` ``uint8`` frame to ``(size, size[, 3])``.

    Uses OpenCV's ``INTER_AREA`` (what baselines, SB3 and Gymnasium's ``AtariPreprocessing`` use) when ``cv2`` is
    installed, as the ``atari`` extra does. Without it, Pillow's ``BOX`` filter (Pillow comes with tensorboard, a core
    dependency): also an area average, but its pixel grid differs (on Breakout frames: mean 1.5, max 42 grey levels
    apart), so a policy trained on one should be evaluated on the same.
    """
    if cv2 is not None:
        return cv2.resize(frame, (size, size), interpolation=cv2.INTER_AREA)
    from PIL import Image  # imported here: only installs without OpenCV need it

    return np.asarray(Image.fromarray(frame).resize((size, size), Image.Resampling.BOX))


def to_grayscale(frame: np.ndarray) -> np.ndarray:
    """ITU-R 601 luma of an ``(H, W, 3)`` RGB frame (what ALE's ``obs_type='grayscale'`` returns)."""
    if cv2 is not None:
        return cv2.cvtColor(frame, cv2.COLOR_RGB2GRAY)
    return (frame @ np.array([0.299, 0.587, 0.114])).round().astype(np.uint8)


class WarpFrameWrapper(gym.ObservationWrapper):
    """Resize frames to ``size x size`` (84 in DQN), grayscale unless ``grayscale=False``.

    Grayscale input (ALE's ``obs_type='grayscale'``, the cheap path) is only resized; RGB input is converted first.
    """

    def __init__(self, env: gym.Env, size: int = 84, grayscale: bool = True) -> None:
        super().__init__(env)
        self.size = size
        self.grayscale = grayscale
        in_shape = env.observation_space.shape
        if len(in_shape) not in (2, 3):
            raise ValueError(f"WarpFrameWrapper expects (H, W) or (H, W, 3) frames, got shape {in_shape}")
        color = len(in_shape) == 3 and not grayscale
        shape = (size, size, 3) if color else (size, size)
        self.observation_space = gym.spaces.Box(0, 255, shape, dtype=np.uint8)

    def observation(self, observation: np.ndarray) -> np.ndarray:
        if observation.ndim == 3 and self.grayscale:
            observation = to_grayscale(observation)
        return resize(observation, self.size)


class ClipRewardWrapper(gym.RewardWrapper):
    """Clip rewards to their sign (-1, 0, 1); the unclipped reward is kept in ``info['raw_reward']``."""

    def step(self, action: Any) -> StepResult:
        obs, reward, terminated, truncated, info = self.env.step(action)
        info = dict(info, raw_reward=float(reward))
        return obs, self.reward(reward), terminated, truncated, info

    def reward(self, reward: SupportsFloat) -> float:
        return float(np.sign(reward))


class FrameStackWrapper(gym.Wrapper):
    """Stack the last ``k`` frames channel-first: ``(k, H, W)`` for grayscale, ``(3k, H, W)`` for RGB, ``uint8``.

    After a reset the stack holds ``k`` copies of the first frame. Each observation is a fresh array, so a replay
    buffer may keep it without copying.
    """

    def __init__(self, env: gym.Env, k: int = 4) -> None:
        super().__init__(env)
        if k < 1:
            raise ValueError(f"FrameStackWrapper: k must be >= 1, got {k}")
        self.k = k
        shape = env.observation_space.shape
        channels = 1 if len(shape) == 2 else shape[2]
        self.observation_space = gym.spaces.Box(0, 255, (k * channels, shape[0], shape[1]), dtype=np.uint8)
        self._frames: Deque[np.ndarray] = deque(maxlen=k)

    @staticmethod
    def _channel_first(frame: np.ndarray) -> np.ndarray:
        return frame[None] if frame.ndim == 2 else frame.transpose(2, 0, 1)

    def reset(self, **kwargs: Any) -> Tuple[np.ndarray, Dict[str, Any]]:
        obs, info = self.env.reset(**kwargs)
        frame = self._channel_first(obs)
        for _ in range(self.k):
            self._frames.append(frame)
        return np.concatenate(self._frames, axis=0), info

    def step(self, action: Any) -> StepResult:
        obs, reward, terminated, truncated, info = self.env.step(action)
        self._frames.append(self._channel_first(obs))
        return np.concatenate(self._frames, axis=0), reward, terminated, truncated, info


def wrap_deepmind(
    env: gym.Env,
    noop_max: int = 30,
    frame_skip: int = 4,
    episodic_life: bool = True,
    fire_reset: bool = True,
    warp_frame: bool = True,
    frame_size: int = 84,
    grayscale: bool = True,
    clip_reward: bool = True,
    frame_stack: int = 4,
) -> gym.Env:
    """Apply the DeepMind wrappers to an ALE env that does not skip frames itself (``frameskip=1``).

    Args:
        env: e.g. ``gym.make('PongNoFrameskip-v4')`` or ``gym.make('ALE/Pong-v5', frameskip=1)``.
        noop_max: Most no-ops after a reset; 0 turns :class:`NoopResetWrapper` off.
        frame_skip: Frames per agent step; 1 turns :class:`MaxAndSkipWrapper` off.
        episodic_life: A lost life terminates the learning episode.
        fire_reset: Press FIRE at episode starts, in games whose action 1 is FIRE (ignored in the others).
        warp_frame: Resize to ``frame_size`` (grayscale when ``grayscale``).
        clip_reward: Clip rewards to their sign.
        frame_stack: Frames stacked channel-first; 0 turns :class:`FrameStackWrapper` off.

    Returns:
        The wrapped env.

    Raises:
        ValueError: ``env`` already skips frames while ``frame_skip > 1``.
    """
    ale_frameskip = getattr(env.unwrapped, "_frameskip", 1)
    if frame_skip > 1 and ale_frameskip != 1:
        env_id = env.spec.id if env.spec else type(env.unwrapped).__name__
        raise ValueError(
            f"{env_id} already repeats each action {ale_frameskip} frames, and frame_skip={frame_skip} would repeat "
            f"that again; set env_kwargs.frameskip: 1 (or use a NoFrameskip-v4 id), or frame_skip: 1"
        )
    if noop_max > 0:
        env = NoopResetWrapper(env, noop_max)
    if frame_skip > 1:
        env = MaxAndSkipWrapper(env, frame_skip)
    if episodic_life:
        env = EpisodicLifeWrapper(env)
    if fire_reset and "FIRE" in env.unwrapped.get_action_meanings()[1:2]:
        env = FireResetWrapper(env)
    if warp_frame:
        env = WarpFrameWrapper(env, frame_size, grayscale)
    if clip_reward:
        env = ClipRewardWrapper(env)
    if frame_stack > 0:
        env = FrameStackWrapper(env, frame_stack)
    return env
