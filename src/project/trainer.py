"""The Lightning Trainer plus a method for each subcommand of __main__.TRAINING that Lightning has not
(`export`, ...), which LightningCLI turns into subcommands (the commands with a CLI of their
own: __main__.COMMANDS)."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import Any

import lightning as L
import torch
from lightning.pytorch.accelerators import CPUAccelerator
from lightning.pytorch.plugins import LayerSync  # room: timm
from lightning.pytorch.plugins.io import CheckpointIO
from lightning.pytorch.strategies import DDPStrategy
from lightning.pytorch.utilities import rank_zero_info
from typing_extensions import override

from project.checkpoint_io import DISK_FULL, AtomicCheckpointIO, DiskFullError
from project.errors import UserError
from project.export import export_checkpoint, validation_images

# room: timm begin
from project.sync_batchnorm import SyncBatchNorm

# room: timm end


class Trainer(L.Trainer):
    """lightning.Trainer with atomic checkpoint files, `export` (ONNX + .pt2, verified) and the methods of
    the other subcommands of __main__.TRAINING."""

    # the command line of a finder, less the subcommand: what it tells the user to pass to fit
    command_args: list[str] = []

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        plugins = kwargs.get("plugins") or []
        plugins = list(plugins) if isinstance(plugins, list | tuple) else [plugins]
        if not any(isinstance(p, CheckpointIO) for p in plugins):  # a user's own CheckpointIO wins
            plugins.append(AtomicCheckpointIO())
        # room: timm begin
        if kwargs.get("sync_batchnorm") and not any(isinstance(p, LayerSync) for p in plugins):
            plugins.append(SyncBatchNorm())  # keeps timm's norm + activation layers whole
        # room: timm end
        kwargs["plugins"] = plugins
        super().__init__(*args, **kwargs)
        if kwargs.get("sync_batchnorm") and isinstance(self.strategy, DDPStrategy):
            _refuse_sync_batchnorm_on_cpu(self)
        checkpoint_io = self.strategy.checkpoint_io
        if isinstance(checkpoint_io, AtomicCheckpointIO):  # it removes files in these folders only
            checkpoint_io.folders = self.checkpoint_folders
            checkpoint_io.tuner_folder = lambda: self.default_root_dir

        if str(kwargs.get("precision")) in ("16-mixed", "16") and self.precision == "bf16-mixed":
            # Lightning warns once per process, in a warning that is easy to miss: said on every run
            rank_zero_info(
                "Precision: 16-mixed (float16) has no autocast on the CPU; this run uses bf16-mixed "
                "(bfloat16) instead."
            )

    def checkpoint_folders(self) -> list[str]:
        """The folders the ModelCheckpoint callbacks write to (set once the trainer is set up)."""
        return [str(callback.dirpath) for callback in self.checkpoint_callbacks if callback.dirpath]

    @override
    def fit(self, *args: Any, **kwargs: Any) -> None:
        with (
            disk_full_ends_in_one_line(self, "fit"),
            out_of_memory_ends_in_one_line(self),
            loader_stall_ends_in_one_line(self),
            checkpoints_written(self),
        ):
            super().fit(*args, **kwargs)

    @override
    def validate(self, *args: Any, **kwargs: Any) -> Any:
        with disk_full_ends_in_one_line(self, "validate"):
            return super().validate(*args, **kwargs)

    @override
    def test(self, *args: Any, **kwargs: Any) -> Any:
        with disk_full_ends_in_one_line(self, "test"):
            return super().test(*args, **kwargs)

    # room: memory begin
    def memory(self, model: L.LightningModule, datamodule: L.LightningDataModule) -> None:
        """Print the memory one training step needs at the configured batch size and precision, and advice.

        Args:
            model: The model as `fit` would build it.
            datamodule: Gives the batch size and image size.
        """
        from project.memory_budget import measure_step

        print(measure_step(model, self, datamodule.batch_size, datamodule.image_size))

    # room: memory end
    # room: pictures begin
    def show_batch(
        self,
        model: L.LightningModule,
        datamodule: L.LightningDataModule,
        output: str = "logs/batch.png",
        count: int = 12,
    ) -> None:
        """Write augmented training images with their labels, beside the validation view, to a PNG.

        Args:
            model: The model as `fit` would build it (unused: the data's own classes caption the images).
            datamodule: The data as `fit` would use it: its transforms and class names.
            output: The PNG to write.
            count: Images of each split.
        """
        from project.show_batch import write_batch_view

        if count < 1:
            raise UserError(f"--count {count} is not a number of images.", "pass 1 or more, e.g. --count 12.")
        written = write_batch_view(datamodule, Path(output), count, seed=torch.initial_seed() % 2**32)
        print(f"Wrote {count} training images (augmented) beside {count} validation images to {written}")

    # room: pictures end
    # room: tuning begin
    def lr_find(
        self,
        model: L.LightningModule,
        datamodule: L.LightningDataModule,
        min_lr: float = 1e-6,
        max_lr: float = 1.0,
        num_training: int = 100,
    ) -> None:
        """Learning-rate range test: print the suggested learning rate and the fit flag, and write the loss
        against the learning rate to logs/<run>/lr_find.png.

        Args:
            model: The model as `fit` would build it.
            datamodule: The data as `fit` would use it.
            min_lr: The first learning rate tried.
            max_lr: The last learning rate tried.
            num_training: Training steps, each at a higher learning rate (exponentially spaced).
        """
        from project.tuning import find_lr

        folder = Path(self.default_root_dir)
        # a small data set would run out of epochs before num_training steps (one batch an epoch at least)
        self.fit_loop.max_epochs = max(self.max_epochs or 1, num_training)
        find_lr(self, model, datamodule, folder, self.command_args, min_lr, max_lr, num_training)

    def batch_size_find(
        self,
        model: L.LightningModule,
        datamodule: L.LightningDataModule,
        mode: str = "power",
        init_val: int = 2,
        max_trials: int = 12,
        max_val: int = 1024,
        steps_per_trial: int = 2,
    ) -> None:
        """Find the largest batch that trains without running out of device memory; print the fit flag.

        Args:
            model: The model as `fit` would build it.
            datamodule: The data as `fit` would use it.
            mode: power (double until it fails) or binsearch (then bisect between the last two sizes).
            init_val: The first batch size tried.
            max_trials: At most this many sizes are tried.
            max_val: Never try a batch larger than this (on a CPU nothing else stops the search).
            steps_per_trial: Training steps run at each size.
        """
        from project.tuning import find_batch_size

        find_batch_size(
            self, model, datamodule, self.command_args, mode, init_val, max_trials, max_val, steps_per_trial
        )

    # room: tuning end
    def export(
        self,
        model: L.LightningModule,
        datamodule: L.LightningDataModule | None = None,
        ckpt_path: str | None = None,
        output_dir: str | None = None,
        **options: Any,
    ) -> None:
        """Export a checkpoint to ONNX and .pt2, verified against PyTorch, with a JSON sidecar.

        Args:
            model: Unused (the checkpoint holds the model); LightningCLI passes it.
            datamodule: Its validation images, when it has any on disk, are used for verification.
                They also fit the calibration.  # room: calibration
            ckpt_path: The checkpoint to export.
            output_dir: Where to write; default: next to the checkpoint.
            options: The fields of `project.export.ExportOptions` (`--opset`, `--format`, ...).
        """
        images = validation_images(datamodule)
        result = export_checkpoint(
            ckpt_path, images=images, output_dir=output_dir, datamodule=datamodule, **options
        )
        print(
            "Exported " + "\n         ".join(str(path) for path in [*result.files.values(), result.sidecar])
        )


def _refuse_sync_batchnorm_on_cpu(trainer: L.Trainer) -> None:
    # torch's DistributedDataParallel raises "SyncBatchNorm layers only work with GPU modules" from
    # deep inside each process once training starts: said here, once, before anything runs
    if isinstance(trainer.accelerator, CPUAccelerator):
        raise UserError(
            f"--trainer.sync_batchnorm=true needs GPUs: torch's SyncBatchNorm does not run in CPU processes "
            f"(this run: {trainer.world_size} CPU process(es), strategy {type(trainer.strategy).__name__}).",
            "drop --trainer.sync_batchnorm (each process then normalizes over its own batch), or train on "
            "GPUs (--trainer.accelerator=gpu).",
        )


@contextmanager
def checkpoints_written(trainer: L.Trainer) -> Iterator[None]:
    """Every checkpoint write asked for is complete when the block is left, however it is left.

    Lightning waits for them in its teardown, but an exception raised while it handles another (a
    logger that cannot flush to a full disk) skips that teardown. A write's own failure is raised
    here unless another error is already on its way.
    """
    try:
        yield
    except BaseException:
        checkpoint_io = trainer.strategy.checkpoint_io
        if isinstance(checkpoint_io, AtomicCheckpointIO):
            with suppress(Exception):
                checkpoint_io.teardown()
        raise
    checkpoint_io = trainer.strategy.checkpoint_io
    if isinstance(checkpoint_io, AtomicCheckpointIO):
        checkpoint_io.teardown()


@contextmanager
def disk_full_ends_in_one_line(trainer: L.Trainer, command: str) -> Iterator[None]:
    """A full disk under the logs (TensorBoard's writer thread, hparams.yaml, ...) stops the run with one
    DiskFullError instead of three tracebacks (the writer thread's, Lightning's ValueError, the failed
    flush in teardown). Stopping, not logging on without the logger: the checkpoints are usually on the
    same disk and would fail next, and a run whose curves silently end is worse than a clear stop."""
    previous = threading.excepthook

    def quiet_when_disk_full(args: threading.ExceptHookArgs) -> None:
        if _disk_full(args.exc_value) is None:  # the main thread reports a full disk, once
            previous(args)

    threading.excepthook = quiet_when_disk_full
    try:
        yield
    except UserError:
        raise  # already one line (a checkpoint that did not fit is a DiskFullError)
    except Exception as e:
        error = _disk_full(e)
        if error is None:
            raise
        raise _log_disk_full(trainer, error, command) from None
    finally:
        threading.excepthook = previous


@contextmanager
def out_of_memory_ends_in_one_line(trainer: L.Trainer) -> Iterator[None]:
    """Running out of memory mid-run (a larger batch of large images, a memory leak, another process on
    the GPU) ends in one message with the step, the batch size and the fixes, instead of the allocator's
    traceback. The checkpoints already written stay as they are: `--ckpt_path last` resumes."""
    try:
        yield
    except Exception as e:
        if not is_out_of_memory(e):
            raise
        size = getattr(trainer.datamodule, "batch_size", None) if trainer.datamodule is not None else None
        first_line = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise UserError(
            f"Out of memory at step {trainer.global_step} (epoch {trainer.current_epoch})"
            + (f" with --data.batch_size={size}" if size else "")
            + f" on {trainer.strategy.root_device}: {first_line[:200]}.",
            # room: tuning begin
            "find the largest batch that fits with `python -m project batch_size_find` "
            "(same flags), or "
            # room: tuning end
            "halve --data.batch_size and set --trainer.accumulate_grad_batches=2 (the same batch per "
            "optimizer step), or --trainer.precision=bf16-mixed; then resume with --ckpt_path last (the "
            "last checkpoint is kept).",
        ) from None


@contextmanager
def loader_stall_ends_in_one_line(trainer: L.Trainer) -> Iterator[None]:
    """A loader whose workers deliver no batch for --data.loader_timeout seconds (DataLoader's timeout)
    stops the run with one message naming each worker and the file it was reading."""
    try:
        yield
    except RuntimeError as e:
        if "DataLoader timed out" not in str(e):
            raise
        datamodule = trainer.datamodule
        reads = datamodule.stalled_reads() if hasattr(datamodule, "stalled_reads") else []
        timeout = getattr(datamodule, "loader_timeout", None)
        raise UserError(
            f"The data loader delivered no batch for {timeout or 'the timeout of'} seconds at step "
            f"{trainer.global_step}: a worker is stuck"
            + (f"; each worker was reading: {'; '.join(reads)}" if reads else "")
            + ".",
            "check that file and its file system (a stuck network mount, a file another process holds), "
            "then resume with --ckpt_path last; raise --data.loader_timeout if batches are merely slow.",
        ) from None


def is_out_of_memory(error: BaseException) -> bool:
    """torch's OutOfMemoryError (CUDA), or the CPU allocator's refusal (a RuntimeError)."""
    text = str(error)
    return isinstance(error, torch.OutOfMemoryError) or (
        isinstance(error, RuntimeError) and ("can't allocate memory" in text or "out of memory" in text)
    )


def _disk_full(error: BaseException | None) -> OSError | None:
    """The ENOSPC/EDQUOT OSError in `error`'s chain of causes and contexts, if any."""
    seen = set()
    while error is not None and id(error) not in seen:
        seen.add(id(error))
        if isinstance(error, OSError) and error.errno in DISK_FULL:
            return error
        error = error.__cause__ or error.__context__
    return None


def _log_disk_full(trainer: L.Trainer, error: OSError, command: str) -> DiskFullError:
    logs = getattr(trainer, "log_dir", None) or "logs/"
    where = f"'{error.filename}'" if error.filename else f"the run's logs (TensorBoard events in '{logs}')"
    problem = f"No space left on the disk ({error.strerror}) while writing {where}; `{command}` stopped."
    then = f"run `{command}` again"
    checkpoints = getattr(trainer.checkpoint_callback, "dirpath", None)
    if command == "fit" and checkpoints:
        saved = sorted(Path(checkpoints).glob("*.ckpt")) if Path(checkpoints).is_dir() else []
        problem += f" The checkpoints already written ({len(saved)} in '{checkpoints}') are intact."
        name = getattr(trainer.logger, "name", None) or Path(checkpoints).name
        then = (
            f"resume with --name {name} --ckpt_path last"
            if saved
            else "start the run again under a new --name (no checkpoint had been written yet)"
        )
    return DiskFullError(
        problem,
        f"free space on that disk (old runs in logs/ and checkpoints/, exports, caches) or set "
        f"--trainer.logger.init_args.save_dir to a disk with room, then {then}.",
    )
