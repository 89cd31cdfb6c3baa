"""Level-Based Foraging (``lbforaging``, Papoudakis et al. 2021) as a cooperative nervex env, registered ``'lbforaging'``.

LBF is a Gymnasium env with tuple observations and actions (one entry per agent). ``ForagingParallelEnv`` shows it as
a PettingZoo ``ParallelEnv`` (legal actions as ``infos[agent]['action_mask']``, the time limit as a truncation), and
``LBForagingEnv`` is the ``ParallelEnv`` adapter over it, so LBF gets the same layout, checks and alive/mask rules as
every PettingZoo env.
"""

from __future__ import annotations

from typing import Any, Dict, Mapping, Optional, Tuple

import gymnasium as gym
import numpy as np

from nervex.utils.registry import ENV_REGISTRY

from .pettingzoo_parallel import PettingZooParallelEnv

ACTION_NUM = 6  # LBF's actions: none, north, south, west, east, load


def _parallel_env_base() -> type:
    try:
        from pettingzoo.utils.env import ParallelEnv
    except ImportError as e:
        raise ImportError("env_type 'lbforaging' needs PettingZoo and lbforaging: pip install 'nervex[marl]'") from e
    return ParallelEnv


def make_foraging_env(env_id: str, max_episode_steps: int, env_kwargs: Mapping[str, Any]) -> Any:
    """The unwrapped ``ForagingEnv`` of a registered id, with its own step limit set to ``max_episode_steps``.

    LBF's ids pass ``max_episode_steps=50`` to the env itself (no Gymnasium ``TimeLimit``; ``gym.make`` would take
    the keyword for one), so the env is built from its spec's entry point with the limit among its kwargs.

    Raises:
        ImportError: lbforaging is not installed.
        gymnasium.error.Error: an unknown id (Gymnasium names the closest).
    """
    try:
        import lbforaging  # noqa: F401 - registers the Foraging-* ids
    except ImportError as e:
        raise ImportError("env_type 'lbforaging' needs lbforaging: pip install 'nervex[marl]'") from e
    from gymnasium.envs.registration import load_env_creator

    spec = gym.spec(env_id)
    kwargs = dict(spec.kwargs, max_episode_steps=int(max_episode_steps))
    kwargs.update(env_kwargs)
    creator = spec.entry_point if callable(spec.entry_point) else load_env_creator(spec.entry_point)
    return creator(**kwargs)


class _ForagingParallel:
    """LBF as a ``ParallelEnv``: agents ``agent_0..``, a mask per agent in ``infos``, a time limit that truncates.

    LBF itself ends an episode with ``done=True`` both when all food is eaten and at its step limit; here the first
    terminates and the second truncates (food is left, the values bootstrap).
    """

    metadata = {"name": "lbforaging_parallel"}

    def __init__(self, env_id: str, max_episode_steps: int, env_kwargs: Mapping[str, Any]) -> None:
        self.env = make_foraging_env(env_id, max_episode_steps, env_kwargs)
        self.max_cycles = int(max_episode_steps)
        n = len(self.env.players)
        self.possible_agents = [f"agent_{i}" for i in range(n)]
        self.agents: list = []
        self.observation_spaces = dict(zip(self.possible_agents, self.env.observation_space.spaces))
        self.action_spaces = dict(zip(self.possible_agents, self.env.action_space.spaces))
        self.food_at_start = 0

    def observation_space(self, agent: str) -> gym.Space:
        return self.observation_spaces[agent]

    def action_space(self, agent: str) -> gym.Space:
        return self.action_spaces[agent]

    def _infos(self) -> Dict[str, Dict[str, np.ndarray]]:
        infos = {}
        for agent, player in zip(self.possible_agents, self.env.players):
            mask = np.zeros(ACTION_NUM, np.int8)
            mask[[action.value for action in self.env._valid_actions[player]]] = 1
            infos[agent] = {"action_mask": mask}
        return infos

    def reset(self, seed: Optional[int] = None, options: Optional[dict] = None) -> Tuple[dict, dict]:
        obs, _ = self.env.reset(seed=seed, options=options)
        self.agents = list(self.possible_agents)
        self.food_at_start = int(np.count_nonzero(self.env.field))
        return dict(zip(self.possible_agents, obs)), self._infos()

    def step(self, actions: Dict[str, Any]) -> Tuple[dict, dict, dict, dict, dict]:
        obs, rewards, done, _, _ = self.env.step(tuple(int(actions[a]) for a in self.possible_agents))
        all_eaten = not self.env.field.any()
        terms = {a: bool(done and all_eaten) for a in self.possible_agents}
        truncs = {a: bool(done and not all_eaten) for a in self.possible_agents}
        if done:
            self.agents = []
        rewards = {a: float(r) for a, r in zip(self.possible_agents, rewards)}
        return dict(zip(self.possible_agents, obs)), rewards, terms, truncs, self._infos()

    def food_left(self) -> int:
        return int(np.count_nonzero(self.env.field))

    def close(self) -> None:
        self.env.close()


@ENV_REGISTRY.register("lbforaging")
class LBForagingEnv(PettingZooParallelEnv):
    """Level-Based Foraging in the cooperative layout (see :class:`PettingZooParallelEnv` for the observation).

    Config keys (``LBForagingEnv.config``):

    - ``env_id``: a ``Foraging-*`` Gymnasium id of lbforaging (``'Foraging-8x8-2p-2f-coop-v3'``).
    - ``env_kwargs``: ``ForagingEnv`` keyword arguments over the id's (``normalize_reward``, ``penalty``...).
    - ``max_episode_steps``: the episode length, 50 as the ids register it and as EPyMARL runs LBF; reaching it with
      food left truncates, eating all food terminates.
    - ``team_reward``: ``'sum'`` (default): with LBF's ``normalize_reward`` (on by default) the agents' rewards for
      eating a food sum to that food's level over the total level spawned, so the team's episode return -- EPyMARL's
      "normalized return" -- is the level-weighted fraction of the food eaten: 1.0 = all food collected.

    Observation rows are LBF's own vectors (``(x, y, level)`` per food, then per agent, -1 where unseen);
    ``action_mask`` is LBF's valid actions (LBF itself would replace an invalid action by "none"; here it raises
    naming the agent). LBF has no global state: ``global_state`` is the agents' observations concatenated
    (``global_state_source == 'concat_obs'``). ``info['episode_stats']`` at the end: ``normalized_return`` (the team
    return, when ``normalize_reward`` is on) and ``food_collected`` (the fraction of food items eaten).
    """

    config: Dict[str, Any] = dict(
        env_id="Foraging-8x8-2p-2f-coop-v3", env_kwargs={}, team_reward="sum", max_episode_steps=50, episode_stats=None
    )

    def __init__(self, cfg: Optional[Mapping[str, Any]] = None) -> None:
        super().__init__(cfg)
        if self._cfg["max_episode_steps"] is None:
            raise ValueError(
                f"{type(self).__name__} config key 'max_episode_steps' must be an int >= 1 (LBF needs one)"
            )

    def _make(self) -> Any:
        base = _parallel_env_base()
        cls = type("ForagingParallelEnv", (_ForagingParallel, base), {})
        return cls(self._cfg["env_id"], self._cfg["max_episode_steps"], self._cfg["env_kwargs"])

    def episode_stats(self) -> Dict[str, float]:
        """``normalized_return`` (team return; 1.0 = all food, when rewards are normalized) and ``food_collected``."""
        env = self._env
        stats = super().episode_stats()  # a config's own episode_stats function, if any
        stats["food_collected"] = 1.0 - env.food_left() / max(env.food_at_start, 1)
        if getattr(env.env, "_normalize_reward", False):
            stats["normalized_return"] = float(self._returns.sum())
        return stats

    def __repr__(self) -> str:
        return f"{type(self).__name__}(env_id={self._cfg['env_id']!r})"


__all__ = ["LBForagingEnv", "make_foraging_env"]
