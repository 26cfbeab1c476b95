"""The prediction service: the real server in a subprocess on a free loopback port, and its parts.

The served models are the tiny hand-built ONNX exports of tests/exports.py (mean colour -> linear layer);
the server and its requests are tests/servers.py's.
"""

from __future__ import annotations

import ast
import asyncio
import http.client
import json
import os
import re
import select
import signal
import socket
import struct
import subprocess
import sys
import threading
import time
import zlib
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack, contextmanager, suppress
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

import project
from project.deploy.classifier import Classifier
from project.deploy.serve import app as serve_app
from project.deploy.serve import command as serve_command
from project.deploy.serve import service as serve_service
from project.deploy.serve.batching import Batcher
from project.deploy.serve.bodies import Limits
from project.deploy.serve.command import main as serve_main
from project.deploy.serve.models import ModelSlot
from project.deploy.serve.predictions import Prepared, run_batch
from project.deploy.serve.service import Settings
from tests.exports import CLASSES, SIZE, SRC, encode, point_latest, tiny_export
from tests.servers import Server, exchange, predict, request


def chunk(kind: bytes, data: bytes) -> bytes:
    return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))


def png_header(width: int, height: int) -> bytes:
    """A valid PNG start claiming width x height, with 64 bytes of pixel data behind it."""
    ihdr = chunk(b"IHDR", struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0))
    return b"\x89PNG\r\n\x1a\n" + ihdr + chunk(b"IDAT", zlib.compress(bytes(64))) + chunk(b"IEND", b"")


def jpeg_header(width: int, height: int) -> bytes:
    """A JPEG start-of-frame claiming width x height, a scan header and 16 bytes of data."""
    frame = b"\xff\xc0" + struct.pack(">HBHHB", 11, 8, height, width, 1) + b"\x01\x11\x00"
    scan = b"\xff\xda" + struct.pack(">HB", 8, 1) + b"\x01\x00\x00\x3f\x00"
    return b"\xff\xd8" + frame + scan + bytes(16) + b"\xff\xd9"


def multipart(fields: list[tuple[str, str | None, bytes]], boundary: str = "b0undary") -> tuple[bytes, str]:
    parts = []
    for name, filename, data in fields:
        disposition = f'form-data; name="{name}"' + (f'; filename="{filename}"' if filename else "")
        parts.append(f"--{boundary}\r\nContent-Disposition: {disposition}\r\n\r\n".encode() + data + b"\r\n")
    return b"".join(parts) + f"--{boundary}--\r\n".encode(), f"multipart/form-data; boundary={boundary}"


@pytest.fixture(scope="module")
def image_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Files of several formats, sizes and colours: one per class and format, and mixtures."""
    rng = np.random.default_rng(0)
    files = {}
    colours = {"red": (220, 30, 20), "green": (20, 210, 40), "blue": (30, 20, 230), "dark": (5, 5, 5)}
    for i, (name, colour) in enumerate(colours.items()):
        noise = rng.integers(-20, 20, (30 + 7 * i, 50, 3))
        pixels = np.clip(np.array(colour) + noise, 0, 255).astype(np.uint8)
        files[f"{name}.jpg"] = encode(Image.fromarray(pixels), "JPEG", quality=90)
        files[f"{name}.png"] = encode(Image.fromarray(pixels).resize((23, 61)), "PNG")
    mixed = rng.integers(0, 256, (40, 40, 3), dtype=np.uint8)
    files["mixed.webp"] = encode(Image.fromarray(mixed), "WEBP")
    files["gray.bmp"] = encode(Image.fromarray(mixed[..., 0]), "BMP")
    folder = tmp_path_factory.mktemp("images")
    for name, data in files.items():
        (folder / name).write_bytes(data)
    return folder


@pytest.fixture(scope="module")
def images(image_dir: Path) -> dict[str, bytes]:
    return {path.name: path.read_bytes() for path in sorted(image_dir.iterdir())}


@pytest.fixture(scope="module")
def exports(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("exports")
    tiny_export(folder, "run-a", seed=0)
    tiny_export(folder, "run-b", seed=1)
    point_latest(folder, "run-a")
    return folder


TOKEN = "test-reload-token-0123456789"
AUTHORIZED = {"Authorization": f"Bearer {TOKEN}"}


def rss_mb(pid: int) -> float:
    """Resident memory of process `pid` in MiB (Linux)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise AssertionError("no VmRSS")


@pytest.fixture(scope="module")
def server(exports: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """Batches of up to 8 waiting 100 ms to fill, small limits so that the refusals are cheap to reach."""
    flags = ["--max_batch_size", "8", "--max_wait_ms", "100", "--max_body_mb", "0.25"]
    flags += ["--max_pixels", "1000000", "--read_timeout", "1", "--max_body_memory_mb", "1"]
    flags += ["--header_timeout", "1", "--max_header_kb", "8"]
    log = tmp_path_factory.mktemp("server") / "server.log"
    served = Server(exports / "latest.onnx", *flags, log=log)
    yield served
    served.stop()


@pytest.mark.slow
def test_answers_match_infer_for_the_same_files(server: Server, image_dir: Path, exports: Path) -> None:
    files = sorted(image_dir.iterdir())
    inferred = Classifier(exports / "latest.onnx").classify(files, top_k=4)  # what `infer` prints
    for path, names, probs, *_ in inferred:
        status, answer = predict(server.port, path.read_bytes(), "application/octet-stream")
        assert status == 200, answer
        assert answer["version"] == "run-a"
        assert [p["class_name"] for p in answer["predictions"]] == names, path.name
        assert [p["probability"] for p in answer["predictions"]] == pytest.approx(probs, abs=1e-6)
        if path.stem in CLASSES:  # the images tell the classes apart
            assert names[0] == path.stem


@pytest.mark.slow
def test_multipart_and_top_k(server: Server, images: dict[str, bytes]) -> None:
    body, content_type = multipart([("note", None, b"hello"), ("file", "x.png", images["blue.png"])])
    status, answer = predict(server.port, body, content_type, "?top_k=2")
    assert status == 200 and [p["class_name"] for p in answer["predictions"]][:1] == ["blue"]
    assert len(answer["predictions"]) == 2


@pytest.mark.slow
def test_concurrent_requests_share_batches(server: Server, images: dict[str, bytes]) -> None:
    before = request(server.port, "GET", "/metrics")[1]
    data = list(images.values()) * 3
    with ThreadPoolExecutor(len(data)) as pool:
        answers = list(pool.map(lambda d: predict(server.port, d), data))
    assert all(status == 200 for status, _ in answers)
    sizes = [answer["batch_size"] for _, answer in answers]
    assert max(sizes) > 1 and max(sizes) <= 8
    after = request(server.port, "GET", "/metrics")[1]
    assert after["batched_images"] - before["batched_images"] == len(data)
    assert after["batches"] - before["batches"] < len(data)


@pytest.mark.slow
def test_health_and_metadata(server: Server) -> None:
    assert request(server.port, "GET", "/health") == (200, {"status": "ok", "version": "run-a"})
    status, meta = request(server.port, "GET", "/metadata")
    assert status == 200 and meta["class_names"] == CLASSES and meta["image_size"] == SIZE
    assert meta["version"] == "run-a" and meta["model"] == "run-a.onnx"
    assert meta["sidecar"]["files"] == {"onnx": "run-a.onnx"}
    assert meta["sidecar"]["source_checkpoint"] == {"sha256": "0" * 64}  # its path is not shown
    assert meta["batching"] == {"max_batch_size": 8, "max_wait_ms": 100.0}
    assert "/" not in json.dumps(meta).replace("image/", "")  # no folder of the server anywhere
    for path in ("/docs", "/openapi.json", "/redoc"):  # off unless --api_docs
        assert request(server.port, "GET", path)[0] == 404, path


def bad_requests(images: dict[str, bytes]) -> dict[str, tuple[int, bytes, str, str]]:
    """name -> (expected status, body, content type, query)."""
    jpeg, png = images["red.jpg"], images["red.png"]
    good_multipart = multipart([("file", "a.jpg", jpeg)])
    return {
        "empty body": (400, b"", "image/jpeg", ""),
        "text": (415, b"hello, world", "text/plain", ""),
        "json content type": (415, jpeg, "application/json", ""),
        "random bytes": (415, bytes(range(256)) * 4, "image/jpeg", ""),
        "truncated jpeg": (400, jpeg[: len(jpeg) // 2], "image/jpeg", ""),
        "truncated png": (400, png[: len(png) // 2], "image/png", ""),
        "png claiming 2.5 gigapixels": (413, png_header(50_000, 50_000), "image/png", ""),
        "jpeg over --max_pixels": (413, jpeg_header(2000, 2000), "image/jpeg", ""),
        "png header, no pixels": (400, png_header(64, 64), "image/png", ""),
        "png of 1x1,000,000 pixels (2 kB)": (400, encode(Image.new("L", (1, 10**6)), "PNG"), "image/png", ""),
        "oversize body": (413, jpeg + bytes(300_000), "image/jpeg", ""),
        "multipart without boundary": (400, good_multipart[0], "multipart/form-data", ""),
        "multipart without file": (400, *multipart([("note", None, b"hi")]), ""),
        "multipart garbage": (400, b"--b0undary\r\nnonsense", good_multipart[1], ""),
        "bad top_k": (400, jpeg, "image/jpeg", "?top_k=zero"),
        "superscript top_k, which int() reads": (400, jpeg, "image/jpeg", "?top_k=%C2%B2"),
        "5,000-digit top_k": (400, jpeg, "image/jpeg", "?top_k=" + "9" * 5000),
        "top_k past the bound": (400, jpeg, "image/jpeg", "?top_k=100000"),
        "negative top_k": (400, jpeg, "image/jpeg", "?top_k=-3"),
        "top_k twice": (400, jpeg, "image/jpeg", "?top_k=2&top_k=3"),
        "unknown query parameter": (400, jpeg, "image/jpeg", "?predictions.top_k=-3"),
    }


@pytest.mark.slow
def test_bad_requests_get_their_status_and_a_json_error(server: Server, images: dict[str, bytes]) -> None:
    for case, (expected, body, content_type, query) in bad_requests(images).items():
        status, answer = predict(server.port, body, content_type, query)
        assert status == expected, (case, answer)
        assert "Fix:" in answer["error"] and "\n" not in answer["error"], case
        assert len(answer["error"]) < 500, case  # a 5,000-digit value is not echoed
    assert predict(server.port, images["red.jpg"])[0] == 200


@pytest.mark.slow
def test_files_that_pillow_parses_a_step_at_a_time_are_refused_at_once(
    exports: Path, images: dict[str, bytes], tmp_path: Path
) -> None:
    """A 15 MB plain PPM, a binary one behind a 15 MB header comment, a PNG of 1M empty chunks, at once."""
    side = 1100  # 1.2 megapixels of "255 255 255": 14.5 MB of text that Pillow would parse in Python
    plain = b"P3\n%d %d\n255\n" % (side, side) + b"255 255 255\n" * (side * side)
    commented = b"P6\n#" + b"x" * 15_000_000 + b"\n2 2\n255\n" + bytes(12)
    png = encode(Image.new("RGB", (4, 4)), "PNG")
    chunked = png[:33] + chunk(b"zzZz", b"") * 1_000_000 + png[33:]  # 12 MB
    flags = ["--max_body_mb", "20", "--max_body_memory_mb", "64", "--max_pixels", "2000000"]
    served = Server(exports / "latest.onnx", *flags, log=tmp_path / "server.log")
    try:

        def timed(body: bytes) -> tuple[int, dict, float]:
            started = time.monotonic()
            status, answer = predict(served.port, body, "application/octet-stream", timeout=30)
            return status, answer, time.monotonic() - started

        with ThreadPoolExecutor(4) as pool:
            hostile = [pool.submit(timed, body) for body in (plain, commented, chunked)]
            good = pool.submit(timed, images["red.jpg"])
            answers = [future.result() for future in hostile]
        assert good.result()[0] == 200
        expected = [
            (
                415,
                "plain (ASCII) Netpbm file (P3); only binary Netpbm (P4, P5, P6) with a header of at most",
            ),
            (415, "binary Netpbm file (P6); only binary Netpbm (P4, P5, P6) with a header of at most 1024"),
            (400, "more than 15814 PNG chunks in its 12000069 bytes, which Pillow would read one at a time"),
        ]
        for (status, answer, seconds), (code, reason) in zip(answers, expected, strict=True):
            assert status == code and reason in answer["error"], answer
            assert "Fix: " in answer["error"]
            assert seconds < 1, seconds  # the old decode held a core for seconds (a minute at 15 MB of P1)
    finally:
        assert served.stop() == 0


@pytest.mark.slow
def test_decoded_pixels_count_against_the_memory_budget(server: Server, images: dict[str, bytes]) -> None:
    """An animated WebP of 1,000 x 1,000 pixels (within --max_pixels): a few kB sent, 27 MB to decode."""
    frames = [Image.new("RGB", (1000, 1000), colour) for colour in ("red", "green", "blue")]
    webp = encode(frames[0], "WEBP", save_all=True, append_images=frames[1:])
    assert len(webp) < 20_000
    before = rss_mb(server.process.pid)
    status, answer = predict(server.port, webp, "image/webp")
    assert status == 413, answer
    assert answer["error"].startswith(
        "The image is 1000x1000 pixels: decoding it takes about 26 MB, more than the service's budget of 1 MB"
    )
    assert "Fix: send a smaller image" in answer["error"]
    assert rss_mb(server.process.pid) - before < 10  # refused from the header: nothing was decoded
    status, answer = predict(server.port, images["red.jpg"])
    assert status == 200, answer
    metrics = request(server.port, "GET", "/metrics")[1]
    assert (metrics["decoding_bytes_held"], metrics["body_bytes_held"]) == (0, 0)


@pytest.mark.slow
def test_a_body_that_never_arrives_times_out(server: Server) -> None:
    connection = http.client.HTTPConnection("127.0.0.1", server.port, timeout=10)
    connection.putrequest("POST", "/predict")
    connection.putheader("Content-Type", "image/jpeg")
    connection.putheader("Content-Length", "5000")
    connection.endheaders(b"\xff\xd8\xff")  # 3 of the 5,000 bytes, then silence
    started = time.monotonic()
    response = connection.getresponse()
    assert response.status == 408 and time.monotonic() - started < 5
    assert "did not arrive within 1 s" in json.loads(response.read())["error"]
    connection.close()
    with socket.create_connection(("127.0.0.1", server.port)) as gone:  # leaves halfway through
        gone.sendall(b"POST /predict HTTP/1.1\r\nHost: x\r\nContent-Length: 5000\r\n\r\n\xff\xd8")
    time.sleep(0.2)
    assert request(server.port, "GET", "/health")[0] == 200
    assert "Traceback" not in server.log()


def until_closed(sock: socket.socket, limit_s: float, drip: bytes = b"") -> tuple[bytes, float]:
    """(what the server sends until it closes, seconds that took), sending `drip` every 0.1 s meanwhile.

    A client that sends a byte now and then is what defeats uvicorn's own keep-alive timer.
    """
    started, received = time.monotonic(), b""
    while time.monotonic() - started < limit_s:
        try:
            if select.select([sock], [], [], 0.1)[0]:
                chunk = sock.recv(65536)
                if not chunk:
                    return received, time.monotonic() - started
                received += chunk
            elif drip:
                sock.send(drip)
        except (ConnectionResetError, BrokenPipeError):
            return received, time.monotonic() - started
    raise AssertionError(f"still open after {limit_s} s; received {received[:200]!r}")


@pytest.mark.slow
def test_slow_and_idle_connections_end_within_the_header_timeout(server: Server) -> None:
    """--header_timeout 1: idle connections close, trickled headers get 408; a 408 for a body closes too."""
    address = ("127.0.0.1", server.port)
    with (
        socket.create_connection(address) as idle,
        socket.create_connection(address) as headers,
        socket.create_connection(address) as body,
    ):
        headers.sendall(b"POST /predict HTTP/1.1\r\nHost: x\r\nX-Slow: ")
        body.sendall(b"POST /predict HTTP/1.1\r\nHost: x\r\nContent-Length: 5000\r\n\r\n\xff\xd8")
        received, seconds = until_closed(headers, 10, drip=b"a")
        assert received.startswith(b"HTTP/1.1 408 ") and seconds < 4, received
        assert b"The request headers did not arrive within 1 s" in received
        received, seconds = until_closed(body, 10, drip=b"\0")  # --read_timeout 1, then the connection ends
        assert received.startswith(b"HTTP/1.1 408 ") and b"connection: close" in received.lower()
        assert until_closed(idle, 10)[0] == b""
    assert request(server.port, "GET", "/health")[0] == 200


@pytest.mark.slow
def test_oversized_headers_are_refused_without_holding_them(server: Server) -> None:
    """--max_header_kb 8: 64 MB of one header is cut off after the first reads, memory stays flat."""
    before, sent = rss_mb(server.process.pid), 0
    with socket.create_connection(("127.0.0.1", server.port), timeout=10) as sock:
        sock.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\nX-Big: ")
        with suppress(ConnectionResetError, BrokenPipeError):
            while sent < 64 * 2**20:
                sock.sendall(b"a" * 2**20)
                sent += 2**20
        with suppress(ConnectionResetError):
            received = sock.recv(65536)
    assert sent < 32 * 2**20  # the rest sat in socket buffers, unread, when the server closed
    assert not received or received.startswith(b"HTTP/1.1 431 "), received
    assert rss_mb(server.process.pid) - before < 16
    assert request(server.port, "GET", "/health")[0] == 200


@pytest.mark.slow
def test_fuzz_malformed_requests_then_a_good_one(server: Server, images: dict[str, bytes]) -> None:
    rng = np.random.default_rng(1)
    cases = list(bad_requests(images).values())
    sources = [images["red.jpg"], images["green.png"], images["mixed.webp"], images["gray.bmp"]]
    seen: set[int] = set()
    for i in range(240):
        kind = i % 4
        if kind == 0:  # random bytes, random type
            body = rng.integers(0, 256, int(rng.integers(0, 3000)), dtype=np.uint8).tobytes()
            content_type = str(rng.choice(["image/jpeg", "application/octet-stream", "image/png", ""]))
        elif kind == 1:  # a real file cut short (the last 32 bytes of a PNG are only its end markers)
            source = sources[int(rng.integers(len(sources)))]
            body, content_type = source[: int(rng.integers(0, len(source) - 32))], "image/jpeg"
        elif kind == 2:  # a real file whose first bytes (the format's signature) are changed
            source = bytearray(sources[int(rng.integers(len(sources)))])
            for j in range(int(rng.integers(1, 16))):
                source[j] ^= int(rng.integers(1, 256))
            body, content_type = bytes(source), "application/octet-stream"
        else:  # the hand-made bad requests, replayed
            _, body, content_type, query = cases[int(rng.integers(len(cases)))]
        status, answer = predict(server.port, body, content_type, query if kind == 3 else "")
        seen.add(status)
        assert status in (400, 413, 415) and "error" in answer, (i, status, body[:40])
    assert seen == {400, 413, 415}
    status, answer = predict(server.port, images["green.jpg"])
    assert status == 200 and answer["predictions"][0]["class_name"] == "green"
    assert server.process.poll() is None


@pytest.mark.slow
def test_errors_are_json_for_unknown_routes_and_methods(server: Server) -> None:
    assert request(server.port, "GET", "/nope") == (404, {"error": "Not Found"})
    assert request(server.port, "GET", "/predict") == (405, {"error": "Method Not Allowed"})


@pytest.mark.slow
def test_reload_swaps_the_model_and_a_failed_reload_keeps_it(
    exports: Path, images: dict[str, bytes], tmp_path: Path
) -> None:
    for stem in ("run-a", "run-b"):
        for ext in ("onnx", "json"):
            (tmp_path / f"{stem}.{ext}").write_bytes((exports / f"{stem}.{ext}").read_bytes())
    point_latest(tmp_path, "run-a")
    env = {"PROJECT_RELOAD_TOKEN": TOKEN}
    served = Server(tmp_path / "latest.onnx", log=tmp_path / "server.log", env=env)
    try:
        assert predict(served.port, images["red.jpg"])[1]["version"] == "run-a"
        point_latest(tmp_path, "run-b")
        status, answer = request(served.port, "POST", "/reload", headers=AUTHORIZED)
        assert (status, answer) == (200, {"version": "run-b", "previous_version": "run-a", "changed": True})
        assert predict(served.port, images["red.jpg"])[1]["version"] == "run-b"

        point_latest(tmp_path, "run-a")  # SIGHUP does the same
        served.process.send_signal(signal.SIGHUP)
        deadline = time.monotonic() + 10
        while request(served.port, "GET", "/health")[1]["version"] != "run-a":
            assert time.monotonic() < deadline, served.log()
            time.sleep(0.05)

        (tmp_path / "broken.onnx").write_bytes(b"not a model")
        (tmp_path / "broken.json").write_bytes((tmp_path / "run-b.json").read_bytes())
        point_latest(tmp_path, "broken")
        status, answer = request(served.port, "POST", "/reload", headers=AUTHORIZED)
        assert status == 500 and "still serving version run-a" in answer["error"]
        assert "broken.onnx" in answer["error"] and "Fix:" in answer["error"]
        assert str(tmp_path) not in answer["error"] and str(tmp_path) in served.log()  # the log has it
        point_latest(tmp_path, "gone")
        status, answer = request(served.port, "POST", "/reload", headers=AUTHORIZED)
        assert status == 500 and "links to" in answer["error"]
        assert "links to 'gone.onnx', which does not exist" in answer["error"]
        assert str(tmp_path) not in answer["error"]
        (tmp_path / "wide.onnx").write_bytes((tmp_path / "run-b.onnx").read_bytes())  # 4 logits
        sidecar = json.loads((tmp_path / "run-b.json").read_text())
        sidecar.update(class_names=[*CLASSES, "white"], files={"onnx": "wide.onnx"})
        (tmp_path / "wide.json").write_text(json.dumps(sidecar))
        point_latest(tmp_path, "wide")
        status, answer = request(served.port, "POST", "/reload", headers=AUTHORIZED)
        assert status == 500 and "still serving version run-a" in answer["error"], answer
        assert (
            "Model 'wide.onnx' gives 4 logits per image, but its sidecar 'wide.json' names 5 classes"
            in (answer["error"])
        )
        (tmp_path / "latest.onnx").unlink()  # a link to itself: Path.resolve raises, not a UserError
        (tmp_path / "latest.onnx").symlink_to("latest.onnx")
        status, answer = request(served.port, "POST", "/reload", headers=AUTHORIZED)
        assert status == 500 and "Reload failed; still serving version run-a" in answer["error"], answer
        status, answer = predict(served.port, images["red.jpg"])
        assert status == 200 and answer["version"] == "run-a"
        metrics = request(served.port, "GET", "/metrics")[1]
        assert (metrics["reloads"], metrics["failed_reloads"]) == (2, 4)
        assert metrics["responses_by_status"]["500"] == 4  # each failed reload's answer
    finally:
        assert served.stop() == 0


async def call(
    app: object, method: str, path: str, body: bytes = b"", headers: dict[str, str] | None = None
) -> tuple[int, dict]:
    """(status, JSON answer) of one request sent to the ASGI app in this process."""
    return (await call_with_headers(app, method, path, body, headers))[:2]


async def call_with_headers(
    app: object, method: str, path: str, body: bytes = b"", headers: dict[str, str] | None = None
) -> tuple[int, dict, dict[str, str]]:
    """(status, JSON answer, answer headers) of one request sent to the ASGI app in this process."""
    sent: list[dict] = []
    sent_headers = [(b"content-type", b"image/jpeg"), (b"content-length", str(len(body)).encode())]
    sent_headers += [(k.lower().encode(), v.encode()) for k, v in (headers or {}).items()]
    scope = {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": method,
        "scheme": "http",
        "path": path,
        "raw_path": path.encode(),
        "root_path": "",
        "query_string": b"",
        "headers": sent_headers,
        "client": ("127.0.0.1", 1),
        "server": ("127.0.0.1", 80),
    }

    async def receive() -> dict:
        return {"type": "http.request", "body": body, "more_body": False}

    async def send(message: dict) -> None:
        sent.append(message)

    with suppress(RuntimeError):  # Starlette raises an unhandled error again once it has answered 500
        await app(scope, receive, send)  # type: ignore[operator]
    start = next(m for m in sent if m["type"] == "http.response.start")
    body = b"".join(m.get("body", b"") for m in sent if m["type"] == "http.response.body")
    answered = {k.decode().lower(): v.decode() for k, v in start["headers"]}
    is_json = answered.get("content-type") == "application/json"
    return start["status"], json.loads(body) if is_json else {"text": body.decode()}, answered


def test_an_unforeseen_error_is_a_json_500_counted_in_metrics(
    exports: Path, images: dict[str, bytes], monkeypatch: pytest.MonkeyPatch
) -> None:
    def broken(*args: object) -> None:
        raise RuntimeError("injected")

    monkeypatch.setattr(serve_service, "prepare", broken)
    limits = Limits(max_body_bytes=2**20, max_pixels=10**6, read_timeout_s=5)
    settings = Settings(
        top_k=3, max_batch_size=4, max_wait_ms=1, max_pending=8, decode_threads=1, limits=limits
    )
    application = serve_app.create_app(ModelSlot(exports / "latest.onnx"), settings)

    async def scenario() -> tuple[tuple[int, dict, dict[str, str]], tuple[int, dict]]:
        return await call_with_headers(application, "POST", "/predict", images["red.jpg"]), await call(
            application, "GET", "/metrics"
        )

    (status, answer, headers), (_, metrics) = asyncio.run(scenario())
    assert (status, headers["x-content-type-options"]) == (500, "nosniff")  # answered outside middleware
    assert answer == {"error": "Internal error (RuntimeError); the service goes on. See the server log."}
    assert metrics["responses_by_status"] == {"500": 1}


ALLOWED = "https://app.example.com"


def test_pages_of_other_sites_are_refused_and_every_answer_is_nosniff(exports: Path) -> None:
    """A form on any web page can POST to /predict without a CORS preflight: only the service's own
    pages and --allow_origin's may; programs, which send no Origin, are not affected."""
    limits = Limits(max_body_bytes=2**20, max_pixels=10**6, read_timeout_s=5)
    settings = Settings(
        top_k=3,
        max_batch_size=4,
        max_wait_ms=1,
        max_pending=8,
        decode_threads=1,
        limits=limits,
        allow_origins=(ALLOWED,),
    )
    application = serve_app.create_app(ModelSlot(exports / "latest.onnx"), settings)
    own = {"Host": "127.0.0.1:8000"}
    preflight = {"Access-Control-Request-Method": "POST", "Access-Control-Request-Headers": "content-type"}
    requests = {  # name: (method, path, headers)
        "foreign": ("POST", "/predict", {**own, "Origin": "https://evil.example"}),
        "sandboxed": ("POST", "/predict", {**own, "Origin": "null"}),
        "look-alike": ("POST", "/predict", {**own, "Origin": "http://127.0.0.1:8000.evil.example"}),
        "foreign preflight": ("OPTIONS", "/predict", {**own, "Origin": "https://evil.example", **preflight}),
        "own": ("GET", "/health", {**own, "Origin": "http://127.0.0.1:8000"}),
        "own via TLS proxy": (
            "GET",
            "/health",
            {"Host": "models.example", "Origin": "https://models.example"},
        ),
        "no origin": ("GET", "/health", own),
        "allowed": ("GET", "/health", {**own, "Origin": ALLOWED}),
        "allowed preflight": ("OPTIONS", "/predict", {**own, "Origin": ALLOWED, **preflight}),
        "no route": ("GET", "/nope", own),
        "no image": ("POST", "/predict", {**own, "Origin": "http://127.0.0.1:8000"}),
    }

    async def scenario() -> dict[str, tuple[int, dict, dict[str, str]]]:
        return {
            name: await call_with_headers(application, method, path, b"", headers)
            for name, (method, path, headers) in requests.items()
        }

    answers = asyncio.run(scenario())
    for name in ("foreign", "sandboxed", "look-alike", "foreign preflight"):
        status, answer, headers = answers[name]
        assert (status, headers["connection"]) == (403, "close"), (name, answer)
        origin = requests[name][2]["Origin"]
        assert answer["error"].startswith(f"Requests from the web page origin '{origin}' are refused.")
        assert "Fix:" in answer["error"] and "--allow_origin" in answer["error"]
        assert "access-control-allow-origin" not in headers
    for name in ("own", "own via TLS proxy", "no origin", "allowed"):
        assert answers[name][:2] == (200, {"status": "ok", "version": "run-a"}), name
    assert answers["allowed"][2]["access-control-allow-origin"] == ALLOWED  # its page may read it
    status, _, headers = answers["allowed preflight"]
    assert status == 200 and headers["access-control-allow-origin"] == ALLOWED
    assert "POST" in headers["access-control-allow-methods"]
    assert answers["no route"][0] == 404 and answers["no image"][0] == 400
    for name, (_, _, headers) in answers.items():
        assert headers["x-content-type-options"] == "nosniff", name


@pytest.mark.slow
def test_a_cross_site_form_post_keeps_no_sample_and_every_reply_is_nosniff(
    exports: Path, images: dict[str, bytes], tmp_path: Path
) -> None:
    samples = tmp_path / "samples"
    flags = ["--sample_fraction", "1", "--sample_dir", str(samples), "--allow_origin", ALLOWED]
    served = Server(exports / "latest.onnx", *flags, log=tmp_path / "server.log")
    try:
        own = f"http://127.0.0.1:{served.port}"
        body, content_type = multipart([("file", "red.jpg", images["red.jpg"])])
        form = {"Content-Type": content_type}  # what a page's <form enctype=multipart/form-data> sends
        status, answer, headers = exchange(
            served.port, "POST", "/predict", body, {**form, "Origin": "https://evil.example"}
        )
        assert status == 403 and "'https://evil.example' are refused" in answer["error"]
        assert headers["x-content-type-options"] == "nosniff"
        for origin in (own, ALLOWED, None):  # the service's own page, an allowed site, a program
            sent = form if origin is None else {**form, "Origin": origin}
            status, answer, headers = exchange(served.port, "POST", "/predict", body, sent)
            assert status == 200 and answer["predictions"][0]["class_name"] == "red", origin
            assert headers["x-content-type-options"] == "nosniff"
        assert exchange(served.port, "GET", "/nope")[2]["x-content-type-options"] == "nosniff"
        with socket.create_connection(("127.0.0.1", served.port), timeout=5) as sock:
            sock.sendall(b"NOT HTTP\r\n\r\n")  # refused by the protocol, before the app
            reply, _ = until_closed(sock, 5)
        head, _, answered = reply.partition(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 400 ") and b"\r\nx-content-type-options: nosniff" in head.lower()
        assert "Invalid HTTP request" in json.loads(answered)["error"]
        deadline = time.monotonic() + 10
        while (stats := request(served.port, "GET", "/metrics")[1])["sampler"]["written"] < 3:
            assert time.monotonic() < deadline, stats
            time.sleep(0.05)
    finally:
        assert served.stop() == 0
    assert stats["responses_by_status"]["403"] == 1 and stats["sampler"]["written"] == 3
    assert len(list(samples.glob("*.json"))) == 3  # the refused request's image was not kept


@pytest.mark.slow
def test_sampler_keeps_requests_within_its_bound(
    exports: Path, images: dict[str, bytes], tmp_path: Path
) -> None:
    samples = tmp_path / "samples"
    samples.mkdir()
    (samples / "notes.txt").write_text("not a sample: never deleted")
    flags = ["--sample_fraction", "1", "--sample_dir", str(samples), "--sample_max_mb", "0.01"]
    served = Server(exports / "latest.onnx", *flags, log=tmp_path / "server.log")
    try:
        order = ["red.jpg", "green.png", "blue.jpg", "dark.png"] * 4
        for name in order:
            assert predict(served.port, images[name])[0] == 200
        deadline = time.monotonic() + 10
        while (stats := request(served.port, "GET", "/metrics")[1]["sampler"])["written"] < len(order):
            assert time.monotonic() < deadline, stats
            time.sleep(0.05)
    finally:
        assert served.stop() == 0
    assert stats["deleted_oldest"] > 0 and stats["bytes"] <= 0.01 * 2**20
    assert stats["folder"] == "samples"  # its name, not where it lives
    records = sorted(samples.glob("*.json"))
    assert 0 < len(records) < len(order)
    size = sum(p.stat().st_size for p in samples.iterdir() if p.name != "notes.txt")
    assert size == stats["bytes"] and (samples / "notes.txt").exists()
    last = json.loads(records[-1].read_text())
    assert last["version"] == "run-a" and last["predictions"][0]["class_name"] == "dark"
    assert (samples / last["image"]).read_bytes() == images["dark.png"]
    assert last["image"].endswith(".png") and last["time"].endswith("+00:00")


@pytest.mark.slow
def test_sigterm_stops_cleanly_and_torch_is_never_imported(
    exports: Path, images: dict[str, bytes], tmp_path: Path
) -> None:
    secret = tmp_path / "reload-token"
    secret.write_text(f"{TOKEN}\n")
    secret.chmod(0o600)
    served = Server(exports / "latest.onnx", "--reload_token_file", str(secret), log=tmp_path / "server.log")
    assert predict(served.port, images["red.jpg"])[0] == 200
    assert request(served.port, "POST", "/reload", headers=AUTHORIZED)[0] == 200
    assert TOKEN not in Path(f"/proc/{served.process.pid}/cmdline").read_text()  # what ps shows
    started = time.monotonic()
    assert served.stop(timeout=10) == 0
    assert time.monotonic() - started < 10
    assert "imported torch: False" in served.log()


def startup_error(capsys: pytest.CaptureFixture[str], args: list[str]) -> str:
    """What `serve` with these arguments prints: one `error:` line, after exiting with status 2."""
    with pytest.raises(SystemExit) as exited:
        serve_main(args)
    assert exited.value.code == 2
    err = capsys.readouterr().err
    assert err.count("error: ") == 1 and err.startswith("error: "), err
    return err


@pytest.mark.slow
def test_startup_errors_are_one_message(
    exports: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    model = str(exports / "latest.onnx")
    assert re.search(
        r"error: Model '.*nope.onnx' does not exist. Fix: pass --model",
        startup_error(capsys, ["--model", str(tmp_path / "nope.onnx")]),
    )
    (tmp_path / "alone.onnx").write_bytes((exports / "run-a.onnx").read_bytes())
    assert re.search(
        r"error: Need the model and its sidecar: .*'.*alone.json'",
        startup_error(capsys, ["--model", str(tmp_path / "alone.onnx")]),
    )
    mistakes = {
        r"--max_batch_size=0 is out of range: it must be an integer >= 1": ["--max_batch_size", "0"],
        r"--sample_fraction is set but --sample_dir is not": ["--sample_fraction", "0.1"],
        r"reload token \(--reload_token\) has 5": ["--reload_token", "short"],
        r"--max_body_memory_mb=10.0 is out of range: .* >= --max_body_mb \(20\)": [
            "--max_body_memory_mb",
            "10",
        ],
        r"--header_timeout=0.0 is out of range": ["--header_timeout", "0"],
    }
    for pattern, flags in mistakes.items():
        assert re.search(pattern, startup_error(capsys, ["--model", model, *flags])), pattern
    (tmp_path / "file").write_text("")
    samples = str(tmp_path / "file" / "samples")
    assert re.search(
        r"Cannot keep samples in --sample_dir '.*file/samples'",
        startup_error(capsys, ["--model", model, "--sample_fraction", "0.1", "--sample_dir", samples]),
    )
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = str(taken.getsockname()[1])
        assert re.search(
            rf"error: Cannot listen on 127.0.0.1:{port}: .*Fix: pass another",
            startup_error(capsys, ["--model", model, "--port", port]),
        )


def test_the_reload_token_comes_from_the_environment_or_a_file_and_a_flag_is_warned_about(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A flag's value is visible to every local user (ps, /proc/<pid>/cmdline): taken, with a warning."""

    def token_of(*flags: str) -> tuple[str | None, str]:
        args = serve_command.parser().parse_args(["--model", "m.onnx", *flags])
        serve_command.check(args)
        return args.reload_token, capsys.readouterr().err

    monkeypatch.delenv("PROJECT_RELOAD_TOKEN", raising=False)
    assert token_of() == (None, "")
    secret = tmp_path / "reload-token"
    secret.write_text(f"{TOKEN}\n")
    secret.chmod(0o600)
    assert token_of("--reload_token_file", str(secret)) == (TOKEN, "")
    secret.chmod(0o644)
    assert token_of("--reload_token_file", str(secret)) == (
        TOKEN,
        f"warning: --reload_token_file '{secret}' can be read by other users: chmod 600 it.\n",
    )
    token, warned = token_of("--reload_token", TOKEN)
    assert token == TOKEN and warned.count("\n") == 1
    assert warned.startswith("warning: --reload_token on the command line is visible to every user")
    assert "Set $PROJECT_RELOAD_TOKEN or pass --reload_token_file instead." in warned
    monkeypatch.setenv("PROJECT_RELOAD_TOKEN", TOKEN)
    assert token_of() == (TOKEN, "")
    assert re.search(
        r"error: The reload token is given twice: by --reload_token_file and by \$PROJECT_RELOAD_TOKEN\.",
        startup_error(capsys, ["--model", "m.onnx", "--reload_token_file", str(secret)]),
    )
    monkeypatch.delenv("PROJECT_RELOAD_TOKEN")
    (tmp_path / "empty").write_text("\n")
    (tmp_path / "short").write_text("short\n")
    (tmp_path / "two").write_text(f"{TOKEN}\n{TOKEN}\n")
    mistakes = {
        r"Cannot read --reload_token_file '.*nope': No such file or directory\. Fix:": "nope",
        r"--reload_token_file '.*empty' holds nothing\. Fix: write the token alone": "empty",
        r"--reload_token_file '.*two' holds more than one word\. Fix:": "two",
        r"The reload token \(--reload_token_file '.*short'\) has 5 characters": "short",
    }
    for pattern, name in mistakes.items():
        err = startup_error(capsys, ["--model", "m.onnx", "--reload_token_file", str(tmp_path / name)])
        assert re.search(pattern, err), err
    for origin in ("app.example.com", "https://app.example.com/page", "ftp://app.example.com", "https://"):
        err = startup_error(capsys, ["--model", "m.onnx", "--allow_origin", origin])
        assert f"error: --allow_origin {origin!r} is not a web page origin. Fix: pass the scheme" in err
    args = serve_command.parser().parse_args(
        ["--model", "m", "--allow_origin", "HTTPS://App.Example.com:8443/"]
    )
    serve_command.check(args)
    assert args.allow_origin == ["https://app.example.com:8443"]  # as browsers send it


def test_batcher_fills_batches_up_to_the_size_and_waits_only_for_announced_items() -> None:
    calls: list[int] = []

    def run(items: list[int]) -> list[int]:
        calls.append(len(items))
        return [10 * i for i in items]

    async def announced(batcher: Batcher[int, int], item: int) -> int:
        with batcher.arriving():  # as a request does while it is read and decoded
            await asyncio.sleep(0.05)
        return await batcher.submit(item)

    async def scenario() -> list[list[int]]:
        batcher: Batcher[int, int] = Batcher(run, max_batch_size=4, max_wait_ms=2000, max_pending=100)
        batcher.start()
        steps = []
        assert await asyncio.gather(*(batcher.submit(i) for i in range(10))) == [10 * i for i in range(10)]
        steps.append(calls[:])  # 4 + 4 + 2: the last two do not wait, nothing else is on its way
        calls.clear()
        started = time.monotonic()
        assert await asyncio.gather(batcher.submit(1), announced(batcher, 2)) == [10, 20]
        steps.append([*calls, time.monotonic() - started < 1])  # one batch: it waited for the second
        calls.clear()
        started = time.monotonic()
        await batcher.submit(3)
        steps.append([*calls, time.monotonic() - started < 1])  # alone: no wait for max_wait_ms
        await batcher.stop()
        return steps

    assert asyncio.run(scenario()) == [[4, 4, 2], [2, True], [1, True]]


def test_a_batch_that_spans_a_reload_runs_each_request_on_its_own_model(exports: Path) -> None:
    from project.deploy.serve.models import load_model

    old, new = load_model(exports / "run-a.onnx"), load_model(exports / "run-b.onnx")
    arrays = np.random.default_rng(0).integers(0, 256, (3, 3, SIZE, SIZE), dtype=np.uint8)
    items = [Prepared(old, arrays[0], 1, 1, None), Prepared(new, arrays[1], 1, 1, None)]
    items.append(Prepared(old, arrays[2], 1, 1, None))
    results = run_batch(items)
    assert [size for _, size in results] == [2, 1, 2]
    expected_old = old.classifier.logits(arrays[[0, 2]])
    np.testing.assert_allclose(results[0][0].logits, expected_old[0], rtol=1e-6)
    np.testing.assert_allclose(results[1][0].logits, new.classifier.logits(arrays[[1]])[0], rtol=1e-6)


@pytest.fixture(scope="module")
def strict(exports: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """At most 100 open files and 12 connections, a 1 MiB budget of bodies of up to 0.25 MiB each."""
    flags = ["--max_body_mb", "0.25", "--max_body_memory_mb", "1", "--read_timeout", "5"]
    flags += ["--max_connections", "12"]
    log = tmp_path_factory.mktemp("strict") / "server.log"
    env = {"PROJECT_RELOAD_TOKEN": TOKEN}
    served = Server(exports / "latest.onnx", *flags, log=log, env=env, open_files=100)
    yield served
    served.stop()


@contextmanager
def held_bodies(port: int, count: int, length: int) -> Iterator[list[socket.socket]]:
    """`count` connections whose /predict bodies declare `length` bytes and send 2: requests in progress."""
    with ExitStack() as stack:
        sockets = [stack.enter_context(socket.create_connection(("127.0.0.1", port))) for _ in range(count)]
        for sock in sockets:
            sock.sendall(
                f"POST /predict HTTP/1.1\r\nHost: x\r\nContent-Length: {length}\r\n\r\n\xff\xd8".encode(
                    "latin-1"
                )
            )
        yield sockets


def wait_for(port: int, key: str, value: int) -> None:
    deadline = time.monotonic() + 10
    while request(port, "GET", "/metrics")[1].get(key) != value:
        assert time.monotonic() < deadline, request(port, "GET", "/metrics")[1]
        time.sleep(0.02)


@pytest.mark.slow
def test_bodies_past_the_memory_budget_get_503(strict: Server, images: dict[str, bytes]) -> None:
    with held_bodies(strict.port, 4, 250_000):  # 1,000,000 of the 1,048,576 bytes
        wait_for(strict.port, "body_bytes_held", 1_000_000)
        status, answer, headers = exchange(
            strict.port, "POST", "/predict", images["red.jpg"] + bytes(200_000)
        )
        assert (status, headers.get("retry-after")) == (503, "1"), answer
        assert "budget of 1048576" in answer["error"] and "Fix:" in answer["error"]
        # answered before it was read, and read (dropped) after: the client gets the answer, no reset
        status, answer = predict(strict.port, bytes(32 * 2**20))
        assert status == 413 and "more than the limit of 262144" in answer["error"]
        assert predict(strict.port, images["red.jpg"])[0] == 200  # a small body still fits
    wait_for(strict.port, "body_bytes_held", 0)
    assert predict(strict.port, images["red.jpg"] + bytes(60_000))[0] == 200


@pytest.mark.slow
def test_connections_past_the_cap_close_idle_ones_or_get_503(
    strict: Server, images: dict[str, bytes]
) -> None:
    """150 idle connections at a 100-file limit: the oldest idle ones close, a good request goes through."""
    with ExitStack() as stack:
        for _ in range(150):
            stack.enter_context(socket.create_connection(("127.0.0.1", strict.port)))
        status, answer = predict(strict.port, images["green.jpg"], timeout=5)
        assert status == 200 and answer["predictions"][0]["class_name"] == "green"
    with held_bodies(strict.port, 11, 1000):  # 11 requests in progress, watched through a 12th connection
        wait_for(strict.port, "body_bytes_held", 11_000)
        with held_bodies(strict.port, 1, 1000) as last:  # the 12th: nothing idle is left to close
            time.sleep(0.5)  # its headers are read meanwhile; a probe of it would be a 13th connection
            status, answer, headers = exchange(strict.port, "GET", "/health", timeout=5)
            assert not select.select(last, [], [], 0)[0]  # still open: it was not taken for idle
        assert (status, headers.get("retry-after")) == (503, "1"), answer
        assert "12 open connections, all busy" in answer["error"]
    wait_for(strict.port, "body_bytes_held", 0)
    assert predict(strict.port, images["red.jpg"])[0] == 200
    assert "Traceback" not in strict.log() and "Too many open files" not in strict.log()


@pytest.mark.slow
def test_reload_needs_the_token_and_runs_one_at_a_time(
    server: Server, strict: Server, images: dict[str, bytes]
) -> None:
    status, answer = request(server.port, "POST", "/reload")  # started without a token
    assert status == 403 and "SIGHUP" in answer["error"] and "PROJECT_RELOAD_TOKEN" in answer["error"]
    wrong = [{}, {"Authorization": "Bearer nope"}, {"Authorization": f"Basic {TOKEN}"}]
    wrong.append({"Authorization": f"Bearer {TOKEN[:-1]}x"})
    for headers in wrong:
        status, answer, answered = exchange(strict.port, "POST", "/reload", headers=headers)
        assert (status, answered.get("www-authenticate")) == (401, "Bearer"), headers
    before = request(strict.port, "GET", "/metrics")[1]["reloads"]
    # fewer at once than the strict server's 12 connections: more would evict the ones whose headers
    # have not arrived yet (the connection cap, tested on its own) and read as no answer at all
    start = threading.Barrier(8)

    def reload(_: int) -> tuple[int, str | None]:
        start.wait()
        # the one that runs loads the model: give it time on a busy machine (the 429s answer at once)
        status, _, headers = exchange(strict.port, "POST", "/reload", headers=AUTHORIZED, timeout=60)
        return status, headers.get("retry-after")

    with ThreadPoolExecutor(8) as pool:
        answers = list(pool.map(reload, range(8)))
    assert {a for a in answers if a[0] == 200} == {(200, None)}
    assert (429, "1") in answers and {status for status, _ in answers} == {200, 429}, answers
    after = request(strict.port, "GET", "/metrics")[1]["reloads"]
    assert after - before == sum(status == 200 for status, _ in answers)
    assert predict(strict.port, images["red.jpg"])[0] == 200


FREED_BODIES = """
import sys, threading
from pathlib import Path
from project.deploy.serve.body_memory import return_freed_bodies, trim

def rss_mb():
    status = Path("/proc/self/status").read_text().splitlines()
    return int(next(line for line in status if line.startswith("VmRSS")).split()[1]) // 1024

return_freed_bodies()  # as serve does at start
before = rss_mb()

def whole_bodies():  # five 19 MB bodies at once, small blocks allocated around them
    bodies, small = [bytes(19 * 2**20) for _ in range(5)], [bytes(1000) for _ in range(1000)]
    del bodies

threads = [threading.Thread(target=whole_bodies) for _ in range(8)]
for thread in threads:
    thread.start()
for thread in threads:
    thread.join()
print(rss_mb() - before)

kept, chunks = [], [[] for _ in range(12)]
for _ in range(300):  # 12 bodies of 19 MB arriving together in 64 kB reads, other objects made meanwhile
    for body in chunks:
        body.append(bytes(65536))
    kept.append(bytes(2000))
bodies = [b"".join(body) for body in chunks]
del chunks, bodies
trim()  # as the body budget does once a burst has ended
print(rss_mb() - before)
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's allocator and /proc")
def test_memory_of_a_burst_of_large_bodies_goes_back_to_the_system() -> None:
    """Without the fixed mmap threshold glibc kept 77 of 760 MB resident, without the trim 169 of 460."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([SRC, os.environ.get("PYTHONPATH", "")])}
    run = subprocess.run([sys.executable, "-c", FREED_BODIES], env=env, capture_output=True, text=True)
    assert run.returncode == 0, run.stderr
    whole, chunked = map(int, run.stdout.split())
    assert whole < 20 and chunked < 40


CAP = """
import resource
from project.deploy.serve.command import connection_cap
print(connection_cap(1000), resource.getrlimit(resource.RLIMIT_NOFILE)[0])
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="setrlimit in the child")
@pytest.mark.parametrize(("soft", "hard", "expected"), [(100, 100, "36 100"), (100, 4096, "1000 1064")])
def test_connection_cap_fits_the_open_file_limit(soft: int, hard: int, expected: str) -> None:
    """The soft limit is raised towards the hard one; where that is too low, fewer connections."""
    import resource

    env = {**os.environ, "PYTHONPATH": os.pathsep.join([SRC, os.environ.get("PYTHONPATH", "")])}
    run = subprocess.run(
        [sys.executable, "-c", CAP],
        env=env,
        capture_output=True,
        text=True,
        preexec_fn=lambda: resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard)),
    )
    assert run.stdout.strip() == expected, run.stderr


def test_sampler_queue_holds_at_most_its_bytes(tmp_path: Path) -> None:
    """Images waiting for a slow disk are bounded in bytes, not only in count: the rest are skipped."""
    from project.deploy.serve.sampler import Sampler

    sampler = Sampler(tmp_path, 1.0, 10**9, queue_size=64, max_queued_bytes=3 * 2**20)
    disk = threading.Event()
    write = sampler._write
    sampler._write = lambda *item: (disk.wait(10), write(*item))  # type: ignore[method-assign]
    for _ in range(10):
        sampler.offer(bytes(2**20), "PNG", {"n": 1})
    assert sampler.skipped_busy == 7
    disk.set()
    sampler.close()
    assert sampler.written == 3 and sampler._queued_bytes == 0


def test_images_being_decoded_share_the_budget_with_bodies() -> None:
    from project.deploy.serve.bodies import RequestError
    from project.deploy.serve.body_memory import BodyBudget

    budget = BodyBudget(1000)
    first = budget.reserve_decoding(600, 10, 20)
    with pytest.raises(RequestError, match="holds 600 bytes of request bodies and decoded images") as full:
        budget.reserve_decoding(600, 10, 20)
    assert full.value.status == 503 and budget.refused == 1
    budget.release_decoding(first)
    assert (budget.held, budget.decoding) == (0, 0)
    assert budget.reserve_decoding(600, 10, 20) == 600
    with pytest.raises(RequestError, match="The image is 10x20 pixels") as alone:
        BodyBudget(1000).reserve_decoding(1001, 10, 20)
    assert alone.value.status == 413


@pytest.mark.slow
def test_the_access_log_escapes_what_a_client_sent(exports: Path, tmp_path: Path) -> None:
    """uvicorn takes the client address from X-Forwarded-For (trusted from 127.0.0.1, where a proxy
    runs): a C1 control character there (U+009B, a terminal's CSI) reached the log raw."""
    served = Server(exports / "latest.onnx", "--access_log", log=tmp_path / "server.log")
    try:
        connection = http.client.HTTPConnection("127.0.0.1", served.port, timeout=10)
        connection.request("GET", "/health", headers={"X-Forwarded-For": "\x9b31mred"})
        assert connection.getresponse().status == 200
        connection.close()
        deadline = time.monotonic() + 10
        while "/health" not in served.log().split("31mred")[-1] and time.monotonic() < deadline:
            time.sleep(0.05)
    finally:
        served.stop()
    logged = [line for line in served.log().splitlines() if "31mred" in line]
    assert logged == ['INFO:     \\x9b31mred:0 - "GET /health HTTP/1.1" 200 OK'], served.log()


def test_the_service_has_no_function_over_50_lines() -> None:
    """serve/ reads top to bottom: its state is an object with methods and its routes short functions,
    not 140 lines of closures in one factory (functions nested in a function count towards it)."""
    serve = Path(project.__file__).parent / "deploy" / "serve"
    long = [
        f"{path.name}:{node.name} ({node.end_lineno - node.lineno + 1} lines)"
        for path in sorted(serve.glob("*.py"))
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.end_lineno - node.lineno >= 50
    ]
    assert long == []
