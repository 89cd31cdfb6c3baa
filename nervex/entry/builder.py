"""The builder: every part of a run made from its config section (Acme's ``make_*`` functions).

``SerialTrainer`` assembles a run from these functions; the parallel roles reuse them one by one (an actor process
needs ``make_env_managers``, ``make_policy(enable_field=['collect'])`` and ``make_actor``). ``config_parts`` tells
``nervex.config.compile_config`` which part will validate each section, so the section of the class actually built
is the one checked (the uniform buffer's keys when a policy trains from it, no ``replay_buffer`` at all for
on-policy data); ``compile_config`` and ``compile_parallel_config`` are the builder-aware compiles.
"""

from __future__ import annotations

import difflib
import inspect
import os
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

import numpy as np
from easydict import EasyDict

from nervex.config import ConfigError, ConfigParts, Field, is_compiled, merge_defaults, to_plain, validate_merge
from nervex.config import compile_config as compile_with_parts
from nervex.config.config import config_source
from nervex.utils import ENV_MANAGER_REGISTRY, POLICY_REGISTRY
from nervex.utils.import_helper import import_modules
from nervex.utils.wandb_logger import LOGGER_CONFIG, check_logger_config

# Keys of the ``env`` section that belong to the pipeline; the env class declares the rest.
ENV_PIPELINE_DEFAULTS: Dict[str, Any] = dict(
    env_type="gym",
    import_names=[],  # modules to import before env_type is looked up (a user's own env)
    manager_type="subprocess",
    collector_env_num=Field(8, ge=1),
    evaluator_env_num=Field(5, ge=1),
)
EVAL_SEED_OFFSET = 100_000  # evaluator envs are seeded apart from every collector env


def _lookup(registry: Any, name: Any, path: str, where: str) -> Any:
    if not isinstance(name, str):
        raise ConfigError(f"key '{path}'{where} must be a registered name (a string), got {name!r}")
    if name not in registry:
        raise ConfigError(f"{registry.unknown_message(name)} (key '{path}'{where})")
    return registry.get(name)


def _search_dirs(source: Optional[str]) -> List[str]:
    """Where a module named by ``import_names`` may live besides ``sys.path``: the config's folder, the cwd."""
    return ([os.path.dirname(os.path.abspath(source))] if source else []) + [os.getcwd()]


# ---- config ---------------------------------------------------------------------------------------------------------
def resolve_policy_class(policy_user: Mapping[str, Any], where: str = "", source: Optional[str] = None) -> type:
    """The policy class a ``policy`` section names (importing its ``import_names`` first)."""
    import nervex.policy  # noqa: F401  (registers the built-in policies)

    import_modules(policy_user.get("import_names"), "policy.import_names", _search_dirs(source))
    if "policy_type" not in policy_user:
        raise ConfigError(
            f"key 'policy.policy_type'{where} is required; registered policies: {', '.join(POLICY_REGISTRY.names())}"
        )
    return _lookup(POLICY_REGISTRY, policy_user["policy_type"], "policy.policy_type", where)


def resolve_env_classes(
    env_user: Mapping[str, Any], where: str = "", source: Optional[str] = None
) -> Tuple[type, type]:
    """The env class and env manager class an ``env`` section names."""
    from nervex.envs import get_env_cls
    from nervex.worker.actor import env_manager  # noqa: F401  (registers the managers)

    import_modules(env_user.get("import_names"), "env.import_names", _search_dirs(source))
    try:
        env_cls = get_env_cls(env_user.get("env_type", ENV_PIPELINE_DEFAULTS["env_type"]))
    except KeyError as e:
        raise ConfigError(f"{e.args[0]} (key 'env.env_type'{where})") from None
    manager_type = env_user.get("manager_type", ENV_PIPELINE_DEFAULTS["manager_type"])
    manager_cls = _lookup(ENV_MANAGER_REGISTRY, manager_type, "env.manager_type", where)
    return env_cls, manager_cls


def env_defaults(env_cls: type, manager_cls: type) -> Dict[str, Any]:
    """The ``env`` section's declared defaults: the pipeline's keys, the manager's options, the env class's keys."""
    return dict(ENV_PIPELINE_DEFAULTS, manager=dict(manager_cls.config), **getattr(env_cls, "config", {}))


def _model_check(policy_cls: type) -> Any:
    """A ConfigParts check: ``policy.model`` keys against the model class's constructor."""

    def check(out: Dict[str, Any], where: str) -> None:
        policy_cfg = out["policy"]
        model_cfg = policy_cfg.get("model") or {}
        if "model_type" in model_cfg:
            raise ConfigError(f"key 'policy.model.model_type'{where} was renamed to 'policy.model_type'")
        try:
            model_cls = policy_cls.model_class(policy_cfg)
        except KeyError as e:
            raise ConfigError(f"{e.args[0]} (key 'policy.model_type'{where})") from None
        if model_cls is None:
            return  # the policy builds its own model (a nerveX-style _create_model_from_cfg): free-form keys
        params = inspect.signature(model_cls.__init__).parameters
        if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()):
            return
        valid = [n for n in params if n != "self"]
        for key in model_cfg:
            if key not in valid:
                close = difflib.get_close_matches(str(key), valid, n=1, cutoff=0.6)
                hint = f"; did you mean 'policy.model.{close[0]}'?" if close else f"; valid keys: {', '.join(valid)}"
                raise ConfigError(f"unknown key 'policy.model.{key}'{where} for model '{model_cls.__name__}'{hint}")

    return check


def config_parts(cfg: Mapping[str, Any], source: Optional[str] = None) -> ConfigParts:
    """The parts a serial run builds from ``cfg``, as ``nervex.config.compile_config`` needs them.

    Resolves the policy class (after ``policy.import_names``), the env and env manager classes (after
    ``env.import_names``), and, from the policy's training contract, the replay buffer class whose keys the
    ``replay_buffer`` section may hold.
    """
    return _serial_parts(cfg, source)[0]


def _serial_parts(cfg: Mapping[str, Any], source: Optional[str]) -> Tuple[ConfigParts, type]:
    """``config_parts`` and the policy class it resolved."""
    from nervex.data import BUFFER_REGISTRY
    from nervex.worker.actor import SerialActor, SerialEvaluator
    from nervex.worker.actor.slots import check_slots
    from nervex.worker.learner import BaseLearner

    where = f" in {os.path.basename(source)}" if source else ""
    user = to_plain(cfg)
    for section in ("env", "policy"):
        if user.get(section) is not None and not isinstance(user[section], Mapping):
            raise ConfigError(f"key '{section}'{where} expects a mapping, got {user[section]!r}")
    env_user, policy_user = user.get("env") or {}, user.get("policy") or {}
    env_cls, manager_cls = resolve_env_classes(env_user, where, source)
    policy_cls = resolve_policy_class(policy_user, where, source)
    policy_cfg = policy_cls.compile_section(policy_user, source)
    contract = policy_cls.contract(policy_cfg)
    sections: Dict[str, Any] = dict(
        env=env_defaults(env_cls, manager_cls),
        policy=policy_cls.default_config(policy_cfg["on_policy"]),
    )
    absent: Dict[str, str] = {}
    if contract.buffer_type is None:
        absent["replay_buffer"] = f"policy '{policy_user['policy_type']}' is on-policy and uses no replay buffer"
    else:
        buffer_cls = BUFFER_REGISTRY.get(contract.buffer_type)
        sections["replay_buffer"] = merge_defaults(buffer_cls.config, contract.buffer_defaults)
    sections.update(learner=BaseLearner, actor=SerialActor, evaluator=SerialEvaluator, logger=LOGGER_CONFIG)
    checks = [_model_check(policy_cls), _resolve_on_policy(policy_cls), _check_on_policy_manager, check_slots]
    open_sections = [] if policy_cls.declares_config() else ["policy"]
    if user.get("league") is not None:
        from nervex.league.league import check_league_section  # a league run: its section is the league's to check

        sections["league"] = {}
        open_sections.append("league")
        checks.append(check_league_section)
    parts = ConfigParts(
        sections=sections,
        open_sections=open_sections,
        absent=absent,
        checks=checks + [check_logger_config],
    )
    return parts, policy_cls


def compile_config(cfg: Mapping[str, Any], source: Optional[str] = None) -> EasyDict:
    """Compile a serial run's config: its parts resolved (``config_parts``), then ``nervex.config.compile_config``.

    Args:
        cfg: The user's config (``read_config``, ``apply_overrides`` or a plain dict).
        source: The file it came from, for messages (taken from ``cfg`` when ``read_config`` made it).

    Returns:
        The full config as an EasyDict: every key present, every value of the declared type and range.

    Raises:
        ConfigError: an unknown key (with the nearest valid one suggested), a value of the wrong type or out of
            range, or an unknown registered name; the message names the dotted key and the file.
    """
    source = source or config_source(cfg)
    return compile_with_parts(cfg, config_parts(cfg, source), source)


def compile_parallel_config(cfg: Mapping[str, Any], source: Optional[str] = None) -> EasyDict:
    """Compile a parallel-mode config: the serial run's sections plus ``system`` (``nervex.system.protocol``).

    The policy's collect unit and counts and its ``learning_starts`` are written into ``system.collect``, where the
    coordinator reads them without importing the policy.

    Args:
        cfg: The user's config, or one this function compiled (returned as it is).
        source: The file it came from, for messages.

    Raises:
        ConfigError: as ``compile_config``, plus keys of ``system`` that contradict each other or the policy
            (``heartbeat_s >= lease_s``, ``n_sample`` for on-policy data, a hand-set ``system.collect`` value).
    """
    from nervex.system.system_config import parallel_parts, resolve_collect  # the parallel mode's plain declarations

    if is_compiled(cfg) and "system" in cfg:
        return cfg  # type: ignore[return-value]
    source = source or config_source(cfg)
    if cfg.get("league") is not None:
        where = f" in {os.path.basename(source)}" if source else ""
        raise ConfigError(
            f"section 'league'{where}: the parallel mode does not train a league yet (its league manager runs one "
            "main player by self-play); train this config in one process: nervex -m serial -c CONFIG"
        )
    parts, policy_cls = _serial_parts(cfg, source)

    def resolve(out: Dict[str, Any], where: str) -> None:
        contract = policy_cls.contract(out["policy"])
        spec = contract.collect
        resolve_collect(out, spec.unit, spec.n, spec.restart_envs, contract.learn.learning_starts, where)

    parts = parallel_parts(parts)
    parts.checks.append(resolve)
    return compile_with_parts(cfg, parts, source)


def _resolve_on_policy(policy_cls: type) -> Any:
    """A ConfigParts check that records the class's ``on_policy`` in the compiled section (the trainer's view)."""

    def resolve(out: Dict[str, Any], where: str) -> None:
        out["policy"]["on_policy"] = policy_cls.is_on_policy(out["policy"])

    return resolve


def _check_on_policy_manager(out: Dict[str, Any], where: str) -> None:
    if out["policy"].get("on_policy") and (out["env"].get("manager") or {}).get("wait_num"):
        raise ConfigError(
            f"key 'env.manager.wait_num'{where} (asynchronous stepping) cannot be used with an on-policy policy: "
            "a rollout must step every env exactly rollout_len times with the current policy"
        )


# ---- parts ----------------------------------------------------------------------------------------------------------
def _model_obs_shape(env_info: Any) -> Tuple[int, ...]:
    """The shape one model input has: the ``obs`` key of a Dict space, per agent for a simultaneous-move env."""
    import gymnasium as gym

    space = env_info.obs_space
    if isinstance(space, gym.spaces.Dict):
        if "obs" not in space.spaces:
            raise ConfigError(
                f"cannot size the model's input from a Dict observation space without an 'obs' key (keys: "
                f"{sorted(space.spaces)}); set model.obs_dim (or model.obs_shape) in the config"
            )
        space = space["obs"]
    if space.shape is None:
        raise ConfigError(f"cannot size the model's input from the observation space {space}; set model.obs_dim")
    shape = tuple(space.shape)
    agents = getattr(env_info, "agent_num", 1)
    if agents > 1 and not getattr(env_info, "turn_based", False) and shape[:1] == (agents,):
        shape = shape[1:]  # observations stacked per agent: a (shared) agent net sees one row
    return shape


def _model_action_dim(act_space: Any, agent_num: int = 1) -> int:
    """Actions of one agent: Discrete ``n``, a Box's size (one agent's row of a ``(agent_num, act_dim)`` Box), the
    common size of a per-agent MultiDiscrete."""
    import gymnasium as gym

    if isinstance(act_space, gym.spaces.Discrete):
        return int(act_space.n)
    if isinstance(act_space, gym.spaces.Box):
        shape = tuple(act_space.shape)
        if agent_num > 1 and len(shape) > 1 and shape[0] == agent_num:
            shape = shape[1:]  # actions stacked per agent: a (shared) agent net outputs one row
        return int(np.prod(shape))
    if isinstance(act_space, gym.spaces.MultiDiscrete) and act_space.nvec.ndim == 1:
        sizes = sorted(set(act_space.nvec.tolist()))
        if len(sizes) == 1:
            return int(sizes[0])
        raise ConfigError(
            f"cannot size model.action_dim: the agents of {act_space} have different action counts {sizes}; a "
            f"shared agent net needs one size: set model.action_dim (and mask the extra actions per agent)"
        )
    raise ConfigError(f"cannot size the model's output from the action space {act_space}; set model.action_dim")


def _one_agent_box(env_info: Any, need_bounds: bool) -> Any:
    """The action space one agent's model acts in: row 0 of a simultaneous-move env's per-agent ``Box`` shaped
    ``(agent_num, ...)`` (every agent's bounds equal where ``need_bounds``), else the env's action space."""
    import gymnasium as gym

    space = env_info.act_space
    agents = getattr(env_info, "agent_num", 1)
    if not isinstance(space, gym.spaces.Box) or agents < 2 or getattr(env_info, "turn_based", False):
        return space
    if space.shape[:1] != (agents,):
        return space
    if need_bounds and not ((space.low == space.low[0]).all() and (space.high == space.high[0]).all()):
        raise ConfigError(
            f"cannot size model.action_low/action_high: the agents of {space} have different bounds; a shared agent "
            "net needs one: set model.action_low and model.action_high"
        )
    return gym.spaces.Box(space.low[0], space.high[0], dtype=space.dtype)


def _model_state_dim(env_info: Any) -> int:
    """The global state's size: ``BaseEnvInfo.state_space``, else the ``global_state`` key of a Dict observation."""
    import gymnasium as gym

    space = getattr(env_info, "state_space", None)
    if space is None and isinstance(env_info.obs_space, gym.spaces.Dict):
        space = env_info.obs_space.spaces.get("global_state")
    if space is None or space.shape is None:
        raise ConfigError(
            "cannot size model.state_dim: the env declares no global state (BaseEnvInfo.state_space or a "
            "'global_state' observation key); set model.state_dim, or use an env adapter that gives one"
        )
    return int(np.prod(space.shape))


def fill_model_from_env(model_cfg: Dict[str, Any], model_cls: Optional[type], env_info: Any) -> None:
    """Fill ``obs_dim``/``obs_shape``/``action_dim``/``action_space`` of the model config from the env's spaces,
    and ``action_low``/``action_high`` (lists, from a ``Box``'s ``low``/``high``), ``agent_num`` and ``state_dim``
    (the global state's size) for the keys the model's constructor takes and the config leaves out.

    A Dict observation space sizes the input from its ``obs`` key (the action mask and ``to_play`` are not model
    inputs); a simultaneous-move env's per-agent observations (leading axis ``agent_num``) size one agent's input;
    a per-agent ``MultiDiscrete`` of equal sizes gives ``action_dim`` = that size (one agent's actions).

    Raises:
        ConfigError: a space it cannot size, naming the model key to set (``model.obs_dim``, ``model.action_dim``).
    """
    import gymnasium as gym

    if model_cls is None:
        return
    params = inspect.signature(model_cls.__init__).parameters

    def wanted(key: str) -> bool:
        return key in params and model_cfg.get(key) is None

    if wanted("obs_dim") or wanted("obs_shape"):
        obs_shape = _model_obs_shape(env_info)
        if wanted("obs_dim"):
            model_cfg["obs_dim"] = int(np.prod(obs_shape)) if len(obs_shape) <= 1 else list(obs_shape)
        if wanted("obs_shape"):
            model_cfg["obs_shape"] = list(obs_shape)
    if wanted("agent_num"):
        model_cfg["agent_num"] = int(getattr(env_info, "agent_num", 1))
    if wanted("state_dim"):
        model_cfg["state_dim"] = _model_state_dim(env_info)
    act_space = _one_agent_box(env_info, wanted("action_low") or wanted("action_high"))  # per agent, like obs_dim
    if wanted("action_dim"):
        agents = 1 if getattr(env_info, "turn_based", False) else int(getattr(env_info, "agent_num", 1))
        model_cfg["action_dim"] = _model_action_dim(act_space, agents)
    if wanted("action_space"):
        discrete = isinstance(act_space, (gym.spaces.Discrete, gym.spaces.MultiDiscrete))
        if not discrete and not isinstance(act_space, gym.spaces.Box):
            raise ConfigError(f"cannot tell model.action_space from {act_space}; set it to 'discrete' or 'continuous'")
        model_cfg["action_space"] = "discrete" if discrete else "continuous"
    if isinstance(act_space, gym.spaces.Box):
        # a bounded actor (QAC) squashes into the env's own bounds, whatever they are
        for key, bound in (("action_low", act_space.low), ("action_high", act_space.high)):
            if wanted(key):
                model_cfg[key] = np.asarray(bound, dtype=np.float64).reshape(-1).tolist()


def make_env_managers(
    cfg: Mapping[str, Any], seed: int, evaluator: bool = True, collector: bool = True
) -> Tuple[Optional[Any], Optional[Any], Any]:
    """The collector's and evaluator's env managers (each optional), seeded, and the env's ``BaseEnvInfo``.

    Collector env ``i`` first resets with ``seed + i``, evaluator env ``i`` with ``seed + 100000 + i``. The caller
    closes the managers.
    """
    from nervex.envs import ENV_PIPELINE_KEYS
    from nervex.worker.actor import eval_episodes_per_env

    env_cls, manager_cls = resolve_env_classes(cfg["env"])
    env_cfg = {k: v for k, v in cfg["env"].items() if k not in ENV_PIPELINE_KEYS}
    probe = env_cls(env_cfg)
    env_info = probe.info()
    probe.close()
    manager_kwargs = dict(cfg["env"]["manager"])
    collector_env = None
    if collector:
        collector_env = manager_cls(env_cls, env_cfg, cfg["env"]["collector_env_num"], **manager_kwargs)
        collector_env.seed(seed)
    if not evaluator:
        return collector_env, None, env_info
    try:
        n_episode = cfg["evaluator"]["n_episode"]
        n_eval_env = max(1, min(cfg["env"]["evaluator_env_num"], n_episode))
        # an env class may play evaluation differently (e.g. Atari: whole games instead of lives)
        eval_env_cfg = {**env_cfg, **getattr(env_cls, "eval_overrides", {})}
        manager_kwargs.pop("wait_num", None)  # evaluation steps every env in lock step
        evaluator_env = manager_cls(
            env_cls,
            eval_env_cfg,
            n_eval_env,
            episode_num=eval_episodes_per_env(n_episode, n_eval_env),
            **manager_kwargs,
        )
        evaluator_env.seed(seed + EVAL_SEED_OFFSET)
    except BaseException:
        if collector_env is not None:
            collector_env.close()
        raise
    return collector_env, evaluator_env, env_info


def make_policy(cfg: Mapping[str, Any], env_info: Any, enable_field: Optional[Sequence[str]] = None) -> Any:
    """The policy of ``cfg.policy``, its model's sizes filled from ``env_info`` where the config leaves them out, and a
    ``team_reward: env`` (cooperative policies) resolved to the env's ``BaseEnvInfo.team_reward``, and an unset
    ``max_episode_len`` (whole-episode policies: COMA) to its ``max_episode_steps``."""
    policy_cls = resolve_policy_class(cfg["policy"])
    policy_cfg = dict(to_plain(cfg["policy"]))
    model_cfg = dict(policy_cfg.get("model") or {})
    fill_model_from_env(model_cfg, policy_cls.model_class(policy_cfg), env_info)
    policy_cfg["model"] = model_cfg
    if policy_cfg.get("team_reward") == "env":
        # a cooperative policy learns from the team reward, reduced from the per-agent rewards as the env states
        policy_cfg["team_reward"] = getattr(env_info, "team_reward", "sum")
    if "max_episode_len" in policy_cls.config and policy_cfg.get("max_episode_len") is None:
        # a whole-episode learner (COMA) pads its episodes to the env's time limit
        policy_cfg["max_episode_len"] = getattr(env_info, "max_episode_steps", None)
    return policy_cls(policy_cfg, enable_field=enable_field)


def make_buffer(cfg: Mapping[str, Any], contract: Any, seed: int) -> Optional[Any]:
    """The replay buffer the contract names, built from ``cfg.replay_buffer`` (None for on-policy data)."""
    from nervex.data import BUFFER_REGISTRY

    if contract.buffer_type is None:
        return None
    buffer_cls = BUFFER_REGISTRY.get(contract.buffer_type)
    defaults = merge_defaults(buffer_cls.config, contract.buffer_defaults)
    kwargs = validate_merge(defaults, cfg.get("replay_buffer") or {}, "replay_buffer")
    if kwargs.get("seed") is None:
        kwargs["seed"] = seed
    return buffer_cls(**kwargs)


def make_learner(cfg: Mapping[str, Any], policy: Any, run_dir: Optional[str], logger: Any, writer: Any) -> Any:
    """A ``BaseLearner`` over the policy's learn mode, with the hooks ``cfg.learner`` asks for."""
    from nervex.worker.learner import BaseLearner

    return BaseLearner(cfg["learner"], policy.learn_mode, run_dir, logger, writer)


def _snapshot_policy_factory(cfg: Mapping[str, Any], env_manager: Any) -> Any:
    """Makes a fresh eval-only policy of ``cfg.policy`` (a ``snapshot`` slot's, an opponent's)."""
    return lambda: make_policy(cfg, env_manager.env_info(), enable_field=["eval"]).eval_mode


def make_actor(
    cfg: Mapping[str, Any],
    env_manager: Any,
    policy: Any,
    seed: int,
    callbacks: Optional[Any] = None,
) -> Any:
    """A ``SerialActor`` over the policy's collect mode and the player slots of ``actor.slots`` (writing
    trajectories to ``actor.save_data`` if set)."""
    from nervex.worker.actor import SerialActor

    writer = None
    if cfg["actor"].get("save_data"):
        from nervex.data import TrajectoryWriter

        writer = TrajectoryWriter(cfg["actor"]["save_data"])
    return SerialActor(
        cfg["actor"],
        env_manager,
        policy.collect_mode,
        callbacks=callbacks,
        data_writer=writer,
        seed=seed,
        policy_factory=_snapshot_policy_factory(cfg, env_manager),
    )


def make_evaluator(cfg: Mapping[str, Any], env_manager: Any, policy: Any, seed: Optional[int] = None) -> Any:
    """A ``SerialEvaluator`` over the policy's eval mode, against the act-only slots of ``actor.slots``.

    Args:
        seed: Seeds the act-only slots' random actions (offset by ``EVAL_SEED_OFFSET``); default: ``cfg.seed``.
    """
    from nervex.worker.actor import SerialEvaluator

    seed = int(cfg.get("seed", 0) if seed is None else seed) + EVAL_SEED_OFFSET
    return SerialEvaluator(
        cfg["evaluator"],
        env_manager,
        policy.eval_mode,
        slots=(cfg.get("actor") or {}).get("slots"),
        seed=seed,
        policy_factory=_snapshot_policy_factory(cfg, env_manager),
    )


__all__ = [
    "config_parts",
    "env_defaults",
    "fill_model_from_env",
    "make_env_managers",
    "make_policy",
    "make_buffer",
    "make_learner",
    "make_actor",
    "make_evaluator",
    "resolve_policy_class",
    "resolve_env_classes",
    "ENV_PIPELINE_DEFAULTS",
    "EVAL_SEED_OFFSET",
]
