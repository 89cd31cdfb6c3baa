"""DDPG (Lillicrap et al. 2016): a deterministic actor, one critic, Polyak-averaged targets, action noise."""

from __future__ import annotations

from typing import Any, Dict, List, Mapping, Optional

import torch

from nervex.config import merge_defaults
from nervex.rl_utils import ddpg_critic_target, deterministic_actor_loss

from .base_policy import Output, register_policy
from .common_policy import CommonPolicy
from .off_policy_ac import (
    AC_CONFIG,
    NOISE_CONFIG,
    ActorCriticLearn,
    DeterministicActing,
    actor_critic_learn,
    actor_output,
    build_qac,
    check_critic_num,
    critic_step,
    critic_values,
    host_figures,
    minimize,
    nstep_terms,
)
from .update_steps import update_step


class DDPGPolicy(CommonPolicy):
    """Deep deterministic policy gradient, with Stable-Baselines3's defaults (lr 1e-3, tau 0.005, gamma 0.99,
    batch 256, 100 random warm-up steps, one gradient step per env step).

    Config keys (besides the off-policy contract keys):
        discount_factor, nstep: the n-step target ``sum_k gamma^k r_k + gamma^n Q'(s_n, mu'(s_n))``; a window cut
            by a time limit bootstraps (only ``terminated`` stops it).
        priority: prioritized replay (per-sample |TD| as priorities, importance-weighted losses).
        learn.learning_rate: of the actor's and the critic's Adam optimizers.
        learn.target_theta: Polyak rate of the target actor and critic, updated after every gradient step.
        learn.grad_clip: max gradient norm per optimizer (0: off).
        collect.noise: exploration noise in the ``[-1, 1]`` action space: ``type`` gaussian (``sigma``) or ou
            (``sigma``, ``theta``, ``dt``; one process per env, reset at its episode's end).

    The model is ``qac`` with ``actor_type: deterministic`` and ``critic_num: 1``; its action bounds come from the
    env. Eval actions are the actor's, without noise.
    """

    default_model_type = "qac"
    model_defaults: Dict[str, Any] = dict(actor_type="deterministic", critic_num=1)
    config: Dict[str, Any] = merge_defaults(AC_CONFIG, dict(collect=dict(noise=NOISE_CONFIG)))

    @classmethod
    def _buffer_type(cls, cfg: Mapping[str, Any]) -> Optional[str]:
        return "prioritized" if cfg["priority"] else "uniform"

    def _create_model_from_cfg(self, cfg: Mapping[str, Any], model_type: Optional[type] = None) -> torch.nn.Module:
        model = build_qac(model_type or self.model_class(cfg), cfg.get("model", {}), self.model_defaults, "ddpg")
        check_critic_num(model, "ddpg", 1, 1)
        return model

    # ---- learn -----------------------------------------------------------------------------------------------
    def _init_learn(self) -> None:
        self._gamma = float(self._cfg.discount_factor)
        self._nstep = int(self._cfg.nstep)
        self._priority = bool(self._cfg.priority)
        self._ac = actor_critic_learn(self._model, self._cfg)
        # the learn state (checkpoint keys 'actor_optimizer', 'critic_optimizer', 'learn_agent')
        self._actor_optimizer, self._critic_optimizer = self._ac.actor_optimizer, self._ac.critic_optimizer
        self._learn_agent = self._ac.agent

    def _forward_learn(self, data: Dict[str, Any]) -> Dict[str, Any]:
        ac = self._ac
        obs, action, next_obs = data["obs"], data["action"], data["next_obs"]
        reward, terminated, value_gamma = nstep_terms(data)
        weight = data.get("weight") if self._priority else None
        # critic target: y = sum_k gamma^k r_k + gamma^n (1 - terminated) Q'(s', mu'(s')), the target actor-critic's
        with torch.no_grad():
            next_action = actor_output(ac, "target", next_obs)["action"]
            target_q = critic_values(ac, "target", next_obs, next_action)
            target = ddpg_critic_target(target_q, reward, terminated, self._gamma, self._nstep, value_gamma)
        # critic loss: Q(s, a) regressed on y
        loss_critic, td_error, q = critic_step(ac, obs, action, target, weight)
        # actor loss: -Q(s, mu(s)) through the updated critic
        loss_actor = deterministic_actor_step(ac, obs, weight)
        # target update: Polyak averaging of the actor and the critic
        ac.agent.target_update()
        info: Dict[str, Any] = host_figures(critic_loss=loss_critic, actor_loss=loss_actor, q_value=q.mean())
        info.update(
            cur_lr=ac.critic_optimizer.param_groups[0]["lr"], total_loss=info["critic_loss"] + info["actor_loss"]
        )
        if self._priority:
            info["priority"] = td_error.cpu().numpy()
        return info

    # ---- collect and eval (shared with TD3 through DeterministicActing) -----------------------------------------
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


@update_step
def deterministic_actor_step(ac: ActorCriticLearn, obs: torch.Tensor, weight: Optional[torch.Tensor]) -> torch.Tensor:
    """Actor loss of DDPG and TD3: ``-mean_b w_b Q_1(s_b, mu(s_b))``, the first critic only (TD3's and SB3's
    choice), one step of the actor's optimizer; the critics' weights get no gradient.

    Returns:
        The loss (detached).
    """
    action = ac.agent.forward(obs, mode="compute_actor")["action"]
    q = ac.agent.forward({"obs": obs, "action": action}, mode="compute_critic", critics=1, param_grad=False)["q"]
    loss = deterministic_actor_loss(q, weight)
    minimize(ac.actor_optimizer, loss, ac.actor_params)
    return loss.detach()


register_policy("ddpg", DDPGPolicy)
