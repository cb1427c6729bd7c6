"""One request to the GUI daemon from inside the sandbox (backends whose sandboxes the host
cannot reach by path, e.g. Docker): the request on stdin, the answer's JSON on stdout, the
screenshot bytes (if any) written to FRAME_PATH for the env to download."""

import json
import os
import socket
import sys


def main() -> None:
    sock_path, frame_path = sys.argv[1], sys.argv[2]
    s = socket.socket(socket.AF_UNIX)
    s.connect(sock_path)
    s.sendall(sys.stdin.buffer.read().strip() + b"\n")
    f = s.makefile("rb")
    head = json.loads(f.readline())
    n = head.get("frame") or 0
    if n:
        tmp = frame_path + ".tmp"
        with open(tmp, "wb") as out:
            out.write(f.read(n))
        os.replace(tmp, frame_path)
    sys.stdout.write(json.dumps(head))


if __name__ == "__main__":
    main()
