"""One training step on the CPU, contiguous against channels-last memory format, alternating.

    python bench/channels_last_cpu.py [NAME:SIZE:BATCH ...]     # e.g. mobilenet_v3_small:128:32
    python bench/channels_last_cpu.py --bf16 [NAME:SIZE:BATCH ...]  # float32 against bf16 autocast

With --bf16 both sides are channels-last, and the second runs forward and loss under
`torch.autocast("cpu", dtype=torch.bfloat16)` (what `--trainer.precision=bf16-mixed` does on the CPU).

A step is forward, cross-entropy, backward and a fused AdamW step on random data, 2 threads.
Each network runs 3 warm-up steps per side, then 5 rounds of 5 steps per side alternating; the
figure is the median round's time per step. What `--model.channels_last=auto` follows (channels-last in a
CPU fit for networks with grouped convolutions): see docs/benchmarks.md, "channels-last and torch.compile
on the CPU".
"""

from __future__ import annotations

import statistics
import sys
import time

import torch
import torchvision

CASES = [("resnet18", 32, 64), ("mobilenet_v3_small", 64, 32), ("resnet18", 32, 128)]


def side(name: str, size: int, batch: int, channels_last: bool, bf16: bool = False) -> tuple:
    net = torchvision.models.get_model(name, num_classes=10)
    x, y = torch.randn(batch, 3, size, size), torch.randint(0, 10, (batch,))
    if channels_last:
        net = net.to(memory_format=torch.channels_last)
        x = x.contiguous(memory_format=torch.channels_last)
    return net, torch.optim.AdamW(net.parameters(), lr=1e-3, fused=True), x, y, bf16


def step(
    net: torch.nn.Module, optimizer: torch.optim.Optimizer, x: torch.Tensor, y: torch.Tensor, bf16: bool
) -> None:
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
        loss = torch.nn.functional.cross_entropy(net(x), y)
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()


def main() -> None:
    torch.manual_seed(0)
    torch.set_num_threads(2)
    bf16 = "--bf16" in sys.argv
    given = [arg for arg in sys.argv[1:] if arg != "--bf16"]
    cases = [(n, int(s), int(b)) for n, s, b in (arg.split(":") for arg in given)] or CASES
    labels = ("float32", "bf16 autocast") if bf16 else ("contiguous", "channels_last")
    for name, size, batch in cases:
        # the second side: channels-last, or (--bf16) channels-last under bf16 autocast
        sides = {second: side(name, size, batch, bf16 or second, bf16 and second) for second in (False, True)}
        for args in sides.values():
            for _ in range(3):
                step(*args)
        times: dict[bool, list[float]] = {False: [], True: []}
        for _ in range(5):
            for layout, args in sides.items():
                started = time.perf_counter()
                for _ in range(5):
                    step(*args)
                times[layout].append((time.perf_counter() - started) / 5)
        plain, last = statistics.median(times[False]), statistics.median(times[True])
        print(
            f"{name} {size} px batch {batch}: {labels[0]} {plain * 1000:.1f} ms, "
            f"{labels[1]} {last * 1000:.1f} ms, ratio {plain / last:.2f}"
        )


if __name__ == "__main__":
    main()
