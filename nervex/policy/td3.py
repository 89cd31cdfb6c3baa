"""TD3 (Fujimoto et al. 2018): DDPG with twin critics, target policy smoothing and delayed actor updates."""

from __future__ import annotations

from typing import Any, Dict, List, Mapping, Optional

import torch

from nervex.config import Field, merge_defaults
from nervex.rl_utils import target_policy_smoothing, td3_critic_target

from .base_policy import Output, register_policy
from .common_policy import CommonPolicy
from .ddpg import deterministic_actor_step
from .off_policy_ac import (
    AC_CONFIG,
    NOISE_CONFIG,
    DeterministicActing,
    actor_critic_learn,
    actor_output,
    build_qac,
    check_critic_num,
    critic_step,
    critic_values,
    host_figures,
    nstep_terms,
)


class TD3Policy(CommonPolicy):
    """Twin delayed DDPG with Stable-Baselines3's defaults (lr 1e-3, tau 0.005, gamma 0.99, batch 256, policy delay
    2, target policy noise 0.2 clipped at 0.5, 100 random warm-up steps, one gradient step per env step).

    Config keys: DDPG's (see ``DDPGPolicy``), and
        learn.actor_update_freq: update the actor, and move the targets (actor and critics) by Polyak averaging,
            once every this many critic steps (the policy delay ``d``).
        learn.target_policy_noise, learn.noise_clip: the target action is
            ``clip(mu'(s') + clip(sigma * N(0, 1), -c, c), low, high)``, both given in the ``[-1, 1]`` action space
            (scaled by ``(high - low) / 2`` per dimension).

    The model is ``qac`` with ``actor_type: deterministic`` and two critics; the target is the minimum over critics
    and the actor climbs the first critic.
    """

    default_model_type = "qac"
    model_defaults: Dict[str, Any] = dict(actor_type="deterministic", critic_num=2)
    config: Dict[str, Any] = merge_defaults(
        AC_CONFIG,
        dict(
            learn=dict(
                actor_update_freq=Field(2, ge=1),
                target_policy_noise=Field(0.2, ge=0),
                noise_clip=Field(0.5, ge=0),
            ),
            collect=dict(noise=NOISE_CONFIG),
        ),
    )

    @classmethod
    def _buffer_type(cls, cfg: Mapping[str, Any]) -> Optional[str]:
        return "prioritized" if cfg["priority"] else "uniform"

    def _create_model_from_cfg(self, cfg: Mapping[str, Any], model_type: Optional[type] = None) -> torch.nn.Module:
        model = build_qac(model_type or self.model_class(cfg), cfg.get("model", {}), self.model_defaults, "td3")
        check_critic_num(model, "td3", 2)
        return model

    # ---- learn -----------------------------------------------------------------------------------------------
    def _init_learn(self) -> None:
        learn = self._cfg.learn
        self._gamma = float(self._cfg.discount_factor)
        self._nstep = int(self._cfg.nstep)
        self._priority = bool(self._cfg.priority)
        self._actor_update_freq = int(learn.actor_update_freq)
        scale = self._model.action_scale
        self._smoothing_sigma = float(learn.target_policy_noise) * scale
        self._smoothing_clip = float(learn.noise_clip) * scale
        self._ac = actor_critic_learn(self._model, self._cfg)
        # the learn state (checkpoint keys 'actor_optimizer', 'critic_optimizer', 'learn_agent')
        self._actor_optimizer, self._critic_optimizer = self._ac.actor_optimizer, self._ac.critic_optimizer
        self._learn_agent = self._ac.agent
        self._critic_steps = 0

    def _forward_learn(self, data: Dict[str, Any]) -> Dict[str, Any]:
        ac, model = self._ac, self._model
        obs, action, next_obs = data["obs"], data["action"], data["next_obs"]
        reward, terminated, value_gamma = nstep_terms(data)
        weight = data.get("weight") if self._priority else None
        # critic target: y = sum_k gamma^k r_k + gamma^n (1 - terminated) min_i Q'_i(s', a') at the smoothed target
        # action a' = clip(mu'(s') + clip(noise, -c, c), low, high)
        with torch.no_grad():
            next_action = actor_output(ac, "target", next_obs)["action"]
            noise = torch.randn_like(next_action) * self._smoothing_sigma
            next_action = target_policy_smoothing(
                next_action, noise, self._smoothing_clip, model.action_low, model.action_high
            )
            target_q = critic_values(ac, "target", next_obs, next_action)
            target = td3_critic_target(target_q, reward, terminated, self._gamma, self._nstep, value_gamma)
        # critic loss: every Q_i(s, a) regressed on y
        loss_critic, td_error, q = critic_step(ac, obs, action, target, weight)
        self._critic_steps += 1
        figures = dict(critic_loss=loss_critic, q_value=q.mean())
        # delayed: the actor loss (-Q_1(s, mu(s)), DDPG's: the second critic is not run) and the target update
        # (Polyak averaging) once every actor_update_freq critic steps
        if self._critic_steps % self._actor_update_freq == 0:
            figures["actor_loss"] = deterministic_actor_step(ac, obs, weight)
            ac.agent.target_update()
        info: Dict[str, Any] = host_figures(**figures)
        info.update(
            cur_lr=ac.critic_optimizer.param_groups[0]["lr"],
            total_loss=info["critic_loss"] + info.get("actor_loss", 0.0),
        )
        if self._priority:
            info["priority"] = td_error.cpu().numpy()
        return info

    def _state_dict_learn(self) -> Dict[str, Any]:
        return {**super()._state_dict_learn(), "critic_steps": self._critic_steps}

    def _load_state_dict_learn(self, state: Mapping[str, Any]) -> None:
        super()._load_state_dict_learn(state)
        self._critic_steps = int(state.get("critic_steps", 0))

    # ---- collect and eval (shared with DDPG through DeterministicActing) -----------------------------------------
    def _init_shared(self) -> None:
        self._acting = DeterministicActing(self._model, self._cfg, self._use_cuda)

    def _init_collect(self) -> None:
        self._adder = self._acting.adder

    def _forward_collect(self, data_id: List[int], data: Any) -> Output:
        return self._acting.collect(data_id, data)

    def _reset_collect(self, data_id: Optional[List[int]] = None) -> None:
        self._acting.reset(data_id)

    def _init_eval(self) -> None:
        pass  # the eval agent is part of self._acting

    def _forward_eval(self, data_id: List[int], data: Any) -> Output:
        return self._acting.evaluate(data)


register_policy("td3", TD3Policy)
