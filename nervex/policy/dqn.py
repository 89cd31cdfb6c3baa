"""DQN with the usual switches: double Q, dueling head (a model option), n-step returns, prioritized replay."""

from __future__ import annotations

from collections import deque
from typing import Any, Dict, List

import torch

from nervex.agent import Agent
from nervex.rl_utils import Adder, epsilon_greedy, q_nstep_td_data, q_nstep_td_error
from nervex.torch_utils import Adam

from .base_policy import CommonPolicy, register_policy


class DQNPolicy(CommonPolicy):
    """Deep Q-learning (Mnih et al. 2015) with double Q (van Hasselt et al. 2016), n-step targets and PER.

    Config keys (defaults in ``config``):
        discount_factor, nstep: the n-step target ``sum_k gamma^k r_k + gamma^n max_a Q'(s_n, a)``.
        priority: return per-sample |TD| as new priorities and weight the loss by importance weights.
        learn.double: pick the next action with the online net, value it with the target net.
        learn.target_update_freq: copy online -> target every this many learner iterations (``assign``);
            ``learn.target_theta`` > 0 switches to Polyak averaging with that rate every iteration instead.
        learn.loss: ``mse`` or ``huber``.
        command.eps: epsilon schedule over env steps (``type`` exp or linear, ``start``, ``end``, ``decay``).
    """

    default_model_type = "fc_discrete_net"
    config: Dict[str, Any] = dict(
        policy_type="dqn",
        use_cuda=False,
        model={},  # kwargs of the model class; obs_dim / action_dim are filled from the env when left out
        discount_factor=0.99,
        nstep=1,
        priority=True,
        learn=dict(
            batch_size=64,
            learning_rate=1e-3,
            weight_decay=0.0,
            train_iteration=1,  # gradient steps after each collection of collect.n_sample samples
            learning_starts=1000,  # env steps collected before the first gradient step
            target_update_freq=100,
            target_theta=0.0,
            double=True,
            loss="mse",
            grad_clip=0.0,  # max gradient norm; 0 turns clipping off
        ),
        collect=dict(n_sample=8, traj_len=1),
        eval=dict(),
        command=dict(eps=dict(type="exp", start=0.95, end=0.05, decay=10000)),
    )

    # ---- learn -----------------------------------------------------------------------------------------------
    def _init_learn(self) -> None:
        learn = self._cfg.learn
        if learn.loss not in ("mse", "huber"):
            raise ValueError(f"policy.learn.loss must be 'mse' or 'huber', got '{learn.loss}'")
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
        self._learn_agent = Agent(self._model)
        if learn.target_theta > 0:
            self._learn_agent.add_model("target", update_type="momentum", update_kwargs={"theta": learn.target_theta})
        else:
            self._learn_agent.add_model(
                "target", update_type="assign", update_kwargs={"freq": int(learn.target_update_freq)}
            )
        self._learn_agent.add_plugin("main", "grad", enable_grad=True)
        self._learn_agent.mode(train=True)

    def _forward_learn(self, data: Dict[str, Any]) -> Dict[str, Any]:
        data = self._to_learn_device(data)
        batch_size = data["obs"].shape[0]
        if self._double:
            # one online pass over obs and next_obs together; the next_obs half only picks actions (no gradient)
            logit = self._learn_agent.forward(torch.cat([data["obs"], data["next_obs"]]))["logit"]
            q, next_action = logit[:batch_size], logit[batch_size:].detach().argmax(dim=-1)
        else:
            q = self._learn_agent.forward(data["obs"])["logit"]
        with torch.no_grad():
            target_q = self._learn_agent.target_forward(data["next_obs"])["logit"]
            if not self._double:
                next_action = target_q.argmax(dim=-1)
        reward = data["reward"].float()
        reward = reward.t() if reward.dim() == 2 else reward.unsqueeze(0)  # (B, nstep) -> (nstep, B)
        weight = data.get("weight") if self._priority else None
        td_data = q_nstep_td_data(
            q, target_q, data["action"].long(), next_action, reward, data["terminated"].float(), weight
        )
        value_gamma = data.get("value_gamma")
        loss, td_error = q_nstep_td_error(
            td_data, self._gamma, nstep=self._nstep, value_gamma=value_gamma, criterion=self._criterion
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

    def _monitor_vars_learn(self) -> List[str]:
        return ["cur_lr", "total_loss", "q_value"]

    def _state_dict_learn(self) -> Dict[str, Any]:
        return {"model": self._learn_agent.state_dict(), "optimizer": self._optimizer.state_dict()}

    def _load_state_dict_learn(self, state_dict: Dict[str, Any]) -> None:
        self._learn_agent.load_state_dict(state_dict["model"])
        if "optimizer" in state_dict:
            self._optimizer.load_state_dict(state_dict["optimizer"])

    # ---- collect ---------------------------------------------------------------------------------------------
    def _init_collect(self) -> None:
        self._gamma = float(self._cfg.discount_factor)
        self._nstep = int(self._cfg.nstep)
        self._collect_traj_len = int(self._cfg.collect.traj_len)
        self._adder = Adder(self._use_cuda, unroll_len=1)
        self._collect_agent = Agent(self._model)
        self._collect_agent.add_plugin("main", "eps_greedy_sample")
        self._collect_agent.add_plugin("main", "grad", enable_grad=False)

    @property
    def _traj_len(self) -> int:
        # n-step targets look nstep - 1 transitions ahead, so the cache must hold that many more.
        return int(self._cfg.collect.traj_len) + int(self._cfg.nstep) - 1

    def _forward_collect(self, data_id: List[int], data: Dict[int, Any], eps: float = 0.0) -> Dict[int, Any]:
        self._collect_agent.mode(train=False)
        output = self._collect_agent.forward(self._batch_obs(data_id, data), eps=eps)
        return self._unbatch(data_id, output)

    def _process_transition(self, obs: Any, agent_output: Dict[str, Any], timestep: Any) -> Dict[str, Any]:
        return {
            "obs": obs,
            "next_obs": timestep.obs,
            "action": agent_output["action"],
            "reward": timestep.reward,
            "terminated": bool(timestep.info.get("terminated", timestep.done)),
            "truncated": bool(timestep.info.get("truncated", False)),
            "done": bool(timestep.done),
        }

    def _get_train_sample(self, traj_cache: deque) -> List[Dict[str, Any]]:
        if traj_cache[-1]["done"]:
            # the episode is over: every remaining transition becomes a sample now
            data = list(traj_cache)
            traj_cache.clear()
        else:
            data = self._adder.get_traj(traj_cache, self._traj_len, return_num=self._nstep - 1)
        data = self._adder.get_nstep_return_data(data, self._nstep, gamma=self._gamma)
        return self._adder.get_train_sample(data)

    # ---- eval ------------------------------------------------------------------------------------------------
    def _init_eval(self) -> None:
        self._eval_agent = Agent(self._model)
        self._eval_agent.add_plugin("main", "argmax_sample")
        self._eval_agent.add_plugin("main", "grad", enable_grad=False)

    def _forward_eval(self, data_id: List[int], data: Dict[int, Any]) -> Dict[int, Any]:
        self._eval_agent.mode(train=False)
        output = self._eval_agent.forward(self._batch_obs(data_id, data))
        return self._unbatch(data_id, output)

    # ---- command ---------------------------------------------------------------------------------------------
    def _init_command(self) -> None:
        eps = self._cfg.command.eps
        self._eps_fn = epsilon_greedy(eps.start, eps.end, eps.decay, eps.type)

    def _get_setting_collect(self, command_info: Dict[str, Any]) -> Dict[str, Any]:
        return {"eps": self._eps_fn(command_info.get("env_step", 0))}


register_policy("dqn", DQNPolicy)
