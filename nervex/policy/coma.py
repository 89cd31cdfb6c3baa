"""COMA (Foerster et al. 2018): counterfactual multi-agent policy gradients, on whole episodes.

One gradient step on a batch of ``B`` episodes, top to bottom (``_forward_learn``):

1. the episodes (``Adder(kind='episode')``: each padded to ``max_episode_len + 1`` steps, the step after an
   episode's last holding its final observation) are made time-major: ``L = T + 1`` rows, ``T`` learn steps;
2. the actor (a GRU ``AgentNet`` shared by the agents) runs over every row from a zero state: per-agent
   probabilities ``pi`` with the epsilon floor over legal actions (``coma_policy_probs``), 0 on illegal actions;
3. the critic and its target give ``Q(s_t, (u_-a, .))`` for every agent; padding rows take joint actions sampled
   from ``pi``, so at a truncated episode's final observation the target's value is the expected
   ``sum_u' pi_a(u') Q'(s_T, (u_-a, u'))``;
4. the critic learns TD(lambda) returns of the team reward from the target critic (``coma_lambda_return``: a
   termination bootstraps nothing, a time limit bootstraps from the final observation, padding gives no loss);
5. the actor ascends ``A_a log pi_a(u_a)`` with the counterfactual advantage ``A_a = Q(s, u)[u_a] - sum_u' pi_a(u')
   Q(s, (u_-a, u'))`` from the critic before its update (``coma_advantage``), plus an entropy bonus; padding steps
   and dead agents (``alive`` 0) give no loss;
6. the target critic copies the critic every ``learn.target_update_freq`` steps.
"""

from __future__ import annotations

import os
from typing import Any, Dict, List, Mapping, NamedTuple, Optional

import torch
from easydict import EasyDict

from nervex.agent import Agent
from nervex.agent.agent import set_train_mode
from nervex.config import ConfigError, Field
from nervex.rl_utils import Adder, epsilon_greedy, masked_argmax
from nervex.rl_utils.coma import coma_advantage, coma_lambda_return, coma_policy_probs, masked_mean
from nervex.torch_utils import Adam

from .base_policy import Output, register_policy
from .common_policy import CommonPolicy


class Episodes(NamedTuple):
    """A batch of padded episodes, time-major (``L = T + 1`` rows).

    Shapes:
        - obs ``(L, B, N, O)``, global_state ``(L, B, S)``, action_mask ``(L, B, N, A)`` bool, action ``(L, B, N)``
        - step_mask ``(L, B)``: 1 for real steps; reward, terminated, truncated ``(T, B)``; agent_mask ``(T, B, N)``
    """

    obs: torch.Tensor
    global_state: torch.Tensor
    action_mask: Optional[torch.Tensor]
    action: torch.Tensor
    step_mask: torch.Tensor
    reward: torch.Tensor
    terminated: torch.Tensor
    truncated: torch.Tensor
    agent_mask: torch.Tensor


def _dict_obs(data: Any) -> Dict[str, Any]:
    """A batched observation as a dict (a plain ``(B, N, O)`` tensor is ``{'obs': ...}``)."""
    return dict(data) if isinstance(data, Mapping) else {"obs": data}


class COMAPolicy(CommonPolicy):
    """COMA: decentralized GRU actors trained with a centralized counterfactual critic, discrete actions.

    The model is ``coma`` (``nervex.model.COMA``: ``AgentNet`` actor + ``COMACritic``); dict observations follow the
    multi-agent contract (``obs``, ``global_state``, optional ``action_mask`` and ``alive``). Collection is whole
    episodes (the on-policy ``episode`` collect unit: the envs restart at each collection).

    Config keys (besides the on-policy contract keys ``collect.n_episode`` (episodes per update), ``learn.batch_size``
    (episodes per gradient step; null: all), ``learn.epoch_per_collect``):
        team_reward: ``env`` (the env's reduction), ``sum`` or ``mean`` of the per-agent rewards.
        max_episode_len: steps an episode sample holds; null: the env's time limit (filled by ``make_policy``).
        discount_factor, td_lambda: the critic's TD(lambda) targets.
        learn.actor_lr, learn.critic_lr, learn.grad_clip: two Adam optimizers, gradient-norm clipping (0: off).
        learn.entropy_weight: weight of the actors' entropy bonus.
        learn.target_update_freq: gradient steps between copies of the critic into the target critic.
        command.eps: the epsilon floor's schedule over env steps (PyMARL: linear 0.5 -> 0.01 over 100k steps);
            collection and learning use the same floor, evaluation acts greedily among legal actions.
    """

    on_policy = True
    default_model_type = "coma"
    config: Dict[str, Any] = dict(
        team_reward=Field("env", choices=("env", "sum", "mean")),
        max_episode_len=Field(None, ge=1, kind="int"),
        discount_factor=Field(0.99, gt=0, le=1),
        td_lambda=Field(0.8, ge=0, le=1),
        learn=dict(
            epoch_per_collect=1,
            batch_size=None,
            actor_lr=Field(5e-4, gt=0),
            critic_lr=Field(5e-4, gt=0),
            grad_clip=Field(10.0, ge=0),
            entropy_weight=Field(0.01, ge=0),
            target_update_freq=Field(200, ge=1),
        ),
        collect=dict(n_episode=8),
        command=dict(
            eps=dict(
                type=Field("linear", choices=("exp", "linear")),
                start=Field(0.5, ge=0, le=1),
                end=Field(0.01, ge=0, le=1),
                decay=Field(100000, gt=0),
            )
        ),
    )

    @classmethod
    def compile_section(cls, cfg: Mapping[str, Any], source: Optional[str] = None) -> EasyDict:
        section = super().compile_section(cfg, source)
        if section.collect.n_episode is None:
            where = f" in {os.path.basename(source)}" if source else ""
            raise ConfigError(
                f"key 'policy.collect.n_episode'{where} is null, but coma learns from whole episodes; set it to the "
                "episodes collected per update (PyMARL: 8)"
            )
        return section

    def _init_shared(self) -> None:
        if not (hasattr(self._model, "actor") and hasattr(self._model, "critic")):
            raise ValueError(f"coma needs the 'coma' model (actor and critic), got {type(self._model).__name__}")
        self._recurrent = bool(getattr(self._model, "recurrent", False))
        self._max_len = self._cfg.max_episode_len

    # ---- learn -----------------------------------------------------------------------------------------------
    def _init_learn(self) -> None:
        learn = self._cfg.learn
        if self._cfg.team_reward == "env":
            raise ValueError(
                "coma: policy.team_reward is 'env' but no env resolved it; build the policy with "
                "nervex.entry.builder.make_policy, or set policy.team_reward to 'sum' or 'mean'"
            )
        self._gamma, self._lambda = float(self._cfg.discount_factor), float(self._cfg.td_lambda)
        clip = dict(grad_clip_type="clip_norm", clip_value=float(learn.grad_clip)) if learn.grad_clip > 0 else {}
        self._actor_optimizer = Adam(self._model.actor.parameters(), lr=learn.actor_lr, **clip)
        self._critic_optimizer = Adam(self._model.critic.parameters(), lr=learn.critic_lr, **clip)
        self._critic_agent = Agent(self._model.critic)
        self._critic_agent.add_model("target", update_type="assign", update_kwargs={"freq": learn.target_update_freq})
        self._critic_agent.add_plugin("main", "grad", enable_grad=True)

    def _episodes(self, data: Mapping[str, Any]) -> Episodes:
        """The collated episode samples ``(B, L, ...)`` made time-major, with the team reward and the masks."""

        def rows(x: torch.Tensor) -> torch.Tensor:
            return x.transpose(0, 1)

        obs = _dict_obs(data["obs"])
        steps = data["mask"].shape[1] - 1
        step_mask = rows(data["mask"].float())
        reward = rows(data["reward"].float())[:steps]
        reward = reward.sum(-1) if self._cfg.team_reward == "sum" else reward.mean(-1)
        agent_obs = rows(obs["obs"].float())
        alive = obs.get("alive")
        alive = torch.ones(agent_obs.shape[:-1], device=agent_obs.device) if alive is None else rows(alive.float())
        mask = obs.get("action_mask")
        return Episodes(
            obs=agent_obs,
            global_state=rows(obs["global_state"].float()),
            action_mask=None if mask is None else rows(mask.bool()),
            action=rows(data["action"].long()),
            step_mask=step_mask,
            reward=reward,
            terminated=rows(data["terminated"].float())[:steps],
            truncated=rows(data["truncated"].float())[:steps],
            agent_mask=step_mask[:steps].unsqueeze(-1) * alive[:steps],
        )

    def _critic_q(self, ep: Episodes, pi: torch.Tensor) -> Dict[str, torch.Tensor]:
        """Step 3: the critic's and the target's ``Q (L, B, N, A)``, with padding rows' joint actions sampled from
        ``pi``, and the target's value ``(L, B, N)`` of each row (taken action; expected under ``pi`` on padding)."""
        with torch.no_grad():
            sampled = torch.multinomial(pi.reshape(-1, pi.shape[-1]), 1).reshape(ep.action.shape)
            action = torch.where(ep.step_mask.unsqueeze(-1) > 0, ep.action, sampled)
        last_action = torch.cat([torch.full_like(action[:1], -1), action[:-1]])
        inputs = {"global_state": ep.global_state, "obs": ep.obs, "action": action, "last_action": last_action}
        q = self._critic_agent.forward(inputs)["q"]
        target_q = self._critic_agent.target_forward(inputs)["q"]
        taken = target_q.gather(-1, action.unsqueeze(-1)).squeeze(-1)
        expected = (pi * target_q).sum(-1)
        value = torch.where(ep.step_mask.unsqueeze(-1) > 0, taken, expected)
        return {"q": q, "target_value": value}

    def _forward_learn(self, data: Dict[str, Any], eps: float = 0.0) -> Dict[str, Any]:
        self._critic_agent.mode(train=True)
        set_train_mode(self._model.actor, True)
        ep = self._episodes(data)
        steps = ep.reward.shape[0]
        logit = self._model.actor({"obs": ep.obs, "prev_state": None}, sequence=True)["logit"]
        pi = coma_policy_probs(logit, ep.action_mask, eps)
        critic = self._critic_q(ep, pi.detach())
        returns = coma_lambda_return(
            ep.reward, critic["target_value"], ep.terminated, ep.truncated, ep.step_mask[:steps], self._gamma,
            self._lambda,
        )  # fmt: skip
        action = ep.action[:steps]
        q = critic["q"][:steps]
        q_taken = q.gather(-1, action.unsqueeze(-1)).squeeze(-1)
        critic_loss = masked_mean((q_taken - returns).square(), ep.agent_mask)
        adv = coma_advantage(q.detach(), pi[:steps].detach(), action, ep.agent_mask)
        pi_taken = pi[:steps].gather(-1, action.unsqueeze(-1)).squeeze(-1)
        log_pi = torch.where(ep.agent_mask > 0, pi_taken, torch.ones_like(pi_taken)).log()
        # pi is exactly 0 on illegal actions: clamp inside the log so their gradient stays finite (xlogy's is NaN)
        entropy = masked_mean(-(pi[:steps] * pi[:steps].clamp(min=1e-10).log()).sum(-1), ep.agent_mask)
        policy_loss = -masked_mean(adv.advantage * log_pi, ep.agent_mask)
        actor_loss = policy_loss - self._cfg.learn.entropy_weight * entropy
        for optimizer, loss in ((self._critic_optimizer, critic_loss), (self._actor_optimizer, actor_loss)):
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
        self._critic_agent.target_update()
        with torch.no_grad():
            figures = {
                "total_loss": actor_loss + critic_loss,
                "actor_loss": policy_loss,
                "critic_loss": critic_loss,
                "entropy": entropy,
                "advantage_mean": masked_mean(adv.advantage, ep.agent_mask),
                "q_taken_mean": masked_mean(adv.q_taken, ep.agent_mask),
                "return_mean": masked_mean(returns, ep.agent_mask),
            }
        out: Dict[str, Any] = dict(zip(figures, torch.stack(list(figures.values())).tolist()))
        out.update(cur_lr=self._actor_optimizer.param_groups[0]["lr"], eps=float(eps))
        return out

    # ---- collect ---------------------------------------------------------------------------------------------
    def _acting_agent(self) -> Agent:
        agent = Agent(self._model)
        if self._recurrent:
            agent.add_plugin("main", "hidden_state", init_fn=self._model.initial_state)
        agent.add_plugin("main", "grad", enable_grad=False)
        return agent

    def _actor_logit(self, agent: Agent, data_id: List[int], obs: Dict[str, Any]) -> torch.Tensor:
        set_train_mode(self._model, False)
        kwargs = {"state_id": data_id} if self._recurrent else {}
        return agent.forward(obs, mode="compute_actor", **kwargs)["logit"]

    def _init_collect(self) -> None:
        if self._max_len is None:
            raise ValueError(
                "coma: policy.max_episode_len is null and no env filled it (the env declares no max_episode_steps); "
                "set it to the longest episode the env plays"
            )
        self._adder = Adder(self._use_cuda, unroll_len=int(self._max_len), kind="episode")
        self._collect_agent = self._acting_agent()

    def _forward_collect(self, data_id: List[int], data: Any, eps: float = 0.0) -> Output:
        """Sample each agent's action from ``pi`` (the epsilon floor over legal actions; illegal ones have 0)."""
        obs = _dict_obs(data)
        logit = self._actor_logit(self._collect_agent, data_id, obs)
        probs = coma_policy_probs(logit, obs.get("action_mask"), eps)
        action = torch.multinomial(probs.reshape(-1, probs.shape[-1]), 1).reshape(probs.shape[:-1])
        return {"action": action}

    def _reset_collect(self, data_id: Optional[List[int]] = None) -> None:
        if self._recurrent:
            self._collect_agent.reset(data_id)

    # ---- eval ------------------------------------------------------------------------------------------------
    def _init_eval(self) -> None:
        self._eval_agent = self._acting_agent()

    def _forward_eval(self, data_id: List[int], data: Any) -> Output:
        """Each agent's most probable legal action."""
        obs = _dict_obs(data)
        logit = self._actor_logit(self._eval_agent, data_id, obs)
        mask = obs.get("action_mask")
        return {"action": masked_argmax(logit, None if mask is None else mask.bool())}

    def _reset_eval(self, data_id: Optional[List[int]] = None) -> None:
        if self._recurrent:
            self._eval_agent.reset(data_id)

    # ---- command ---------------------------------------------------------------------------------------------
    def _init_command(self) -> None:
        eps = self._cfg.command.eps
        self._eps_fn = epsilon_greedy(eps.start, eps.end, eps.decay, eps.type)

    def _get_setting_collect(self, command_info: Dict[str, Any]) -> Dict[str, Any]:
        return {"eps": self._eps_fn(command_info["env_step"])}

    def _get_setting_learn(self, command_info: Dict[str, Any]) -> Dict[str, Any]:
        return {"eps": self._eps_fn(command_info["env_step"])}


register_policy("coma", COMAPolicy)
