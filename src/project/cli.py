"""The command line: LightningCLI with our defaults, links, run names and one-line user errors."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

from jsonargparse import ArgumentError, Namespace
from lightning.pytorch.callbacks import Callback, LearningRateMonitor, ModelCheckpoint
from lightning.pytorch.cli import LightningArgumentParser, LightningCLI
from lightning.pytorch.loggers import Logger  # room: trackers
from typing_extensions import override

# room: trackers begin
from project import trackers

# room: trackers end
from project.__main__ import COMMANDS, TRAINING
from project.atomic import remove_partials
from project.backbones import preprocessing
from project.callbacks import (
    EMA,  # room: ema
    CheckpointPaths,
    CompactModelSummary,  # room: console
    ConfusionMatrix,  # room: pictures
    DataCheck,
    EpochLines,  # room: console
    ExportBest,
    GracefulStop,
    GradNormMonitor,
    HParams,  # room: dashboard
    Misclassified,  # room: pictures
    NonFiniteGuard,
    PredictionWriter,
    RNGState,
    RunSummary,
    ScalarsLayout,  # room: dashboard
    Throughput,  # room: dashboard
    TrackerArtifacts,  # room: trackers
    TrainingImages,  # room: pictures
)

# room: explain begin
from project.callbacks.grad_cam import GradCam

# room: explain end
from project.callbacks.save_config import AtomicSaveConfig
from project.checkpoint_values import checkpoint_layer
from project.config_checks import check_cli_config
from project.data.datamodule import ImageDataModule
from project.data.shapes import IMAGE_SIZE as SHAPES_IMAGE_SIZE
from project.errors import UserError, exits_on_user_error, usage_error
from project.metrics import MONITOR
from project.model import ImageClassifier
from project.quiet import quiet_lightning
from project.runs import (
    CHECKPOINTS,
    LOGS,
    check_run_name,
    debug_run_name,
    eval_run_name,
    fit_run_name,
    newest_run,
    release_runs,
)
from project.trainer import Trainer


def checkpoint_filename(monitor: str) -> str:
    """Checkpoint names carry the monitored metric: `epoch=004-val_balanced_acc=0.8123` (val/balanced_acc)."""
    return f"epoch={{epoch:03d}}-{monitor.replace('/', '_')}={{{monitor}:.4f}}"


# Subcommands that evaluate a trained model: its classes, image size and data settings come from
# --ckpt_path (project.checkpoint_values), flags override them; the data's classes are checked against it.
CHECKPOINT_ONLY = tuple(name for name, kind in TRAINING.items() if kind == "checkpoint")
DEFAULT_FILENAME = checkpoint_filename(MONITOR)  # another --checkpoint.monitor puts its own in the name
# Subcommands that only look at the configured model and data: no checkpoint, no run folder.
DRY = tuple(name for name, kind in TRAINING.items() if kind == "dry")
# Subcommands that try training steps on the configured model and data (Lightning's Tuner), then print
# the flag to pass to fit: no checkpoint; lr_find leaves its plot in logs/<name>/.
FINDERS = tuple(name for name, kind in TRAINING.items() if kind == "finder")

# Every callback of the template, in one table: flag group -> (class, defaults). Each is on in every
# command, with its arguments as flags and YAML keys (`--predictions.top_k`, `predictions: {top_k: ...}`);
# those with an `enabled` argument can be switched off. A new callback is one line here (docs/new-task.md).
# `trainer.callbacks` in a config or `--trainer.callbacks+=CLASS` is left for a run's extras (e.g.
# configs/presets/early_stopping.yaml), so adding one never repeats these.
CALLBACKS: dict[str, tuple[type[Callback], dict[str, Any]]] = {
    "checkpoint": (
        ModelCheckpoint,
        {
            "monitor": MONITOR,
            "mode": "max",
            "save_top_k": 3,
            "save_last": True,
            "filename": DEFAULT_FILENAME,
            "auto_insert_metric_name": False,
            # a run resumed after a kill redoes the epoch whose checkpoint may already exist: replace
            # it (atomically) instead of keeping both as `name.ckpt` and `name-v1.ckpt`
            "enable_version_counter": False,
        },
    ),
    "lr_monitor": (LearningRateMonitor, {"logging_interval": "step"}),
    # room: ema begin
    # off unless --ema.decay: validation, checkpoints and the export get the averaged weights
    "ema": (EMA, {}),
    # room: ema end
    "predictions": (PredictionWriter, {}),
    "explain": (GradCam, {}),  # room: explain
    "export_best": (ExportBest, {}),
    "data_check": (DataCheck, {}),
    "non_finite": (NonFiniteGuard, {}),
    "grad_norm": (GradNormMonitor, {}),
    # monitoring: what TensorBoard shows besides the scalars  # room: pictures, dashboard
    "training_images": (TrainingImages, {}),  # room: pictures
    "confusion_matrix": (ConfusionMatrix, {}),  # room: pictures
    "misclassified": (Misclassified, {}),  # room: pictures
    "throughput": (Throughput, {}),  # room: dashboard
    "hparams": (HParams, {}),  # room: dashboard
}
# Always on, without flags: the exact-resume RNG state, the clean stop on Ctrl-C/SIGTERM, the
# check of the file paths a resumed checkpoint's ModelCheckpoint state names,
# TensorBoard's layout (accuracy and loss first),  # room: dashboard
# the files the trackers get when fit ends (nothing without one),  # room: trackers
# and the block that ends a fit (after GracefulStop's, whose checkpoint it names).
BUILT_IN: tuple[type[Callback], ...] = (
    RNGState,
    GracefulStop,
    CheckpointPaths,
    ScalarsLayout,  # room: dashboard
    TrackerArtifacts,  # room: trackers
    RunSummary,
)
# room: console begin
# What the console shows, where the trainer's own flags leave it on (console_callbacks): the model summary
# without a FLOPs column, and per-epoch lines instead of the progress bar when stdout is not a terminal.
CONSOLE: tuple[type[Callback], ...] = (CompactModelSummary, EpochLines)
# room: console end


class ProjectCLI(LightningCLI):
    """The subcommands of __main__.TRAINING (fit, validate, ..., export), each from configs/default.yaml."""

    @staticmethod
    @override
    def subcommands() -> dict[str, set[str]]:
        own = LightningCLI.subcommands()  # fit, validate, test, predict
        return {name: own.get(name, {"model", "datamodule"}) for name in TRAINING}

    def __init__(self, args: list[str] | None = None, **kwargs: Any) -> None:
        quiet_lightning()
        given = sys.argv[1:] if args is None else args
        # only the subcommand the command line names gets its options (reading the signatures of the
        # model, data module and Trainer for the other eight took about half a second of a refused
        # command line); without one (`--help`, a misspelt name) every subcommand gets them
        self._named = given[0] if given and given[0] in self.subcommands() else None
        super().__init__(
            ImageClassifier,
            ImageDataModule,
            trainer_class=Trainer,
            args=args,
            parser_kwargs={
                "prog": "python -m project",
                "description": "Train, evaluate, predict with and export image classifiers. Also: "
                + "python -m project "
                + ", ".join(f"{name} ({what})" for name, (_, what, _) in COMMANDS.items())
                + "; each with --help.",
                # a refused command line is raised (see parse_or_refuse), not printed with the usage
                "exit_on_error": False,
            },
            save_config_callback=AtomicSaveConfig,
            save_config_kwargs={"overwrite": True},
            trainer_defaults={"callbacks": [callback() for callback in BUILT_IN]},  # per command: below
            auto_configure_optimizers=False,
            **kwargs,
        )

    @override
    def _prepare_subcommand_parser(
        self, klass: type, subcommand: str, **kwargs: Any
    ) -> LightningArgumentParser:
        # add_arguments_to_parser needs to know which subcommand it builds (see CHECKPOINT_ONLY);
        # private Lightning API, checked against lightning 2.6 (the pin is <2.7)
        self._building = subcommand
        if self._named not in (None, subcommand):
            return LightningArgumentParser(**kwargs)  # never parsed: the command line names another
        parser = super()._prepare_subcommand_parser(klass, subcommand, **kwargs)
        self._subcommand_parsers = {**getattr(self, "_subcommand_parsers", {}), subcommand: parser}
        return parser

    @override
    def parse_arguments(self, parser: LightningArgumentParser, args: list[str] | None) -> None:
        """default.yaml, then the checkpoint's own settings (validated), then the user's configs and flags."""
        args = sys.argv[1:] if args is None else args
        self.command_args = list(args[1:])
        # a first pass finds --ckpt_path; --print_config would print (and exit) before the layer is in
        plain = [a for a in args if not a.startswith("--print_config")]
        # a refusal names the subcommand's own options and its --help
        refusing = self._subcommand_parsers.get(self._named, parser)
        self.config = parse_or_refuse(parser, with_default_config(plain), refusing)
        subcommand = self.config.get("subcommand")
        ckpt_path = self.config[subcommand].get("ckpt_path") if subcommand else None
        name = self.config[subcommand].get("name") if subcommand else None
        if subcommand != "fit" and ckpt_path == "last":
            ckpt_path = str(last_checkpoint(name))
        # `fit --ckpt_path last` keeps `last` (the run it resumes is claimed by name) but reads that file
        read = resumed_checkpoint(name) if subcommand == "fit" and ckpt_path == "last" else ckpt_path
        layer = checkpoint_layer(read, subcommand) if is_file(read) else None
        self.checkpoint_classes = layer["model"].get("class_names") if layer else None
        layers = [json.dumps(layer)] if layer else []
        if layers or plain != args:
            self.config = parse_or_refuse(parser, with_default_config(args, *layers), refusing)
        if ckpt_path:
            self.config[subcommand].ckpt_path = ckpt_path

    @override
    def instantiate_classes(self) -> None:
        super().instantiate_classes()
        if self.subcommand in FINDERS:
            self.trainer.command_args = self.command_args
        if self.subcommand == "fit":
            self._check_resumed_classes()

    def _check_resumed_classes(self) -> None:
        """A resumed fit's data has the checkpoint's classes: the head is sized and ordered by them.

        (validate, test and predict check this in the data module; fit links the model's classes to the
        data's, so a mismatch would surface as PyTorch's size mismatch loading the weights, or not at all.)
        """
        data_classes = list(self.datamodule.class_names)  # linked to the model's: every data module has them
        if self.checkpoint_classes is None or list(self.checkpoint_classes) == data_classes:
            return
        config = self.config[self.subcommand]
        where = config.data.get("root") or "the embedded shapes data set"
        raise UserError(
            f"Checkpoint '{config.ckpt_path}' was trained on classes {list(self.checkpoint_classes)}, "
            f"but the data to resume on ('{where}') has {data_classes}.",
            "resume on the run's own data (leave out --data.root: resuming takes it from the checkpoint), "
            "or start a new run on this data without --ckpt_path.",
        )

    @override
    def _parse_ckpt_path(self) -> None:
        """Nothing: parse_arguments already took the checkpoint's settings, as data, below the user's flags.

        (LightningCLI's own version, private API checked against lightning 2.6, merges the checkpoint's
        hyper-parameters unchecked and over the command line: a `class_path` there would be imported.)
        """

    @override
    def add_arguments_to_parser(self, parser: LightningArgumentParser) -> None:
        parser.add_argument(
            "--name",
            type=str | None,
            default=None,
            help="Run name: logs/<name> and checkpoints/<name>. Default: a new time stamp; "
            "with --ckpt_path last, the newest run.",
        )
        # room: trackers begin
        parser.add_argument(
            "--trackers",
            type=list[Logger] | None,
            default=None,
            help="Experiment trackers logged to beside trainer.logger (TensorBoard): Lightning's loggers, "
            "e.g. --config configs/presets/mlflow.yaml (also wandb.yaml, csv.yaml).",
        )
        # room: trackers end
        for group, (callback, defaults) in CALLBACKS.items():
            parser.add_lightning_class_args(callback, group)
            parser.set_defaults({f"{group}.{key}": value for key, value in defaults.items()})
        if getattr(self, "_building", None) not in CHECKPOINT_ONLY:
            for key in (
                "num_classes",
                "class_names",
                "image_size",
                "task",  # room: multilabel
                "class_weights",  # room: recipes
            ):
                parser.link_arguments(f"data.{key}", f"model.{key}", apply_on="instantiate")

    @override
    def before_instantiate_classes(self) -> None:
        config = self.config[self.subcommand]
        check_cli_config(config)
        callbacks = [callback() for callback in BUILT_IN]
        callbacks += console_callbacks(self.subcommand, config)  # room: console
        self.trainer_defaults["callbacks"] = callbacks
        apply_backbone_defaults(config)
        # room: trackers begin
        if self.subcommand in DRY + FINDERS:
            config.trackers = None
        trackers.require_packages(config.trackers or [])
        # room: trackers end
        if self.subcommand in DRY:
            config.trainer.logger = False
            return
        if self.subcommand in FINDERS:
            config.trainer.logger = False
            config.name = eval_run_name(config.name, None)
            config.trainer.default_root_dir = str(LOGS / config.name)  # the plot and the Tuner's restore file
            config.checkpoint.dirpath = str(CHECKPOINTS / config.name)  # nothing is saved there
            self.save_config_kwargs["config_filename"] = f"{self.subcommand}-config.yaml"
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
        monitor = config.checkpoint.monitor
        if config.checkpoint.filename == DEFAULT_FILENAME and monitor not in (None, MONITOR):
            config.checkpoint.filename = checkpoint_filename(monitor)
        if config.checkpoint.dirpath is None:
            config.checkpoint.dirpath = str(CHECKPOINTS / config.name)
        if self.subcommand == "fit" and not debug and os.environ.get("LOCAL_RANK", "0") == "0":
            # temporary files a killed save left behind: this process holds the run (runs.lock_run)
            remove_partials(Path(config.checkpoint.dirpath))
        logger = config.trainer.logger
        if hasattr(logger, "init_args") and "name" in logger.init_args:
            logger.init_args.name = config.name
            # validate/test/predict log to logs/<name>/<subcommand>/, a TensorBoard run of its own: in the
            # fit's folder their step-0 points would end the fit's series there (TensorBoard drops the
            # later points of a tag whose steps go back) and `report` would draw them as the fit's
            logger.init_args.version = "" if self.subcommand == "fit" else self.subcommand
        trackers.configure(config.trackers or [], config.name, self.subcommand)  # room: trackers

    # room: trackers begin
    @override
    def instantiate_trainer(self, **kwargs: Any) -> Trainer:
        """The trainer, logging to `trainer.logger` (TensorBoard) and to each of `trackers`."""
        added = self.config_init[self.subcommand].get("trackers") or []
        if added:
            logger = self.config_init[self.subcommand]["trainer"].get("logger")
            kwargs["logger"] = trackers.beside(logger, added)
        return super().instantiate_trainer(**kwargs)

    # room: trackers end


# room: console begin
def console_callbacks(subcommand: str, config: Any) -> list[Callback]:
    """CONSOLE's callbacks for this command, each only where the trainer's flag leaves it on
    (Lightning refuses a progress bar callback with enable_progress_bar=false)."""
    callbacks: list[Callback] = []
    if config.trainer.enable_model_summary is not False:
        callbacks.append(CompactModelSummary())
    if subcommand == "fit" and config.trainer.enable_progress_bar is not False and not sys.stdout.isatty():
        callbacks.append(EpochLines())
    return callbacks


# room: console end


def resumed_checkpoint(name: str | None) -> str | None:
    """The file `fit --ckpt_path last` resumes from, or None when there is none (fit then says so)."""
    check_run_name(name)
    if name is None:
        try:
            name = newest_run()
        except UserError:
            return None
    found = sorted((CHECKPOINTS / name).glob("last*.ckpt"))
    return str(found[0]) if found else None


def is_file(path: str | None) -> bool:
    return path is not None and Path(path).is_file()


def last_checkpoint(name: str | None) -> Path:
    """`--ckpt_path last` outside fit: the last checkpoint of run --name, or of the newest run."""
    name = name or newest_run()
    found = sorted((CHECKPOINTS / name).glob("last*.ckpt"))
    if not found:
        raise UserError(
            f"--ckpt_path last: run '{name}' has no last checkpoint in '{CHECKPOINTS / name}'.",
            "check --name (runs are the folders in checkpoints/), or pass --ckpt_path PATH to a .ckpt file.",
        )
    return found[0]


def apply_backbone_defaults(config: Namespace) -> None:
    """The data options left null take the backbone's: image size, crop and resize filter."""
    pretrained = preprocessing(config.model.backbone, config.model.weights)
    if config.data.image_size is None:
        config.data.image_size = default_image_size(config.model, pretrained)
    if config.data.crop_ratio is None:  # the crop the backbone's pretrained weights were made with
        config.data.crop_ratio = pretrained["crop_pct"]
    if config.data.interpolation is None:  # and their resize filter (timm's are bilinear or bicubic)
        config.data.interpolation = pretrained["interpolation"]


def default_image_size(model: Namespace, pretrained: dict[str, Any]) -> int:
    """`--data.image_size` when not given: a resumed checkpoint's, else the pretrained weights' input size
    (224 for most), else the embedded shapes' 64 px (a network from scratch has no size of its own)."""
    if model.get("image_size") is not None:  # --ckpt_path: the size the run was trained at
        return int(model.image_size)
    if model.get("weights") is not None:
        return int(pretrained["input_size"])
    return SHAPES_IMAGE_SIZE


def config_folder() -> Path:
    """configs/: inside the installed package, or beside src/ in a checkout (and an editable install)."""
    here = Path(__file__).resolve().parent
    for folder in (here / "configs", here.parents[1] / "configs"):
        if (folder / "default.yaml").is_file():
            return folder
    raise UserError(
        f"configs/default.yaml was not found in '{here}' (installed package) nor in "
        f"'{here.parents[1]}' (source checkout): without it every option would silently take another "
        "default.",
        "reinstall the package (`pip install .` from a checkout ships the configs) or run from the checkout.",
    )


def parse_or_refuse(
    parser: LightningArgumentParser, args: list[str], refusing: LightningArgumentParser | None = None
) -> Namespace:
    """`parser.parse_args(args)`; a value of the wrong type, an unknown or a missing argument is one
    UserError with a fix, where jsonargparse printed its usage (147 lines for fit) and a bare `error:`.
    `refusing`: the parser whose options and --help the message names (the subcommand's)."""
    try:
        return parser.parse_args(args)
    except ArgumentError as e:
        refusing = refusing or parser
        # jsonargparse names a subcommand's parser "python -m project [options] fit"
        prog = refusing.prog.replace(" [options]", "")
        raise usage_error(str(e), prog, refusing._option_string_actions) from None


def with_default_config(args: list[str], *layers: str) -> list[str]:
    """Put `--config configs/default.yaml` (then each layer) first after the subcommand, so every
    config and flag the user gives overrides them.

    (A `--config` rather than jsonargparse's default_config_files: those drop the class_path of
    optimizer and scheduler callables in jsonargparse 4.53.)
    """
    if args and args[0] in ProjectCLI.subcommands():
        configs = [str(config_folder() / "default.yaml"), *layers]
        rest = packaged_configs(args[1:])
        return [args[0], *(item for config in configs for item in ("--config", config)), *rest]
    return list(args)


def packaged_configs(args: list[str]) -> list[str]:
    """`--config configs/...` (the docs' paths) from the package's configs/ when the working folder has
    no such file: an installed copy has its presets and experiments inside the package."""
    resolved, after_flag = [], False
    for arg in args:
        if after_flag:
            arg = packaged_config(arg)
        elif arg.startswith("--config="):
            arg = "--config=" + packaged_config(arg.removeprefix("--config="))
        after_flag = arg == "--config"
        resolved.append(arg)
    return resolved


def packaged_config(path: str) -> str:
    """`path` itself when it exists (or is not under configs/), else the packaged file of that name."""
    parts = Path(path).parts
    if Path(path).exists() or len(parts) < 2 or parts[0] != "configs":
        return path
    packaged = config_folder().joinpath(*parts[1:])
    return str(packaged) if packaged.is_file() else path


@exits_on_user_error
def main(args: list[str] | None = None) -> None:
    """Entry point of the LightningCLI subcommands (fit, validate, export, lr_find, ...)."""
    try:
        ProjectCLI(args=args)
    finally:
        release_runs()  # finished, stopped or refused: the run's lock (and an empty run folder) goes
