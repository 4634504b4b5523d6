"""HTTP client for the EARL service (httpx only: no torch, no earl_service)."""

from .client import Client, JobFailed, ServiceError

__all__ = ["Client", "JobFailed", "ServiceError"]
