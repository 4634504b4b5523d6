"""EARL: entity-agnostic knowledge-graph embeddings (AAAI 2023) with RotatE scoring, as a library."""

from earl_service.version import __version__

__all__ = ["Bundle", "__version__", "load_bundle"]


def __getattr__(name: str):
    # Lazy, so that `earl_service.device.reader` (numpy only) never imports torch through this package.
    if name in ("load_bundle", "Bundle"):
        from earl_service.bundle import model_io as bundle

        return getattr(bundle, name)
    raise AttributeError(f"module 'earl_service' has no attribute {name!r}")
