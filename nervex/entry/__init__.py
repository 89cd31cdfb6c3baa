from .callbacks import DefaultCallbacks
from .serial_entry import SerialTrainer, serial_pipeline

__all__ = ["serial_pipeline", "SerialTrainer", "DefaultCallbacks"]
