"""Loader workers outlive SIGTERM/SIGINT sent to the whole process group; the main process stops them.

SLURM preemption, `kill -- -PGID` and Ctrl-C signal every process of the group, loader workers
included. PyTorch's worker installs a SIGTERM handler that kills the worker unless the signal comes from
its parent; the main process then fails at its next batch ("DataLoader worker ... is killed by signal:
Terminated") before GracefulStop can save the interruption checkpoint.
"""

from __future__ import annotations

import os
import signal
import threading

from lightning.fabric.utilities.seed import pl_worker_init_function

_SIGNALS = {signal.SIGTERM, signal.SIGINT}


def worker_init(worker_id: int) -> None:
    """DataLoader `worker_init_fn`: leave SIGTERM/SIGINT to the main process; seed as Lightning would.

    Lightning adds its own seeding `worker_init_fn` only to a loader without one, so this one calls it
    (`seed_everything(workers=True)`, which LightningCLI uses, sets PL_SEED_WORKERS).

    Args:
        worker_id: The worker's index in its loader.
    """
    if int(os.environ.get("PL_SEED_WORKERS", 0)):
        pl_worker_init_function(worker_id)
    _leave_signals_to_the_parent()


def _leave_signals_to_the_parent() -> None:
    """Block SIGTERM/SIGINT in this worker; a thread takes them: the parent's SIGTERM ends it, others not.

    Why not SIG_IGN: the parent's own `terminate()` (its shutdown's fallback, and multiprocessing's at
    exit, which then joins) must still end the worker, and only the sender's pid tells them apart;
    Python's handlers do not see it, `sigwaitinfo` does. Threads started later inherit the mask, and a
    worker has no other thread yet (it runs this before its first item).
    """
    if not hasattr(signal, "sigwaitinfo"):  # macOS, Windows: PyTorch's own handling stays
        return
    parent = os.getppid()
    signal.pthread_sigmask(signal.SIG_BLOCK, _SIGNALS)

    def take_signals() -> None:
        while True:
            info = signal.sigwaitinfo(_SIGNALS)
            if info.si_signo == signal.SIGTERM and info.si_pid == parent:
                os._exit(0)  # as PyTorch's handler does: a non-zero exit would be reported as a failure

    threading.Thread(target=take_signals, name="loader-worker-signals", daemon=True).start()
