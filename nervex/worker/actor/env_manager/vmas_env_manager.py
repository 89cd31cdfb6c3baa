"""``VmasEnvManager`` (``manager_type: vmas``): ``env_num`` VMAS envs stepped as one batched torch call.

VMAS simulates a batch of envs at once, so the batch *is* the env manager: no subprocesses, one
``VmasBatch.step`` per manager step, and per-env views of the batch's arrays for the actor's
``{env_id: timestep}`` interface (the same contract as ``BaseEnvManager``: ``docs/internals.md``, "Env managers").

What differs from ``BaseEnvManager``, because the envs share one simulator:

- ``step`` must get an action for every env waiting for one (a batch cannot step some envs and hold the others);
  envs that have played their ``episode_num`` episodes are stepped with a zero action and ignored.
- ``seed(s)`` seeds the batch's one random stream: the first reset draws every env's start from it (env ``i`` starts
  from row ``i`` of that draw), later resets continue it. The same seed and actions give the same episodes.
- A VMAS exception is not an env failure to recover from (it would be every env's): it propagates; there are no
  restarts, and ``stats`` stays at zero.
"""

from __future__ import annotations

import math
from typing import Any, Dict, List, Mapping, Optional, Sequence, Union

import numpy as np

from nervex.envs.base_env import BaseEnvInfo, BaseEnvTimestep
from nervex.envs.gym_env import check_env_cfg
from nervex.envs.vmas_env import VmasBatch, VmasEnv
from nervex.utils.registry import ENV_MANAGER_REGISTRY

from .base_env_manager import expand_env_cfg

_new_timestep = tuple.__new__
_STATS = ("restarts", "dropped_episodes", "timeouts", "crashes", "exceptions", "reset_requests")


def _one_cfg(env_fn: Any, env_cfg: Union[Mapping[str, Any], Sequence[Mapping[str, Any]], None], env_num: int) -> Dict:
    """The one config every env of the batch shares (a list of configs must hold ``env_num`` equal ones)."""
    if not (isinstance(env_fn, type) and issubclass(env_fn, VmasEnv)):
        raise TypeError(
            f"manager_type 'vmas' steps VMAS scenarios only: env_fn must be VmasEnv (env_type 'vmas'), got {env_fn!r}; "
            "use manager_type 'base' or 'subprocess' for other envs"
        )
    if env_cfg is None or isinstance(env_cfg, Mapping):
        cfg = env_cfg or {}
    else:
        cfgs = expand_env_cfg(env_cfg, env_num)
        if any(c != cfgs[0] for c in cfgs[1:]):
            raise ValueError("manager_type 'vmas': every env of a VMAS batch runs one scenario; give one env config")
        cfg = cfgs[0]
    merged = check_env_cfg(env_fn, cfg)
    return {k: getattr(v, "default", v) for k, v in merged.items()}


class VmasEnvManager:
    """``env_num`` envs of one VMAS scenario as one batch, behind the env-manager interface.

    Args:
        env_fn: ``VmasEnv`` (the builder passes the ``env_type``'s class).
        env_cfg: The ``vmas`` env config (or a list of ``env_num`` equal ones).
        env_num: How many envs the batch holds.
        episode_num: Episodes each env plays before it leaves ``ready_obs`` (``inf``: keep playing).

    Raises:
        TypeError: ``env_fn`` is not ``VmasEnv``; ValueError: different configs per env, or a bad ``episode_num``.

    Example:
        >>> with VmasEnvManager(VmasEnv, {'scenario': 'simple_spread'}, env_num=32) as manager:
        ...     manager.seed(0)
        ...     manager.launch()
        ...     timesteps = manager.step({i: np.zeros(3, np.int64) for i in manager.ready_obs})
    """

    config: Dict[str, Any] = {}  # no options: the batch is the whole manager

    def __init__(
        self,
        env_fn: type,
        env_cfg: Union[Mapping[str, Any], Sequence[Mapping[str, Any]], None],
        env_num: int,
        episode_num: float = float("inf"),
    ) -> None:
        self._cfg = _one_cfg(env_fn, env_cfg, env_num)
        self._env_fn = env_fn
        self._env_num = env_num
        if not (episode_num == math.inf or (isinstance(episode_num, int) and episode_num >= 1)):
            raise ValueError(f"episode_num must be an int >= 1 or float('inf'), got {episode_num!r}")
        self._episode_num = episode_num
        self._batch: Optional[VmasBatch] = None
        self._env_info: Optional[BaseEnvInfo] = None
        self._pending_seed: Optional[int] = None
        self._ready: Dict[int, Any] = {}
        self._episode_count = np.zeros(env_num, np.int64)
        self._returns = np.zeros((env_num, 0))
        self._lens = np.zeros(env_num, np.int64)
        self._idle_action: Optional[np.ndarray] = None

    # ---- properties --------------------------------------------------------------------------------------------
    @property
    def env_num(self) -> int:
        return self._env_num

    @property
    def episode_num(self) -> float:
        return self._episode_num

    @property
    def ready_obs(self) -> Dict[int, Any]:
        """``{env_id: obs}`` of the envs waiting for an action, in env-id order (a new dict)."""
        self._check_launched("ready_obs")
        return dict(self._ready)

    @property
    def done(self) -> bool:
        """True when every env has played ``episode_num`` episodes."""
        return bool((self._episode_count >= self._episode_num).all())

    @property
    def stats(self) -> Dict[str, int]:
        """The failure counters of the env-manager interface: always zero (a VMAS error propagates)."""
        return dict.fromkeys(_STATS, 0)

    @property
    def launched(self) -> bool:
        return self._batch is not None

    # ---- seeding and lifecycle ---------------------------------------------------------------------------------
    def seed(self, seed: int) -> None:
        """The next ``launch``/``reset`` reseeds the batch's random stream with ``seed``."""
        if isinstance(seed, bool) or not isinstance(seed, int):
            raise TypeError(f"seed must be an int, got {seed!r}")
        self._pending_seed = seed

    def launch(self) -> None:
        """Build the batch and reset it (a launched manager just resets)."""
        if self._batch is None:
            self._batch = VmasBatch(self._cfg, self._env_num)
            self._env_info = self._batch.info
            shape = self._env_info.act_space.shape
            self._idle_action = np.zeros(shape, self._env_info.act_space.dtype)
        self.reset()

    def reset(self) -> None:
        """Reset every env (launching first if needed) and restart episode counting."""
        if self._batch is None:
            self.launch()
            return
        seed, self._pending_seed = self._pending_seed, None
        obs = self._batch.reset(seed)
        self._episode_count[:] = 0
        self._returns = np.zeros((self._env_num, self._batch.agent_num))
        self._lens[:] = 0
        self._ready = dict(enumerate(self._batch.env_obs(obs)))

    # ---- stepping ----------------------------------------------------------------------------------------------
    def step(self, actions: Mapping[int, Any]) -> Dict[int, BaseEnvTimestep]:
        """Step the batch: every env waiting for an action must have one in ``actions``.

        Returns:
            ``{env_id: timestep}`` for every env in ``actions``; a done env is reset at once (its first observation
            in ``ready_obs``) unless it has played ``episode_num`` episodes.

        Raises:
            KeyError: ``actions`` names an env that is not waiting for one, or leaves out one that is.
            ValueError: an action of the wrong shape, an out-of-range index, a non-finite continuous action.
        """
        self._check_launched("step")
        if actions.keys() != self._ready.keys():
            raise self._mismatch_error(actions)
        if not actions:
            return {}  # every env has played its episodes: nothing to step
        env_ids = list(actions)
        obs, reward, terminated, truncated = self._step_batch(env_ids, list(actions.values()))
        self._returns += reward
        self._lens += 1
        done = terminated | truncated
        env_obs, rewards = self._batch.env_obs(obs), list(reward)  # per-env views, made at C speed
        if not done.any():  # most steps: one comprehension, no branch per env
            self._ready = {env_id: env_obs[env_id] for env_id in env_ids}
            return {
                env_id: _new_timestep(
                    BaseEnvTimestep,
                    (env_obs[env_id], rewards[env_id], False, {"terminated": False, "truncated": False}),
                )
                for env_id in env_ids
            }
        out: Dict[int, BaseEnvTimestep] = {}
        ended: List[int] = []
        ready = self._ready = {}
        for env_id in env_ids:
            if done[env_id]:
                ended.append(env_id)
                info = dict(
                    terminated=bool(terminated[env_id]),
                    truncated=bool(truncated[env_id]),
                    episode_return=self._returns[env_id].copy(),
                    episode_len=int(self._lens[env_id]),
                )
            else:
                info = {"terminated": False, "truncated": False}
                ready[env_id] = env_obs[env_id]
            out[env_id] = _new_timestep(BaseEnvTimestep, (env_obs[env_id], rewards[env_id], bool(done[env_id]), info))
        if ended:
            self._end_episodes(ended)
        return out

    def _step_batch(self, env_ids: List[int], actions: List[Any]) -> Any:
        """Stack the actions into the batch's array (idle envs get a zero action), check them, step."""
        batch, n = self._batch, self._env_num
        try:
            stacked = np.array(actions)  # 2.5x faster than np.stack on many small arrays
        except ValueError:
            stacked = None  # ragged shapes: find the culprit below
        want = self._idle_action.shape
        if stacked is None or stacked.dtype == object or stacked.shape[1:] != want:
            for env_id, action in zip(env_ids, actions):
                if np.shape(action) != want:
                    raise batch.action_shape_error(env_id, action)
        stacked = batch.check_actions(stacked, env_ids)
        if len(env_ids) == n and env_ids == list(range(n)):
            full = stacked
        else:
            full = np.broadcast_to(self._idle_action, (n, *want)).copy()
            full[env_ids] = stacked
        return batch.step(full)

    def _end_episodes(self, ended: List[int]) -> None:
        """Count the episodes that ended; reset the envs that play on (all at once when the whole batch ended)."""
        count = self._episode_count
        count[ended] += 1
        again = [env_id for env_id in ended if count[env_id] < self._episode_num]
        self._returns[ended] = 0.0
        self._lens[ended] = 0
        if not again:
            return
        if len(again) == self._env_num:
            obs = self._batch.reset()  # one batched reset instead of env_num reset_at calls
        else:
            obs = self._batch.reset_at(again)
        env_obs = self._batch.env_obs(obs)
        for env_id in again:
            self._ready[env_id] = env_obs[env_id]
        if len(self._ready) > len(again):
            self._ready = dict(sorted(self._ready.items()))

    def _mismatch_error(self, actions: Mapping[int, Any]) -> KeyError:
        extra = sorted(set(actions) - set(self._ready), key=str)
        missing = sorted(set(self._ready) - set(actions))
        if extra:
            why = f"env(s) {extra} are not waiting for an action (envs 0..{self._env_num - 1}; finished or unknown)"
        else:
            why = f"env(s) {missing} are waiting but got no action: a VMAS batch steps every waiting env at once"
        return KeyError(f"VmasEnvManager.step: {why}; ready: {sorted(self._ready)}")

    def _check_launched(self, what: str) -> None:
        if self._batch is None:
            raise RuntimeError(f"VmasEnvManager.{what}: the manager is not launched; call launch() or reset()")

    # ---- info and closing --------------------------------------------------------------------------------------
    def env_info(self) -> BaseEnvInfo:
        """One env's ``BaseEnvInfo`` (from a batch of one when the manager is not launched)."""
        if self._env_info is None:
            probe = self._env_fn(self._cfg)
            try:
                self._env_info = probe.info()
            finally:
                probe.close()
        return self._env_info

    def close(self) -> None:
        """Drop the batch; safe to call twice. ``launch()`` builds a new one."""
        if self._batch is not None:
            self._batch.close()
        self._batch = None
        self._ready = {}

    def __enter__(self) -> VmasEnvManager:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"VmasEnvManager(scenario={self._cfg['scenario']!r}, env_num={self._env_num})"


ENV_MANAGER_REGISTRY.register("vmas", VmasEnvManager)
