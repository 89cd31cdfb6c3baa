"""Google Research Football (Kurach et al. 2020) as a nervex env, registered as ``'gfootball'``.

The engine is built by ``app_zoo/gfootball/install.sh``; this module imports without it, and building a
:class:`FootballEnv` (or asking for its ``info()``) then raises an ImportError naming that script. gfootball's own
Python code is written for the old ``gym`` API: :mod:`app_zoo.gfootball.envs.gym_shim` imports it on Gymnasium.
"""

from __future__ import annotations

import copy
import difflib
from typing import Any, Dict, List, Mapping, Optional, Tuple

import gymnasium as gym
import numpy as np

from nervex.envs import BaseEnv, BaseEnvInfo, BaseEnvTimestep
from nervex.envs.gym_env import check_env_cfg
from nervex.utils import ENV_REGISTRY

from .gym_shim import import_gfootball_env

REPRESENTATIONS = ("simple115v2", "simple115", "extracted")
REWARDS = ("scoring", "scoring,checkpoints")
STACK = 4  # gfootball's FrameStack depth
SIMPLE115_DIM = 115
# keys of create_environment this class sets itself; engine_options may not set them behind its back
_OWN_ENGINE_KEYS = ("level", "players", "game_engine_random_seed", "write_video", "dump_full_episodes", "dump_scores")


def _check_cfg(cfg: Mapping[str, Any]) -> None:
    """Reject values the engine would misread or fail on late, naming the key and what is valid."""
    if not isinstance(cfg["env_name"], str) or not cfg["env_name"]:
        raise ValueError(f"gfootball config key 'env_name' must be a scenario name, got {cfg['env_name']!r}")
    if cfg["representation"] not in REPRESENTATIONS:
        raise ValueError(
            f"gfootball config key 'representation' must be one of {REPRESENTATIONS}, got {cfg['representation']!r} "
            "(pixel frames need the engine's OpenGL renderer; 'extracted' is the stacked-minimap pixel input)"
        )
    if cfg["stacked"] and cfg["representation"] != "extracted":
        raise ValueError("gfootball config key 'stacked' is for representation 'extracted' only (gfootball's rule)")
    if cfg["rewards"] not in REWARDS:
        raise ValueError(f"gfootball config key 'rewards' must be one of {REWARDS}, got {cfg['rewards']!r}")
    players = cfg["controlled_players"]
    if isinstance(players, bool) or not isinstance(players, int) or not 1 <= players <= 11:
        raise ValueError(f"gfootball config key 'controlled_players' must be an int in 1..11, got {players!r}")
    dims = cfg["channel_dimensions"]
    if not (
        isinstance(dims, (list, tuple)) and len(dims) == 2 and all(isinstance(d, int) and 8 <= d <= 1024 for d in dims)
    ):
        raise ValueError(f"gfootball config key 'channel_dimensions' must be [width, height] in 8..1024, got {dims!r}")
    limit = cfg["max_episode_steps"]
    if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int) or limit < 1):
        raise ValueError(f"gfootball config key 'max_episode_steps' must be None or an int >= 1, got {limit!r}")
    if not isinstance(cfg["engine_options"], Mapping):
        raise TypeError(f"gfootball config key 'engine_options' must be a mapping, got {cfg['engine_options']!r}")
    own = sorted(set(cfg["engine_options"]) & set(_OWN_ENGINE_KEYS))
    if own:
        raise ValueError(
            f"gfootball config key 'engine_options' may not set {own}: use env_name, controlled_players and seeding"
        )


@ENV_REGISTRY.register("gfootball")
class FootballEnv(BaseEnv):
    """A Google Research Football scenario with the left team's ``controlled_players`` played by the agent(s).

    Config keys (``FootballEnv.config``):

    - ``env_name``: a scenario of ``gfootball/scenarios`` (``academy_empty_goal_close``, ``11_vs_11_easy_stochastic``).
    - ``representation``: ``simple115v2`` (float32 ``(115,)``: positions and directions of the players and the ball,
      ball ownership, the active player, the game mode), ``simple115`` (the same, v1 layout) or ``extracted``
      (gfootball's "super minimap": uint8 planes of the left team, the right team, the ball and the active player,
      ``channel_dimensions`` = ``[96, 72]`` by default), channel-first: ``(4, 72, 96)``, or ``(16, 72, 96)`` with
      ``stacked: true`` (the last 4 frames, oldest first).
    - ``rewards``: ``scoring`` (+1 when the left team scores, -1 when it concedes) or ``scoring,checkpoints`` (plus
      0.1 for each of 10 distance checkpoints towards the goal reached with the ball, once per episode).
    - ``controlled_players``: left-team players the agent controls (gfootball's ``number_of_left_players_agent_controls``);
      1 = one agent; more = a cooperative many-agent env (see below).
    - ``max_episode_steps``: a time limit shorter than the scenario's own ``game_duration`` (None: the scenario's).
    - ``engine_options``: further gfootball ``Config`` values (``action_set: v2``, ``physics_steps_per_frame``...).

    One agent: ``Discrete(19)`` actions, a float reward. Many agents (``controlled_players`` = N > 1): the layout of
    ``nervex.envs.multi_agent``: ``{'obs': (N, ...), 'global_state': ...}`` with ``global_state`` the agents'
    observations' element-wise maximum (they differ only in the active-player entries, so it is the shared view with
    every controlled player marked), ``MultiDiscrete([19] * N)`` actions, a ``(N,)`` reward (each agent gets the
    team's scoring reward and its own checkpoint rewards), ``team_reward: mean``.

    Episodes end as the scenario says: a goal, the ball out of play or lost (academy scenarios), which terminate, or
    the scenario's ``game_duration`` (400 steps in the academy) or ``max_episode_steps``, which truncate.
    ``info['score_reward']`` is each step's scoring reward (without checkpoints); at the episode's end
    ``info['episode_stats']`` holds ``goal`` (1.0 when the left team scored in the episode), ``win`` (1.0 when it
    scored more than it conceded) and ``score_reward`` (the goal difference), logged as ``eval/goal``... and as
    ``eval.csv`` columns.

    Seeding: ``seed(s)`` seeds a generator that draws each episode's ``game_engine_random_seed`` from the next reset
    on (and the action space); without a seed, episodes draw from fresh entropy. The gfootball env is built on first
    use in the process that steps it (each engine lives in one process), so a fresh ``FootballEnv`` pickles cheaply.

    Raises:
        ImportError: gfootball is not installed (the message names ``app_zoo/gfootball/install.sh``).
    """

    config: Dict[str, Any] = dict(
        env_name="academy_empty_goal_close",
        representation="simple115v2",
        stacked=False,
        rewards="scoring",
        controlled_players=1,
        channel_dimensions=[96, 72],
        max_episode_steps=None,
        engine_options={},
    )

    def __init__(self, cfg: Optional[Mapping[str, Any]] = None) -> None:
        merged = check_env_cfg(type(self), cfg)
        _check_cfg(merged)
        super().__init__(merged)
        self._agent_num: int = merged["controlled_players"]
        self._football: Any = None
        self._info: Optional[BaseEnvInfo] = None
        self._rng = np.random.default_rng()
        self._pending_seed: Optional[int] = None
        self._running = False
        self._episode_len = 0
        self._episode_return: Any = 0.0
        self._goals_for = 0
        self._goals_against = 0

    # ---- building ---------------------------------------------------------------------------------------------
    def _engine_options(self, engine_seed: int) -> Dict[str, Any]:
        return dict(copy.deepcopy(dict(self._cfg["engine_options"])), game_engine_random_seed=engine_seed)

    def _build(self, engine_seed: int) -> Any:
        cfg = self._cfg
        football = import_gfootball_env()
        self._check_scenario()
        self._football = football.create_environment(
            env_name=cfg["env_name"],
            stacked=bool(cfg["stacked"]),
            representation=cfg["representation"],
            rewards=cfg["rewards"],
            number_of_left_players_agent_controls=self._agent_num,
            channel_dimensions=tuple(cfg["channel_dimensions"]),
            other_config_options=self._engine_options(engine_seed),
        )
        if self._pending_seed is not None:
            self.info().act_space.seed(self._pending_seed)
        return self._football

    def _obs_shape(self) -> Tuple[int, ...]:
        cfg = self._cfg
        if cfg["representation"] != "extracted":
            return (SIMPLE115_DIM,)
        import_gfootball_env()
        from gfootball.env import config as football_config
        from gfootball.env import observation_preprocessing

        options = dict(cfg["engine_options"])
        layers = len(observation_preprocessing.get_smm_layers(football_config.Config(options)))
        width, height = cfg["channel_dimensions"]
        return (layers * (STACK if cfg["stacked"] else 1), height, width)

    def _check_scenario(self) -> None:
        """gfootball itself logs an unknown scenario and calls sys.exit(1): name it here instead."""
        import_gfootball_env()
        from gfootball.env import scenario_builder

        name, known = self._cfg["env_name"], sorted(scenario_builder.all_scenarios())
        if name not in known:
            close = difflib.get_close_matches(name, known, n=1)
            hint = f"did you mean '{close[0]}'? " if close else ""
            raise ValueError(f"gfootball config key 'env_name': unknown scenario {name!r}; {hint}scenarios: {known}")

    def _scenario_duration(self) -> int:
        """The scenario's ``game_duration`` (its steps; reading it builds the scenario, not the engine)."""
        self._check_scenario()
        from gfootball.env import config as football_config

        # a fixed engine seed: without one, gfootball's Config draws one from Python's global `random`
        options = {"level": self._cfg["env_name"], "game_engine_random_seed": 0}
        return int(football_config.Config(options).ScenarioConfig().game_duration)

    def _action_num(self) -> int:
        import_gfootball_env()
        from gfootball.env import football_action_set

        name = dict(self._cfg["engine_options"]).get("action_set", "default")
        if name not in football_action_set.action_set_dict:
            raise ValueError(
                f"gfootball engine_options.action_set {name!r} is not one of "
                f"{sorted(football_action_set.action_set_dict)}"
            )
        return len(football_action_set.action_set_dict[name])

    def info(self) -> BaseEnvInfo:
        """Spaces and agents, from the config (the engine is not started: a probe in the main process stays cheap)."""
        if self._info is not None:
            return self._info
        n, shape, actions = self._agent_num, self._obs_shape(), self._action_num()
        if self._cfg["representation"] == "extracted":
            one = gym.spaces.Box(0, 255, shape, np.uint8)
        else:
            one = gym.spaces.Box(-np.inf, np.inf, shape, np.float32)
        limit = self._scenario_duration()
        if self._cfg["max_episode_steps"] is not None:
            limit = min(limit, self._cfg["max_episode_steps"])
        if n == 1:
            self._info = BaseEnvInfo(
                agent_num=1, obs_space=one, act_space=gym.spaces.Discrete(actions), max_episode_steps=limit
            )
            return self._info
        many = gym.spaces.Box(
            np.broadcast_to(one.low, (n, *shape)), np.broadcast_to(one.high, (n, *shape)), (n, *shape), one.dtype
        )
        self._info = BaseEnvInfo(
            agent_num=n,
            obs_space=gym.spaces.Dict(obs=many, global_state=one),
            act_space=gym.spaces.MultiDiscrete([actions] * n),
            rew_space=gym.spaces.Box(-np.inf, np.inf, (n,), np.float64),
            max_episode_steps=limit,
            agent_ids=tuple(f"player_{i}" for i in range(n)),
            team_reward="mean",
            state_space=one,
        )
        return self._info

    # ---- observations -----------------------------------------------------------------------------------------
    def _convert_obs(self, raw: Any) -> Any:
        """gfootball's observation -> nervex's: float32 vectors, channel-first uint8 minimaps, the many-agent dict."""
        if self._cfg["representation"] == "extracted":
            obs = np.ascontiguousarray(np.moveaxis(np.asarray(raw, np.uint8), -1, -3))
        else:
            obs = np.asarray(raw, np.float32)
        if self._agent_num == 1:
            return obs
        return {"obs": obs, "global_state": obs.max(axis=0)}

    # ---- the contract -----------------------------------------------------------------------------------------
    def seed(self, seed: int) -> None:
        """Draw the engine seeds of the episodes from the next reset on from ``seed``; seed the action space."""
        self._pending_seed = int(seed)
        if self._info is not None:
            self._info.act_space.seed(self._pending_seed)

    def reset(self) -> Any:
        """Start an episode with a fresh engine seed and return its first observation."""
        if self._pending_seed is not None:
            self._rng = np.random.default_rng(self._pending_seed)
        engine_seed = int(self._rng.integers(0, 2**31 - 1))
        if self._football is None:
            self._build(engine_seed)
        else:
            # Config.NewScenario (called by reset) reads the episode's engine seed from the config's values
            self._football.unwrapped._config["game_engine_random_seed"] = engine_seed
        self._pending_seed = None
        raw = self._football.reset()
        self._running = True
        self._episode_len = 0
        self._episode_return = 0.0 if self._agent_num == 1 else np.zeros(self._agent_num, np.float64)
        self._goals_for = self._goals_against = 0
        return self._convert_obs(raw)

    def step(self, action: Any) -> BaseEnvTimestep:
        """Advance one step (see the class docstring for the reward, the end flags and ``info``).

        Raises:
            RuntimeError: no ``reset`` since construction or since the last ``done``.
            ValueError: an action that is not one of the env's per agent.
        """
        if not self._running:
            raise RuntimeError(f"{self!r}: step() before reset(); reset the env first and after every done step")
        raw_obs, raw_reward, done, engine_info = self._football.step(self._engine_action(action))
        if self._agent_num == 1:
            reward: Any = float(raw_reward)
        else:
            reward = np.asarray(raw_reward, np.float64).reshape(self._agent_num)
        score = int(engine_info.get("score_reward", 0))
        self._goals_for += score > 0
        self._goals_against += score < 0
        self._episode_return = self._episode_return + reward
        self._episode_len += 1
        info: Dict[str, Any] = {"score_reward": float(score)}
        limit = self._cfg["max_episode_steps"]
        out_of_time = self._steps_left() <= 0 or (limit is not None and self._episode_len >= limit)
        terminated = bool(done) and not out_of_time
        truncated = out_of_time
        info["terminated"], info["truncated"] = terminated, truncated
        if terminated or truncated:
            self._running = False
            ret = self._episode_return
            info["episode_return"] = float(ret) if self._agent_num == 1 else np.array(ret, np.float64)
            info["episode_len"] = self._episode_len
            info["episode_stats"] = self.episode_stats()
        return BaseEnvTimestep(self._convert_obs(raw_obs), reward, terminated or truncated, info)

    def episode_stats(self) -> Dict[str, float]:
        """``goal`` (the left team scored), ``win`` (it scored more than it conceded), ``score_reward`` (the difference)."""
        return {
            "goal": float(self._goals_for > 0),
            "win": float(self._goals_for > self._goals_against),
            "score_reward": float(self._goals_for - self._goals_against),
        }

    def _steps_left(self) -> int:
        """Steps left of the scenario's ``game_duration`` (0: the engine ended the episode on time)."""
        observation: List[Dict[str, Any]] = self._football.unwrapped.observation()
        return int(observation[0]["steps_left"])

    def _engine_action(self, action: Any) -> Any:
        space = self.info().act_space
        if self._agent_num == 1:
            try:
                value = int(np.asarray(action).item())
            except (TypeError, ValueError):
                raise ValueError(
                    f"{self!r}: the action must be one integer in 0..{space.n - 1}, got {action!r}"
                ) from None
            if not 0 <= value < space.n:
                raise ValueError(f"{self!r}: action {value} is not in 0..{space.n - 1}")
            return value
        actions = np.asarray(action, np.int64).reshape(-1)
        if actions.shape != (self._agent_num,) or (actions < 0).any() or (actions >= space.nvec).any():
            raise ValueError(
                f"{self!r}: the action must be one integer in 0..{int(space.nvec[0]) - 1} per controlled player, "
                f"shaped ({self._agent_num},), got {action!r}"
            )
        return actions.tolist()

    def close(self) -> None:
        """Close the gfootball env (its engine goes back to gfootball's per-process pool); safe to call twice."""
        env, self._football = self._football, None
        self._running = False
        if env is not None:
            env.close()

    # ---- pickling: config and pending seed only ----------------------------------------------------------------
    def __getstate__(self) -> Dict[str, Any]:
        state = self.__dict__.copy()
        state.update(_football=None, _info=None, _running=False)
        return state

    def __repr__(self) -> str:
        return f"{type(self).__name__}(env_name={self._cfg['env_name']!r}, players={self._agent_num})"


__all__ = ["FootballEnv", "REPRESENTATIONS", "REWARDS"]
