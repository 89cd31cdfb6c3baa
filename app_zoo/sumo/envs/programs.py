"""SUMO's own actuated control for a net's traffic lights: a copy of each static program as ``type="actuated"``.

The copy keeps the phases and their order; green phases get ``minDur``/``maxDur`` (netconvert's defaults for
actuated lights: 5 s and 50 s), yellow and all-red phases keep their duration. SUMO then extends a green phase while
its automatically placed induction loops see vehicles arrive within ``max-gap`` (3 s by default) and switches when the
gap is exceeded or ``maxDur`` is reached
(https://sumo.dlr.de/docs/Simulation/Traffic_Lights.html#actuated_traffic_lights).
"""

from __future__ import annotations

import os
import xml.etree.ElementTree as ET
from typing import List

ACTUATED_PROGRAM_ID = "actuated"


def is_green(state: str) -> bool:
    """A phase that gives some stream green and none yellow (sumo-rl's own test for a green phase)."""
    return "y" not in state.lower() and any(c in "Gg" for c in state)


def write_actuated_programs(net_file: str, directory: str, min_dur: int = 5, max_dur: int = 50) -> str:
    """Write an additional file with an actuated copy (program id ``'actuated'``) of every static ``tlLogic`` of
    ``net_file``; return its path.

    Raises:
        ValueError: the net has no static traffic light, or ``min_dur`` / ``max_dur`` are not ``1 <= min <= max``.
    """
    if not 1 <= min_dur <= max_dur:
        raise ValueError(f"actuated green bounds must satisfy 1 <= min_dur <= max_dur, got {min_dur}, {max_dur}")
    root = ET.Element("additional")
    logics: List[ET.Element] = [t for t in ET.parse(net_file).getroot().iter("tlLogic") if t.get("type") == "static"]
    if not logics:
        raise ValueError(f"{net_file}: no static tlLogic to copy as an actuated program")
    for logic in logics:
        copy = ET.SubElement(
            root, "tlLogic", id=logic.get("id"), type="actuated", programID=ACTUATED_PROGRAM_ID, offset="0"
        )
        for phase in logic.iter("phase"):
            attrs = {"duration": phase.get("duration"), "state": phase.get("state")}
            if is_green(phase.get("state")):
                attrs.update(minDur=str(min_dur), maxDur=str(max_dur))
            ET.SubElement(copy, "phase", attrs)
    path = os.path.join(directory, "actuated.add.xml")
    ET.ElementTree(root).write(path, encoding="utf-8", xml_declaration=True)
    return path


__all__ = ["ACTUATED_PROGRAM_ID", "is_green", "write_actuated_programs"]
