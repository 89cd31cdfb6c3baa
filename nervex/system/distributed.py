"""Data-parallel training of one logical learner with ``torch.distributed``.

The parallel mode's learner role may run as several processes (one per GPU, or several CPU processes): rank 0 talks
HTTP to the coordinator, every rank trains on its share of each batch, and the gradients are averaged across ranks
right after each backward pass, so every rank takes the same optimizer step and the ranks stay equal. A learner::

    info = dist_info_from_env()                  # torchrun's variables, else Slurm's, else a single process
    init_process_group(info, device, timeout_s=60.0)
    broadcast_policy(policy)                     # every rank starts from rank 0's weights, targets, optimizer
    handle = attach_gradient_allreduce([policy.model], info.world_size, optimized_tensors(policy))
    ...  # each rank: policy.learn_mode.forward(its rows of the batch)
    handle.remove()
    destroy_process_group()

Why not ``DistributedDataParallel``: nervex policies call ``optimizer.step()`` themselves inside their learn forward
(with gradient clipping in between), and wrapping the model in DDP would rename every ``state_dict`` key
(``module.``). ``attach_gradient_allreduce`` instead hooks the parameters: when a backward pass has accumulated every
gradient, one all-reduce per (device, dtype) averages them, before the policy clips and steps.

Limits: every rank must run the same sequence of backward passes, each reaching the same parameters (a rank that
skips a backward, or whose loss does not reach a parameter the others' does, leaves the others waiting until the
group's timeout). The averaged gradient equals the gradient of the whole batch only when the loss is a mean over
equally sized per-rank shares (DQN's importance-weighted mean is). A rank that dies or stalls makes the others raise
a ``RuntimeError`` within the group's timeout (gloo at once for a closed connection; NCCL through its watchdog).
"""

from __future__ import annotations

import hashlib
import math
import os
import re
import threading
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, Callable, Dict, Iterable, Iterator, List, Mapping, Optional, Protocol, Tuple, Union

import torch
import torch.distributed as dist

from nervex.torch_utils.optimizer import trained_tensors

DEFAULT_MASTER_ADDR = "127.0.0.1"
DEFAULT_MASTER_PORT = 29500  # torchrun's default
SLURM_PORT_BASE = 15000
SLURM_PORT_SPAN = 20000  # the port is SLURM_PORT_BASE + SLURM_JOB_ID % SLURM_PORT_SPAN: 15000..34999
SLURM_NODELIST_VARS = ("SLURM_STEP_NODELIST", "SLURM_JOB_NODELIST", "SLURM_NODELIST")
TORCHRUN_VARS = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")
SOURCES = ("single", "torchrun", "slurm")
_DIGITS = re.compile(r"[0-9]+")  # ASCII only: str.isdigit() and int() also take other scripts' digits
HostPart = Union[str, List[Tuple[int, int, int]]]  # literal text, or a bracket group's (first, last, width) ranges


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


# ---- Slurm host lists -----------------------------------------------------------------------------------------------
def expand_hostlist(nodelist: str) -> Iterator[str]:
    """The hosts of a Slurm host list, in the order written (lazily: ``n[1-100000]`` costs nothing up front).

    ``node01``; ``node[01-03,07]`` (node01 node02 node03 node07); ``gpu-a[1-2],gpu-b5``; ``n[001-004]`` keeps the
    zero padding of the range's first number; several bracket groups in one name (``r[1-2]n[1-2]``) expand as a
    product, the last group fastest.

    Args:
        nodelist: The host list (``SLURM_JOB_NODELIST``'s format).

    Yields:
        Host names.

    Raises:
        ValueError: the list is empty or malformed (unbalanced or nested brackets, an empty name or range, a range
            whose end is below its start, anything but digits, ``-`` and ``,`` inside brackets); the whole list is
            checked by the call, before any host is produced.
    """
    items = [_parse_item(item, nodelist) for item in _split_top_level(nodelist)]
    return (host for parts in items for host in _expand_parts(parts))


def first_host(nodelist: str) -> str:
    """The first host of a Slurm host list (rank 0's node under ``srun``'s default block distribution).

    Args:
        nodelist: The host list, e.g. ``'gpu-a[1-2],gpu-b5'`` (gives ``'gpu-a1'``).

    Returns:
        The first host name.

    Raises:
        ValueError: the list is empty or malformed (see ``expand_hostlist``).
    """
    return next(expand_hostlist(nodelist))


def _split_top_level(nodelist: str) -> List[str]:
    """Split at the commas outside brackets, checking that the brackets balance and do not nest."""
    text = nodelist.strip()
    if not text:
        raise ValueError("the host list is empty")
    items, depth, start = [], 0, 0
    for i, char in enumerate(text):
        if char == "[":
            if depth:
                raise ValueError(f"nested '[' at position {i} of host list {nodelist!r}")
            depth = 1
        elif char == "]":
            if not depth:
                raise ValueError(f"']' without '[' at position {i} of host list {nodelist!r}")
            depth = 0
        elif char == "," and not depth:
            items.append(text[start:i])
            start = i + 1
    if depth:
        raise ValueError(f"'[' is never closed in host list {nodelist!r}")
    items.append(text[start:])
    for item in items:
        if not item.strip():
            raise ValueError(f"empty host name in host list {nodelist!r}")
    return [item.strip() for item in items]


def _parse_item(item: str, nodelist: str) -> List[HostPart]:
    """One host pattern as parts: literal text, or a bracket group's ranges (``'n[1-2]x'`` -> ``['n', [...], 'x']``)."""
    parts: List[HostPart] = []
    pos = 0
    while pos < len(item):
        open_at = item.find("[", pos)
        if open_at < 0:
            parts.append(item[pos:])
            break
        if open_at > pos:
            parts.append(item[pos:open_at])
        close_at = item.index("]", open_at)  # balanced: checked by _split_top_level
        parts.append(_parse_ranges(item[open_at + 1 : close_at], nodelist))
        pos = close_at + 1
    return parts


def _parse_ranges(body: str, nodelist: str) -> List[Tuple[int, int, int]]:
    """``'01-03,7'`` -> ``[(1, 3, 2), (7, 7, 1)]``: (first, last, zero-padded width)."""
    ranges = []
    for spec in body.split(","):
        low, sep, high = spec.strip().partition("-")
        if not _DIGITS.fullmatch(low) or (sep and not _DIGITS.fullmatch(high)):
            raise ValueError(f"bad range {spec!r} in '[{body}]' of host list {nodelist!r}: expected N or N-M")
        first, last = int(low), int(high) if sep else int(low)
        if last < first:
            raise ValueError(f"range {spec!r} of host list {nodelist!r} ends below its start")
        ranges.append((first, last, len(low)))
    return ranges


def _expand_parts(parts: List[HostPart]) -> Iterator[str]:
    if not parts:
        yield ""
        return
    head, rest = parts[0], parts[1:]
    heads = [head] if isinstance(head, str) else (f"{n:0{w}d}" for a, b, w in head for n in range(a, b + 1))
    for prefix in heads:
        for suffix in _expand_parts(rest):
            yield prefix + suffix


# ---- the process group ----------------------------------------------------------------------------------------------
def init_process_group(info: DistInfo, device: str = "cpu", timeout_s: float = 60.0) -> None:
    """Join the group ``info`` describes (a no-op for a single process).

    Rendezvous is ``tcp://master_addr:master_port`` (rank 0 hosts the store). The backend is gloo on the CPU and
    NCCL for ``'cuda'`` (this process's GPU is ``cuda:local_rank``; ``'cuda:i'`` picks ``i`` instead). ``timeout_s``
    bounds the rendezvous and every collective: a rank that died or stalls makes the others raise instead of hang
    (NCCL through its watchdog, ``TORCH_NCCL_ASYNC_ERROR_HANDLING``, on by default).

    Args:
        info: This process's place in the group (``dist_info_from_env()``).
        device: ``'cpu'``, ``'cuda'`` or ``'cuda:i'``: the device the learner trains on.
        timeout_s: Seconds the rendezvous and each collective may wait for the other ranks.

    Raises:
        ValueError: ``timeout_s`` is not a positive number, or ``device`` is neither CPU nor CUDA.
        RuntimeError: the group is already initialized, or the other ranks did not join within ``timeout_s``.
    """
    if not (isinstance(timeout_s, (int, float)) and math.isfinite(timeout_s) and timeout_s > 0):
        raise ValueError(f"init_process_group: timeout_s must be a positive number of seconds, got {timeout_s!r}")
    dev = torch.device(device)
    if dev.type not in ("cpu", "cuda"):
        raise ValueError(f"init_process_group: device must be 'cpu', 'cuda' or 'cuda:i', got {device!r}")
    if not info.distributed:
        return
    if dist.is_initialized():
        raise RuntimeError(
            "init_process_group: torch.distributed is already initialized; destroy_process_group() first"
        )
    backend = "nccl" if dev.type == "cuda" else "gloo"
    if backend == "nccl":
        index = info.local_rank if dev.index is None else dev.index
        if index >= torch.cuda.device_count():
            raise RuntimeError(
                f"init_process_group: rank {info.rank} wants cuda:{index} (local rank {info.local_rank}) but this node "
                f"has {torch.cuda.device_count()} GPU(s); start at most one process per GPU"
            )
        torch.cuda.set_device(index)
    host = f"[{info.master_addr}]" if ":" in info.master_addr else info.master_addr  # an IPv6 literal
    url = f"tcp://{host}:{info.master_port}"
    try:
        dist.init_process_group(
            backend, init_method=url, rank=info.rank, world_size=info.world_size, timeout=timedelta(seconds=timeout_s)
        )
    except RuntimeError as e:
        hint = "; was the learner started through srun, one process per task?" if info.source == "slurm" else ""
        raise RuntimeError(
            f"rank {info.rank} of {info.world_size} ({info.source}) could not join the {backend} process group at "
            f"{url} within {timeout_s:g} s{hint}: {e}"
        ) from e


def destroy_process_group() -> None:
    """Leave the process group; safe when none was initialized (a single process, or after an error)."""
    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()


def _group_size() -> int:
    """The group's world size; 1 when no group is initialized (a single process)."""
    return dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1


def _collective_device() -> torch.device:
    """Where the tensors of a small collective live: NCCL only reduces GPU tensors."""
    if dist.get_backend() == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def _check_same_layout(entries: Iterable[str], caller: str, what: str) -> None:
    """Raise on every rank if the ranks' ``entries`` differ (one collective of two numbers, no pickling)."""
    digest = hashlib.sha256("\n".join(entries).encode()).digest()
    value = int.from_bytes(digest[:8], "little") >> 2  # < 2**62: its negation fits an int64
    pair = torch.tensor([value, -value], dtype=torch.int64, device=_collective_device())
    dist.all_reduce(pair, op=dist.ReduceOp.MAX)
    if int(pair[0]) != -int(pair[1]):  # max == min over the ranks
        raise RuntimeError(
            f"{caller}: the ranks hold {what} of different layouts (names, shapes, dtypes); every rank must build "
            "the same policy from the same config (and load the same checkpoint, or none) before this call"
        )


def _flat_groups(tensors: List[torch.Tensor]) -> List[List[torch.Tensor]]:
    """The tensors grouped by (device, dtype), each group in the given order: one collective per group."""
    groups: Dict[Tuple[torch.device, torch.dtype], List[torch.Tensor]] = {}
    for tensor in tensors:
        groups.setdefault((tensor.device, tensor.dtype), []).append(tensor)
    return list(groups.values())


def _collective_flat(tensors: List[torch.Tensor], op: Callable[[torch.Tensor], Any]) -> None:
    """Apply ``op`` to the tensors flattened per (device, dtype), writing the results back in place.

    A group not on the backend's device travels through it (Adam's ``step`` counts stay on the CPU under NCCL).
    """
    device = _collective_device()
    for group in _flat_groups(tensors):
        flat = torch.cat([t.detach().reshape(-1) for t in group]).to(device)
        op(flat)
        offset = 0
        for tensor in group:
            tensor.detach().copy_(flat[offset : offset + tensor.numel()].view_as(tensor))
            offset += tensor.numel()


def _module_tensors(modules: Iterable[torch.nn.Module]) -> List[Tuple[str, torch.Tensor]]:
    seen, out = set(), []
    for i, module in enumerate(modules):
        if not isinstance(module, torch.nn.Module):
            raise TypeError(f"expected torch.nn.Module objects, got {type(module).__name__} at position {i}")
        for name, tensor in [*module.named_parameters(), *module.named_buffers()]:
            if id(tensor) not in seen:
                seen.add(id(tensor))
                out.append((f"{i}.{name}", tensor))
    return out


def broadcast_parameters(modules: Iterable[torch.nn.Module], src: int = 0) -> None:
    """Copy rank ``src``'s parameters and buffers into every rank's modules (a no-op for a single process).

    Every rank must call it with the same modules (checked: names, shapes and dtypes). For a whole nervex policy,
    targets and optimizer state included, use ``broadcast_policy``.

    Args:
        modules: The modules, in the same order on every rank; a tensor shared by two of them is sent once.
        src: The rank whose values win.

    Raises:
        RuntimeError: the ranks' modules differ in layout, or a rank failed (see ``init_process_group``).
    """
    named = _module_tensors(modules)
    if _group_size() == 1:
        return
    _check_same_layout((f"{n}:{tuple(t.shape)}:{t.dtype}" for n, t in named), "broadcast_parameters", "modules")
    with torch.no_grad():
        _collective_flat([t for _, t in named], lambda flat: dist.broadcast(flat, src))


class StatefulPolicy(Protocol):
    """What ``broadcast_policy`` needs: a policy's one state format (``Policy.state_dict``)."""

    def state_dict(self) -> Dict[str, Any]: ...

    def load_state_dict(self, state: Mapping[str, Any]) -> None: ...


def broadcast_policy(policy: StatefulPolicy, src: int = 0) -> None:
    """Make every rank's policy equal to rank ``src``'s: weights, target copies and their update counts, optimizer
    moments and step counts, extra state (a no-op for a single process).

    Every rank must hold a state of the same layout: build the policy from the same config, and either load a
    checkpoint on every rank or on none (a rank whose optimizer has stepped and one whose has not differ in layout).
    Tensors and numbers travel as tensors; strings, booleans and None must already agree (they are checked).

    Args:
        policy: The policy (anything whose ``state_dict()`` is nested dicts, lists and tuples of tensors and plain
            values, and whose ``load_state_dict()`` takes it back).
        src: The rank whose state wins.

    Raises:
        RuntimeError: the ranks' states differ in layout, or a rank failed.
    """
    if _group_size() == 1:
        return
    state = policy.state_dict()
    tensors: List[torch.Tensor] = []
    numbers: List[float] = []
    layout: List[str] = []
    _collect_leaves(state, "", tensors, numbers, layout)
    _check_same_layout(layout, "broadcast_policy", "policy states")
    with torch.no_grad():
        _collective_flat(tensors, lambda flat: dist.broadcast(flat, src))
    sent = torch.tensor(numbers, dtype=torch.float64, device=_collective_device())
    if numbers:
        dist.broadcast(sent, src)
    policy.load_state_dict(_replace_numbers(state, iter(sent.tolist())))


def _collect_leaves(
    value: Any, path: str, tensors: List[torch.Tensor], numbers: List[float], layout: List[str]
) -> None:
    if isinstance(value, dict):
        for key, item in value.items():
            _collect_leaves(item, f"{path}/{key!r}", tensors, numbers, layout)
    elif isinstance(value, (list, tuple)):
        for i, item in enumerate(value):
            _collect_leaves(item, f"{path}[{i}]", tensors, numbers, layout)
    elif isinstance(value, torch.Tensor):
        tensors.append(value)
        layout.append(f"{path}:tensor{tuple(value.shape)}:{value.dtype}")
    elif _is_sent_number(value):
        numbers.append(float(value))
        layout.append(f"{path}:{type(value).__name__}")
    else:  # must already agree: part of the layout
        layout.append(f"{path}:{value!r}")


def _is_sent_number(value: Any) -> bool:
    """A number ``broadcast_policy`` sends (as a float64: integers up to 2**53 exactly; bools are flags)."""
    return isinstance(value, float) or (isinstance(value, int) and not isinstance(value, bool) and abs(value) < 2**53)


def _replace_numbers(value: Any, received: Iterator[float]) -> Any:
    """``value`` with its numbers replaced by the broadcast ones, in the traversal order of ``_collect_leaves``.

    Dicts and lists are updated in place, so a module's ``OrderedDict`` keeps its ``_metadata`` (format versions).
    """
    if isinstance(value, dict):
        for key, item in value.items():
            value[key] = _replace_numbers(item, received)
    elif isinstance(value, list):
        value[:] = [_replace_numbers(item, received) for item in value]
    elif isinstance(value, tuple):  # immutable (Adam's betas): a new one
        items = [_replace_numbers(item, received) for item in value]
        return type(value)(*items) if hasattr(value, "_fields") else tuple(items)
    elif _is_sent_number(value):
        number = next(received)
        return int(number) if isinstance(value, int) else number
    return value


# ---- gradients ------------------------------------------------------------------------------------------------------
class GradientAllReduce:
    """The handle ``attach_gradient_allreduce`` returns: averages gradients at the end of every backward pass.

    Each parameter's post-accumulate-grad hook records that its gradient is ready and, for the first parameter of a
    backward pass, queues a callback at the end of that pass (as DDP does); the callback all-reduces the ready
    gradients, flattened per (device, dtype), and divides by the world size. Reducing an already averaged gradient
    again leaves it unchanged, so gradient accumulation over several backward passes averages correctly too.

    Attributes:
        reductions: Backward passes whose gradients were averaged so far.
    """

    def __init__(self, params: List[torch.nn.Parameter], world_size: int) -> None:
        self._params = params
        self._index = {id(p): i for i, p in enumerate(params)}
        self._world_size = world_size
        self._ready: List[int] = []
        self._task_id: Optional[int] = None
        self._lock = threading.Lock()  # hooks of parameters on different devices run on different autograd threads
        self.reductions = 0
        self._handles = [p.register_post_accumulate_grad_hook(self._on_grad) for p in params] if world_size > 1 else []

    def _on_grad(self, param: torch.Tensor) -> None:
        # private autograd API, as DDP and FSDP use it: the one way to run code after the last gradient of a pass
        task_id = torch._C._current_graph_task_id()
        with self._lock:
            if task_id != self._task_id:  # a new pass (an earlier one that raised never ran its callback)
                self._task_id = task_id
                self._ready.clear()
                torch.autograd.Variable._execution_engine.queue_callback(self._reduce)
            self._ready.append(self._index[id(param)])

    def _reduce(self) -> None:
        ready = sorted(set(self._ready))  # the same order on every rank, whatever order the hooks ran in
        self._ready.clear()
        self._task_id = None
        grads = [self._params[i].grad for i in ready]
        if any(g.is_sparse for g in grads):
            raise RuntimeError("gradient all-reduce: sparse gradients are not supported (use a dense embedding)")
        try:
            _collective_flat(grads, self._average)
        except RuntimeError as e:
            raise RuntimeError(
                f"gradient all-reduce failed on rank {dist.get_rank()}: a rank died, stalled beyond the group's "
                f"timeout, or ran a different sequence of backward passes: {e}"
            ) from e
        self.reductions += 1

    def _average(self, flat: torch.Tensor) -> None:
        dist.all_reduce(flat)
        flat.div_(self._world_size)

    def remove(self) -> None:
        """Stop averaging: remove every hook (idempotent)."""
        for handle in self._handles:
            handle.remove()
        self._handles.clear()


def optimized_tensors(policy: Any) -> List[torch.Tensor]:
    """Every tensor the policy's optimizers train, in their order (``policy.learn_mode.optimizers()``): the model's
    parameters and any outside it, such as SAC's temperature ``log_alpha``."""
    return trained_tensors(*policy.learn_mode.optimizers().values())


def attach_gradient_allreduce(
    modules: Iterable[torch.nn.Module], world_size: int, tensors: Iterable[torch.Tensor] = ()
) -> GradientAllReduce:
    """Average every trainable parameter's gradient across the ranks right after each backward pass.

    Attach it to the modules the policy's optimizers train (``[policy.model]``), after ``broadcast_policy``; the
    policy's own ``optimizer.step()`` then sees the averaged gradient (clipping included). A no-op handle for a
    single process. Limits: every rank must run the same sequence of backward passes, each reaching the same
    parameters; the gradient a pass accumulates is averaged once the pass ends, so read or clip gradients after
    ``backward()`` returns (as every optimizer does), not inside other hooks.

    Args:
        modules: The modules whose trainable parameters (``requires_grad``) to average; shared ones count once.
        world_size: The group's size (``DistInfo.world_size``), checked against the initialized group.
        tensors: Further leaf tensors to average that are no module's parameter (``optimized_tensors(policy)``
            gives every tensor the policy's optimizers train: SAC's ``log_alpha`` is one); those of ``modules`` and
            those that need no gradient are skipped.

    Returns:
        The handle; ``handle.remove()`` stops averaging.

    Raises:
        ValueError: no parameter requires a gradient, or ``world_size`` differs from the group's.
        RuntimeError: ``world_size > 1`` but no process group is initialized, or the ranks' parameters differ in
            layout.
    """
    params = [t for _, t in _module_tensors(modules) if isinstance(t, torch.nn.Parameter) and t.requires_grad]
    seen = {id(p) for p in params}
    for tensor in tensors:
        if tensor.requires_grad and id(tensor) not in seen:
            if not tensor.is_leaf:
                raise ValueError("attach_gradient_allreduce: a tensor to average must be a leaf (an optimizer's)")
            seen.add(id(tensor))
            params.append(tensor)
    if not params:
        raise ValueError("attach_gradient_allreduce: none of the modules' parameters requires a gradient")
    if world_size > 1 and _group_size() == 1:
        raise RuntimeError(
            f"attach_gradient_allreduce: world_size={world_size} but no process group is initialized; call "
            "init_process_group(info) first"
        )
    if world_size != _group_size():
        raise ValueError(f"attach_gradient_allreduce: world_size={world_size}, the process group has {_group_size()}")
    if world_size > 1:
        _check_same_layout(
            (f"{i}:{tuple(p.shape)}:{p.dtype}" for i, p in enumerate(params)), "attach_gradient_allreduce", "parameters"
        )
    return GradientAllReduce(params, world_size)


def all_reduce_mean(value: float) -> float:
    """The mean of ``value`` over the ranks (a figure to log); ``value`` itself for a single process.

    Every rank must call it, in the same order as its other collectives.

    Raises:
        RuntimeError: a rank failed (see ``init_process_group``).
    """
    size = _group_size()
    if size == 1:
        return float(value)
    total = torch.tensor([float(value)], dtype=torch.float64, device=_collective_device())
    dist.all_reduce(total)
    return float(total.item()) / size


__all__ = [
    "DistInfo",
    "GradientAllReduce",
    "StatefulPolicy",
    "all_reduce_mean",
    "attach_gradient_allreduce",
    "broadcast_parameters",
    "broadcast_policy",
    "destroy_process_group",
    "dist_info_from_env",
    "expand_hostlist",
    "first_host",
    "init_process_group",
    "optimized_tensors",
]


def broadcast_json(message: Any, src: int = 0) -> Any:
    """Rank ``src``'s JSON-serialisable ``message`` on every rank (the message itself for a single process).

    It travels as UTF-8 JSON bytes in a uint8 tensor (its length first): nothing is pickled, unlike
    ``torch.distributed.broadcast_object_list``. Every rank must call it; the others' ``message`` is ignored.

    Raises:
        RuntimeError: a rank failed (see ``init_process_group``).
    """
    if _group_size() == 1:
        return message
    import json

    device = _collective_device()
    if dist.get_rank() == src:
        payload = json.dumps(message, separators=(",", ":"), allow_nan=False).encode("utf-8")
        length = torch.tensor([len(payload)], dtype=torch.int64, device=device)
    else:
        payload, length = b"", torch.zeros(1, dtype=torch.int64, device=device)
    dist.broadcast(length, src)
    size = int(length.item())
    if dist.get_rank() == src:
        data = (
            torch.frombuffer(bytearray(payload), dtype=torch.uint8).to(device)
            if size
            else torch.zeros(0, dtype=torch.uint8, device=device)
        )
    else:
        data = torch.empty(size, dtype=torch.uint8, device=device)
    if size:
        dist.broadcast(data, src)
    return json.loads(bytes(data.cpu().numpy().tobytes()).decode("utf-8"))


def barrier() -> None:
    """Wait for every rank (a no-op for a single process)."""
    if _group_size() > 1:
        dist.barrier()


__all__ += ["barrier", "broadcast_json"]
