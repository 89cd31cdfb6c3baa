"""``compile_config``: the user's config laid over every part's declared defaults, validated."""

from __future__ import annotations

import difflib
import importlib
import inspect
import os
from typing import Any, Dict, Mapping, Optional

from easydict import EasyDict

from .config import ConfigError, config_source, to_plain, validate_merge

# Keys of the top level that belong to the pipeline itself; the sections hold their own defaults.
TOP_LEVEL_DEFAULTS: Dict[str, Any] = dict(
    exp_name=None,  # run directory name under runs/; default: {env}__{policy}__{seed}__{time}
    seed=0,
    max_env_step=10_000_000,  # stop training after this many env steps
    max_train_iter=1_000_000_000,  # ... or this many learner iterations
    num_threads=1,  # torch intra-op threads; small RL nets are fastest on one
)
ENV_PIPELINE_DEFAULTS: Dict[str, Any] = dict(
    env_type="gym",
    manager_type="subprocess",
    collector_env_num=8,
    evaluator_env_num=5,
)
SECTIONS = ("env", "policy", "replay_buffer", "learner", "actor", "evaluator")


def _lookup(registry: Any, name: Any, path: str, where: str) -> Any:
    if not isinstance(name, str):
        raise ConfigError(f"key '{path}'{where} must be a registered name (a string), got {name!r}")
    if name not in registry:
        raise ConfigError(f"{registry.unknown_message(name)} (key '{path}'{where})")
    return registry.get(name)


def _check_top_level(user: Mapping[str, Any], where: str) -> None:
    valid = list(TOP_LEVEL_DEFAULTS) + list(SECTIONS)
    for key in user:
        if key not in valid:
            close = difflib.get_close_matches(str(key), valid, n=1, cutoff=0.6)
            hint = f"; did you mean '{close[0]}'?" if close else f"; valid top-level keys: {', '.join(valid)}"
            raise ConfigError(f"unknown key '{key}'{where}{hint}")


def check_model_kwargs(model_cfg: Mapping[str, Any], where: str = "") -> None:
    """Validate ``policy.model`` against the model class's constructor signature."""
    from nervex.utils import MODEL_REGISTRY

    importlib.import_module("nervex.model")
    model_type = model_cfg.get("model_type")
    if model_type is None:
        return
    cls = _lookup(MODEL_REGISTRY, model_type, "policy.model.model_type", where)
    params = inspect.signature(cls.__init__).parameters
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()):
        return
    valid = [n for n in params if n != "self"]
    for key in model_cfg:
        if key != "model_type" and key not in valid:
            close = difflib.get_close_matches(str(key), valid, n=1, cutoff=0.6)
            hint = f"; did you mean 'policy.model.{close[0]}'?" if close else f"; valid keys: {', '.join(valid)}"
            raise ConfigError(f"unknown key 'policy.model.{key}'{where} for model '{model_type}'{hint}")


def section_defaults() -> Dict[str, Dict[str, Any]]:
    """The defaults of the sections whose class does not depend on the user's choice."""
    from nervex.data import PrioritizedBuffer
    from nervex.worker.actor import SerialActor, SerialEvaluator
    from nervex.worker.learner import BaseLearner

    return dict(
        replay_buffer=PrioritizedBuffer.config,
        learner=BaseLearner.config,
        actor=SerialActor.config,
        evaluator=SerialEvaluator.config,
    )


def compile_config(cfg: Mapping[str, Any], source: Optional[str] = None) -> EasyDict:
    """Merge a user config onto the defaults of every part it names, and validate it.

    Args:
        cfg: The user's config (as ``read_config`` returns it, or a plain dict).
        source: The file it came from, for messages (taken from ``cfg`` when ``read_config`` made it).

    Returns:
        The full config as an EasyDict: every key present, every value of the declared type.

    Raises:
        ConfigError: an unknown key, a value of the wrong type, or an unknown ``policy_type``/``env_type``/
            ``manager_type``/``model_type``; the message names the dotted key and suggests the nearest valid one.
    """
    from nervex.envs import get_env_cls
    from nervex.utils import ENV_MANAGER_REGISTRY, POLICY_REGISTRY

    importlib.import_module("nervex.policy")
    importlib.import_module("nervex.envs")
    importlib.import_module("nervex.worker.actor.env_manager")
    source = source or config_source(cfg)
    where = f" in {os.path.basename(source)}" if source else ""
    user = to_plain(cfg)
    _check_top_level(user, where)
    out: Dict[str, Any] = validate_merge(TOP_LEVEL_DEFAULTS, {k: v for k, v in user.items() if k not in SECTIONS})

    env_user = user.get("env") or {}
    env_type = env_user.get("env_type", "gym")
    try:
        env_cls = get_env_cls(env_type)  # imports app_zoo once for a name it does not know yet
    except KeyError as e:
        raise ConfigError(f"{e.args[0]} (key 'env.env_type'{where})") from None
    manager_cls = _lookup(
        ENV_MANAGER_REGISTRY,
        env_user.get("manager_type", ENV_PIPELINE_DEFAULTS["manager_type"]),
        "env.manager_type",
        where,
    )
    env_defaults = dict(ENV_PIPELINE_DEFAULTS, manager=dict(manager_cls.config), **getattr(env_cls, "config", {}))
    out["env"] = validate_merge(env_defaults, env_user, "env", source)

    policy_user = user.get("policy") or {}
    if "policy_type" not in policy_user:
        raise ConfigError(
            f"key 'policy.policy_type'{where} is required; registered policies: {', '.join(POLICY_REGISTRY.names())}"
        )
    policy_cls = _lookup(POLICY_REGISTRY, policy_user["policy_type"], "policy.policy_type", where)
    out["policy"] = validate_merge(policy_cls.config, policy_user, "policy", source)
    default_model_type = getattr(policy_cls, "default_model_type", None)
    if default_model_type and "model_type" not in out["policy"].setdefault("model", {}):
        out["policy"]["model"]["model_type"] = default_model_type
    check_model_kwargs(out["policy"].get("model", {}), where)

    for name, defaults in section_defaults().items():
        out[name] = validate_merge(defaults, user.get(name) or {}, name, source)
    result = EasyDict(out)
    object.__setattr__(result, "_compiled", True)
    if source:
        object.__setattr__(result, "_source", source)
    return result
