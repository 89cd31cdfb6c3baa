"""The search space of ``nervex -m tune``: a YAML file of dotted config keys and the range each is searched in.

::

    policy.learn.learning_rate: {type: loguniform, low: 1.0e-4, high: 1.0e-2}
    policy.learn.update_per_collect: {type: int, low: 1, high: 8}
    policy.learn.target_update_freq: {type: int, low: 5, high: 500, log: true}
    policy.command.eps.end: {type: uniform, low: 0.01, high: 0.1, step: 0.01}
    policy.model.hidden_sizes: {type: choice, choices: [[64, 64], [256, 256]]}

The whole file is checked before any trial runs: every key must exist in the compiled config (a typo is an error
with the nearest key suggested), its type must suit the key's value (a float range for an integer key is an error),
and each bound (every choice) is laid into the config and compiled, so a value the config would refuse from
``--set`` is refused here too, naming the key and the file.
"""

from __future__ import annotations

import difflib
import math
import os
from dataclasses import dataclass
from typing import Any, Dict, List, Mapping, Optional, Sequence

import yaml
from easydict import EasyDict

from nervex.config import ConfigError, set_by_path, to_plain

SPACE_TYPES = ("loguniform", "uniform", "int", "choice")
SPEC_KEYS = {
    "loguniform": ("type", "low", "high"),
    "uniform": ("type", "low", "high", "log", "step"),
    "int": ("type", "low", "high", "log", "step"),
    "choice": ("type", "choices"),
}
RESERVED_KEYS = {
    "seed": "the tuner seeds each trial itself (-s/--seed and --seeds)",
    "exp_name": "the tuner names each trial's run directory",
}


class SpaceError(ConfigError):
    """A search space file is malformed or names a key or value the config cannot take."""


@dataclass(frozen=True)
class ParamSpec:
    """One searched key.

    Attributes:
        key: The dotted config key (also the Optuna parameter name).
        type: ``loguniform``, ``uniform``, ``int`` or ``choice``.
        low, high: The range (numeric types).
        log: Sample on a log scale (``loguniform`` always does).
        step: The grid of a ``uniform`` or ``int`` range (None: continuous, or 1 for ``int``).
        choices: The values of a ``choice`` (a list value, such as ``hidden_sizes``, is offered to Optuna as its
            YAML text ``'[64, 64]'`` and turned back into the list).
    """

    key: str
    type: str
    low: Optional[float] = None
    high: Optional[float] = None
    log: bool = False
    step: Optional[float] = None
    choices: tuple = ()

    def suggest(self, trial: Any) -> Any:
        """The value an Optuna trial samples (or was enqueued with) for this key, as the config takes it."""
        if self.type == "choice":
            labels = [choice_label(c) for c in self.choices]
            label = trial.suggest_categorical(self.key, labels)
            return self.choices[labels.index(label)]
        if self.type == "int":
            step = int(self.step) if self.step is not None else 1
            return trial.suggest_int(self.key, int(self.low), int(self.high), step=step, log=self.log)
        return trial.suggest_float(self.key, self.low, self.high, step=self.step, log=self.log)

    def config_value(self, param: Any) -> Any:
        """A stored Optuna parameter (a choice's label) -> the config's value."""
        if self.type == "choice":
            labels = [choice_label(c) for c in self.choices]
            return self.choices[labels.index(param)] if param in labels else param
        return param

    def bounds(self) -> List[Any]:
        """The values whose acceptance by the config stands for the whole range: both ends, or every choice."""
        if self.type == "choice":
            return list(self.choices)
        if self.type == "int":
            return [int(self.low), int(self.high)]
        return [self.low, self.high]

    def describe(self) -> str:
        """``loguniform[0.0001, 0.01]``, ``int[1, 8] step 2``, ``choice{32, 64}``: for summaries."""
        if self.type == "choice":
            return "choice{" + ", ".join(str(choice_label(c)) for c in self.choices) + "}"
        scale = " log" if self.log and self.type != "loguniform" else ""
        step = f" step {self.step:g}" if self.step is not None else ""
        return f"{self.type}[{self.low:g}, {self.high:g}]{scale}{step}"


def choice_label(value: Any) -> Any:
    """How a choice is offered to Optuna: scalars as they are, a list as its YAML flow text (``'[64, 64]'``)."""
    if isinstance(value, (list, tuple)):
        return yaml.safe_dump(list(value), default_flow_style=True).strip()
    return value


def _number(spec: Mapping[str, Any], name: str, key: str, where: str) -> float:
    """A bound as a float; YAML 1.1 reads ``1e-4`` as text, so numeric text is accepted as the config does."""
    if name not in spec:
        raise SpaceError(f"key '{key}'{where}: type '{spec['type']}' needs '{name}'")
    value = spec[name]
    if isinstance(value, str):
        try:
            value = float(value.strip())
        except ValueError:
            raise SpaceError(f"key '{key}'{where}: '{name}' must be a number, got {spec[name]!r}") from None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise SpaceError(f"key '{key}'{where}: '{name}' must be a finite number, got {spec[name]!r}")
    return float(value)


def parse_param(key: str, spec: Any, where: str) -> ParamSpec:
    """Check one entry of a space file (its own rules; the config is consulted by ``check_against_config``).

    Raises:
        SpaceError: not a mapping, an unknown type or spec key, ``low >= high``, ``low <= 0`` for a log scale,
            a fractional ``int`` bound, a step with a log scale, an empty or repeated choice.
    """
    if not isinstance(spec, Mapping):
        raise SpaceError(f"key '{key}'{where} must map to a range like {{type: uniform, low: 0.9, high: 0.99}}")
    kind = spec.get("type")
    if kind not in SPACE_TYPES:
        close = difflib.get_close_matches(str(kind), SPACE_TYPES, n=1)
        hint = f"; did you mean '{close[0]}'?" if close else f"; valid types: {', '.join(SPACE_TYPES)}"
        raise SpaceError(f"key '{key}'{where}: unknown type {kind!r}{hint}")
    for name in spec:
        if name not in SPEC_KEYS[kind]:
            raise SpaceError(
                f"key '{key}'{where}: '{name}' does not apply to type '{kind}' (it takes {', '.join(SPEC_KEYS[kind])})"
            )
    if kind == "choice":
        return _parse_choice(key, spec, where)
    low, high = _number(spec, "low", key, where), _number(spec, "high", key, where)
    if low >= high:
        raise SpaceError(f"key '{key}'{where}: low must be below high, got low={low:g} high={high:g}")
    log = kind == "loguniform" or bool(spec.get("log", False))
    if not isinstance(spec.get("log", False), bool):
        raise SpaceError(f"key '{key}'{where}: 'log' must be true or false, got {spec['log']!r}")
    if log and low <= 0:
        raise SpaceError(f"key '{key}'{where}: a log scale needs low > 0, got low={low:g}")
    step = _number(spec, "step", key, where) if "step" in spec else None
    if step is not None and (step <= 0 or step > high - low):
        raise SpaceError(f"key '{key}'{where}: step must be in (0, high - low], got {step:g}")
    if kind == "int":
        for name, value in (("low", low), ("high", high), ("step", step)):
            if value is not None and not float(value).is_integer():
                raise SpaceError(f"key '{key}'{where}: type 'int' needs an integer '{name}', got {value:g}")
    if log and step is not None and not (kind == "int" and step == 1):
        raise SpaceError(f"key '{key}'{where}: 'step' cannot be combined with a log scale")
    return ParamSpec(key=key, type=kind, low=low, high=high, log=log, step=step)


def _parse_choice(key: str, spec: Mapping[str, Any], where: str) -> ParamSpec:
    choices = spec.get("choices")
    if not isinstance(choices, list) or not choices:
        raise SpaceError(f"key '{key}'{where}: type 'choice' needs a non-empty list 'choices', got {choices!r}")
    labels = []
    for choice in choices:
        items = choice if isinstance(choice, list) else [choice]
        if not all(item is None or isinstance(item, (bool, int, float, str)) for item in items):
            raise SpaceError(f"key '{key}'{where}: a choice must be a scalar or a list of scalars, got {choice!r}")
        labels.append(choice_label(choice))
    repeated = sorted({str(label) for label in labels if labels.count(label) > 1})
    if repeated:
        raise SpaceError(f"key '{key}'{where}: repeated choices {', '.join(repeated)}")
    return ParamSpec(key=key, type="choice", choices=tuple(choices))


def read_space(path: str | os.PathLike) -> List[ParamSpec]:
    """Read and check a space file on its own (``load_space`` also checks it against a config).

    Raises:
        FileNotFoundError: ``path`` does not exist.
        SpaceError: bad YAML, not a non-empty mapping, or a bad entry (``parse_param``).
    """
    path = os.fspath(path)
    if not os.path.isfile(path):
        raise FileNotFoundError(f"search space file not found: '{path}' (working directory: {os.getcwd()})")
    where = f" in {os.path.basename(path)}"
    try:
        with open(path, encoding="utf-8") as f:
            data = yaml.safe_load(f)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        at = f"{path}:{mark.line + 1}:{mark.column + 1}" if mark is not None else path
        raise SpaceError(f"YAML syntax error in {at}: {getattr(e, 'problem', None) or e}") from None
    if not isinstance(data, dict) or not data:
        raise SpaceError(
            f"search space file '{path}' must map dotted config keys to ranges, e.g. "
            "'policy.learn.learning_rate: {type: loguniform, low: 1.0e-4, high: 1.0e-2}'"
        )
    params = []
    for key, spec in data.items():
        if not isinstance(key, str) or not all(key.split(".")):
            raise SpaceError(f"key {key!r}{where} must be a dotted config key like 'policy.learn.batch_size'")
        if key in RESERVED_KEYS:
            raise SpaceError(f"key '{key}'{where} cannot be searched: {RESERVED_KEYS[key]}")
        params.append(parse_param(key, spec, where))
    return params


def flat_keys(cfg: Mapping[str, Any], prefix: str = "") -> List[str]:
    """Every dotted path of a nested mapping (sections and leaves)."""
    keys = []
    for key, value in cfg.items():
        path = f"{prefix}.{key}" if prefix else str(key)
        keys.append(path)
        if isinstance(value, Mapping):
            keys += flat_keys(value, path)
    return keys


def lookup(cfg: Mapping[str, Any], dotted: str) -> Any:
    """``cfg['a']['b']`` for ``'a.b'``; raises KeyError when a level is missing."""
    node: Any = cfg
    for part in dotted.split("."):
        if not isinstance(node, Mapping) or part not in node:
            raise KeyError(dotted)
        node = node[part]
    return node


def _check_kind(param: ParamSpec, default: Any, where: str, config_name: str) -> None:
    """The space type must suit the key's compiled value: numbers for ranges, integers for integer keys."""
    if isinstance(default, Mapping):
        raise SpaceError(f"key '{param.key}'{where} is a section of {config_name}, not a value")
    if param.type == "choice" or default is None:
        return
    if isinstance(default, bool) or not isinstance(default, (int, float)):
        raise SpaceError(
            f"key '{param.key}'{where} holds {type(default).__name__} {default!r} in {config_name}: "
            f"search it with type 'choice', not '{param.type}'"
        )
    if isinstance(default, int) and param.type != "int":
        raise SpaceError(
            f"key '{param.key}'{where} is an integer in {config_name} ({default!r}): use type 'int' "
            f"(with log: true for a log scale), not '{param.type}'"
        )


def trial_config(user_cfg: Mapping[str, Any], values: Mapping[str, Any]) -> EasyDict:
    """The user's config (after ``--set``) with the sampled values laid in, ready for ``compile_config``."""
    data = to_plain(user_cfg)
    for key, value in values.items():
        set_by_path(data, key, value)
    out = EasyDict(data)
    source = getattr(user_cfg, "_source", None)
    if source:
        object.__setattr__(out, "_source", source)
    return out


def load_space(
    path: str | os.PathLike, user_cfg: Mapping[str, Any], compiled: Mapping[str, Any], compile_fn: Any
) -> List[ParamSpec]:
    """Read a space file and check every entry against the config it will search.

    Args:
        path: The space YAML.
        user_cfg: The user's config after ``--set`` (what trials lay their values into).
        compiled: ``compile_fn(user_cfg)``: where each key must exist.
        compile_fn: The builder-aware ``compile_config``; each bound (each choice) is laid into ``user_cfg``
            and compiled, so a range the config refuses fails now, not in trial 7.

    Returns:
        The parameters, in the file's order.

    Raises:
        SpaceError: a problem of the file (``read_space``), a key the compiled config does not hold (with the
            nearest one suggested), a type that does not suit the key's value, or a bound the config refuses.
    """
    params = read_space(path)
    where = f" in {os.path.basename(os.fspath(path))}"
    source = getattr(user_cfg, "_source", None)
    config_name = os.path.basename(source) if source else "the config"
    known = flat_keys(compiled)
    for param in params:
        try:
            default = lookup(compiled, param.key)
        except KeyError:
            close = difflib.get_close_matches(param.key, known, n=1, cutoff=0.6)
            hint = f"; did you mean '{close[0]}'?" if close else ""
            raise SpaceError(
                f"key '{param.key}'{where} does not exist in the compiled config of {config_name}{hint} (a key the "
                "config may hold but does not set, such as a model keyword argument, must be written in the config "
                "or given with --set first)"
            ) from None
        _check_kind(param, default, where, config_name)
        for value in param.bounds():
            try:
                compile_fn(trial_config(user_cfg, {param.key: value}))
            except ConfigError as e:
                raise SpaceError(
                    f"key '{param.key}'{where}: the value {value!r} is refused by the config: {e}"
                ) from None
    return params


def space_summary(params: Sequence[ParamSpec]) -> Dict[str, str]:
    """``{key: 'loguniform[0.0001, 0.01]'}``: what a study records so that a resume with another space is caught."""
    return {p.key: p.describe() for p in params}


__all__ = [
    "ParamSpec",
    "SpaceError",
    "SPACE_TYPES",
    "choice_label",
    "load_space",
    "read_space",
    "parse_param",
    "space_summary",
    "trial_config",
    "lookup",
]
