"""Gaussian optimisation: configs, initialisation, schedules, densification, the trainer, and
reconstruction from posed views."""

from microdreamer.config import ReconstructConfig, TrainConfig
from microdreamer.train.initialize import random_ball_splat, splat_from_points
from microdreamer.train.schedule import exponential_lr
from microdreamer.train.trainer import GaussianTrainer

__all__ = [
    "GaussianTrainer",
    "ReconstructConfig",
    "TrainConfig",
    "exponential_lr",
    "random_ball_splat",
    "splat_from_points",
]
