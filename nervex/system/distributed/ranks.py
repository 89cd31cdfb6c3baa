"""Where a learner process stands in its group: rank, world size and rendezvous, from torchrun's or Slurm's variables.

``dist_info_from_env`` reads torchrun's variables (``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``, ``MASTER_ADDR``,
``MASTER_PORT``), else Slurm's (``SLURM_PROCID``, ``SLURM_NTASKS``, ``SLURM_LOCALID``, the first host of the step's node
list, a port derived from ``SLURM_JOB_ID``), else describes a single process.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from typing import Mapping

from nervex.system.distributed.hostlist import first_host

DEFAULT_MASTER_ADDR = "127.0.0.1"
DEFAULT_MASTER_PORT = 29500  # torchrun's default
SLURM_PORT_BASE = 15000
SLURM_PORT_SPAN = 20000  # the port is SLURM_PORT_BASE + SLURM_JOB_ID % SLURM_PORT_SPAN: 15000..34999
SLURM_NODELIST_VARS = ("SLURM_STEP_NODELIST", "SLURM_JOB_NODELIST", "SLURM_NODELIST")
TORCHRUN_VARS = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")
SOURCES = ("single", "torchrun", "slurm")


@dataclass(frozen=True)
class DistInfo:
    """Where this process stands in its process group.

    Attributes:
        rank: Global rank, ``0 <= rank < world_size``.
        world_size: Number of processes in the group.
        local_rank: Rank on this node; picks the GPU (``cuda:local_rank``), nothing else.
        master_addr: Host of rank 0's rendezvous store.
        master_port: Port of rank 0's rendezvous store.
        source: Where the figures came from: ``'single'``, ``'torchrun'`` or ``'slurm'``.
    """

    rank: int
    world_size: int
    local_rank: int
    master_addr: str
    master_port: int
    source: str

    def __post_init__(self) -> None:
        if self.world_size < 1:
            raise ValueError(f"DistInfo.world_size must be >= 1, got {self.world_size}")
        if not 0 <= self.rank < self.world_size:
            raise ValueError(f"DistInfo.rank must be in [0, {self.world_size}), got {self.rank}")
        if self.local_rank < 0:
            raise ValueError(f"DistInfo.local_rank must be >= 0, got {self.local_rank}")
        if not 1 <= self.master_port <= 65535:
            raise ValueError(f"DistInfo.master_port must be in [1, 65535], got {self.master_port}")
        if self.source not in SOURCES:
            raise ValueError(f"DistInfo.source must be one of {SOURCES}, got {self.source!r}")

    @property
    def is_main(self) -> bool:
        """Whether this is rank 0 (the rank that talks to the coordinator, logs and saves checkpoints)."""
        return self.rank == 0

    @property
    def distributed(self) -> bool:
        """Whether there is more than one process."""
        return self.world_size > 1


# ---- where am I: the environment ------------------------------------------------------------------------------------
def dist_info_from_env(environ: Mapping[str, str] = os.environ) -> DistInfo:
    """This process's rank, world size and rendezvous address from the launcher's environment variables.

    torchrun's variables (``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``, ``MASTER_ADDR``, ``MASTER_PORT``) take precedence;
    else Slurm's (``srun``): the rank is ``SLURM_PROCID`` of ``SLURM_NTASKS`` (``SLURM_LOCALID`` only picks the
    device), rank 0's host the first host of ``SLURM_STEP_NODELIST`` (else ``SLURM_JOB_NODELIST``, else
    ``SLURM_NODELIST``) and the port ``15000 + SLURM_JOB_ID % 20000``; ``MASTER_ADDR`` and ``MASTER_PORT``, when
    set, override both. With neither, a single process.

    Note that an ``sbatch`` script itself runs with ``SLURM_PROCID=0`` and the job's ``SLURM_NTASKS``: start the
    learner through ``srun`` (one process per task), or rank 0 waits for ranks that never come.

    Args:
        environ: The environment to read.

    Returns:
        The process's ``DistInfo``.

    Raises:
        ValueError: a variable is malformed (not an integer, a rank outside the world, a bad node list or port) or
            missing (``RANK`` without ``WORLD_SIZE``; a multi-process Slurm step without a node list or job id);
            the message names the variable.
    """
    if "RANK" in environ or "WORLD_SIZE" in environ:
        return _torchrun_info(environ)
    if "SLURM_PROCID" in environ:
        return _slurm_info(environ)
    return DistInfo(0, 1, 0, DEFAULT_MASTER_ADDR, DEFAULT_MASTER_PORT, "single")


def _int_var(environ: Mapping[str, str], name: str, minimum: int, hint: str = "") -> int:
    if name not in environ:
        raise ValueError(f"environment variable {name} is not set{hint}")
    raw = environ[name]
    if not re.fullmatch(r"-?[0-9]+", raw.strip()):  # int() would also take '1_0', '+1' and other scripts' digits
        raise ValueError(f"environment variable {name}={raw!r} is not an integer")
    value = int(raw)
    if value < minimum:
        raise ValueError(f"environment variable {name}={raw!r} must be >= {minimum}")
    return value


def _port_var(environ: Mapping[str, str]) -> int:
    port = _int_var(environ, "MASTER_PORT", 1)
    if port > 65535:
        raise ValueError(f"environment variable MASTER_PORT={environ['MASTER_PORT']!r} must be a port <= 65535")
    return port


def _addr_var(environ: Mapping[str, str]) -> str:
    addr = environ["MASTER_ADDR"].strip()
    if not addr:
        raise ValueError("environment variable MASTER_ADDR is empty; set it to rank 0's host name or address")
    return addr


def _torchrun_info(environ: Mapping[str, str]) -> DistInfo:
    hint = f" (torchrun sets {', '.join(TORCHRUN_VARS)} together)"
    world_size = _int_var(environ, "WORLD_SIZE", 1, hint)
    rank = _int_var(environ, "RANK", 0, hint)
    if rank >= world_size:
        raise ValueError(f"environment variable RANK={environ['RANK']!r} must be < WORLD_SIZE={world_size}")
    local_rank = _int_var(environ, "LOCAL_RANK", 0, hint)
    if world_size == 1 and "MASTER_ADDR" not in environ:
        return DistInfo(rank, 1, local_rank, DEFAULT_MASTER_ADDR, DEFAULT_MASTER_PORT, "torchrun")
    for name in ("MASTER_ADDR", "MASTER_PORT"):
        if name not in environ:
            raise ValueError(f"environment variable {name} is not set{hint}")
    return DistInfo(rank, world_size, local_rank, _addr_var(environ), _port_var(environ), "torchrun")


def _slurm_info(environ: Mapping[str, str]) -> DistInfo:
    hint = " (srun sets SLURM_PROCID and SLURM_NTASKS for every task)"
    world_size = _int_var(environ, "SLURM_NTASKS", 1, hint)
    rank = _int_var(environ, "SLURM_PROCID", 0, hint)
    if rank >= world_size:
        raise ValueError(
            f"environment variable SLURM_PROCID={environ['SLURM_PROCID']!r} must be < SLURM_NTASKS={world_size}"
        )
    local_rank = _int_var(environ, "SLURM_LOCALID", 0) if "SLURM_LOCALID" in environ else 0
    addr, port = _slurm_master_addr(environ, world_size), _slurm_master_port(environ, world_size)
    return DistInfo(rank, world_size, local_rank, addr, port, "slurm")


def _slurm_master_addr(environ: Mapping[str, str], world_size: int) -> str:
    if "MASTER_ADDR" in environ:
        return _addr_var(environ)
    for name in SLURM_NODELIST_VARS:
        if name in environ:
            try:
                return first_host(environ[name])
            except ValueError as e:
                raise ValueError(f"environment variable {name}={environ[name]!r}: {e}") from None
    if world_size == 1:
        return DEFAULT_MASTER_ADDR
    raise ValueError(f"none of {', '.join(SLURM_NODELIST_VARS)} is set; set MASTER_ADDR to rank 0's host")


def _slurm_master_port(environ: Mapping[str, str], world_size: int) -> int:
    if "MASTER_PORT" in environ:
        return _port_var(environ)
    if "SLURM_JOB_ID" in environ:
        return SLURM_PORT_BASE + _int_var(environ, "SLURM_JOB_ID", 0) % SLURM_PORT_SPAN
    if world_size == 1:
        return DEFAULT_MASTER_PORT
    raise ValueError("environment variable SLURM_JOB_ID is not set; set MASTER_PORT to a free port on rank 0's host")


__all__ = ["DistInfo", "SOURCES", "dist_info_from_env"]
