"""A2C (Mnih et al. 2016, synchronous): one gradient step on each short rollout, n-step or GAE returns."""

from __future__ import annotations

from typing import Any, Dict, Optional

import torch

from nervex.agent import Agent
from nervex.config import Field, merge_defaults
from nervex.rl_utils import a2c_data, a2c_error
from nervex.torch_utils import Adam, clip_grad_norm

from .actor_critic import ACTOR_CRITIC_CONFIG, SCHEDULES, ActorCriticPolicy
from .base_policy import register_policy


class A2CPolicy(ActorCriticPolicy):
    """Advantage actor-critic with Stable-Baselines3's defaults (RMSprop, 5-step rollouts, one update each).

    Config keys besides the on-policy contract (``collect.rollout_len``; ``learn.batch_size: null`` and
    ``learn.epoch_per_collect: 1`` make one gradient step on the whole rollout):
        discount_factor, gae_lambda: ``gae_lambda: 1`` gives n-step returns (SB3's A2C default).
        learn.optimizer: ``rmsprop`` (alpha 0.99, eps ``learn.optimizer_eps``, as SB3) or ``adam``.
        learn.learning_rate / lr_schedule, learn.value_weight, learn.entropy_weight, learn.grad_clip, learn.adv_norm.
        normalize.obs / normalize.reward: running normalization as SB3's VecNormalize.
    """

    config: Dict[str, Any] = merge_defaults(
        ACTOR_CRITIC_CONFIG,
        dict(
            gae_lambda=1.0,
            learn=dict(
                epoch_per_collect=1,
                batch_size=None,
                optimizer=Field("rmsprop", choices=("rmsprop", "adam")),
                learning_rate=Field(7e-4, gt=0),
                lr_schedule=Field("constant", choices=SCHEDULES),
                optimizer_eps=Field(1e-5, gt=0),
                value_weight=Field(0.5, ge=0),
                entropy_weight=Field(0.0, ge=0),
                adv_norm=False,
                grad_clip=Field(0.5, ge=0),
            ),
            collect=dict(rollout_len=5),
        ),
    )

    # ---- learn -----------------------------------------------------------------------------------------------
    def _init_learn(self) -> None:
        learn = self._cfg.learn
        if learn.optimizer == "rmsprop":
            self._optimizer = torch.optim.RMSprop(
                self._model.parameters(), lr=learn.learning_rate, alpha=0.99, eps=learn.optimizer_eps
            )
        else:
            self._optimizer = Adam(self._model.parameters(), lr=learn.learning_rate, eps=learn.optimizer_eps)
        self._learn_agent = Agent(self._model)
        self._learn_agent.add_plugin("main", "grad", enable_grad=True)

    def _forward_learn(self, data: Dict[str, Any], learning_rate: Optional[float] = None) -> Dict[str, Any]:
        learn = self._cfg.learn
        value, logp, entropy, _, adv = self.learn_terms(self._learn_agent, self._optimizer, data, learning_rate)
        loss = a2c_error(a2c_data(logp, entropy, value, adv, data["return"], data.get("weight")))
        total = self.weighted_loss(loss.policy_loss, loss.value_loss, loss.entropy_loss)
        self._optimizer.zero_grad(set_to_none=True)
        total.backward()
        if learn.grad_clip > 0:
            clip_grad_norm(self._model.parameters(), learn.grad_clip)
        self._optimizer.step()
        figures = torch.stack([total, loss.policy_loss, loss.value_loss, loss.entropy_loss]).tolist()
        out: Dict[str, Any] = dict(zip(("total_loss", "policy_loss", "value_loss", "entropy_loss"), figures))
        out["explained_variance"] = self._batch_constants(data)[1]
        out["cur_lr"] = self._optimizer.param_groups[0]["lr"]
        return out


register_policy("a2c", A2CPolicy)
