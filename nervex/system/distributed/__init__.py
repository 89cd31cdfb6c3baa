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

The package: ``ranks`` (``DistInfo``, ``dist_info_from_env``), ``hostlist`` (Slurm host lists) and ``collectives`` (the
process group, the broadcasts, the gradient all-reduce).
"""

from nervex.system.distributed.collectives import (
    GradientAllReduce,
    StatefulPolicy,
    all_reduce_mean,
    attach_gradient_allreduce,
    barrier,
    broadcast_json,
    broadcast_parameters,
    broadcast_policy,
    destroy_process_group,
    init_process_group,
    optimized_tensors,
)
from nervex.system.distributed.hostlist import expand_hostlist, first_host
from nervex.system.distributed.ranks import DistInfo, dist_info_from_env

__all__ = [
    "DistInfo",
    "GradientAllReduce",
    "StatefulPolicy",
    "all_reduce_mean",
    "attach_gradient_allreduce",
    "barrier",
    "broadcast_json",
    "broadcast_parameters",
    "broadcast_policy",
    "destroy_process_group",
    "dist_info_from_env",
    "expand_hostlist",
    "first_host",
    "init_process_group",
    "optimized_tensors",
]
