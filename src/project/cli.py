"""The command line: LightningCLI with our defaults, links, run names and one-line user errors."""

from __future__ import annotations

import os
import pickle
import sys
from pathlib import Path
from typing import Any

from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.cli import LightningArgumentParser, LightningCLI

from project.atomic import remove_partials
from project.callbacks import (
    ConfusionMatrix,
    DataCheck,
    ExportBest,
    GracefulStop,
    GradNormMonitor,
    HParams,
    Misclassified,
    NonFiniteGuard,
    PredictionWriter,
    RNGState,
    Throughput,
    TrainingImages,
)
from project.callbacks.save_config import AtomicSaveConfig
from project.checkpoint_io import load_checkpoint_file
from project.config_checks import check_cli_config
from project.data.datamodule import ImageDataModule
from project.errors import UserError, user_message
from project.model import ImageClassifier
from project.runs import CHECKPOINTS, debug_run_name, eval_run_name, fit_run_name
from project.trainer import Trainer

DEFAULT_CONFIG = Path(__file__).resolve().parents[2] / "configs" / "default.yaml"


# Subcommands that read the model's classes and image size from --ckpt_path, not from a data folder.
CHECKPOINT_ONLY = ("predict", "export")
# Subcommands that only look at the configured model and data: no checkpoint, no run folder.
DRY = ("memory",)


class ProjectCLI(LightningCLI):
    """fit, validate, test, predict, export and memory, each starting from configs/default.yaml."""

    @staticmethod
    def subcommands() -> dict[str, set[str]]:
        return {
            **LightningCLI.subcommands(),
            "export": {"model", "datamodule"},
            "memory": {"model", "datamodule"},
        }

    def __init__(self, args: list[str] | None = None, **kwargs: Any) -> None:
        super().__init__(
            ImageClassifier,
            ImageDataModule,
            trainer_class=Trainer,
            args=args,
            parser_kwargs={
                "prog": "python -m project",
                "description": "Train, evaluate, predict with and export image classifiers. "
                "Also: python -m project infer (torch-free inference on an export), report (a run's "
                "curves as a PNG), doctor (check this machine), new (start a task from this template); "
                "each with --help.",
            },
            save_config_callback=AtomicSaveConfig,
            save_config_kwargs={"overwrite": True},
            trainer_defaults={"callbacks": [RNGState(), GracefulStop()]},
            auto_configure_optimizers=False,
            **kwargs,
        )

    def _prepare_subcommand_parser(
        self, klass: type, subcommand: str, **kwargs: Any
    ) -> LightningArgumentParser:
        # add_arguments_to_parser needs to know which subcommand it builds (see CHECKPOINT_ONLY)
        self._building = subcommand
        return super()._prepare_subcommand_parser(klass, subcommand, **kwargs)

    def parse_arguments(self, parser: LightningArgumentParser, args: list[str] | None) -> None:
        self.config = parser.parse_args(with_default_config(sys.argv[1:] if args is None else args))

    def _parse_ckpt_path(self) -> None:
        try:  # LightningCLI reads the checkpoint's hyper-parameters, weights-only, before anything else
            super()._parse_ckpt_path()
        except pickle.UnpicklingError:
            load_checkpoint_file(self.config[self.config.subcommand].ckpt_path)  # raises the one-line error
            raise

    def add_arguments_to_parser(self, parser: LightningArgumentParser) -> None:
        parser.add_argument(
            "--name",
            type=str | None,
            default=None,
            help="Run name: logs/<name> and checkpoints/<name>. Default: a new time stamp; "
            "with --ckpt_path last, the newest run.",
        )
        parser.add_lightning_class_args(ModelCheckpoint, "checkpoint")
        parser.set_defaults(
            {
                "checkpoint.monitor": "val/acc",
                "checkpoint.mode": "max",
                "checkpoint.save_top_k": 3,
                "checkpoint.save_last": True,
                "checkpoint.filename": "epoch={epoch:03d}-val_acc={val/acc:.4f}",
                "checkpoint.auto_insert_metric_name": False,
                # a run resumed after a kill redoes the epoch whose checkpoint may already exist: replace
                # it (atomically) instead of keeping both as `name.ckpt` and `name-v1.ckpt`
                "checkpoint.enable_version_counter": False,
            }
        )
        parser.add_lightning_class_args(PredictionWriter, "predictions")
        parser.add_lightning_class_args(ExportBest, "export_best")
        parser.add_lightning_class_args(DataCheck, "data_check")
        parser.add_lightning_class_args(NonFiniteGuard, "non_finite")
        parser.add_lightning_class_args(GradNormMonitor, "grad_norm")
        # monitoring: what TensorBoard shows besides the scalars (each with an `enabled` switch)
        parser.add_lightning_class_args(TrainingImages, "training_images")
        parser.add_lightning_class_args(ConfusionMatrix, "confusion_matrix")
        parser.add_lightning_class_args(Misclassified, "misclassified")
        parser.add_lightning_class_args(Throughput, "throughput")
        parser.add_lightning_class_args(HParams, "hparams")
        if getattr(self, "_building", None) not in CHECKPOINT_ONLY:
            for key in ("num_classes", "class_names", "image_size", "task"):
                parser.link_arguments(f"data.{key}", f"model.{key}", apply_on="instantiate")

    def before_instantiate_classes(self) -> None:
        config = self.config[self.subcommand]
        check_cli_config(config)
        if self.subcommand in DRY:
            config.trainer.logger = False
            return
        if self.subcommand != "fit" and not config.ckpt_path:
            raise UserError(
                f"`{self.subcommand}` needs a trained model.",
                f"pass --ckpt_path PATH (e.g. {CHECKPOINTS}/<run>/last.ckpt).",
            )
        if config.ckpt_path not in (None, "last") and not Path(config.ckpt_path).is_file():
            raise UserError(
                f"Checkpoint '{config.ckpt_path}' (--ckpt_path) does not exist.",
                f"pass a .ckpt file (runs keep them in {CHECKPOINTS}/<run>/), or `last` to resume.",
            )
        debug = self.subcommand == "fit" and bool(config.trainer.fast_dev_run)
        if debug:  # writes nothing; Lightning 2.6 saves `last` at the end even under fast_dev_run
            config.checkpoint.save_last = False
            config.name = debug_run_name(config.name, config.ckpt_path)
        elif self.subcommand == "fit":
            config.name = fit_run_name(config.name, config.ckpt_path)
        else:
            config.name = eval_run_name(config.name, config.ckpt_path)
            self.save_config_kwargs["config_filename"] = f"{self.subcommand}-config.yaml"
        if config.checkpoint.dirpath is None:
            config.checkpoint.dirpath = str(CHECKPOINTS / config.name)
        if self.subcommand == "fit" and not debug and os.environ.get("LOCAL_RANK", "0") == "0":
            # temporary files a killed save left behind: this process holds the run (runs.lock_run)
            remove_partials(Path(config.checkpoint.dirpath))
        logger = config.trainer.logger
        if hasattr(logger, "init_args") and "name" in logger.init_args:
            logger.init_args.name = config.name
            logger.init_args.version = ""


def with_default_config(args: list[str]) -> list[str]:
    """Put `--config configs/default.yaml` first after the subcommand, so every other config overrides it.

    (A `--config` rather than jsonargparse's default_config_files: those drop the class_path of
    optimizer and scheduler callables in jsonargparse 4.53.)
    """
    if args and args[0] in ProjectCLI.subcommands() and DEFAULT_CONFIG.is_file():
        return [args[0], "--config", str(DEFAULT_CONFIG), *args[1:]]
    return list(args)


def main(args: list[str] | None = None) -> None:
    """Entry point of `python -m project`: user mistakes end in one message and exit status 2."""
    try:
        ProjectCLI(args=args)
    except UserError as e:
        print(f"error: {user_message(e)}", file=sys.stderr)
        sys.exit(2)
