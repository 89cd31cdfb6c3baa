"""SAC (Haarnoja et al. 2018): a squashed-Gaussian actor, twin critics and an entropy temperature tuned toward a
target entropy."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Dict, List, Mapping, Optional

import torch

from nervex.config import Field, merge_defaults
from nervex.rl_utils import Adder, sac_actor_loss, sac_alpha_loss, sac_critic_target
from nervex.torch_utils import TanhGaussianDist, squash_bounds
from nervex.torch_utils.distribution import SquashBounds

from .base_policy import Output, register_policy
from .common_policy import CommonPolicy
from .off_policy_ac import (
    AC_CONFIG,
    ActorCriticLearn,
    actor_critic_learn,
    actor_output,
    build_qac,
    check_critic_num,
    critic_step,
    critic_values,
    host_figures,
    inference_agent,
    make_adam,
    minimize,
    nstep_terms,
)
from .update_steps import update_step


class SACPolicy(CommonPolicy):
    """Soft actor-critic with Stable-Baselines3's defaults (lr 3e-4, tau 0.005, gamma 0.99, batch 256, 100 random
    warm-up steps, one gradient step per env step, ``ent_coef='auto'`` starting at 1, target entropy ``-|A|``).

    Config keys (besides the off-policy contract keys and ``discount_factor``, ``nstep``, ``priority``,
    ``learn.learning_rate``, ``learn.target_theta``, ``learn.grad_clip`` as for DDPG):
        learn.auto_alpha: tune the temperature by gradient descent on ``sac_alpha_loss`` with its own Adam optimizer
            (on ``log_alpha``); false keeps it fixed at ``learn.alpha``.
        learn.alpha: the initial (or fixed) temperature.
        learn.target_entropy: the entropy the temperature steers toward; null: ``-action_dim``.
        collect.noise: where collect's standard-normal draws ``eps`` in ``squash(mu + sigma * eps)`` come from:
            ``type`` white (i.i.d., the default), ar1 (``rho``: lag-1 autocorrelation) or pink (``beta``: spectral
            exponent, ``seq_len``: steps per generated sequence); one process per env, restarted at its episode's
            end (see ``nervex.agent.colored_noise``). Each draw is still N(0, 1), so the policy's distribution is
            unchanged; correlated draws explore sparse-reward tasks that need sustained pushes (MountainCar).

    Actions are sampled from the actor's tanh-squashed Gaussian in the env's bounds when collecting (with the
    reparameterization trick when learning) and are its squashed mean when evaluating. The model is ``qac`` with
    ``actor_type: squashed_gaussian`` and two critics; the target copy (Polyak, every step) is only read for its
    critics. The n-step target adds the entropy bonus of the bootstrap state only.
    """

    default_model_type = "qac"
    model_defaults: Dict[str, Any] = dict(actor_type="squashed_gaussian", critic_num=2)
    config: Dict[str, Any] = merge_defaults(
        AC_CONFIG,
        dict(
            learn=dict(
                learning_rate=3e-4,
                auto_alpha=True,
                alpha=Field(1.0, gt=0),
                target_entropy=Field(None, kind="number"),
            ),
            # the standard-normal draws of collect's samples: white (i.i.d.), or temporally correlated per env
            collect=dict(
                noise=dict(
                    type=Field("white", choices=("white", "ar1", "pink")),
                    rho=Field(0.9, ge=0, lt=1),  # ar1 only
                    beta=Field(1.0, ge=0, le=4),  # pink only
                    seq_len=Field(1000, ge=2),  # pink only
                )
            ),
        ),
    )

    @classmethod
    def _buffer_type(cls, cfg: Mapping[str, Any]) -> Optional[str]:
        return "prioritized" if cfg["priority"] else "uniform"

    def _create_model_from_cfg(self, cfg: Mapping[str, Any], model_type: Optional[type] = None) -> torch.nn.Module:
        model = build_qac(model_type or self.model_class(cfg), cfg.get("model", {}), self.model_defaults, "sac")
        check_critic_num(model, "sac", 1)
        return model

    # ---- learn -----------------------------------------------------------------------------------------------
    def _init_learn(self) -> None:
        learn, model = self._cfg.learn, self._model
        self._gamma = float(self._cfg.discount_factor)
        self._nstep = int(self._cfg.nstep)
        self._priority = bool(self._cfg.priority)
        self._auto_alpha = bool(learn.auto_alpha)
        self._ac = actor_critic_learn(model, self._cfg)
        # the learn state (checkpoint keys 'actor_optimizer', 'critic_optimizer', 'alpha_optimizer', 'learn_agent')
        self._actor_optimizer, self._critic_optimizer = self._ac.actor_optimizer, self._ac.critic_optimizer
        self._learn_agent = self._ac.agent
        self._log_alpha = torch.full((), math.log(learn.alpha), device=self._device, requires_grad=self._auto_alpha)
        if self._auto_alpha:
            self._alpha_optimizer = make_adam([self._log_alpha], learn.learning_rate, 0.0)
            target_entropy = -float(model.action_dim) if learn.target_entropy is None else float(learn.target_entropy)
            self._temperature = Temperature(
                self._log_alpha, self._alpha_optimizer, target_entropy, self._ac.use_equivalents
            )
        self._bounds = squash_bounds(model.action_low, model.action_high, model.action_dim, device=self._device)

    def _forward_learn(self, data: Dict[str, Any]) -> Dict[str, Any]:
        ac, bounds = self._ac, self._bounds
        obs, action, next_obs = data["obs"], data["action"], data["next_obs"]
        reward, terminated, value_gamma = nstep_terms(data)
        weight = data.get("weight") if self._priority else None
        alpha = self._log_alpha.detach().exp()  # every loss of this update reads the temperature from before its step
        # a fresh reparameterized action a ~ pi(.|s) of the current policy: the actor's and the temperature's losses
        sample = policy_sample(ac, obs, bounds)
        # critic target: y = sum_k gamma^k r_k + gamma^n (1 - terminated) (min_i Q'_i(s', a') - alpha log pi(a'|s'))
        # with a' ~ pi(.|s') and the target critics
        with torch.no_grad():
            next_dist = squashed_gaussian(actor_output(ac, "main", next_obs), bounds)
            next_action, next_log_prob = next_dist.rsample_with_log_prob()
            target_q = critic_values(ac, "target", next_obs, next_action)
            target = sac_critic_target(
                target_q, next_log_prob, alpha, reward, terminated, self._gamma, self._nstep, value_gamma
            )
        # critic loss: every Q_i(s, a) regressed on y
        loss_critic, td_error, q = critic_step(ac, obs, action, target, weight)
        # actor loss: alpha log pi(a|s) - min_i Q_i(s, a), through the reparameterized a and the updated critics
        loss_actor = sac_actor_step(ac, obs, sample, alpha, weight)
        figures = dict(alpha=alpha, entropy=-sample.log_prob.detach().mean())
        # temperature loss: log_alpha (-log pi(a|s) - target_entropy)
        if self._auto_alpha:
            figures["alpha_loss"] = temperature_step(self._temperature, sample.log_prob)
        # target update: Polyak averaging of the critics (and of the actor, whose copy is not read)
        ac.agent.target_update()
        info: Dict[str, Any] = host_figures(**figures, critic_loss=loss_critic, actor_loss=loss_actor, q_value=q.mean())
        info.update(
            cur_lr=ac.critic_optimizer.param_groups[0]["lr"], total_loss=info["critic_loss"] + info["actor_loss"]
        )
        if self._priority:
            info["priority"] = td_error.cpu().numpy()
        return info

    def _state_dict_learn(self) -> Dict[str, Any]:
        return {**super()._state_dict_learn(), "log_alpha": self._log_alpha.detach().clone()}

    def _load_state_dict_learn(self, state: Mapping[str, Any]) -> None:
        super()._load_state_dict_learn(state)
        if "log_alpha" in state:
            with torch.no_grad():
                self._log_alpha.copy_(torch.as_tensor(state["log_alpha"]))

    # ---- collect ---------------------------------------------------------------------------------------------
    def _init_collect(self) -> None:
        self._gamma = float(self._cfg.discount_factor)
        self._nstep = int(self._cfg.nstep)
        self._adder = Adder(self._use_cuda, kind="nstep", nstep=self._nstep, gamma=self._gamma)
        bounds = dict(low=self._model.action_low, high=self._model.action_high)
        noise = dict(self._cfg.collect.noise)
        self._collect_agent = inference_agent(
            self._model, "colored_gaussian_sample", noise=noise.pop("type"), **noise, **bounds
        )

    def _forward_collect(self, data_id: List[int], data: Any) -> Output:
        self._collect_agent.mode(train=False)
        output = self._collect_agent.forward(data, mode="compute_actor", state_id=data_id)
        return {"action": output["action"]}

    def _reset_collect(self, data_id: Optional[List[int]] = None) -> None:
        self._collect_agent.reset(data_id)

    # ---- eval ------------------------------------------------------------------------------------------------
    def _init_eval(self) -> None:
        bounds = dict(low=self._model.action_low, high=self._model.action_high)
        self._eval_agent = inference_agent(self._model, "gaussian_sample", squash=True, deterministic=True, **bounds)

    def _forward_eval(self, data_id: List[int], data: Any) -> Output:
        self._eval_agent.mode(train=False)
        return {"action": self._eval_agent.forward(data, mode="compute_actor")["action"]}


# ---- SAC's update steps (nervex/policy/update_steps.py; shared ones in off_policy_ac.py) ---------------------------
def squashed_gaussian(output: Mapping[str, torch.Tensor], bounds: SquashBounds) -> TanhGaussianDist:
    """The policy's distribution from the actor's ``{'mu', 'sigma', 'log_sigma'}``, squashed into ``bounds``."""
    return TanhGaussianDist(
        output["mu"], output["sigma"], bounds, validate_args=False, log_sigma=output.get("log_sigma")
    )


@dataclass
class PolicySample:
    """A reparameterized action of the current policy and its log-probability (tanh correction included), both with
    a graph back to the actor's parameters.

    Shapes:
        - action: :math:`(B, A)`; log_prob: :math:`(B,)`
    """

    action: torch.Tensor
    log_prob: torch.Tensor


@dataclass
class Temperature:
    """What the temperature's step works on: ``log_alpha`` (0-dim, trained), its optimizer, the target entropy and
    ``policy.learn.fused_update`` (see ``update_steps``)."""

    log_alpha: torch.Tensor
    optimizer: torch.optim.Optimizer
    target_entropy: float
    use_equivalents: bool


@update_step
def policy_sample(ac: ActorCriticLearn, obs: torch.Tensor, bounds: SquashBounds) -> PolicySample:
    """``a ~ pi(.|s)`` by the reparameterization trick, and ``log pi(a|s)``."""
    action, log_prob = squashed_gaussian(ac.agent.forward(obs, mode="compute_actor"), bounds).rsample_with_log_prob()
    return PolicySample(action, log_prob)


@update_step
def sac_actor_step(
    ac: ActorCriticLearn, obs: torch.Tensor, sample: PolicySample, alpha: torch.Tensor, weight: Optional[torch.Tensor]
) -> torch.Tensor:
    """Actor loss: ``mean_b w_b [alpha log pi(a_b|s_b) - min_i Q_i(s_b, a_b)]`` with the sample's reparameterized
    ``a`` (drawn once, before the critic step), one step of the actor's optimizer; the critics' weights get no
    gradient.

    Raises:
        ValueError: the sample has no graph to the actor (one drawn by another implementation of ``policy_sample``).
    """
    if not sample.log_prob.requires_grad:
        raise ValueError(
            "sac_actor_step: the sample's log_prob has no graph; draw it with policy_sample in this update"
        )
    q = ac.agent.forward({"obs": obs, "action": sample.action}, mode="compute_critic", param_grad=False)["q"]
    loss = sac_actor_loss(q, sample.log_prob, alpha, weight)
    minimize(ac.actor_optimizer, loss, ac.actor_params)
    return loss.detach()


@update_step
def temperature_step(temperature: Temperature, log_prob: torch.Tensor) -> torch.Tensor:
    """Temperature loss: ``mean_b log_alpha (-log pi(a_b|s_b) - target_entropy)`` (``sac_alpha_loss``), one step of
    its optimizer: alpha rises while the policy's entropy is below the target, and falls above it."""
    loss = sac_alpha_loss(temperature.log_alpha, log_prob, temperature.target_entropy)
    minimize(temperature.optimizer, loss)
    return loss.detach()


register_policy("sac", SACPolicy)
