"""The parallel mode's communication layer: authenticated JSON over HTTP, the bulk-data codec and the storage path.

- ``auth``: the run's shared secret and the HMAC signature every request carries.
- ``server``: ``Server`` (Flask routes served by waitress, signature, body caps and JSON bounds checked before any
  handler); ``connections``: its connection limits (per peer, in all, idle and request deadlines) and rate-limited
  refusal logs.
- ``client``: ``Client`` (signed requests with bounded, jittered retries under a deadline).
- ``codec``, ``safetensors_header`` and ``schema``: arrays and state_dicts as safetensors, parsed and checked before
  use; never pickle. The codec (it imports torch) is imported on first use of its names here.
- ``storage``: content-addressed files under the run's storage path, written atomically and verified on read.
"""

from typing import Any

from .auth import RequestVerifier, load_or_create_token, sign_request
from .client import Client
from .errors import ProtocolError
from .schema import ArraySpec, Schema
from .server import Server
from .storage import Storage

_CODEC_NAMES = ("decode_arrays", "decode_state_dict", "encode_arrays", "encode_state_dict")


def __getattr__(name: str) -> Any:
    """The codec's names, imported on first use: the codec imports torch, which the coordinator does without."""
    if name in _CODEC_NAMES:
        from . import codec

        return getattr(codec, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "ArraySpec",
    "Client",
    "ProtocolError",
    "RequestVerifier",
    "Schema",
    "Server",
    "Storage",
    "decode_arrays",
    "decode_state_dict",
    "encode_arrays",
    "encode_state_dict",
    "load_or_create_token",
    "sign_request",
]
