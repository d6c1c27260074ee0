"""Typed errors of the casq SDK, converted once from gRPC errors."""

from __future__ import annotations

from collections.abc import Iterable

import grpc

from casq.v1 import errors_pb2

#: The trailer in which a broker names the leader's address when it redirects a
#: call (see proto/casq/v1/errors.proto): the one spelling of it in Python.
LEADER_ADDRESS_KEY = "casq-leader-address"
#: The trailer of gRPC's rich status (a google.rpc.Status with the details).
STATUS_DETAILS_KEY = "grpc-status-details-bin"

MetadataItems = Iterable[tuple[str, str | bytes]]


class CasqError(Exception):
    """A failed casq call: the gRPC ``code`` and the server's message."""

    def __init__(self, code: grpc.StatusCode, message: str) -> None:
        super().__init__(f"{code.name}: {message}")
        self.code = code
        self.message = message


class NotFoundError(CasqError):
    """The queue or subscription does not exist."""


class AlreadyExistsError(CasqError):
    """The thing to create exists already, e.g. ``create_queue`` of an existing queue
    (pass ``if_not_exists=True`` to get the existing queue instead)."""


class InvalidArgumentError(CasqError):
    """A malformed request; nothing was applied."""


class UnavailableError(CasqError):
    """No broker answered (an outage), after failover gave up."""


class RedirectError(CasqError):
    """Another broker leads the shard (seen only when the redirect limit ran out)."""

    def __init__(self, message: str, redirect: errors_pb2.LeaderRedirect) -> None:
        super().__init__(grpc.StatusCode.UNAVAILABLE, message)
        self.leader_address = redirect.leader_address
        self.leader_id = redirect.leader_id
        self.epoch = redirect.epoch
        self.queue = redirect.queue
        self.shard = redirect.shard


class BatchRedirectError(CasqError):
    """An Enqueue batch spans shards led by several brokers; nothing of it was stored.

    The producers split such a batch by ``routes`` on their own, so a caller
    sees this only when the batch still spanned several leaders after the
    split limit (leadership kept moving). ``routes`` lists, per broker
    address, the 0-based indexes of the request's messages that broker can
    store. Not an :class:`UnavailableError` although the code is UNAVAILABLE:
    resending the same batch anywhere would fail the same way, so the retry
    loop must hand it to the producer at once instead of failing over.
    """

    def __init__(self, message: str, redirect: errors_pb2.BatchRedirect) -> None:
        super().__init__(grpc.StatusCode.UNAVAILABLE, message)
        self.queue = redirect.queue
        self.routes: list[tuple[str, list[int]]] = [
            (route.leader_address, list(route.message_indexes)) for route in redirect.routes
        ]
        self.redirect = redirect


class LeaseLostError(CasqError):
    """An ack or nack the broker did not apply: the job's lease was gone (delivered again or dead-lettered).

    Reported to the worker's ``on_error`` (and logged) with the job; the
    outcome of that delivery's handler was thrown away.
    """

    def __init__(self, message: str, receipt: str) -> None:
        super().__init__(grpc.StatusCode.ABORTED, message)
        self.receipt = receipt


class StreamTimeoutError(UnavailableError):
    """A Work stream whose broker did not answer in time (hung): the worker ends it and goes elsewhere."""


class DeadLetter(Exception):
    """Raise from a worker handler to dead-letter the job at once (no retry)."""

    def __init__(self, reason: str = "") -> None:
        super().__init__(reason)
        self.reason = reason


_BY_CODE: dict[grpc.StatusCode, type[CasqError]] = {
    grpc.StatusCode.NOT_FOUND: NotFoundError,
    grpc.StatusCode.ALREADY_EXISTS: AlreadyExistsError,
    grpc.StatusCode.INVALID_ARGUMENT: InvalidArgumentError,
    grpc.StatusCode.UNAVAILABLE: UnavailableError,
}

_CODES_BY_NUMBER: dict[int, grpc.StatusCode] = {c.value[0]: c for c in grpc.StatusCode}


def redirect_from_status(status: errors_pb2.RpcStatus) -> errors_pb2.LeaderRedirect | None:
    """The LeaderRedirect detail of a status (google.rpc.Status has the same wire shape)."""
    for detail in status.details:
        if detail.Is(errors_pb2.LeaderRedirect.DESCRIPTOR):
            redirect = errors_pb2.LeaderRedirect()
            detail.Unpack(redirect)
            return redirect
    return None


def batch_redirect_from_status(status: errors_pb2.RpcStatus) -> errors_pb2.BatchRedirect | None:
    """The BatchRedirect detail of a status, if it has one."""
    for detail in status.details:
        if detail.Is(errors_pb2.BatchRedirect.DESCRIPTOR):
            redirect = errors_pb2.BatchRedirect()
            detail.Unpack(redirect)
            return redirect
    return None


def status_from_metadata(metadata: MetadataItems | None) -> errors_pb2.RpcStatus | None:
    """The status details trailer (``grpc-status-details-bin``), decoded."""
    for key, value in metadata or ():
        if key == STATUS_DETAILS_KEY and isinstance(value, bytes):
            status = errors_pb2.RpcStatus()
            status.ParseFromString(value)
            return status
    return None


def redirect_from_metadata(metadata: MetadataItems | None) -> errors_pb2.LeaderRedirect | None:
    """A redirect from trailing metadata: the status detail, else the bare trailer."""
    status = status_from_metadata(metadata)
    found = redirect_from_status(status) if status is not None else None
    if found is not None and found.leader_address:
        return found
    for key, value in metadata or ():
        if key == LEADER_ADDRESS_KEY:
            address = value.decode() if isinstance(value, bytes) else value
            if address:
                return errors_pb2.LeaderRedirect(leader_address=address)
    return None


def make_error(
    code: grpc.StatusCode,
    message: str,
    redirect: errors_pb2.LeaderRedirect | None = None,
    batch_redirect: errors_pb2.BatchRedirect | None = None,
) -> CasqError:
    if code == grpc.StatusCode.UNAVAILABLE and batch_redirect is not None:
        return BatchRedirectError(message, batch_redirect)
    if code == grpc.StatusCode.UNAVAILABLE and redirect is not None:
        return RedirectError(message, redirect)
    return _BY_CODE.get(code, CasqError)(code, message)


def error_from_rpc(error: grpc.RpcError) -> CasqError:
    """Convert a grpcio error (sync or aio) into a CasqError."""
    code_fn = getattr(error, "code", None)
    details_fn = getattr(error, "details", None)
    trailers_fn = getattr(error, "trailing_metadata", None)
    code = code_fn() if callable(code_fn) else grpc.StatusCode.UNKNOWN
    message = (details_fn() if callable(details_fn) else None) or str(error)
    trailers = trailers_fn() if callable(trailers_fn) else None
    code = code if isinstance(code, grpc.StatusCode) else grpc.StatusCode.UNKNOWN
    if code != grpc.StatusCode.UNAVAILABLE:
        return make_error(code, message)
    status = status_from_metadata(trailers)
    batch_redirect = batch_redirect_from_status(status) if status is not None else None
    return make_error(code, message, redirect_from_metadata(trailers), batch_redirect)


def error_from_status(status: errors_pb2.RpcStatus) -> CasqError:
    """Convert a Work stream ``request_failed`` status into a CasqError."""
    code = _CODES_BY_NUMBER.get(status.code, grpc.StatusCode.UNKNOWN)
    return make_error(code, status.message, redirect_from_status(status), batch_redirect_from_status(status))
