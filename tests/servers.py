"""`python -m project serve` as a client sees it: the real server in a subprocess on a free loopback
port, and plain HTTP requests to it (no client library between the test and the bytes)."""

from __future__ import annotations

import http.client
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from tests.exports import SRC

# runs `python -m project serve ARGS` and reports at exit whether torch or lightning got imported
PROBE = (
    "import atexit, runpy, sys; "
    "atexit.register(lambda: print('imported torch:', bool({'torch', 'lightning'} & set(sys.modules)))); "
    "sys.argv = ['project', 'serve'] + sys.argv[1:]; runpy.run_module('project', run_name='__main__')"
)


class Server:
    """`python -m project serve` in a subprocess, on a free loopback port, its output in a file."""

    def __init__(
        self, model: Path, *flags: str, log: Path, env: dict | None = None, open_files: int | None = None
    ) -> None:
        self.log_path = log
        environment = {**os.environ, "PYTHONPATH": os.pathsep.join([SRC, os.environ.get("PYTHONPATH", "")])}
        environment.pop("PROJECT_RELOAD_TOKEN", None)
        with open(log, "wb") as out:
            self.process = subprocess.Popen(
                [sys.executable, "-c", PROBE, "--model", str(model), "--port", "0", *flags],
                stdout=out,
                stderr=subprocess.STDOUT,
                env={**environment, **(env or {})},
                preexec_fn=None if open_files is None else lambda: limit_open_files(open_files),
            )
        self.port = self._wait_for_port(deadline=time.monotonic() + 30)
        while request(self.port, "GET", "/health")[0] != 200:
            time.sleep(0.05)

    def _wait_for_port(self, deadline: float) -> int:
        while time.monotonic() < deadline:
            for line in self.log().splitlines():
                if line.startswith("Serving ") and "http://127.0.0.1:" in line:
                    return int(line.split("http://127.0.0.1:")[1].split(" ")[0])
            if self.process.poll() is not None:
                break
            time.sleep(0.05)
        self.process.kill()
        raise AssertionError(f"the server did not start:\n{self.log()}")

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def stop(self, timeout: float = 15) -> int:
        """SIGTERM, then the exit status (killed and failed if it takes longer than `timeout`)."""
        self.process.send_signal(signal.SIGTERM)
        try:
            return self.process.wait(timeout)
        except subprocess.TimeoutExpired:
            self.process.kill()
            raise AssertionError(f"no exit within {timeout} s of SIGTERM:\n{self.log()}") from None


def limit_open_files(count: int) -> None:
    """In the child before exec: at most `count` file descriptors, soft and hard (as `ulimit -n`)."""
    import resource

    resource.setrlimit(resource.RLIMIT_NOFILE, (count, count))


def exchange(
    port: int, method: str, path: str, body: bytes = b"", headers: dict | None = None, timeout: float = 10
) -> tuple[int, dict, dict[str, str]]:
    """(status, JSON answer, headers) of one request on a new connection; (0, {}, {}) when nothing answers."""
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        connection.request(method, path, body=body, headers=headers or {})
        response = connection.getresponse()
        return response.status, json.loads(response.read() or b"null"), dict(response.getheaders())
    except (ConnectionError, OSError):
        return 0, {}, {}
    finally:
        connection.close()


def request(
    port: int, method: str, path: str, body: bytes = b"", headers: dict | None = None, timeout: float = 10
) -> tuple[int, dict]:
    """(status, JSON answer) of one request on a new connection; (0, {}) when nothing answers."""
    return exchange(port, method, path, body, headers, timeout)[:2]


def predict(
    port: int, data: bytes, content_type: str = "image/jpeg", query: str = "", timeout: float = 10
) -> tuple[int, dict]:
    return request(port, "POST", f"/predict{query}", data, {"Content-Type": content_type}, timeout)
