"""Throughput and latency of `python -m project serve`, batched versus unbatched, in one run.

    python bench/serve_load.py                                     # mobilenet_v3_small, 64 px
    python bench/serve_load.py --backbone resnet18 --image_size 224

Exports a freshly initialised backbone with the real export code (speed does not depend on the
weights), starts the service twice on free loopback ports, batched (the defaults) and unbatched
(--max_batch_size 1), and drives each with 1, 8 and 64 concurrent clients, each sending JPEGs back
to back over one keep-alive connection. A level's `--seconds` (after a warm-up, at most
`--max_requests` requests) are split into `--rounds` that alternate between the two servers, the
order swapped each round, so that other load on the machine falls on both alike. Prints the
CPU time other programs took meanwhile, the table with the mean batch size (from /metrics) and
the batched / unbatched throughput ratio per level. The load generator shares the cores with
the servers, as any client on the same host would.
"""

from __future__ import annotations

import argparse
import asyncio
import io
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Coroutine
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from project.data.shapes import CLASSES, draw_shape
from project.export import export_checkpoint
from project.model import ImageClassifier

LEVELS = (1, 8, 64)


def export_fresh(backbone: str, size: int, folder: Path) -> Path:
    """A checkpoint of an untrained model, exported and verified like a trained one."""
    model = ImageClassifier(num_classes=len(CLASSES), class_names=list(CLASSES), image_size=size,
                            backbone=backbone, scheduler=None)  # fmt: skip
    keys = ("num_classes", "class_names", "image_size", "backbone", "mean", "std", "task", "threshold")
    checkpoint = {
        "hyper_parameters": {k: model.hparams[k] for k in keys},
        "state_dict": model.state_dict(),
        "datamodule_hyper_parameters": {"crop_ratio": 0.875},
    }
    path = folder / backbone / "fresh.ckpt"
    path.parent.mkdir(parents=True)
    torch.save(checkpoint, path)
    return export_checkpoint(path).onnx


def request_images(size: int, count: int = 32) -> list[bytes]:
    """JPEGs a little larger than the model's input, as a client would send (resized, then cropped)."""
    rng = np.random.default_rng(0)
    images = []
    for i in range(count):
        buffer = io.BytesIO()
        draw_shape(CLASSES[i % len(CLASSES)], round(size * 1.25), rng).save(buffer, "JPEG", quality=90)
        images.append(buffer.getvalue())
    return images


class Server:
    def __init__(self, model: Path, flags: list[str], log: Path) -> None:
        command = [sys.executable, "-m", "project", "serve", "--model", str(model), "--port", "0", *flags]
        self.log = log
        with open(log, "wb") as out:
            self.process = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 60
        while "Serving " not in log.read_text():
            if self.process.poll() is not None or time.monotonic() > deadline:
                raise SystemExit(f"the server did not start:\n{log.read_text()}")
            time.sleep(0.1)
        self.port = int(log.read_text().split("http://127.0.0.1:")[1].split(" ")[0])

    def stop(self) -> int:
        self.process.send_signal(signal.SIGTERM)
        return self.process.wait(30)


async def http(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, head: bytes, body: bytes):
    """One request on a keep-alive connection: (status, body)."""
    writer.write(head + body)
    await writer.drain()
    status_line, *headers = (await reader.readuntil(b"\r\n\r\n")).split(b"\r\n")
    length = next(int(h.split(b":")[1]) for h in headers if h.lower().startswith(b"content-length:"))
    return int(status_line.split()[1]), await reader.readexactly(length)


def post_head(port: int, size: int) -> bytes:
    return (
        f"POST /predict HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nContent-Type: image/jpeg\r\n"
        f"Content-Length: {size}\r\n\r\n"
    ).encode()


async def client(port: int, images: list[bytes], offset: int, window: tuple[float, float], out: list) -> None:
    """Send images back to back until the window ends; latencies of requests started inside it."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    warm, until = window
    i = offset
    try:  # perf_counter: uvloop's loop.time() ticks in whole milliseconds
        while (start := time.perf_counter()) < until and len(out) < MAX_REQUESTS[0]:
            data = images[i % len(images)]
            status, _ = await http(reader, writer, post_head(port, len(data)), data)
            if status != 200:
                raise RuntimeError(f"status {status}")
            if start >= warm:
                out.append(time.perf_counter() - start)
            i += 1
    finally:
        writer.close()


MAX_REQUESTS = [50_000]  # measured requests per level, at most (--max_requests)


@dataclass
class Cell:
    """What one server measured at one level, summed over the rounds."""

    latencies: list[float] = field(default_factory=list)
    seconds: float = 0.0
    batches: int = 0
    images: int = 0

    def row(self) -> dict:
        ordered = sorted(self.latencies)
        return {
            "requests": len(ordered),
            "throughput": len(ordered) / self.seconds,
            "p50": statistics.median(ordered) * 1e3,
            "p99": ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))] * 1e3,
            "mean_batch": self.images / max(1, self.batches),
        }


async def level(
    port: int, images: list[bytes], clients: int, timing: tuple[float, float], cell: Cell
) -> None:
    """`clients` clients for `timing` = (warm-up, measured) seconds; batch sizes from /metrics."""
    warmup, seconds = timing
    before = await metrics(port)
    warm = time.perf_counter() + warmup
    window = (warm, warm + seconds)
    latencies: list[float] = []
    await asyncio.gather(*(client(port, images, c, window, latencies) for c in range(clients)))
    cell.seconds += min(seconds, time.perf_counter() - warm)
    cell.latencies += latencies
    after = await metrics(port)
    cell.batches += after["batches"] - before["batches"]
    cell.images += after["batched_images"] - before["batched_images"]


async def metrics(port: int) -> dict:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        head = f"GET /metrics HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n\r\n".encode()
        _, body = await http(reader, writer, head, b"")
    finally:
        writer.close()
    return json.loads(body)


def machine_busy() -> float:
    """CPU seconds all processes on this machine have used since boot (Linux /proc/stat)."""
    fields = Path("/proc/stat").read_text().split("\n")[0].split()[1:]
    user, nice, system, _, _, irq, softirq, steal = (int(f) for f in fields[:8])
    return (user + nice + system + irq + softirq + steal) / os.sysconf("SC_CLK_TCK")


def own_busy(servers: list[Server]) -> float:
    """CPU seconds used by this process and the servers it started."""
    ticks = 0
    for server in servers:
        stat = Path(f"/proc/{server.process.pid}/stat").read_text().rsplit(")", 1)[1].split()
        ticks += int(stat[11]) + int(stat[12])  # utime, stime
    times = os.times()
    return ticks / os.sysconf("SC_CLK_TCK") + times.user + times.system


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--backbone", default="mobilenet_v3_small")
    parser.add_argument("--image_size", type=int, default=64)
    parser.add_argument("--seconds", type=float, default=8.0, help="measured seconds per level and server")
    parser.add_argument(
        "--rounds", type=int, default=2, help="rounds the seconds are split into, order swapped"
    )
    parser.add_argument("--warmup", type=float, default=1.5, help="unmeasured seconds before each level")
    parser.add_argument(
        "--max_requests", type=int, default=50_000, help="measured requests per level, at most"
    )
    parser.add_argument("--batched_flags", default="", help="extra flags for the batched server")
    parser.add_argument("--flags", default="", help="extra flags for both servers (e.g. --threads 1)")
    parser.add_argument("--model", help="serve this export instead of exporting a fresh backbone")
    args = parser.parse_args()
    MAX_REQUESTS[0] = args.max_requests
    common = args.flags.split()
    settings = {
        "batched": common + args.batched_flags.split(),
        "unbatched": [*common, "--max_batch_size", "1"],
    }
    print(f"{os.cpu_count()} CPUs, {args.backbone} at {args.image_size} px, {args.seconds:g} s per level")
    with tempfile.TemporaryDirectory() as tmp:
        model = Path(args.model) if args.model else export_fresh(args.backbone, args.image_size, Path(tmp))
        images = request_images(args.image_size)
        print(f"serving {model.name}; request JPEGs of about {len(images[0]) // 1024 + 1} KiB")
        # both servers stay up (an idle one costs no CPU) and the levels alternate between them,
        # so that other load on the machine, if any, falls on both alike
        servers: dict[str, Server] = {}
        cells = {(name, clients): Cell() for name in settings for clients in LEVELS}
        try:
            for name, flags in settings.items():
                servers[name] = Server(model, flags, Path(tmp) / f"{name}.log")
            busy_before, own_before = machine_busy(), own_busy([*servers.values()])
            started = time.perf_counter()
            for turn in range(args.rounds):
                for clients in LEVELS:
                    order = list(servers) if turn % 2 == 0 else list(servers)[::-1]
                    for name in order:
                        timing = (args.warmup, args.seconds / args.rounds)
                        run(level(servers[name].port, images, clients, timing, cells[name, clients]))
            others = machine_busy() - busy_before - (own_busy([*servers.values()]) - own_before)
            wall = time.perf_counter() - started
            print(f"other programs used {others:.1f} CPU-seconds of {wall * os.cpu_count():.0f} meanwhile")
        finally:
            for name, server in servers.items():
                flags = " ".join(settings[name]) or "defaults"
                print(f"{name} server ({flags}) stopped with status {server.stop()}")
    results = {name: [{"clients": c, **cells[name, c].row()} for c in LEVELS] for name in settings}
    print_table(results)


def run(coroutine: Coroutine) -> Any:
    """asyncio.run, on uvloop where installed: the load generator should cost the cores little."""
    try:
        import uvloop
    except ImportError:
        return asyncio.run(coroutine)
    return uvloop.run(coroutine)


def print_table(results: dict[str, list[dict]]) -> None:
    print("| server | clients | requests | throughput (req/s) | p50 ms | p99 ms | mean batch |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for name, rows in results.items():
        for r in rows:
            print(
                f"| {name} | {r['clients']} | {r['requests']} | {r['throughput']:.0f} | {r['p50']:.1f} | "
                f"{r['p99']:.1f} | {r['mean_batch']:.1f} |"
            )
    for batched, unbatched in zip(results["batched"], results["unbatched"], strict=True):
        ratio = batched["throughput"] / unbatched["throughput"]
        print(f"{batched['clients']} clients: batched / unbatched throughput = {ratio:.2f}")


if __name__ == "__main__":
    main()
