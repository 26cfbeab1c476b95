"""Time the bare `python -m project fit` from an empty folder (data generation included).

    python bench/default_fit.py [extra fit flags...]

Prints the wall time, the last and best val/acc read back from the TensorBoard events, when
(seconds after the command started) each epoch's val/acc was logged, and the time to 95%.
Other configs run the same way; paths must be absolute (the command runs in an empty folder):

    python bench/default_fit.py --config $PWD/configs/experiments/cifar10.yaml \
        --data.root=$PWD/data/cifar10/train --trainer.max_time=00:00:10:00 --export_best.enabled=false
"""

from __future__ import annotations

import subprocess
import sys
import tempfile
import time
from pathlib import Path

from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

TARGET = 0.95


def main() -> None:
    with tempfile.TemporaryDirectory() as work:
        command = [sys.executable, "-m", "project", "fit", "--trainer.enable_progress_bar=false"]
        command += sys.argv[1:]
        start, wall_start = time.perf_counter(), time.time()
        subprocess.run(command, cwd=work, check=True, stdout=subprocess.DEVNULL)
        seconds = time.perf_counter() - start
        (run,) = (Path(work) / "logs").iterdir()
        events = EventAccumulator(str(run))
        events.Reload()
        logged = events.Scalars("val/acc")
        accuracy = [e.value for e in logged]
        last, best = accuracy[-1], max(accuracy)
        print(f"wall time {seconds:.1f} s, epochs {len(accuracy)}, val/acc last {last:.4f}, best {best:.4f}")
        print(
            "val/acc by epoch: "
            + " ".join(f"{e.value:.3f} (at {e.wall_time - wall_start:.0f} s)" for e in logged)
        )
        reached = [e.wall_time - wall_start for e in logged if e.value >= TARGET]
        print(f"time to val/acc >= {TARGET}: " + (f"{reached[0]:.0f} s" if reached else "not reached"))


if __name__ == "__main__":
    main()
