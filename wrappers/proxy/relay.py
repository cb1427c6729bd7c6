"""Runs inside a sandbox: a loopback TCP port that leads to the recording proxy's unix
socket, and nowhere else; then the harness, with its model base URL pointed there.

    python3 -I -S relay.py --connect /path/proxy.sock --path /r/ID/v1 -- bash run.sh

A local sandbox with `block_network=True` has a network namespace of its own holding only
loopback, so nothing it runs can reach any network; the proxy's socket is a file the
sandbox can see (the host's file system is mounted read-only, and connecting to a
socket is not a write to the file system). This relay listens on 127.0.0.1 (an
ephemeral port, inside that namespace), exports `OPENAI_BASE_URL`/`OPENAI_API_BASE` =
`http://127.0.0.1:PORT/r/ID/v1`, runs the command and exits with its exit code.

Standard library only: it runs with whatever `python3` the sandbox has.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import sys


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while True:
            data = await reader.read(65536)
            if not data:
                break
            writer.write(data)
            await writer.drain()
        if writer.can_write_eof():
            writer.write_eof()
    except (ConnectionError, OSError):
        pass


async def _serve_one(sock_path: str, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        up_reader, up_writer = await asyncio.open_unix_connection(sock_path)
    except OSError as e:
        body = f'{{"error": {{"message": "the relay cannot reach the proxy: {e}", "type": "proxy_error"}}}}'.encode()
        writer.write(b"HTTP/1.1 502 Bad Gateway\r\ncontent-type: application/json\r\nconnection: close\r\n"
                     b"content-length: " + str(len(body)).encode() + b"\r\n\r\n" + body)
        await writer.drain()
        writer.close()
        return
    try:
        await asyncio.gather(_pipe(reader, up_writer), _pipe(up_reader, writer))
    finally:
        for w in (writer, up_writer):
            w.close()


async def _main(args: argparse.Namespace) -> int:
    server = await asyncio.start_server(lambda r, w: _serve_one(args.connect, r, w), "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    url = f"http://127.0.0.1:{port}{args.path}"
    env = {**os.environ, "OPENAI_BASE_URL": url, "OPENAI_API_BASE": url, "ORCHARD_PROXY_URL": url}
    if args.port_file:
        with open(args.port_file, "w") as f:
            f.write(str(port))
    child = await asyncio.create_subprocess_exec(*args.command, env=env)
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        loop.add_signal_handler(sig, lambda s=sig: child.returncode is None and child.send_signal(s))
    code = await child.wait()
    server.close()
    return code if code >= 0 else 128 - code


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--connect", required=True, help="the proxy's unix socket")
    parser.add_argument("--path", default="/v1", help="URL path prefix of the rollout, e.g. /r/ID/v1")
    parser.add_argument("--port-file", help="write the chosen port here")
    parser.add_argument("command", nargs=argparse.REMAINDER, help="-- the command to run")
    args = parser.parse_args(argv)
    if args.command[:1] == ["--"]:
        args.command = args.command[1:]
    if not args.command:
        parser.error("give the command to run after --")
    return asyncio.run(_main(args))


if __name__ == "__main__":
    sys.exit(main())
