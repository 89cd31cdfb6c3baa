"""ATOC (Jiang & Lu 2018): DDPG for a team whose actor communicates through an attention unit and a BiLSTM channel.

One gradient step, as the paper's update (``nervex/model/atoc.py`` holds the networks):

1. critic: ``Q(o_i, a_i)`` of every agent's stored action regressed on ``y_i = sum_k gamma^k r_{i,k} + gamma^n
   (1 - terminated) Q'(o'_i, mu'(o')_i)``, the target actor acting for the whole team (with its communication);
2. actor: ``-mean_i Q(o_i, mu(o)_i)``, the team's actions computed with the communication in the graph, so the
   gradient reaches every group member's part I through the channel (the critic's weights get none);
3. attention unit: a binary classifier on the thoughts stored at collection, trained with log loss on labels from
   the stored delta Q (``ATOC.delta_q``), min-max normalized into ``[0, 1]`` over the batch, as the paper;
4. Polyak averaging of the target copy (actor, channel, attention unit, critic together).

Rewards: the paper trains each agent on its own reward (``team_reward: agent``, the default); ``env``, ``sum`` or
``mean`` give every agent the team's reward, reduced as the key says (``env``: as the env states).
"""

from __future__ import annotations

from typing import Any, Dict, List, Mapping, Optional, Tuple

import numpy as np
import torch
import torch.nn.functional as F

from nervex.config import Field, merge_defaults
from nervex.rl_utils import ddpg_critic_target, deterministic_actor_loss

from .base_policy import Output, register_policy
from .common_policy import CommonPolicy, standard_transition
from .off_policy_ac import (
    AC_CONFIG,
    NOISE_CONFIG,
    ActorCriticLearn,
    DeterministicActing,
    actor_output,
    critic_step,
    critic_values,
    host_figures,
    make_adam,
    minimize,
    polyak_agent,
)

TEAM_REWARDS = ("agent", "env", "sum", "mean")
_LEARN = {k: v for k, v in AC_CONFIG["learn"].items() if k != "fused_update"}  # no fused kernels for ATOC


class ATOCPolicy(CommonPolicy):
    """ATOC: DDPG with attentional communication, per-agent critic, parameters shared by the agents.

    Config keys (besides the off-policy contract keys):
        team_reward: ``agent`` (each agent learns from its own reward, the paper's choice), or ``env`` / ``sum`` /
            ``mean`` (every agent learns from the team's reward).
        discount_factor, nstep, priority: as DDPG (a sample's priority is its agents' mean |TD|).
        learn.learning_rate: Adam of the actor (part I, channel, part II) and of the critic.
        learn.attention_learning_rate: Adam of the attention unit.
        learn.target_theta, learn.grad_clip: as DDPG.
        collect.noise: Gaussian or OU exploration noise in the ``[-1, 1]`` action space, per agent, clipped into the
            bounds.

    The model is ``atoc`` (``model.communication: false`` turns the channel off: independent DDPG with shared
    parameters and the same networks, the ablation the paper compares against). Eval actions have no noise.
    """

    default_model_type = "atoc"
    config: Dict[str, Any] = merge_defaults(
        {**AC_CONFIG, "learn": _LEARN},
        dict(
            team_reward=Field("agent", choices=TEAM_REWARDS),
            discount_factor=Field(0.95, gt=0, le=1),
            learn=dict(
                batch_size=64,
                update_per_collect=4,
                learning_starts=1000,
                attention_learning_rate=Field(1e-3, gt=0),
            ),
            collect=dict(noise=NOISE_CONFIG),
        ),
    )

    @classmethod
    def _buffer_type(cls, cfg: Mapping[str, Any]) -> Optional[str]:
        return "prioritized" if cfg["priority"] else "uniform"

    def _create_model_from_cfg(self, cfg: Mapping[str, Any], model_type: Optional[type] = None) -> torch.nn.Module:
        model = (model_type or self.model_class(cfg))(**cfg.get("model", {}))
        needed = ("actor_parameters", "attention", "critic", "delta_q", "agent_num", "action_low", "action_high")
        missing = [a for a in needed if not hasattr(model, a)]
        if missing:
            raise ValueError(f"atoc needs an ATOC-like model (with {missing}); got {type(model).__name__}")
        return model

    # ---- learn -----------------------------------------------------------------------------------------------
    def _init_learn(self) -> None:
        if self._cfg.team_reward == "env":
            raise ValueError(
                "policy.team_reward 'env' is resolved from the env by make_policy; building ATOCPolicy directly, set "
                f"it to one of {TEAM_REWARDS[:1] + TEAM_REWARDS[2:]}"
            )
        self._gamma = float(self._cfg.discount_factor)
        self._nstep = int(self._cfg.nstep)
        self._priority = bool(self._cfg.priority)
        learn, model = self._cfg.learn, self._model
        actor_params, critic_params = model.actor_parameters(), list(model.critic.parameters())
        self._ac = ActorCriticLearn(
            model=model,
            agent=polyak_agent(model, learn.target_theta),
            actor_optimizer=make_adam(actor_params, learn.learning_rate, learn.grad_clip),
            critic_optimizer=make_adam(critic_params, learn.learning_rate, learn.grad_clip),
            actor_params=actor_params,
            critic_params=critic_params,
            use_equivalents=False,
            priority=self._priority,
        )
        # the learn state (checkpoint keys 'actor_optimizer', 'critic_optimizer', 'attention_optimizer', 'learn_agent')
        self._actor_optimizer, self._critic_optimizer = self._ac.actor_optimizer, self._ac.critic_optimizer
        attention = list(model.attention.parameters())
        self._attention_optimizer = make_adam(attention, learn.attention_learning_rate, learn.grad_clip)
        self._learn_agent = self._ac.agent

    def _forward_learn(self, data: Dict[str, Any]) -> Dict[str, Any]:
        ac, model = self._ac, self._model
        obs, next_obs = model.agent_obs(data["obs"]), model.agent_obs(data["next_obs"])
        agents = obs.shape[1]
        reward, terminated, value_gamma = agent_terms(data, self._cfg.team_reward, agents)
        weight = per_agent(data.get("weight"), agents) if self._priority else None
        action = data["action"].float()
        # critic target: y_i = sum_k gamma^k r_ik + gamma^n (1 - terminated) Q'(o'_i, mu'(o')_i), the target team's
        with torch.no_grad():
            next_action = actor_output(ac, "target", next_obs)["action"]
            target_q = critic_values(ac, "target", agent_rows(next_obs), agent_rows(next_action))
            target = ddpg_critic_target(target_q, reward, terminated, self._gamma, self._nstep, value_gamma)
        # critic loss: Q(o_i, a_i) of the stored actions regressed on y_i
        loss_critic, td_error, q = critic_step(ac, agent_rows(obs), agent_rows(action), target, weight)
        # actor loss: -Q(o_i, mu(o)_i), the communication in the graph
        loss_actor = atoc_actor_step(ac, obs, weight)
        figures = dict(critic_loss=loss_critic, actor_loss=loss_actor, q_value=q.mean())
        # attention unit: log loss of the initiator probability against the normalized delta Q
        if model.communication:
            step = attention_step(model, self._attention_optimizer, data["thought"], data["delta_q"])
            if step is not None:  # None: only random warm-up samples in the batch, nothing to label
                figures.update(attention_loss=step[0], initiator_rate=step[1], delta_q=data["delta_q"].nanmean())
        # target update: Polyak averaging of the whole model
        ac.agent.target_update()
        info: Dict[str, Any] = host_figures(**figures)
        info.update(
            cur_lr=ac.critic_optimizer.param_groups[0]["lr"],
            total_loss=info["critic_loss"] + info["actor_loss"] + info.get("attention_loss", 0.0),
        )
        if self._priority:
            info["priority"] = td_error.view(-1, agents).mean(1).cpu().numpy()
        return info

    # ---- collect and eval --------------------------------------------------------------------------------------
    def _init_shared(self) -> None:
        self._acting = DeterministicActing(self._model, self._cfg, self._use_cuda)

    def _init_collect(self) -> None:
        self._adder = self._acting.adder

    def _forward_collect(self, data_id: List[int], data: Any) -> Output:
        """Noisy actions ``(B, N, A)`` and, with communication, the attention unit's samples: the thoughts ``(B, N,
        H)`` and each agent's delta Q ``(B, N)``."""
        agent = self._acting.collect_agent
        agent.mode(train=False)
        kwargs = {"state_id": data_id} if self._acting.noise_per_env else {}
        output = agent.forward(data, mode="compute_actor", **kwargs)
        return {"action": output["action"], **self._attention_fields(data, output)}

    def _attention_fields(self, obs: Any, output: Mapping[str, torch.Tensor]) -> Dict[str, torch.Tensor]:
        if not self._model.communication:
            return {}
        with torch.no_grad():
            delta_q = self._model.delta_q(obs, output["thought"], output["group"])
        return {"thought": output["thought"], "delta_q": delta_q}

    def _process_transition(self, obs: Any, agent_output: Output, timestep: Any) -> Dict[str, Any]:
        transition = standard_transition(obs, agent_output, timestep)
        if self._model.communication:
            if "thought" in agent_output:
                transition.update(thought=agent_output["thought"], delta_q=agent_output["delta_q"])
            else:  # a random warm-up action: no thought was formed; the attention unit skips NaN labels
                model = self._model
                transition.update(
                    thought=np.zeros((model.agent_num, model.thought_size), np.float32),
                    delta_q=np.full(model.agent_num, np.nan, np.float32),
                )
        return transition

    def _reset_collect(self, data_id: Optional[List[int]] = None) -> None:
        self._acting.reset(data_id)

    def _init_eval(self) -> None:
        pass  # the eval agent is part of self._acting

    def _forward_eval(self, data_id: List[int], data: Any) -> Output:
        return self._acting.evaluate(data)


def atoc_actor_step(ac: ActorCriticLearn, obs: torch.Tensor, weight: Optional[torch.Tensor]) -> torch.Tensor:
    """The actor's loss ``-mean_{b,i} w_bi Q(o_bi, mu(o_b)_i)`` with the team's communication in the graph, one step
    of the actor's optimizer (part I, channel, part II); the critic's weights get no gradient.

    Shapes:
        - obs: :math:`(B, N, obs\\_dim)`; weight: :math:`(B N,)` or None

    Returns:
        The loss (detached).
    """
    action = ac.agent.forward(obs, mode="compute_actor")["action"]
    critic_input = {"obs": agent_rows(obs), "action": agent_rows(action)}
    q = ac.agent.forward(critic_input, mode="compute_critic", param_grad=False)["q"]
    loss = deterministic_actor_loss(q, weight)
    minimize(ac.actor_optimizer, loss, ac.actor_params)
    return loss.detach()


def attention_labels(delta_q: torch.Tensor) -> torch.Tensor:
    """The attention unit's targets: delta Q min-max normalized into ``[0, 1]`` over the batch (the paper's
    normalization); 0.5 everywhere when every delta Q is the same.

    Shapes:
        - delta_q: :math:`(K,)`; output: :math:`(K,)`
    """
    low, high = delta_q.min(), delta_q.max()
    span = high - low
    if float(span) <= 1e-8:
        return torch.full_like(delta_q, 0.5)
    return (delta_q - low) / span


def attention_step(
    model: torch.nn.Module, optimizer: torch.optim.Optimizer, thought: torch.Tensor, delta_q: torch.Tensor
) -> Optional[Tuple[torch.Tensor, torch.Tensor]]:
    """The attention unit's log loss ``-mean [y log p + (1 - y) log(1 - p)]``, ``p = sigmoid(g(h))`` on the stored
    thoughts and ``y = attention_labels(delta_q)``, one step of its optimizer. Entries whose delta Q is NaN (random
    warm-up actions, which formed no thought) are left out; a batch of only those takes no step and returns None.

    Shapes:
        - thought: :math:`(B, N, H)`; delta_q: :math:`(B, N)`

    Returns:
        ``(loss, initiator_rate)``, detached: the rate is the fraction of ``p > initiator_threshold`` before the step;
        None without a labelled entry.
    """
    valid = torch.isfinite(delta_q)
    thought, delta_q = thought[valid].float(), delta_q[valid].float()
    if delta_q.numel() == 0:
        return None
    logit = model.attention_logit(thought)
    loss = F.binary_cross_entropy_with_logits(logit, attention_labels(delta_q))
    minimize(optimizer, loss)
    rate = (torch.sigmoid(logit.detach()) > model.initiator_threshold).float().mean()
    return loss.detach(), rate


def agent_rows(x: torch.Tensor) -> torch.Tensor:
    """Per-agent rows as one batch: ``(B, N, D) -> (B N, D)`` (agent ``i`` of sample ``b`` at row ``b N + i``)."""
    return x.reshape(-1, x.shape[-1])


def per_agent(value: Optional[torch.Tensor], agents: int) -> Optional[torch.Tensor]:
    """A per-sample value repeated for each agent's row: ``(B,) -> (B N,)`` (None stays None)."""
    return None if value is None else value.repeat_interleave(agents)


def agent_terms(
    data: Mapping[str, Any], team_reward: str, agents: int
) -> Tuple[torch.Tensor, torch.Tensor, Optional[torch.Tensor]]:
    """``(reward, terminated, value_gamma)`` per agent row, rewards time first: each agent's own reward
    (``team_reward: agent``) or the team's ``sum``/``mean`` given to every agent.

    Shapes:
        - data['reward']: :math:`(B, nstep, N)`; data['terminated'], data['value_gamma']: :math:`(B,)`
        - reward: :math:`(nstep, B N)`; terminated, value_gamma: :math:`(B N,)`

    Raises:
        ValueError: the reward is not one per agent.
    """
    reward = data["reward"].float()
    if reward.dim() != 3 or reward.shape[2] != agents:
        raise ValueError(
            f"atoc: the batch's reward has shape {tuple(reward.shape)}; expected (batch, nstep, {agents}), one "
            "reward per agent (an env of the multi-agent contract)"
        )
    if team_reward in ("sum", "mean"):
        team = reward.sum(-1, keepdim=True) if team_reward == "sum" else reward.mean(-1, keepdim=True)
        reward = team.expand_as(reward)
    reward = reward.transpose(0, 1).reshape(reward.shape[1], -1)
    value_gamma = data.get("value_gamma")
    return reward, per_agent(data["terminated"].float(), agents), per_agent(value_gamma, agents)


register_policy("atoc", ATOCPolicy)
