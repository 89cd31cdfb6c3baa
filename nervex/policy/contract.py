"""The training contract: what a policy class declares and the trainer (serial or parallel) reads.

A trainer must not know the algorithm. It asks the policy class for a ``TrainingContract`` made from the compiled
``policy`` section and reads nothing else: whether the data is on- or off-policy, which replay buffer (if any) holds
it, how much to collect between learning phases and in which unit, how many gradient steps each phase takes, and
when learning starts.

The keys behind the contract are declared once, here, for each kind of policy; a policy class adds its own keys
in its ``config`` and may change these defaults there.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Dict, Literal, Mapping, Optional

from nervex.config import Field

CollectUnit = Literal["sample", "rollout", "episode"]

# Keys every policy section has.
POLICY_BASE_CONFIG: Dict[str, Any] = dict(
    policy_type="",  # the registered name (required)
    import_names=[],  # modules to import before the name is looked up (a user's own policy file)
    use_cuda=False,  # model and batches on the GPU
    on_policy=Field(None, kind="bool"),  # declared by the policy class; a class that declares no config reads it here
    model_type=None,  # registered model name; None: the policy's default model
    model={},  # keyword arguments of the model class (checked against its constructor)
    learn={},
    collect={},
    eval={},
    command={},
)

# Keys of the contract for off-policy data (a replay buffer between actor and learner).
OFF_POLICY_CONFIG: Dict[str, Any] = dict(
    learn=dict(
        batch_size=Field(64, ge=1),  # samples per gradient step
        update_per_collect=Field(1, ge=1),  # gradient steps after each collection
        learning_starts=Field(1000, ge=0),  # env steps collected before the first gradient step
        random_warmup=False,  # act uniformly at random (from the env's action space) until learning_starts
    ),
    collect=dict(
        n_sample=Field(8, ge=1),  # env steps per collection, over all collector envs together
        n_episode=Field(None, ge=1, kind="int"),  # if set: collect this many whole episodes instead
    ),
)

# Keys of the contract for on-policy data (each rollout is trained on, then dropped).
ON_POLICY_CONFIG: Dict[str, Any] = dict(
    learn=dict(
        epoch_per_collect=Field(10, ge=1),  # passes over each rollout
        batch_size=Field(64, ge=1, nullable=True),  # minibatch size; null: the whole rollout in one step
    ),
    collect=dict(
        rollout_len=Field(128, ge=1),  # env steps per collector env in one rollout (exact), then a bootstrap flush
        n_episode=Field(None, ge=1, kind="int"),  # if set: collect this many whole episodes instead of rollouts
    ),
)


@dataclass(frozen=True)
class CollectSpec:
    """How much the actor collects between two learning phases.

    Attributes:
        unit: ``'sample'``: ``n`` env steps over all envs; an env's unfinished trajectory carries over to the next
            call (off-policy). ``'rollout'``: exactly ``n`` steps of every env, then every trajectory is handed over
            with the value of its last observation bootstrapped; nothing carries over (on-policy).
            ``'episode'``: ``n`` whole episodes (on-policy: the envs restart at each call, so no episode mixes two
            policies).
        n: The count of that unit.
        restart_envs: Restart the envs at the start of each collection (on-policy ``episode`` unit).
    """

    unit: CollectUnit
    n: int
    restart_envs: bool = False


@dataclass(frozen=True)
class LearnSpec:
    """How the learner trains on what was collected.

    Attributes:
        batch_size: Samples per gradient step (on-policy: the minibatch; None: the whole rollout).
        update_per_collect: Off-policy gradient steps per collection.
        epoch_per_collect: On-policy passes over each rollout (each pass is shuffled into minibatches).
        learning_starts: Env steps before the first gradient step.
        random_warmup: Act uniformly at random until ``learning_starts``.
    """

    batch_size: Optional[int]
    update_per_collect: int = 1
    epoch_per_collect: int = 1
    learning_starts: int = 0
    random_warmup: bool = False


@dataclass(frozen=True)
class TrainingContract:
    """Everything a trainer reads about a policy.

    Attributes:
        on_policy: Trains on each collection once (True) or samples from a replay buffer (False).
        buffer_type: Registered buffer name (``'prioritized'``, ``'uniform'``); None for on-policy.
        buffer_defaults: The policy's own defaults for the ``replay_buffer`` section (over the buffer class's).
        collect: See ``CollectSpec``.
        learn: See ``LearnSpec``.
    """

    on_policy: bool
    buffer_type: Optional[str]
    collect: CollectSpec
    learn: LearnSpec
    buffer_defaults: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.on_policy and self.buffer_type is not None:
            raise ValueError("an on-policy contract trains on its rollouts: buffer_type must be None")
        if not self.on_policy and self.buffer_type is None:
            raise ValueError("an off-policy contract needs a buffer_type")
        if self.collect.unit == "rollout" and not self.on_policy:
            raise ValueError("the 'rollout' collect unit (bootstrap flush, nothing kept) is for on-policy data")

    def train_iter_per_collect(self, n_samples: int) -> int:
        """Gradient steps one learning phase takes on ``n_samples`` collected samples."""
        if not self.on_policy:
            return self.learn.update_per_collect
        batch = self.learn.batch_size or n_samples
        return self.learn.epoch_per_collect * -(-n_samples // batch)


def contract_from_config(cfg: Mapping[str, Any], on_policy: bool, buffer_type: Optional[str]) -> TrainingContract:
    """Read the contract keys (``OFF_POLICY_CONFIG`` / ``ON_POLICY_CONFIG``) of a compiled policy section."""
    learn, collect = cfg["learn"], cfg["collect"]
    episodes = collect.get("n_episode")
    if on_policy:
        spec = (
            CollectSpec("episode", int(episodes), restart_envs=True)
            if episodes
            else CollectSpec("rollout", int(collect["rollout_len"]))
        )
        batch = learn.get("batch_size")
        return TrainingContract(
            on_policy=True,
            buffer_type=None,
            collect=spec,
            learn=LearnSpec(
                batch_size=None if batch is None else int(batch), epoch_per_collect=learn["epoch_per_collect"]
            ),
        )
    spec = CollectSpec("episode", int(episodes)) if episodes else CollectSpec("sample", int(collect["n_sample"]))
    return TrainingContract(
        on_policy=False,
        buffer_type=buffer_type,
        collect=spec,
        learn=LearnSpec(
            batch_size=int(learn["batch_size"]),
            update_per_collect=int(learn["update_per_collect"]),
            learning_starts=int(learn["learning_starts"]),
            random_warmup=bool(learn["random_warmup"]),
        ),
    )
