"""The one place that chooses how a step of a learner's update runs: the algorithm's autograd code, or an equivalent.

An algorithm writes each step of its update (a critic's regression, an actor's loss, SAC's temperature, a no-grad
evaluation for a target) with autograd, as a function marked :func:`update_step` whose first argument holds what the
step works on (its *parts*: model, optimizers, ...). That function is the step's definition and its reference.

Elsewhere, a faster computation of the same step registers itself with :func:`equivalent_of` and a predicate saying
when it computes what the reference would (the hand-differentiated CPU kernels of ``nervex/policy/fused_ac.py`` for
the stock ``QAC``). :meth:`UpdateStep.implementation` is the whole choice: the equivalent runs when the parts allow
equivalents (``parts.use_equivalents``, set from ``policy.learn.fused_update``) and its predicate holds for this
call's arguments; the reference runs otherwise. A step nobody registered an equivalent for (any new algorithm's)
runs its reference, with nothing to change here. :func:`equivalents` lists what is registered.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any, Callable, Dict, Generic, Optional, ParamSpec, Protocol, TypeVar

P = ParamSpec("P")
R = TypeVar("R")


class StepParts(Protocol):
    """What a step's first argument tells the seam: whether registered equivalents may run for it at all."""

    use_equivalents: bool


@dataclass(frozen=True)
class Equivalent:
    """A computation registered as equal to a step's reference (float rounding apart) where ``applies`` holds.

    Attributes:
        run: Takes the step's arguments, returns what the reference returns.
        applies: Takes the step's arguments; True when ``run`` computes what the reference would for them (it is
            asked on every call: a hook may be added to a model at any time).
    """

    run: Callable[..., Any]
    applies: Callable[..., bool]


_STEPS: Dict[str, UpdateStep[Any, Any]] = {}


class UpdateStep(Generic[P, R]):
    """A step of an update: its autograd reference and, once registered, an equivalent (see the module's docstring).

    Call it as the reference is called; its first argument must carry ``use_equivalents`` (:class:`StepParts`).
    """

    def __init__(self, reference: Callable[P, R]) -> None:
        self.reference = reference
        self.name = f"{reference.__module__}.{reference.__qualname__}"
        self.equivalent: Optional[Equivalent] = None
        functools.update_wrapper(self, reference)

    def implementation(self, *args: P.args, **kwargs: P.kwargs) -> Callable[P, R]:
        """The function a call with these arguments runs: the equivalent where it applies, else the reference."""
        equivalent = self.equivalent
        if equivalent is not None and args[0].use_equivalents and equivalent.applies(*args, **kwargs):
            return equivalent.run
        return self.reference

    def __call__(self, *args: P.args, **kwargs: P.kwargs) -> R:
        return self.implementation(*args, **kwargs)(*args, **kwargs)

    def __repr__(self) -> str:
        equivalent = "none" if self.equivalent is None else self.equivalent.run.__qualname__
        return f"UpdateStep({self.name}, equivalent: {equivalent})"


def update_step(reference: Callable[P, R]) -> UpdateStep[P, R]:
    """Mark ``reference`` (autograd code, first argument the step's parts) as a step of an update (a module-level
    function: the step is not a descriptor, so not a method). A module defined again (``importlib.reload``) replaces
    its steps in :func:`equivalents`' list, without their equivalents until those register again."""
    step = UpdateStep(reference)
    _STEPS[step.name] = step
    return step


def equivalent_of(
    step: UpdateStep[Any, Any], applies: Callable[..., bool]
) -> Callable[[Callable[..., R]], Callable[..., R]]:
    """Register the decorated function as ``step``'s equivalent, run where ``applies(*args, **kwargs)`` holds.

    Args:
        step: A function marked :func:`update_step`.
        applies: The predicate, given the step's arguments.

    Raises:
        TypeError: ``step`` is not marked ``update_step``.
        ValueError: ``step`` has an equivalent already (one per step: say in its predicate where each applies).
    """
    if not isinstance(step, UpdateStep):
        raise TypeError(f"equivalent_of: {step!r} is not marked @update_step; mark the reference first")

    def register(run: Callable[..., R]) -> Callable[..., R]:
        if step.equivalent is not None:
            raise ValueError(
                f"equivalent_of: {step.name} has the equivalent {step.equivalent.run.__qualname__} already; "
                f"one per step, not also {run.__qualname__}"
            )
        step.equivalent = Equivalent(run, applies)
        return run

    return register


def equivalents() -> Dict[str, Optional[str]]:
    """Every step marked so far and the equivalent registered for it (None: it always runs its reference)."""
    return {
        name: None
        if step.equivalent is None
        else f"{step.equivalent.run.__module__}.{step.equivalent.run.__qualname__}"
        for name, step in _STEPS.items()
    }
