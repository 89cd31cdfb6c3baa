"""Running statistics for observation and reward normalization, as Stable-Baselines3's ``VecNormalize``.

:class:`RunningMeanStd` keeps float64 NumPy moments merged batch by batch with the parallel algorithm of Chan et al.
(exact for any split of the data into batches). :class:`ReturnNormalizer` scales rewards by the standard deviation of
a running discounted return. Both save to checkpoints that hold only tensors and plain numbers.
"""

from __future__ import annotations

from typing import Any, Dict, Hashable, Tuple, Union

import numpy as np
import torch

ArrayOrTensor = Union[np.ndarray, torch.Tensor]


class RunningMeanStd:
    """Running mean and (population) variance of a stream of batches.

    It starts as a pseudo-batch of ``epsilon`` samples with mean 0 and variance 1, as SB3's does, so the statistics
    are defined before the first update and the first batch dominates them at once.

    Args:
        shape: Shape of one sample (``()`` for scalars such as returns).
        epsilon: Weight of the initial pseudo-batch, >= 0.

    Raises:
        ValueError: ``epsilon < 0``.
    """

    def __init__(self, shape: Tuple[int, ...] = (), epsilon: float = 1e-4):
        if epsilon < 0:
            raise ValueError(f"RunningMeanStd: epsilon must be >= 0, got {epsilon}")
        self.shape = tuple(shape)
        self.mean = np.zeros(self.shape, dtype=np.float64)
        self.var = np.ones(self.shape, dtype=np.float64)
        self.count = float(epsilon)

    def update(self, x: ArrayOrTensor) -> None:
        """Merge a batch of samples stacked along axis 0; an empty batch changes nothing.

        Args:
            x: The batch (a NumPy array, or a tensor, which is copied to the host).

        Shapes:
            - x: :math:`(N, *shape)`

        Raises:
            ValueError: ``x`` is not shaped ``(N, *shape)``.
        """
        x = x.detach().cpu().numpy() if isinstance(x, torch.Tensor) else np.asarray(x)
        if x.ndim != len(self.shape) + 1 or x.shape[1:] != self.shape:
            raise ValueError(f"RunningMeanStd.update: x has shape {x.shape}; expected (N, *{self.shape})")
        if x.shape[0] == 0:
            return
        x = x.astype(np.float64, copy=False)
        self.update_from_moments(x.mean(axis=0), x.var(axis=0), x.shape[0])

    def update_from_moments(self, batch_mean: np.ndarray, batch_var: np.ndarray, batch_count: int) -> None:
        """Merge a batch given by its mean, population variance and size (Chan et al.'s parallel algorithm).

        Shapes:
            - batch_mean, batch_var: ``shape``
        """
        delta = batch_mean - self.mean
        total = self.count + batch_count
        m2 = self.var * self.count + batch_var * batch_count + np.square(delta) * self.count * batch_count / total
        # np.asarray: for shape () the arithmetic yields NumPy scalars; keep 0-dim arrays
        self.mean = np.asarray(self.mean + delta * batch_count / total, dtype=np.float64)
        self.var = np.asarray(m2 / total, dtype=np.float64)
        self.count = total

    def normalize(self, x: ArrayOrTensor, clip: float = 10.0, eps: float = 1e-8) -> ArrayOrTensor:
        """``clip((x - mean) / sqrt(var + eps), -clip, clip)``.

        Args:
            x: Samples of shape ``(*, *shape)``.
            clip: Bound of the result's magnitude.
            eps: Added to the variance, so a constant feature does not divide by zero.

        Returns:
            A float32 NumPy array for a NumPy (or array-like) input; for a tensor, a tensor on its device of its
            dtype (float32 if that is not a floating-point type, since normalized integers make no sense).
        """
        if isinstance(x, torch.Tensor):
            dtype = x.dtype if x.is_floating_point() else torch.float32
            mean = torch.as_tensor(self.mean, dtype=dtype, device=x.device)
            std = torch.as_tensor(np.sqrt(self.var + eps), dtype=dtype, device=x.device)
            return ((x.to(dtype) - mean) / std).clamp(-clip, clip)
        out = np.clip((np.asarray(x, dtype=np.float64) - self.mean) / np.sqrt(self.var + eps), -clip, clip)
        return out.astype(np.float32)

    def state_dict(self) -> Dict[str, Any]:
        """``{'mean': Tensor, 'var': Tensor, 'count': float}`` (float64 tensors; loads with ``weights_only=True``)."""
        return {
            "mean": torch.from_numpy(self.mean.copy()),
            "var": torch.from_numpy(self.var.copy()),
            "count": self.count,
        }

    def load_state_dict(self, state: Dict[str, Any]) -> None:
        """Restore what :meth:`state_dict` returned.

        Raises:
            ValueError: a key is missing, or the saved shape is not this normalizer's ``shape``.
        """
        missing = [key for key in ("mean", "var", "count") if key not in state]
        if missing:
            raise ValueError(f"RunningMeanStd.load_state_dict: missing keys {missing}; expected 'mean', 'var', 'count'")
        mean, var = (np.array(torch.as_tensor(state[key]).cpu().numpy(), dtype=np.float64) for key in ("mean", "var"))
        for key, value in (("mean", mean), ("var", var)):
            if value.shape != self.shape:
                raise ValueError(
                    f"RunningMeanStd.load_state_dict: saved {key} has shape {value.shape} but this normalizer's "
                    f"shape is {self.shape}"
                )
        self.mean, self.var, self.count = mean, var, float(state["count"])


class ReturnNormalizer:
    """Reward scaling of ``VecNormalize``: rewards divided by the standard deviation of the discounted return.

    Per env id it keeps ``ret = ret * gamma + reward`` (reset to 0 after the episode's last step), feeds each ``ret``
    to a scalar :class:`RunningMeanStd` and returns ``clip(reward / sqrt(var(ret) + 1e-8), -clip, clip)``. The mean
    is not subtracted: that would change which policies are optimal.

    SB3 updates the statistics with all envs' returns of a step at once, then scales; here each call updates then
    scales, so within one vector step a later env sees the earlier envs' returns. The merged statistics are the same.

    Args:
        gamma: The discount of the running return (the policy's ``gamma``).
        num_envs_hint: Env ids ``0 .. num_envs_hint - 1`` start with a return entry; any other hashable id gets one
            on first use.
        epsilon: ``epsilon`` of the return :class:`RunningMeanStd`.
        clip: Bound of the scaled reward's magnitude.
    """

    def __init__(self, gamma: float, num_envs_hint: int = 0, epsilon: float = 1e-4, clip: float = 10.0):
        self.gamma = gamma
        self.clip = clip
        self.ret_rms = RunningMeanStd((), epsilon)
        self.returns: Dict[Hashable, float] = {env_id: 0.0 for env_id in range(num_envs_hint)}

    def scale(self, env_id: Hashable, reward: float, done: bool) -> float:
        """Update env ``env_id``'s running return with ``reward`` and return the scaled reward.

        Args:
            env_id: Any hashable id of the env that produced ``reward``.
            reward: The raw reward.
            done: Whether this step ended the episode (terminated or truncated): the running return restarts.

        Returns:
            ``clip(reward / sqrt(var(ret) + 1e-8), -clip, clip)``, with ``var`` including this step's return.
        """
        ret = self.returns.get(env_id, 0.0) * self.gamma + float(reward)
        self.ret_rms.update(np.array([ret], dtype=np.float64))
        scaled = float(np.clip(reward / np.sqrt(self.ret_rms.var + 1e-8), -self.clip, self.clip))
        self.returns[env_id] = 0.0 if done else ret
        return scaled

    def state_dict(self) -> Dict[str, Any]:
        """The return statistics (not the per-env running returns, which belong to unfinished episodes)."""
        return {"ret_rms": self.ret_rms.state_dict()}

    def load_state_dict(self, state: Dict[str, Any]) -> None:
        """Restore what :meth:`state_dict` returned.

        Raises:
            ValueError: ``state`` has no ``'ret_rms'``, or its shapes do not match (see
                :meth:`RunningMeanStd.load_state_dict`).
        """
        if "ret_rms" not in state:
            raise ValueError(f"ReturnNormalizer.load_state_dict: missing key 'ret_rms'; got keys {sorted(state)}")
        self.ret_rms.load_state_dict(state["ret_rms"])
