"""DQN with the usual switches: double Q, dueling head (a model option), n-step returns, prioritized replay."""

from __future__ import annotations

from typing import Any, Dict, List, Mapping, Optional

import torch

from nervex.config import Field
from nervex.rl_utils import Adder, epsilon_greedy, masked_argmax, q_nstep_td_data, q_nstep_td_error
from nervex.torch_utils import Adam

from .base_policy import Output, register_policy
from .common_policy import CommonPolicy, acting_agent, eps_schedule_config, obs_and_mask, q_learn_agent


class DQNPolicy(CommonPolicy):
    """Deep Q-learning (Mnih et al. 2015) with double Q (van Hasselt et al. 2016), n-step targets and PER.

    Config keys (besides the off-policy contract keys ``learn.batch_size``, ``learn.update_per_collect``,
    ``learn.learning_starts``, ``collect.n_sample``):
        discount_factor, nstep: the n-step target ``sum_k gamma^k r_k + gamma^n max_a Q'(s_n, a)``.
        priority: prioritized replay: return per-sample |TD| as new priorities and weight the loss by importance
            weights; false trains from the uniform ``ReplayBuffer``.
        learn.double: pick the next action with the online net, value it with the target net.
        learn.target_update_freq: copy online -> target every this many gradient steps (``assign``);
            ``learn.target_theta`` > 0 switches to Polyak averaging with that rate every step instead.
        learn.loss: ``mse`` or ``huber``.
        command.eps: epsilon schedule over env steps (``type`` exp or linear, ``start``, ``end``, ``decay``).

    Action masks: with dict observations ``{'obs', 'action_mask', ...}`` the model sees ``obs['obs']``; the
    epsilon-greedy and greedy actions are legal ones, and the target's max (double DQN's argmax) is over the legal
    actions of ``next_obs`` (``rl_utils.masked_argmax``).
    """

    default_model_type = "fc_discrete_net"
    config: Dict[str, Any] = dict(
        discount_factor=Field(0.99, gt=0, le=1),
        nstep=Field(1, ge=1),
        priority=True,
        learn=dict(
            learning_rate=Field(1e-3, gt=0),
            weight_decay=Field(0.0, ge=0),
            target_update_freq=Field(100, ge=1),
            target_theta=Field(0.0, ge=0, le=1),
            double=True,
            loss=Field("mse", choices=("mse", "huber")),
            grad_clip=Field(0.0, ge=0),  # max gradient norm; 0 turns clipping off
        ),
        command=dict(eps=eps_schedule_config()),
    )

    @classmethod
    def _buffer_type(cls, cfg: Mapping[str, Any]) -> Optional[str]:
        return "prioritized" if cfg["priority"] else "uniform"

    # ---- learn -----------------------------------------------------------------------------------------------
    def _init_learn(self) -> None:
        learn = self._cfg.learn
        self._gamma = float(self._cfg.discount_factor)
        self._nstep = int(self._cfg.nstep)
        self._priority = bool(self._cfg.priority)
        self._double = bool(learn.double)
        self._criterion = (
            torch.nn.MSELoss(reduction="none") if learn.loss == "mse" else torch.nn.SmoothL1Loss(reduction="none")
        )
        clip = dict(grad_clip_type="clip_norm", clip_value=float(learn.grad_clip)) if learn.grad_clip > 0 else {}
        self._optimizer = Adam(
            self._model.parameters(), lr=learn.learning_rate, weight_decay=learn.weight_decay, **clip
        )
        self._learn_agent = q_learn_agent(self._model, learn)
        self._learn_agent.mode(train=True)

    def _forward_learn(self, data: Dict[str, Any]) -> Dict[str, Any]:
        obs, _ = obs_and_mask(data["obs"])
        next_obs, next_mask = obs_and_mask(data["next_obs"])  # the target's max is over legal next actions only
        batch_size = obs.shape[0]
        if self._double:
            # one online pass over obs and next_obs together; the next_obs half only picks actions (no gradient)
            logit = self._learn_agent.forward(torch.cat([obs, next_obs]))["logit"]
            q, next_action = logit[:batch_size], masked_argmax(logit[batch_size:].detach(), next_mask)
        else:
            q = self._learn_agent.forward(obs)["logit"]
        with torch.no_grad():
            target_q = self._learn_agent.target_forward(next_obs)["logit"]
            if not self._double:
                next_action = masked_argmax(target_q, next_mask)
        reward = data["reward"].float()
        reward = reward.t() if reward.dim() == 2 else reward.unsqueeze(0)  # (B, nstep) -> (nstep, B)
        weight = data.get("weight") if self._priority else None
        td_data = q_nstep_td_data(
            q, target_q, data["action"].long(), next_action, reward, data["terminated"].float(), weight
        )
        loss, td_error = q_nstep_td_error(
            td_data,
            self._gamma,
            nstep=self._nstep,
            value_gamma=data.get("value_gamma"),
            criterion=self._criterion,
            return_td_error=True,
        )
        self._optimizer.zero_grad()
        loss.backward()
        self._optimizer.step()
        self._learn_agent.target_update()
        return {
            "cur_lr": self._optimizer.param_groups[0]["lr"],
            "total_loss": loss.item(),
            "q_value": q.detach().mean().item(),
            "priority": td_error.detach().cpu().numpy(),
        }

    # ---- collect ---------------------------------------------------------------------------------------------
    def _init_collect(self) -> None:
        self._gamma = float(self._cfg.discount_factor)
        self._nstep = int(self._cfg.nstep)
        self._adder = Adder(self._use_cuda, kind="nstep", nstep=self._nstep, gamma=self._gamma)
        self._collect_agent = acting_agent(self._model, "eps_greedy_sample", dict_obs=True)

    def _forward_collect(self, data_id: List[int], data: Any, eps: float = 0.0) -> Output:
        self._collect_agent.mode(train=False)
        return self._collect_agent.forward(data, eps=eps)

    # ---- eval ------------------------------------------------------------------------------------------------
    def _init_eval(self) -> None:
        self._eval_agent = acting_agent(self._model, "argmax_sample", dict_obs=True)

    def _forward_eval(self, data_id: List[int], data: Any) -> Output:
        self._eval_agent.mode(train=False)
        return self._eval_agent.forward(data)

    # ---- command ---------------------------------------------------------------------------------------------
    def _init_command(self) -> None:
        eps = self._cfg.command.eps
        self._eps_fn = epsilon_greedy(eps.start, eps.end, eps.decay, eps.type)

    def _get_setting_collect(self, command_info: Dict[str, Any]) -> Dict[str, Any]:
        return {"eps": self._eps_fn(command_info["env_step"])}


register_policy("dqn", DQNPolicy)
