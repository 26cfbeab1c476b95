"""Callbacks: one file per callback."""

from project.callbacks.prediction_writer import PredictionWriter

__all__ = ["PredictionWriter"]
