"""Text logging, TensorBoard scalars and CSV tables for a run directory."""

from __future__ import annotations

import csv
import logging
import os
import sys
from typing import Any, Dict, List, Mapping, Optional

from nervex.utils.wandb_logger import WandbRun, wandb_settings


def build_logger(run_dir: Optional[str], name: str = "nervex", level: int = logging.INFO) -> logging.Logger:
    """A logger writing to ``run_dir/log.txt`` and to stderr, one per run directory.

    Args:
        run_dir: Where ``log.txt`` goes; None logs to stderr only.
        name: Logger name; the run directory is appended so runs in one process stay apart.
    """
    logger = logging.getLogger(f"{name}.{os.path.abspath(run_dir)}" if run_dir else name)
    logger.setLevel(level)
    logger.propagate = False
    if not logger.handlers:
        fmt = logging.Formatter("[%(asctime)s] %(levelname)s %(message)s", "%H:%M:%S")
        console = logging.StreamHandler(sys.stderr)
        console.setFormatter(fmt)
        logger.addHandler(console)
        if run_dir:
            os.makedirs(run_dir, exist_ok=True)
            file_handler = logging.FileHandler(os.path.join(run_dir, "log.txt"), encoding="utf-8")
            file_handler.setFormatter(fmt)
            logger.addHandler(file_handler)
    return logger


def close_logger(logger: logging.Logger) -> None:
    for handler in list(logger.handlers):
        handler.close()
        logger.removeHandler(handler)


class ScalarWriter:
    """Scalars with slash names (``train/loss``) against env steps: TensorBoard, and W&B when the config asks.

    TensorBoard's writer is created on first use; so is the W&B run (``nervex.utils.wandb_logger.WandbRun``), which
    gets the same names, ``env_step`` as its x-axis and the resolved config.

    Args:
        run_dir: Where the event files go; None disables writing (the figures are still kept in ``latest``).
        cfg: The run's compiled config: its ``logger.wandb`` section turns W&B on (ignored without ``run_dir``).
        logger: Where the one warning about a W&B failure goes.

    Raises:
        ImportError: ``logger.wandb.mode`` is online or offline and the wandb package is missing.
    """

    def __init__(
        self,
        run_dir: Optional[str],
        cfg: Optional[Mapping[str, Any]] = None,
        logger: Optional[logging.Logger] = None,
    ) -> None:
        self._run_dir = run_dir
        self._writer: Any = None
        self.latest: Dict[str, float] = {}
        self.wandb: Optional[WandbRun] = None
        settings = wandb_settings(cfg) if run_dir is not None else None
        if settings is not None:
            self.wandb = WandbRun(settings, run_dir, config=cfg, logger=logger)

    def add_scalars(self, scalars: Mapping[str, Any], step: int) -> None:
        """Write every numeric value of ``scalars`` at x = ``step`` (the env step)."""
        numeric = {
            key: float(value)
            for key, value in scalars.items()
            if isinstance(value, (int, float)) and not isinstance(value, bool)
        }
        self.latest.update(numeric)
        if self._run_dir is None or not numeric:
            return
        writer = self._get_writer()
        for key, value in numeric.items():
            writer.add_scalar(key, value, int(step))
        if self.wandb is not None:
            self.wandb.log(numeric, int(step))

    def _get_writer(self) -> Any:
        if self._writer is None:
            # imported here: TensorBoard takes a second to import and most code paths never need it
            from torch.utils.tensorboard import SummaryWriter

            self._writer = SummaryWriter(log_dir=self._run_dir)
        return self._writer

    def flush(self) -> None:
        if self._writer is not None:
            self._writer.flush()

    def close(self) -> None:
        if self._writer is not None:
            self._writer.close()
            self._writer = None
        if self.wandb is not None:
            self.wandb.close()


class CsvWriter:
    """Append rows to a CSV file with a fixed header (``eval.csv``), flushing each row so a crash loses nothing."""

    def __init__(self, path: str, fields: List[str]) -> None:
        self.path = path
        self.fields = fields
        new = not os.path.exists(path) or os.path.getsize(path) == 0
        self._file = open(path, "a", newline="", encoding="utf-8")
        self._writer = csv.DictWriter(self._file, fieldnames=fields, extrasaction="ignore")
        if new:
            self._writer.writeheader()
            self._file.flush()

    def write(self, row: Mapping[str, Any]) -> None:
        self._writer.writerow(dict(row))
        self._file.flush()

    def close(self) -> None:
        if not self._file.closed:
            self._file.close()
