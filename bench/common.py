"""The harness's old name: tests/api/test_bundle_memory.py (outside bench/) still imports api_server from here.
New code imports from `harness`."""

from harness import api_server

__all__ = ["api_server"]
