"""CommonPolicy: a Policy with the transition every single-agent policy stores."""

from __future__ import annotations

from typing import Any, Dict, Mapping, Optional, Tuple

import torch

from nervex.agent import Agent
from nervex.config import Field

from .base_policy import Output, Policy


def eps_schedule_config(**extra: Any) -> Dict[str, Any]:
    """The ``command.eps`` keys of an epsilon-greedy policy (the schedule of ``rl_utils.epsilon_greedy`` over env
    steps), with a policy's own ``extra`` keys first."""
    return dict(
        **extra,
        type=Field("exp", choices=("exp", "linear")),
        start=Field(0.95, ge=0, le=1),
        end=Field(0.05, ge=0, le=1),
        decay=Field(10000, gt=0),
    )


def q_learn_agent(model: Any, learn: Mapping[str, Any]) -> Agent:
    """The learn-mode Agent of the Q-learning family: ``model`` with gradients and a target copy updated by Polyak
    averaging at ``learn.target_theta`` when it is > 0, else copied every ``learn.target_update_freq`` train steps."""
    agent = Agent(model)
    if learn["target_theta"] > 0:
        agent.add_model("target", update_type="momentum", update_kwargs={"theta": learn["target_theta"]})
    else:
        agent.add_model("target", update_type="assign", update_kwargs={"freq": int(learn["target_update_freq"])})
    agent.add_plugin("main", "grad", enable_grad=True)
    return agent


def acting_agent(
    model: Any, sample: str, hidden_state: Optional[Dict[str, Any]] = None, dict_obs: bool = False
) -> Agent:
    """A collect- or eval-mode Agent: ``model`` without gradients, acting through the ``sample`` plugin
    (``'eps_greedy_sample'``, ``'argmax_sample'``), after a ``hidden_state`` plugin with these kwargs for a
    recurrent model. ``dict_obs``: dict observations feed the model their ``obs`` and the sampler their
    ``action_mask`` (the ``dict_obs`` plugin, next to the model)."""
    agent = Agent(model)
    if dict_obs:
        agent.add_plugin("main", "dict_obs")
    if hidden_state is not None:
        agent.add_plugin("main", "hidden_state", **hidden_state)
    agent.add_plugin("main", sample)
    agent.add_plugin("main", "grad", enable_grad=False)
    return agent


def obs_and_mask(obs: Any) -> Tuple[Any, Optional[torch.Tensor]]:
    """The model input and the action mask (1 = legal) of a batched observation: ``(obs['obs'],
    obs.get('action_mask'))`` for a dict observation, ``(obs, None)`` otherwise."""
    if isinstance(obs, Mapping) and "obs" in obs:
        return obs["obs"], obs.get("action_mask")
    return obs, None


def standard_transition(obs: Any, agent_output: Output, timestep: Any) -> Dict[str, Any]:
    """The fields nervex's transitions always hold: ``obs``, ``next_obs``, ``action``, ``reward`` and the three flags.

    ``terminated`` cuts bootstrapping; ``truncated`` (a time limit) does not; ``done`` is either.
    """
    info = timestep.info
    return {
        "obs": obs,
        "next_obs": timestep.obs,
        "action": agent_output["action"],
        "reward": timestep.reward,
        "terminated": bool(info.get("terminated", timestep.done)),
        "truncated": bool(info.get("truncated", False)),
        "done": bool(timestep.done),
    }


class CommonPolicy(Policy):
    """A Policy whose transitions are ``standard_transition`` unless a subclass adds fields.

    Subclasses still implement the learn, collect (``_forward_collect``, a streaming ``self._adder``) and eval modes.
    """

    def _process_transition(self, obs: Any, agent_output: Output, timestep: Any) -> Dict[str, Any]:
        return standard_transition(obs, agent_output, timestep)
