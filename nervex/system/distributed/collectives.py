"""The learner group's process group and collectives: join it, broadcast a policy, average gradients after each
backward pass, reduce a number, broadcast JSON (never pickle), wait at a barrier."""

from __future__ import annotations

import hashlib
import math
import threading
from datetime import timedelta
from typing import Any, Callable, Dict, Iterable, Iterator, List, Mapping, Optional, Protocol, Tuple

import torch
import torch.distributed as dist

from nervex.system.distributed.ranks import DistInfo
from nervex.torch_utils.optimizer import trained_tensors


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


__all__ = [
    "GradientAllReduce",
    "StatefulPolicy",
    "all_reduce_mean",
    "attach_gradient_allreduce",
    "barrier",
    "broadcast_json",
    "broadcast_parameters",
    "broadcast_policy",
    "destroy_process_group",
    "init_process_group",
    "optimized_tensors",
]
