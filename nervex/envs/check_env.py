"""``check_env``: check that an env keeps the nervex env contract (and Gymnasium's, for the gym env inside).

The contract (see ``docs/internals.md``): ``reset()`` returns an observation inside ``info().obs_space``; ``step``
returns a ``BaseEnvTimestep`` with an observation in that space, a Python ``float`` reward (a float ndarray shaped
like ``info().rew_space`` for per-agent rewards), a ``bool`` ``done`` equal to ``info['terminated'] or
info['truncated']`` (both ``bool``); a ``done`` step's info carries ``episode_return`` (the sum of the episode's
rewards, per agent where rewards are) and ``episode_len`` (and, for games, ``outcome`` in {-1, 0, 1} per seat);
random actions respect the observation's ``action_mask`` when it has one; ``seed(s)`` makes the next rollout reproducible;
``close()`` may be called twice.

Two documented refinements, for envs that reshape rewards or episodes (``app_zoo.atari``):

- an env that transforms rewards (clipping) reports the untransformed one in ``info['raw_reward']``;
  ``episode_return`` is then the sum of those, the return users read in logs;
- an env may end a *learning* episode inside a longer one (episodic life: a lost life terminates, the game goes
  on). Such a ``done`` says ``info['game_over'] = False`` and carries no ``episode_return``; the return and length
  reported at the real end cover the whole game, from the last reported end.
"""

from __future__ import annotations

import copy
import warnings
from typing import Any, Dict, List, Optional, Tuple

import gymnasium as gym
import numpy as np

from .base_env import BaseEnv, BaseEnvInfo, BaseEnvTimestep
from .multi_agent import TEAM_REDUCTIONS, reward_shape, sample_action

# attributes under which nervex envs keep the Gymnasium env they wrap, in the order they are tried
GYM_ENV_ATTRS = ("gym_env", "_gym_env", "_env", "env")
SEED_PROBES = 3  # different seeds tried before concluding that the seed has no effect


class EnvCheckError(AssertionError):
    """An env breaks the nervex env contract; the message names the property, the step and what was expected."""


def find_gym_env(env: BaseEnv) -> Optional[gym.Env]:
    """Return the Gymnasium env inside a nervex env (looked up as ``gym_env``, ``_gym_env``, ``_env``, ``env``)."""
    for attr in GYM_ENV_ATTRS:
        inner = getattr(env, attr, None)
        if isinstance(inner, gym.Env):
            return inner
    return None


def check_env(env: BaseEnv, n_steps: int = 200, seed: int = 0, deterministic: bool = False) -> None:
    """Check ``env`` against the nervex env contract; raise on the first property it breaks.

    Runs Gymnasium's own checker on the gym env inside (when there is one, found by :func:`find_gym_env`), then
    plays ``n_steps`` random actions (resetting after every ``done``, checking every step): twice with seed ``seed``
    (must be identical), then with seeds ``seed + 1``... (up to 3) but the same actions, until one differs (one must,
    unless ``deterministic``). Finally closes ``env`` twice.

    Args:
        env: The env to check; it is seeded, stepped and closed.
        n_steps: Steps per rollout; long enough to see some episode ends makes the episode checks bite.
        seed: Seed of the env and of the random actions.
        deterministic: The env has no randomness by design: skip the "a different seed differs" check.

    Raises:
        EnvCheckError: naming the failed property, e.g. ``step 3: reward must be a Python float, got ndarray``.
    """
    env_info = env.info()
    _check_env_info(env_info)
    gym_env = find_gym_env(env)
    if gym_env is not None:
        _run_gymnasium_checker(gym_env)
    first = _rollout(env, env_info, n_steps, env_seed=seed, action_seed=seed)
    second = _rollout(env, env_info, n_steps, env_seed=seed, action_seed=seed)
    diff = _first_difference(first, second)
    if diff is not None:
        raise EnvCheckError(
            f"seeding: two rollouts after env.seed({seed}) with the same actions differ at {diff}; seed() must make "
            f"the next reset (and everything after it) reproducible"
        )
    if not deterministic:
        _check_seed_matters(env, env_info, n_steps, seed, first)
    env.close()
    try:
        env.close()
    except Exception as e:  # noqa: BLE001 - any exception here is the finding
        raise EnvCheckError(f"close: a second env.close() raised {type(e).__name__}: {e}; it must be a no-op") from e


def _check_env_info(env_info: Any) -> None:
    if not isinstance(env_info, BaseEnvInfo):
        raise EnvCheckError(f"info(): must return a BaseEnvInfo, got {type(env_info).__name__}")
    for name in ("obs_space", "act_space"):
        space = getattr(env_info, name)
        if not isinstance(space, gym.Space):
            raise EnvCheckError(f"info().{name} must be a gymnasium.Space, got {type(space).__name__}")
    if env_info.rew_space is not None and not isinstance(env_info.rew_space, gym.Space):
        raise EnvCheckError(f"info().rew_space must be None or a gymnasium.Space, got {env_info.rew_space!r}")
    if not isinstance(env_info.agent_num, int) or env_info.agent_num < 1:
        raise EnvCheckError(f"info().agent_num must be an int >= 1, got {env_info.agent_num!r}")
    steps = env_info.max_episode_steps
    if steps is not None and (not isinstance(steps, int) or steps < 1):
        raise EnvCheckError(f"info().max_episode_steps must be None or an int >= 1, got {steps!r}")
    _check_agents_info(env_info)


def _check_agents_info(env_info: BaseEnvInfo) -> None:
    """The many-agent fields: agent ids match agent_num, a known team reduction, a reward shape () or (agent_num,)."""
    ids = env_info.agent_ids
    if not isinstance(ids, tuple) or not all(isinstance(a, str) for a in ids) or len(set(ids)) != len(ids):
        raise EnvCheckError(f"info().agent_ids must be a tuple of distinct str, got {ids!r}")
    if ids and len(ids) != env_info.agent_num:
        raise EnvCheckError(f"info().agent_num = {env_info.agent_num} but agent_ids names {len(ids)}: {list(ids)}")
    if env_info.team_reward not in TEAM_REDUCTIONS:
        raise EnvCheckError(f"info().team_reward must be one of {TEAM_REDUCTIONS}, got {env_info.team_reward!r}")
    shape = reward_shape(env_info)
    if shape not in ((), (env_info.agent_num,)):
        raise EnvCheckError(
            f"info().rew_space has shape {shape}; it must be () (a scalar reward) or ({env_info.agent_num},) "
            f"(one reward per agent)"
        )
    if env_info.state_space is not None and not isinstance(env_info.state_space, gym.Space):
        raise EnvCheckError(f"info().state_space must be None or a gymnasium.Space, got {env_info.state_space!r}")
    if env_info.turn_based and not _has_key(env_info.obs_space, "to_play"):
        raise EnvCheckError("info().turn_based is True but obs_space has no 'to_play' key; the acting seat is unknown")


def _has_key(space: gym.Space, key: str) -> bool:
    return isinstance(space, gym.spaces.Dict) and key in space.spaces


def _run_gymnasium_checker(gym_env: gym.Env) -> None:
    from gymnasium.utils.env_checker import check_env as gym_check_env

    with warnings.catch_warnings():
        # nervex envs wrap their gym env on purpose: the wrapped stack is what must follow the API
        warnings.filterwarnings("ignore", message=".*is different from the unwrapped version.*")
        try:
            gym_check_env(gym_env, skip_render_check=True, skip_close_check=True)
        except Exception as e:  # noqa: BLE001 - Gymnasium raises assorted types; all mean the same here
            name = gym_env.spec.id if gym_env.spec is not None else type(gym_env).__name__
            raise EnvCheckError(
                f"gymnasium check_env failed on the gym env inside ({name}): {type(e).__name__}: {e}"
            ) from e


def _contains(space: gym.Space, obs: Any) -> bool:
    try:
        return bool(space.contains(obs))
    except Exception:  # noqa: BLE001 - a malformed obs can make contains() raise instead of return False
        return False


def _describe(obs: Any) -> str:
    if isinstance(obs, np.ndarray):
        desc = f"ndarray(shape={obs.shape}, dtype={obs.dtype}"
        return desc + (f", min={obs.min()}, max={obs.max()})" if obs.size and obs.dtype.kind in "biuf" else ")")
    kind = type(obs)
    name = kind.__name__ if kind.__module__ == "builtins" else f"{kind.__module__}.{kind.__name__}"
    return f"{name} {obs!r}"[:200]


def _check_obs(space: gym.Space, obs: Any, where: str) -> None:
    if not _contains(space, obs):
        raise EnvCheckError(f"{where}: observation {_describe(obs)} is not inside info().obs_space {space}")


def _check_timestep(timestep: Any, env_info: BaseEnvInfo, where: str) -> None:
    if not isinstance(timestep, BaseEnvTimestep):
        raise EnvCheckError(f"{where}: step() must return a BaseEnvTimestep, got {type(timestep).__name__}")
    obs, reward, done, info = timestep
    _check_obs(env_info.obs_space, obs, where)
    _check_reward(reward, env_info, where)
    if not isinstance(done, bool):
        raise EnvCheckError(f"{where}: done must be a bool, got {_describe(done)}")
    if not isinstance(info, dict):
        raise EnvCheckError(f"{where}: info must be a dict, got {type(info).__name__}")
    for key in ("terminated", "truncated"):
        if not isinstance(info.get(key), bool):
            raise EnvCheckError(f"{where}: info['{key}'] must be a bool, got {_describe(info.get(key))}")
    if done != (info["terminated"] or info["truncated"]):
        raise EnvCheckError(
            f"{where}: done={done} but terminated={info['terminated']}, truncated={info['truncated']}; "
            f"done must equal terminated or truncated"
        )


def _check_reward(reward: Any, env_info: BaseEnvInfo, where: str) -> None:
    shape = reward_shape(env_info)
    if shape == ():
        if not isinstance(reward, float):
            raise EnvCheckError(
                f"{where}: reward must be a Python float, got {_describe(reward)}; return float(reward)"
            )
    elif not (isinstance(reward, np.ndarray) and reward.shape == shape and reward.dtype.kind == "f"):
        raise EnvCheckError(
            f"{where}: reward must be a float ndarray of shape {shape} (one per agent, as info().rew_space), got "
            f"{_describe(reward)}; nervex.envs.agent_array turns a dict keyed by agent id into one"
        )
    if not np.isfinite(reward).all():
        raise EnvCheckError(f"{where}: reward must be finite, got {reward}")
    rew_space = env_info.rew_space
    if isinstance(rew_space, gym.spaces.Box) and not (
        (rew_space.low <= reward).all() and (reward <= rew_space.high).all()
    ):
        raise EnvCheckError(f"{where}: reward {reward} is outside info().rew_space {rew_space}")


def _check_outcome(outcome: Any, shape: Tuple[int, ...], where: str) -> None:
    if not (
        isinstance(outcome, np.ndarray)
        and outcome.shape == shape
        and outcome.dtype.kind in "iu"
        and np.isin(outcome, (-1, 0, 1)).all()
    ):
        raise EnvCheckError(
            f"{where}: info['outcome'] must be an int ndarray of shape {shape} in {{-1, 0, 1}}, got {_describe(outcome)}"
        )


def _check_episode_end(info: Dict[str, Any], ret: Any, length: int, env_info: BaseEnvInfo, where: str) -> bool:
    """Check a done step's episode figures; return whether it closed a reported episode."""
    if "episode_return" not in info:
        if info.get("game_over") is False:
            return False  # a learning episode inside a game (episodic life): the game's figures come at its end
        raise EnvCheckError(
            f"{where}: done but info has no 'episode_return' (keys: {sorted(info)}); a done step must report "
            f"episode_return and episode_len (or say info['game_over'] = False if the real episode goes on)"
        )
    episode_return, episode_len = info["episode_return"], info.get("episode_len")
    shape = reward_shape(env_info)
    if shape == ():
        if isinstance(episode_return, bool) or not isinstance(episode_return, (float, int, np.floating, np.integer)):
            raise EnvCheckError(f"{where}: info['episode_return'] must be a float, got {_describe(episode_return)}")
    elif not (isinstance(episode_return, np.ndarray) and episode_return.shape == shape):
        raise EnvCheckError(f"{where}: info['episode_return'] must be an ndarray of shape {shape} (one per agent)")
    if not np.allclose(episode_return, ret, rtol=1e-5, atol=1e-5):
        raise EnvCheckError(
            f"{where}: info['episode_return'] = {episode_return} but the episode's rewards sum to {ret} "
            f"(info['raw_reward'] where given, else reward)"
        )
    if "outcome" in info:
        _check_outcome(info["outcome"], shape or (1,), where)
    if isinstance(episode_len, bool) or not isinstance(episode_len, (int, np.integer)):
        raise EnvCheckError(f"{where}: info['episode_len'] must be an int, got {_describe(episode_len)}")
    if episode_len != length:
        raise EnvCheckError(f"{where}: info['episode_len'] = {episode_len} but the episode took {length} steps")
    return True


def _rollout(env: BaseEnv, env_info: BaseEnvInfo, n_steps: int, env_seed: int, action_seed: int) -> List[Any]:
    """Play ``n_steps`` random actions, checking every step; return the trace (observations, rewards, dones)."""
    sampler = copy.deepcopy(env_info.act_space)
    sampler.seed(action_seed)
    rng = np.random.default_rng(action_seed)
    env.seed(env_seed)
    obs = env.reset()
    _check_obs(env_info.obs_space, obs, f"seed {env_seed}, reset")
    trace: List[Any] = [obs]
    zero = np.zeros(reward_shape(env_info))
    ret, length = zero.copy(), 0
    for t in range(n_steps):
        where = f"seed {env_seed}, step {t}"
        mask = obs.get("action_mask") if isinstance(obs, dict) else None
        action = sampler.sample() if mask is None else sample_action(env_info.act_space, mask, rng)
        timestep = env.step(action)
        _check_timestep(timestep, env_info, where)
        obs = timestep.obs
        trace.append((timestep.obs, timestep.reward, timestep.done))
        ret = ret + timestep.info.get("raw_reward", timestep.reward)
        length += 1
        if not timestep.done:
            continue
        if _check_episode_end(timestep.info, ret, length, env_info, where):
            ret, length = zero.copy(), 0
        obs = env.reset()
        _check_obs(env_info.obs_space, obs, f"{where}, reset after done")
        trace.append(obs)
    return trace


def _equal(a: Any, b: Any) -> bool:
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_equal(a[k], b[k]) for k in a)
    if isinstance(a, (tuple, list)) and isinstance(b, (tuple, list)):
        return len(a) == len(b) and all(_equal(x, y) for x, y in zip(a, b))
    try:
        return bool(np.array_equal(np.asarray(a), np.asarray(b)))
    except Exception:  # noqa: BLE001 - values that are not array-like compare as objects
        return a == b


def _first_difference(first: List[Any], second: List[Any]) -> Optional[str]:
    for i, (a, b) in enumerate(zip(first, second)):
        if not _equal(a, b):
            kind = "the first reset" if i == 0 else f"trace entry {i} (a reset's obs or a step's (obs, reward, done))"
            return kind
    if len(first) != len(second):
        return f"the number of resets ({len(first)} vs {len(second)} trace entries)"
    return None


def _check_seed_matters(env: BaseEnv, env_info: BaseEnvInfo, n_steps: int, seed: int, first: List[Any]) -> None:
    tried: Tuple[int, ...] = tuple(seed + k for k in range(1, SEED_PROBES + 1))
    for other in tried:
        # same actions, other env seed: any difference comes from the env's own randomness
        if _first_difference(first, _rollout(env, env_info, n_steps, env_seed=other, action_seed=seed)) is not None:
            return
    raise EnvCheckError(
        f"seeding: rollouts with seeds {seed} and {list(tried)} (same actions) are identical; seed() seems to have "
        f"no effect. If the env has no randomness by design, call check_env(..., deterministic=True)"
    )
