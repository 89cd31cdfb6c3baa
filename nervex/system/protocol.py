"""The parallel mode's wire protocol: its version, route paths, the ``system`` config section and request checks.

Every role (coordinator, manager, league manager, learner, actor) imports this module and nothing of the others, so
what one role sends and another reads is declared once, here:

* ``PROTOCOL_VERSION`` and ``config_hash``: a worker registers with both, and the coordinator refuses (403) a worker
  of another protocol or started from another config.
* The route paths (``REGISTER_PATH`` ...): every route is a signed JSON ``POST``.
* The ``system`` config section and ``config_hash`` live beside it, in ``nervex.system.system_config``.
* ``require``/``optional``/``check_known`` and ``validate_collect_result``: request checks whose 400 names the field.

Nothing here imports torch, gymnasium, a policy, an env or the builder, whatever the call: the coordinator reads
the plain values of the compiled ``system`` section.
"""

from __future__ import annotations

import difflib
import json
import math
import os
import re
import tempfile
from typing import Any, Dict, Iterable, Mapping, Optional, Tuple, Type, Union

from nervex.system.comm.errors import ProtocolError
from nervex.system.comm.storage import KIND_PATTERN, SUFFIX

PROTOCOL_VERSION = 3
"""2: lease and complete requests carry a request_id (KEYED_PATHS); 3: actors play a collect task's ``opponent`` and
report each episode's ``outcome`` (``validate_collect_result``)."""
ROLES = ("actor", "learner", "manager", "league_manager")

REGISTER_PATH = "/v1/register"
HEARTBEAT_PATH = "/v1/heartbeat"
HEARTBEATS_PATH = "/v1/heartbeats"
TASK_LEASE_PATH = "/v1/task/lease"
TASK_COMPLETE_PATH = "/v1/task/complete"
TASK_FAIL_PATH = "/v1/task/fail"
DATA_POLL_PATH = "/v1/data/poll"
LEARNER_PROGRESS_PATH = "/v1/learner/progress"
RUN_FINISH_PATH = "/v1/run/finish"
STATUS_PATH = "/v1/status"
LEAGUE_UPDATE_PATH = "/v1/league/update"
ROUTES = (
    REGISTER_PATH,
    HEARTBEAT_PATH,
    HEARTBEATS_PATH,
    TASK_LEASE_PATH,
    TASK_COMPLETE_PATH,
    TASK_FAIL_PATH,
    DATA_POLL_PATH,
    LEARNER_PROGRESS_PATH,
    RUN_FINISH_PATH,
    STATUS_PATH,
    LEAGUE_UPDATE_PATH,
)

KEYED_PATHS = (TASK_LEASE_PATH, TASK_COMPLETE_PATH)
"""Routes that lease (a complete with ``lease_next`` leases too), so not idempotent by their body alone: ``RoleLink``
adds a ``request_id``, the same through every retry of one call, and a lease whose answer was lost is handed out again
instead of a second task being leased."""

COORDINATOR_URL_FILE = "coordinator.url"
"""``<run_dir>/coordinator.url``: the coordinator's ``http://host:port``, written atomically once it listens."""
MAX_POLL_LIMIT = 1000
"""The most items one ``/v1/data/poll`` returns."""
MAX_BEATS = 4096
"""The most workers' heartbeats one ``/v1/heartbeats`` carries (a manager batches its node's actors)."""

_STORAGE_NAME = re.compile(rf"{KIND_PATTERN}/[0-9a-f]{{64}}{re.escape(SUFFIX)}")
_TYPE_NAMES = {
    str: "a string",
    int: "an integer",
    float: "a number",
    bool: "a boolean",
    dict: "an object",
    list: "a list",
}
Kind = Union[Type[Any], Tuple[Type[Any], ...]]


def write_coordinator_url(run_dir: str, url: str) -> str:
    """Write ``url`` to ``<run_dir>/coordinator.url`` atomically (temporary file, fsync, rename); returns the path."""
    return _write_atomically(run_dir, COORDINATOR_URL_FILE, url + "\n")


RUN_FINISHED_FILE = "run_finished.json"
"""``<run_dir>/run_finished.json``: written by the coordinator once the run finished (``{reason, worker_id, at}``),
before any answer says stop, so a launcher tells a role that ended because the run is over from one that ended
early (``run_slurm.sh`` starts the latter again)."""


def write_run_finished(run_dir: str, record: Mapping[str, Any]) -> str:
    """Write ``record`` to ``<run_dir>/run_finished.json`` atomically; returns the path."""
    return _write_atomically(run_dir, RUN_FINISHED_FILE, json.dumps(dict(record)) + "\n")


def _write_atomically(run_dir: str, name: str, text: str) -> str:
    path = os.path.join(run_dir, name)
    fd, temp = tempfile.mkstemp(prefix=f".{name}.", dir=run_dir)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(temp, path)
    except BaseException:
        if os.path.exists(temp):
            os.unlink(temp)
        raise
    return path


def read_coordinator_url(run_dir: str) -> Optional[str]:
    """The URL in ``<run_dir>/coordinator.url``, or None when the file is missing or empty."""
    try:
        with open(os.path.join(run_dir, COORDINATOR_URL_FILE), encoding="ascii") as f:
            return f.read().strip() or None
    except FileNotFoundError:
        return None


# ---- request checks -----------------------------------------------------------------------------------------------
def check_known(body: Any, names: Iterable[str], where: str = "") -> Dict[str, Any]:
    """``body`` as a dict, after refusing a body that is not an object or holds a field not in ``names``.

    Raises:
        ProtocolError: 400 naming the unknown field (and the nearest known one).
    """
    label = where or "body"
    if not isinstance(body, dict):
        raise ProtocolError(400, f"'{label}' must be a JSON object, got {_json_type(body)}", field=where or "body")
    names = list(names)
    for key in body:
        if key not in names:
            close = difflib.get_close_matches(str(key), names, n=1, cutoff=0.6)
            hint = f"; did you mean '{close[0]}'?" if close else f"; known fields: {', '.join(names)}"
            raise ProtocolError(400, f"unknown field '{_join(where, key)}'{hint}", field=_join(where, key))
    return body


def require(body: Mapping[str, Any], name: str, kind: Kind, *, ge: Optional[float] = None, where: str = "") -> Any:
    """The field ``name`` of ``body``, which must be present, of ``kind`` and (for numbers) ``>= ge``.

    ``int`` never accepts a boolean; ``float`` accepts an integer.

    Raises:
        ProtocolError: 400 naming the field.
    """
    field = _join(where, name)
    if name not in body:
        raise ProtocolError(400, f"missing field '{field}'", field=field)
    return _check_type(body[name], kind, field, ge)


def optional(
    body: Mapping[str, Any], name: str, kind: Kind, default: Any = None, *, ge: Optional[float] = None, where: str = ""
) -> Any:
    """Like ``require``, but a missing field or a null gives ``default``."""
    if body.get(name) is None:
        return default
    return _check_type(body[name], kind, _join(where, name), ge)


def require_storage_name(value: Any, field: str) -> str:
    """``value`` if it is a storage name ``'<kind>/<64 hex>.safetensors'``; else a 400 naming ``field``."""
    if not isinstance(value, str) or not _STORAGE_NAME.fullmatch(value):
        raise ProtocolError(
            400, f"'{field}' must be a storage name '<kind>/<64 lowercase hex>{SUFFIX}', got {value!r:.120}", field
        )
    return value


COLLECT_RESULT_FIELDS = ("data", "n_samples", "env_steps", "episodes", "policy_iter", "info")
EPISODE_FIELDS = ("return", "length", "outcome")
OUTCOMES = (-1, 0, 1)
"""An episode's outcome for the actor's (first) learning slot: loss, draw, win."""


def validate_collect_result(result: Any) -> Dict[str, Any]:
    """Check a collect task's result: ``{data, n_samples, env_steps, episodes: [{return, length[, outcome]}],
    policy_iter}``.

    ``data`` is the storage name of the trajectories, ``n_samples`` the train samples in it, ``env_steps`` the env
    steps taken, ``episodes`` the episodes that ended during the task (at most one per env step): the (first)
    learning slot's return, the length and, for games, its ``outcome`` (+1 win, 0 draw, -1 loss); ``policy_iter``
    the snapshot's learner iteration actually used; an optional ``info`` object holds free-form metrics.

    Returns:
        ``result`` unchanged.

    Raises:
        ProtocolError: 400 naming the field (``result.episodes[2].length``).
    """
    check_known(result, COLLECT_RESULT_FIELDS, "result")
    require_storage_name(require(result, "data", str, where="result"), "result.data")
    for name in ("n_samples", "env_steps", "policy_iter"):
        require(result, name, int, ge=0, where="result")
    optional(result, "info", dict, where="result")
    episodes = require(result, "episodes", list, where="result")
    if len(episodes) > result["env_steps"]:
        raise ProtocolError(
            400,
            f"'result.episodes' lists {len(episodes)} episodes, more than the {result['env_steps']} env steps taken "
            "(an env step ends at most one episode)",
            field="result.episodes",
        )
    for i, episode in enumerate(episodes):
        where = f"result.episodes[{i}]"
        check_known(episode, EPISODE_FIELDS, where)
        require(episode, "return", float, where=where)
        require(episode, "length", int, ge=1, where=where)
        outcome = optional(episode, "outcome", int, where=where)
        if outcome is not None and outcome not in OUTCOMES:
            raise ProtocolError(
                400, f"'{where}.outcome' must be -1 (loss), 0 (draw) or 1 (win), got {outcome!r}", f"{where}.outcome"
            )
    return result


def _check_type(value: Any, kind: Kind, field: str, ge: Optional[float]) -> Any:
    kinds = kind if isinstance(kind, tuple) else (kind,)
    if not any(_is_kind(value, k) for k in kinds):
        expected = " or ".join(_TYPE_NAMES.get(k, k.__name__) for k in kinds)
        raise ProtocolError(400, f"'{field}' must be {expected}, got {_json_type(value)} {value!r:.80}", field=field)
    if isinstance(value, float) and not math.isfinite(value):
        raise ProtocolError(400, f"'{field}' must be finite, got {value!r}", field=field)
    if ge is not None and isinstance(value, (int, float)) and not isinstance(value, bool) and value < ge:
        raise ProtocolError(400, f"'{field}' must be >= {ge:g}, got {value!r}", field=field)
    return value


def _is_kind(value: Any, kind: Type[Any]) -> bool:
    if isinstance(value, bool):
        return kind is bool
    if kind is float:
        return isinstance(value, (int, float))
    return isinstance(value, kind)


def _json_type(value: Any) -> str:
    for kind, name in ((type(None), "null"), (bool, "a boolean"), (dict, "an object"), (list, "a list")):
        if isinstance(value, kind):
            return name
    return _TYPE_NAMES.get(type(value), type(value).__name__)


def _join(where: str, name: Any) -> str:
    return f"{where}.{name}" if where else str(name)


__all__ = [
    "PROTOCOL_VERSION",
    "ROLES",
    "ROUTES",
    "RUN_FINISHED_FILE",
    "KEYED_PATHS",
    "REGISTER_PATH",
    "HEARTBEAT_PATH",
    "HEARTBEATS_PATH",
    "TASK_LEASE_PATH",
    "TASK_COMPLETE_PATH",
    "TASK_FAIL_PATH",
    "DATA_POLL_PATH",
    "LEARNER_PROGRESS_PATH",
    "RUN_FINISH_PATH",
    "STATUS_PATH",
    "LEAGUE_UPDATE_PATH",
    "COORDINATOR_URL_FILE",
    "MAX_BEATS",
    "MAX_POLL_LIMIT",
    "COLLECT_RESULT_FIELDS",
    "EPISODE_FIELDS",
    "OUTCOMES",
    "write_coordinator_url",
    "write_run_finished",
    "read_coordinator_url",
    "check_known",
    "require",
    "optional",
    "require_storage_name",
    "validate_collect_result",
]
