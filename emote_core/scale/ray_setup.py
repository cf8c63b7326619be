"""Getting Ray: importing it (an optional extra), reaching a cluster without hanging, starting a
local instance whose workers can import emote.

``ray.init(address=...)`` waits minutes for a cluster that is not there, printing Ray's own
warnings, so an address is checked first, each step within :data:`CONNECT_TIMEOUT_S`: a TCP
connection (nothing listens: one line saying how to start a cluster), then a gRPC handshake, which
a cluster's GCS and Ray's client server both answer (something else listens: one line saying it
is not Ray).
"""

from __future__ import annotations

import io
import logging
import os
import re
import socket
import sys
import threading
from typing import Any

from emote_core.errors import ConfigurationError, EmoteError

__all__ = [
    "CONNECT_TIMEOUT_S",
    "GCS_WAIT_S",
    "ClusterError",
    "RayOutput",
    "address_endpoint",
    "check_answers_grpc",
    "check_reachable",
    "connect",
    "require_ray",
]

log = logging.getLogger(__name__)

CONNECT_TIMEOUT_S = 3.0
"""Seconds to wait for a TCP connection to a Ray address before calling it unreachable."""
GCS_WAIT_S = 5
"""Seconds ``ray.init`` tries to reach a cluster's GCS (``RAY_gcs_server_port_wait_time_s``)."""
_GCS_WAIT_VARIABLE = "RAY_gcs_server_port_wait_time_s"
_GCS_PORT = 6379  # a cluster's address without a port: `ray start --head`'s default
_CLIENT_PORT = 10001  # a ray:// address without a port: the Ray client server's default


class ClusterError(EmoteError):
    """Ray is missing, a cluster cannot be reached, or its workers were lost."""


_ANSI_ESCAPE = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")


class RayOutput(io.TextIOBase):
    """A text stream that turns every line written to it into one log record of the
    ``ray.driver_output`` logger (WARNING), terminal colours removed.

    Ray's driver prints what its raylets report (a worker that died, with why) on ``sys.stdout``,
    which belongs to the command (a ``--json`` document): while Ray runs, stdout is this stream,
    so those reports reach stderr as ``warning: ...`` lines where the process logs.
    """

    def __init__(self) -> None:
        super().__init__()
        self._partial = ""
        self._lock = threading.Lock()  # Ray prints from its listener thread
        self._log = logging.getLogger("ray.driver_output")

    def writable(self) -> bool:
        return True

    def write(self, text: str) -> int:
        with self._lock:
            *lines, self._partial = (self._partial + text).split("\n")
        for line in lines:
            self._emit(line)
        return len(text)

    def flush(self) -> None:
        with self._lock:
            line, self._partial = self._partial, ""
        self._emit(line)

    def _emit(self, line: str) -> None:
        text = _ANSI_ESCAPE.sub("", line).strip()
        if text:
            self._log.warning("%s", text)


def require_ray() -> Any:
    """The ``ray`` module.

    Raises:
        ClusterError: If Ray is not installed, naming the extra that installs it.
    """
    try:
        import ray
    except ImportError:
        from emote_core import install_command

        raise ClusterError(
            "collecting on several workers needs Ray, which is not installed: "
            + install_command("ray")
        ) from None
    return ray


def address_endpoint(address: str) -> tuple[str, int] | None:
    """The host and port that ``address`` connects to; ``None`` for ``auto`` (found by Ray).

    Raises:
        ConfigurationError: If the port is not a number.
    """
    if address == "auto":
        return None
    client = address.startswith("ray://")
    rest = address.removeprefix("ray://").rstrip("/")
    host, _, port = rest.rpartition(":") if ":" in rest else (rest, "", "")
    if not port:
        return rest, _CLIENT_PORT if client else _GCS_PORT
    if not port.isdigit():
        raise ConfigurationError(
            f"Ray address '{address}' has no valid port; give HOST:PORT, ray://HOST:PORT or auto"
        )
    return host.strip("[]"), int(port)


def check_reachable(address: str, timeout: float = CONNECT_TIMEOUT_S) -> None:
    """Refuses, within ``timeout`` seconds, a Ray address nothing listens on.

    Raises:
        ClusterError: If no TCP connection to the address opens in time.
    """
    endpoint = address_endpoint(address)
    if endpoint is None:
        return
    try:
        with socket.create_connection(endpoint, timeout=timeout):
            pass
    except OSError as error:
        reason = "timed out" if isinstance(error, TimeoutError) else error.strerror or str(error)
        raise ClusterError(
            f"cannot reach Ray at '{address}' ({reason}); start a cluster there with "
            "`ray start --head`, or leave out `address` to run a local Ray"
        ) from None


def check_answers_grpc(address: str, timeout: float = CONNECT_TIMEOUT_S) -> None:
    """Refuses, within ``timeout`` seconds, a Ray address whose listener does not complete a
    gRPC (HTTP/2) handshake, as a Ray GCS or client server does (not checked under Ray's
    ``RAY_USE_TLS``).

    Raises:
        ClusterError: If no handshake completes in time.
    """
    endpoint = address_endpoint(address)
    if endpoint is None or os.environ.get("RAY_USE_TLS", "0").lower() in ("1", "true"):
        return  # a TLS cluster answers a handshake with certificates only Ray is given
    try:
        import grpc  # Ray's own dependency
    except ImportError:  # pragma: no cover - Ray installs it
        return
    host, port = endpoint
    channel = grpc.insecure_channel(f"[{host}]:{port}" if ":" in host else f"{host}:{port}")
    try:
        grpc.channel_ready_future(channel).result(timeout=timeout)
    except grpc.FutureTimeoutError:
        raise ClusterError(
            f"'{address}' accepts connections but does not answer as Ray does (no gRPC handshake "
            f"within {timeout:g} s); give the address `ray start --head` printed, or leave out "
            "`address` to run a local Ray"
        ) from None
    finally:
        channel.close()


def connect(address: str | None, *, num_cpus: int) -> bool:
    """Connects to the cluster at ``address``, or starts a local Ray when it is ``None``.

    A Ray already initialised in this process is used as it is. A local instance gets
    ``num_cpus`` CPUs and passes this process's ``sys.path`` to its workers, so they import
    the same emote. Workers' output stays on their machines, and the ``ray`` logger is left
    as the process configured it.

    Args:
        address: ``None``, ``auto``, ``HOST:PORT`` or ``ray://HOST:PORT``.
        num_cpus: CPUs of a local instance.

    Returns:
        Whether this call started the connection (the caller then shuts it down).

    Raises:
        ClusterError: If Ray is missing, or nothing at the address answers as Ray does.
    """
    ray = require_ray()
    if ray.is_initialized():
        return False
    if address is None:
        path = os.pathsep.join(entry for entry in sys.path if entry)
        ray.init(
            num_cpus=num_cpus,
            include_dashboard=False,
            log_to_driver=False,  # stdout may be a --json document; the driver reports deaths
            configure_logging=False,  # the "ray" logger is the process's to set up
            runtime_env={"env_vars": {"PYTHONPATH": path}},
        )
        return True
    check_reachable(address)
    check_answers_grpc(address)
    # Something that accepts connections but is no Ray (a proxy, another service) would keep
    # ray.init retrying for about 20 s; Ray's own setting bounds it, unless the user set it.
    os.environ.setdefault(_GCS_WAIT_VARIABLE, str(GCS_WAIT_S))
    try:
        ray.init(address=address, log_to_driver=False, configure_logging=False)
    except (ConnectionError, RuntimeError, TimeoutError) as error:
        first = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        raise ClusterError(
            f"cannot connect to Ray at '{address}': {first}; start a cluster with "
            "`ray start --head`, or leave out `address` to run a local Ray"
        ) from None
    return True
