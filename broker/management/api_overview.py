"""/api/overview, /api/whoami and the node-level endpoints."""
from __future__ import annotations

from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from .auth import require


async def whoami(request: Request) -> JSONResponse:
    user = await require(request)
    return JSONResponse({"name": user.name, "tags": sorted(user.tags)})


def routes() -> list:
    return [Route("/api/whoami", whoami)]
