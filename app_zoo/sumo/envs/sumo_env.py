"""sumo-rl's single-intersection traffic-signal task on libsumo as a nervex env (registered as ``'sumo'``)."""

from __future__ import annotations

import itertools
from typing import Any, Dict, Mapping, Optional

import numpy as np

from nervex.envs import BaseEnv, BaseEnvInfo, BaseEnvTimestep
from nervex.envs.gym_env import check_env_cfg
from nervex.utils import ENV_REGISTRY

from .backend import SCENARIOS
from .common import SUMO_KEYS, EpisodeFigures, EpisodeSeeds, SumoBuild, check_sumo_keys

_instance_ids = itertools.count()


@ENV_REGISTRY.register("sumo")
class SumoEnv(BaseEnv):
    """One SUMO traffic light driven by the agent (sumo-rl's ``SumoEnvironment``, ``single_agent=True``, libsumo).

    Config keys (``SumoEnv.config``):

    - ``scenario``: a net and routes shipped with sumo-rl: ``'single-intersection'`` (one light, two one-way
      two-lane roads, 0.5 veh/s west-east and 0.2 veh/s north-south drawn per second by SUMO's seed).
    - ``net_file``, ``route_file``: paths replacing the scenario's (``None``: the scenario's).
    - ``num_seconds``: simulated seconds per episode (the time limit: ``truncated``, never ``terminated``).
    - ``delta_time``: simulated seconds per decision (one env step); ``yellow_time``: the yellow phase between two
      greens; ``min_green``: green seconds before the agent may switch again (also the actuated program's
      ``minDur``); ``actuated_max_green``: the actuated program's ``maxDur``.
    - ``reward_fn``: a sumo-rl reward (``'diff-waiting-time'``: the drop of the accumulated waiting time at the
      light's lanes / 100 s; ``'queue'``, ``'pressure'``, ``'average-speed'``).
    - ``control``: ``'agent'`` (actions pick the next green phase), ``'fixed'`` (the net's static program; actions
      are ignored) or ``'actuated'`` (SUMO's gap-based actuated control of the same phases; actions ignored). The
      two baselines run through this same env so that they are measured exactly as the agent is.

    Observation: sumo-rl's default, float32 in ``[0, 1]``: the green phase one-hot, whether ``min_green`` has passed,
    each incoming lane's density and queue. Action: ``Discrete(number of green phases)``.

    Episode figures (``info['episode_stats']`` at the end, ``eval/<name>`` in ``eval.csv``): means over the
    episode's decision steps of sumo-rl's system figures: ``mean_waiting_time`` (the mean over vehicles in the
    network of their current waiting time, sumo-rl's ``system_mean_waiting_time``; the benchmark's metric),
    ``total_waiting_time``, ``mean_stopped`` (vehicles below 0.1 m/s) and ``mean_speed``; and per vehicle
    ``vehicle_waiting_time`` (mean accumulated waiting time of the vehicles seen) and ``vehicles`` (see
    :class:`~app_zoo.sumo.envs.common.EpisodeFigures`). ``info['sumo_seed']`` names the episode's SUMO seed.

    Seeding: episode ``k`` after ``seed(s)`` runs SUMO with the ``k``-th draw of ``numpy.random.default_rng(s)``
    (the routes' vehicle departures are random), so one seed reproduces a run. libsumo allows one simulation per
    process: a second ``SumoEnv`` built in a process whose simulation is taken raises ``LibsumoBusyError``.
    """

    config: Dict[str, Any] = dict(scenario="single-intersection", **SUMO_KEYS)

    def __init__(self, cfg: Optional[Mapping[str, Any]] = None) -> None:
        merged = check_env_cfg(type(self), cfg)
        super().__init__(merged)
        if merged["scenario"] not in SCENARIOS:
            raise ValueError(
                f"SumoEnv config key 'scenario' must be one of {sorted(SCENARIOS)}, got {merged['scenario']!r}"
            )
        self._keys = check_sumo_keys(merged, "SumoEnv")
        self._who = f"SumoEnv#{next(_instance_ids)}(scenario={merged['scenario']!r})"
        self._build: Optional[SumoBuild] = None
        self._env: Any = None
        self._info: Optional[BaseEnvInfo] = None
        self._seeds = EpisodeSeeds()
        self._figures = EpisodeFigures()
        self._sumo_seed: Optional[int] = None
        self._action_seed: Optional[int] = None  # seed() before the env is built seeds its action space at the build
        self._running = False
        self._return = 0.0
        self._len = 0

    # ---- building ---------------------------------------------------------------------------------------------
    def _make(self) -> Any:
        build = SumoBuild(self._who, self._cfg["scenario"], self._keys)
        try:
            env = build.sumo_rl.SumoEnvironment(single_agent=True, **build.kwargs())
            if len(env.ts_ids) != 1:
                raise ValueError(
                    f"{self._who}: the net has {len(env.ts_ids)} traffic lights; SumoEnv drives one (the grid is the "
                    f"multi-agent env 'sumo_grid')"
                )
        except BaseException:
            build.release()
            raise
        self._build, self._env = build, env
        steps = -(-self._keys["num_seconds"] // self._keys["delta_time"])
        self._info = BaseEnvInfo(
            agent_num=1, obs_space=env.observation_space, act_space=env.action_space, max_episode_steps=steps
        )
        if self._action_seed is not None:
            env.action_space.seed(self._action_seed)
        return env

    @property
    def sumo_env(self) -> Any:
        """sumo-rl's ``SumoEnvironment`` inside (built on first use; takes the process's libsumo slot)."""
        return self._env if self._env is not None else self._make()

    @property
    def figures(self) -> EpisodeFigures:
        """The traffic figures of the episode under way (or of the last one)."""
        return self._figures

    # ---- the contract -----------------------------------------------------------------------------------------
    def seed(self, seed: int) -> None:
        """Episode ``k`` after this call uses the ``k``-th draw of ``default_rng(seed)`` as SUMO's seed."""
        self._seeds.seed(seed)
        self._action_seed = int(seed)
        if self._info is not None:
            self._info.act_space.seed(self._action_seed)

    def reset(self) -> np.ndarray:
        """Start a simulation with the next episode's SUMO seed; return the first observation."""
        env = self.sumo_env
        self._sumo_seed = self._seeds.next()
        obs, _ = env.reset(seed=self._sumo_seed)
        self._build.select_program(env)
        self._figures = EpisodeFigures()
        self._running, self._return, self._len = True, 0.0, 0
        return obs

    def step(self, action: Any) -> BaseEnvTimestep:
        """Apply the green phase ``action`` (ignored under ``control: fixed/actuated``) for ``delta_time`` seconds.

        Raises:
            RuntimeError: no ``reset`` since construction or the last done step.
            ValueError: an action outside ``Discrete(n)``.
        """
        if not self._running:
            raise RuntimeError(f"{self._who}: step() before reset(); reset the env first and after every done step")
        index = int(np.asarray(action).reshape(-1)[0]) if np.ndim(action) else int(action)
        n = int(self._info.act_space.n)
        if not 0 <= index < n:
            raise ValueError(f"{self._who}: action {index} is outside Discrete({n})")
        obs, reward, terminated, truncated, info = self._env.step(index)
        reward = float(reward)
        self._figures.add(info, self._env.sumo)
        self._return += reward
        self._len += 1
        done = bool(terminated or truncated)
        out = {"terminated": bool(terminated), "truncated": bool(truncated)}
        if done:
            self._running = False
            out.update(
                episode_return=self._return,
                episode_len=self._len,
                episode_stats=self._figures.means(),
                sumo_seed=self._sumo_seed,
            )
        return BaseEnvTimestep(obs, reward, done, out)

    def info(self) -> BaseEnvInfo:
        """Spaces and the time limit in decisions (``ceil(num_seconds / delta_time)``); builds the env once."""
        if self._info is None:
            self._make()
        return self._info

    def close(self) -> None:
        """Stop the simulation and free the process's libsumo slot; safe to call twice."""
        env, build = self._env, self._build
        self._env, self._build, self._running = None, None, False
        try:
            if env is not None:
                env.close()
        finally:
            if build is not None:
                build.release()

    def __getstate__(self) -> Dict[str, Any]:
        state = self.__dict__.copy()
        state.update(_env=None, _build=None, _running=False)
        return state

    def __repr__(self) -> str:
        return self._who


__all__ = ["SumoEnv"]
