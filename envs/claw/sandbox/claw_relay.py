"""Raw request relay for the env (door 1 and snapshots): stdin bytes -> service -> stdout.

    python -I -S -c "$(cat claw_relay.py)" SOCKET < request.json

Run as text (`-c`), never from a file in the sandbox, so the policy cannot edit what relays the
env's requests (it could not forge a snapshot's signature anyway).

Only builtin modules (`_socket`, no `json`, no `socket`): it starts in the time of a bare
interpreter, which is most of a door-1 call's cost. The env parses and checks the answer.
"""

import _socket
import sys


def main() -> int:
    data = sys.stdin.buffer.read()
    conn = _socket.socket(_socket.AF_UNIX, _socket.SOCK_STREAM)
    try:
        conn.settimeout(120)
        conn.connect(sys.argv[1])
        conn.sendall(data)
        conn.shutdown(_socket.SHUT_WR)
        while True:
            chunk = conn.recv(65536)
            if not chunk:
                break
            sys.stdout.buffer.write(chunk)
    except OSError as e:
        sys.stderr.write(f"the claw service is unreachable at {sys.argv[1]}: {e}\n")
        return 2
    finally:
        conn.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
