"""`python -m project doctor`: check this machine before a run wastes its time on it."""

from __future__ import annotations

import os
import platform
import re
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path

import torch
from torch.utils.data import DataLoader, Dataset

from project.data.datamodule import MAX_WORKERS_PER_CORE, usable_cores
from project.errors import CommandParser, UserError, exits_on_user_error, install_hint
from project.terminal import printable

PACKAGES = ("torch", "torchvision", "lightning", "torchmetrics", "onnx", "onnxruntime")
GiB = 2**30


@dataclass
class Report:
    """Lines to print, and the problems found (each with its fix)."""

    lines: list[str] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)

    # printable: a folder named on the command line (or an error's text) may hold control characters
    def info(self, name: str, value: str) -> None:
        self.lines.append(printable(f"  {name:<14} {value}"))

    def problem(self, what: str, fix: str) -> None:
        self.problems.append(printable(f"{what} Fix: {fix}"))


def check_versions(report: Report) -> None:
    report.lines.append("Software")
    report.info("python", f"{platform.python_version()} ({sys.executable})")
    for package in PACKAGES:
        try:
            version = metadata.version(package)
        except metadata.PackageNotFoundError:
            report.info(package, "MISSING")
            report.problem(f"{package} is not installed.", install_hint("dev", package) + ".")
            continue
        if package == "torch":
            build = f"CUDA {torch.version.cuda}" if torch.version.cuda else "CPU-only build"
            version += f" ({build}{', ROCm ' + torch.version.hip if torch.version.hip else ''})"
        report.info(package, version)


def check_devices(report: Report) -> None:
    report.lines.append("Devices")
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    ram = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / GiB if hasattr(os, "sysconf") else 0
    report.info("cpu", f"{platform.processor() or platform.machine()}, {cores} cores, {ram:.1f} GiB RAM")
    report.info(
        "", f"matmul {matmul_check(torch.device('cpu'), report)}; bf16 {bf16_check(torch.device('cpu'))}"
    )
    driver = nvidia_driver()
    if not torch.cuda.is_available():
        report.info(
            "cuda", "not available" + ("" if driver else ": no NVIDIA driver, training runs on the CPU")
        )
        if driver and not torch.version.cuda:
            report.problem(
                f"This machine has an NVIDIA GPU (driver {driver}), but torch {torch.__version__} is a "
                "CPU-only build.",
                "install a CUDA build of torch, e.g. pip install torch --index-url "
                "https://download.pytorch.org/whl/cu126 (pick the CUDA version your driver supports).",
            )
        elif driver:
            visible = os.environ.get("CUDA_VISIBLE_DEVICES")
            report.problem(
                f"This machine has an NVIDIA GPU (driver {driver}), but torch {torch.__version__} (CUDA "
                f"{torch.version.cuda}) sees none (CUDA_VISIBLE_DEVICES={visible!r}).",
                "check nvidia-smi, that the driver supports this CUDA version (a newer torch may need a "
                "newer driver), and CUDA_VISIBLE_DEVICES (in a container: run it with --gpus all).",
            )
    else:
        cudnn = torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None
        report.info("cuda", f"driver {driver or '?'}, runtime {torch.version.cuda}, cuDNN {cudnn}")
        for i in range(torch.cuda.device_count()):
            device = torch.device("cuda", i)
            p = torch.cuda.get_device_properties(device)
            report.info(
                str(device),
                f"{p.name}, capability {p.major}.{p.minor}, {p.total_memory / GiB:.1f} GiB; "
                f"matmul {matmul_check(device, report)}; bf16 {bf16_check(device)}",
            )
    if getattr(torch.backends, "mps", None) is not None and torch.backends.mps.is_available():
        report.info("mps", f"matmul {matmul_check(torch.device('mps'), report)}")


def matmul_check(device: torch.device, report: Report | None = None) -> str:
    """A 256x256 float32 product on `device`, compared with the float64 CPU result."""
    generator = torch.Generator().manual_seed(0)
    a, b = (torch.randn(256, 256, generator=generator) for _ in range(2))
    expected = a.double() @ b.double()
    try:
        got = (a.to(device) @ b.to(device)).cpu().double()
    except RuntimeError as e:
        if report is not None:
            report.problem(
                f"A matrix product on {device} failed: {e}.", "check the driver and the torch build."
            )
        return "FAILED"
    error = ((got - expected).abs().max() / expected.abs().max()).item()
    if error > 1e-2 and report is not None:  # TF32 gives ~1e-3; more is a broken device or driver
        report.problem(
            f"A matrix product on {device} is off by {error:.1e} (relative) from the CPU's.",
            "update the driver; check the GPU's health (nvidia-smi -q, ECC errors).",
        )
    return f"ok (relative error {error:.0e})" if error <= 1e-2 else f"WRONG (relative error {error:.0e})"


def bf16_check(device: torch.device) -> str:
    if device.type == "cuda":
        return "supported" if torch.cuda.is_bf16_supported() else "not supported (use 16-mixed)"
    try:
        torch.ones(8, 8, dtype=torch.bfloat16) @ torch.ones(8, 8, dtype=torch.bfloat16)
    except RuntimeError:
        return "not supported"
    return "works (speed depends on the CPU's AVX-512 BF16 / AMX support)"


def nvidia_driver() -> str | None:
    """The NVIDIA driver version, when the machine has one (independent of torch)."""
    version_file = Path("/proc/driver/nvidia/version")
    if version_file.is_file():
        match = re.search(r"Kernel Module\s+(\S+)", version_file.read_text())
        if match:
            return match.group(1)
    if shutil.which("nvidia-smi"):
        try:
            out = subprocess.run(
                ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                capture_output=True,
                text=True,
                timeout=20,
            )
            return out.stdout.split("\n")[0].strip() or None
        except (OSError, subprocess.SubprocessError):
            return None
    return None


class _Squares(Dataset):
    def __len__(self) -> int:
        return 8

    def __getitem__(self, i: int) -> torch.Tensor:
        return torch.full((3, 4, 4), i, dtype=torch.uint8)


def check_dataloader(report: Report, workers: int = 2) -> None:
    report.lines.append("Data loading")
    start = time.perf_counter()
    try:
        loader = DataLoader(_Squares(), batch_size=4, num_workers=workers, timeout=60 if workers else 0)
        total = sum(int(batch.sum()) for batch in loader)
    except Exception as e:  # any failure here is what the user needs to see, whatever its type
        report.info("DataLoader", f"{workers} workers FAILED: {e}")
        report.problem(
            f"A DataLoader with {workers} workers failed: {str(e).splitlines()[0]}",
            "in a container, give it more shared memory (docker run --shm-size=8g); "
            "or train with --data.num_workers=0.",
        )
        return
    seconds = time.perf_counter() - start
    ok = total == sum(i * 48 for i in range(8))
    report.info("DataLoader", f"{workers} workers started and delivered 8 samples in {seconds:.1f} s")
    if not ok:
        report.problem("The DataLoader workers returned wrong data.", "report this with the doctor's output.")
    shm = Path("/dev/shm")
    if shm.is_dir():
        free = shutil.disk_usage(shm).free / GiB
        report.info("/dev/shm", f"{free:.1f} GiB free (workers pass batches through it)")
        if free < 0.5:
            report.problem(
                f"/dev/shm has only {free:.2f} GiB free: DataLoader workers will crash with a bus error.",
                "docker run --shm-size=8g (or --ipc=host); or --data.num_workers=0.",
            )


def check_folders(report: Report, folders: list[Path], min_free_gb: float) -> None:
    report.lines.append("Folders")
    for folder in folders:
        if folder.exists() and not folder.is_dir():
            report.info(f"{folder}/", "NOT A FOLDER")
            report.problem(
                f"'{folder}' is a file, not a folder.", f"move it away so '{folder}/' can be made."
            )
            continue
        existing = next(p for p in [folder, *folder.absolute().parents] if p.exists())
        free = shutil.disk_usage(existing).free / GiB
        if not writable(existing):
            report.info(f"{folder}/", f"NOT WRITABLE, {free:.1f} GiB free")
            report.problem(
                f"'{existing}' is not writable: runs could not save {folder}.",
                f"chmod u+w '{existing}' or run from a folder you own.",
            )
            continue
        report.info(f"{folder}/", f"writable, {free:.1f} GiB free")
        if free < min_free_gb:
            report.problem(
                f"Only {free:.1f} GiB free for '{folder}' (less than {min_free_gb:g} GiB).",
                "free disk space (old runs in logs/ and checkpoints/) or point the run elsewhere.",
            )


def writable(folder: Path) -> bool:
    """Really write a file there: permission bits lie on read-only mounts and for root."""
    try:
        with tempfile.NamedTemporaryFile(dir=folder, prefix=".doctor-") as f:
            f.write(b"ok")
            f.flush()
            os.fsync(f.fileno())
    except OSError:
        return False
    return True


def check_workers(workers: int) -> None:
    """The same bound as --data.num_workers: each worker is a process, and 100,000 of them exhaust memory."""
    cores = usable_cores()
    most = MAX_WORKERS_PER_CORE * cores
    if not 0 <= workers <= most:
        raise UserError(
            f"--workers {workers} is not a number of DataLoader workers to start: it must be from 0 to "
            f"{most} ({MAX_WORKERS_PER_CORE} per CPU core: this process may use {cores}), as "
            "--data.num_workers is.",
            f"pass e.g. --workers {min(2, most)} (0 loads the data in the main process).",
        )


@exits_on_user_error
def main(argv: list[str]) -> None:
    parser = CommandParser(
        prog="python -m project doctor",
        description="Check Python, packages, devices, data loading and disk; "
        "exit 1 with fixes if anything is wrong.",
    )
    parser.add_argument("--folders", nargs="+", type=Path, default=[Path("logs"), Path("checkpoints")])
    parser.add_argument(
        "--min_free_gb", type=float, default=5.0, help="Less free disk than this is a problem."
    )
    parser.add_argument(
        "--workers",
        type=int,
        default=2,
        help=f"DataLoader workers to start: 0 to {MAX_WORKERS_PER_CORE} per CPU core, as --data.num_workers.",
    )
    args = parser.parse_args(argv)
    check_workers(args.workers)
    if not args.min_free_gb >= 0:  # also NaN
        raise UserError(
            f"--min_free_gb {args.min_free_gb} is not a size: it must be 0 or more.",
            "pass e.g. --min_free_gb 5.",
        )
    report = Report()
    check_versions(report)
    check_devices(report)
    check_dataloader(report, args.workers)
    check_folders(report, args.folders, args.min_free_gb)
    print("\n".join(report.lines))
    if report.problems:
        print(f"\n{len(report.problems)} problem(s):")
        print("\n".join(f"  - {p}" for p in report.problems))
        sys.exit(1)
    print("\nAll checks passed.")
