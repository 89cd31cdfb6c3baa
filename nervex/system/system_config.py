"""The parallel mode's ``system`` config section: its declared defaults, and reading it without any runtime.

* ``SYSTEM_CONFIG``: the declared defaults of the config's ``system`` section. ``parallel_parts`` adds it to the
  serial run's parts, so ``nervex.entry.compile_parallel_config`` validates a whole parallel-mode config (an unknown
  key is an error with a suggestion) and writes the policy's collect unit and counts into ``system.collect``
  (``resolve_collect``). ``compile_coordinator_config`` re-validates such a compiled config without any policy.
* ``config_hash``: every role registers with it, and the coordinator refuses (403) a role started from another
  config. ``default_run_dir`` and ``storage_root``: where a run's files are.

Nothing here imports torch, gymnasium, a policy, an env or the builder, whatever the call: the coordinator reads
the plain values of the compiled ``system`` section.
"""

from __future__ import annotations

import hashlib
import json
import os
from typing import Any, Dict, Mapping, NamedTuple, Optional

from easydict import EasyDict

from nervex.config import TOP_LEVEL_DEFAULTS, ConfigError, ConfigParts, Field, compile_config, is_compiled, to_plain
from nervex.config.config import config_source

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
    idle_polls_per_s=Field(100.0, gt=0),  # lease polls per second of all idle actors together (their wait_s hint)
    shed_backlog=Field(64, ge=1),  # requests waiting for a thread above which leases answer "no task, wait" (overload)
    n_sample=Field(None, ge=1, kind="int"),  # env steps per collect task; null: the policy's policy.collect.n_sample
    samples_per_insert=Field(None, gt=0, kind="number"),  # off-policy rate limit (Reverb's); null: off
    max_queued_results=Field(64, ge=1),  # results the learner has not polled yet above which no task is created
    hard_queued_results=Field(None, ge=1, kind="int"),  # ... above which a complete is refused (429); null: 2x soft
    min_free_bytes=Field(256 << 20, ge=0),  # free space on the storage root and run dir under which results are 507
    max_connections=Field(1024, ge=1),  # open HTTP connections in all; over it no new one is accepted until some close
    max_connections_per_peer=Field(256, ge=1),  # ... from one address: one peer never takes every slot
    idle_timeout_s=Field(60.0, gt=0),  # a connection with no request in progress closes after this long
    request_timeout_s=Field(30.0, gt=0),  # a request must arrive whole within this long of its first byte
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


# ---- config -------------------------------------------------------------------------------------------------------
RUN_SECTIONS = ("env", "policy", "replay_buffer", "learner", "actor", "evaluator", "logger")
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
    # no replay_buffer for on-policy data; no logger in a run compiled before the section existed
    for key in list(TOP_LEVEL_DEFAULTS) + [s for s in RUN_SECTIONS if s not in ("replay_buffer", "logger")]:
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


__all__ = [
    "STORAGE_CONFIG",
    "COORDINATOR_CONFIG",
    "LEARNER_CONFIG",
    "ACTOR_CONFIG",
    "MANAGER_CONFIG",
    "LEAGUE_CONFIG",
    "COLLECT_CONFIG",
    "SYSTEM_CONFIG",
    "LOCAL_KEYS",
    "RUN_SECTIONS",
    "CollectTask",
    "parallel_parts",
    "resolve_collect",
    "compile_coordinator_config",
    "is_parallel_compiled",
    "collect_spec",
    "learning_starts",
    "config_hash",
    "default_run_dir",
    "storage_root",
]
