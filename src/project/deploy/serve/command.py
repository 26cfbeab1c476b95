"""`python -m project serve --model PATH`: the flags, their checks, and running the service with uvicorn.

The socket is bound here, before anything starts, so that a port in use is one clear error and
`--port 0` (any free port) works: the first line printed names the address actually served.
SIGTERM or Ctrl-C stops accepting connections, lets the requests in progress finish (at most
`--shutdown_timeout` seconds), writes the queued samples and exits with status 0.

The connection limits (header time and size, open connections) are applied by a subclass of
uvicorn's HTTP protocol (connections.py), the body limits by the app (bodies.py, app.py).
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import signal
import socket
import sys
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING
from urllib.parse import urlsplit

from project.config_checks import positive_int, require
from project.errors import CommandParser, UserError, exits_on_user_error
from project.terminal import PrintableLog

if TYPE_CHECKING:  # imported by serve() itself, once the flags are checked
    from starlette.types import ASGIApp

    from project.deploy.serve.sampler import Sampler
    from project.deploy.serve.service import Settings

DESCRIPTION = "Serve an exported model over HTTP with dynamic batching (onnxruntime or OpenVINO; no torch)."
TOKEN_VARIABLE = "PROJECT_RELOAD_TOKEN"
RESERVED_FILES = 64  # descriptors beside the connections: listening socket, model files, samples, logs


def parser() -> argparse.ArgumentParser:
    """serve's flags, in groups as `--help` shows them."""
    p = CommandParser(prog="python -m project serve", description=DESCRIPTION)
    p.add_argument(
        "--model",
        required=True,
        help="exported .onnx or OpenVINO .xml (or a latest.onnx/latest.xml link), its .json beside it",
    )
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (0.0.0.0: every interface)")
    p.add_argument("--port", type=int, default=8000, help="port to listen on (0: any free port)")
    p.add_argument("--top_k", type=int, default=5, help="classes per answer unless ?top_k= says otherwise")
    # room: unknown begin
    p.add_argument(
        "--unknown_accept",
        type=float,
        default=None,
        help="share of validation images accepted; below the threshold this gives, the answer's "
        "class_name is `unknown` (default: the export's, usually 0.95; 0: never unknown)",
    )
    # room: unknown end
    add_batching(p)
    add_limits(p)
    access = p.add_argument_group("access")
    access.add_argument(
        "--reload_token_file",
        default=None,
        help=f"file holding the secret that POST /reload must send as 'Authorization: Bearer ...' "
        f"(or set ${TOKEN_VARIABLE}; neither: only SIGHUP reloads)",
    )
    # kept for old scripts: a flag's value shows in `ps` and /proc/<pid>/cmdline to every local user
    access.add_argument(
        "--reload_token", default=None, help=f"the secret itself (visible in ps: use ${TOKEN_VARIABLE})"
    )
    access.add_argument(
        "--allow_origin",
        action="append",
        default=[],
        metavar="ORIGIN",
        help="a web page origin (https://app.example.com) besides the service's own whose pages may "
        "call it; repeat for more (default: none: requests from other sites' pages get 403)",
    )
    access.add_argument("--api_docs", action="store_true", help="serve /docs and /openapi.json")
    sampling = p.add_argument_group("input sampling (for data drift)")
    sampling.add_argument("--sample_fraction", type=float, default=0.0, help="share of requests kept, 0-1")
    sampling.add_argument("--sample_dir", default=None, help="folder for the kept images and answers")
    sampling.add_argument("--sample_max_mb", type=float, default=500.0, help="folder bound; oldest deleted")
    p.add_argument("--access_log", action="store_true", help="log every request (costs throughput)")
    return p


def add_batching(p: argparse.ArgumentParser) -> None:
    """The flags of the batcher and of the threads it and decoding use."""
    batching = p.add_argument_group("batching")
    batching.add_argument("--max_batch_size", type=int, default=32, help="1 turns batching off")
    batching.add_argument("--max_wait_ms", type=float, default=5.0, help="how long a batch waits to fill up")
    batching.add_argument("--max_pending", type=int, default=512, help="queued requests before answering 503")
    batching.add_argument(
        "--threads", type=int, default=None, help="onnxruntime or OpenVINO threads (default: one per core)"
    )
    # decoding holds the GIL outside Pillow's C code, so more threads than half the cores contend
    # with the event loop instead of overlapping (2 cores: 1 thread answered 18% more than 2)
    batching.add_argument(
        "--decode_threads",
        type=int,
        default=max(1, min(4, (os.cpu_count() or 2) // 2)),
        help="threads decoding and resizing images (default: half the cores, at most 4)",
    )


def add_limits(p: argparse.ArgumentParser) -> None:
    """The flags bounding what clients may send and hold: bodies, images, time, connections."""
    limits = p.add_argument_group("limits")
    limits.add_argument("--max_body_mb", type=float, default=20.0, help="largest request body")
    limits.add_argument("--max_pixels", type=int, default=40_000_000, help="largest image (width x height)")
    limits.add_argument("--read_timeout", type=float, default=30.0, help="seconds a client may take to send")
    limits.add_argument("--shutdown_timeout", type=int, default=10, help="seconds to finish requests on stop")
    limits.add_argument(
        "--max_body_memory_mb",
        type=float,
        # one image of --max_pixels decodes in 720 MB (18 bytes a pixel): a 24-megapixel phone photo fits
        default=1024.0,
        help="request bodies and decoded images held at once, all together",
    )
    limits.add_argument(
        "--header_timeout", type=float, default=10.0, help="seconds a client may take to send its headers"
    )
    limits.add_argument("--max_header_kb", type=float, default=64.0, help="largest request line + headers")
    limits.add_argument(
        "--keep_alive", type=float, default=5.0, help="seconds an idle connection stays open between requests"
    )
    limits.add_argument(
        "--max_connections",
        type=int,
        default=1000,
        help="open connections; beyond, the longest-idle one is closed, or 503 (fits ulimit -n)",
    )


def check(args: argparse.Namespace) -> None:
    """Ranges the types cannot express; UserError naming the flag."""
    for name in ("top_k", "max_batch_size", "max_pending", "decode_threads", "max_connections"):
        positive_int(name, getattr(args, name))
    if args.threads is not None:
        positive_int("threads", args.threads)
    require(0 <= args.port <= 65535, "port", args.port, "a port number from 0 to 65535")
    # room: unknown begin
    if args.unknown_accept is not None:
        require(0 <= args.unknown_accept <= 1, "unknown_accept", args.unknown_accept, "a share from 0 to 1")
    # room: unknown end
    require(args.max_wait_ms >= 0, "max_wait_ms", args.max_wait_ms, "a number of milliseconds >= 0")
    for name in (
        "max_body_mb",
        "read_timeout",
        "sample_max_mb",
        "header_timeout",
        "max_header_kb",
        "keep_alive",
    ):
        require(getattr(args, name) > 0, name, getattr(args, name), "a number > 0")
    require(
        args.max_body_memory_mb >= args.max_body_mb,
        "max_body_memory_mb",
        args.max_body_memory_mb,
        f"a number >= --max_body_mb ({args.max_body_mb:g}), so that one largest body fits",
    )
    require(args.max_pixels >= 1, "max_pixels", args.max_pixels, "an integer >= 1")
    require(args.shutdown_timeout >= 0, "shutdown_timeout", args.shutdown_timeout, "an integer >= 0")
    require(0 <= args.sample_fraction <= 1, "sample_fraction", args.sample_fraction, "a number from 0 to 1")
    if args.sample_fraction > 0 and args.sample_dir is None:
        raise UserError("--sample_fraction is set but --sample_dir is not.", "add --sample_dir FOLDER.")
    args.allow_origin = [origin_of(value) for value in args.allow_origin]
    args.reload_token = reload_token(args)


def origin_of(value: str) -> str:
    """`value` as browsers send it in Origin (scheme://host[:port], lower case); UserError otherwise."""
    parts = urlsplit(value.strip())
    try:
        port_ok = parts.port is None or parts.port > 0
    except ValueError:
        port_ok = False
    if not (
        parts.scheme in ("http", "https")
        and parts.hostname
        and port_ok
        and "@" not in parts.netloc
        and parts.path in ("", "/")
        and not parts.query
        and not parts.fragment
    ):
        raise UserError(
            f"--allow_origin {value!r} is not a web page origin.",
            "pass the scheme, host and port as browsers send them in the Origin header, without a path, "
            "e.g. --allow_origin https://app.example.com or http://localhost:3000.",
        )
    return f"{parts.scheme}://{parts.netloc.lower()}"


def reload_token(args: argparse.Namespace) -> str | None:
    """The reload token from --reload_token_file, $PROJECT_RELOAD_TOKEN or --reload_token (warned
    about: a flag is visible to every local user); None when none is given. UserError when it is
    given twice, unreadable, or short."""
    from_env = os.environ.get(TOKEN_VARIABLE) or None
    if args.reload_token_file is not None and (from_env or args.reload_token):
        given = "--reload_token" if args.reload_token else f"${TOKEN_VARIABLE}"
        raise UserError(
            f"The reload token is given twice: by --reload_token_file and by {given}.",
            f"give it one way: unset {given}, or leave out --reload_token_file.",
        )
    if args.reload_token is not None:
        token, source = args.reload_token, "--reload_token"
    elif args.reload_token_file is not None:
        token = token_from_file(Path(args.reload_token_file))
        source = f"--reload_token_file '{args.reload_token_file}'"
    else:
        token, source = from_env, f"${TOKEN_VARIABLE}"
    if token is not None and len(token) < 16:
        raise UserError(
            f"The reload token ({source}) has {len(token)} characters; a short one can be guessed.",
            "use at least 16 random characters, e.g. "
            'python -c "import secrets; print(secrets.token_urlsafe())".',
        )
    if args.reload_token_file is not None and os.stat(args.reload_token_file).st_mode & 0o077:
        print(
            f"warning: --reload_token_file '{args.reload_token_file}' can be read by other users: "
            "chmod 600 it.",
            file=sys.stderr,
        )
    if args.reload_token is not None:
        print(
            "warning: --reload_token on the command line is visible to every user of this machine "
            f"(ps, /proc/<pid>/cmdline). Set ${TOKEN_VARIABLE} or pass --reload_token_file instead.",
            file=sys.stderr,
        )
    return token


def token_from_file(path: Path) -> str:
    """The token a file holds, without surrounding whitespace (its newline); UserError when unusable."""
    try:
        token = path.read_text(encoding="utf-8").strip()
    except (OSError, UnicodeDecodeError) as e:
        reason = e.strerror if isinstance(e, OSError) and e.strerror else str(e)
        raise UserError(
            f"Cannot read --reload_token_file '{path}': {reason}.",
            "pass a readable text file that holds the token on one line.",
        ) from None
    if not token or any(c.isspace() for c in token):
        raise UserError(
            f"--reload_token_file '{path}' holds {'nothing' if not token else 'more than one word'}.",
            "write the token alone on one line, e.g. "
            'python -c "import secrets; print(secrets.token_urlsafe())" > FILE.',
        )
    return token


def bind(host: str, port: int) -> socket.socket:
    """A listening-ready socket on host:port; UserError with the reason when the address is unusable."""
    try:
        family, kind, proto, _, address = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0]
        sock = socket.socket(family, kind, proto)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # restart at once after a stop
        sock.bind(address)
    except OSError as e:
        raise UserError(
            f"Cannot listen on {host}:{port}: {e.strerror or e}.",
            "pass another --port (or --port 0 for any free one), or stop the program that uses it.",
        ) from None
    return sock


def connection_cap(wanted: int) -> int:
    """`wanted`, or fewer where the open-file limit cannot hold that many connections beside the rest.

    Past the limit accept() fails and every new connection, good ones included, is reset; the soft
    limit is raised towards the hard one first (the usual 1,024 is often far below it).
    """
    try:
        import resource
    except ImportError:  # Windows: no such limit to fit
        return wanted
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    needed = wanted + RESERVED_FILES
    if soft != resource.RLIM_INFINITY and soft < needed:
        raised = needed if hard == resource.RLIM_INFINITY else min(needed, hard)
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(resource.RLIMIT_NOFILE, (raised, hard))
            soft = raised
    if soft == resource.RLIM_INFINITY:
        return wanted
    return max(1, min(wanted, soft - RESERVED_FILES))


def serve(args: argparse.Namespace) -> None:
    """Load the model, bind the socket and serve until SIGTERM or Ctrl-C."""
    from project.deploy.serve.app import create_app
    from project.deploy.serve.body_memory import return_freed_bodies
    from project.deploy.serve.models import ModelSlot

    return_freed_bodies()
    slot = ModelSlot(
        Path(args.model),
        args.threads,
        args.unknown_accept,  # room: unknown
    )
    sock = bind(args.host, args.port)
    max_connections = connection_cap(args.max_connections)
    banner = banner_of(args, slot.current.version, sock.getsockname()[:2], max_connections)
    app = create_app(slot, settings_of(args), sampler_of(args), banner)
    run(app, sock, args, max_connections)


def settings_of(args: argparse.Namespace) -> Settings:
    from project.deploy.serve.bodies import Limits
    from project.deploy.serve.service import Settings

    limits = Limits(round(args.max_body_mb * 2**20), args.max_pixels, args.read_timeout)
    return Settings(
        args.top_k,
        args.max_batch_size,
        args.max_wait_ms,
        args.max_pending,
        args.decode_threads,
        limits,
        max_body_memory=round(args.max_body_memory_mb * 2**20),
        reload_token=args.reload_token,
        api_docs=args.api_docs,
        allow_origins=tuple(args.allow_origin),
    )


def sampler_of(args: argparse.Namespace) -> Sampler | None:
    """The sampler --sample_fraction asks for, or None; UserError when --sample_dir is unusable."""
    from project.deploy.serve.sampler import Sampler

    if args.sample_fraction == 0:
        return None
    try:
        return Sampler(Path(args.sample_dir), args.sample_fraction, round(args.sample_max_mb * 2**20))
    except OSError as e:
        raise UserError(
            f"Cannot keep samples in --sample_dir '{args.sample_dir}': {e.strerror or e}.",
            "pass a folder this user can create and write, or leave out --sample_fraction.",
        ) from None


def banner_of(args: argparse.Namespace, version: str, address: tuple[str, int], max_connections: int) -> str:
    """The first lines printed: the address actually served, and a connection cap lower than asked."""
    host, port = address
    shown = f"[{host}]" if ":" in host else host
    banner = (
        f"Serving {args.model} (version {version}) on http://{shown}:{port} "
        f"(max batch {args.max_batch_size}, max wait {args.max_wait_ms:g} ms). Stop with Ctrl-C or SIGTERM."
    )
    if max_connections < args.max_connections:
        banner += (
            f"\nAt most {max_connections} open connections, not --max_connections "
            f"{args.max_connections}: the open-file limit (ulimit -n) is lower."
        )
    return banner


def run(app: ASGIApp, sock: socket.socket, args: argparse.Namespace, max_connections: int) -> None:
    """Run `app` with uvicorn on `sock` until a stop signal, then exit with status 0."""
    import uvicorn

    from project.deploy.serve.connections import ConnectionLimits, guarded_protocol

    max_header_bytes = round(args.max_header_kb * 1024)
    connection_limits = ConnectionLimits(args.header_timeout, max_header_bytes, max_connections)
    # no limit_concurrency: it counts idle connections too, so a slow client flood would refuse
    # every good request; the protocol's cap closes the idle ones instead (connections.py)
    config = uvicorn.Config(
        app,
        http=guarded_protocol(connection_limits),
        log_level="info",
        access_log=args.access_log,
        timeout_graceful_shutdown=args.shutdown_timeout,
        timeout_keep_alive=args.keep_alive,  # type: ignore[arg-type]  # a float works: call_later
        h11_max_incomplete_event_size=max_header_bytes,  # where h11 parses (no httptools)
        server_header=False,
        lifespan="on",
    )
    logging.getLogger("uvicorn.access").addFilter(PrintableLog())  # a forwarded address is the client's text
    # uvicorn re-raises the stop signal after its graceful shutdown; with these handlers (its
    # "previous" ones) that re-raise does nothing, and a requested stop exits with status 0
    for stop in (signal.SIGINT, signal.SIGTERM):
        signal.signal(stop, lambda *_: None)
    # hostile files make Pillow warn (corrupt EXIF, bomb sizes): each one is refused with its
    # reason in the answer, and warnings.catch_warnings is not thread-safe for the decode pool
    warnings.filterwarnings("ignore", module="PIL")
    uvicorn.Server(config).run(sockets=[sock])


@exits_on_user_error
def main(argv: Sequence[str] | None = None) -> None:
    args = parser().parse_args(argv)
    check(args)
    serve(args)
