"""`python -m project audit`: the options of `fit` (the same parser, --config and default.yaml) plus a few.

The parser is ProjectCLI's own, built without subcommands (LightningCLI's run=False): every `--data.*`,
`--model.*`, `--trainer.*` and `--config` that fit accepts means the same here, with the same links
(classes, image size) and checks. Nothing is trained through `fit`: folds.py trains k short runs.
"""

from __future__ import annotations

import importlib.util
import signal
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
from torch.utils.data import Subset
from typing_extensions import override

from project.audit.data import AuditDataModule, combined
from project.audit.duplicates import Thresholds, find_duplicates, joint_embedding
from project.audit.folds import Recipe, default_epochs, make_folds, train_folds
from project.audit.images import read_images
from project.audit.labels import find_label_issues
from project.audit.outliers import outlier_percentiles
from project.audit.report import Findings, summary, write_clean_list, write_findings
from project.audit.stop import Stopped, raise_if_stopped, stop_on_ctrl_c
from project.audit.timing import default_folds, measure_step, plan_folds, runs_on_cpu
from project.cli import ProjectCLI, apply_backbone_defaults, config_folder, packaged_configs, parse_or_refuse
from project.config_checks import check_cli_config, positive_int, require
from project.data.dataset import ImageDataset
from project.errors import UserError, exits_on_user_error, missing_package
from project.runs import LOGS, lock_run, new_run_name

# fit's Trainer options that also shape the fold runs; devices, logger and checkpoints are the audit's
TRAINER_KEYS = (
    "accelerator",
    "precision",
    "gradient_clip_val",
    "gradient_clip_algorithm",
    "accumulate_grad_batches",
    "deterministic",
    "benchmark",
    "limit_train_batches",
)


class AuditCLI(ProjectCLI):
    """fit's parser without subcommands, plus the audit's options; builds the model and data, no trainer."""

    def __init__(self, args: list[str]) -> None:
        super().__init__(args=args, run=False)

    @override
    def init_parser(self, **kwargs: Any) -> Any:
        kwargs["prog"] = "python -m project audit"
        kwargs["description"] = (
            "Find likely wrong labels, duplicates, train/val leaks and outliers: k-fold out-of-fold "
            "predictions with the configured model and data (the options of fit), ranked for review in "
            "logs/<name>/audit/. Never changes a data file."
        )
        return super().init_parser(**kwargs)

    @override
    def add_core_arguments_to_parser(self, parser: Any) -> None:
        self._datamodule_class = AuditDataModule  # fit's options; also audits data with no split
        super().add_core_arguments_to_parser(parser)

    @override
    def add_arguments_to_parser(self, parser: Any) -> None:
        super().add_arguments_to_parser(parser)
        parser.add_argument(
            "--folds",
            type=int | None,
            default=None,
            help="Folds: each image is predicted by a model trained on the others; default: 5, on a CPU 3.",
        )
        parser.add_argument(
            "--epochs",
            type=int | None,
            default=None,
            help="Epochs per fold; default: sized for the data (about 8,000 training images seen per fold, "
            "3 to 15), on a CPU lowered (not below 3) to train for about 5 minutes by a measured step time.",
        )
        parser.add_argument(
            "--hash_distance",
            type=int,
            default=16,
            help="Near duplicates: perceptual hashes (64 bits) at most this many bits apart...",
        )
        parser.add_argument(
            "--color_distance",
            type=float,
            default=10.0,
            help="...and 8x8 colour thumbnails at most this far apart (mean absolute difference, 0-255); "
            "up to twice this when the embeddings are at least --similarity alike.",
        )
        parser.add_argument(
            "--similarity",
            type=float,
            default=0.98,
            help="Near duplicates: mean cosine similarity of the fold models' embeddings that vouches for "
            "a pair whose colours moved (crops).",
        )
        parser.add_argument(
            "--outlier_percentile",
            type=float,
            default=0.01,
            help="Outliers: images less typical than this share of their fold's training images.",
        )
        parser.add_argument("--top", type=int, default=40, help="Findings of each kind shown in report.html.")
        parser.add_argument(
            "--write_clean",
            type=str | None,
            default=None,
            help="Also write this file: "
            "the files to keep (readable, not flagged, one of each duplicate group), one "
            "per line relative to --data.root. No image is ever moved or deleted.",
        )

    @override
    def parse_arguments(self, parser: Any, args: list[str] | None) -> None:
        """configs/default.yaml first, as for every fit, then the user's configs and flags."""
        args = packaged_configs(list(args or []))
        self.config = parse_or_refuse(parser, ["--config", str(config_folder() / "default.yaml"), *args])

    @override
    def before_instantiate_classes(self) -> None:
        check_cli_config(self.config)
        check_audit_options(self.config)
        apply_backbone_defaults(self.config)  # image size, crop and filter, as fit takes them

    @override
    def instantiate_classes(self) -> None:
        """Model and data as fit builds them (links included); each fold makes its own trainer."""
        self.config_init = self.parser.instantiate_classes(self.config)
        self.datamodule = self.config_init["data"]
        self.model = self.config_init["model"]


def check_audit_options(config: Any) -> None:
    if config.folds is not None:
        require(isinstance(config.folds, int) and config.folds >= 2, "folds", config.folds, "an integer >= 2")
    if config.epochs is not None:
        positive_int("epochs", config.epochs)
    require(0 <= config.hash_distance <= 64, "hash_distance", config.hash_distance, "an integer in [0, 64]")
    require(
        0 <= config.color_distance <= 255, "color_distance", config.color_distance, "a number in [0, 255]"
    )
    require(-1 <= config.similarity <= 1, "similarity", config.similarity, "a number in [-1, 1]")
    require(0 <= config.outlier_percentile < 1, "outlier_percentile", config.outlier_percentile, "in [0, 1)")
    positive_int("top", config.top)
    check_recipe_not_used(config)


def check_recipe_not_used(config: Any) -> None:
    """The folds train a plain short recipe (no sampler, batch mixing or weight averaging: their loaders
    and trainers are the audit's own), and confident learning wants the plain model's probabilities, not
    reweighted or mixed ones: fit's options that change the recipe are refused, not ignored."""
    used: list[str] = []
    overrides: list[str] = []
    # room: recipes begin
    data = config.data
    used += [f"--data.balance={data.balance}"] if data.get("balance", "none") != "none" else []
    used += [f"--data.{k}={data[k]}" for k in ("mixup_alpha", "cutmix_alpha") if data.get(k)]
    overrides += ["--data.balance=none", "--data.mixup_alpha=0", "--data.cutmix_alpha=0"]
    # room: recipes end
    # room: ema begin
    ema = config.get("ema")
    used += [f"--ema.decay={ema.decay}"] if ema is not None and ema.get("decay") is not None else []
    overrides += ["--ema.decay=null"]
    # room: ema end
    if used:
        raise UserError(
            f"audit does not use {', '.join(used)}: its fold models train a plain recipe, so that the "
            "out-of-fold probabilities it ranks labels by are a plain model's (not reweighted, mixed or "
            "averaged).",
            f"leave {'them' if len(used) > 1 else 'it'} out for the audit (a --config of fit's with "
            f"them: override with {' '.join(overrides)}).",
        )


def audit(cli: AuditCLI) -> Findings:
    """Read, fold, train, rank and write: the whole audit of the configured data."""
    config, data = cli.config, cli.datamodule
    started = time.perf_counter()
    index, split_of = combined(data.splits, data.root)
    clean = check_clean_path(config.write_clean, data.root)
    out = audit_folder(config.name)
    side = round(data.image_size / data.crop_ratio)
    print(f"Reading {len(index):,} images of {data.num_classes} classes from '{data.root}' (read only)...")
    images = read_images(index, side, data.num_workers)
    good = images.good
    recipe = Recipe(
        trainer_kwargs={k: config.trainer[k] for k in TRAINER_KEYS if config.trainer.get(k) is not None},
        epochs=0,  # planned below, from a measured step time
        batch_size=data.batch_size,
        num_workers=data.num_workers,
        seed=int(config.seed_everything or 0),
        progress=config.trainer.get("enable_progress_bar") is not False,
    )
    folds = config.folds or default_folds(runs_on_cpu(recipe))
    if len(good) < 2 * folds:
        raise UserError(
            f"Only {len(good)} readable images in '{data.root}': too few for --folds={folds}.",
            "audit a data set with at least a few images per class per fold, or lower --folds.",
        )
    labels = index.labels[good]
    fold_of = make_folds(labels, folds, int(config.seed_everything or 0))
    train_rows = int(len(good) * (folds - 1) / folds)
    train_data = Subset(ImageDataset(index, data.train_transform, cache=images.decoded), good.tolist())
    print("Timing a few training steps...")
    step = measure_step(cli.model, train_data, np.arange(len(good)), recipe)
    plan = plan_folds(step, folds, config.epochs, default_epochs(train_rows), train_rows, len(good), recipe)
    recipe = replace(recipe, epochs=plan.epochs)
    print(plan.describe())
    outputs = train_folds(
        cli.model,
        train_data,
        Subset(ImageDataset(index, data.eval_transform, cache=images.decoded), good.tolist()),
        fold_of,
        recipe,
    )
    findings = Findings(
        index=index,
        split_of=split_of,
        good=good,
        images=images,
        outputs=outputs,
        issues=find_label_issues(
            labels,
            outputs.probabilities,
            getattr(cli.model, "threshold", 0.5),  # room: multilabel
        ),
        pairs=find_duplicates(
            [images.digests[i] for i in good],
            images.hashes[good],
            images.thumbs[good],
            joint_embedding(outputs.all_embeddings),
            split_of[good],
            Thresholds(config.hash_distance, config.color_distance, config.similarity),
        ),
        outlier_percentile=outlier_percentiles(outputs.all_embeddings, fold_of),
        outlier_limit=config.outlier_percentile,
        top=config.top,
        seconds=0.0,
    )
    findings.seconds = time.perf_counter() - started
    raise_if_stopped()  # a Ctrl-C whose raise was lost (in cleanlab's pool) stops before anything is written
    write_findings(findings, out)
    if clean is not None:
        write_clean_list(findings, clean)
    print(summary(findings, out, clean))
    return findings


def audit_folder(name: str | None) -> Path:
    """logs/<name>/audit: a new run by default; an existing run (e.g. a fit's) if it has no audit yet."""
    if name is None:
        name = new_run_name()
    else:
        lock_run(name)
    out = LOGS / name / "audit"
    if out.exists():
        raise UserError(
            f"'{out}' already exists: an audit never overwrites another.",
            "pick another --name, or leave --name out for a new run.",
        )
    return out


def check_clean_path(dest: str | None, root: Path) -> Path | None:
    """--write_clean's file: never inside the data folder (read only), never over an existing file."""
    if dest is None:
        return None
    path = Path(dest)
    if path.resolve().is_relative_to(root.resolve()):
        raise UserError(
            f"--write_clean '{dest}' is inside the data folder '{root}', which the audit only reads.",
            "write the list elsewhere, e.g. --write_clean=keep.txt.",
        )
    if path.exists():
        raise UserError(f"--write_clean '{dest}' already exists.", "pass a new file name.")
    return path


def require_cleanlab() -> None:
    """cleanlab (and scikit-learn with it) is the `audit` extra: say how to install it."""
    if importlib.util.find_spec("cleanlab") is None or importlib.util.find_spec("sklearn") is None:
        raise missing_package("`audit` (confident learning)", "audit", "cleanlab")


@exits_on_user_error
def main(argv: list[str]) -> None:
    """Entry point of `python -m project audit`; a first Ctrl-C stops it with nothing half-written."""
    try:
        with stop_on_ctrl_c():
            require_cleanlab()
            cli = AuditCLI(argv)
            try:
                audit(cli)
            finally:
                cli.datamodule.close()  # the images of shards, copied for the audit
    except Stopped:
        sys.stdout.flush()
        print(
            "\nStopped by Ctrl-C. Nothing is half-written: logs/<run>/audit/ and the --write_clean list "
            "appear whole or not at all, and the data folder is only read.",
            file=sys.stderr,
        )
        sys.exit(128 + signal.SIGINT)
