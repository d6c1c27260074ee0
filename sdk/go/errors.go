package casq

import (
	"context"
	"errors"
	"fmt"
	"time"

	casqv1 "github.com/casq/casq/sdk/go/gen/casq/v1"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
)

// LeaderAddressTrailer is the trailer in which a broker names the leader of
// a shard it does not lead.
const LeaderAddressTrailer = "casq-leader-address"

// Error is every failure the SDK returns from a call: the gRPC code and the
// server's message, plus the redirect when a broker named another leader.
type Error struct {
	// Code is the gRPC status code.
	Code codes.Code
	// Message is the server's (or the transport's) message.
	Message string
	// LeaderAddress is set when the broker redirected to another leader.
	LeaderAddress string
	// Redirect is the casq.v1.LeaderRedirect detail, if the status had one.
	Redirect *casqv1.LeaderRedirect
	// BatchRedirect is the casq.v1.BatchRedirect detail, if the status had
	// one: an Enqueue batch spanned shards of several leaders and nothing
	// was stored. EnqueueBatch splits such a batch itself; callers see it
	// only inside a *BatchSplitError.
	BatchRedirect *casqv1.BatchRedirect
}

func (e *Error) Error() string {
	if e.BatchRedirect != nil {
		return fmt.Sprintf("casq: %s: %s (batch spans %d leaders)", e.Code, e.Message, len(e.BatchRedirect.GetRoutes()))
	}
	if e.LeaderAddress != "" {
		return fmt.Sprintf("casq: %s: %s (leader %s)", e.Code, e.Message, e.LeaderAddress)
	}
	return fmt.Sprintf("casq: %s: %s", e.Code, e.Message)
}

// GRPCStatus lets status.FromError and status.Code see the code.
func (e *Error) GRPCStatus() *status.Status { return status.New(e.Code, e.Message) }

// ErrAlreadyExists matches, with errors.Is, an ALREADY_EXISTS error: the
// thing to create is there already (e.g. CreateQueue of an existing queue;
// pass IfNotExists() to get the existing queue instead).
var ErrAlreadyExists = errors.New("casq: already exists")

// Is makes errors.Is(err, context.Canceled / context.DeadlineExceeded /
// ErrAlreadyExists) work.
func (e *Error) Is(target error) bool {
	return (target == context.Canceled && e.Code == codes.Canceled) ||
		(target == context.DeadlineExceeded && e.Code == codes.DeadlineExceeded) ||
		(target == ErrAlreadyExists && e.Code == codes.AlreadyExists)
}

// Code returns the gRPC code of err: codes.OK for nil, codes.Unknown for
// errors that carry none.
func Code(err error) codes.Code {
	if err == nil {
		return codes.OK
	}
	var e *Error
	if errors.As(err, &e) {
		return e.Code
	}
	return status.Code(err)
}

// IsNotFound reports whether err is NOT_FOUND (a missing queue or
// subscription).
func IsNotFound(err error) bool { return Code(err) == codes.NotFound }

// IsAlreadyExists reports whether err is ALREADY_EXISTS (see
// ErrAlreadyExists).
func IsAlreadyExists(err error) bool { return Code(err) == codes.AlreadyExists }

// IsRedirect reports whether err is a redirect to another leader (only seen
// when the attempts ran out while following redirects).
func IsRedirect(err error) bool {
	var e *Error
	return errors.As(err, &e) && e.LeaderAddress != ""
}

// toError converts a gRPC (or context) error once; trailer may be nil.
func toError(err error, trailer metadata.MD) *Error {
	var e *Error
	if errors.As(err, &e) {
		return e
	}
	st, ok := status.FromError(err)
	if !ok {
		st = status.FromContextError(err)
	}
	e = &Error{Code: st.Code(), Message: st.Message()}
	for _, d := range st.Details() {
		switch r := d.(type) {
		case *casqv1.LeaderRedirect:
			e.Redirect = r
			e.LeaderAddress = r.GetLeaderAddress()
		case *casqv1.BatchRedirect:
			e.BatchRedirect = r
		}
	}
	if v := trailer.Get(LeaderAddressTrailer); len(v) > 0 && v[0] != "" && e.LeaderAddress == "" {
		e.LeaderAddress = v[0]
	}
	if e.Code != codes.Unavailable {
		// Redirects (both kinds) are UNAVAILABLE by the protocol's convention.
		e.LeaderAddress = ""
		e.BatchRedirect = nil
	}
	return e.settle()
}

// settle drops the leader address when there is a BatchRedirect: it names
// several leaders, so there is no single one to follow.
func (e *Error) settle() *Error {
	if e.BatchRedirect != nil {
		e.LeaderAddress = ""
	}
	return e
}

// statusError converts a casq.v1.RpcStatus (Work request_failed).
func statusError(s *casqv1.RpcStatus) *Error {
	e := &Error{Code: codes.Code(s.GetCode()), Message: s.GetMessage()}
	for _, a := range s.GetDetails() {
		r := &casqv1.LeaderRedirect{}
		if a.MessageIs(r) && a.UnmarshalTo(r) == nil {
			e.Redirect = r
			e.LeaderAddress = r.GetLeaderAddress()
		}
		b := &casqv1.BatchRedirect{}
		if a.MessageIs(b) && a.UnmarshalTo(b) == nil {
			e.BatchRedirect = b
		}
	}
	return e.settle()
}

// BatchSplitError is returned by EnqueueBatch when a batch spanning several
// shard leaders could not be stored as a whole: a part failed, or the parts
// were still answered with BatchRedirect after the split depth limit (the
// leadership kept moving). Parts sent to other brokers may have been stored;
// retrying the batch with the same dedup ids stores each message once.
// errors.As to *Error (and Code) see the failure of the part.
type BatchSplitError struct {
	// Queue is the queue of the batch.
	Queue string
	// Depth is how many times the batch (or its part) had been split.
	Depth int
	// TooDeep is true when the split depth limit was reached.
	TooDeep bool
	// Indexes are the indexes, in the caller's batch, of the part that
	// failed.
	Indexes []int
	// Err is the failure of that part.
	Err *Error
}

func (e *BatchSplitError) Error() string {
	if e.TooDeep {
		return fmt.Sprintf("casq: batch for queue %s still spans several shard leaders after %d splits (leadership is moving; other parts may have been stored, retry with the same dedup ids): %v", e.Queue, e.Depth, e.Err)
	}
	return fmt.Sprintf("casq: part of a batch for queue %s split across shard leaders failed (%d messages; other parts may have been stored, retry with the same dedup ids): %v", e.Queue, len(e.Indexes), e.Err)
}

// Unwrap exposes the part's *Error to errors.As and Code.
func (e *BatchSplitError) Unwrap() error { return e.Err }

// StreamTimeoutError is reported to a worker's error handler (and logged)
// when a broker left a request on a Work stream (an ack, nack or heartbeat)
// unanswered for the client's Options.Timeout. The broker is taken for hung:
// a stopped process keeps its connections open, so the stream would not
// break before TCP gave up, while the leases of its jobs ran out. The worker
// ends the stream, sends what was unanswered by unary calls (which move on
// to the next broker) and opens the stream again elsewhere. Its code is
// UNAVAILABLE.
type StreamTimeoutError struct {
	// Broker is the address of the broker that did not answer.
	Broker string
	// Timeout is how long the oldest request waited.
	Timeout time.Duration
}

func (e *StreamTimeoutError) Error() string {
	return fmt.Sprintf("casq: broker %s left a Work stream request unanswered for %s (hung?): stream ended, going elsewhere", e.Broker, e.Timeout)
}

// GRPCStatus gives the error the code UNAVAILABLE for Code and status.Code.
func (e *StreamTimeoutError) GRPCStatus() *status.Status {
	return status.New(codes.Unavailable, e.Error())
}

// LeaseLostError is reported to a worker's error handler (and logged), with
// the job, when the worker learns that it no longer holds the job's lease.
// Op says how: "ack" or "nack" (answered LEASE_LOST: the message was
// delivered again or dead-lettered meanwhile, and the settle changed
// nothing; the job's outcome counts only through that later delivery), or
// "heartbeat" (a heartbeat answered LOST or NOT_FOUND, or the broker's
// leases_lost event: the handler's context is cancelled). Its code is
// ABORTED.
type LeaseLostError struct {
	// Op is "ack", "nack" or "heartbeat".
	Op string
	// JobID, Queue, Attempt and Receipt name the delivery.
	JobID   string
	Queue   string
	Attempt uint32
	Receipt string
	// Reason is what the worker was told.
	Reason string
}

func (e *LeaseLostError) Error() string {
	if e.Op == "heartbeat" {
		return "casq: lease lost: " + e.Reason
	}
	if e.JobID == "" {
		return fmt.Sprintf("casq: lease lost: %s of receipt %s (queue %s) changed nothing: %s", e.Op, e.Receipt, e.Queue, e.Reason)
	}
	return fmt.Sprintf("casq: lease lost: %s of job %s (queue %s, attempt %d) changed nothing: %s", e.Op, e.JobID, e.Queue, e.Attempt, e.Reason)
}

// GRPCStatus gives the error the code ABORTED for Code and status.Code.
func (e *LeaseLostError) GRPCStatus() *status.Status { return status.New(codes.Aborted, e.Error()) }

// ErrDeadLetter, returned (or wrapped) by a handler, dead-letters the job at
// once instead of retrying it.
var ErrDeadLetter = errors.New("casq: dead letter")

type deadLetterError struct{ err error }

func (d *deadLetterError) Error() string {
	if d.err == nil {
		return ErrDeadLetter.Error()
	}
	return "casq: dead letter: " + d.err.Error()
}
func (d *deadLetterError) Unwrap() []error { return []error{ErrDeadLetter, d.err} }

// DeadLetter wraps err so that a handler returning it dead-letters the job
// with err's message as the reason.
func DeadLetter(err error) error { return &deadLetterError{err: err} }

// reason is the text kept with a nack.
func reason(err error) string {
	var d *deadLetterError
	if errors.As(err, &d) && d.err != nil {
		return d.err.Error()
	}
	return err.Error()
}
