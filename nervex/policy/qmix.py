"""QMIX (Rashid et al. 2018): recurrent agent Q-networks mixed by a state-conditioned monotonic network, learned on
stored sequences with burn-in (the R2D2 layout) from the team reward."""

from __future__ import annotations

from typing import Any, Dict, List, Mapping, Optional

import numpy as np
import torch
import torch.nn.functional as F

from nervex.config import Field
from nervex.data.priority import sequence_priority
from nervex.rl_utils import Adder, bootstrap_agent_q, chosen_agent_q, epsilon_greedy, qmix_td_data, qmix_td_error
from nervex.torch_utils import Adam

from .base_policy import Output, register_policy
from .common_policy import CommonPolicy, acting_agent, eps_schedule_config, q_learn_agent, standard_transition
from .r2d2 import take_steps

TEAM_REWARDS = ("env", "sum", "mean")


def window_index(steps: int, burnin: torch.Tensor, window: int, who: str) -> torch.Tensor:
    """``(window, B)``: the time steps ``b .. b + window - 1`` of each sample (``b`` its own burn-in).

    Raises:
        ValueError: a sample is too short (it came from an adder with other ``burnin_step``/``unroll_len``/``nstep``).
    """
    reach = int(burnin.max()) + window
    if reach > steps:
        raise ValueError(
            f"{who}: a sample has {steps} steps but burn-in {int(burnin.max())} + unroll_len + nstep = {reach} are "
            "needed; samples must come from this policy's own adder (burnin_step, unroll_len, nstep unchanged)"
        )
    return burnin.unsqueeze(0) + torch.arange(window, device=burnin.device).unsqueeze(1)


def last_action_inputs(action: torch.Tensor, prev_action: torch.Tensor, action_dim: int) -> torch.Tensor:
    """Each step's last-action one-hot: ``prev_action`` (stored at the sample's first step) then the sample's own
    actions shifted by one step.

    Shapes:
        ``action`` ``(T, B, N)``, ``prev_action`` ``(B, N, A)`` -> ``(T, B, N, A)``.
    """
    onehot = F.one_hot(action.long(), action_dim).to(torch.float32)
    return torch.cat([prev_action.to(torch.float32).unsqueeze(0), onehot[:-1]], dim=0)


class LastActions:
    """Each env's agents' last actions as one-hots (zeros at an episode's start): the agents' extra input.

    The acting modes keep one per env, written after every forward and cleared when the env's episode restarts.
    """

    def __init__(self, agent_num: int, action_dim: int) -> None:
        self._zeros = torch.zeros(agent_num, action_dim)
        self._rows: Dict[int, torch.Tensor] = {}

    def get(self, ids: List[int], device: torch.device) -> torch.Tensor:
        """``(len(ids), N, A)``."""
        return torch.stack([self._rows.get(i, self._zeros) for i in ids]).to(device)

    def set(self, ids: List[int], action: torch.Tensor) -> None:
        onehot = F.one_hot(action.long().cpu(), self._zeros.shape[1]).to(torch.float32)
        for k, i in enumerate(ids):
            self._rows[i] = onehot[k]

    def reset(self, ids: Optional[List[int]] = None) -> None:
        if ids is None:
            self._rows.clear()
        for i in ids or ():
            self._rows.pop(int(i), None)


class QMIXPolicy(CommonPolicy):
    """QMIX: ``Q_tot(s, u) = mixer(Q_1(o_1, u_1), ..., Q_N(o_N, u_N); s)`` learned end to end from the team reward.

    Model: ``qmix`` (``nervex.model.QMix``): a shared ``AgentNet`` (GRU by default) for every agent's Q-values and a
    ``QMixer`` whose hypernetworks read the global state. ``model.last_action`` (default true, EPyMARL's
    ``obs_last_action``): each agent also sees the one-hot of its previous action.

    What it stores: ``Adder(kind='sequence')`` samples like R2D2's (``burnin_step`` + ``unroll_len`` learn steps +
    ``nstep`` lookahead, padded after an episode's end with the final observation) holding the dict observation
    (``obs``, ``global_state``, ``action_mask``, ``alive``), the joint action ``(N,)``, the per-agent reward ``(N,)``,
    the flags, ``prev_state`` (the agents' recurrent state before the sample's first step) and ``prev_action`` (their
    last-action one-hot there).

    How it learns on a batch of ``B`` sequences (time-major inside):

    1. burn-in without gradient: each sample's first ``b`` steps refresh its stored ``prev_state``.
    2. the window steps ``[b, b + unroll_len + nstep)`` run with gradient: per-agent Q-values ``(W, B, N, A)``; the
       online mixer turns the taken actions' Qs (0 for dead agents) and the global state into ``Q_tot``.
    3. the target agent net runs each sample from ``prev_state`` (its own burn-in); at each window step the online
       net picks every agent's best legal action under that step's action mask (double Q, ``learn.double``), the
       target net values it and the **target mixer** mixes those values with the step's state.
    4. the team reward (``team_reward``: sum or mean of the per-agent rewards, ``env``: as the env states) and the
       flags give n-step / TD(lambda) targets (``rl_utils.qmix_td_target``: a termination cuts, a time limit
       bootstraps from the final observation, padding gives no loss); the loss is their MSE to ``Q_tot``.
    5. Adam with the gradient norm clipped (``learn.grad_clip``, 10 as in PyMARL); the target network is copied
       every ``learn.target_update_freq`` gradient steps, or Polyak-averaged at ``learn.target_theta`` > 0.

    Acting: epsilon-greedy per agent among its legal actions (collect), greedy among legal actions (eval); the random
    warm-up draws legal actions in the actor. Warm-up transitions store the zero state and no last action.

    Config keys (besides the off-policy contract keys ``learn.batch_size`` (sequences), ``learn.update_per_collect``,
    ``learn.learning_starts``, ``collect.n_sample``):
        team_reward: ``env``, ``sum`` or ``mean``.
        discount_factor, nstep, td_lambda: the targets (``td_lambda`` 1 is the n-step return).
        burnin_step, unroll_len: steps of burn-in before and learn steps in each sequence.
        priority, priority_eta: prioritized replay of sequences and the max/mean mix of their priority.
        learn.double, learn.target_update_freq / target_theta, learn.learning_rate, adam_eps, grad_clip.
        command.eps: the epsilon schedule over env steps.
    """

    default_model_type = "qmix"
    config: Dict[str, Any] = dict(
        team_reward=Field("env", choices=TEAM_REWARDS),
        discount_factor=Field(0.99, gt=0, le=1),
        nstep=Field(1, ge=1),
        td_lambda=Field(1.0, ge=0, le=1),
        burnin_step=Field(0, ge=0),
        unroll_len=Field(10, ge=1),
        priority=False,
        priority_eta=Field(0.9, ge=0, le=1),
        learn=dict(
            batch_size=Field(32, ge=1),  # sequences (PyMARL: 32 episodes)
            learning_rate=Field(5e-4, gt=0),
            adam_eps=Field(1e-5, gt=0),
            target_update_freq=Field(200, ge=1),
            target_theta=Field(0.0, ge=0, le=1),
            double=True,
            grad_clip=Field(10.0, ge=0),  # max gradient norm; 0 turns clipping off
        ),
        command=dict(eps=eps_schedule_config()),
    )

    @classmethod
    def _buffer_type(cls, cfg: Mapping[str, Any]) -> Optional[str]:
        return "prioritized" if cfg["priority"] else "uniform"

    def _init_shared(self) -> None:
        model = self._model
        needed = ("agent_num", "action_dim", "last_action", "initial_state")
        if any(not hasattr(model, name) for name in needed):
            raise ValueError(
                f"{type(self).__name__} needs a QMix-like model (policy.model_type: qmix or vdn) with "
                f"{', '.join(needed)}; got {type(model).__name__}"
            )
        self._recurrent = model.initial_state() is not None

    # ---- learn -----------------------------------------------------------------------------------------------
    def _init_learn(self) -> None:
        cfg, learn = self._cfg, self._cfg.learn
        if cfg.team_reward == "env":
            raise ValueError(
                f"{type(self).__name__}: policy.team_reward is 'env' but no env resolved it; build the policy with "
                "nervex.entry.builder.make_policy (it reads the env's team_reward) or set 'sum' or 'mean'"
            )
        self._gamma, self._nstep, self._lambda = float(cfg.discount_factor), int(cfg.nstep), float(cfg.td_lambda)
        self._unroll_len, self._double = int(cfg.unroll_len), bool(learn.double)
        self._priority, self._eta = bool(cfg.priority), float(cfg.priority_eta)
        clip = dict(grad_clip_type="clip_norm", clip_value=float(learn.grad_clip)) if learn.grad_clip > 0 else {}
        self._optimizer = Adam(self._model.parameters(), lr=learn.learning_rate, eps=learn.adam_eps, **clip)
        self._learn_agent = q_learn_agent(self._model, learn)

    def _agent_inputs(self, data: Dict[str, Any], obs: Dict[str, torch.Tensor]) -> Dict[str, torch.Tensor]:
        """The agent net's time-major inputs: ``obs`` and, with ``model.last_action``, the last-action one-hots."""
        inputs = {"obs": obs["obs"]}
        if self._model.last_action:
            action = data["action"].transpose(0, 1)
            inputs["last_action"] = last_action_inputs(action, data["prev_action"], self._model.action_dim)
        return inputs

    def _burn_in(self, inputs: Dict[str, torch.Tensor], prev_state: Any, burnin: torch.Tensor) -> Any:
        """The state after each sample's own ``b`` burn-in steps, without gradient (``prev_state`` where b = 0)."""
        longest = int(burnin.max())
        if longest == 0 or prev_state is None:
            return prev_state
        state = prev_state
        with torch.no_grad():
            for t in range(longest):
                step = {k: v[t] for k, v in inputs.items()}
                new = self._learn_agent.forward({**step, "prev_state": state})["next_state"]
                state = {
                    k: torch.where((t < burnin).view(-1, *[1] * (v.dim() - 1)), new[k], v) for k, v in state.items()
                }
        return state

    def _team_reward(self, reward: torch.Tensor) -> torch.Tensor:
        """``(T, B, N)`` per-agent rewards -> ``(T, B)`` by ``team_reward``; a scalar reward ``(T, B)`` stays."""
        reward = reward.float()
        if reward.dim() == 2:
            return reward
        return reward.sum(-1) if self._cfg.team_reward == "sum" else reward.mean(-1)

    def _mix(self, agent_q: torch.Tensor, state: Optional[torch.Tensor], target: bool = False) -> torch.Tensor:
        forward = self._learn_agent.target_forward if target else self._learn_agent.forward
        return forward({"agent_q": agent_q, "global_state": state}, mode="mix")["q_tot"]

    def _sequence_loss(self, data: Dict[str, Any]) -> Dict[str, torch.Tensor]:
        """Steps 1-4 of the class docstring: ``loss``, ``td_error`` ``(unroll_len, B)``, ``q_tot``, ``mask``."""
        agent = self._learn_agent
        obs = {k: v.transpose(0, 1) for k, v in data["obs"].items()}  # (B, T, ...) from replay -> (T, B, ...)
        inputs = self._agent_inputs(data, obs)
        burnin = data["burnin"].long().to(obs["obs"].device)
        index = window_index(obs["obs"].shape[0], burnin, self._unroll_len + self._nstep, "qmix")
        prev_state = data.get("prev_state") if self._recurrent else None
        start_state = self._burn_in(inputs, prev_state, burnin)
        window = {k: take_steps(v, index) for k, v in inputs.items()}
        q = agent.forward({**window, "prev_state": start_state}, sequence=True)["logit"]  # (W, B, N, A)
        fields = {k: obs[k] for k in ("global_state", "action_mask", "alive") if k in obs}
        fields.update({k: data[k].transpose(0, 1) for k in ("action", "reward", "terminated", "mask")})
        steps = {k: take_steps(v, index) for k, v in fields.items()}
        alive, state = steps.get("alive"), steps.get("global_state")
        with torch.no_grad():
            reach = int(index.max()) + 1
            full = agent.target_forward(
                {**{k: v[:reach] for k, v in inputs.items()}, "prev_state": prev_state}, sequence=True
            )
            target_q = take_steps(full["logit"], index)
            online = q.detach() if self._double else None
            value, _ = bootstrap_agent_q(target_q, online, steps.get("action_mask"), alive)
            target_q_tot = self._mix(value, state, target=True)
        q_tot = self._mix(chosen_agent_q(q, steps["action"], alive), state)
        weight = data.get("weight") if self._priority else None
        td_data = qmix_td_data(
            q_tot, target_q_tot, self._team_reward(steps["reward"]), steps["terminated"], steps["mask"], weight
        )
        loss, td_error = qmix_td_error(td_data, self._gamma, self._nstep, self._lambda)
        learn = slice(0, self._unroll_len)
        return {"loss": loss, "td_error": td_error, "q_tot": q_tot[learn].detach(), "mask": steps["mask"][learn]}

    def _forward_learn(self, data: Dict[str, Any]) -> Dict[str, Any]:
        self._learn_agent.mode(train=True)
        out = self._sequence_loss(data)
        self._optimizer.zero_grad()
        out["loss"].backward()
        self._optimizer.step()
        self._learn_agent.target_update()
        mask = out["mask"].float()
        real = mask.sum().clamp(min=1)
        info = {
            "cur_lr": self._optimizer.param_groups[0]["lr"],
            "total_loss": out["loss"].item(),
            "q_value": ((out["q_tot"] * mask).sum() / real).item(),
            "td_error": (out["td_error"].sum() / real).item(),
        }
        if self._priority:
            info["priority"] = sequence_priority(out["td_error"], self._eta, mask).cpu().numpy()
        return info

    # ---- acting (collect and eval) ---------------------------------------------------------------------------
    def _acting_agent(self, sample: str) -> Any:
        hidden = dict(init_fn=self._model.initial_state, save_prev_state=True) if self._recurrent else None
        return acting_agent(self._model, sample, hidden_state=hidden)

    def _act(self, agent: Any, last: LastActions, data_id: List[int], data: Any, **kwargs: Any) -> Dict[str, Any]:
        """One acting step for the envs ``data_id``: the agents' inputs, their (masked) actions, the last actions."""
        agent.mode(train=False)
        obs = data["obs"]
        prev_action = last.get(data_id, obs.device)
        inputs = {"obs": obs, "action_mask": data.get("action_mask"), "last_action": prev_action}
        if self._recurrent:
            kwargs["state_id"] = data_id
        output = agent.forward(inputs, **kwargs)
        last.set(data_id, output["action"])
        output["prev_action"] = prev_action
        return output

    # ---- collect ---------------------------------------------------------------------------------------------
    def _init_collect(self) -> None:
        self._adder = Adder(
            self._use_cuda,
            unroll_len=int(self._cfg.unroll_len),
            kind="sequence",
            burnin=int(self._cfg.burnin_step),
            lookahead=int(self._cfg.nstep),
            first_only=("prev_state", "prev_action"),
        )
        self._collect_agent = self._acting_agent("eps_greedy_sample")
        self._collect_last = LastActions(self._model.agent_num, self._model.action_dim)

    def _forward_collect(self, data_id: List[int], data: Any, eps: float = 0.0) -> Output:
        output = self._act(self._collect_agent, self._collect_last, data_id, data, eps=eps)
        keep = ("action", "prev_action") + (("prev_state",) if self._recurrent else ())
        return {k: output[k] for k in keep}

    def _process_transition(self, obs: Any, agent_output: Output, timestep: Any) -> Dict[str, Any]:
        transition = standard_transition(obs, agent_output, timestep)
        # a random warm-up step comes with the action only: the zero state and no last action
        zeros = np.zeros((self._model.agent_num, self._model.action_dim), dtype=np.float32)
        transition["prev_action"] = agent_output.get("prev_action", zeros)
        if self._recurrent:
            state = agent_output.get("prev_state")
            if state is None:
                state = {k: v.cpu().numpy() for k, v in self._model.initial_state().items()}
            transition["prev_state"] = state
        return transition

    def _reset_collect(self, data_id: Optional[List[int]] = None) -> None:
        self._collect_agent.reset(data_id)
        self._collect_last.reset(data_id)

    # ---- eval ------------------------------------------------------------------------------------------------
    def _init_eval(self) -> None:
        self._eval_agent = self._acting_agent("argmax_sample")
        self._eval_last = LastActions(self._model.agent_num, self._model.action_dim)

    def _forward_eval(self, data_id: List[int], data: Any) -> Output:
        return {"action": self._act(self._eval_agent, self._eval_last, data_id, data)["action"]}

    def _reset_eval(self, data_id: Optional[List[int]] = None) -> None:
        self._eval_agent.reset(data_id)
        self._eval_last.reset(data_id)

    # ---- command ---------------------------------------------------------------------------------------------
    def _init_command(self) -> None:
        eps = self._cfg.command.eps
        self._eps_fn = epsilon_greedy(eps.start, eps.end, eps.decay, eps.type)

    def _get_setting_collect(self, command_info: Dict[str, Any]) -> Dict[str, Any]:
        return {"eps": self._eps_fn(command_info["env_step"])}


register_policy("qmix", QMIXPolicy)
