"""R2D2 (Kapturowski et al. 2019): recurrent n-step double Q-learning on stored sequences with burn-in."""

from __future__ import annotations

import os
from typing import Any, Dict, List, Mapping, Optional

import torch
from easydict import EasyDict

from nervex.config import ConfigError, Field
from nervex.data.priority import sequence_priority
from nervex.rl_utils import Adder, epsilon_greedy, q_nstep_sequence_td_data, q_nstep_sequence_td_error
from nervex.torch_utils import Adam

from .base_policy import Output, register_policy
from .common_policy import CommonPolicy, acting_agent, eps_schedule_config, q_learn_agent, standard_transition


def take_steps(x: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """Per-sample time steps of a time-major tensor: ``out[j, b] = x[index[j, b], b]``.

    Shapes:
        ``x`` ``(T, B, *S)``, ``index`` ``(W, B)`` int64 -> ``(W, B, *S)``.
    """
    return x[index, torch.arange(x.shape[1], device=x.device).unsqueeze(0)]


class R2D2Policy(CommonPolicy):
    """R2D2: a recurrent Q-network (``drqn``) learning n-step double-Q targets on sequences from prioritized replay.

    What it stores: ``Adder(kind='sequence')`` cuts each episode into learn windows of ``unroll_len`` steps; a sample
    holds ``burnin_step`` steps before its window (fewer at an episode's start: the sample's ``burnin`` b), the window,
    and ``nstep`` steps after it for the targets, plus ``prev_state``, the recurrent state the actor had before the
    sample's first step (stored state, not a zero start: R2D2's "stored state" strategy).

    How it learns on a batch of ``B`` samples (time-major inside, ``(T, B, ...)``):

    1. burn-in, without gradient: each sample's first ``b`` steps run from its ``prev_state`` in one call, a packed
       sequence of per-sample lengths (``DRQN``'s ``lengths``; b = 0 keeps ``prev_state``). So a sample's burn-in
       only refreshes its state: no loss and no gradient come from burn-in steps.
    2. the window steps ``[b, b + unroll_len + nstep)`` of each sample are gathered (a per-sample shift) and run with
       gradient from the burned-in state: online Q-values ``(unroll_len + nstep, B, A)``.
    3. the target network runs each sample from its ``prev_state`` over every step (its own burn-in, no gradient);
       its Q-values at the same window steps value the bootstrap actions, which the online net picks (double Q).
    4. loss: ``q_nstep_sequence_td_error`` over the ``unroll_len`` learn steps, in the rescaled value space
       ``h(x) = sign(x)(sqrt(|x| + 1) - 1) + eps x`` with ``value_rescale``; padding after an episode's end gives no
       loss; importance weights from PER weight each sequence.
    5. priority of each sequence: ``eta * max_t |td_t| + (1 - eta) * mean_t |td_t|`` over its real learn steps.

    Config keys (besides the off-policy contract keys ``learn.batch_size`` (sequences), ``learn.update_per_collect``,
    ``learn.learning_starts``, ``collect.n_sample``):
        discount_factor, nstep: the n-step target; a termination cuts it, a time limit bootstraps from the final
            observation.
        burnin_step, unroll_len: steps of burn-in before and learn steps in each sequence.
        priority, priority_eta: prioritized replay of sequences and the max/mean mix of their priority.
        value_rescale, value_rescale_eps: learn ``h(Q)`` instead of ``Q``, and the ``eps`` of ``h``.
        learn.double, learn.target_update_freq / target_theta, learn.learning_rate, adam_eps, grad_clip.
        command.eps: epsilon schedule over env steps; ``per_env`` gives env ``i`` of ``N`` the rate
            ``eps ** (1 + per_env_alpha * i / (N - 1))`` (Ape-X's spread of actors from exploring to greedy).
    """

    default_model_type = "drqn"
    config: Dict[str, Any] = dict(
        discount_factor=Field(0.997, gt=0, le=1),
        nstep=Field(5, ge=1),
        burnin_step=Field(2, ge=0),
        unroll_len=Field(8, ge=1),
        priority=True,
        priority_eta=Field(0.9, ge=0, le=1),
        value_rescale=True,
        value_rescale_eps=Field(1e-3, gt=0),
        learn=dict(
            learning_rate=Field(1e-3, gt=0),
            adam_eps=Field(1e-8, gt=0),  # R2D2's Atari setting is 1e-3 with a learning rate of 1e-4
            target_update_freq=Field(100, ge=1),
            target_theta=Field(0.0, ge=0, le=1),
            double=True,
            grad_clip=Field(0.0, ge=0),  # max gradient norm; 0 turns clipping off
        ),
        command=dict(eps=eps_schedule_config(per_env=False, per_env_alpha=Field(7.0, ge=0))),
    )

    @classmethod
    def _buffer_type(cls, cfg: Mapping[str, Any]) -> Optional[str]:
        return "prioritized" if cfg["priority"] else "uniform"

    @classmethod
    def compile_section(cls, cfg: Mapping[str, Any], source: Optional[str] = None) -> EasyDict:
        section = super().compile_section(cfg, source)
        where = f" in {os.path.basename(source)}" if source else ""
        if section.command.eps.per_env and section.command.eps.per_env_alpha == 0:
            raise ConfigError(
                f"key 'policy.command.eps.per_env_alpha'{where} is 0 with per_env true: every env would get the "
                "same rate; set per_env_alpha > 0 (Ape-X: 7) or per_env: false"
            )
        return section

    def _init_shared(self) -> None:
        if not callable(getattr(self._model, "initial_state", None)):
            raise ValueError(
                f"r2d2 needs a recurrent model with initial_state() and a sequence forward (policy.model_type: drqn); "
                f"got {type(self._model).__name__}"
            )

    # ---- learn -----------------------------------------------------------------------------------------------
    def _init_learn(self) -> None:
        learn = self._cfg.learn
        self._gamma = float(self._cfg.discount_factor)
        self._nstep = int(self._cfg.nstep)
        self._unroll_len = int(self._cfg.unroll_len)
        self._priority = bool(self._cfg.priority)
        self._eta = float(self._cfg.priority_eta)
        self._rescale = bool(self._cfg.value_rescale)
        self._rescale_eps = float(self._cfg.value_rescale_eps)
        self._double = bool(learn.double)
        clip = dict(grad_clip_type="clip_norm", clip_value=float(learn.grad_clip)) if learn.grad_clip > 0 else {}
        self._optimizer = Adam(self._model.parameters(), lr=learn.learning_rate, eps=learn.adam_eps, **clip)
        self._learn_agent = q_learn_agent(self._model, learn)

    def _window_index(self, steps: int, burnin: torch.Tensor) -> torch.Tensor:
        """``(unroll_len + nstep, B)``: the time steps ``b .. b + unroll_len + nstep - 1`` of each sample."""
        window = self._unroll_len + self._nstep
        reach = int(burnin.max()) + window
        if reach > steps:
            raise ValueError(
                f"r2d2: a sample has {steps} steps but burn-in {int(burnin.max())} + unroll_len {self._unroll_len} + "
                f"nstep {self._nstep} = {reach} are needed; samples must come from this policy's own adder "
                "(policy.burnin_step, unroll_len and nstep unchanged since they were stored)"
            )
        return burnin.unsqueeze(0) + torch.arange(window, device=burnin.device).unsqueeze(1)

    def _burn_in(self, obs: torch.Tensor, prev_state: Any, burnin: torch.Tensor) -> Any:
        """The state after each sample's own ``b`` burn-in steps, without gradient (``prev_state`` where b = 0)."""
        longest = int(burnin.max())
        if longest == 0:
            return prev_state
        with torch.no_grad():
            data = {"obs": obs[:longest], "prev_state": prev_state, "lengths": burnin}
            return self._learn_agent.forward(data, sequence=True)["next_state"]

    def _sequence_loss(self, data: Dict[str, Any]) -> Dict[str, torch.Tensor]:
        """Steps 1-4 of the class docstring: ``loss``, ``td_error`` and ``q`` ``(unroll_len, B)``, ``mask``."""
        agent = self._learn_agent
        obs = data["obs"].transpose(0, 1)  # (B, T, ...) from replay -> time-major (T, B, ...)
        burnin = data["burnin"].long().to(obs.device)
        index = self._window_index(obs.shape[0], burnin)
        start_state = self._burn_in(obs, data["prev_state"], burnin)
        q = agent.forward({"obs": take_steps(obs, index), "prev_state": start_state}, sequence=True)["logit"]
        with torch.no_grad():
            reach = int(index.max()) + 1
            target = agent.target_forward({"obs": obs[:reach], "prev_state": data["prev_state"]}, sequence=True)
            target_q = take_steps(target["logit"], index)
            target_action = (q if self._double else target_q).detach().argmax(dim=-1)
        steps = {k: take_steps(data[k].transpose(0, 1), index) for k in ("action", "reward", "terminated", "mask")}
        weight = data.get("weight") if self._priority else None
        td_data = q_nstep_sequence_td_data(
            q, target_q, steps["action"], target_action, steps["reward"], steps["terminated"], steps["mask"], weight
        )
        loss, td_error = q_nstep_sequence_td_error(
            td_data, self._gamma, self._nstep, value_rescale=self._rescale, eps=self._rescale_eps
        )
        learn = slice(0, self._unroll_len)
        q_taken = q[learn].detach().gather(2, steps["action"][learn].long().unsqueeze(-1)).squeeze(-1)
        return {"loss": loss, "td_error": td_error, "q": q_taken, "mask": steps["mask"][learn].float()}

    def _forward_learn(self, data: Dict[str, Any]) -> Dict[str, Any]:
        self._learn_agent.mode(train=True)
        out = self._sequence_loss(data)
        self._optimizer.zero_grad()
        out["loss"].backward()
        self._optimizer.step()
        self._learn_agent.target_update()
        mask = out["mask"]
        info = {
            "cur_lr": self._optimizer.param_groups[0]["lr"],
            "total_loss": out["loss"].item(),
            "q_value": ((out["q"] * mask).sum() / mask.sum().clamp(min=1)).item(),
        }
        if self._priority:
            info["priority"] = sequence_priority(out["td_error"], self._eta, mask).cpu().numpy()
        return info

    # ---- collect ---------------------------------------------------------------------------------------------
    def _init_collect(self) -> None:
        self._adder = Adder(
            self._use_cuda,
            unroll_len=int(self._cfg.unroll_len),
            kind="sequence",
            burnin=int(self._cfg.burnin_step),
            lookahead=int(self._cfg.nstep),
            first_only=("prev_state",),
        )
        self._per_env_alpha = float(self._cfg.command.eps.per_env_alpha) if self._cfg.command.eps.per_env else None
        self._collect_agent = acting_agent(
            self._model, "eps_greedy_sample", hidden_state=dict(init_fn=self._model.initial_state, save_prev_state=True)
        )

    def _env_eps(self, data_id: List[int], eps: float) -> Any:
        """``eps`` for every env, or Ape-X's per-env rates ``eps ** (1 + alpha * i / (N - 1))``."""
        if self._per_env_alpha is None:
            return eps
        num = max(self._collect_agent.plugin("main", "hidden_state").state_num, max(data_id) + 1, 2)
        return [eps ** (1.0 + self._per_env_alpha * i / (num - 1)) for i in data_id]

    def _forward_collect(self, data_id: List[int], data: Any, eps: float = 0.0) -> Output:
        self._collect_agent.mode(train=False)
        output = self._collect_agent.forward({"obs": data}, state_id=data_id, eps=self._env_eps(data_id, eps))
        return {"action": output["action"], "prev_state": output["prev_state"]}

    def _process_transition(self, obs: Any, agent_output: Output, timestep: Any) -> Dict[str, Any]:
        transition = standard_transition(obs, agent_output, timestep)
        transition["prev_state"] = agent_output["prev_state"]
        return transition

    def _reset_collect(self, data_id: Optional[List[int]] = None) -> None:
        self._collect_agent.reset(data_id)

    # ---- eval ------------------------------------------------------------------------------------------------
    def _init_eval(self) -> None:
        self._eval_agent = acting_agent(
            self._model, "argmax_sample", hidden_state=dict(init_fn=self._model.initial_state)
        )

    def _forward_eval(self, data_id: List[int], data: Any) -> Output:
        self._eval_agent.mode(train=False)
        return {"action": self._eval_agent.forward({"obs": data}, state_id=data_id)["action"]}

    def _reset_eval(self, data_id: Optional[List[int]] = None) -> None:
        self._eval_agent.reset(data_id)

    # ---- command ---------------------------------------------------------------------------------------------
    def _init_command(self) -> None:
        eps = self._cfg.command.eps
        self._eps_fn = epsilon_greedy(eps.start, eps.end, eps.decay, eps.type)

    def _get_setting_collect(self, command_info: Dict[str, Any]) -> Dict[str, Any]:
        return {"eps": self._eps_fn(command_info["env_step"])}


register_policy("r2d2", R2D2Policy)
