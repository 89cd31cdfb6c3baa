"""The parallel mode's communication layer: authenticated JSON over HTTP, the bulk-data codec and the storage path.

- ``auth``: the run's shared secret and the HMAC signature every request carries.
- ``http``: ``Server`` (Flask routes served by waitress, signature and body caps checked before any handler) and
  ``Client`` (signed requests with bounded, jittered retries under a deadline).
- ``codec`` and ``schema``: arrays and state_dicts as safetensors, parsed and checked before use; never pickle.
- ``storage``: content-addressed files under the run's storage path, written atomically and verified on read.
"""

import importlib
from typing import Any

# Imported on first use (PEP 562), not with the package: the coordinator reaches ``errors`` and ``storage`` through
# ``nervex.system.protocol`` and must not import the codec's torch with them.
_HOMES = {
    "RequestVerifier": "auth",
    "load_or_create_token": "auth",
    "sign_request": "auth",
    "decode_arrays": "codec",
    "decode_state_dict": "codec",
    "encode_arrays": "codec",
    "encode_state_dict": "codec",
    "ProtocolError": "errors",
    "Client": "http",
    "Server": "http",
    "ArraySpec": "schema",
    "Schema": "schema",
    "Storage": "storage",
}


def __getattr__(name: str) -> Any:
    if name not in _HOMES:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f".{_HOMES[name]}", __name__), name)


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
