"""The admin API, behind the admin key (admin_key_sha256); tenant keys are refused (403).

GET  /admin/tenants                     every tenant: group, weight, VTC counter, waiting,
                                        running, service received, preemptions
POST /admin/tenants/{name}/weight       {"weight": 2.0}: the next decision uses it
GET  /admin/groups                      every group: weight, VTC counter, service
POST /admin/groups/{path}/weight        {"weight": 2.0}: the next decision uses it
GET  /admin/requests                    the requests in flight: id, tenant, tokens, age
POST /admin/requests/{request_id}/abort abort one request (its id is the response's `id`)
POST /admin/reload                      re-read the tenants file (as SIGHUP does)
GET  /admin/requests/recent             the last finished requests with their timing
                                        (TTFT in seconds and in engine steps), newest last
"""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Depends, Query, Request
from fastapi.responses import Response

from tokenfair.core.share_tree import group_id
from tokenfair.edge.errors import APIError
from tokenfair.edge.weight_change import WeightChange
from tokenfair.server.metrics import RECENT_REQUESTS
from tokenfair.server.routes import json_response
from tokenfair.server.state import ServerState


def _state(request: Request) -> ServerState:
    state: ServerState = request.app.state.server
    state.tenants.check_admin(request.headers.get("authorization"))
    return state


router = APIRouter(prefix="/admin", tags=["admin"])
AdminState = Annotated[ServerState, Depends(_state)]


@router.get("/tenants", summary="Tenants with their counters and queues")
async def list_tenants(state: AdminState) -> Response:
    snap = await state.snapshot()
    names = {t.name for t in state.tenants.tenants} | set(snap.running) | set(snap.waiting)
    rows: list[dict[str, Any]] = []
    for name in sorted(names):
        tenant = state.tenants.get(name)
        rows.append(
            {
                "name": name,
                "group": tenant.group if tenant else None,
                "weight": snap.weights.get(name, tenant.weight if tenant else 1.0),
                "priority": tenant.priority if tenant else 0,
                "counter": snap.counters.get(name, 0.0),
                "waiting": snap.waiting.get(name, 0),
                "running": snap.running.get(name, 0),
                "swapped": snap.swapped.get(name, 0),
                "service": state.metrics.service.get(name, 0.0),
                "preemptions": snap.preemptions.get(name, 0),
            }
        )
    return json_response({"object": "list", "data": rows})


# `:path`: a tenant name may hold a slash (`org/team`), plain or as %2F.
@router.post("/tenants/{name:path}/weight", summary="Change a tenant's weight at run time")
async def set_weight(name: str, change: WeightChange, state: AdminState) -> Response:
    if state.tenants.get(name) is None:
        raise APIError(404, f"no tenant named {name!r}", param="name")
    await state.set_weight(name, change.weight)
    return json_response({"name": name, "weight": change.weight})


@router.get("/groups", summary="Groups of tenants with their counters and service")
async def list_groups(state: AdminState) -> Response:
    snap = await state.snapshot()
    tree = state.tenants.tree
    rows: list[dict[str, Any]] = []
    for path, weight in sorted(state.tenants.groups.items()):
        node = group_id(path)
        rows.append(
            {
                "path": path,
                "parent": tree.parent_of(node)[1:] or None,
                "weight": snap.weights.get(node, weight),
                "counter": snap.group_counters.get(path, 0.0),
                "service": sum(
                    amount
                    for tenant, amount in state.metrics.service.items()
                    if node in tree.path(tenant)
                ),
            }
        )
    return json_response({"object": "list", "data": rows})


# `:path`: a group's path holds slashes (`org-a/search`).
@router.post("/groups/{path:path}/weight", summary="Change a group's weight at run time")
async def set_group_weight(path: str, change: WeightChange, state: AdminState) -> Response:
    if path not in state.tenants.groups:
        raise APIError(404, f"no group {path!r}", param="path")
    await state.set_group_weight(path, change.weight)
    return json_response({"path": path, "weight": change.weight})


@router.get("/requests", summary="The requests in flight, oldest first")
async def requests_in_flight(
    state: AdminState, tenant: Annotated[str | None, Query(max_length=256)] = None
) -> Response:
    """What an operator needs to find a request to abort: a non-streaming request's id
    is otherwise only known once its answer has come."""
    now = state.engine.now()
    in_flight = [stream.request for stream in list(state.engine.streams.values())]
    in_flight.sort(key=lambda request: request.arrival_s)
    rows = [
        {
            "id": request.request_id,
            "tenant": request.client,
            "prompt_tokens": request.input_tokens,
            "completion_tokens": len(request.output_token_ids),
            "age_s": round(now - request.arrival_s, 3),
            "started": request.first_token_s is not None,
        }
        for request in in_flight
        if tenant is None or request.client == tenant
    ]
    return json_response({"object": "list", "data": rows})


@router.post("/requests/{request_id}/abort", summary="Abort a request by id")
async def abort_request(request_id: str, state: AdminState) -> Response:
    if request_id not in state.engine.streams:
        raise APIError(404, f"no request {request_id!r} in flight", param="request_id")
    state.engine.abort(request_id)
    return json_response({"id": request_id, "aborted": True})


@router.get("/requests/recent", summary="Recently finished requests and their timing")
async def recent_requests(
    state: AdminState,
    tenant: Annotated[str | None, Query(max_length=256)] = None,
    limit: Annotated[int, Query(ge=1, le=RECENT_REQUESTS)] = 100,
) -> Response:
    rows = [r for r in state.metrics.recent if tenant is None or r["tenant"] == tenant]
    return json_response({"object": "list", "data": rows[-limit:]})


@router.post("/reload", summary="Re-read the tenants file")
async def reload(state: AdminState) -> Response:
    error = await state.reload_tenants()
    if error is not None:
        raise APIError(400, f"tenants file not reloaded, the previous one stays: {error}")
    return json_response({"reloaded": True, "tenants": [t.name for t in state.tenants.tenants]})
