"""The tools around training: watch a checkpoint (``watch``), plot learning curves (``plot``), search
hyperparameters (``tune``). Each imports its optional package (moviepy, matplotlib, optuna) only when used."""
