"""SAC (Haarnoja et al. 2018): a squashed-Gaussian actor, twin critics and an entropy temperature tuned toward a
target entropy."""

from __future__ import annotations

import math
from typing import Any, Dict, List, Mapping, Optional

import torch

from nervex.config import Field, merge_defaults
from nervex.rl_utils import Adder, sac_alpha_loss, sac_critic_target
from nervex.torch_utils import TanhGaussianDist, squash_bounds, trained_tensors

from .base_policy import Output, register_policy
from .common_policy import CommonPolicy
from .fused_ac import critic_update, fused_update_ok, qac_forward, sac_actor_update, sac_sample
from .off_policy_ac import (
    AC_CONFIG,
    actor_critic_optimizers,
    build_qac,
    check_critic_num,
    host_figures,
    inference_agent,
    make_adam,
    nstep_terms,
    polyak_agent,
)


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

    def _dist(self, output: Mapping[str, torch.Tensor]) -> TanhGaussianDist:
        return TanhGaussianDist(
            output["mu"], output["sigma"], self._bounds, validate_args=False, log_sigma=output.get("log_sigma")
        )

    # ---- learn -----------------------------------------------------------------------------------------------
    def _init_learn(self) -> None:
        learn = self._cfg.learn
        self._gamma = float(self._cfg.discount_factor)
        self._nstep = int(self._cfg.nstep)
        self._priority = bool(self._cfg.priority)
        self._auto_alpha = bool(learn.auto_alpha)
        target_entropy = learn.target_entropy
        self._target_entropy = -float(self._model.action_dim) if target_entropy is None else float(target_entropy)
        self._log_alpha = torch.full((), math.log(learn.alpha), device=self._device, requires_grad=self._auto_alpha)
        if self._auto_alpha:
            self._alpha_optimizer = make_adam([self._log_alpha], learn.learning_rate, 0.0)
        self._actor_params, self._actor_optimizer, self._critic_optimizer = actor_critic_optimizers(self._model, learn)
        self._learn_agent = polyak_agent(self._model, learn.target_theta)
        self._fused_update = bool(learn.fused_update)
        alpha_optimizer = [self._alpha_optimizer] if self._auto_alpha else []
        self._trained = trained_tensors(self._actor_optimizer, self._critic_optimizer, *alpha_optimizer)
        model = self._model
        self._bounds = squash_bounds(model.action_low, model.action_high, model.action_dim, device=self._device)

    def _forward_learn(self, data: Dict[str, Any]) -> Dict[str, Any]:
        agent, model = self._learn_agent, self._model
        reward, terminated, value_gamma = nstep_terms(data)
        weight = data.get("weight") if self._priority else None
        obs, next_obs = data["obs"], data["next_obs"]
        fused = self._fused_update and fused_update_ok(model, self._trained)
        # a fresh reparameterized action of the current policy: for the temperature's and the actor's losses
        sample = sac_sample(agent, model, self._dist, obs, fused)
        alpha = self._log_alpha.detach().exp()  # this step's losses use the temperature from before its update
        figures = dict(alpha=alpha, entropy=-sample.log_prob.detach().mean())
        # critics: regress every Q(s, a) on the soft value of a' ~ pi(.|s') under the smaller target critic
        with torch.no_grad():
            next_dist = self._dist(qac_forward(agent, "main", next_obs, "compute_actor", fused))
            next_action, next_log_prob = next_dist.rsample_with_log_prob()
            pair = {"obs": next_obs, "action": next_action}
            target_q = qac_forward(agent, "target", pair, "compute_critic", fused)["q"]
            target = sac_critic_target(
                target_q, next_log_prob, alpha, reward, terminated, self._gamma, self._nstep, value_gamma
            )
        loss_critic, td_error, q = critic_update(
            agent, model, self._critic_optimizer, obs, data["action"], target, weight, fused, self._priority
        )
        # actor: maximize min_i Q_i(s, a) + alpha * entropy through the reparameterized action (updated critics)
        loss_actor = sac_actor_update(
            agent, model, self._actor_optimizer, self._actor_params, sample, obs, alpha, weight, fused
        )
        if self._auto_alpha:
            # the temperature's step comes after the actor's, which changes nothing: this update's losses read the
            # temperature from before it
            log_prob = sample.log_prob.detach()
            if fused:  # sac_alpha_loss's gradient in log_alpha: -mean(log_prob + target_entropy)
                loss_alpha = sac_alpha_loss(self._log_alpha.detach(), log_prob, self._target_entropy)
                self._log_alpha.grad = (log_prob + self._target_entropy).mean().neg_()
            else:  # through autograd, so gradient hooks (multi-learner all-reduce) see it
                loss_alpha = sac_alpha_loss(self._log_alpha, log_prob, self._target_entropy)
                self._alpha_optimizer.zero_grad()
                loss_alpha.backward()
            self._alpha_optimizer.step()
            figures["alpha_loss"] = loss_alpha.detach()
        agent.target_update()
        info: Dict[str, Any] = host_figures(**figures, critic_loss=loss_critic, actor_loss=loss_actor, q_value=q.mean())
        info.update(
            cur_lr=self._critic_optimizer.param_groups[0]["lr"], total_loss=info["critic_loss"] + info["actor_loss"]
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


register_policy("sac", SACPolicy)
