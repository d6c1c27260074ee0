"""What an ack or nack did, per receipt: the outcomes a worker reports instead of ignoring.

Each receipt the worker sent must have a result saying it did what was asked
(acked, already acked; retry scheduled, dead-lettered). A receipt whose
result says LEASE_LOST is a :class:`LeaseLostError`; one the answer has no
result for, or an outcome the SDK does not know, is an UNKNOWN
:class:`CasqError` (it may or may not have been applied), as in the
TypeScript and Go SDKs: never a success.
"""

from __future__ import annotations

from collections.abc import Iterable

import grpc

from casq.errors import CasqError, LeaseLostError
from casq.v1 import message_pb2

_ACKED = frozenset({message_pb2.ACK_OUTCOME_ACKED, message_pb2.ACK_OUTCOME_ALREADY_ACKED})
_NACKED = frozenset({message_pb2.NACK_OUTCOME_RETRY_SCHEDULED, message_pb2.NACK_OUTCOME_DEAD_LETTERED})


def ack_failures(receipts: Iterable[str], results: Iterable[message_pb2.AckResult]) -> list[CasqError]:
    """The acks of ``receipts`` that did not do what was asked.

    ALREADY_ACKED is a success: an ack retried after a lost answer lands there.
    """
    return _failures(
        "ack",
        receipts,
        {r.receipt: r.outcome for r in results},
        _ACKED,
        message_pb2.ACK_OUTCOME_LEASE_LOST,
        "the message was delivered again or dead-lettered), so it will be processed again or is in the dead letters",
    )


def nack_failures(receipts: Iterable[str], results: Iterable[message_pb2.NackResult]) -> list[CasqError]:
    """The nacks of ``receipts`` that did not do what was asked (LEASE_LOST: settled or redelivered meanwhile)."""
    return _failures(
        "nack",
        receipts,
        {r.receipt: r.outcome for r in results},
        _NACKED,
        message_pb2.NACK_OUTCOME_LEASE_LOST,
        "the message was delivered again, acked or dead-lettered by someone else)",
    )


def _failures(
    op: str,
    receipts: Iterable[str],
    outcomes: dict[str, int],
    succeeded: frozenset[int],
    lease_lost: int,
    lost_why: str,
) -> list[CasqError]:
    """Per receipt sent: nothing when its outcome is a success, else a LeaseLostError or an UNKNOWN error."""
    failures: list[CasqError] = []
    for receipt in receipts:
        outcome = outcomes.get(receipt)
        if outcome in succeeded:
            continue
        if outcome == lease_lost:
            failures.append(LeaseLostError(f"{op} of {receipt} not applied: the lease was lost ({lost_why}", receipt))
        else:
            failures.append(_unknown(op, receipt, outcome))
    return failures


def _unknown(op: str, receipt: str, outcome: int | None) -> CasqError:
    """A receipt the broker's answer gave no known outcome for: whether it was applied is unknown."""
    got = "no result" if outcome is None else f"outcome {outcome}"
    return CasqError(
        grpc.StatusCode.UNKNOWN,
        f"casq: {op} of receipt {receipt} got no known outcome ({got}): it may not have been applied",
    )
