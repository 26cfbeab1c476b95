"""project.sweep: its checks, the trial logic, the fit-side callback, whole sweeps surviving a kill."""

from __future__ import annotations

import json
import logging
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import warnings
from collections.abc import Iterator
from pathlib import Path

import lightning as L
import optuna
import pytest
import sqlalchemy
import torch
import yaml
from optuna.distributions import CategoricalDistribution, FloatDistribution
from optuna.trial import TrialState

import project
from project.errors import UserError
from project.sweep import command
from project.sweep.settings import parse_argv
from project.sweep.trial import ENV, PRUNED_AT, SweepTrial
from tests.helpers import exit_status, fast_args, run_cli, tiny_trainer

SPACE = {
    "model.optimizer.init_args.lr": {"type": "float", "low": 1e-4, "high": 1e-2, "log": True},
    "model.optimizer.init_args.weight_decay": {"type": "float", "low": 1e-4, "high": 0.1, "log": True},
}
TRIAL_FLAGS = (
    "--trainer.limit_train_batches=2",
    "--trainer.limit_val_batches=1",
    "--trainer.enable_model_summary=false",
)


def sweep_config(folder: Path, **section: object) -> Path:
    """A sweep config: one fit option and a `sweep:` section (name, space and the given keys)."""
    path = folder / "tiny.yaml"
    path.write_text(
        yaml.safe_dump({"confusion_matrix": {"enabled": False}, "sweep": {"space": SPACE, **section}})
    )
    return path


@pytest.mark.parametrize(
    ("section", "flags", "message"),
    [
        (
            {"space": {"model.backbone": {"type": "choice", "choices": ["a"]}}},
            [],
            "sweep.space.model.backbone: type 'choice'",
        ),
        (
            {"space": {"x.lr": {"type": "float", "low": 0.1, "high": 0.01}}},
            [],
            "sweep.space.x.lr: low=0.1 is above high=0.01",
        ),
        (
            {"space": {"x.lr": {"type": "float", "low": 0, "high": 1, "log": True}}},
            [],
            "log=true needs low > 0",
        ),
        (
            {"space": {"x.n": {"type": "int", "low": 1.5, "high": 3}}},
            [],
            "sweep.space.x.n: low=1.5 is not an integer",
        ),
        ({"space": {}}, [], "sweep.space is {}"),
        ({"pruner": "bogus"}, [], "sweep.pruner 'bogus' is not a pruner"),
        ({"pruner": {"type": "median", "n_warmup": 1}}, [], "sweep.pruner median does not take"),
        ({"trails": 3}, [], "'sweep.trails' is not a sweep setting. Fix: did you mean 'trials'?"),
        ({}, ["--sweep.trials=0"], "sweep.trials=0 must be an integer >= 1"),
        ({}, ["--sweep.direction=up"], "sweep.direction='up'"),
        ({}, ["--name=x"], "--name cannot be given to sweep"),
    ],
)
def test_settings_mistakes_name_the_key(
    tmp_path: Path, section: dict, flags: list[str], message: str
) -> None:
    config = sweep_config(tmp_path, **section)
    with pytest.raises(UserError, match=None) as error:
        parse_argv(["--config", str(config), *flags])
    assert message in str(error.value)
    assert "\n" not in str(error.value)


def test_settings_defaults_and_flags(tmp_path: Path) -> None:
    """The study is named after the file; flags override the section; fit gets the config less `sweep:`."""
    config = sweep_config(tmp_path, trials=5)
    parsed = parse_argv(["--config", str(config), "--sweep.trials=7", "--trainer.max_epochs=2", "--summary"])
    assert (parsed.sweep.name, parsed.sweep.trials, parsed.summary) == ("tiny", 7, True)
    assert parsed.sweep.storage == "sqlite:///logs/tiny/study.db"
    assert (parsed.sweep.metric, parsed.sweep.direction, parsed.sweep.pruner) == (
        "val/acc",
        "maximize",
        {"type": "median"},
    )
    assert parsed.fit_args[0] == "--config" and yaml.safe_load(parsed.fit_args[1]) == {
        "confusion_matrix": {"enabled": False}
    }
    assert parsed.fit_args[2:] == ["--trainer.max_epochs=2"]


def test_space_keys_are_checked_against_fit(tmp_path: Path, shapes_root: Path) -> None:
    """A searched key fit does not have ends the sweep before any trial, naming it and the close match."""
    config = sweep_config(
        tmp_path, space={"model.optimizer.init_args.lrr": {"type": "float", "low": 1e-4, "high": 1e-2}}
    )
    parsed = parse_argv(["--config", str(config), *fast_args(shapes_root)])
    options = command.fit_options(parsed.fit_args)
    with pytest.raises(
        UserError,
        match=r"'model.optimizer.init_args.lrr' is not an option of fit.*"
        r"did you mean 'model.optimizer.init_args.lr'",
    ):
        command.check_space_keys(parsed, options)
    parsed = parse_argv(["--config", str(sweep_config(tmp_path)), "--model.optimizer.init_args.lr=0.1"])
    with pytest.raises(UserError, match=r"--model.optimizer.init_args.lr is given as a flag"):
        command.check_space_keys(parsed, options)


def test_a_mistake_in_fits_options_creates_no_study(
    workdir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = sweep_config(workdir)
    assert exit_status(command.main, "--config", str(config), "--data.batch_size=abc") == 2
    assert "--data.batch_size=abc is not an integer" in capsys.readouterr().err
    assert not (workdir / "logs").exists()  # no logs/tiny/study.db


def test_unreachable_storage_is_one_message(tmp_path: Path) -> None:
    config = sweep_config(tmp_path, storage="postgresql://user:secret@127.0.0.1:1/none")
    with pytest.raises(
        UserError, match=r"sweep.storage 'postgresql://user:\*\*\*@127.0.0.1:1/none' cannot be opened"
    ) as e:
        command.open_study(parse_argv(["--config", str(config)]).sweep)
    assert "secret" not in str(e.value)


OPEN_AT = """
import sys, time
from project.sweep import command
from project.sweep.settings import parse_argv
print("ready", flush=True)
for line in sys.stdin:  # one study a line: its config and the instant to open it at
    config, start = line.split()
    sweep = parse_argv(["--config", config]).sweep
    time.sleep(max(0.0, float(start) - time.time()))
    command.open_study(sweep)
    print("opened", flush=True)
"""


@pytest.mark.slow  # 4 interpreters importing the sweep at once: about 40 s on 2 busy cores
def test_processes_starting_together_on_a_new_study_all_open_it(tmp_path: Path) -> None:
    """Sweeps started at the same instant on a new SQLite file: each opens the study (they used to race
    creating its tables, and all but one failed with "table ... already exists"). Three new studies,
    each opened by the same 4 processes at once (an interpreter costs seconds to start, a study not)."""
    processes = [
        subprocess.Popen(
            [sys.executable, "-c", OPEN_AT],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env={**os.environ, "PYTHONPATH": str(Path(project.__file__).parents[1])},
        )
        for _ in range(4)
    ]
    watchdog = threading.Timer(300, lambda: [p.kill() for p in processes])  # a hang ends the reads
    watchdog.start()
    try:
        assert [p.stdout.readline().strip() for p in processes] == ["ready"] * 4  # each has imported
        for attempt in range(3):
            database = tmp_path / f"study-{attempt}.db"
            config = sweep_config(tmp_path, name="together", storage=f"sqlite:///{database}")
            start = time.time() + 2  # after every process has parsed the config
            for p in processes:
                p.stdin.write(f"{config} {start}\n")
                p.stdin.flush()
            answers = [p.stdout.readline().strip() for p in processes]
            failed = [p for p, answer in zip(processes, answers, strict=True) if answer != "opened"]
            assert failed == [], [p.wait(60) and p.stderr.read()[-2000:] for p in failed]
            assert optuna.load_study(study_name="together", storage=f"sqlite:///{database}").trials == []
        for p in processes:
            p.stdin.close()
        assert [p.wait(60) for p in processes] == [0] * 4, [p.stderr.read() for p in processes]
    finally:
        watchdog.cancel()
        for p in processes:
            p.kill()
            p.wait()


# The trial logic, with the fit replaced by what a fit does to the study (see SweepTrial).
def fake_fit(values: dict[int, float], code: int = 0, pruned: bool = False):
    def run_fit(args: list[str], env: dict[str, str]) -> tuple[int, str]:
        spec = json.loads(env[ENV])
        storage = optuna.storages.RDBStorage(spec["storage"])
        for step, value in values.items():
            storage.set_trial_intermediate_value(spec["trial_id"], step, value)
        if pruned:
            storage.set_trial_user_attr(spec["trial_id"], PRUNED_AT, max(values))
        run = next(a for a in args if a.startswith("--name=")).removeprefix("--name=")
        (Path("logs") / run).mkdir(parents=True)
        (Path("logs") / run / "config.yaml").write_text(f"name: {run}\ntrainer: {{max_epochs: 3}}\n")
        return code, "error: bad option --x\n" if code == 2 else ""

    return run_fit


def sweeper(tmp_path: Path, trials: int = 1, **section: object) -> command.Sweeper:
    parsed = parse_argv(["--config", str(sweep_config(tmp_path, trials=trials, **section))])
    return command.Sweeper(parsed, command.open_study(parsed.sweep))


def test_trial_value_is_the_best_epoch(workdir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(command, "run_fit", fake_fit({0: 0.5, 1: 0.9, 2: 0.7}))
    maximize = sweeper(workdir)
    maximize.run()
    assert maximize.study.best_value == 0.9
    minimize = sweeper(workdir, name="loss", direction="min", metric="val/loss")
    minimize.run()
    assert minimize.study.best_value == 0.5
    assert minimize.study.best_trial.user_attrs["run"] == "loss/trial-0000"
    assert "max_epochs: 3" in minimize.study.best_trial.user_attrs["config"]


def test_pruned_and_crashed_trials(workdir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A pruned fit is a finished trial; a crashed one is failed and re-run; three in a row stop the sweep."""
    monkeypatch.setattr(command, "run_fit", fake_fit({0: 0.1}, pruned=True))
    s = sweeper(workdir, trials=2)
    s.run()
    assert [t.state for t in s.study.trials] == [TrialState.PRUNED, TrialState.PRUNED]
    monkeypatch.setattr(command, "run_fit", fake_fit({0: 0.3}, code=-signal.SIGKILL))
    with pytest.raises(UserError, match=r"3 trials in a row failed, the last one logs/tiny/trial-0004"):
        sweeper(workdir, trials=3).run()
    assert [t.state for t in s.study.get_trials()][2:] == [TrialState.FAIL] * 3


def test_option_mistake_in_a_trial_stops_the_sweep(workdir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(command, "run_fit", fake_fit({}, code=2))
    records: list[logging.LogRecord] = []
    handler = logging.Handler()
    handler.emit = records.append  # type: ignore[method-assign]
    logging.getLogger("optuna.study._optimize").addHandler(handler)
    s = sweeper(workdir, trials=5)
    with pytest.raises(UserError, match=r"trial 0's fit stopped on a mistake in its options: bad option --x"):
        s.run()
    assert [t.state for t in s.study.trials] == [TrialState.FAIL]
    logging.getLogger("optuna.study._optimize").removeHandler(handler)
    failed = [r for r in records if "failed with parameters" in r.getMessage()]
    assert failed and all(r.exc_info is None for r in failed)  # optuna's log of it: one line, no traceback


def test_last_slot_taken_by_another_process(workdir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Two processes that start a trial for the last slot at once: the later trial is failed unrun."""
    monkeypatch.setattr(command, "run_fit", fake_fit({0: 0.5}))
    s = sweeper(workdir, trials=1)
    other = s.study.ask()  # another process's trial, running
    s.study.optimize(s.objective, n_trials=1, catch=(command.Surplus,))
    surplus = s.study.get_trials()[1]
    assert (surplus.state, surplus.user_attrs, surplus.params) == (TrialState.FAIL, {"surplus": True}, {})
    assert not (workdir / "logs" / "tiny" / "trial-0001").exists()
    s.study.tell(other, 0.7)
    s.run()  # the study has its trial: nothing more to run
    assert len(s.study.get_trials()) == 2


def test_summary_without_complete_trial(workdir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    parsed = parse_argv(["--config", str(sweep_config(workdir)), "--summary"])
    command.open_study(parsed.sweep)
    with pytest.raises(SystemExit) as e:
        command.main(["--config", str(sweep_config(workdir)), "--summary"])
    assert e.value.code == 2
    assert "error: Study 'tiny' has no complete trial yet." in capsys.readouterr().err
    assert not (workdir / "logs" / parsed.sweep.name / "best.yaml").exists()


def summary(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str]:
    """`sweep ARGS --summary` in this process: (exit status, stderr)."""
    status = exit_status(command.main, *args, "--summary")
    return status, capsys.readouterr().err


EVIL = "trainer:\n  callbacks:\n  - class_path: os.system\n    init_args: {command: touch marker}\n"


def test_best_yaml_is_built_from_the_local_config_and_the_trials_parameters(
    workdir: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """The config stored with the best trial (anyone who can write the study storage controls it) is
    never copied: best.yaml is the sweep config and flags given to --summary plus the trial's parameters."""
    monkeypatch.setattr(command, "run_fit", fake_fit({0: 0.5}))
    s = sweeper(workdir)
    s.run()
    best = s.study.best_trial
    with sqlalchemy.create_engine("sqlite:///logs/tiny/study.db").begin() as db:  # as anyone with access can
        db.execute(
            sqlalchemy.text("UPDATE trial_user_attributes SET value_json = :v WHERE key = 'config'"),
            {"v": json.dumps(EVIL)},
        )
    stored = optuna.load_study(study_name="tiny", storage="sqlite:///logs/tiny/study.db")
    assert stored.best_trial.user_attrs["config"] == EVIL
    config = str(sweep_config(workdir))
    status, err = summary(capsys, "--config", config, "--trainer.max_epochs=7")
    assert status == 0, err
    text = (workdir / "logs" / "tiny" / "best.yaml").read_text()
    assert "os.system" not in text
    written = yaml.safe_load(text)
    assert written["trainer"]["max_epochs"] == 7  # the flag given to --summary
    assert written["confusion_matrix"]["enabled"] is False  # the sweep config's own option
    init_args = written["model"]["optimizer"]["init_args"]
    assert init_args["lr"] == best.params["model.optimizer.init_args.lr"]
    assert init_args["weight_decay"] == best.params["model.optimizer.init_args.weight_decay"]
    assert "name" not in written and written["checkpoint"]["dirpath"] is None


@pytest.mark.parametrize(
    ("params", "attrs", "message"),
    [
        (  # a searched option outside its range
            {"model.optimizer.init_args.lr": (5.0, FloatDistribution(1e-4, 9, log=True))},
            {},
            "has model.optimizer.init_args.lr=5.0, which sweep.space.model.optimizer.init_args.lr",
        ),
        (  # an option the sweep does not search
            {"trainer.callbacks": ("os.system", CategoricalDistribution(["os.system"]))},
            {},
            "has the parameters ['model.optimizer.init_args.lr', 'model.optimizer.init_args.weight_decay', "
            "'trainer.callbacks'], but sweep.space searches",
        ),
        (  # a run name leading elsewhere
            {},
            {"run": "../../../etc"},
            "records its run as '../../../etc'; this sweep names it 'tiny/trial-0001'",
        ),
    ],
)
def test_summary_refuses_a_best_trial_the_sweep_cannot_have_written(
    workdir: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    params: dict,
    attrs: dict,
    message: str,
) -> None:
    """A trial added to a shared study storage by someone else, better than every real one."""
    monkeypatch.setattr(command, "run_fit", fake_fit({0: 0.5}))
    s = sweeper(workdir)
    s.run()
    real = s.study.best_trial
    planted = {**real.params, **{k: v for k, (v, _) in params.items()}}
    distributions = {**real.distributions, **{k: d for k, (_, d) in params.items()}}
    s.study.add_trial(
        optuna.trial.create_trial(
            params=planted,
            distributions=distributions,
            value=1.0,
            user_attrs={"run": "tiny/trial-0001", "config": EVIL, **attrs},
        )
    )
    status, err = summary(capsys, "--config", str(sweep_config(workdir)))
    assert status == 2
    assert f"error: Trial 1 of study 'tiny' {message}" in err and err.count("Fix:") == 1
    assert not (workdir / "logs" / "tiny" / "best.yaml").exists()


def test_summary_of_a_study_that_does_not_exist_creates_nothing(
    workdir: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(command, "run_fit", fake_fit({0: 0.5}))
    sweeper(workdir).run()  # study 'tiny' in logs/tiny/study.db
    config = str(sweep_config(workdir))
    status, err = summary(capsys, "--config", config, "--sweep.name=tiyn")
    assert status == 2
    assert "error: --summary: study 'tiyn' does not exist in 'logs/tiyn/study.db' (no such file)" in err
    assert "Fix: did you mean 'tiny'? Pass --sweep.name=tiny." in err
    assert not (workdir / "logs" / "tiyn").exists()
    # a storage that exists, without that study: it is not added
    storage = "--sweep.storage=logs/tiny/study.db"
    status, err = summary(capsys, "--config", config, "--sweep.name=other", storage)
    assert status == 2
    assert "study 'other' does not exist in 'sqlite:///logs/tiny/study.db'; nothing was created" in err
    assert "the studies there: 'tiny'; pass one with --sweep.name." in err
    assert optuna.get_all_study_names("sqlite:///logs/tiny/study.db") == ["tiny"]


def test_summary_reads_a_database_without_optunas_tables_without_creating_them(
    workdir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Optuna's RDBStorage creates its tables in any database it opens (an empty PostgreSQL database
    too): the names are read with plain SQL first, and a database without a study is left as it was."""
    database = workdir / "shared.db"
    engine = sqlalchemy.create_engine(f"sqlite:///{database}")
    with engine.begin() as connection:
        connection.execute(sqlalchemy.text("CREATE TABLE notes (text TEXT)"))
    config = str(sweep_config(workdir))
    status, err = summary(capsys, "--config", config, "--sweep.name=tiny", f"--sweep.storage={database}")
    assert status == 2
    assert f"study 'tiny' does not exist in 'sqlite:///{database}'; nothing was created" in err
    assert sqlalchemy.inspect(engine).get_table_names() == ["notes"]
    engine.dispose()


def test_a_study_of_the_same_name_in_another_storage_stops_before_its_first_trial(
    workdir: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Both studies would run trial 0 into logs/tiny/trial-0000: said once, before any trial."""
    monkeypatch.setattr(command, "run_fit", fake_fit({0: 0.5}))
    sweeper(workdir).run()  # logs/tiny/trial-0000 of the study in logs/tiny/study.db
    status = exit_status(command.main, "--config", str(sweep_config(workdir)), "--sweep.storage=other.db")
    err = capsys.readouterr().err
    assert status == 2
    assert (
        "error: 'logs/tiny/trial-0000' exists, but study 'tiny' in 'sqlite:///other.db' has not run that "
        "trial: another study of the same name"
    ) in err
    assert err.count("Fix:") == 1 and "--sweep.name=tiny-2" in err
    assert optuna.load_study(study_name="tiny", storage="sqlite:///other.db").trials == []
    # a folder that appears while the sweep runs: that trial fails with the same message
    (workdir / "logs" / "tiny" / "trial-0001").mkdir()
    with pytest.raises(
        UserError, match=r"'logs/tiny/trial-0001' exists, but study 'tiny' in 'sqlite:///logs"
    ):
        sweeper(workdir, trials=2).run()


def test_a_trials_fit_error_keeps_its_own_fix(workdir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    said = "error: --data.root 'x' does not exist. Fix: pass a folder.\n"
    monkeypatch.setattr(command, "run_fit", lambda args, env: (2, said))
    with pytest.raises(UserError) as error:
        sweeper(workdir).run()
    assert str(error.value) == (
        "trial 0's fit stopped on a mistake in its options: --data.root 'x' does not exist. "
        "Fix: pass a folder. Then run the same sweep command again."
    )


# The fit side: SweepTrial in a real Trainer.
class Scores(L.LightningModule):
    """Logs val/acc = 0.1 each validation."""

    def __init__(self) -> None:
        super().__init__()
        self.layer = torch.nn.Linear(1, 1)

    def training_step(self, batch: object, batch_idx: int) -> torch.Tensor:
        return self.layer(torch.ones(1, 1)).sum()

    def validation_step(self, batch: object, batch_idx: int) -> None:
        self.log("val/acc", 0.1, batch_size=1)

    def train_dataloader(self) -> list:
        return [0]

    def val_dataloader(self) -> list:
        return [0]

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.1)


@pytest.mark.slow
@pytest.mark.parametrize(("lower", "epochs"), [(0.5, 1), (0.0, 3)])
def test_sweep_trial_reports_and_stops_when_pruned(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, lower: float, epochs: int
) -> None:
    url = f"sqlite:///{tmp_path / 'study.db'}"
    study = optuna.create_study(study_name="s", storage=url)
    trial = study.ask()
    pruner = {"type": "threshold", "lower": lower}  # val/acc 0.1 < lower: pruned at once
    spec = {"storage": url, "study": "s", "trial_id": trial._trial_id, "metric": "val/acc", "pruner": pruner}
    monkeypatch.setenv(ENV, json.dumps(spec))
    trainer = tiny_trainer(SweepTrial(), max_epochs=3)
    trainer.fit(Scores())
    assert trainer.current_epoch == epochs
    frozen = study.get_trials()[0]
    assert frozen.intermediate_values == {e: pytest.approx(0.1) for e in range(epochs)}
    assert frozen.user_attrs.get(PRUNED_AT) == (0 if lower else None)


@pytest.mark.slow
def test_sweep_trial_names_a_metric_not_logged(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    url = f"sqlite:///{tmp_path / 'study.db'}"
    trial = optuna.create_study(study_name="s", storage=url).ask()
    spec = {
        "storage": url,
        "study": "s",
        "trial_id": trial._trial_id,
        "metric": "val/f1",
        "pruner": {"type": "none"},
    }
    monkeypatch.setenv(ENV, json.dumps(spec))
    with pytest.raises(
        UserError, match=r"sweep.metric 'val/f1' was not logged by this fit \(logged: val/acc\)"
    ):
        tiny_trainer(SweepTrial()).fit(Scores())
    monkeypatch.delenv(ENV)
    with pytest.raises(UserError, match="not started by one"):
        SweepTrial()


# Whole sweeps: processes as a user starts them.
def start_sweep(workdir: Path, config: Path, root: Path, *extra: str) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": str(Path(project.__file__).parents[1]), "OMP_NUM_THREADS": "1"}
    args = ["--config", str(config), *fast_args(root, *TRIAL_FLAGS), *extra]
    log = open(workdir / f"sweep-{time.monotonic_ns()}.log", "w")  # noqa: SIM115 (the process keeps it)
    return subprocess.Popen(
        [sys.executable, "-m", "project", "sweep", *args], cwd=workdir, env=env, stdout=log, stderr=log
    )


def wait_for(condition, timeout: float, what: str) -> object:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if found := condition():
            return found
        time.sleep(0.2)
    raise AssertionError(f"timed out waiting for {what}")


def finish(process: subprocess.Popen, workdir: Path, timeout: float = 400) -> None:
    assert process.wait(timeout) == 0, "\n".join(p.read_text()[-3000:] for p in workdir.glob("sweep-*.log"))


@pytest.mark.slow
def test_two_processes_one_killed_then_rerun(workdir: Path, shapes_root: Path) -> None:
    """Two sweeps share one SQLite study; one is SIGKILLed mid-trial and the command re-run: the study
    ends with its 3 complete trials, the killed trial failed (and its parameters re-run), a best.yaml
    that fit runs, and the pictures."""
    config = sweep_config(workdir, name="tiny", trials=3, heartbeat=1)
    first = start_sweep(workdir, config, shapes_root)
    second = start_sweep(workdir, config, shapes_root)
    storage = f"sqlite:///{workdir / 'logs/tiny/study.db'}"

    def second_is_training() -> optuna.trial.FrozenTrial | None:
        try:  # under the sweeps' schema lock: optuna creates missing tables even to load a study
            with command._schema_lock(storage):
                trials = optuna.load_study(study_name="tiny", storage=storage).get_trials()
        except (KeyError, sqlalchemy.exc.OperationalError):  # not created yet
            return None
        return next(
            (t for t in trials if t.state == TrialState.RUNNING
             and t.user_attrs.get("host", "").endswith(f"pid {second.pid}")
             and (workdir / "logs" / t.user_attrs["run"] / "hparams.yaml").exists()),
            None,
        )  # fmt: skip

    killed = wait_for(second_is_training, 240, "the second sweep's trial to train")
    second.send_signal(signal.SIGKILL)
    second.wait()
    again = start_sweep(workdir, config, shapes_root)
    finish(first, workdir)
    finish(again, workdir)

    study = optuna.load_study(study_name="tiny", storage=storage)
    states = [t.state for t in study.trials]
    assert states.count(TrialState.COMPLETE) == 3, states
    assert TrialState.RUNNING not in states
    assert study.trials[killed.number].state == TrialState.FAIL
    retry = optuna.storages.RetryHeartbeatStaleTrialCallback
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        retried = [retry.retried_trial_number(t) for t in study.trials]
    assert killed.number in retried  # its slot re-run, with its parameters
    for trial in study.get_trials(states=(TrialState.COMPLETE,)):
        assert (workdir / "logs" / trial.user_attrs["run"] / "config.yaml").is_file()
        assert any((workdir / "checkpoints" / trial.user_attrs["run"]).glob("last*.ckpt"))
    folder = workdir / "logs" / "tiny"
    best = yaml.safe_load((folder / "best.yaml").read_text())
    assert "name" not in best and best["checkpoint"]["dirpath"] is None
    assert best["model"]["optimizer"]["init_args"]["lr"] == study.best_params["model.optimizer.init_args.lr"]
    assert all(
        c["class_path"] != "project.sweep.trial.SweepTrial" for c in best["trainer"]["callbacks"] or []
    )
    assert (folder / "optimization_history.png").stat().st_size > 1000
    assert (folder / "parallel_coordinate.png").stat().st_size > 1000

    assert run_cli("fit", "--config", str(folder / "best.yaml"), "--name=best") == 0
    assert (workdir / "checkpoints" / "best" / "last.ckpt").is_file()


@pytest.fixture
def postgres() -> Iterator[str]:
    """A throwaway PostgreSQL server (initdb, pg_ctl) on a free local port; its URL."""
    pytest.importorskip("psycopg2", reason="psycopg2 (PostgreSQL's driver; in .[dev]) is not installed")
    initdb, pg_ctl = shutil.which("initdb"), shutil.which("pg_ctl")
    if not (initdb and pg_ctl):
        pytest.skip("PostgreSQL is not installed on this machine (no initdb/pg_ctl on PATH)")
    as_user: list[str] = []
    data = Path(tempfile.mkdtemp(prefix="sweep-pg-"))
    if os.geteuid() == 0:  # PostgreSQL refuses to run as root
        if not shutil.which("runuser"):
            pytest.skip("running as root without runuser: PostgreSQL cannot be started")
        as_user = ["runuser", "-u", "postgres", "--"]
        shutil.chown(data, "postgres")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    run = lambda *a: subprocess.run([*as_user, *a], check=True, capture_output=True)  # noqa: E731
    try:
        run(initdb, "-D", str(data / "db"), "-A", "trust", "-U", "sweep")
        options = f"-p {port} -k {data} -c listen_addresses=127.0.0.1 -c fsync=off"
        run(pg_ctl, "-D", str(data / "db"), "-o", options, "-l", str(data / "log"), "-w", "start")
        yield f"postgresql+psycopg2://sweep@127.0.0.1:{port}/postgres"
    finally:
        subprocess.run(
            [*as_user, pg_ctl, "-D", str(data / "db"), "-m", "immediate", "stop"], capture_output=True
        )
        shutil.rmtree(data, ignore_errors=True)


@pytest.mark.slow
def test_postgresql_storage(workdir: Path, monkeypatch: pytest.MonkeyPatch, postgres: str) -> None:
    """The multi-machine set-up's storage: a study in a PostgreSQL server, reached by URL from the sweep
    process (its trials, heartbeats) and from a trial's fit (SweepTrial). Whole sweeps: the SQLite test."""
    monkeypatch.setattr(command, "run_fit", fake_fit({0: 0.2, 1: 0.4}))
    s = sweeper(workdir, trials=2, name="pg", storage=postgres)
    s.run()
    study = optuna.load_study(study_name="pg", storage=postgres)
    assert [t.value for t in study.trials] == [0.4, 0.4]
    trial = study.ask()
    spec = {"storage": postgres, "study": "pg", "trial_id": trial._trial_id, "metric": "val/acc",
            "pruner": {"type": "none"}}  # fmt: skip
    monkeypatch.setenv(ENV, json.dumps(spec))
    tiny_trainer(SweepTrial(), max_epochs=2).fit(Scores())
    assert study.get_trials()[2].intermediate_values == {0: pytest.approx(0.1), 1: pytest.approx(0.1)}
    assert not (workdir / "logs" / "pg" / "study.db").exists()


@pytest.mark.skipif(sys.platform != "linux", reason="reads /proc")
def test_a_trial_whose_sweep_process_dies_stops(tmp_path: Path) -> None:
    """The fit of a SIGKILLed sweep process gets SIGTERM (GracefulStop: last.ckpt, exit) within seconds."""
    ready = tmp_path / "ready"
    fit = (
        "import os, time\nfrom project.sweep.trial import _stop_when_orphaned\n"
        f"_stop_when_orphaned(os.getppid())\nopen({str(ready)!r}, 'w').close()\ntime.sleep(120)\n"
    )
    sweep = (
        "import subprocess, sys, time\n"
        f"print(subprocess.Popen([sys.executable, '-c', {fit!r}]).pid, flush=True)\ntime.sleep(120)\n"
    )
    env = {**os.environ, "PYTHONPATH": str(Path(project.__file__).parents[1])}
    parent = subprocess.Popen([sys.executable, "-c", sweep], stdout=subprocess.PIPE, env=env, text=True)
    child = int(parent.stdout.readline())
    wait_for(ready.exists, 120, "the fit to start watching")
    parent.kill()
    parent.wait()

    def gone() -> bool:
        status = Path(f"/proc/{child}/status")
        return not status.exists() or "State:\tZ" in status.read_text()

    wait_for(gone, 10, "the orphaned fit to stop")


def test_the_study_pictures_are_drawn_as_plain_text_whatever_the_matplotlibrc(tmp_path: Path) -> None:
    """Option names (`model.optimizer.init_args.lr`) are text: a matplotlibrc with `text.usetex: true`
    (and no LaTeX installed) failed every picture."""
    import matplotlib

    from project.sweep.summary import PICTURES, write_pictures

    study = optuna.create_study(direction="maximize")
    for lr, decay, value in ((1e-3, 0.0, 0.5), (1e-2, 0.1, 0.7), (3e-3, 0.05, 0.6)):
        params = {"model.optimizer.init_args.lr": lr, "model.optimizer.init_args.weight_decay": decay}
        distributions = {
            "model.optimizer.init_args.lr": optuna.distributions.FloatDistribution(1e-4, 1e-1, log=True),
            "model.optimizer.init_args.weight_decay": optuna.distributions.FloatDistribution(0.0, 0.2),
        }
        study.add_trial(optuna.trial.create_trial(params=params, distributions=distributions, value=value))
    with matplotlib.rc_context({"text.usetex": True}):
        notes = write_pictures(study, tmp_path)
    assert notes == [f"picture: {tmp_path / name}.png" for name in PICTURES]
