"""The three names ``cli/importing.py`` still imports from here; every other caller imports ``frames`` and
``client`` directly (the RPC's contract is this package's docstring, in ``rpc/__init__.py``). This module
goes when that import does."""

from __future__ import annotations

from .client import connect_rpc as connect_rpc
from .frames import MAX_MESSAGE_SIZE as MAX_MESSAGE_SIZE
from .frames import encode_frame as encode_frame

__all__ = ["MAX_MESSAGE_SIZE", "connect_rpc", "encode_frame"]
