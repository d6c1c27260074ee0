"""What an ack or nack did, per receipt: the outcomes a worker reports instead of ignoring."""

from __future__ import annotations

from collections.abc import Iterable

from casq.errors import LeaseLostError
from casq.v1 import message_pb2


def ack_failures(results: Iterable[message_pb2.AckResult]) -> list[LeaseLostError]:
    """The acks that did nothing: LEASE_LOST (ALREADY_ACKED is an ack retried after a lost answer: success)."""
    return [
        LeaseLostError(
            f"ack of {r.receipt} not applied: the lease was lost (the message was delivered again "
            "or dead-lettered), so it will be processed again or is in the dead letters",
            r.receipt,
        )
        for r in results
        if r.outcome == message_pb2.ACK_OUTCOME_LEASE_LOST
    ]


def nack_failures(results: Iterable[message_pb2.NackResult]) -> list[LeaseLostError]:
    """The nacks that did nothing: LEASE_LOST (the delivery was settled or redelivered meanwhile)."""
    return [
        LeaseLostError(
            f"nack of {r.receipt} not applied: the lease was lost (the message was delivered again, "
            "acked or dead-lettered by someone else)",
            r.receipt,
        )
        for r in results
        if r.outcome == message_pb2.NACK_OUTCOME_LEASE_LOST
    ]
