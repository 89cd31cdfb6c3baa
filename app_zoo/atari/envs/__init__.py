"""The Atari env and its wrappers; importing registers ``'atari'`` (ale-py itself is needed only to build one)."""

from .atari_env import AtariEnv, import_ale

__all__ = ["AtariEnv", "import_ale"]
