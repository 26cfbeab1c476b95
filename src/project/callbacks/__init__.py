"""Callbacks: one file per callback."""

from project.callbacks.export import ExportBest
from project.callbacks.graceful_stop import GracefulStop
from project.callbacks.prediction_writer import PredictionWriter
from project.callbacks.rng_state import RNGState

__all__ = ["ExportBest", "GracefulStop", "PredictionWriter", "RNGState"]
