"""Error conversion and redirect following, without a broker."""

from __future__ import annotations

import asyncio

import grpc
import pytest
from google.protobuf.any_pb2 import Any

import casq
import casq.aio
from casq.errors import LEADER_ADDRESS_KEY, error_from_rpc, error_from_status
from casq.v1 import errors_pb2


class FakeRpcError(grpc.RpcError):
    def __init__(self, code: grpc.StatusCode, details: str, trailers: tuple[tuple[str, str | bytes], ...] = ()) -> None:
        self._code, self._details, self._trailers = code, details, trailers

    def code(self) -> grpc.StatusCode:
        return self._code

    def details(self) -> str:
        return self._details

    def trailing_metadata(self) -> tuple[tuple[str, str | bytes], ...]:  # type: ignore[override]
        return self._trailers


def redirect_status(address: str) -> errors_pb2.RpcStatus:
    detail = Any()
    detail.Pack(errors_pb2.LeaderRedirect(leader_address=address, leader_id="b2", epoch=7, queue="q", shard=1))
    return errors_pb2.RpcStatus(code=14, message="led elsewhere", details=[detail])


def test_redirect_from_status_details() -> None:
    trailers = (("grpc-status-details-bin", redirect_status("10.0.0.2:50051").SerializeToString()),)
    error = error_from_rpc(FakeRpcError(grpc.StatusCode.UNAVAILABLE, "led elsewhere", trailers))
    assert isinstance(error, casq.RedirectError)
    assert (error.leader_address, error.leader_id, error.epoch, error.shard) == ("10.0.0.2:50051", "b2", 7, 1)
    assert isinstance(error_from_status(redirect_status("x:1")), casq.RedirectError)


def test_redirect_from_bare_trailer_and_plain_codes() -> None:
    error = error_from_rpc(FakeRpcError(grpc.StatusCode.UNAVAILABLE, "x", ((LEADER_ADDRESS_KEY, "h:1"),)))
    assert isinstance(error, casq.RedirectError) and error.leader_address == "h:1"
    assert isinstance(error_from_rpc(FakeRpcError(grpc.StatusCode.UNAVAILABLE, "down")), casq.UnavailableError)
    assert isinstance(error_from_rpc(FakeRpcError(grpc.StatusCode.NOT_FOUND, "no")), casq.NotFoundError)
    other = error_from_rpc(FakeRpcError(grpc.StatusCode.DATA_LOSS, "bad"))
    assert type(other) is casq.CasqError and other.code == grpc.StatusCode.DATA_LOSS


def test_call_follows_redirects_and_fails_over() -> None:
    client = casq.Client(brokers=["a:1", "b:1"], backoff_initial=0.001, backoff_max=0.002)
    trailers = (("grpc-status-details-bin", redirect_status("leader:1").SerializeToString()),)
    seen: list[str] = []

    def attempt(address: str) -> str:
        seen.append(address)
        if address == "a:1":
            raise FakeRpcError(grpc.StatusCode.UNAVAILABLE, "redirect", trailers)
        if address == "leader:1":
            raise FakeRpcError(grpc.StatusCode.UNAVAILABLE, "down")
        return address

    assert client.call(attempt) == "b:1"
    assert seen == ["a:1", "leader:1", "b:1"]

    limited = casq.Client(brokers=["a:1"], max_attempts=2, backoff_initial=0.001, backoff_max=0.002)
    with pytest.raises(casq.UnavailableError):
        limited.call(lambda address: (_ for _ in ()).throw(FakeRpcError(grpc.StatusCode.UNAVAILABLE, "down")))


def test_call_moves_on_from_a_hung_broker_and_does_not_go_back() -> None:
    """DEADLINE_EXCEEDED (an attempt ran out of its own timeout) is an outage: the call fails over,
    and a redirect back to the broker that timed out is not followed (its lease has to run out first)."""
    client = casq.Client(brokers=["hung:1", "b:1"], backoff_initial=0.001, backoff_max=0.002)
    trailers = (("grpc-status-details-bin", redirect_status("hung:1").SerializeToString()),)
    seen: list[str] = []

    def attempt(address: str) -> str:
        seen.append(address)
        if address == "hung:1":
            raise FakeRpcError(grpc.StatusCode.DEADLINE_EXCEEDED, "Deadline Exceeded")
        if len(seen) < 4:
            raise FakeRpcError(grpc.StatusCode.UNAVAILABLE, "led by hung:1", trailers)
        return address

    assert client.call(attempt) == "b:1"
    assert seen == ["hung:1", "b:1", "b:1", "b:1"]
    assert client.current_broker == "b:1"

    # Out of budget, the last failure is what the caller sees.
    with pytest.raises(casq.CasqError) as raised:
        casq.Client(brokers=["hung:1"], max_attempts=2, backoff_initial=0.001).call(
            lambda address: (_ for _ in ()).throw(FakeRpcError(grpc.StatusCode.DEADLINE_EXCEEDED, "late"))
        )
    assert raised.value.code == grpc.StatusCode.DEADLINE_EXCEEDED


def test_aio_call_moves_on_from_a_hung_broker() -> None:
    seen: list[str] = []

    async def attempt(address: str) -> str:
        seen.append(address)
        if address == "hung:1":
            raise FakeRpcError(grpc.StatusCode.DEADLINE_EXCEEDED, "Deadline Exceeded")
        return address

    async def main() -> str:
        async with casq.aio.Client(brokers=["hung:1", "b:1"], backoff_initial=0.001, backoff_max=0.002) as client:
            return await client.call(attempt)

    assert asyncio.run(main()) == "b:1"
    assert seen == ["hung:1", "b:1"]
