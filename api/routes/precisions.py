"""GET /precisions: the registered precisions, what a job's `precision` and `precisions` take (the console's list)."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter

from earl_service.bundle.precision import catalogue

from ..schemas import PrecisionOut

router = APIRouter(tags=["precisions"])


@router.get("/precisions", response_model=list[PrecisionOut])
def list_precisions() -> list[dict[str, Any]]:
    """Every precision a bundle can be exported at, in registration order (bundle/precision.py)."""
    return catalogue()
