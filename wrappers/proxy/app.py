"""The proxy's ASGI app: model endpoints per rollout, the admin control API, and the guard
that keeps the unix socket (what sandboxes reach) to model endpoints only."""

from __future__ import annotations

import contextlib
import hmac
import json
import secrets

from fastapi import Depends, FastAPI, HTTPException, Query, Request
from fastapi.responses import JSONResponse, Response

from .anthropic_format import MESSAGES, anthropic_error, check_prompt, estimate_input_tokens
from .openai_format import CHAT, RESPONSES, FormatError, assistant_message, error_body
from .calls import bearer_token, error_response, ModelEndpoints
from .models import Answer, FinishRollout, OpenRollout, ProxyConfig
from .records import Rollout, RolloutClosed, RolloutNotFound, RolloutStore


class _UnixSocketGuard:
    """Over the unix socket (what sandboxes reach) only model endpoints and /health exist."""

    def __init__(self, app):
        self.app = app

    async def __call__(self, scope, receive, send):
        if scope["type"] == "http":
            server = scope.get("server")
            over_uds = server is None or server[1] is None
            path = scope.get("path", "")
            if over_uds and not (path.startswith("/r/") or path == "/health"):
                await JSONResponse(error_body("not found", "invalid_request_error", "not_found"),
                                   status_code=404)(scope, receive, send)
                return
        await self.app(scope, receive, send)


def create_app(config: ProxyConfig | None = None, store: RolloutStore | None = None) -> FastAPI:
    """The proxy's ASGI app. `app.state.store` holds the rollouts, `app.state.config` the config
    (its `admin_key` filled in when it was absent)."""
    config = (config or ProxyConfig()).model_copy()
    config.admin_key = config.admin_key or secrets.token_urlsafe(24)
    store = store or RolloutStore()
    model = ModelEndpoints(config, store)

    @contextlib.asynccontextmanager
    async def lifespan(app):
        yield
        await model.aclose()

    app = FastAPI(title="orchard-gym recording proxy", lifespan=lifespan, docs_url=None, redoc_url=None)
    app.state.config, app.state.store, app.state.model = config, store, model

    def admin(request: Request) -> None:
        token = bearer_token(request)
        if token is None or not hmac.compare_digest(token.encode(), config.admin_key.encode()):
            raise HTTPException(401, "missing or wrong admin key (Authorization: Bearer <admin key>)")

    def rollout_or_404(rollout_id: str) -> Rollout:
        try:
            return store.get(rollout_id)
        except RolloutNotFound as e:
            raise HTTPException(404, str(e)) from None

    def base_url(request: Request, rollout_id: str) -> str:
        root = config.public_url or str(request.base_url).rstrip("/")
        return f"{root.rstrip('/')}/r/{rollout_id}/v1"

    # ------------------------------------------------------------------ model endpoints
    @app.post("/r/{rollout_id}/v1/chat/completions", include_in_schema=False)
    async def chat_completions(rollout_id: str, request: Request):
        return await model.call(request, rollout_id, CHAT)

    @app.post("/r/{rollout_id}/v1/responses", include_in_schema=False)
    async def responses(rollout_id: str, request: Request):
        return await model.call(request, rollout_id, RESPONSES)

    @app.post("/r/{rollout_id}/v1/messages", include_in_schema=False)
    async def messages(rollout_id: str, request: Request):
        return await model.call(request, rollout_id, MESSAGES)

    def authorized(request: Request, rollout_id: str) -> Rollout | JSONResponse:
        """The rollout, or the error (in the caller's dialect: Anthropic's when it sent anthropic-version)."""
        endpoint = MESSAGES if "anthropic-version" in request.headers else CHAT
        try:
            rollout = store.get(rollout_id)
        except RolloutNotFound as e:
            return error_response(endpoint, 404, str(e), "rollout_not_found")
        if not rollout.check_token(bearer_token(request)):
            rollout.reject("missing or wrong rollout token", request.url.path)
            return error_response(endpoint, 401, "missing or wrong rollout token", "invalid_api_key",
                              "authentication_error")
        return rollout

    @app.post("/r/{rollout_id}/v1/messages/count_tokens", include_in_schema=False)
    async def count_tokens(rollout_id: str, request: Request):
        rollout = authorized(request, rollout_id)
        if isinstance(rollout, JSONResponse):
            return rollout
        try:
            body = check_prompt(json.loads(await request.body()))
        except (ValueError, FormatError) as e:
            rollout.reject(f"bad request: {e}", request.url.path)
            return JSONResponse(anthropic_error(400, f"bad request: {e}"), status_code=400)
        return {"input_tokens": estimate_input_tokens(body)}  # an estimate: the proxy has no tokenizer

    def model_names(rollout: Rollout) -> list[str]:
        return [(config.upstream_model or config.model_name) if rollout.record.mode == "upstream" else config.model_name]

    def model_entry(name: str) -> dict:  # both dialects' fields: OpenAI's and Anthropic's clients read theirs
        return {"id": name, "object": "model", "created": 0, "owned_by": "orchard-gym", "type": "model",
                "display_name": name, "created_at": "1970-01-01T00:00:00Z"}

    @app.get("/r/{rollout_id}/v1/models", include_in_schema=False)
    async def models(rollout_id: str, request: Request):
        rollout = authorized(request, rollout_id)
        if isinstance(rollout, JSONResponse):
            return rollout
        names = model_names(rollout)
        return {"object": "list", "data": [model_entry(n) for n in names], "has_more": False,
                "first_id": names[0], "last_id": names[-1]}

    @app.get("/r/{rollout_id}/v1/models/{name:path}", include_in_schema=False)
    async def one_model(rollout_id: str, name: str, request: Request):
        rollout = authorized(request, rollout_id)
        if isinstance(rollout, JSONResponse):
            return rollout
        return model_entry(name)  # whatever the harness names is served (the proxy picks the model)

    # ------------------------------------------------------------------ control API
    @app.get("/health")
    async def health():
        return {"status": "ok", "rollouts": len(store.rollouts), "upstream": config.upstream}

    @app.post("/rollouts", dependencies=[Depends(admin)], status_code=201)
    async def open_rollout(body: OpenRollout, request: Request):
        mode = body.mode or ("upstream" if config.upstream else "policy")
        if mode == "upstream" and not config.upstream:
            raise HTTPException(422, "this proxy has no upstream (start it with --upstream URL) or use mode=policy")
        try:
            rollout = store.open(mode, body.metadata, body.rollout_id)
        except ValueError as e:
            raise HTTPException(409, str(e)) from None
        return {"rollout_id": rollout.id, "token": rollout.token, "mode": mode,
                "base_url": base_url(request, rollout.id)}

    @app.get("/rollouts", dependencies=[Depends(admin)])
    async def list_rollouts(status: str | None = None):
        return [r.summary() for r in store.records([status] if status else None)]

    @app.get("/rollouts/{rollout_id}", dependencies=[Depends(admin)])
    async def get_rollout(rollout_id: str):
        return rollout_or_404(rollout_id).record.model_dump(mode="json")

    @app.post("/rollouts/{rollout_id}/finish", dependencies=[Depends(admin)])
    async def finish_rollout(rollout_id: str, body: FinishRollout):
        rollout_or_404(rollout_id)
        try:
            return store.finish(rollout_id, reward=body.reward, error=body.error).summary()
        except RolloutClosed as e:
            raise HTTPException(409, str(e)) from None
        except ValueError as e:
            raise HTTPException(422, str(e)) from None

    @app.delete("/rollouts/{rollout_id}", dependencies=[Depends(admin)])
    async def delete_rollout(rollout_id: str):
        rollout_or_404(rollout_id)
        return store.delete(rollout_id).summary()

    @app.get("/rollouts/{rollout_id}/samples", dependencies=[Depends(admin)])
    async def samples(rollout_id: str, gamma: float = Query(1.0, ge=0.0, le=1.0), include_failed: bool = False):
        from .reconstruct import reconstruct

        record = rollout_or_404(rollout_id).record
        if record.status == "open":
            raise HTTPException(409, f"rollout {rollout_id} is still open; finish it first")
        return [s.model_dump(mode="json") for s in reconstruct(record, gamma=gamma, drop_failed=not include_failed)]

    @app.get("/rollouts/{rollout_id}/trajectory", dependencies=[Depends(admin)])
    async def trajectory(rollout_id: str):
        from .reconstruct import to_trajectory

        return to_trajectory(rollout_or_404(rollout_id).record).model_dump(mode="json")

    @app.get("/rollouts/{rollout_id}/next", dependencies=[Depends(admin)])
    async def next_call(rollout_id: str, timeout: float = Query(30.0, ge=0.0, le=600.0)):
        rollout = rollout_or_404(rollout_id)
        if rollout.record.mode != "policy":
            raise HTTPException(409, f"rollout {rollout_id} is in {rollout.record.mode} mode")
        pending = await store.next_call(rollout_id, timeout)
        if pending is None:
            return Response(status_code=204)
        c = pending.record
        return {"call_id": c.call_id, "index": c.index, "endpoint": c.endpoint, "messages": c.messages,
                "tools": c.tools, "request": c.request}

    @app.post("/rollouts/{rollout_id}/calls/{call_id}/respond", dependencies=[Depends(admin)])
    async def respond(rollout_id: str, call_id: str, body: Answer):
        rollout_or_404(rollout_id)
        try:
            message = assistant_message(body.message)
            extra = body.model_dump(exclude={"message"}, exclude_none=True)
            return {"call_id": store.respond(rollout_id, call_id, message, **extra).call_id}
        except FormatError as e:
            raise HTTPException(422, str(e)) from None
        except RolloutClosed as e:
            raise HTTPException(409, str(e)) from None
        except KeyError as e:
            raise HTTPException(404, str(e.args[0])) from None

    @app.get("/export", dependencies=[Depends(admin)])
    async def export(status: str | None = None):
        records = store.records([status] if status else None)
        return Response("".join(r.model_dump_json() + "\n" for r in records), media_type="application/x-ndjson")

    @app.api_route("/r/{rollout_id}/{rest:path}", methods=["GET", "POST", "PUT", "PATCH", "DELETE", "HEAD"],
                   include_in_schema=False)
    async def unknown(rollout_id: str, rest: str, request: Request):
        """Endpoints no door serves: noted on the rollout (so a harness's surprises show)."""
        rollout = authorized(request, rollout_id)
        if isinstance(rollout, JSONResponse):
            return rollout
        rollout.reject(f"no such endpoint: {request.method} /{rest}", request.url.path)
        endpoint = MESSAGES if "anthropic-version" in request.headers else CHAT
        return error_response(endpoint, 404, f"the proxy has no endpoint {request.method} /{rest}", "not_found")

    app.add_middleware(_UnixSocketGuard)
    return app
