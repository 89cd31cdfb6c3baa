"""``compile_config``: the user's config laid over the declared defaults of the parts that will be built.

The config package knows no policy, env or buffer: the entry that assembles a run names its parts (``ConfigParts``)
and ``compile_config`` validates each section against the part that will actually be built. Nothing here imports
torch, gymnasium, a policy, an env or the entry, whatever the call: a config can be checked anywhere the parts'
declarations are importable (``nervex.entry.compile_config`` is the builder-aware compile).
"""

from __future__ import annotations

import difflib
import os
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Mapping, Optional

from easydict import EasyDict

from .config import ConfigError, config_source, to_plain, validate_merge
from .field import Field

# Keys of the top level that belong to the pipeline itself; the sections hold their own defaults.
TOP_LEVEL_DEFAULTS: Dict[str, Any] = dict(
    exp_name=None,  # run directory name under runs/; default: {env}__{policy}__{seed}__{time}
    seed=Field(0, ge=0),
    max_env_step=Field(10_000_000, ge=1),  # stop training after this many env steps
    max_train_iter=Field(1_000_000_000, ge=1),  # ... or this many gradient steps
    num_threads=Field(1, ge=0),  # torch intra-op threads; small RL nets are fastest on one (0: torch's default)
)

Check = Callable[[Dict[str, Any], str], None]


@dataclass
class ConfigParts:
    """What a whole-run config is validated against.

    Attributes:
        sections: Section name -> its declared defaults: a mapping, or a class whose ``config`` attribute holds them.
            The top-level keys (``seed``, ``max_env_step``...) are ``top``.
        top: Defaults of the top-level keys.
        open_sections: Sections whose unknown keys are accepted (their class declares no defaults of its own).
        absent: Sections that must not be given, with the reason (e.g. ``replay_buffer`` for an on-policy policy).
        checks: Functions ``check(compiled, where)`` run in order on the merged config: cross-key rules (model
            keyword arguments against the model class) that raise ``ConfigError``, or values resolved from several
            keys (a policy's ``on_policy``) that they write into it.
    """

    sections: Dict[str, Any]
    top: Mapping[str, Any] = field(default_factory=lambda: dict(TOP_LEVEL_DEFAULTS))
    open_sections: List[str] = field(default_factory=list)
    absent: Dict[str, str] = field(default_factory=dict)
    checks: List[Check] = field(default_factory=list)


def declared_defaults(part: Any) -> Mapping[str, Any]:
    """A part's defaults: the mapping itself, or a class's ``config`` attribute."""
    if part is None:
        return {}
    if isinstance(part, Mapping):
        return part
    defaults = getattr(part, "config", None)
    if not isinstance(defaults, Mapping):
        raise TypeError(f"config part {part!r} declares no 'config' mapping of defaults")
    return defaults


def _check_top_level(user: Mapping[str, Any], parts: ConfigParts, where: str) -> None:
    valid = list(parts.top) + list(parts.sections) + list(parts.absent)
    for key in user:
        if key not in valid:
            close = difflib.get_close_matches(str(key), valid, n=1, cutoff=0.6)
            hint = f"; did you mean '{close[0]}'?" if close else f"; valid top-level keys: {', '.join(valid)}"
            raise ConfigError(f"unknown key '{key}'{where}{hint}")
        if key in parts.absent and user[key]:
            raise ConfigError(f"section '{key}'{where} does not apply: {parts.absent[key]}")


def compile_config(
    cfg: Mapping[str, Any], parts: Optional[ConfigParts] = None, source: Optional[str] = None
) -> EasyDict:
    """Merge a user config onto the defaults of the parts it is given, and validate it.

    This function knows no policy, env or buffer: the caller names the parts the config will build. To compile a
    config against the parts a serial run builds from it (the policy, env, env manager and buffer it names), call
    ``nervex.entry.compile_config(cfg)``, which resolves them and calls this.

    Args:
        cfg: The user's config (as ``read_config`` returns it, or a plain dict).
        parts: The parts the config will build (``nervex.entry.config_parts`` for a serial run). Required: None is
            a ``TypeError`` that names ``nervex.entry.compile_config``.
        source: The file it came from, for messages (taken from ``cfg`` when ``read_config`` made it).

    Returns:
        The full config as an EasyDict: every key present, every value of the declared type and range.

    Raises:
        TypeError: ``parts`` is None.
        ConfigError: an unknown key, a value of the wrong type or out of range, or a failed check of ``parts``; the
            message names the dotted key (and the file) and suggests the nearest valid key.
    """
    if not isinstance(parts, ConfigParts):
        raise TypeError(
            f"nervex.config.compile_config(cfg, parts) validates against the ConfigParts it is given, got parts="
            f"{parts!r}; to compile a run config against the policy, env and buffer it names, call "
            "nervex.entry.compile_config(cfg) (or nervex.entry.compile_parallel_config(cfg) for the parallel mode)"
        )
    source = source or config_source(cfg)
    where = f" in {os.path.basename(source)}" if source else ""
    user = to_plain(cfg)
    _check_top_level(user, parts, where)
    out: Dict[str, Any] = validate_merge(parts.top, {k: v for k, v in user.items() if k in parts.top}, "", source)
    for name, part in parts.sections.items():
        out[name] = validate_merge(
            declared_defaults(part), user.get(name) or {}, name, source, open_keys=name in parts.open_sections
        )
    for check in parts.checks:
        check(out, where)
    result = EasyDict(out)
    object.__setattr__(result, "_compiled", True)
    if source:
        object.__setattr__(result, "_source", source)
    return result


def compile_section(
    part: Any, cfg: Optional[Mapping[str, Any]], path: str, open_keys: bool = False, source: Optional[str] = None
) -> EasyDict:
    """Validate one section for the class that is being built with it (its ``config`` or a defaults mapping).

    Every configurable class calls this on the section it receives, so a class built directly (not through
    ``compile_config``) still refuses an unknown key or an out-of-range value, naming ``path.key``.
    """
    return EasyDict(validate_merge(declared_defaults(part), cfg or {}, path, source, open_keys=open_keys))


def is_compiled(cfg: Any) -> bool:
    """Whether ``cfg`` came out of ``compile_config``."""
    return bool(getattr(cfg, "_compiled", False))


__all__ = ["ConfigParts", "compile_config", "compile_section", "declared_defaults", "is_compiled", "TOP_LEVEL_DEFAULTS"]
