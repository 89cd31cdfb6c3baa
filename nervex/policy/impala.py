"""IMPALA (Espeholt et al. 2018), serial: an actor-critic learning from replayed sequences with V-trace corrections.

One gradient step, top to bottom (``_forward_learn``):

1. a batch of ``B`` sequences of ``T = U + 1`` steps (the sequence Adder's ``kind='sequence'``, ``burnin=0``,
   ``lookahead=1``) is made time-major; learn steps are ``[0, U)``, ``obs[U]`` is the bootstrap observation;
2. the model runs over all ``T`` steps (an LSTM from the ``prev_state`` the actor had at step 0): logits and values;
3. a time-limit truncation at step ``t`` becomes ``reward_t + gamma * V(obs_{t+1})`` with the episode cut there, so
   every ``done`` cuts the traces and padding after an episode's end never reaches a real step's target;
4. V-trace targets ``v_s`` and policy-gradient advantages from ``log pi - log mu`` (``mu``: the behaviour log-probs
   the actor stored), clipped at ``rho_clip`` (rho-bar), ``c_clip`` (c-bar) and ``rho_pg_clip``;
5. loss = policy + ``value_weight`` * value + ``entropy_weight`` * entropy (+ ``upgo_weight`` * UPGO), masked to real
   steps; one optimizer step with gradient-norm clipping;
6. every ``policy_lag`` steps the actor's copy of the weights is refreshed (see ``learn.policy_lag``).

Off-policy data come from two sources in serial mode: the replay buffer (a small FIFO of recent sequences, each
drawn at most ``replay_buffer.max_use`` times) and the policy lag.
"""

from __future__ import annotations

import copy
import dataclasses
from typing import Any, Dict, List, Mapping, NamedTuple, Optional

import torch

from nervex.agent import Agent
from nervex.agent.agent import set_train_mode
from nervex.config import Field
from nervex.rl_utils import Adder, upgo_loss, vtrace_advantages, vtrace_nstep_return
from nervex.rl_utils.td import weighted_mean
from nervex.rl_utils.vtrace import clipped_ratio
from nervex.torch_utils import Adam, clip_grad_norm

from .actor_critic import dist_from_output
from .base_policy import Output, register_policy
from .common_policy import CommonPolicy, standard_transition
from .contract import TrainingContract

ACTION_KEYS = ("logit", "mu", "sigma")


class SequenceInputs(NamedTuple):
    """What the targets and losses of one batch are computed from, time-major.

    Shapes:
        - target_logp, entropy, behaviour_logp, reward, done, mask: :math:`(U, B)`
        - value: :math:`(U + 1, B)`, with gradient; the last row is the bootstrap value ``V(obs[U])``
    """

    target_logp: torch.Tensor
    entropy: torch.Tensor
    value: torch.Tensor
    behaviour_logp: torch.Tensor
    reward: torch.Tensor  # with a truncation's bootstrap folded in
    done: torch.Tensor  # 0/1: every episode end (and all padding) cuts the traces
    mask: torch.Tensor  # 1 for real steps, 0 for padding


class Targets(NamedTuple):
    """V-trace value targets ``v_s``, policy-gradient advantages and the unclipped importance ratios, :math:`(U, B)`."""

    returns: torch.Tensor
    adv: torch.Tensor
    rho: torch.Tensor


class IMPALAPolicy(CommonPolicy):
    """IMPALA's learner and actor in one process, discrete or continuous actions, optional LSTM and UPGO.

    The model is ``ValueAC`` (``model.lstm_hidden_size`` makes it recurrent: it then acts with one state per env,
    stores the state each sequence starts from as ``prev_state``, and learns on whole sequences from it). Data are
    off-policy: the trainer stores each emitted sequence in a uniform ``ReplayBuffer`` (defaults here: a FIFO of
    ``maxlen`` 128 sequences, each drawn at most ``max_use`` 4 times) and samples ``learn.batch_size`` sequences
    per gradient step. With the defaults (8 envs, 160 env steps per collection: about 8 new sequences, one step of
    32) a sequence is drawn about 4 times within a few collections of being made, then evicted.

    Config keys besides the off-policy contract (``learn.batch_size`` sequences, ``learn.update_per_collect``,
    ``learn.learning_starts``, ``collect.n_sample`` env steps):
        discount_factor: gamma.
        collect.unroll_len: learn steps per sequence ``U`` (a sequence holds ``U + 1`` steps).
        learn.optimizer: ``adam`` or ``rmsprop`` (IMPALA's: alpha 0.99, eps ``learn.optimizer_eps``, 0.01 there).
        learn.learning_rate, learn.grad_clip (global gradient norm; 0: off).
        learn.value_weight, learn.entropy_weight: loss coefficients.
        learn.rho_clip, learn.c_clip, learn.rho_pg_clip: V-trace's rho-bar, c-bar and the policy gradient's clip
            (``.inf``: no clipping); learn.trace_lambda: lambda applied to c (1: the paper's V-trace).
        learn.upgo_weight: weight of an UPGO policy-gradient term (AlphaStar); 0 turns it off.
        learn.policy_lag: the actor's weights are copied from the learner's every ``policy_lag`` gradient steps,
            so between copies it acts with weights up to ``policy_lag - 1`` steps old (0 or 1: always current).
    """

    default_model_type = "value_ac"
    config: Dict[str, Any] = dict(
        discount_factor=Field(0.99, gt=0, le=1),
        learn=dict(
            batch_size=Field(32, ge=1),  # sequences per gradient step
            learning_starts=Field(0, ge=0),
            optimizer=Field("adam", choices=("adam", "rmsprop")),
            learning_rate=Field(5e-4, gt=0),
            optimizer_eps=Field(1e-5, gt=0),  # IMPALA's RMSprop used 0.01
            grad_clip=Field(40.0, ge=0),
            value_weight=Field(0.5, ge=0),
            entropy_weight=Field(0.01, ge=0),
            upgo_weight=Field(0.0, ge=0),
            rho_clip=Field(1.0, gt=0),
            c_clip=Field(1.0, gt=0),
            rho_pg_clip=Field(1.0, gt=0),
            trace_lambda=Field(1.0, ge=0, le=1),
            policy_lag=Field(0, ge=0),
        ),
        collect=dict(n_sample=Field(160, ge=1), unroll_len=Field(20, ge=1)),
    )
    # the replay_buffer section's defaults: a small FIFO of recent sequences, each used a bounded number of times
    buffer_defaults: Dict[str, Any] = dict(maxlen=128, max_use=4)

    _acting_model: torch.nn.Module  # the learner's model, or its lagged copy (learn.policy_lag > 1)
    _collect_agent: Agent
    _eval_agent: Agent
    _learn_iter: int = 0

    @classmethod
    def contract(cls, cfg: Mapping[str, Any]) -> TrainingContract:
        return dataclasses.replace(super().contract(cfg), buffer_defaults=dict(cls.buffer_defaults))

    def _init_shared(self) -> None:
        cfg = self._cfg
        self._gamma = float(cfg.discount_factor)
        self._continuous = cfg.model.get("action_space") == "continuous"
        # a recurrent model (ValueAC with lstm_hidden_size) takes {'obs', 'prev_state'} and has initial_state()
        self._recurrent = bool(getattr(self._model, "recurrent", False))
        lagged = int(cfg.learn.policy_lag) > 1 and {"learn", "collect"} <= set(self._enable_field)
        self._acting_model = copy.deepcopy(self._model).requires_grad_(False) if lagged else self._model

    def _model_input(self, obs: torch.Tensor, prev_state: Any = None) -> Any:
        return {"obs": obs, "prev_state": prev_state} if self._recurrent else obs

    # ---- learn -----------------------------------------------------------------------------------------------
    def _init_learn(self) -> None:
        learn = self._cfg.learn
        params = self._model.parameters()
        if learn.optimizer == "rmsprop":
            self._optimizer = torch.optim.RMSprop(params, lr=learn.learning_rate, alpha=0.99, eps=learn.optimizer_eps)
        else:
            self._optimizer = Adam(params, lr=learn.learning_rate, eps=learn.optimizer_eps)
        self._learn_agent = Agent(self._model)
        self._learn_agent.add_plugin("main", "grad", enable_grad=True)

    def _forward_learn(self, data: Dict[str, Any]) -> Dict[str, Any]:
        learn = self._cfg.learn
        set_train_mode(self._model, True)
        inputs = self._sequence_inputs(data)
        targets = self._targets(inputs)
        losses = self._losses(inputs, targets)
        total = losses["policy_loss"] + learn.value_weight * losses["value_loss"]
        total = total + learn.entropy_weight * losses["entropy_loss"] + learn.upgo_weight * losses.get("upgo_loss", 0)
        self._optimizer.zero_grad(set_to_none=True)
        total.backward()
        if learn.grad_clip > 0:
            clip_grad_norm(self._model.parameters(), learn.grad_clip)
        self._optimizer.step()
        self._refresh_acting_model()
        mask = inputs.mask
        with torch.no_grad():
            real = mask.sum().clamp(min=1)
            figures = {
                "total_loss": total,
                **losses,
                "rho_mean": (targets.rho * mask).sum() / real,
                "rho_clip_fraction": ((targets.rho > learn.rho_clip).to(mask.dtype) * mask).sum() / real,
                "value_target_mean": (targets.returns * mask).sum() / real,
            }
        # one host copy for every figure instead of an .item() each
        out: Dict[str, Any] = dict(zip(figures, torch.stack(list(figures.values())).tolist()))
        out["cur_lr"] = self._optimizer.param_groups[0]["lr"]
        return out

    def _losses(self, inputs: SequenceInputs, targets: Targets) -> Dict[str, torch.Tensor]:
        """Policy-gradient, value and entropy losses (and UPGO's when weighted), each ``mean(mask * x)`` over the
        ``(U, B)`` steps: ``vtrace_error``'s terms on the inputs of ``_sequence_inputs``."""
        learn, mask = self._cfg.learn, inputs.mask
        losses = {
            "policy_loss": -weighted_mean(targets.adv * inputs.target_logp, mask),
            "value_loss": weighted_mean((inputs.value[:-1] - targets.returns).square(), mask),
            "entropy_loss": -weighted_mean(inputs.entropy, mask),
        }
        if learn.upgo_weight > 0:
            losses["upgo_loss"] = upgo_loss(
                inputs.target_logp,
                inputs.behaviour_logp,
                inputs.reward,
                inputs.value,
                inputs.done,
                mask,
                self._gamma,
                learn.rho_clip,
            )
        return losses

    def _sequence_inputs(self, data: Mapping[str, Any]) -> SequenceInputs:
        """Run the model over a batch of sequences and line up what the targets need (see ``SequenceInputs``).

        Shapes:
            data: ``obs`` ``(B, T, *obs_shape)``; ``action`` ``(B, T)`` (or ``(B, T, D)``); ``logp``, ``reward``,
            ``terminated``, ``truncated``, ``done``, ``mask`` ``(B, T)``; ``prev_state`` leaves ``(B, layers, H)``.
        """
        obs = data["obs"].transpose(0, 1)  # time-major from here on
        unroll = obs.shape[0] - 1
        out = self._learn_agent.forward(self._model_input(obs, data.get("prev_state")), mode="compute_action_value")
        dist = dist_from_output({k: out[k][:unroll] for k in ACTION_KEYS if k in out})
        action = data["action"].transpose(0, 1)[:unroll]
        target_logp = dist.log_prob(action if self._continuous else action.long())
        entropy = dist.entropy()
        if self._cfg.learn.entropy_weight == 0:
            entropy = entropy.detach()

        def steps(key: str) -> torch.Tensor:
            return data[key].transpose(0, 1)[:unroll].to(target_logp.dtype)

        value = out["value"]
        mask = steps("mask")
        done = steps("done")
        # bootstrap a time-limit truncation into its reward and cut there: the next row may be padding
        truncated = steps("truncated") * (1.0 - steps("terminated")) * mask
        reward = steps("reward") + self._gamma * truncated * value[1:].detach()
        return SequenceInputs(
            target_logp=target_logp,
            entropy=entropy,
            value=value,
            behaviour_logp=steps("logp"),
            reward=reward,
            done=done,
            mask=mask,
        )

    def _targets(self, inputs: SequenceInputs) -> Targets:
        """V-trace targets and advantages (rl_utils' ``vtrace_nstep_return`` / ``vtrace_advantages``)."""
        learn = self._cfg.learn
        with torch.no_grad():
            log_rho = inputs.target_logp.detach() - inputs.behaviour_logp
            values = inputs.value.detach()
            gammas = self._gamma * (1.0 - inputs.done)
            rhos = clipped_ratio(log_rho, learn.rho_clip)
            cs = clipped_ratio(log_rho, learn.c_clip)
            returns = vtrace_nstep_return(rhos, cs, inputs.reward, values, gammas, learn.trace_lambda)
            pg_rhos = clipped_ratio(log_rho, learn.rho_pg_clip)
            adv = vtrace_advantages(pg_rhos, inputs.reward, returns, values, gammas)
        return Targets(returns, adv, log_rho.exp())

    def _refresh_acting_model(self) -> None:
        self._learn_iter += 1
        if self._acting_model is not self._model and self._learn_iter % int(self._cfg.learn.policy_lag) == 0:
            self._acting_model.load_state_dict(self._model.state_dict())

    # ---- collect ---------------------------------------------------------------------------------------------
    def _init_collect(self) -> None:
        first_only = ("prev_state",) if self._recurrent else ()
        self._adder = Adder(
            self._use_cuda,
            unroll_len=int(self._cfg.collect.unroll_len),
            kind="sequence",
            burnin=0,
            lookahead=1,
            first_only=first_only,
        )
        self._collect_agent = self._acting_agent(self._acting_model)

    def _acting_agent(self, model: torch.nn.Module, greedy: bool = False) -> Agent:
        agent = Agent(model)
        if self._recurrent:
            # one state per env id (the plugin grows with the ids it sees), reset at each episode's start
            agent.add_plugin("main", "hidden_state", init_fn=model.initial_state, save_prev_state=not greedy)
        if self._continuous:
            agent.add_plugin("main", "gaussian_sample", deterministic=greedy)
        else:
            agent.add_plugin("main", "argmax_sample" if greedy else "multinomial_sample")
        agent.add_plugin("main", "grad", enable_grad=False)
        return agent

    def _forward_collect(self, data_id: List[int], data: torch.Tensor) -> Output:
        """Sample actions with the acting weights: ``action``, its behaviour log-prob ``logp``, and with an LSTM the
        state each env had before acting, ``prev_state``."""
        set_train_mode(self._acting_model, False)
        kwargs = {"state_id": data_id} if self._recurrent else {}
        out = self._collect_agent.forward(self._model_input(data), mode="compute_action", **kwargs)
        output: Dict[str, Any] = {"action": out["action"], "logp": out["logp"]}
        if self._recurrent:
            output["prev_state"] = out["prev_state"]
        return output

    def _process_transition(self, obs: Any, agent_output: Output, timestep: Any) -> Dict[str, Any]:
        """The standard transition (``next_obs`` pads a sequence after its episode's end) plus ``logp`` and, with
        an LSTM, ``prev_state``."""
        transition = standard_transition(obs, agent_output, timestep)
        transition["logp"] = agent_output["logp"]
        if self._recurrent:
            transition["prev_state"] = agent_output["prev_state"]
        return transition

    def _reset_collect(self, data_id: Optional[List[int]] = None) -> None:
        if self._recurrent:
            self._collect_agent.reset(data_id)

    # ---- eval ------------------------------------------------------------------------------------------------
    def _init_eval(self) -> None:
        self._eval_agent = self._acting_agent(self._model, greedy=True)

    def _forward_eval(self, data_id: List[int], data: torch.Tensor) -> Output:
        set_train_mode(self._model, False)
        kwargs = {"state_id": data_id} if self._recurrent else {}
        return {"action": self._eval_agent.forward(self._model_input(data), mode="compute_action", **kwargs)["action"]}

    def _reset_eval(self, data_id: Optional[List[int]] = None) -> None:
        if self._recurrent:
            self._eval_agent.reset(data_id)

    # ---- state -----------------------------------------------------------------------------------------------
    def _state_dict_extra(self) -> Dict[str, Any]:
        if self._acting_model is self._model:
            return {}
        return {"acting_model": self._acting_model.state_dict(), "learn_iter": self._learn_iter}

    def _load_state_dict_extra(self, state: Mapping[str, Any]) -> None:
        if self._acting_model is not self._model:
            # a state without the lagged copy (an eval snapshot) starts the actor from the loaded weights
            self._acting_model.load_state_dict(state.get("acting_model", self._model.state_dict()))
            self._learn_iter = int(state.get("learn_iter", 0))


register_policy("impala", IMPALAPolicy)
