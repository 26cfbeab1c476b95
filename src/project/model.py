"""ImageClassifier: a torchvision or timm backbone with a new head, its loss, metrics, optimizer, schedule."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Literal

import lightning as L
import torch
import torch.nn.functional as F
from lightning.pytorch.callbacks import Timer
from lightning.pytorch.cli import LRSchedulerCallable, OptimizerCallable
from lightning.pytorch.plugins.precision import MixedPrecision
from torch import nn
from torch.optim.lr_scheduler import ReduceLROnPlateau
from torchmetrics import MaxMetric, MeanMetric, MetricCollection
from torchmetrics.classification import (
    MulticlassAccuracy,
    MultilabelAccuracy,  # room: multilabel
)
from typing_extensions import override

from project.backbones import build_backbone, fix_batchnorm, preprocessing
from project.backbones import freeze_backbone as set_frozen
from project.config_checks import positive_int, require
from project.errors import UserError

# room: finetune begin
from project.finetune import depth_groups

# room: finetune end
from project.metrics import (
    classification_metrics,
    multilabel_metrics,  # room: multilabel
    per_label_metrics,  # room: multilabel
)
from project.optim import build_optimizer, match_state_layout
from project.schedulers import WarmupCosineLR


# room: multilabel begin
def is_multilabel(model: object) -> bool:
    """Whether `model` gives each image any number of labels (its `task`); without a task: one class."""
    return getattr(model, "task", "multiclass") == "multilabel"


# room: multilabel end


def refuse_plain_learnt_tensors(model: nn.Module) -> None:
    """A tensor that requires grad, assigned to a module as a plain attribute (`self.scale = torch.ones(3,
    requires_grad=True)`), is no parameter: the optimizer never updates it, checkpoints do not save it and
    `.to(device)` leaves it behind, while the run trains on as if it were learnt. Named before training."""
    found = [
        f"{name}.{attribute}" if name else attribute
        for name, module in model.named_modules()
        for attribute, value in vars(module).items()
        if isinstance(value, torch.Tensor) and value.requires_grad and not isinstance(value, nn.Parameter)
    ]
    if found:
        raise UserError(
            f"The model has {len(found)} tensor(s) that require grad but are plain attributes, not "
            f"parameters: {', '.join(found[:5])}{' ...' if len(found) > 5 else ''}. The optimizer never "
            "updates them, checkpoints do not save them and they do not move with the model to the GPU.",
            "wrap each in torch.nn.Parameter where the module sets it (self.scale = nn.Parameter(tensor)), "
            "or self.register_buffer(name, tensor) if it is not learnt.",
        )


def grouped_convolutions(net: nn.Module) -> bool:
    """Whether the network has grouped or depthwise convolutions: the families that run faster
    channels-last on the CPU (docs/benchmarks.md, "channels-last and torch.compile on the CPU")."""
    return any(isinstance(m, nn.Conv2d) and m.groups > 1 for m in net.modules())


def label_names(model: object, count: int | None = None) -> list[str]:
    """`model.class_names`, or "0", "1", ... for a model without names (`count`, default its num_classes)."""
    names = getattr(model, "class_names", None)
    if names:
        return list(names)
    return [str(i) for i in range(model.hparams["num_classes"] if count is None else count)]


# room: recipes begin
def check_class_weights(class_weights: list[float] | None, num_classes: int) -> None:
    """One positive, finite weight per class."""
    if class_weights is None:
        return
    require(
        len(class_weights) == num_classes and all(math.isfinite(w) and w > 0 for w in class_weights),
        "model.class_weights",
        class_weights,
        f"a list of {num_classes} positive numbers, one per class",
    )


# room: recipes end
def check_pixel_values(images: torch.Tensor) -> None:
    """Refuse float images that are not on the 0-255 scale the model takes (ValueError saying what to pass).

    A float 0-1 tensor (torchvision's ToTensor) or an already normalized one would be normalized a
    second time and answered wrongly without a word. uint8 images, and float ones with values 0-255,
    pass; so do tensors traced or compiled for an export (those are uint8).
    """
    if not images.is_floating_point() or images.numel() == 0:
        return
    if torch.compiler.is_compiling() or torch.jit.is_tracing() or torch.onnx.is_in_onnx_export():
        return  # no data-dependent branch in a graph
    finite = images[torch.isfinite(images)]  # NaN and inf are the non-finite guard's to stop, not a scale
    if finite.numel() == 0:
        return
    low, high = float(finite.min()), float(finite.max())
    if low >= 0 and high <= 255 and not 0 < high <= 1:
        return
    raise ValueError(
        f"ImageClassifier takes RGB images [N, 3, H, W] with values 0-255 (uint8; it normalizes them "
        f"itself), but got a float tensor with values from {low:.3g} to {high:.3g}"
        f"{' (the 0-1 scale of ToTensor)' if high <= 1 and low >= 0 else ' (already normalized?)'}. "
        "Pass uint8 images: (images * 255).round().to(torch.uint8) for 0-1 floats, without Normalize"
        # room: api begin
        "; or predict files, PIL images and numpy arrays with project.api.load(CKPT).predict"
        # room: api end
        "."
    )


class Normalize(nn.Module):
    """uint8 images in, normalized float out: the one place preprocessing happens, also in exports."""

    def __init__(self, mean: tuple[float, ...], std: tuple[float, ...]) -> None:
        super().__init__()
        self.register_buffer("shift", torch.tensor(mean).view(1, -1, 1, 1) * 255)
        self.register_buffer("scale", 1 / (torch.tensor(std).view(1, -1, 1, 1) * 255))

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        return (images.float() - self.shift) * self.scale


class ImageClassifier(L.LightningModule):
    """Classify uint8 RGB batches [N, 3, H, W] into `num_classes` logits."""

    def __init__(
        self,
        num_classes: int | None = None,
        class_names: list[str] | None = None,
        image_size: int | None = None,
        backbone: str = "mobilenet_v3_small",
        weights: str | None = None,
        freeze_backbone: bool = False,
        head_epochs: int = 0,  # room: finetune
        layer_decay: float = 1.0,  # room: finetune
        tta: Literal["none", "flip"] = "none",  # room: recipes
        bn_momentum: float | None = 0.1,
        optimizer: OptimizerCallable = torch.optim.AdamW,
        scheduler: LRSchedulerCallable | None = WarmupCosineLR,
        scheduler_interval: Literal["step", "epoch"] = "step",
        label_smoothing: float = 0.0,
        class_weights: list[float] | None = None,  # room: recipes
        mean: tuple[float, float, float] | None = None,
        std: tuple[float, float, float] | None = None,
        channels_last: bool | Literal["auto"] = "auto",
        compile: bool = False,
        # room: multilabel begin
        task: Literal["multiclass", "multilabel"] = "multiclass",
        threshold: float = 0.5,
        # room: multilabel end
    ) -> None:
        """
        Args:
            num_classes: Number of classes; linked from the data, never typed.
            class_names: Class names in label order; linked from the data and kept in checkpoints.
            image_size: Training image size; linked from the data and used by predict and export.
            backbone: A model name of a backbone family: torchvision's by name (resnet18, efficientnet_b0,
                vit_b_16, ...), another family's with its prefix (docs/models.md).
            weights: none, DEFAULT, a weights name of the model's family (torchvision's IMAGENET1K_V1, ...)
                or a local .safetensors/.pth state-dict file.
            freeze_backbone: Train the head only (the backbone's BatchNorm statistics stay fixed too).
            # room: finetune begin
            head_epochs: Fine-tuning: train the head only for this many epochs (backbone frozen as with
                freeze_backbone), then every layer.
            layer_decay: Fine-tuning: the backbone, cut into 8 levels from the head down, learns at
                lr x layer_decay^k at level k (1.0: one learning rate for all; 0.7 is a common choice).
            # room: finetune end
            # room: recipes begin
            tta: Test-time augmentation in validate, test and predict: none, or flip (the mean of the
                logits of the image and its mirror image). Not part of exports.
            # room: recipes end
            bn_momentum: Set every BatchNorm's momentum. torchvision's mobilenet/efficientnet/mnasnet use
                0.01 or less, tuned for long ImageNet runs: a short run from scratch needs about 0.1,
                or its running statistics (used in evaluation) never catch up. null keeps the backbone's own.
            optimizer: Optimizer class and init args; AdamW by default. Biases and norms get no decay.
            scheduler: Learning-rate schedule; WarmupCosineLR by default, ReduceLROnPlateau on val/loss.
            scheduler_interval: Step the schedule every optimizer step or every epoch.
            label_smoothing: Cross-entropy label smoothing.
            # room: recipes begin
            class_weights: Weight of each class in the training loss, in label order; linked from the
                data with `--data.balance=loss` (inverse class frequency) and kept in checkpoints.
                val/loss and test/loss stay the unweighted cross-entropy.
            # room: recipes end
            mean: Per-channel mean in [0, 1] for normalization; null: the backbone's pretrained config
                (ImageNet's for torchvision; its own for another family's weights).
            std: Per-channel standard deviation in [0, 1] for normalization; null: as for mean.
            channels_last: Run the network in channels-last memory format. auto: in fit on the CPU when
                the network has grouped or depthwise convolutions (mobilenet, efficientnet, regnet,
                shufflenet: 1.1-1.5x per step on the CPU, measured; resnets and ConvNeXt gain nothing),
                contiguous elsewhere, including every export; true: always (tensor-core GPUs).
            compile: Compile the network with torch.compile.
            # room: multilabel begin
            task: multiclass (one class per image: softmax, cross-entropy) or multilabel (any number of
                labels per image: a sigmoid per label, binary cross-entropy); linked from the data.
            threshold: Multi-label only: a label is predicted when its probability reaches this.
            # room: multilabel end
        """
        super().__init__()
        if num_classes is None:
            raise UserError(
                "The model's number of classes is unknown.",
                "fit, validate and test take it from --data.root; predict takes it from --ckpt_path.",
            )
        positive_int("model.num_classes", num_classes)
        require(0 <= label_smoothing < 1, "model.label_smoothing", label_smoothing, "a number in [0, 1)")
        # room: finetune begin
        require(head_epochs >= 0, "model.head_epochs", head_epochs, "a whole number of epochs, 0 or more")
        require(0 < layer_decay <= 1, "model.layer_decay", layer_decay, "a number in (0, 1]")
        # room: finetune end
        # room: recipes begin
        # room: multilabel begin
        if task == "multilabel" and class_weights is not None:
            raise UserError(
                "--model.class_weights is for multiclass models; this one is multilabel.",
                "remove --model.class_weights (and --data.balance) for multi-label data.",
            )
        # room: multilabel end
        check_class_weights(class_weights, num_classes)
        # room: recipes end
        # what the pretrained weights expect; kept in checkpoints and export sidecars
        self.pretrained_config = preprocessing(backbone, weights)
        mean = tuple(mean) if mean is not None else self.pretrained_config["mean"]
        std = tuple(std) if std is not None else self.pretrained_config["std"]
        self.save_hyperparameters()
        self.hparams.update(mean=mean, std=std)  # resolved: checkpoints and exports name the numbers
        self.class_names = class_names
        self.image_size = image_size
        self.optimizer = optimizer
        self.scheduler = scheduler
        self.scheduler_interval = scheduler_interval
        self.label_smoothing = label_smoothing
        self.channels_last = channels_last is True  # "auto" is resolved in setup, once the device is known
        self.compile_net = compile
        self.freeze_backbone = freeze_backbone
        self.head_epochs = head_epochs  # room: finetune
        self.layer_decay = layer_decay  # room: finetune
        self.tta = tta  # room: recipes
        self.backbone_frozen = freeze_backbone  # also true in the head-only epochs of a fine-tuning
        # room: multilabel begin
        self.task = task
        self.threshold = threshold
        # room: multilabel end
        self.normalize = Normalize(mean, std)
        # room: recipes begin
        # not in the state dict: the weights are a hyper-parameter (checkpoints keep them there)
        weight = torch.tensor(class_weights, dtype=torch.float) if class_weights is not None else None
        self.register_buffer("class_weight", weight, persistent=False)
        # room: recipes end
        self.net = build_backbone(backbone, num_classes, weights, image_size)
        if bn_momentum is not None:
            for module in self.net.modules():
                if isinstance(module, nn.modules.batchnorm._BatchNorm):
                    module.momentum = bn_momentum
        if self.channels_last:
            self.net = self.net.to(memory_format=torch.channels_last)
        if freeze_backbone:
            set_frozen(self.net, True)
        train_acc = MulticlassAccuracy(num_classes, average="micro")
        self.val_metrics = classification_metrics(num_classes, "val/")
        self.test_metrics = classification_metrics(num_classes, "test/")
        # room: multilabel begin
        self.val_per_label = self.test_per_label = None
        if self.multilabel:  # averaged over labels, and each label's own
            train_acc = MultilabelAccuracy(num_classes, threshold, average="macro")
            self.val_metrics = multilabel_metrics(num_classes, threshold, "val/")
            self.test_metrics = multilabel_metrics(num_classes, threshold, "test/")
            self.val_per_label = per_label_metrics(num_classes, threshold, "val/")
            self.test_per_label = per_label_metrics(num_classes, threshold, "test/")
        # room: multilabel end
        self.train_metrics = MetricCollection({"acc": train_acc}, prefix="train/")
        # a metric, not a logged mean of means: exact over all images, also across DDP ranks
        self.val_loss, self.test_loss = MeanMetric(), MeanMetric()
        self.val_acc_best = MaxMetric()
        self.val_acc_best.persistent(True)  # kept in checkpoints, so a resumed run knows its best

    # room: multilabel begin
    @property
    def multilabel(self) -> bool:
        """Any number of labels per image (sigmoid, binary cross-entropy), not one class (softmax)."""
        return is_multilabel(self)

    # room: multilabel end

    @property
    def label_names(self) -> list[str]:
        """The class names in label order, or "0", "1", ... when the model was built without them."""
        return label_names(self)

    @override
    def forward(self, images: torch.Tensor) -> torch.Tensor:
        check_pixel_values(images)
        x = self.normalize(images)
        if self.channels_last:
            x = x.contiguous(memory_format=torch.channels_last)
        return self.net(x)

    @override
    def setup(self, stage: str) -> None:
        """Before a fit: no learnt tensor hides from the optimizer. `channels_last: auto`: a fit on the CPU
        runs a network with grouped convolutions channels-last."""
        if stage == "fit":
            refuse_plain_learnt_tensors(self)
        auto = self.hparams.get("channels_last") == "auto"
        if (
            auto
            and stage == "fit"
            and self.trainer.strategy.root_device.type == "cpu"
            and grouped_convolutions(self.net)
        ):
            self.channels_last = True
            self.net = self.net.to(memory_format=torch.channels_last)

    @override
    def on_train_start(self) -> None:
        """After a resume has loaded the optimizer state: its tensors take their parameters' layout."""
        for optimizer in self.trainer.optimizers:
            match_state_layout(optimizer)

    @override
    def configure_model(self) -> None:
        if self.compile_net:
            self.net.compile()

    @override
    def on_save_checkpoint(self, checkpoint: dict) -> None:
        """The backbone's pretrained config (mean, std, input size, interpolation, crop) beside the weights:
        what a user of the checkpoint needs to know of the weights it started from."""
        checkpoint["pretrained_config"] = dict(self.pretrained_config)

    def train(self, mode: bool = True) -> ImageClassifier:
        """Like nn.Module.train, but a frozen backbone's BatchNorm layers stay in eval mode."""
        super().train(mode)
        if mode and self.backbone_frozen:
            fix_batchnorm(self.net)
        return self

    # room: finetune begin
    @override
    def on_train_epoch_start(self) -> None:
        """Fine-tuning: the backbone is frozen in the first `head_epochs` epochs (also after a resume)."""
        if self.head_epochs and not self.freeze_backbone:
            self.backbone_frozen = self.current_epoch < self.head_epochs
            set_frozen(self.net, self.backbone_frozen)
            self.train()

    # room: finetune end

    @override
    def on_train_batch_start(self, batch: object, batch_idx: int) -> None:
        """From random weights, BatchNorm's running statistics start as the plain mean over the batches
        seen (momentum 1/n) until that falls below the layer's own momentum: the initial mean 0 and
        variance 1 describe no data, and kept at a weight of (1 - momentum)^steps they leave a short
        run's evaluation (which uses these statistics) giving every image the same answer. The count is
        the layer's own `num_batches_tracked` (saved in checkpoints, restored with the statistics when a
        non-finite step is skipped), so a resumed or a skipped step keeps the same mean."""
        if self.hparams.weights is not None:
            return  # pretrained statistics describe real images: kept, as the layer's momentum keeps them
        for module, momentum in self._bn_momenta():
            module.momentum = max(momentum, 1 / (int(module.num_batches_tracked) + 1))

    def _bn_momenta(self) -> list[tuple[nn.Module, float]]:
        """Each BatchNorm layer with a momentum, and that momentum as configured."""
        if not hasattr(self, "_bn_configured"):
            self._bn_configured = [
                (m, m.momentum)
                for m in self.net.modules()
                if isinstance(m, nn.modules.batchnorm._BatchNorm)
                and m.momentum is not None
                and m.num_batches_tracked is not None
            ]
        return self._bn_configured

    # ---- steps ----

    def loss(
        self,
        batch: tuple[torch.Tensor, torch.Tensor],
        logits: torch.Tensor | None = None,
        weight: torch.Tensor | None = None,  # room: recipes
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The loss of a batch and its logits (computed unless given): what training, evaluation and
        `memory` compute. Multiclass labels are class indices [N].
        # room: recipes begin
        Or class probabilities [N, C] (MixUp/CutMix's soft targets); `weight` weighs the classes
        (training only).
        # room: recipes end
        """
        images, labels = batch
        logits = self(images) if logits is None else logits
        # room: multilabel begin
        if self.multilabel:
            targets = labels.float() * (1 - self.label_smoothing) + 0.5 * self.label_smoothing
            return F.binary_cross_entropy_with_logits(logits, targets), logits
        # room: multilabel end
        loss = F.cross_entropy(
            logits,
            labels,
            weight=weight,  # room: recipes
            label_smoothing=self.label_smoothing,
        )
        return loss, logits

    def _metric_inputs(self, logits: torch.Tensor, labels: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """What the metrics see: the logits and a class per image."""
        # room: multilabel begin
        if self.multilabel:  # the probabilities (torchmetrics would guess) and the 0/1 rows
            return logits.float().sigmoid(), labels
        # room: multilabel end
        # room: recipes begin
        if labels.is_floating_point():  # MixUp/CutMix's soft targets: the dominant class, the larger share
            return logits, labels.argmax(dim=1)
        # room: recipes end
        return logits, labels

    @override
    def training_step(
        self, batch: tuple[torch.Tensor, torch.Tensor] | None, batch_idx: int
    ) -> torch.Tensor | None:
        if batch is None:  # every image of the batch was skipped as unreadable
            return None
        loss, logits = self.loss(
            batch,
            weight=self.class_weight,  # room: recipes
        )
        self.train_metrics.update(*self._metric_inputs(logits.detach(), batch[1]))
        self.log("train/loss", loss, prog_bar=True)
        self.log_dict(self.train_metrics, on_step=False, on_epoch=True)
        return loss

    @override
    def validation_step(
        self, batch: tuple[torch.Tensor, torch.Tensor] | None, batch_idx: int
    ) -> torch.Tensor | None:
        # the logits go to the callbacks: no second forward pass
        # (the confusion matrix and the misclassified images read them)  # room: pictures
        return self._evaluate(batch, self.val_metrics, self.val_loss, "val/loss")

    @override
    def test_step(self, batch: tuple[torch.Tensor, torch.Tensor] | None, batch_idx: int) -> None:
        self._evaluate(batch, self.test_metrics, self.test_loss, "test/loss")

    def _evaluate(
        self,
        batch: tuple | None,
        metrics: MetricCollection,
        loss_metric: MeanMetric,
        loss_name: str,
    ) -> torch.Tensor | None:
        if batch is None:
            return None
        loss, logits = self.loss(batch, self._evaluation_logits(batch[0]))
        scores, labels = self._metric_inputs(logits, batch[1])
        metrics.update(scores, labels)
        # room: multilabel begin
        per_label = self.val_per_label if loss_name.startswith("val") else self.test_per_label
        if per_label is not None:
            per_label.update(scores, labels)
        # room: multilabel end
        loss_metric.update(loss, weight=len(batch[1]))
        self.log(loss_name, loss_metric, on_epoch=True, prog_bar=True)
        self.log_dict(metrics, on_epoch=True, prog_bar=loss_name.startswith("val"))
        return logits

    # room: multilabel begin
    def _log_per_label(self, per_label: MetricCollection | None) -> None:
        """Log each label's metrics by name (vectors cannot be logged as metric objects), then reset."""
        if per_label is None:
            return
        if not self.trainer.sanity_checking:
            for key, values in per_label.compute().items():  # computed across devices already
                by_name = {f"{key}/{name}": v for name, v in zip(self.label_names, values, strict=True)}
                self.log_dict(by_name, sync_dist=True)  # equal on every rank
        per_label.reset()

    @override
    def on_test_epoch_end(self) -> None:
        self._log_per_label(self.test_per_label)

    # room: multilabel end
    @override
    def on_validation_epoch_end(self) -> None:
        self._log_per_label(self.val_per_label)  # room: multilabel
        if self.trainer.sanity_checking:
            return
        self.val_acc_best.update(self.val_metrics["acc"].compute())
        self.log("val/acc_best", self.val_acc_best.compute(), sync_dist=True)  # equal on every rank

    @override
    def predict_step(
        self, batch: tuple[torch.Tensor, torch.Tensor] | None, batch_idx: int
    ) -> torch.Tensor | None:
        if batch is None:
            return None
        # logits: PredictionWriter turns them into answers, as infer and serve do
        # room: calibration begin
        # (with the export's calibration, project.deploy.calibration)
        # room: calibration end
        return self._evaluation_logits(batch[0]).float()

    def _evaluation_logits(self, images: torch.Tensor) -> torch.Tensor:
        """Logits for evaluation and prediction.
        # room: recipes begin
        With `tta=flip`, the mean of the logits of the image and its mirror image.
        # room: multilabel begin
        For multi-label, the logit of the mean sigmoid.
        # room: multilabel end

        The mean of logits, not the log of the mean softmax: log-probabilities are logits of another
        kind (their logsumexp is 0), off the scale of the plain logits the export's temperature was
        fitted on; a mean of logits is on their scale.
        # room: unknown begin
        With the log of the mean softmax, its unknown threshold would answer every image `unknown`.
        # room: unknown end
        # room: recipes end
        """
        # room: recipes begin
        if self.tta != "none":
            views = torch.stack([self(images), self(images.flip(-1))]).float()
            # room: multilabel begin
            if self.multilabel:
                return torch.logit(views.sigmoid().mean(0), eps=1e-6)
            # room: multilabel end
            return views.mean(0)
        # room: recipes end
        return self(images)

    # ---- optimization ----

    @override
    def configure_optimizers(self) -> dict:
        # room: finetune begin
        if self.head_epochs or self.layer_decay != 1.0:
            # every parameter from the start (frozen ones get no gradient, so no step): the param groups
            # stay the same through the phases, and a resumed run's optimizer state fits them
            groups = depth_groups(self.net, self.hparams.backbone, self.layer_decay)
            optimizer = build_optimizer(self.optimizer, groups, self._clips_mixed())
            for group in optimizer.param_groups:
                group["lr"] *= group["lr_scale"]
            return self._scheduled(optimizer)
        # room: finetune end
        decay, no_decay = [], []
        for param in self.parameters():
            if param.requires_grad:
                (no_decay if param.ndim <= 1 else decay).append(param)  # biases and norms: no decay
        optimizer = build_optimizer(
            self.optimizer,
            [{"params": decay}, {"params": no_decay, "weight_decay": 0.0}],
            self._clips_mixed(),
        )
        return self._scheduled(optimizer)

    def _scheduled(self, optimizer: torch.optim.Optimizer) -> dict:
        """Lightning's optimizer configuration: `optimizer` with the run's scheduler, if any."""
        if self.scheduler is None:
            return {"optimizer": optimizer}
        scheduler = self.scheduler(optimizer)
        if isinstance(scheduler, WarmupCosineLR):
            steps = self.trainer.estimated_stepping_batches  # inf: no max_epochs nor max_steps
            scheduler.fit_run(int(steps) if math.isfinite(steps) else None, self._budget_share())
        if isinstance(scheduler, ReduceLROnPlateau):
            config = {"scheduler": scheduler, "monitor": "val/loss", "interval": "epoch"}
        else:
            config = {"scheduler": scheduler, "interval": self.scheduler_interval}
        return {"optimizer": optimizer, "lr_scheduler": config}

    def _clips_mixed(self) -> bool:
        """The run clips gradients under 16-mixed or bf16-mixed (no trainer: a bare model, no clipping)."""
        trainer = self._trainer
        if trainer is None or not trainer.gradient_clip_val:
            return False
        return isinstance(trainer.precision_plugin, MixedPrecision)

    def _budget_share(self) -> Callable[[], float] | None:
        """With --trainer.max_time: a clock giving the elapsed share of the time budget (rank 0's on every
        rank, so that all ranks step with the same learning rate); None without a budget."""
        timer = next((c for c in self.trainer.callbacks if isinstance(c, Timer)), None)
        if timer is None or timer.time_remaining() is None:
            return None

        def share() -> float:
            elapsed = timer.time_elapsed()
            return self.trainer.strategy.broadcast(elapsed / max(elapsed + timer.time_remaining(), 1e-9))

        return share
