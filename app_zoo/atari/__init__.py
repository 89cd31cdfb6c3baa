"""Atari 2600 games (ale-py); importing this package registers the ``'atari'`` env.

The import works without ale-py; building an ``AtariEnv`` then raises an ImportError that says
``pip install -e .[atari]``.
"""

from .envs import AtariEnv

__all__ = ["AtariEnv"]
