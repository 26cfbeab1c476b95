"""Start-up time of the commands against `python -c "import lightning"`, and which ones import it.

    python bench/startup.py [--rounds 5]

Runs each command as a fresh process, alternating them, `--rounds` times, and prints the median
wall time, the ratio to importing Lightning, and whether the command imported torch or lightning
(from `python -X importtime`). The Lightning subcommands need Lightning, so for them the target is
a small ratio; the torch-free ones (infer, report, new) must not import torch at all.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time

COMMANDS = {
    "import lightning": ["-c", "import lightning"],
    "--help": ["-m", "project", "--help"],
    "fit --help": ["-m", "project", "fit", "--help"],
    "infer --help": ["-m", "project", "infer", "--help"],
    "report --help": ["-m", "project", "report", "--help"],
    "new --help": ["-m", "project", "new", "--help"],
}


def seconds(args: list[str]) -> float:
    started = time.perf_counter()
    subprocess.run([sys.executable, *args], check=True, stdout=subprocess.DEVNULL)
    return time.perf_counter() - started


def imported(args: list[str]) -> str:
    log = subprocess.run(
        [sys.executable, "-X", "importtime", *args], check=True, capture_output=True, text=True
    ).stderr
    modules = {line.split("|")[-1].strip() for line in log.splitlines() if "|" in line}
    return ", ".join(name for name in ("torch", "lightning") if name in modules) or "neither"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    times: dict[str, list[float]] = {name: [] for name in COMMANDS}
    for _ in range(args.rounds):
        for name, command in COMMANDS.items():
            times[name].append(seconds(command))
    base = statistics.median(times["import lightning"])
    print(f"{'command':24s} {'median s':>9s} {'ratio':>6s}  imports")
    for name, command in COMMANDS.items():
        median = statistics.median(times[name])
        print(f"{name:24s} {median:9.2f} {median / base:6.2f}  {imported(command)}")


if __name__ == "__main__":
    main()
