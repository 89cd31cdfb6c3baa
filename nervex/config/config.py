"""Reading, merging and validating configs.

A config is a nested mapping. Every configurable class declares its defaults in a class attribute ``config``;
``compile_config`` lays the user's YAML over those defaults and refuses anything it does not know, so a typo
is an error with a suggestion instead of a silently ignored setting.
"""

from __future__ import annotations

import copy
import difflib
import os
import tempfile
from typing import Any, Dict, List, Mapping, Optional, Sequence

import yaml
from easydict import EasyDict

from .field import Field, plain_defaults

# A default that is an empty dict marks a free-form section (e.g. ``env_kwargs``): any keys are accepted there.
FREE_FORM: Dict[str, Any] = {}


class ConfigError(ValueError):
    """A config is malformed: unknown key, wrong type, unknown registered name, bad YAML."""


def read_config(path: str | os.PathLike) -> EasyDict:
    """Read a YAML config file into an EasyDict.

    Args:
        path: The YAML file.

    Returns:
        The file's mapping as an EasyDict (nothing merged or validated yet; see ``compile_config``).

    Raises:
        FileNotFoundError: ``path`` does not exist.
        ConfigError: the YAML does not parse (the message names file, line and column) or is not a mapping.
    """
    path = os.fspath(path)
    if not os.path.isfile(path):
        raise FileNotFoundError(f"config file not found: '{path}' (working directory: {os.getcwd()})")
    with open(path, encoding="utf-8") as f:
        text = f.read()
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f"{path}:{mark.line + 1}:{mark.column + 1}" if mark is not None else path
        problem = getattr(e, "problem", None) or str(e)
        raise ConfigError(f"YAML syntax error in {where}: {problem}") from None
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ConfigError(f"config file '{path}' must hold a mapping at the top level, got {type(data).__name__}")
    cfg = EasyDict(data)
    # Kept out of the mapping's keys so it never reaches validation or the resolved config.yaml.
    object.__setattr__(cfg, "_source", path)
    return cfg


def config_source(cfg: Any) -> Optional[str]:
    """The file a config was read from, if ``read_config`` made it."""
    return getattr(cfg, "_source", None)


def deep_merge(base: Mapping[str, Any], override: Mapping[str, Any]) -> Dict[str, Any]:
    """Return a new dict: ``override`` laid recursively over ``base`` (no validation)."""
    out = copy.deepcopy(dict(base))
    for key, value in override.items():
        if isinstance(value, Mapping) and isinstance(out.get(key), Mapping):
            out[key] = deep_merge(out[key], value)
        else:
            out[key] = copy.deepcopy(value)
    return out


def _type_name(value: Any) -> str:
    return type(value).__name__


def _coerce_number(value: Any, default: Any, path: str, where: str) -> Any:
    """Accept any number (or a numeric string such as '1e5', which YAML 1.1 reads as text) for a numeric key."""
    original = value
    if isinstance(value, str):
        try:
            value = float(value.strip())
        except ValueError:
            raise ConfigError(
                f"key '{path}'{where} expects a number (like {default!r}), got {_type_name(original)} {original!r}"
            ) from None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ConfigError(
            f"key '{path}'{where} expects a number (like {default!r}), got {_type_name(original)} {original!r}"
        )
    if isinstance(default, int):
        if isinstance(value, float):
            if value == float("inf"):
                return value  # 'inf' is how a user says "unbounded" for a count
            if not value.is_integer():
                raise ConfigError(f"key '{path}'{where} expects an integer (like {default!r}), got {original!r}")
            return int(value)
        return value
    return float(value)


def _check_value(value: Any, default: Any, path: str, where: str) -> Any:
    if isinstance(default, Field):
        if value is None:
            if not default.nullable:
                raise ConfigError(f"key '{path}'{where} must not be null; it expects {_expected(default)}")
            return None
        value = _check_value(value, default.type_example(), path, where)
        problem = default.violation(value)
        if problem:
            raise ConfigError(f"key '{path}'{where} {problem}, got {value!r}")
        return value
    if default is None or value is None:
        return value
    if isinstance(default, bool):
        if not isinstance(value, bool):
            raise ConfigError(f"key '{path}'{where} expects a bool (true/false), got {_type_name(value)} {value!r}")
        return value
    if isinstance(default, (int, float)):
        return _coerce_number(value, default, path, where)
    if isinstance(default, str):
        if not isinstance(value, str):
            raise ConfigError(f"key '{path}'{where} expects a string, got {_type_name(value)} {value!r}")
        return value
    if isinstance(default, (list, tuple)):
        if not isinstance(value, (list, tuple)):
            raise ConfigError(f"key '{path}'{where} expects a list, got {_type_name(value)} {value!r}")
        return list(value)
    return value


def _expected(field: Field) -> str:
    example = field.type_example()
    kind = "a value" if example is None else f"a {type(example).__name__}"
    rule = field.describe()
    return f"{kind}{' ' + rule if rule else ''}"


# Keys that moved: an old config gets told where the key went instead of "unknown key".
RENAMED_KEYS: Dict[str, str] = {
    "policy.learn.train_iteration": "policy.learn.update_per_collect",
    "policy.model.model_type": "policy.model_type",
}


def suggest_choice(value: Any, valid: Sequence[str]) -> str:
    """``"did you mean 'x'?"`` for the valid choice closest to ``value``, else ``"valid: a, b, c"`` (for messages)."""
    close = difflib.get_close_matches(str(value), list(valid), n=1, cutoff=0.6)
    return f"did you mean '{close[0]}'?" if close else f"valid: {', '.join(valid)}"


def _unknown_key_message(key: Any, full: str, path: str, valid: List[str], where: str) -> str:
    if full in RENAMED_KEYS:
        return f"key '{full}'{where} was renamed to '{RENAMED_KEYS[full]}'"
    msg = f"unknown key '{full}'{where}"
    close = difflib.get_close_matches(str(key), valid, n=1, cutoff=0.6)
    if close:
        return msg + f"; did you mean '{f'{path}.{close[0]}' if path else close[0]}'?"
    return msg + f"; valid keys{' under ' + repr(path) if path else ''}: {', '.join(sorted(valid))}"


def validate_merge(
    defaults: Mapping[str, Any],
    user: Mapping[str, Any],
    path: str = "",
    source: Optional[str] = None,
    open_keys: bool = False,
) -> Dict[str, Any]:
    """Merge ``user`` onto ``defaults``, rejecting unknown keys and values of the wrong type or range.

    Args:
        defaults: The declared defaults (values or ``Field``s). An empty dict accepts any keys (free-form section).
        user: What the user wrote.
        path: Dotted path of this level, for messages.
        source: The file the user's config came from, for messages.
        open_keys: Accept keys the defaults do not declare (copied as they are) while still checking the declared
            ones: the section of a class that declares no defaults of its own.

    Returns:
        The merged mapping as a plain dict (no ``Field`` left).

    Raises:
        ConfigError: an unknown key (with the nearest valid key suggested), a value of the wrong type, or a value
            outside its declared range; the message names the dotted key.
    """
    where = f" in {os.path.basename(source)}" if source else ""
    if not isinstance(user, Mapping):
        raise ConfigError(f"key '{path}'{where} expects a mapping, got {_type_name(user)} {user!r}")
    if not defaults:
        return copy.deepcopy(to_plain(dict(user)))
    out = plain_defaults(defaults)
    for key, value in user.items():
        full = f"{path}.{key}" if path else str(key)
        if key not in defaults:
            if open_keys:
                out[key] = copy.deepcopy(to_plain(value))
                continue
            raise ConfigError(_unknown_key_message(key, full, path, [str(k) for k in defaults], where))
        default = defaults[key]
        if isinstance(default, Mapping) and value is not None:
            out[key] = validate_merge(default, value, full, source, open_keys)
        else:
            out[key] = _check_value(copy.deepcopy(to_plain(value)), default, full, where)
    return out


def to_plain(obj: Any) -> Any:
    """EasyDict/tuple/numpy scalars -> plain dicts, lists and Python scalars (for YAML dumping)."""
    if isinstance(obj, Mapping):
        return {str(k): to_plain(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [to_plain(v) for v in obj]
    if hasattr(obj, "item") and callable(obj.item):
        try:
            return obj.item()
        except (TypeError, ValueError):
            pass
    return obj


def save_config(cfg: Mapping[str, Any], path: str | os.PathLike) -> None:
    """Write a config as YAML (block style, keys in their declared order), atomically.

    The file is written next to ``path`` and renamed over it, so a process reading a run's ``config.yaml`` while
    another role rewrites it reads one whole config, never a torn one.
    """
    path = os.fspath(path)
    fd, temp = tempfile.mkstemp(prefix=f".{os.path.basename(path)}.", dir=os.path.dirname(path) or ".")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            yaml.safe_dump(to_plain(cfg), f, sort_keys=False, default_flow_style=False)
        os.chmod(temp, 0o644)  # as open() would have made it (mkstemp makes 0600)
        os.replace(temp, path)
    except BaseException:
        if os.path.exists(temp):
            os.unlink(temp)
        raise


def set_by_path(cfg: Dict[str, Any], dotted: str, value: Any) -> None:
    """Set ``cfg['a']['b']['c'] = value`` for ``dotted='a.b.c'``, creating levels as needed."""
    keys = dotted.split(".")
    if not all(keys):
        raise ConfigError(f"malformed key path '{dotted}': expected dotted names like 'policy.learn.batch_size'")
    node = cfg
    for key in keys[:-1]:
        nxt = node.get(key)
        if nxt is None:
            nxt = node[key] = {}
        elif not isinstance(nxt, dict):
            raise ConfigError(f"cannot set '{dotted}': '{key}' holds {nxt!r}, not a section")
        node = nxt
    node[keys[-1]] = value


def parse_overrides(items: Sequence[str]) -> List[tuple]:
    """Parse ``['policy.learn.batch_size=64', ...]`` into ``[(path, value)]`` (values read as YAML scalars)."""
    pairs = []
    for item in items:
        if "=" not in item:
            raise ConfigError(f"override '{item}' must look like key.path=value")
        key, raw = item.split("=", 1)
        try:
            value = yaml.safe_load(raw) if raw != "" else ""
        except yaml.YAMLError:
            value = raw
        pairs.append((key.strip(), value))
    return pairs


def apply_overrides(cfg: Mapping[str, Any], items: Sequence[str]) -> EasyDict:
    """Return a copy of ``cfg`` with dotted overrides applied (validated later by ``compile_config``)."""
    source = config_source(cfg)
    data = to_plain(cfg)
    for key, value in parse_overrides(items):
        set_by_path(data, key, value)
    out = EasyDict(data)
    if source:
        object.__setattr__(out, "_source", source)
    return out
