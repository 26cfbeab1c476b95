"""Callbacks: one file per callback."""

from project.callbacks.checkpoint_paths import CheckpointPaths

# room: pictures begin
from project.callbacks.confusion_matrix import ConfusionMatrix

# room: pictures end
from project.callbacks.data_check import DataCheck

# room: ema begin
from project.callbacks.ema import EMA

# room: ema end
# room: console begin
from project.callbacks.epoch_lines import EpochLines

# room: console end
from project.callbacks.export import ExportBest
from project.callbacks.graceful_stop import GracefulStop
from project.callbacks.grad_norm import GradNormMonitor

# room: dashboard begin
from project.callbacks.hparams import HParams

# room: dashboard end
# room: pictures begin
from project.callbacks.misclassified import Misclassified

# room: pictures end
# room: console begin
from project.callbacks.model_summary import CompactModelSummary

# room: console end
from project.callbacks.non_finite import NonFiniteGuard
from project.callbacks.prediction_writer import PredictionWriter
from project.callbacks.rng_state import RNGState
from project.callbacks.run_summary import RunSummary

# room: dashboard begin
from project.callbacks.scalars_layout import ScalarsLayout
from project.callbacks.throughput import Throughput

# room: dashboard end
# room: trackers begin
from project.callbacks.trackers import TrackerArtifacts

# room: trackers end
# room: pictures begin
from project.callbacks.training_images import TrainingImages

# room: pictures end

__all__ = [
    "EMA",  # room: ema
    "CheckpointPaths",
    "CompactModelSummary",  # room: console
    "ConfusionMatrix",  # room: pictures
    "DataCheck",
    "EpochLines",  # room: console
    "ExportBest",
    "GracefulStop",
    "GradNormMonitor",
    "HParams",  # room: dashboard
    "Misclassified",  # room: pictures
    "NonFiniteGuard",
    "PredictionWriter",
    "RNGState",
    "RunSummary",
    "ScalarsLayout",  # room: dashboard
    "Throughput",  # room: dashboard
    "TrackerArtifacts",  # room: trackers
    "TrainingImages",  # room: pictures
]
