"""``python -m mockllm``: run the mock LLM upstream.

On readiness it prints exactly one line to stdout,
``mock-llm listening on URL`` followed by `` (ca: PATH)`` with ``--tls`` (and ``--grpc``),
and writes URL alone to ``--ready-file`` (atomically, via rename) so a test
can poll for the file instead of parsing output. SIGINT/SIGTERM stop it
gracefully with exit status 0.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import tempfile
from contextlib import ExitStack
from pathlib import Path

from . import certs, grpc_mock
from .server import MockLLM, listen, serve


def _parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="mock-llm", description="Run the mock LLM upstream.")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0, help="0 picks a free port")
    parser.add_argument("--tls", action="store_true", help="HTTPS with ALPN h2 and http/1.1")
    parser.add_argument("--cert-dir", type=Path, help="where to write ca.pem/cert.pem/key.pem (default: a temp dir)")
    parser.add_argument(
        "--cert-name",
        action="append",
        default=[],
        metavar="NAME",
        help="with --tls: a further host name (or IP address) the certificate is valid for, "
        "e.g. api.openai.com; repeatable",
    )
    parser.add_argument(
        "--grpc", action="store_true", help="a gRPC server (TLS, implies --tls) of the protobuf methods instead"
    )
    parser.add_argument("--ready-file", type=Path, help="file to write the URL to once listening")
    return parser.parse_args(argv)


def _write_atomically(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(text)
    tmp.replace(path)


async def _run(args: argparse.Namespace, cert_dir: Path | None) -> None:
    paths = certs.generate(cert_dir, tuple(args.cert_name)) if cert_dir is not None else None
    host = f"[{args.host}]" if ":" in args.host else args.host

    def announce(port: int) -> None:
        url = f"{'https' if paths else 'http'}://{host}:{port}"
        print(f"mock-llm listening on {url}" + (f" (ca: {paths.ca})" if paths else ""), flush=True)
        if args.ready_file is not None:
            _write_atomically(args.ready_file, url)

    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(signum, stop.set)
    if args.grpc and paths is not None:
        await grpc_mock.serve(args.host, args.port, paths, on_ready=announce, stop=stop)
        return
    sock = listen(args.host, args.port)
    port = sock.getsockname()[1]
    await serve(MockLLM(), sock, paths, on_ready=lambda: announce(port), stop=stop)


def main(argv: list[str] | None = None) -> None:
    args = _parse_args(argv)
    with ExitStack() as stack:
        cert_dir: Path | None = None
        if args.tls or args.grpc:
            cert_dir = args.cert_dir or Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="mock-llm-")))
        asyncio.run(_run(args, cert_dir))


if __name__ == "__main__":
    main()
