"""Time the bare `python -m project fit` from an empty folder (data generation included).

    python bench/default_fit.py [extra fit flags...]

Prints the wall time and the last and best val/acc read back from the TensorBoard events.
"""

from __future__ import annotations

import subprocess
import sys
import tempfile
import time
from pathlib import Path

from tensorboard.backend.event_processing.event_accumulator import EventAccumulator


def main() -> None:
    with tempfile.TemporaryDirectory() as work:
        command = [sys.executable, "-m", "project", "fit", "--trainer.enable_progress_bar=false"]
        command += sys.argv[1:]
        start = time.perf_counter()
        subprocess.run(command, cwd=work, check=True, stdout=subprocess.DEVNULL)
        seconds = time.perf_counter() - start
        (run,) = (Path(work) / "logs").iterdir()
        events = EventAccumulator(str(run))
        events.Reload()
        accuracy = [e.value for e in events.Scalars("val/acc")]
        last, best = accuracy[-1], max(accuracy)
        print(f"wall time {seconds:.1f} s, epochs {len(accuracy)}, val/acc last {last:.4f}, best {best:.4f}")
        print("val/acc by epoch: " + " ".join(f"{a:.3f}" for a in accuracy))


if __name__ == "__main__":
    main()
