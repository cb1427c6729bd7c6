"""The client of the in-sandbox agent: the one seam every backend shares."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator

from .http1 import ErrorAnswer, HTTP1Client, HTTPConnectError, HTTPProtocolError, Response
from .errors import AgentUnavailable, OrchardError, SandboxTimeout, error_from_agent
from .models import AgentEndpoint, ExecEvent, ExecRequest, ExecResult, FileInfo, PatchResult
from .retry import RetryPolicy, retrying

# the agent enforces a command's timeout; the HTTP wait needs only some slack beyond it
SLACK = 10.0


class AgentClient:
    """Talks to one agent over a unix socket or TCP (async; keeps connections open)."""

    def __init__(self, endpoint: AgentEndpoint, retry: RetryPolicy | None = None):
        self.endpoint = endpoint
        self.retry = retry or RetryPolicy()
        self._http = HTTP1Client(uds=endpoint.uds, base_url=endpoint.base_url,
                                 headers={"Authorization": f"Bearer {endpoint.token}"}, max_idle=8,
                                 server="orchard-agent/", peer="the agent")

    async def aclose(self) -> None:
        await self._http.aclose()

    async def _request(self, method: str, path: str, *, idempotent: bool = True, timeout: float = 30.0,
                       params: dict | None = None, body: bytes | None = None,
                       ctype: str = "application/json") -> Response:
        try:
            async for attempt in retrying(self.retry, idempotent=idempotent):
                with attempt:
                    resp = await self._http.request(method, path, params=params, body=body, ctype=ctype,
                                                    timeout=timeout)
        except TimeoutError as e:
            raise SandboxTimeout(f"agent did not answer {method} {path} within {timeout:.0f}s") from e
        except (HTTPConnectError, HTTPProtocolError) as e:
            raise AgentUnavailable(str(e)) from e
        _raise_for_status(resp)
        return resp

    async def health(self, timeout: float = 2.0) -> dict:
        resp = await self._http.request("GET", "/health", timeout=timeout)
        _raise_for_status(resp)
        return resp.json()

    async def exec(self, req: ExecRequest) -> ExecResult:
        body = json.dumps(req.model_dump(exclude_none=True)).encode()
        resp = await self._request("POST", "/exec", body=body, idempotent=False, timeout=req.timeout + SLACK)
        return ExecResult.model_validate_json(resp.body)

    async def exec_stream(self, req: ExecRequest) -> AsyncIterator[ExecEvent]:
        body = json.dumps(req.model_dump(exclude_none=True)).encode()
        try:
            async for line in self._http.stream_lines("POST", "/exec/stream", body=body,
                                                      timeout=req.timeout + SLACK):
                if line.strip():
                    yield ExecEvent.model_validate_json(line)
        except ErrorAnswer as e:
            _raise_for_status(e.response)
        except TimeoutError as e:
            raise SandboxTimeout("agent stream timed out") from e
        except (HTTPConnectError, HTTPProtocolError) as e:
            raise AgentUnavailable(str(e)) from e

    async def upload(self, path: str, data: bytes, mode: int | None = None) -> dict:
        params = {"path": path}
        if mode is not None:
            params["mode"] = oct(mode)[2:]
        resp = await self._request("PUT", "/files", params=params, body=data, ctype="application/octet-stream",
                                   timeout=300)
        return resp.json()

    async def download(self, path: str) -> bytes:
        return (await self._request("GET", "/files", params={"path": path}, timeout=300)).body

    async def download_stream(self, path: str, timeout: float = 300) -> tuple[int, AsyncIterator[bytes]]:
        """(size, chunks) of a file, read as they arrive: nothing holds the whole file.
        The agent's refusals (413 too large, 422 not a regular file, 404) raise here."""
        try:
            resp, body = await self._http.request_stream("GET", "/files", params={"path": path}, timeout=timeout)
        except TimeoutError as e:
            raise SandboxTimeout(f"agent did not answer GET /files within {timeout:.0f}s") from e
        except (HTTPConnectError, HTTPProtocolError) as e:
            raise AgentUnavailable(str(e)) from e
        if body is None:
            _raise_for_status(resp)
            raise OrchardError(f"agent answered GET /files with {resp.status} and no body")

        async def chunks():
            inner = body.__aiter__()
            try:
                async for chunk in inner:
                    yield chunk
            except (HTTPConnectError, HTTPProtocolError) as e:
                raise AgentUnavailable(str(e)) from e
            except TimeoutError as e:
                raise SandboxTimeout("the agent stopped sending the file") from e
            finally:  # stopped early: close the connection now, not when collected
                await inner.aclose()
        return body.size, chunks()

    async def open_pty(self, init: dict):
        """A terminal session (POST /pty, switched to JSON-line frames): a LinesChannel."""
        from .terminal import LinesChannel

        try:
            reader, writer = await self._http.upgrade("/pty", json.dumps(init).encode())
        except ErrorAnswer as e:
            _raise_for_status(e.response)
            raise OrchardError(f"agent answered POST /pty with {e.response.status}")
        except TimeoutError as e:
            raise SandboxTimeout("agent did not start the terminal session within 30s") from e
        except (HTTPConnectError, HTTPProtocolError) as e:
            raise AgentUnavailable(str(e)) from e
        return LinesChannel(reader, writer)

    async def open_tunnel(self, port: int, timeout: float = 30.0):
        """(reader, writer) of a byte tunnel to 127.0.0.1:port inside the sandbox (POST /connect)."""
        try:
            return await self._http.upgrade("/connect", json.dumps({"port": port}).encode(), timeout)
        except ErrorAnswer as e:
            _raise_for_status(e.response)
            raise OrchardError(f"agent answered POST /connect with {e.response.status}")
        except TimeoutError as e:
            raise SandboxTimeout(f"agent did not open a tunnel to port {port} within {timeout:g}s") from e
        except (HTTPConnectError, HTTPProtocolError) as e:
            raise AgentUnavailable(str(e)) from e

    async def cancel(self, job_id: str) -> bool:
        resp = await self._request("POST", f"/jobs/{job_id}/cancel", body=b"")
        return bool(resp.json().get("cancelled"))

    async def list_files(self, path: str = ".") -> list[FileInfo]:
        resp = await self._request("GET", "/files/list", params={"path": path})
        return [FileInfo.model_validate(f) for f in resp.json()["files"]]

    async def apply_patch(self, patch: str, cwd: str | None = None, timeout: float = 120) -> PatchResult:
        payload = {"patch": patch, "timeout": timeout}
        if cwd:
            payload["cwd"] = cwd
        resp = await self._request("POST", "/patch", body=json.dumps(payload).encode(), idempotent=False,
                                   timeout=timeout + SLACK)
        return PatchResult.model_validate_json(resp.body)


def _raise_for_status(resp: Response) -> None:
    if resp.status < 400:
        return
    try:
        message = resp.json().get("error") or resp.body.decode("utf-8", "replace")
    except (ValueError, AttributeError):
        message = resp.body.decode("utf-8", "replace")
    raise error_from_agent(resp.status, str(message))
