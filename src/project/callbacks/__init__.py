"""Callbacks: one file per callback."""

from project.callbacks.export import ExportBest
from project.callbacks.prediction_writer import PredictionWriter

__all__ = ["ExportBest", "PredictionWriter"]
