"""Google Research Football (gfootball); importing this package registers the ``'gfootball'`` env.

The import works without the engine; building a ``FootballEnv`` then raises an ImportError that names
``app_zoo/gfootball/install.sh`` (which builds the engine from its source package, 20-30 minutes).
"""

from .envs import FootballEnv, gfootball_available, import_gfootball_env

__all__ = ["FootballEnv", "gfootball_available", "import_gfootball_env"]
