"""MAPPO (Yu et al. 2022, "The Surprising Effectiveness of PPO in Cooperative Multi-Agent Games").

PPO for a team of agents that share one actor, with a centralized value on the global state. One rollout step is one
joint step of every agent; the team reward (the env's ``team_reward`` reduction of the per-agent rewards) drives a GAE
per agent, ``A_i`` from ``V(s, i)``, with time-limit truncations bootstrapped (the actor stores ``next_value``). The
update, per minibatch of joint steps (the learn loop's shuffled epochs):

1. the value targets ``R_i`` and the stored values are normalized by a running mean/std of the returns (MAPPO's
   ValueNorm, updated with each minibatch's returns as the MAPPO code does); the critic predicts normalized values;
2. advantages are normalized over the minibatch's live agents;
3. PPO's clipped surrogate on each agent's ``pi(a_i | o_i)`` (illegal actions have probability 0), the clipped value
   loss and the entropy bonus, each a mean over live agents (a dead agent's entries weigh 0);
4. actor and critic each take an Adam step with their gradient norm clipped apart (MAPPO's two optimizers).
"""

from __future__ import annotations

from typing import Any, Dict, List, Mapping, Optional, Tuple

import numpy as np
import torch

from nervex.agent import Agent
from nervex.agent.agent import set_train_mode
from nervex.config import Field
from nervex.envs.multi_agent import team_value
from nervex.rl_utils import Adder, ppo_data, ppo_error
from nervex.torch_utils import Adam, RunningMeanStd

from .actor_critic import SCHEDULES, dist_from_output, explained_variance, schedule_value
from .base_policy import Output, Policy, register_policy
from .common_policy import standard_transition

SAMPLE_FIELDS = ("obs", "action", "logp", "value", "adv", "return")
TEAM_REWARDS = ("env", "sum", "mean")
VALUE_NORM_MIN_VAR = 1e-2  # MAPPO's ValueNorm floors the variance: returns that barely vary are not blown up


def alive_weight(alive: Optional[torch.Tensor], like: torch.Tensor) -> Optional[torch.Tensor]:
    """Per-entry weights whose plain mean is the mean over live agents: ``alive * numel / sum(alive)`` (None when
    every agent is alive, i.e. ``alive`` is None); all zeros when no agent is alive.

    Shapes:
        - alive: :math:`(B, N)` (0/1) or None; like: :math:`(B, N)`; output: :math:`(B, N)`
    """
    if alive is None:
        return None
    alive = alive.to(like.dtype)
    return alive * (alive.numel() / alive.sum().clamp_min(1.0))


def masked_normalize(x: torch.Tensor, weight: Optional[torch.Tensor], eps: float = 1e-8) -> torch.Tensor:
    """``(x - mean) / (std + eps)`` with the mean and (unbiased) std over the entries where ``weight > 0``.

    Shapes:
        - x, weight: :math:`(B, N)` (weight may be None: every entry); output: like ``x``
    """
    if weight is None:
        return (x - x.mean()) / (x.std() + eps) if x.numel() > 1 else x
    live = weight > 0
    count = int(live.sum())
    if count < 2:
        return x
    mean = x[live].mean()
    return (x - mean) / (x[live].std() + eps)


class MAPPOPolicy(Policy):
    """MAPPO over the cooperative env contract (``nervex.envs.multi_agent``): dict observations with per-agent
    ``obs``, ``global_state``, optional ``action_mask`` and ``alive``; ``(N,)`` actions; ``(N,)`` rewards.

    Config keys besides the on-policy contract (``collect.rollout_len`` joint steps per env, ``learn.epoch_per_collect``
    passes of ``learn.batch_size`` joint steps; null: the whole rollout, MAPPO's one minibatch):
        team_reward: ``env`` (the env's reduction), ``sum`` or ``mean`` of the per-agent rewards.
        discount_factor, gae_lambda: GAE's gamma and lambda, per agent.
        value_norm: normalize value targets by a running mean/std of the returns (MAPPO's ValueNorm).
        learn.learning_rate / critic_learning_rate (null: learning_rate) / lr_schedule: the two Adams' rates.
        learn.clip_ratio / clip_schedule; learn.value_clip_ratio (null: off); learn.value_weight; learn.entropy_weight;
        learn.adv_norm; learn.grad_clip (per network, 0: off); learn.adam_eps.
        eval.greedy: evaluate each agent's most likely legal action (or its Gaussian mean), as the MAPPO code does;
            false: sample the learned distribution as collection does (the policy PPO trained; in LBF, greedy agents
            can block each other forever where sampling walks around).
    """

    on_policy = True
    default_model_type = "mappo"
    config: Dict[str, Any] = dict(
        team_reward=Field("env", choices=TEAM_REWARDS),
        discount_factor=Field(0.99, gt=0, le=1),
        gae_lambda=Field(0.95, ge=0, le=1),
        value_norm=True,
        learn=dict(
            epoch_per_collect=10,
            batch_size=None,
            learning_rate=Field(7e-4, gt=0),
            critic_learning_rate=Field(None, gt=0, kind="number"),
            lr_schedule=Field("constant", choices=SCHEDULES),
            clip_ratio=Field(0.2, gt=0),
            clip_schedule=Field("constant", choices=SCHEDULES),
            value_clip_ratio=Field(0.2, gt=0, nullable=True),
            value_weight=Field(1.0, ge=0),
            entropy_weight=Field(0.01, ge=0),
            adv_norm=True,
            grad_clip=Field(10.0, ge=0),
            adam_eps=Field(1e-5, gt=0),
        ),
        collect=dict(rollout_len=25),
        eval=dict(greedy=True),
    )

    _value_rms: Optional[RunningMeanStd] = None

    def _init_shared(self) -> None:
        cfg = self._cfg
        if cfg.team_reward == "env":
            raise ValueError(
                "MAPPOPolicy: policy.team_reward is 'env' but no env resolved it; build the policy with "
                "nervex.entry.make_policy (which reads the env's team_reward), or set 'sum' or 'mean'"
            )
        self._team_reward = str(cfg.team_reward)
        self._continuous = getattr(self._model, "continuous", False)
        self._recurrent = self._model.initial_state() is not None
        if cfg.value_norm:
            self._value_rms = RunningMeanStd(())

    # ---- value normalization (MAPPO's ValueNorm) -------------------------------------------------------------
    def _value_scale(self, like: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
        rms = self._value_rms
        mean = torch.as_tensor(rms.mean, dtype=like.dtype, device=like.device)
        std = torch.as_tensor(np.sqrt(max(float(rms.var), VALUE_NORM_MIN_VAR)), dtype=like.dtype, device=like.device)
        return mean, std

    def normalize_value(self, value: torch.Tensor) -> torch.Tensor:
        """Returns-scale values to the critic's scale (identity without ``value_norm``)."""
        if self._value_rms is None:
            return value
        mean, std = self._value_scale(value)
        return (value - mean) / std

    def denormalize_value(self, value: torch.Tensor) -> torch.Tensor:
        """The critic's output back on the returns' scale (identity without ``value_norm``)."""
        if self._value_rms is None:
            return value
        mean, std = self._value_scale(value)
        return value * std + mean

    # ---- learn ----------------------------------------------------------------------------------------------
    def _init_learn(self) -> None:
        learn = self._cfg.learn
        clip = dict(grad_clip_type="clip_norm", clip_value=float(learn.grad_clip)) if learn.grad_clip > 0 else {}
        critic_lr = learn.critic_learning_rate or learn.learning_rate
        actor_params, critic_params = self._model.actor_parameters(), self._model.critic_parameters()
        self._actor_optimizer = Adam(actor_params, lr=learn.learning_rate, eps=learn.adam_eps, **clip)
        self._critic_optimizer = Adam(critic_params, lr=critic_lr, eps=learn.adam_eps, **clip)

    def _forward_learn(
        self,
        data: Dict[str, Any],
        learning_rate: Optional[float] = None,
        critic_learning_rate: Optional[float] = None,
        clip_ratio: Optional[float] = None,
    ) -> Dict[str, Any]:
        learn = self._cfg.learn
        clip = learn.clip_ratio if clip_ratio is None else clip_ratio
        self._set_rates(learning_rate, critic_learning_rate)
        set_train_mode(self._model, True)
        output = self._model({**data["obs"], "prev_state": data.get("prev_state")}, mode="compute_action_value")
        dist = dist_from_output(output)
        logp = dist.log_prob(data["action"] if self._continuous else data["action"].long())
        entropy = dist.entropy()
        alive = data["obs"].get("alive")
        weight = alive_weight(alive, logp)
        value_old, value_target = self._value_targets(data["value"], data["return"], weight)
        adv = masked_normalize(data["adv"], weight) if learn.adv_norm else data["adv"]
        loss, info = ppo_error(
            ppo_data(logp, data["logp"], entropy, output["value"], value_old, adv, value_target, weight),
            clip,
            learn.value_clip_ratio,
        )
        total = loss.policy_loss + learn.value_weight * loss.value_loss + learn.entropy_weight * loss.entropy_loss
        self._actor_optimizer.zero_grad(set_to_none=True)
        self._critic_optimizer.zero_grad(set_to_none=True)
        total.backward()
        self._actor_optimizer.step()  # each clips its own network's gradient norm first
        self._critic_optimizer.step()
        return self._learn_figures(total, loss, info, data, weight, clip, dist)

    def _set_rates(self, learning_rate: Optional[float], critic_learning_rate: Optional[float]) -> None:
        for optimizer, rate in ((self._actor_optimizer, learning_rate), (self._critic_optimizer, critic_learning_rate)):
            if rate is not None:
                for group in optimizer.param_groups:
                    group["lr"] = rate

    def _value_targets(
        self, value: torch.Tensor, returns: torch.Tensor, weight: Optional[torch.Tensor]
    ) -> Tuple[torch.Tensor, torch.Tensor]:
        """The rollout's values and the GAE returns on the critic's scale, after the running statistics took in
        the live agents' returns of this minibatch."""
        if self._value_rms is not None:
            live = returns if weight is None else returns[weight > 0]
            self._value_rms.update(live.detach().reshape(-1).cpu().numpy())
        return self.normalize_value(value), self.normalize_value(returns)

    def _learn_figures(
        self, total: torch.Tensor, loss: Any, info: Any, data: Mapping[str, Any], weight: Any, clip: float, dist: Any
    ) -> Dict[str, Any]:
        figures = torch.stack(
            [total, loss.policy_loss, loss.value_loss, loss.entropy_loss, info.approx_kl, info.clip_fraction]
        ).tolist()
        names = ("total_loss", "policy_gradient_loss", "value_loss", "entropy_loss", "approx_kl", "clip_fraction")
        out: Dict[str, Any] = dict(zip(names, figures))
        live = slice(None) if weight is None else weight > 0
        out["explained_variance"] = explained_variance(
            data["value"][live].reshape(-1), data["return"][live].reshape(-1)
        )
        out["cur_lr"] = self._actor_optimizer.param_groups[0]["lr"]
        out["clip_range"] = clip
        if self._value_rms is not None:
            out["value_norm_mean"] = float(self._value_rms.mean)
            out["value_norm_std"] = float(np.sqrt(self._value_rms.var))
        if self._continuous:
            out["std"] = float(dist.sigma.detach().mean())
        return out

    def _get_setting_learn(self, command_info: Dict[str, Any]) -> Dict[str, Any]:
        learn = self._cfg.learn
        critic_lr = learn.critic_learning_rate or learn.learning_rate
        return {
            "learning_rate": schedule_value(learn.learning_rate, learn.lr_schedule, command_info),
            "critic_learning_rate": schedule_value(critic_lr, learn.lr_schedule, command_info),
            "clip_ratio": schedule_value(learn.clip_ratio, learn.clip_schedule, command_info),
        }

    # ---- collect --------------------------------------------------------------------------------------------
    def _init_collect(self) -> None:
        keep = SAMPLE_FIELDS + (("prev_state",) if self._recurrent else ())
        self._adder = Adder(
            self._use_cuda,
            kind="gae",
            gamma=float(self._cfg.discount_factor),
            gae_lambda=float(self._cfg.gae_lambda),
            keep=keep,
        )
        plugin = "gaussian_sample" if self._continuous else "multinomial_sample"
        self._collect_agent = self._acting_agent(plugin, save_prev_state=True)

    def _acting_agent(self, sample: str, save_prev_state: bool = False, **sample_kwargs: Any) -> Agent:
        """The model without gradients, through the actor's recurrent state (one per env, when recurrent) and the
        ``sample`` plugin (which reads the model's ``action_mask``)."""
        agent = Agent(self._model)
        if self._recurrent:
            agent.add_plugin("main", "hidden_state", init_fn=self._model.initial_state, save_prev_state=save_prev_state)
        agent.add_plugin("main", sample, **sample_kwargs)
        agent.add_plugin("main", "grad", enable_grad=False)
        return agent

    def _forward_collect(self, data_id: List[int], data: Dict[str, Any]) -> Output:
        """Every agent's sampled ``action`` and its ``logp``, the centralized ``value`` per agent (returns' scale),
        and the actor's ``prev_state`` when recurrent."""
        set_train_mode(self._model, False)
        kwargs = {"state_id": data_id} if self._recurrent else {}
        out = self._collect_agent.forward(data, mode="compute_action_value", **kwargs)
        output = {"action": out["action"], "logp": out["logp"], "value": self.denormalize_value(out["value"])}
        if self._recurrent:
            output["prev_state"] = out["prev_state"]
        return output

    def _forward_bootstrap(self, data_id: List[int], data: Dict[str, Any]) -> Output:
        """``{'value': V(s', i)}`` per agent for observations that are not acted on (truncations, cut rollouts)."""
        set_train_mode(self._model, False)
        return {"value": self.denormalize_value(self._model(data, mode="compute_value")["value"])}

    def _process_transition(self, obs: Any, agent_output: Output, timestep: Any) -> Dict[str, Any]:
        """The standard transition with the team reward (a scalar: GAE broadcasts it over the agents' values),
        ``logp`` and ``value`` per agent (and ``prev_state``)."""
        transition = standard_transition(obs, agent_output, timestep)
        del transition["next_obs"]  # the actor bootstraps from the real next observation; samples do not need it
        transition["reward"] = np.float32(team_value(timestep.reward, self._team_reward))
        transition["logp"] = agent_output["logp"]
        transition["value"] = agent_output["value"]
        if self._recurrent:
            transition["prev_state"] = agent_output["prev_state"]
        return transition

    def _reset_collect(self, data_id: Optional[List[int]] = None) -> None:
        self._collect_agent.reset(data_id)

    # ---- eval -----------------------------------------------------------------------------------------------
    def _init_eval(self) -> None:
        greedy = bool(self._cfg.eval.greedy)
        if self._continuous:
            self._eval_agent = self._acting_agent("gaussian_sample", deterministic=greedy)
        else:
            self._eval_agent = self._acting_agent("argmax_sample" if greedy else "multinomial_sample")

    def _forward_eval(self, data_id: List[int], data: Dict[str, Any]) -> Output:
        """The joint action: each agent's most likely legal action, or its Gaussian mean (``eval.greedy``); else a
        sample of each agent's (masked) distribution."""
        set_train_mode(self._model, False)
        kwargs = {"state_id": data_id} if self._recurrent else {}
        return {"action": self._eval_agent.forward(data, mode="compute_action", **kwargs)["action"]}

    def _reset_eval(self, data_id: Optional[List[int]] = None) -> None:
        self._eval_agent.reset(data_id)

    # ---- state ----------------------------------------------------------------------------------------------
    def _state_dict_extra(self) -> Dict[str, Any]:
        return {} if self._value_rms is None else {"value_norm": self._value_rms.state_dict()}

    def _load_state_dict_extra(self, state: Mapping[str, Any]) -> None:
        if self._value_rms is not None and "value_norm" in state:
            self._value_rms.load_state_dict(state["value_norm"])


register_policy("mappo", MAPPOPolicy)
