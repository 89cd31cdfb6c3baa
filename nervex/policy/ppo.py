"""PPO (Schulman et al. 2017): clipped surrogate, GAE, minibatch epochs; discrete and continuous actions."""

from __future__ import annotations

from typing import Any, Dict, Optional

import torch

from nervex.agent import Agent
from nervex.config import Field, merge_defaults
from nervex.rl_utils import ppo_data, ppo_error
from nervex.torch_utils import Adam

from .actor_critic import ACTOR_CRITIC_CONFIG, SCHEDULES, ActorCriticPolicy, schedule_value
from .base_policy import register_policy


class PPOPolicy(ActorCriticPolicy):
    """Proximal Policy Optimization with the details of Stable-Baselines3's implementation (and its defaults).

    Config keys besides the on-policy contract (``collect.rollout_len`` steps per env, ``learn.epoch_per_collect``
    passes of ``learn.batch_size`` minibatches) and ``ACTOR_CRITIC_CONFIG`` (``discount_factor``, ``gae_lambda``,
    ``normalize``):
        learn.learning_rate / lr_schedule: Adam's rate, ``constant`` or ``linear`` (to 0 at ``max_env_step``).
        learn.clip_ratio / clip_schedule: the surrogate's clip range, constant or linear.
        learn.value_clip_ratio: clip the value change per update (None: off); learn.dual_clip: dual-clip PPO (> 1).
        learn.value_weight, learn.entropy_weight: the loss coefficients (SB3's vf_coef, ent_coef).
        learn.adv_norm: normalize advantages per minibatch; learn.grad_clip: max gradient norm (0: off).
    """

    config: Dict[str, Any] = merge_defaults(
        ACTOR_CRITIC_CONFIG,
        dict(
            learn=dict(
                epoch_per_collect=10,
                batch_size=64,
                learning_rate=Field(3e-4, gt=0),
                lr_schedule=Field("constant", choices=SCHEDULES),
                clip_ratio=Field(0.2, gt=0),
                clip_schedule=Field("constant", choices=SCHEDULES),
                value_clip_ratio=Field(None, gt=0, kind="number"),
                dual_clip=Field(None, gt=1, kind="number"),
                value_weight=Field(0.5, ge=0),
                entropy_weight=Field(0.0, ge=0),
                adv_norm=True,
                grad_clip=Field(0.5, ge=0),
                adam_eps=Field(1e-5, gt=0),
            ),
            collect=dict(rollout_len=2048),
        ),
    )

    def _init_learn(self) -> None:
        learn = self._cfg.learn
        clip = dict(grad_clip_type="clip_norm", clip_value=float(learn.grad_clip)) if learn.grad_clip > 0 else {}
        self._optimizer = Adam(self._model.parameters(), lr=learn.learning_rate, eps=learn.adam_eps, **clip)
        self._learn_agent = Agent(self._model)
        self._learn_agent.add_plugin("main", "grad", enable_grad=True)

    def _forward_learn(
        self, data: Dict[str, Any], learning_rate: Optional[float] = None, clip_ratio: Optional[float] = None
    ) -> Dict[str, Any]:
        learn = self._cfg.learn
        clip = learn.clip_ratio if clip_ratio is None else clip_ratio
        value, logp, entropy, dist, adv = self.learn_terms(self._learn_agent, self._optimizer, data, learning_rate)
        loss, info = ppo_error(
            ppo_data(logp, data["logp"], entropy, value, data["value"], adv, data["return"], data.get("weight")),
            clip,
            learn.value_clip_ratio,
            learn.dual_clip,
        )
        total = self.weighted_loss(loss.policy_loss, loss.value_loss, loss.entropy_loss)
        self._optimizer.zero_grad(set_to_none=True)
        total.backward()
        self._optimizer.step()  # clips the gradients' global norm to learn.grad_clip first
        # one host copy for every figure instead of an .item() each
        figures = torch.stack(
            [total, loss.policy_loss, loss.value_loss, loss.entropy_loss, info.approx_kl, info.clip_fraction]
        ).tolist()
        names = ("total_loss", "policy_gradient_loss", "value_loss", "entropy_loss", "approx_kl", "clip_fraction")
        out: Dict[str, Any] = dict(zip(names, figures))
        out["explained_variance"] = self._batch_constants(data)[1]
        out["cur_lr"] = self._optimizer.param_groups[0]["lr"]
        out["clip_range"] = clip
        if self._continuous:
            out["std"] = float(dist.sigma.detach().mean())
        return out

    def _get_setting_learn(self, command_info: Dict[str, Any]) -> Dict[str, Any]:
        learn = self._cfg.learn
        return {
            "learning_rate": schedule_value(learn.learning_rate, learn.lr_schedule, command_info),
            "clip_ratio": schedule_value(learn.clip_ratio, learn.clip_schedule, command_info),
        }


register_policy("ppo", PPOPolicy)
