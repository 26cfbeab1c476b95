"""`python -m project sweep --config configs/sweeps/NAME.yaml [fit options] [--sweep.KEY=VALUE] [--summary]`.

An Optuna study over fit's own options. Each trial is an ordinary `fit` in a subprocess (a clean process
per trial, DDP included), run `logs/<study>/trial-<number>` with its checkpoints in
`checkpoints/<study>/trial-<number>`; its result is the best value of sweep.metric over its epochs.

The study lives in sweep.storage (default: the SQLite file logs/<study>/study.db). The same command again
continues the study; started in several terminals, or on several machines sharing a PostgreSQL storage,
it runs trials in parallel until the study has sweep.trials finished (complete or pruned) trials. A
running trial signals life every sweep.heartbeat seconds; one silent for 3x that (its process was
killed) is marked failed by whichever sweep process looks next, and its parameters are queued again.
"""

from __future__ import annotations

import collections
import contextlib
import difflib
import json
import logging
import os
import signal
import socket
import subprocess
import sys
import time
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

try:
    import fcntl
except ImportError:  # Windows: one process per study file
    fcntl = None

import optuna
from optuna.trial import TrialState

from project.errors import UserError, exits_on_user_error, install_hint
from project.runs import CHECKPOINTS, LOGS
from project.sweep.options import check_space_keys, fit_options
from project.sweep.settings import (
    Command,
    Sweep,
    flag,
    make_pruner,
    parse_argv,
    rdb_storage,
    run_name,
    suggest,
)
from project.sweep.summary import summarize
from project.sweep.trial import ENV, PRUNED_AT

CALLBACK = "project.sweep.trial.SweepTrial"
DONE = (TrialState.COMPLETE, TrialState.PRUNED)
MAX_FAILURES = 3  # trials in a row that crash: stop instead of burning the whole budget


class TrialFailed(RuntimeError):
    """The trial's fit crashed or was killed: the trial is marked failed, the sweep goes on."""


class Surplus(RuntimeError):
    """Another process took the last free slot a moment before this one: the trial is not run."""


class _OneLine(logging.Filter):
    """Optuna logs each failed trial with a traceback; ours are expected endings, said in one line."""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.exc_info and isinstance(record.exc_info[1], TrialFailed | Surplus | UserError):
            record.exc_info = None
        return True


logging.getLogger("optuna.study._optimize").addFilter(_OneLine())


def open_study(sweep: Sweep, create: bool = True) -> optuna.Study:
    """Create or load the study in sweep.storage; an unreachable storage is one UserError.

    `create` false (--summary): load it, or fail naming the studies there, creating nothing (no
    database file, no study).
    """
    import sqlalchemy

    url = sweep.storage
    if not create:
        _database_exists(sweep)
    for attempt in range(SCHEMA_TRIES):
        try:
            lock = _schema_lock(url) if create else contextlib.nullcontext()
            if not create and sweep.name not in (names := _study_names(url)):
                raise _no_study(sweep, names, f"'{_masked(url)}'")
            with lock, warnings.catch_warnings():
                warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
                storage = rdb_storage(
                    url,
                    heartbeat_interval=sweep.heartbeat,
                    grace_period=3 * sweep.heartbeat,
                    heartbeat_stale_trial_callback=optuna.storages.RetryHeartbeatStaleTrialCallback(
                        max_retry=1
                    ),
                )
                study = optuna.create_study(
                    study_name=sweep.name,
                    storage=storage,
                    direction=sweep.direction,
                    pruner=make_pruner(sweep.pruner),
                    load_if_exists=True,
                )
            break
        except sqlalchemy.exc.SQLAlchemyError as e:
            if "already exists" in str(e) and attempt + 1 < SCHEMA_TRIES:
                time.sleep(0.5 + attempt)  # another machine created the tables a moment before: load them
                continue
            raise _unreachable(url, e) from None
        except (ImportError, ValueError) as e:
            raise _unreachable(url, e) from None
    if study.direction.name.lower() != sweep.direction:
        raise UserError(
            f"Study '{sweep.name}' in '{_masked(url)}' was created to {study.direction.name.lower()} its "
            f"metric; sweep.direction is {sweep.direction}.",
            "keep the study's direction, or start a new study with another sweep.name.",
        )
    return study


SCHEMA_TRIES = 4


def _study_names(url: str) -> list[str]:
    """The studies in the database at `url`, read without writing: Optuna's RDBStorage creates its
    tables in any database it opens (an empty PostgreSQL database, an SQLite file of other tables)."""
    import sqlalchemy

    engine = sqlalchemy.create_engine(url)
    try:
        if not sqlalchemy.inspect(engine).has_table("studies"):
            return []
        with engine.connect() as connection:
            return [row[0] for row in connection.execute(sqlalchemy.text("SELECT study_name FROM studies"))]
    finally:
        engine.dispose()


def _database_exists(sweep: Sweep) -> None:
    """An SQLite study file that is not there is not created to look into: it holds no study."""
    if not sweep.storage.startswith("sqlite:///"):
        return
    database = Path(sweep.storage.removeprefix("sqlite:///"))
    if not database.is_file():
        # the default storage of a study is logs/<study>/study.db: the names of those in logs/
        names = [p.parent.name for p in LOGS.glob("*/study.db")]
        raise _no_study(sweep, names, f"'{database}' (no such file)", where_names=f"{LOGS}/")


def _no_study(sweep: Sweep, names: list[str], where: str, where_names: str = "there") -> UserError:
    close = difflib.get_close_matches(sweep.name, names, n=3, cutoff=0.6)
    if close:
        hint = f"did you mean {' or '.join(repr(n) for n in close)}? Pass --sweep.name={close[0]}"
        hint += f" (studies {where_names}: {_names(names)})." if len(names) > len(close) else "."
    elif names:
        hint = f"the studies {where_names}: {_names(names)}; pass one with --sweep.name."
    else:
        hint = f"there is no study {where_names}; run the sweep without --summary to start '{sweep.name}'."
    return UserError(
        f"--summary: study '{sweep.name}' does not exist in {where}; nothing was created.",
        f"{hint} Check sweep.storage too: a study is found in the storage that ran it.",
    )


def _names(names: list[str], most: int = 20) -> str:
    shown = ", ".join(repr(n) for n in sorted(names)[:most])
    return shown + (f" and {len(names) - most} more" if len(names) > most else "")


@contextlib.contextmanager
def _schema_lock(url: str) -> Iterator[None]:
    """Processes opening one new SQLite study create its tables one at a time.

    Optuna creates the schema table by table; two processes starting together on a new file both see no
    tables and the second fails with "table ... already exists". A blocking POSIX lock on a file beside
    the database orders them (the kernel drops it if a holder is killed). Other databases are shared by
    several machines, where no local lock helps: open_study retries those instead.
    """
    if not url.startswith("sqlite:///") or fcntl is None:
        yield
        return
    database = Path(url.removeprefix("sqlite:///"))
    database.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(database.with_name(database.name + ".lock"), os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.lockf(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # closing the file releases the lock


def _unreachable(url: str, e: Exception) -> UserError:
    return UserError(
        f"sweep.storage '{_masked(url)}' cannot be opened: {str(e).splitlines()[0]}",
        "check the URL, that the database server runs and is reachable, and that its driver is "
        f"installed (PostgreSQL: {install_hint('postgres', 'psycopg2-binary')}).",
    )


def _masked(url: str) -> str:
    from sqlalchemy.engine import make_url

    try:
        return make_url(url).render_as_string(hide_password=True)
    except Exception:
        return url


class Sweeper:
    """Runs trials in this process until the study has its finished trials."""

    def __init__(self, command: Command, study: optuna.Study) -> None:
        self.sweep, self.fit_args, self.study = command.sweep, command.fit_args, study
        self.number = -1  # the trial this process runs now

    def run(self) -> None:
        failures, waiting_for = 0, None
        while True:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
                optuna.storages.fail_stale_trials(self.study)  # killed elsewhere: failed, and queued again
            trials = self.study.get_trials(deepcopy=False)
            done = sum(t.state in DONE for t in trials)
            running = [t for t in trials if t.state == TrialState.RUNNING]
            if done >= self.sweep.trials:
                return
            if done + len(running) >= self.sweep.trials:
                now = [t.number for t in running]
                if now != waiting_for:
                    waiting_for = now
                    print(
                        f"[sweep {self.sweep.name}] {done}/{self.sweep.trials} done; waiting for "
                        f"{_describe(running)}",
                        flush=True,
                    )
                time.sleep(self.sweep.heartbeat)
                continue
            waiting_for = None
            self.study.optimize(self.objective, n_trials=1, catch=(TrialFailed, Surplus))
            ours = self.study.get_trials(deepcopy=False)[self.number]
            crashed = ours.state == TrialState.FAIL and not ours.user_attrs.get("surplus")
            failures = failures + 1 if crashed else 0
            if failures >= MAX_FAILURES:
                raise UserError(
                    f"{failures} trials in a row failed, the last one "
                    f"{LOGS / run_name(self.sweep.name, self.number)}.",
                    "read its output above; fix the options, then run the same command to continue.",
                )

    def objective(self, trial: optuna.Trial) -> float:
        self.number = trial.number
        ahead = [
            t
            for t in self.study.get_trials(deepcopy=False)
            if t.number < trial.number and t.state in (*DONE, TrialState.RUNNING)
        ]
        if len(ahead) >= self.sweep.trials:
            trial.set_user_attr("surplus", True)
            raise Surplus(f"the study's {self.sweep.trials} trials were taken by other processes")
        params = suggest(trial, self.sweep.space)
        run = run_name(self.sweep.name, trial.number)
        for folder in (LOGS / run, CHECKPOINTS / run):
            if folder.exists():  # this trial is new: another study of the same name wrote the folder
                raise _collision(self.sweep, folder)
        trial.set_user_attr("run", run)
        trial.set_user_attr("host", f"{socket.gethostname()} pid {os.getpid()}")
        print(
            f"[sweep {self.sweep.name}] trial {trial.number} -> {LOGS / run}: "
            + ", ".join(f"{k}={v}" for k, v in params.items()),
            flush=True,
        )
        code, tail = run_fit(self.trial_args(run, params), self.trial_env(trial))
        config = LOGS / run / "config.yaml"
        if config.is_file():  # for reference (who ran what): the summary never runs a stored config
            trial.set_user_attr("config", config.read_text())
        if code == 2:
            problem, _, fix = _last_error(tail).partition(" Fix: ")  # fit's own fix, said once
            raise UserError(
                f"trial {trial.number}'s fit stopped on a mistake in its options: {problem}",
                f"{fix} Then run the same sweep command again."
                if fix
                else "fix the sweep config or the fit flags, then run the same command again.",
            )
        if code != 0:
            raise TrialFailed(f"its fit ended with {_exit(code)}; output in {LOGS / run}")
        frozen = self.study.get_trials(deepcopy=False)[trial.number]
        if PRUNED_AT in frozen.user_attrs:
            raise optuna.TrialPruned(f"pruned after epoch {frozen.user_attrs[PRUNED_AT]}")
        if not frozen.intermediate_values:
            raise TrialFailed(f"its fit ran no validation: no {self.sweep.metric} to report")
        pick = max if self.sweep.direction == "maximize" else min
        return pick(frozen.intermediate_values.values())  # the best epoch, not the last

    def trial_args(self, run: str, params: dict[str, Any]) -> list[str]:
        return [
            "fit", *self.fit_args, *(flag(k, v) for k, v in params.items()),
            f"--name={run}", f"--trainer.callbacks+={CALLBACK}",
        ]  # fmt: skip

    def trial_env(self, trial: optuna.Trial) -> dict[str, str]:
        spec = {
            "storage": self.sweep.storage,
            "study": self.sweep.name,
            "trial_id": trial._trial_id,  # optuna.trial.Trial(study, trial_id) in the fit takes the id
            "metric": self.sweep.metric,
            "pruner": self.sweep.pruner,
            "parent": os.getpid(),
        }
        # the fit imports the same package as this process (a checkout without install too)
        package_root = str(Path(__file__).resolve().parents[2])
        path = os.pathsep.join(p for p in (package_root, os.environ.get("PYTHONPATH")) if p)
        return {**os.environ, ENV: json.dumps(spec), "PYTHONPATH": path}


def check_run_folders(study: optuna.Study, sweep: Sweep) -> None:
    """No trial folder in logs/<study>/ or checkpoints/<study>/ is one this study has not had yet.

    Trial numbers count from 0 in each study: a study of the same name in another storage (or in a
    study database deleted since) would run its trials into the same folders, and fit refuses a run
    that exists, so each of its trials would fail. Said here, before a trial starts.
    """
    found = [f for root in (LOGS, CHECKPOINTS) for f in sorted((root / sweep.name).glob("trial-*"))]
    count = len(study.get_trials(deepcopy=False))  # after the folders: a trial's folder follows it
    for folder in found:
        number = folder.name.removeprefix("trial-")
        if number.isdigit() and int(number) >= count:
            raise _collision(sweep, folder)


def _collision(sweep: Sweep, folder: Path) -> UserError:
    return UserError(
        f"'{folder}' exists, but study '{sweep.name}' in '{_masked(sweep.storage)}' has not run that "
        "trial: another study of the same name (in another storage, or a study database deleted since) "
        f"wrote its trials into {LOGS / sweep.name} and {CHECKPOINTS / sweep.name}.",
        f"give this study its own name (e.g. --sweep.name={sweep.name}-2), or continue the other study "
        "with the sweep.storage it was run with; or move those two folders away.",
    )


def run_fit(args: list[str], env: dict[str, str]) -> tuple[int, str]:
    """Run `python -m project ARGS`, its output shown as it comes; (exit status, the end of its stderr)."""
    process = subprocess.Popen([sys.executable, "-m", "project", *args], stderr=subprocess.PIPE, env=env)
    tail: collections.deque[bytes] = collections.deque(maxlen=64)
    assert process.stderr is not None
    try:
        # chunks, not lines: progress bars redraw with \r
        while chunk := os.read(process.stderr.fileno(), 65536):
            sys.stderr.buffer.write(chunk)
            sys.stderr.buffer.flush()
            tail.append(chunk)
        return process.wait(), b"".join(tail).decode(errors="replace")
    except KeyboardInterrupt:
        # the fit got the same Ctrl-C (one process group): it saves last.ckpt and exits; let it
        process.wait()
        raise


def _last_error(tail: str) -> str:
    lines = [line.strip() for line in tail.replace("\r", "\n").splitlines() if line.strip()]
    errors = [line for line in lines if line.startswith("error:") or "error:" in line.lower()]
    return (errors or lines or ["(no output)"])[-1].removeprefix("error: ")


def _exit(code: int) -> str:
    if code < 0:
        return f"signal {signal.Signals(-code).name}"
    return f"exit status {code}"


def _describe(running: list[optuna.trial.FrozenTrial]) -> str:
    return ", ".join(f"trial {t.number} ({t.user_attrs.get('host', 'starting')})" for t in running)


@exits_on_user_error
def main(argv: list[str]) -> None:
    """Run the sweep (or only its summary)."""
    if {"-h", "--help"} & set(argv):
        print(f"usage: {__doc__.strip()}")
        return
    try:
        command = parse_argv(list(argv))
        # fit's own check of its options first: a mistake there leaves no study behind
        options = None if command.summary else fit_options(command.fit_args)
        study = open_study(command.sweep, create=not command.summary)
        if options is not None:
            check_space_keys(command, options)
            check_run_folders(study, command.sweep)
            Sweeper(command, study).run()
        summarize(study, command)
    except KeyboardInterrupt:
        print(
            "\ninterrupted: the running trial is marked failed; the same command continues the study.",
            file=sys.stderr,
        )
        sys.exit(130)
