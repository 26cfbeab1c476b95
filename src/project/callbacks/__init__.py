"""Callbacks: one file per callback."""

from project.callbacks.data_check import DataCheck
from project.callbacks.export import ExportBest
from project.callbacks.grad_norm import GradNormMonitor
from project.callbacks.non_finite import NonFiniteGuard
from project.callbacks.prediction_writer import PredictionWriter

__all__ = ["DataCheck", "ExportBest", "GradNormMonitor", "NonFiniteGuard", "PredictionWriter"]
