"""The parallel mode's communication layer: authenticated JSON over HTTP, the bulk-data codec and the storage path.

- ``auth``: the run's shared secret and the HMAC signature every request carries.
- ``server``: ``Server`` (Flask routes served by waitress, signature and body caps checked before any handler).
- ``client``: ``Client`` (signed requests with bounded, jittered retries under a deadline).
- ``codec``, ``safetensors_header`` and ``schema``: arrays and state_dicts as safetensors, parsed and checked before
  use; never pickle.
- ``storage``: content-addressed files under the run's storage path, written atomically and verified on read.
"""

from .auth import RequestVerifier, load_or_create_token, sign_request
from .client import Client
from .codec import decode_arrays, decode_state_dict, encode_arrays, encode_state_dict
from .errors import ProtocolError
from .schema import ArraySpec, Schema
from .server import Server
from .storage import Storage

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
