"""Where stores live: local paths and fsspec URLs (``s3://``, ``gs://``, ``az://``, ``memory://``).

Every URL emote opens goes through :func:`filesystem` (or :func:`storage_options` for Zarr): a
scheme without an installed fsspec backend, and an object store's errors, become one-line
:class:`~emote_core.errors.StorageError`\\ s naming the URL. Listings are never cached (other
processes add shards). Configuration is the backend's own (AWS and ``FSSPEC_*`` variables); for
S3 emote defaults to 3 attempts in the ``standard`` retry mode and a 3 s connect timeout.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from emote_core.errors import EmoteError, StorageError

S3_SCHEMES = ("s3", "s3a")
_LISTING_CACHES = (*S3_SCHEMES, "gs", "gcs", "az", "abfs", "abfss")
"""Backends that cache directory listings unless told not to."""
_S3_RETRIES = {"total_max_attempts": 3, "mode": "standard"}
_S3_CONNECT_TIMEOUT = 3.0


def is_url(location: str | os.PathLike[str]) -> bool:
    """Whether ``location`` is a URL (``scheme://...``) rather than a local path."""
    return "://" in os.fspath(location)


def scheme(url: str) -> str:
    """The scheme of a URL, lower-cased (``"s3"`` for ``s3://bucket/x.zarr``)."""
    return url.split("://", 1)[0].lower()


def check_backend(url: str) -> None:
    """Refuses a URL whose scheme fsspec does not know or whose backend is not installed.

    Raises:
        StorageError: Naming the package to install (``pip install gcsfs`` for ``gs://``), or,
            for a scheme fsspec does not know, the schemes that work.
    """
    import fsspec
    from fsspec.registry import known_implementations

    from emote_core import install_command

    protocol = scheme(url)
    try:
        fsspec.get_filesystem_class(protocol)
    except ImportError:
        package = str(known_implementations[protocol]["class"]).split(".", 1)[0]
        extra = f" (or {install_command('s3')})" if protocol in S3_SCHEMES else ""
        raise StorageError(
            f"'{url}' needs the {package} package for {protocol}:// URLs, which is not "
            f"installed: pip install {package}{extra}"
        ) from None
    except ValueError:
        raise StorageError(
            f"'{url}' has the unknown URL scheme '{protocol}://'; stores are local paths or "
            "fsspec URLs (s3://, gs://, az://, memory://, ...)"
        ) from None


def storage_options(url: str) -> dict[str, Any]:
    """The options emote opens ``url``'s file system with (fsspec's configuration aside).

    Raises:
        StorageError: As :func:`check_backend`.
    """
    check_backend(url)
    protocol = scheme(url)
    # Other processes add shards and commits: a listing cached by this one would hide them.
    options: dict[str, Any] = {"use_listings_cache": False} if protocol in _LISTING_CACHES else {}
    if protocol not in S3_SCHEMES:
        return options
    import fsspec.config

    configured = {key for proto in S3_SCHEMES for key in fsspec.config.conf.get(proto, {})}
    if "config_kwargs" in configured:
        return options
    config: dict[str, Any] = {"connect_timeout": _S3_CONNECT_TIMEOUT}
    if not ({"AWS_MAX_ATTEMPTS", "AWS_RETRY_MODE"} & set(os.environ)):
        config["retries"] = dict(_S3_RETRIES)
    return {**options, "config_kwargs": config}


def filesystem(url: str) -> tuple[Any, str]:
    """``(file system, path)`` of a URL, opened with :func:`storage_options`.

    Raises:
        StorageError: As :func:`check_backend`.
    """
    import fsspec

    with storage_errors(url):
        return fsspec.core.url_to_fs(url, **storage_options(url))


_CREDENTIALS = ("NoCredentialsError", "PartialCredentialsError", "CredentialRetrievalError")
_UNREACHABLE = ("EndpointConnectionError", "ConnectTimeoutError", "ConnectionClosedError")
_ACCESS = ("InvalidAccessKeyId", "SignatureDoesNotMatch", "AccessDenied", "ExpiredToken")


def describe_error(url: str, error: BaseException) -> StorageError | None:
    """The one-line error for a failure of the object store behind ``url`` (``None`` when
    ``error`` is not one: emote's own errors, a missing key that means "no store here")."""
    if isinstance(error, EmoteError):
        return None
    names = {cls.__name__ for cls in type(error).__mro__}
    text = str(error).splitlines()[0] if str(error) else type(error).__name__
    endpoint = os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get("AWS_ENDPOINT_URL")
    where = f" at {endpoint}" if endpoint and scheme(url) in S3_SCHEMES else ""
    if names & set(_CREDENTIALS):
        return StorageError(
            f"cannot reach '{url}': no credentials for the object store ({text}); set them as "
            "its backend reads them (for S3: AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, or "
            "AWS_PROFILE)"
        )
    if names & set(_UNREACHABLE) or "Could not connect" in text:
        return StorageError(
            f"cannot reach '{url}': the object store{where} does not answer ({text}); check "
            "the endpoint (AWS_ENDPOINT_URL for an S3-compatible server) and the network"
        )
    if any(code in text for code in _ACCESS) or isinstance(error, PermissionError):
        return StorageError(f"access to '{url}' refused by the object store{where} ({text})")
    if "bucket does not exist" in text or "NoSuchBucket" in text:
        return StorageError(
            f"the bucket of '{url}' does not exist{where}; create it first, or name another"
        )
    return None


@contextmanager
def storage_errors(url: str | os.PathLike[str]) -> Iterator[None]:
    """Turns object-store failures inside the block into one-line errors naming ``url``
    (local paths pass everything through)."""
    text = os.fspath(url)
    try:
        yield
    except Exception as error:
        found = describe_error(text, error) if is_url(text) else None
        if found is None:
            raise
        raise found from error


__all__ = [
    "S3_SCHEMES",
    "check_backend",
    "describe_error",
    "filesystem",
    "is_url",
    "scheme",
    "storage_errors",
    "storage_options",
]
