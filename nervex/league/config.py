"""The ``league:`` section of a config: its defaults, and the checks that name the key at fault."""

from __future__ import annotations

import copy
import math
from typing import Any, Dict, List, Mapping, Optional, Sequence

from nervex.config import ConfigError, suggest_choice

from .payoff import check_payoff_settings
from .pfsp import PFSP_WEIGHTINGS
from .player import ACTIVE_KINDS, MAIN, MAIN_EXPLOITER

MATCHMAKING = ("alphastar", "self_play", "uniform", "pfsp", "nash")
"""How main players pick opponents (exploiters always follow AlphaStar)."""
RATINGS = ("elo",)

DEFAULT_LEAGUE_CONFIG: Dict[str, Any] = {
    "players": [{"name": "main", "kind": "main"}],
    "matchmaking": "alphastar",
    "main_mix": {"pfsp": 0.5, "self_play": 0.35, "verification": 0.15},
    "pfsp_weighting": "squared",
    "verification": {"exploiters_below": 0.3, "history_below": 0.7, "weighting": "squared"},
    "main_exploiter_win_rate": 0.1,
    "main_exploiter_weighting": "variance",
    "league_exploiter_weighting": "linear_capped",
    "league_exploiter_reset_prob": 0.25,
    "payoff": {"decay": 0.99, "min_games": 8},
    "snapshot": {"win_rate": 0.7, "min_steps": 0, "every_steps": None},
    "keep_history": None,
    "rating": {"kind": "elo", "k": 16.0, "initial": 1200.0},
}
"""Every key of the ``league:`` section with its default (``League``'s docstring says what each means)."""

MAX_STEPS = 10**15
LEAGUE_EVAL_DEFAULTS: Dict[str, Any] = {
    "freq": 5000,  # env steps (all players) between two league evaluations
    "exploitability": True,  # computed where the game allows (matrix games, two-player zero-sum open_spiel games)
    "opponent": {"kind": "random"},  # the act-only slot each learning player is evaluated against, in both seats
    "stop_exploitability": None,  # stop once league/exploitability is below this
}
"""The ``league.eval`` sub-section: how the serial league trainer evaluates the league."""
EVAL_OPPONENT_KINDS = ("random", "snapshot", "callable")


def _merge(defaults: Mapping[str, Any], user: Mapping[str, Any], path: str) -> Dict[str, Any]:
    out = copy.deepcopy(dict(defaults))
    for key, value in user.items():
        if key not in defaults:
            raise ConfigError(f"unknown key '{path}.{key}'; {suggest_choice(key, list(defaults))}")
        if isinstance(defaults[key], dict):
            if not isinstance(value, Mapping):
                raise ConfigError(f"key '{path}.{key}' expects a mapping like {defaults[key]}, got {value!r}")
            out[key] = _merge(defaults[key], value, f"{path}.{key}")
        else:
            out[key] = copy.deepcopy(value)
    return out


def _number(value: Any, path: str, low: float, high: float, integer: bool = False) -> float:
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
    if ok and integer:
        ok = float(value).is_integer()
    if not ok or not low <= value <= high:
        what = "an integer" if integer else "a number"
        raise ConfigError(f"key '{path}' must be {what} in [{low:g}, {high:g}], got {value!r}")
    return int(value) if integer else float(value)


def _choice(value: Any, path: str, valid: Sequence[str]) -> str:
    if value not in valid:
        raise ConfigError(f"key '{path}' is {value!r}; {suggest_choice(value, valid)} (choices: {', '.join(valid)})")
    return value


def _players(value: Any, path: str) -> List[Dict[str, str]]:
    if not isinstance(value, (list, tuple)) or not value:
        raise ConfigError(f"key '{path}' expects a non-empty list like [{{name: main, kind: main}}], got {value!r}")
    out: List[Dict[str, str]] = []
    for i, entry in enumerate(value):
        where = f"{path}[{i}]"
        if not isinstance(entry, Mapping):
            raise ConfigError(f"key '{where}' expects a mapping like {{name: main, kind: main}}, got {entry!r}")
        for key in entry:
            if key not in ("name", "kind"):
                raise ConfigError(f"unknown key '{where}.{key}'; {suggest_choice(key, ['name', 'kind'])}")
        name, kind = entry.get("name"), entry.get("kind", MAIN)
        if not isinstance(name, str) or not name or any(c in name for c in "@#/ ") or len(name) > 64:
            raise ConfigError(f"key '{where}.name' must be a name of 1-64 characters without '@#/ ', got {name!r}")
        if name in {p["name"] for p in out}:
            raise ConfigError(f"key '{where}.name': player '{name}' is listed twice; player names are unique")
        out.append({"name": name, "kind": _choice(kind, f"{where}.kind", ACTIVE_KINDS)})
    if any(p["kind"] == MAIN_EXPLOITER for p in out) and not any(p["kind"] == MAIN for p in out):
        raise ConfigError(f"key '{path}' has a main_exploiter but no main player for it to exploit")
    return out


def resolve_league_config(cfg: Optional[Mapping[str, Any]], path: str = "league", where: str = "") -> Dict[str, Any]:
    """``cfg`` laid over ``DEFAULT_LEAGUE_CONFIG``, checked.

    Args:
        cfg: The user's ``league:`` section (None: every default).
        path: How errors name the section.
        where: Appended to the key in messages (`` in league.yaml``).

    Returns:
        The resolved section (plain dicts, numbers as float or int).

    Raises:
        ConfigError: an unknown key (with a suggestion), an unknown choice, a number out of range (the message
            names the key and the range), duplicate player names, or ``main_mix`` shares not summing to 1.
    """
    try:
        return _resolve(cfg, path)
    except ConfigError as error:
        if not where:
            raise
        message = str(error)
        cut = message.find("'", message.find("'") + 1) + 1  # after the first quoted key
        raise ConfigError(message[:cut] + where + message[cut:] if cut > 0 else message + where) from None


def resolve_eval_config(cfg: Optional[Mapping[str, Any]], path: str = "league.eval") -> Dict[str, Any]:
    """The ``league.eval`` sub-section laid over ``LEAGUE_EVAL_DEFAULTS``, checked (errors name the key)."""
    if cfg is not None and not isinstance(cfg, Mapping):
        raise ConfigError(f"key '{path}' expects a mapping, got {cfg!r}")
    user = dict(cfg or {})
    opponent = user.pop("opponent", None)
    out = _merge({k: v for k, v in LEAGUE_EVAL_DEFAULTS.items() if k != "opponent"}, user, path)
    out["freq"] = _number(out["freq"], f"{path}.freq", 1, MAX_STEPS, integer=True)
    if not isinstance(out["exploitability"], bool):
        raise ConfigError(f"key '{path}.exploitability' must be true or false, got {out['exploitability']!r}")
    if out["stop_exploitability"] is not None:
        out["stop_exploitability"] = _number(out["stop_exploitability"], f"{path}.stop_exploitability", 0.0, 1e9)
    opponent = dict(LEAGUE_EVAL_DEFAULTS["opponent"] if opponent is None else opponent)
    if not isinstance(opponent, dict) or "seats" in opponent:
        raise ConfigError(
            f"key '{path}.opponent' expects a slot without seats ({{kind: random | snapshot | callable, path, fn}}: "
            f"the trainer seats it at both seats in turn), got {opponent!r}"
        )
    opponent["kind"] = _choice(opponent.get("kind"), f"{path}.opponent.kind", EVAL_OPPONENT_KINDS)
    out["opponent"] = opponent
    return out


def _resolve(cfg: Optional[Mapping[str, Any]], path: str) -> Dict[str, Any]:
    if cfg is not None and not isinstance(cfg, Mapping):
        raise ConfigError(f"key '{path}' expects a mapping, got {cfg!r}")
    out = _merge(DEFAULT_LEAGUE_CONFIG, cfg or {}, path)
    out["players"] = _players(out["players"], f"{path}.players")
    out["matchmaking"] = _choice(out["matchmaking"], f"{path}.matchmaking", MATCHMAKING)
    for key in ("pfsp_weighting", "main_exploiter_weighting", "league_exploiter_weighting"):
        out[key] = _choice(out[key], f"{path}.{key}", list(PFSP_WEIGHTINGS))
    mix = {k: _number(v, f"{path}.main_mix.{k}", 0.0, 1.0) for k, v in out["main_mix"].items()}
    if abs(sum(mix.values()) - 1.0) > 1e-6:
        raise ConfigError(f"key '{path}.main_mix' shares must sum to 1, got {mix} (sum {sum(mix.values()):.6g})")
    out["main_mix"] = mix
    ver = out["verification"]
    for key in ("exploiters_below", "history_below"):
        ver[key] = _number(ver[key], f"{path}.verification.{key}", 0.0, 1.0)
    ver["weighting"] = _choice(ver["weighting"], f"{path}.verification.weighting", list(PFSP_WEIGHTINGS))
    for key in ("main_exploiter_win_rate", "league_exploiter_reset_prob"):
        out[key] = _number(out[key], f"{path}.{key}", 0.0, 1.0)
    pay = out["payoff"]
    pay["decay"] = _number(pay["decay"], f"{path}.payoff.decay", 1e-9, 1.0)
    pay["min_games"] = _number(pay["min_games"], f"{path}.payoff.min_games", 0.0, 1e9)
    try:
        check_payoff_settings(pay["decay"], pay["min_games"], f"{path}.payoff")
    except ValueError as error:
        raise ConfigError(f"key '{path}.payoff.min_games': {error}") from None
    snap = out["snapshot"]
    snap["win_rate"] = _number(snap["win_rate"], f"{path}.snapshot.win_rate", 0.0, 1.0)
    snap["min_steps"] = _number(snap["min_steps"], f"{path}.snapshot.min_steps", 0, MAX_STEPS, integer=True)
    if snap["every_steps"] is not None:
        snap["every_steps"] = _number(snap["every_steps"], f"{path}.snapshot.every_steps", 1, MAX_STEPS, True)
    if out["keep_history"] is not None:
        out["keep_history"] = _number(out["keep_history"], f"{path}.keep_history", 1, 10**6, integer=True)
    rating = out["rating"]
    rating["kind"] = _choice(rating["kind"], f"{path}.rating.kind", RATINGS)
    rating["k"] = _number(rating["k"], f"{path}.rating.k", 1e-6, 1000.0)
    rating["initial"] = _number(rating["initial"], f"{path}.rating.initial", -1e6, 1e6)
    return out


__all__ = [
    "DEFAULT_LEAGUE_CONFIG",
    "LEAGUE_EVAL_DEFAULTS",
    "MATCHMAKING",
    "RATINGS",
    "resolve_eval_config",
    "resolve_league_config",
]
