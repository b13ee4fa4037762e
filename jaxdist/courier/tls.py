"""Mutual TLS for courier: a server proves its host to every client, and every client proves its
host to the server, with certificates signed by the run's own CA (``python -m jaxdist.tools.certs``).
The token still decides who may call; TLS keeps the token, the parameters and the stops from
being read or changed between hosts, and a process that takes a node's address from answering.

A process finds its credentials in its environment: ``JAXDIST_TLS_DIR`` (what the certs command
wrote) and ``JAXDIST_TLS_NAME`` (this host's name there). The multihost launcher sets both from
``tls_dir=``, and node processes inherit them, so every server and client of the run uses TLS
without being told; ``Server(tls=...)`` and ``Client(tls=...)`` take a ``TLS`` explicitly.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping

import grpc

TLS_DIR_ENV = "JAXDIST_TLS_DIR"
TLS_NAME_ENV = "JAXDIST_TLS_NAME"
CA_FILE = "ca.pem"


@dataclasses.dataclass(frozen=True, repr=False)
class TLS:
    """PEM bytes: the CA every peer must be signed by, this host's certificate and its key."""

    ca: bytes
    cert: bytes
    key: bytes

    @classmethod
    def load(cls, directory: str, name: str) -> "TLS":
        """``<directory>/ca.pem``, ``<name>.pem`` and ``<name>.key``, as the certs command writes them."""
        files = [os.path.join(directory, file) for file in (CA_FILE, f"{name}.pem", f"{name}.key")]
        missing = [path for path in files if not os.path.isfile(path)]
        if missing:
            raise FileNotFoundError(f"TLS for host {name!r} needs {', '.join(missing)}: make them with "
                                    f"`python -m jaxdist.tools.certs {directory} --hosts {name},...` (every host of the run)")
        ca, cert, key = (open(path, "rb").read() for path in files)
        return cls(ca, cert, key)

    def server_credentials(self) -> grpc.ServerCredentials:
        return grpc.ssl_server_credentials([(self.key, self.cert)], root_certificates=self.ca,
                                           require_client_auth=True)

    def channel_credentials(self) -> grpc.ChannelCredentials:
        return grpc.ssl_channel_credentials(root_certificates=self.ca, private_key=self.key,
                                            certificate_chain=self.cert)

    def __repr__(self) -> str:  # never the key
        return f"TLS(ca={len(self.ca)} bytes, cert={len(self.cert)} bytes)"


def from_environment(environ: Mapping[str, str] = os.environ) -> TLS | None:
    """The credentials ``JAXDIST_TLS_DIR`` and ``JAXDIST_TLS_NAME`` name, or None without them."""
    directory = environ.get(TLS_DIR_ENV)
    if not directory:
        return None
    name = environ.get(TLS_NAME_ENV)
    if not name:
        raise ValueError(f"${TLS_DIR_ENV} is set but ${TLS_NAME_ENV} is not: set it to this host's name in {directory}")
    return TLS.load(directory, name)
