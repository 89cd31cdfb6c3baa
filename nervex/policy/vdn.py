"""VDN (Sunehag et al. 2018): QMIX's algorithm with the team value a plain sum of the agents' Q-values."""

from __future__ import annotations

from .base_policy import register_policy
from .qmix import QMIXPolicy


class VDNPolicy(QMIXPolicy):
    """Value decomposition networks: ``Q_tot(s, u) = sum_a Q_a(o_a, u_a)``.

    Everything but the mixer is ``QMIXPolicy`` (the same sequences, burn-in, double-Q n-step / TD(lambda) targets
    from the team reward, masks and config keys; see its docstring). The default model is ``vdn``
    (``nervex.model.VDN``: ``QMix`` with the parameter-free ``VDNMixer``), which needs no global state.
    """

    default_model_type = "vdn"


register_policy("vdn", VDNPolicy)
