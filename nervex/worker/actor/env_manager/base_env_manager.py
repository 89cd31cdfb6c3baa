"""``BaseEnvManager``: several envs stepped in the main process, with auto-reset and episode counting.

The contract (``docs/internals.md``, "Env managers") is shared with ``SubprocessEnvManager``:
``seed`` -> ``launch``/``reset`` -> loop { ``ready_obs`` -> ``step({env_id: action})`` } -> ``close``.

Failures. An env may raise ``EnvResetRequest`` from ``step``: the manager resets it. Any other exception makes
the manager rebuild the env with ``env_fn`` (up to ``max_retry`` consecutive times, waiting ``retry_delay`` before
each retry after the first); with ``max_retry=0`` it raises :class:`EnvError` at once. Either way the episode in
progress is dropped: the step returns for that env an *abnormal* timestep (see :func:`abnormal_timestep`) and the
env shows up in ``ready_obs`` with the first observation of a fresh episode.
"""

from __future__ import annotations

import copy
import math
import time
import traceback
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, Union

from nervex.config import Field, signature_config
from nervex.envs.base_env import BaseEnv, BaseEnvInfo, BaseEnvTimestep, EnvResetRequest
from nervex.utils.registry import ENV_MANAGER_REGISTRY

EnvFn = Callable[[Any], BaseEnv]
_MISSING = object()
_new_timestep = tuple.__new__


class EnvError(RuntimeError):
    """An env failed and its manager could not recover (retries exhausted, or ``max_retry=0``).

    Attributes:
        env_id: The env that failed.
        child_traceback: The traceback text of the exception where it was raised (in the child process for
            ``SubprocessEnvManager``); empty when the env's process died without one (killed by a signal).
    """

    def __init__(self, message: str, env_id: Optional[int] = None, child_traceback: str = "") -> None:
        super().__init__(message)
        self.env_id = env_id
        self.child_traceback = child_traceback


def abnormal_timestep(env_id: int, obs: Any, reason: str, error: str = "", tb: str = "") -> BaseEnvTimestep:
    """The timestep a manager returns for an env whose episode was cut by a failure (or an ``EnvResetRequest``).

    It has ``done=True``, ``reward=0.0``, ``obs`` = the observation the action was chosen on, and ``info`` with
    ``abnormal=True``, ``terminated=False``, ``truncated=False``, ``reason`` (``'exception'``, ``'crash'``,
    ``'timeout'`` or ``'reset_request'``), ``error`` and ``traceback`` (text), ``env_id``. It carries no
    ``episode_return``.

    How an actor treats it: drop the env's unfinished trajectory (never stitch it to the next episode), learn
    nothing from this timestep, do not count it as an episode, reset the policy's per-env state, and take the
    env's next observation from ``ready_obs`` as the start of a new episode.
    """
    info = dict(
        abnormal=True, terminated=False, truncated=False, reason=reason, error=error, traceback=tb, env_id=env_id
    )
    return _new_timestep(BaseEnvTimestep, (obs, 0.0, True, info))


def expand_env_cfg(env_cfg: Union[Mapping[str, Any], Sequence[Mapping[str, Any]], None], env_num: int) -> List[Any]:
    """One config per env: a mapping is deep-copied ``env_num`` times, a list must have ``env_num`` entries."""
    if not isinstance(env_num, int) or isinstance(env_num, bool) or env_num < 1:
        raise ValueError(f"env_num must be an int >= 1, got {env_num!r}")
    if env_cfg is None or isinstance(env_cfg, Mapping):
        return [copy.deepcopy(env_cfg) for _ in range(env_num)]
    cfgs = list(env_cfg)
    if len(cfgs) != env_num:
        raise ValueError(f"env_cfg is a list of {len(cfgs)} configs but env_num={env_num}; give one per env")
    return [copy.deepcopy(c) for c in cfgs]


def describe_exception(e: BaseException) -> str:
    return f"{type(e).__name__}: {e}"


class BaseEnvManager:
    """Steps ``env_num`` envs one after the other in this process (the fastest choice for envs that step in
    microseconds, such as classic control: no inter-process round trip).

    Args:
        env_fn: Builds one env from one config: an env class or a picklable function ``cfg -> BaseEnv``.
        env_cfg: One config (copied for every env) or a list of ``env_num`` configs.
        env_num: How many envs.
        episode_num: Episodes each env plays before it leaves ``ready_obs`` (``inf``: keep playing).
        max_retry: Consecutive failures of one env (an exception from ``step``/``reset``) that are answered by
            rebuilding it; one more raises :class:`EnvError`. ``0``: raise on the first failure.
        retry_delay: Seconds to wait before the second and later consecutive rebuild of the same env.

    Example:
        >>> with BaseEnvManager(CartPoleEnv, {}, env_num=4) as manager:
        ...     manager.seed(0)
        ...     manager.launch()
        ...     while True:
        ...         timesteps = manager.step({i: 0 for i in manager.ready_obs})
    """

    def __init__(
        self,
        env_fn: EnvFn,
        env_cfg: Union[Mapping[str, Any], Sequence[Mapping[str, Any]], None],
        env_num: int,
        episode_num: float = float("inf"),
        max_retry: int = 0,
        retry_delay: float = 0.0,
    ) -> None:
        if not callable(env_fn):
            raise TypeError(f"env_fn must build an env from a config (an env class or function), got {env_fn!r}")
        self._env_fn = env_fn
        self._env_cfgs = expand_env_cfg(env_cfg, env_num)
        self._env_num = env_num
        if not (episode_num == math.inf or (isinstance(episode_num, int) and episode_num >= 1)):
            raise ValueError(f"episode_num must be an int >= 1 or float('inf'), got {episode_num!r}")
        self._episode_num = episode_num
        if max_retry < 0 or retry_delay < 0:
            raise ValueError(f"max_retry and retry_delay must be >= 0, got {max_retry!r} and {retry_delay!r}")
        self._max_retry = int(max_retry)
        self._retry_delay = float(retry_delay)
        self._seed: Optional[int] = None
        self._pending_seeds: Dict[int, int] = {}  # consumed by each env's next manager reset
        self._restarts_of = [0] * env_num
        self._failing: Dict[int, int] = {}  # env id -> consecutive failures (cleared by a good step)
        self._episode_count = [0] * env_num
        self._finished_num = 0
        self._ready: Dict[int, Any] = {}
        self._launched = False
        self._closed = False
        self._env_info: Optional[BaseEnvInfo] = None
        self._stats = dict(restarts=0, dropped_episodes=0, timeouts=0, crashes=0, exceptions=0, reset_requests=0)
        self._envs: List[Optional[BaseEnv]] = []

    # in-process envs that raise are usually buggy: surface the error at once (max_retry 0)
    config = signature_config(
        __init__,
        skip=("env_fn", "env_cfg", "env_num", "episode_num"),
        max_retry=Field(..., ge=0),
        retry_delay=Field(..., ge=0),
    )

    # ---- properties --------------------------------------------------------------------------------------------
    @property
    def env_num(self) -> int:
        return self._env_num

    @property
    def episode_num(self) -> float:
        return self._episode_num

    @property
    def ready_obs(self) -> Dict[int, Any]:
        """``{env_id: obs}`` of the envs waiting for an action (a new dict: later steps do not change it)."""
        self._check_launched("ready_obs")
        # env-id order: subprocess workers fill _ready as they answer, and the actor's random draws follow this order
        return {env_id: self._ready[env_id] for env_id in sorted(self._ready)}

    @property
    def done(self) -> bool:
        """True when every env has played ``episode_num`` episodes."""
        return self._finished_num == self._env_num

    @property
    def stats(self) -> Dict[str, int]:
        """Failure counters since construction: ``restarts`` (env rebuilds), ``dropped_episodes`` (abnormal
        timesteps returned), ``timeouts``, ``crashes`` (processes that died), ``exceptions``, ``reset_requests``."""
        return dict(self._stats)

    @property
    def launched(self) -> bool:
        return self._launched

    # ---- seeding and lifecycle ---------------------------------------------------------------------------------
    def seed(self, seed: int) -> None:
        """Env ``i`` uses ``seed + i`` at its next reset (a rebuilt env uses ``seed + i + env_num * k`` for its
        ``k``-th rebuild); auto-resets continue each env's random stream."""
        if isinstance(seed, bool) or not isinstance(seed, int):
            raise TypeError(f"seed must be an int, got {seed!r}")
        self._seed = seed
        self._pending_seeds = {i: seed + i for i in range(self._env_num)}

    def _restart_seed(self, env_id: int) -> Optional[int]:
        self._restarts_of[env_id] += 1
        if self._seed is None:
            return None
        return self._seed + env_id + self._env_num * self._restarts_of[env_id]

    def launch(self) -> None:
        """Build the envs and reset them (a launched manager just resets)."""
        if not self._launched:
            self._envs = [None] * self._env_num
            self._launched = True
            self._closed = False
        self.reset()

    def reset(self) -> None:
        """Reset every env (launching first if needed) and restart episode counting."""
        if not self._launched:
            self.launch()
            return
        self._ready.clear()
        self._episode_count = [0] * self._env_num
        self._finished_num = 0
        for env_id in range(self._env_num):
            self._reset_env(env_id, self._pending_seeds.pop(env_id, None))

    def _reset_env(self, env_id: int, seed: Optional[int]) -> None:
        try:
            env = self._envs[env_id]
            if env is None:
                env = self._envs[env_id] = self._env_fn(self._env_cfgs[env_id])
            if seed is not None:
                env.seed(seed)
            self._ready[env_id] = env.reset()
        except Exception as e:  # noqa: BLE001 - any failure of a user env goes through the retry policy
            self._recover(env_id, e, traceback.format_exc())

    def _recover(self, env_id: int, error: BaseException, tb: str) -> None:
        """Rebuild a failed env and reset it, within the retry budget; raise :class:`EnvError` beyond it."""
        self._stats["exceptions"] += 1
        failures = self._failing[env_id] = self._failing.get(env_id, 0) + 1
        if failures > self._max_retry:
            raise EnvError(
                f"env {env_id} failed {failures} time(s) in a row (max_retry={self._max_retry}); last error: "
                f"{describe_exception(error)}\n--- traceback of env {env_id} ---\n{tb}",
                env_id=env_id,
                child_traceback=tb,
            ) from error
        if failures > 1:
            time.sleep(self._retry_delay)
        self._stats["restarts"] += 1
        old, self._envs[env_id] = self._envs[env_id], None
        if old is not None:
            try:
                old.close()
            except Exception:  # noqa: BLE001 - a broken env may fail to close; it is replaced anyway
                pass
        self._reset_env(env_id, self._restart_seed(env_id))

    # ---- stepping ----------------------------------------------------------------------------------------------
    def step(self, actions: Mapping[int, Any]) -> Dict[int, BaseEnvTimestep]:
        """Step the envs named in ``actions``.

        Returns:
            ``{env_id: timestep}`` for every env in ``actions``. A ``done`` env is reset at once (its new first
            observation is in ``ready_obs``) unless it has played ``episode_num`` episodes.

        Raises:
            KeyError: an env id that is not waiting for an action.
            EnvError: an env failed beyond ``max_retry``.
        """
        ready, envs, failing, out = self._ready, self._envs, self._failing, {}
        for env_id, action in actions.items():
            obs = ready.pop(env_id, _MISSING)
            if obs is _MISSING:
                raise self._not_ready_error(env_id)
            try:
                timestep = envs[env_id].step(action)
            except EnvResetRequest as e:
                timestep = self._on_reset_request(env_id, obs, e)
            except Exception as e:  # noqa: BLE001 - user env code: the retry policy decides
                tb = traceback.format_exc()
                self._recover(env_id, e, tb)
                self._stats["dropped_episodes"] += 1
                timestep = abnormal_timestep(env_id, obs, "exception", describe_exception(e), tb)
            else:
                if failing:
                    failing.pop(env_id, None)
                if timestep.done:
                    self._end_episode(env_id)
                else:
                    ready[env_id] = timestep.obs
            out[env_id] = timestep
        return out

    def _end_episode(self, env_id: int) -> None:
        self._episode_count[env_id] += 1
        if self._episode_count[env_id] < self._episode_num:
            self._reset_env(env_id, None)
        else:
            self._finished_num += 1

    def _on_reset_request(self, env_id: int, obs: Any, request: EnvResetRequest) -> BaseEnvTimestep:
        self._stats["reset_requests"] += 1
        self._stats["dropped_episodes"] += 1
        self._reset_env(env_id, None)
        return abnormal_timestep(env_id, obs, "reset_request", describe_exception(request))

    def _check_launched(self, what: str) -> None:
        if not self._launched:
            raise RuntimeError(f"{type(self).__name__}.{what}: the manager is not launched; call launch() or reset()")

    def _not_ready_error(self, env_id: Any) -> KeyError:
        self._check_launched("step")
        if not isinstance(env_id, int) or not 0 <= env_id < self._env_num:
            why = f"there are envs 0..{self._env_num - 1}"
        elif self._episode_count[env_id] >= self._episode_num:
            why = f"it has played its episode_num={self._episode_num} episodes"
        else:
            why = "it is still stepping (async mode) or was already given an action"
        return KeyError(f"step: env {env_id!r} is not waiting for an action: {why}; ready: {sorted(self._ready)}")

    # ---- info and closing --------------------------------------------------------------------------------------
    def env_info(self) -> BaseEnvInfo:
        """The ``BaseEnvInfo`` of env 0 (built from a probe env when the manager is not launched)."""
        if self._env_info is None:
            if self._envs and self._envs[0] is not None:
                self._env_info = self._envs[0].info()
            else:
                probe = self._env_fn(copy.deepcopy(self._env_cfgs[0]))
                try:
                    self._env_info = probe.info()
                finally:
                    probe.close()
        return self._env_info

    def close(self) -> None:
        """Close every env; safe to call twice. ``launch()`` starts again from scratch."""
        envs, self._envs = self._envs, []
        self._launched = False
        self._closed = True
        self._ready.clear()
        for env in envs:
            if env is not None:
                try:
                    env.close()
                except Exception:  # noqa: BLE001 - closing the others matters more than one env's close error
                    pass

    def __enter__(self) -> BaseEnvManager:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"{type(self).__name__}(env_num={self._env_num}, episode_num={self._episode_num})"


ENV_MANAGER_REGISTRY.register("base", BaseEnvManager)
