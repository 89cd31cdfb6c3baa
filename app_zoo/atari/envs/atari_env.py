"""Atari 2600 games through ale-py, with the DeepMind preprocessing (registered as ``'atari'``)."""

from __future__ import annotations

from typing import Any, Dict, Mapping, Optional

import gymnasium as gym

from nervex.envs import GymEnv
from nervex.envs.wrappers import apply_wrappers
from nervex.utils import ENV_REGISTRY

from .atari_wrappers import EpisodicLifeWrapper, wrap_deepmind

INSTALL_HINT = "pip install -e .[atari]"
ATARI_FPS = 60.0  # frames the console draws per second (NTSC)


def import_ale() -> Any:
    """Import ale-py and register its ids with Gymnasium.

    Raises:
        ImportError: ale-py is not installed; the message says how to install it.
    """
    try:
        import ale_py
    except ImportError as e:
        raise ImportError(f"the 'atari' env needs ale-py (the Arcade Learning Environment): {INSTALL_HINT}") from e
    gym.register_envs(ale_py)
    return ale_py


@ENV_REGISTRY.register("atari")
class AtariEnv(GymEnv):
    """An ALE game with the DeepMind wrappers of :mod:`app_zoo.atari.envs.atari_wrappers`, each switchable.

    Config keys (``AtariEnv.config``), besides ``GymEnv``'s ``env_id``, ``max_episode_steps``, ``env_kwargs``
    and ``wrappers`` (extra wrappers, applied after the DeepMind ones):

    - ``env_id``: a game without ALE's own frame skip, e.g. ``PongNoFrameskip-v4``, or ``ALE/Pong-v5`` with
      ``env_kwargs: {frameskip: 1}`` (v5 ids default to sticky actions, ``repeat_action_probability: 0.25``).
    - ``noop_max`` (30; 0 = off), ``frame_skip`` (4; 1 = off, max-pools the last two frames),
      ``episodic_life``, ``fire_reset`` (only in games whose action 1 is FIRE), ``clip_reward`` (to the sign),
      ``warp_frame`` with ``frame_size`` (84) and ``grayscale``, ``frame_stack`` (4; 0 = off).

    With every switch on, observations are ``uint8`` ``(4, 84, 84)``, channel-first.

    Episodes, rewards and the two end flags:

    - ``reward`` is what the learner sees (clipped); ``info['raw_reward']`` is the game's, and
      ``info['episode_return']`` sums the game's rewards: the score users know (Pong: -21..21).
    - With ``episodic_life``, losing a life (not the last) gives ``done=True`` with ``terminated=True``,
      ``truncated=False``, ``info['life_loss']=True`` and ``info['game_over']=False``: the learner does not
      bootstrap past it, and the next ``reset()`` continues the same game (it does not restart the emulator).
      Such a ``done`` carries no ``episode_return``/``episode_len``; the ``done`` that ends the game
      (``game_over=True``) carries those of the whole game, all lives together.
    - A game lost (no lives left) or won ends with ``terminated=True``. ``truncated=True`` always ends the whole
      game (``game_over=True``, figures reported, next reset a real one): ALE's own frame cap (108000 frames for
      v4/v5 ids) or ``max_episode_steps``, which counts the agent steps of the whole game, not of one life.
    - Steps played inside ``reset()`` (no-ops, FIRE, the no-op that goes on after a lost life) count in neither
      ``episode_len`` nor ``episode_return`` (their rewards are 0 in practice).

    Seeding follows ``BaseEnv``: ``seed(s)`` makes the next reset a real one with ALE and the no-op count seeded
    by ``s``; later resets continue that stream.

    Raises:
        ImportError: ale-py is missing (``pip install -e .[atari]``).
    """

    # evaluation plays whole games: a lost life must not end an evaluation episode
    eval_overrides: Dict[str, Any] = dict(episodic_life=False)
    config: Dict[str, Any] = dict(
        GymEnv.config,
        env_id="PongNoFrameskip-v4",
        noop_max=30,
        frame_skip=4,
        episodic_life=True,
        fire_reset=True,
        clip_reward=True,
        warp_frame=True,
        frame_size=84,
        grayscale=True,
        frame_stack=4,
    )

    def __init__(self, cfg: Optional[Mapping[str, Any]] = None) -> None:
        import_ale()  # before GymEnv looks the id up in Gymnasium's registry
        super().__init__(cfg)
        self._life_wrapper: Optional[EpisodicLifeWrapper] = None

    def _make_gym_env(self) -> gym.Env:
        import_ale()  # an env unpickled in a subprocess has not run __init__ there
        cfg = self._cfg
        kwargs = dict(cfg["env_kwargs"])
        # ALE's own luma is cheaper than converting RGB frames (Dopamine and Gymnasium pool grayscale frames too)
        kwargs.setdefault("obs_type", "grayscale" if cfg["grayscale"] else "rgb")
        # as GymEnv does: without Gymnasium's time-limit/order/checker layers, whose work GymEnv does itself; a video
        # recorder (enable_rendering) wraps the bare ALE env, so it records every emulator frame in colour
        env = self._make_bare_env(kwargs)
        env = wrap_deepmind(
            env,
            noop_max=cfg["noop_max"],
            frame_skip=cfg["frame_skip"],
            episodic_life=cfg["episodic_life"],
            fire_reset=cfg["fire_reset"],
            warp_frame=cfg["warp_frame"],
            frame_size=cfg["frame_size"],
            grayscale=cfg["grayscale"],
            clip_reward=cfg["clip_reward"],
            frame_stack=cfg["frame_stack"],
        )
        self._life_wrapper = _find_wrapper(env, EpisodicLifeWrapper)
        return apply_wrappers(env, self._wrappers)

    def video_fps(self) -> float:
        """The real-time speed of the bare env's frames: the Atari 2600 draws 60 frames a second, and an ALE id with
        its own frame skip (``ALE/Pong-v5``: 4) returns one of every ``frameskip`` (ALE's ``render_fps``, 30, is a
        display default, not the game's speed)."""
        frameskip = {**self._spec.kwargs, **self._cfg["env_kwargs"]}.get("frameskip", 1)
        return ATARI_FPS / frameskip if isinstance(frameskip, int) and frameskip >= 1 else ATARI_FPS

    def reset(self) -> Any:
        """Start an episode (right after a lost life: go on with the same game) and return its first observation."""
        # Only a plain reset right after a lost life continues the game (EpisodicLifeWrapper decides the same way);
        # a seeded one restarts it, so the game's figures and time-limit count restart too.
        continue_game = self._game_goes_on and self._pending_seed is None
        game_elapsed = self._elapsed
        self._game_goes_on = continue_game
        obs = super().reset()
        self._game_goes_on = False  # consumed: a second reset without a step in between is a real one
        if continue_game:
            self._elapsed = game_elapsed  # the time limit covers the game, not one life
        return obs

    def _end_episode(self, info: Dict[str, Any]) -> None:
        if info["truncated"] and info.get("game_over") is False:
            # the time limit cut the game short while a life was left: the whole game ends, and the next reset
            # must restart the emulator
            info["game_over"] = True
            if self._life_wrapper is not None:
                self._life_wrapper.game_over = True
        super()._end_episode(info)

    def __getstate__(self) -> Dict[str, Any]:
        state = super().__getstate__()
        state["_life_wrapper"] = None
        return state


def _find_wrapper(env: gym.Env, cls: type) -> Optional[gym.Wrapper]:
    while isinstance(env, gym.Wrapper):
        if isinstance(env, cls):
            return env
        env = env.env
    return None
