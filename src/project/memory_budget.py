"""Memory budget of one training step: parameters, gradients, optimizer state and measured activations."""

from __future__ import annotations

import os
from dataclasses import dataclass

import lightning as L
import torch

from project.backbones import head_of

# room: multilabel begin
from project.model import is_multilabel

# room: multilabel end

MiB = 2**20


@dataclass
class MemoryBudget:
    """Bytes per item of one training step at a given batch size and precision."""

    device: torch.device
    batch_shape: tuple[int, ...]
    precision: str
    parameters: int
    parameter_count: int
    gradients: int
    optimizer_state: int
    optimizer: str
    activations: int
    inputs: int
    head_parameters: int
    device_memory: int
    peak: int | None  # measured by the CUDA allocator, when on a GPU

    @property
    def total(self) -> int:
        return self.parameters + self.gradients + self.optimizer_state + self.activations + self.inputs


def measure(model: L.LightningModule, trainer: L.Trainer, batch_size: int, image_size: int) -> MemoryBudget:
    """Run one real training step (forward, backward, optimizer step) on a random batch and count bytes."""
    device = trainer.strategy.root_device
    plugin = trainer.precision_plugin
    model = plugin.convert_module(model).to(device).train()
    num_classes = model.hparams.num_classes
    images = torch.randint(0, 256, (batch_size, 3, image_size, image_size), dtype=torch.uint8, device=device)
    labels = torch.randint(0, num_classes, (batch_size,), device=device)
    # room: multilabel begin
    if is_multilabel(model):
        labels = torch.randint(0, 2, (batch_size, num_classes), dtype=torch.uint8, device=device)
    # room: multilabel end
    params = [p for p in model.parameters()]
    trainable = [p for p in params if p.requires_grad]
    optimizer = model.optimizer([{"params": trainable}])
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)

    saved = ActivationCounter(params)
    with plugin.train_step_context(), torch.autograd.graph.saved_tensors_hooks(saved.pack, lambda t: t):
        loss, _ = model.loss((plugin.convert_input(images), labels))  # the loss training uses
    loss.backward()
    optimizer.step()
    state = [t for s in optimizer.state.values() for t in s.values() if isinstance(t, torch.Tensor)]
    return MemoryBudget(
        device=device,
        batch_shape=tuple(images.shape),
        precision=str(trainer.precision),
        parameters=nbytes(params) + nbytes(list(model.buffers())),
        parameter_count=sum(p.numel() for p in params),
        gradients=nbytes([p.grad for p in trainable if p.grad is not None]),
        optimizer_state=nbytes(state),
        optimizer=type(optimizer).__name__,
        activations=saved.bytes,
        inputs=images.nbytes + labels.nbytes,
        head_parameters=nbytes(list(head_of(model.net).parameters())) if hasattr(model, "net") else 0,
        device_memory=device_memory(device),
        peak=torch.cuda.max_memory_allocated(device) if device.type == "cuda" else None,
    )


class ActivationCounter:
    """Sums the distinct storages autograd keeps for backward, leaving out the parameters themselves."""

    def __init__(self, params: list[torch.Tensor]) -> None:
        self.seen = {p.untyped_storage().data_ptr() for p in params}
        self.bytes = 0

    def pack(self, tensor: torch.Tensor) -> torch.Tensor:
        storage = tensor.untyped_storage()
        if storage.data_ptr() not in self.seen:
            self.seen.add(storage.data_ptr())
            self.bytes += storage.nbytes()
        return tensor


def nbytes(tensors: list[torch.Tensor]) -> int:
    return sum(t.numel() * t.element_size() for t in tensors)


def device_memory(device: torch.device) -> int:
    """Total memory of a GPU, or the machine's RAM for the CPU."""
    if device.type == "cuda":
        return torch.cuda.get_device_properties(device).total_memory
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def report(budget: MemoryBudget, accumulate: int) -> str:
    """The budget as a table, then what each lever would change."""
    b = budget
    where = "GPU" if b.device.type == "cuda" else "RAM"
    rows = [
        ("parameters + buffers", b.parameters, f"{b.parameter_count / 1e6:.2f} M parameters"),
        ("gradients", b.gradients, "trainable parameters only"),
        (f"optimizer state ({b.optimizer})", b.optimizer_state, "after one step"),
        ("activations", b.activations, "saved for backward, measured on one batch"),
        ("input batch", b.inputs, "x".join(map(str, b.batch_shape)) + " uint8 + labels"),
    ]
    lines = [
        f"Memory budget of one training step: batch {b.batch_shape[0]}, precision {b.precision}, {b.device}"
    ]
    lines += [f"  {name:<34} {size / MiB:>10.1f} MiB   {note}" for name, size, note in rows]
    share = b.total / b.device_memory
    lines.append(
        f"  {'total':<34} {b.total / MiB:>10.1f} MiB   {share:.1%} of {b.device_memory / MiB:.0f} MiB {where}"
    )
    if b.peak is not None:
        lines.append(f"  {'peak allocated (CUDA allocator)':<34} {b.peak / MiB:>10.1f} MiB")
    return "\n".join([*lines, "", *advice(b, accumulate)])


def advice(b: MemoryBudget, accumulate: int) -> list[str]:
    """What each lever saves, with this run's numbers."""
    batch = b.batch_shape[0]
    fixed = b.total - b.activations - b.inputs
    per_image = (b.activations + b.inputs) / batch
    fits = b.total <= 0.9 * b.device_memory
    largest = int((0.9 * b.device_memory - fixed) // per_image) if per_image else batch
    lines = [
        f"Fits, with room for a batch of about {largest}."
        if fits
        else "Does not fit in 90% of the device's memory. Ways to shrink it:",
        f"  - batch {batch // 2 or 1} with --trainer.accumulate_grad_batches={2 * accumulate}: "
        f"same effective batch, activations ~{b.activations / 2 / MiB:.0f} MiB",
    ]
    if "16" not in b.precision:
        lines.append(
            "  - --trainer.precision=bf16-mixed: activations about halve "
            f"(~{b.activations / 2 / MiB:.0f} MiB), and faster on recent GPUs"
        )
    lines.append(
        "  - gradient checkpointing (torch.utils.checkpoint around the backbone's blocks): activations "
        "are recomputed in backward instead of kept, for ~30% more compute"
    )
    if b.head_parameters and b.gradients > b.head_parameters:
        frozen = b.head_parameters * (1 + (b.optimizer_state / b.gradients if b.gradients else 0))
        lines.append(
            f"  - --model.freeze_backbone=true: gradients + optimizer state "
            f"{(b.gradients + b.optimizer_state) / MiB:.1f} -> {frozen / MiB:.1f} MiB (head only)"
        )
    return lines


def measure_step(model: L.LightningModule, trainer: L.Trainer, batch_size: int, image_size: int) -> str:
    """What `memory` prints: the budget of one training step measured, with its advice."""
    return report(measure(model, trainer, batch_size, image_size), trainer.accumulate_grad_batches)
