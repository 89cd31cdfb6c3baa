"""The parallel mode's wire protocol: its version, route paths, the ``system`` config section and request checks.

Every role (coordinator, manager, league manager, learner, actor) imports this module and nothing of the others, so
what one role sends and another reads is declared once, here:

* ``PROTOCOL_VERSION`` and ``config_hash``: a worker registers with both, and the coordinator refuses (403) a worker
  of another protocol or started from another config.
* The route paths (``REGISTER_PATH`` ...): every route is a signed JSON ``POST``.
* ``SYSTEM_CONFIG``: the declared defaults of the config's ``system`` section. ``parallel_parts`` adds it to the
  serial run's parts, so ``nervex.entry.compile_parallel_config`` validates a whole parallel-mode config (an unknown
  key is an error with a suggestion) and writes the policy's collect unit and counts into ``system.collect``
  (``resolve_collect``). ``compile_coordinator_config`` re-validates such a compiled config without any policy.
* ``require``/``optional``/``check_known`` and ``validate_collect_result``: request checks whose 400 names the field.

Nothing here imports torch, gymnasium, a policy, an env or the builder, whatever the call: the coordinator reads
the plain values of the compiled ``system`` section.
"""

from __future__ import annotations

import difflib
import hashlib
import json
import math
import os
import re
import tempfile
from typing import Any, Dict, Iterable, Mapping, NamedTuple, Optional, Tuple, Type, Union

from easydict import EasyDict

from nervex.config import TOP_LEVEL_DEFAULTS, ConfigError, ConfigParts, Field, compile_config, is_compiled, to_plain
from nervex.config.config import config_source
from nervex.system.comm.errors import ProtocolError
from nervex.system.comm.storage import KIND_PATTERN, SUFFIX

PROTOCOL_VERSION = 3
"""2: lease and complete requests carry a request_id (KEYED_PATHS); 3: actors play a collect task's ``opponent`` and
report each episode's ``outcome`` (``validate_collect_result``)."""
ROLES = ("actor", "learner", "manager", "league_manager")

REGISTER_PATH = "/v1/register"
HEARTBEAT_PATH = "/v1/heartbeat"
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

STORAGE_CONFIG: Dict[str, Any] = dict(
    root=Field(None, kind="str"),  # the payload directory every process reaches; null: <run_dir>/storage
)

COORDINATOR_CONFIG: Dict[str, Any] = dict(
    host="127.0.0.1",  # bind address; anything but loopback exposes an unencrypted control plane
    port=Field(0, ge=0, le=65535),  # 0: the port of the previous <run_dir>/coordinator.url if free, else any free one
    lease_s=Field(30.0, gt=0),  # a task lease lasts this long from its grant or its last heartbeat
    heartbeat_s=Field(None, gt=0, kind="number"),  # how often workers heartbeat; null: lease_s / 3
    max_attempts=Field(3, ge=1),  # leases a task gets (failures, expiries) before it is marked failed
    tick_s=Field(0.2, gt=0),  # period of the background pass: expire leases, create collect tasks
    max_pending_collect=Field(4, ge=1),  # collect tasks kept queued for actors (set >= the number of actors)
    n_sample=Field(None, ge=1, kind="int"),  # env steps per collect task; null: the policy's policy.collect.n_sample
    samples_per_insert=Field(None, gt=0, kind="number"),  # off-policy rate limit (Reverb's); null: off
    max_queued_results=Field(64, ge=1),  # results the learner has not polled yet above which no task is created
    hard_queued_results=Field(None, ge=1, kind="int"),  # ... above which a complete is refused (429); null: 2x soft
    min_free_bytes=Field(256 << 20, ge=0),  # free space on the storage root and run dir under which results are 507
)

LEARNER_CONFIG: Dict[str, Any] = dict(
    snapshot_every=Field(10, ge=1),  # off-policy: publish the weights every this many gradient steps
    snapshot_min_interval_s=Field(0.2, ge=0),  # ... but not more often than this (on-policy: after every rollout)
    keep_snapshots=Field(8, ge=2),  # the learner deletes its older snapshot files (league copies are kept apart)
    max_policy_lag=Field(None, ge=0, kind="int"),  # drop data whose snapshot is this many gradient steps old; null: off
    poll_limit=Field(100, ge=1, le=1000),  # results fetched per /v1/data/poll
    poll_wait_s=Field(0.02, gt=0),  # sleep when a poll brought nothing and nothing is left to train on
    checkpoint_interval_min=Field(10.0, gt=0),  # write <run_dir>/ckpt/iteration_<n>.pt this often (and on SIGTERM)
    keep_checkpoints=Field(3, ge=1),  # periodic checkpoints kept (best.pt apart)
    dist_timeout_s=Field(120.0, gt=0),  # torch.distributed process-group timeout (several learner ranks)
)

ACTOR_CONFIG: Dict[str, Any] = dict(
    idle_wait_s=Field(0.02, gt=0),  # first wait when no collect task is available (doubles up to 0.5 s)
    seed_stride=Field(1000, ge=1),  # actor i seeds its envs from seed + (i + 1) * seed_stride
    prefetch=Field(True),  # lease the next task and report the last one in a background thread while collecting
    io_process=Field(True),  # write samples and make the round trips in a forked process, off collection's GIL
)

MANAGER_CONFIG: Dict[str, Any] = dict(
    actors=Field(1, ge=0),  # actor processes each manager starts and restarts
    max_restarts=Field(20, ge=0),  # restarts per worker slot before the manager gives up on it
    restart_backoff_s=Field(1.0, ge=0),  # first wait before a restart (doubles per quick death, at most 30 s)
)

LEAGUE_CONFIG: Dict[str, Any] = dict(
    poll_s=Field(0.1, gt=0),  # how often the league manager reads the learner's progress and sets the choice
    keep_history=Field(32, ge=1),  # snapshots of the main player kept as league history (future opponents)
    history_every=Field(1000, ge=1),  # gradient steps between two history snapshots
)

COLLECT_CONFIG: Dict[str, Any] = dict(
    unit=Field(None, choices=("sample", "rollout", "episode"), kind="str"),  # the policy's collect unit
    n=Field(None, ge=1, kind="int"),  # of that unit per collect task: system.coordinator.n_sample, else the policy's
    restart_envs=Field(None, kind="bool"),  # the envs restart at each task (on-policy episodes)
    learning_starts=Field(None, ge=0, kind="int"),  # env steps before the first gradient step (0: on-policy)
)
"""``system.collect``: what one collect task asks for, as plain values. ``nervex.entry.compile_parallel_config``
writes them from the policy's training contract; a value given by hand must equal the resolved one. The coordinator
reads them here, so it never imports the policy."""

SYSTEM_CONFIG: Dict[str, Any] = dict(
    collect=COLLECT_CONFIG,
    storage=STORAGE_CONFIG,
    coordinator=COORDINATOR_CONFIG,
    learner=LEARNER_CONFIG,
    actor=ACTOR_CONFIG,
    manager=MANAGER_CONFIG,
    league=LEAGUE_CONFIG,
)
"""The ``system`` section's declared defaults; each role adds its own sub-section here."""

LOCAL_KEYS = frozenset({"host", "port", "root"})
"""Keys of a ``system`` sub-section that may differ per process (addresses, mount points): not in ``config_hash``."""

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


# ---- config -------------------------------------------------------------------------------------------------------
RUN_SECTIONS = ("env", "policy", "replay_buffer", "learner", "actor", "evaluator")
"""The sections of a run config besides ``system`` (``nervex.entry.config_parts`` declares what validates each)."""


class CollectTask(NamedTuple):
    """What one collect task asks for (``system.collect``): read by ``SerialActor.collect`` like a ``CollectSpec``."""

    unit: str
    n: int
    restart_envs: bool


def parallel_parts(parts: ConfigParts) -> ConfigParts:
    """The serial run's parts (``nervex.entry.config_parts``) plus the ``system`` section and its cross-key checks.

    ``system.collect`` is resolved by the caller, who knows the policy (``resolve_collect``, a check it appends).
    """
    parts.sections["system"] = SYSTEM_CONFIG
    parts.checks.append(_check_coordinator)
    return parts


def resolve_collect(
    out: Dict[str, Any], unit: str, n: int, restart_envs: bool, learning_starts: int, where: str = ""
) -> None:
    """Write the policy's collect spec into ``out['system']['collect']`` (a ``ConfigParts`` check's body).

    Args:
        out: The merged config (``system`` compiled).
        unit, n, restart_envs: The policy's ``CollectSpec``; ``system.coordinator.n_sample`` replaces ``n`` when set.
        learning_starts: The policy's ``LearnSpec.learning_starts``.
        where: `` in <file>``, for messages.

    Raises:
        ConfigError: ``system.coordinator.n_sample`` set for a policy that does not collect samples, or a
            ``system.collect`` key given by hand that differs from the resolved value.
    """
    n_sample = out["system"]["coordinator"]["n_sample"]
    if n_sample is not None and unit != "sample":
        raise ConfigError(
            f"key 'system.coordinator.n_sample'{where} applies to off-policy sample collection; this policy "
            f"collects by {unit} (set it in the policy's collect section instead)"
        )
    resolved = dict(
        unit=str(unit),
        n=int(n if n_sample is None else n_sample),
        restart_envs=bool(restart_envs),
        learning_starts=int(learning_starts),
    )
    given = out["system"]["collect"]
    for key, value in resolved.items():
        if given.get(key) is not None and given[key] != value:
            raise ConfigError(
                f"key 'system.collect.{key}'{where} is {given[key]!r}, but the policy's training contract makes it "
                f"{value!r}: system.collect is written from the policy section (and system.coordinator.n_sample); "
                "leave it out"
            )
    out["system"]["collect"] = resolved


def compile_coordinator_config(cfg: Mapping[str, Any], source: Optional[str] = None) -> EasyDict:
    """Re-validate a config that ``nervex.entry.compile_parallel_config`` compiled, knowing no policy or env.

    The top-level keys and the ``system`` section are checked against their declarations (and ``system.collect``
    must be resolved); the serial sections are taken as they are: the entry validated them. This is how the
    coordinator reads a run's ``config.yaml``. A config compiled this way hashes as the entry's compile did.

    Args:
        cfg: A compiled parallel config, or one read back from the YAML that ``save_config`` wrote of it.
        source: The file it came from, for messages.

    Raises:
        ConfigError: an unknown key, a bad value (the message names the dotted key), or ``system.collect`` not
            resolved (a user's YAML that the entry has not compiled).
    """
    if is_compiled(cfg) and "system" in cfg and is_parallel_compiled(cfg):
        return cfg  # type: ignore[return-value]
    source = source or config_source(cfg)
    user = to_plain(cfg)
    _require_compiled(user, f" in {os.path.basename(source)}" if source else "")  # before the merge fills keys in
    sections: Dict[str, Any] = {name: {} for name in RUN_SECTIONS if name in user}
    parts = ConfigParts(
        sections=dict(sections, system=SYSTEM_CONFIG),
        top=dict(TOP_LEVEL_DEFAULTS),
        open_sections=list(sections),
        checks=[_check_coordinator],
    )
    return compile_config(cfg, parts, source)


def is_parallel_compiled(cfg: Mapping[str, Any]) -> bool:
    """Whether ``cfg`` is a compiled parallel config (or the YAML of one): every top-level key, every section the
    entry always writes, and a resolved ``system.collect``. A user's YAML is not."""
    return _first_uncompiled_key(to_plain(cfg)) is None


def _first_uncompiled_key(cfg: Mapping[str, Any]) -> Optional[str]:
    """The first key a compiled parallel config has and ``cfg`` lacks (or holds as null), else None."""
    system = cfg.get("system")
    collect = system.get("collect") if isinstance(system, Mapping) else None
    if not isinstance(collect, Mapping):
        return "system.collect"
    for key in COLLECT_CONFIG:
        if collect.get(key) is None:
            return f"system.collect.{key}"
    for key in list(TOP_LEVEL_DEFAULTS) + [s for s in RUN_SECTIONS if s != "replay_buffer"]:
        if key not in cfg:
            return key
    return None


def _require_compiled(user: Dict[str, Any], where: str) -> None:
    missing = _first_uncompiled_key(user)
    if missing:
        raise ConfigError(
            f"key '{missing}'{where} is not set: the coordinator reads a config compiled for the parallel mode; "
            "compile it with nervex.entry.compile_parallel_config (or `python -m nervex.system.launch CONFIG "
            "--print-config`), which fills every key and writes system.collect from the policy"
        )
    for name in RUN_SECTIONS:
        if name in user and not isinstance(user[name], Mapping):
            raise ConfigError(f"key '{name}'{where} expects a mapping, got {user[name]!r}")


def _check_coordinator(out: Dict[str, Any], where: str) -> None:
    section = out["system"]["coordinator"]
    heartbeat_s, lease_s = section["heartbeat_s"], section["lease_s"]
    if heartbeat_s is not None and heartbeat_s >= lease_s:
        raise ConfigError(
            f"key 'system.coordinator.heartbeat_s'{where} is {heartbeat_s}, not below lease_s = {lease_s}: a worker "
            "would lose its leases between heartbeats; use at most lease_s / 2 (or null: lease_s / 3)"
        )
    hard = section["hard_queued_results"]
    if hard is not None and hard < section["max_queued_results"]:
        raise ConfigError(
            f"key 'system.coordinator.hard_queued_results'{where} is {hard}, below max_queued_results = "
            f"{section['max_queued_results']}; it must be >= it (or null: twice it)"
        )


def collect_spec(cfg: Mapping[str, Any]) -> CollectTask:
    """What one collect task asks for: ``system.collect`` of a compiled parallel config (plain values)."""
    collect = cfg["system"]["collect"]
    return CollectTask(str(collect["unit"]), int(collect["n"]), bool(collect["restart_envs"]))


def learning_starts(cfg: Mapping[str, Any]) -> int:
    """Env steps the learner collects before its first gradient step (0 for on-policy data): ``system.collect``."""
    return int(cfg["system"]["collect"]["learning_starts"])


def config_hash(cfg: Mapping[str, Any]) -> str:
    """SHA-256 (hex) of the compiled config as canonical JSON, without the ``system`` section's per-process keys.

    Every role started from the same YAML (and the same ``--set`` overrides) computes the same hash, whatever host,
    port or storage mount point it was given (``LOCAL_KEYS``).

    Args:
        cfg: A compiled parallel config (``nervex.entry.compile_parallel_config``), or the YAML written of one.
    """
    cfg = compile_coordinator_config(cfg)
    plain = to_plain(cfg)
    system = plain.get("system") or {}
    plain["system"] = {
        name: {k: v for k, v in section.items() if k not in LOCAL_KEYS} if isinstance(section, dict) else section
        for name, section in system.items()
    }
    text = json.dumps(plain, sort_keys=True, separators=(",", ":"), allow_nan=True, ensure_ascii=True)
    return hashlib.sha256(text.encode("ascii")).hexdigest()


def default_run_dir(cfg: Mapping[str, Any], run_root: str = "runs") -> str:
    """``run_root/<exp_name>``, else ``run_root/<env>__<policy>__<seed>__<first 8 of config_hash>``.

    Unlike a serial run's name there is no time in it: every role started from the same YAML finds the same folder.
    """
    name = cfg.get("exp_name")
    if not name:
        env = cfg["env"].get("env_id") or cfg["env"]["env_type"]
        name = f"{env}__{cfg['policy']['policy_type']}__{cfg['seed']}__{config_hash(cfg)[:8]}"
    return os.path.join(run_root, name)


def storage_root(cfg: Mapping[str, Any], run_dir: str) -> str:
    """The payload directory: ``system.storage.root``, else ``<run_dir>/storage``."""
    return cfg["system"]["storage"]["root"] or os.path.join(run_dir, "storage")


def write_coordinator_url(run_dir: str, url: str) -> str:
    """Write ``url`` to ``<run_dir>/coordinator.url`` atomically (temporary file, fsync, rename); returns the path."""
    path = os.path.join(run_dir, COORDINATOR_URL_FILE)
    fd, temp = tempfile.mkstemp(prefix=".coordinator.url.", dir=run_dir)
    try:
        with os.fdopen(fd, "w", encoding="ascii") as f:
            f.write(url + "\n")
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
    "KEYED_PATHS",
    "REGISTER_PATH",
    "HEARTBEAT_PATH",
    "TASK_LEASE_PATH",
    "TASK_COMPLETE_PATH",
    "TASK_FAIL_PATH",
    "DATA_POLL_PATH",
    "LEARNER_PROGRESS_PATH",
    "RUN_FINISH_PATH",
    "STATUS_PATH",
    "LEAGUE_UPDATE_PATH",
    "LEARNER_CONFIG",
    "ACTOR_CONFIG",
    "MANAGER_CONFIG",
    "LEAGUE_CONFIG",
    "COORDINATOR_URL_FILE",
    "MAX_POLL_LIMIT",
    "SYSTEM_CONFIG",
    "COORDINATOR_CONFIG",
    "STORAGE_CONFIG",
    "LOCAL_KEYS",
    "COLLECT_RESULT_FIELDS",
    "COLLECT_CONFIG",
    "RUN_SECTIONS",
    "CollectTask",
    "parallel_parts",
    "resolve_collect",
    "compile_coordinator_config",
    "is_parallel_compiled",
    "EPISODE_FIELDS",
    "OUTCOMES",
    "collect_spec",
    "learning_starts",
    "config_hash",
    "default_run_dir",
    "storage_root",
    "write_coordinator_url",
    "read_coordinator_url",
    "check_known",
    "require",
    "optional",
    "require_storage_name",
    "validate_collect_result",
]
