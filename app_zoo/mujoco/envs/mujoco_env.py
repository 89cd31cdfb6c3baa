"""MuJoCo locomotion tasks (Gymnasium ``-v5`` ids) as a nervex env (registered as ``'mujoco'``)."""

from __future__ import annotations

import os
from typing import Any, Callable, Dict, Mapping, Optional

import gymnasium as gym

from nervex.envs import GymEnv
from nervex.utils import ENV_REGISTRY

INSTALL_HINT = "pip install -e .[mujoco]"


def import_mujoco() -> Any:
    """Import the ``mujoco`` bindings and what Gymnasium's MuJoCo envs import with them.

    Raises:
        ImportError: ``mujoco`` (or ``imageio``, which Gymnasium's MuJoCo envs import) is missing; the message says
            how to install them.
    """
    try:
        import imageio  # noqa: F401 - gymnasium.envs.mujoco imports it at module level
        import mujoco
    except ImportError as e:
        raise ImportError(f"the 'mujoco' env needs the MuJoCo bindings ({e.name} is missing): {INSTALL_HINT}") from e
    return mujoco


@ENV_REGISTRY.register("mujoco")
class MujocoEnv(GymEnv):
    """A Gymnasium MuJoCo task: ``float32`` observations, a ``Box`` action space in ``[-1, 1]`` (Hopper, Walker2d,
    HalfCheetah, Ant...), the id's registered time limit (1000 steps for the locomotion tasks).

    Config keys are ``GymEnv``'s (``env_id``, ``max_episode_steps``, ``env_kwargs``, ``wrappers``); ``env_kwargs``
    reaches the task's constructor (``terminate_when_unhealthy``, ``reset_noise_scale``, ``frame_skip``...).
    Falling (Hopper, Walker2d) is ``terminated``; the time limit is ``truncated``.

    Seeding follows ``BaseEnv``: ``seed(s)`` seeds the next reset's initial-state noise and the action space.

    Raises:
        ImportError: the ``mujoco`` extra is missing (``pip install -e .[mujoco]``).

    Example:
        >>> env = MujocoEnv({'env_id': 'Hopper-v5'})
        >>> env.info().obs_space
        Box(-inf, inf, (11,), float32)
    """

    config: Dict[str, Any] = dict(GymEnv.config, env_id="Hopper-v5")

    def __init__(self, cfg: Optional[Mapping[str, Any]] = None) -> None:
        import_mujoco()
        super().__init__(cfg)

    def enable_rendering(
        self, render_mode: str = "rgb_array", wrap_bare: Optional[Callable[[gym.Env], gym.Env]] = None
    ) -> None:
        """As ``GymEnv.enable_rendering``; without a display (no ``DISPLAY``/``WAYLAND_DISPLAY``) and with no
        ``MUJOCO_GL`` set, renders off screen through EGL (``MUJOCO_GL=egl``): Gymnasium's default tries GLFW, which
        needs a display. Set ``MUJOCO_GL=osmesa`` where EGL is missing."""
        headless = not (os.environ.get("DISPLAY") or os.environ.get("WAYLAND_DISPLAY"))
        if render_mode != "human" and headless and not os.environ.get("MUJOCO_GL"):
            os.environ["MUJOCO_GL"] = "egl"  # read when the first frame is rendered, so setting it now is in time
        super().enable_rendering(render_mode, wrap_bare)
