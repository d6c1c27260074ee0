package casq_test

// These tests prove that the generated Go code of the casq.v1 API works: the
// messages survive binary and JSON round trips (oneofs and optional fields
// included), the descriptors describe both services (Work is a bidirectional
// stream), the redirect detail decodes from a real gRPC status, and the gRPC
// stubs carry unary calls and the Work stream over loopback TCP.

import (
	"context"
	"errors"
	"io"
	"net"
	"testing"
	"time"

	casq "github.com/casq/casq/sdk/go"
	casqv1 "github.com/casq/casq/sdk/go/gen/casq/v1"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/types/known/anypb"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"
)

func sampleMessage() *casqv1.Message {
	return &casqv1.Message{
		Id:          "01J00000000000000000000000",
		Queue:       "emails",
		Shard:       2,
		Offset:      1 << 40,
		Payload:     []byte{0x00, 0xff, 'h', 'i'},
		Headers:     map[string]string{"content-type": "application/json", "schema": "v3"},
		Key:         "customer-42",
		Priority:    -7,
		RunAt:       timestamppb.New(time.Date(2030, 1, 2, 3, 4, 5, 6, time.UTC)),
		MaxAttempts: 5,
		DedupId:     "order-9",
		EnqueuedAt:  timestamppb.New(time.Date(2030, 1, 2, 3, 4, 0, 0, time.UTC)),
		TraceContext: &casqv1.TraceContext{
			Traceparent: "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
			Tracestate:  "vendor=value",
		},
	}
}

func sampleJob() *casqv1.ClaimedMessage {
	return &casqv1.ClaimedMessage{
		Message:       sampleMessage(),
		Subscription:  "default",
		Receipt:       "r-2-1099511627776-3",
		Attempt:       3,
		MaxAttempts:   5,
		LeaseDeadline: timestamppb.New(time.Date(2030, 1, 2, 3, 5, 0, 0, time.UTC)),
	}
}

// roundTrip checks that m survives the binary and the JSON encoding.
func roundTrip[M proto.Message](t *testing.T, in M, empty func() M) {
	t.Helper()
	wire, err := proto.Marshal(in)
	if err != nil {
		t.Fatalf("marshal %T: %v", in, err)
	}
	out := empty()
	if err := proto.Unmarshal(wire, out); err != nil {
		t.Fatalf("unmarshal %T: %v", in, err)
	}
	if !proto.Equal(in, out) {
		t.Fatalf("binary round trip changed the %T:\n in: %v\nout: %v", in, in, out)
	}
	js, err := protojson.Marshal(in)
	if err != nil {
		t.Fatalf("marshal json %T: %v", in, err)
	}
	out = empty()
	if err := protojson.Unmarshal(js, out); err != nil {
		t.Fatalf("unmarshal json %s: %v", js, err)
	}
	if !proto.Equal(in, out) {
		t.Fatalf("JSON round trip changed the %T:\n in: %v\nout: %v", in, in, out)
	}
}

func TestMessageRoundTrips(t *testing.T) {
	roundTrip(t, sampleMessage(), func() *casqv1.Message { return &casqv1.Message{} })
	roundTrip(t, sampleJob(), func() *casqv1.ClaimedMessage { return &casqv1.ClaimedMessage{} })
}

func TestNewMessageScheduleOneof(t *testing.T) {
	m := &casqv1.NewMessage{
		Payload:  []byte("job"),
		Schedule: &casqv1.NewMessage_Delay{Delay: durationpb.New(90 * time.Second)},
	}
	if m.GetRunAt() != nil || m.GetDelay().AsDuration() != 90*time.Second {
		t.Fatalf("oneof schedule: run_at=%v delay=%v", m.GetRunAt(), m.GetDelay())
	}
	wire, err := proto.Marshal(&casqv1.EnqueueRequest{Queue: "q", Messages: []*casqv1.NewMessage{m}})
	if err != nil {
		t.Fatalf("marshal: %v", err)
	}
	var req casqv1.EnqueueRequest
	if err := proto.Unmarshal(wire, &req); err != nil {
		t.Fatalf("unmarshal: %v", err)
	}
	if got := req.GetMessages()[0].GetDelay().AsDuration(); got != 90*time.Second {
		t.Fatalf("delay after round trip = %v, want 90s", got)
	}
}

func TestWorkRequestOneofRoundTrip(t *testing.T) {
	requests := []*casqv1.WorkRequest{
		{Command: &casqv1.WorkRequest_Open{Open: &casqv1.WorkOpen{
			Queue: "emails", WorkerId: "host-1/pid-7", Credits: 10, LeaseTtl: durationpb.New(30 * time.Second),
		}}},
		{Command: &casqv1.WorkRequest_Credit{Credit: &casqv1.WorkCredit{Credits: 3}}},
		{RequestId: 7, Command: &casqv1.WorkRequest_Heartbeat{Heartbeat: &casqv1.WorkHeartbeat{Receipts: []string{"a", "b"}}}},
		{RequestId: 8, Command: &casqv1.WorkRequest_Ack{Ack: &casqv1.WorkAck{Receipts: []string{"a"}}}},
		{RequestId: 9, Command: &casqv1.WorkRequest_Nack{Nack: &casqv1.WorkNack{
			Receipts: []string{"b"}, Delay: durationpb.New(0), DeadLetter: true, Reason: "bad input",
		}}},
	}
	for _, req := range requests {
		roundTrip(t, req, func() *casqv1.WorkRequest { return &casqv1.WorkRequest{} })
	}
	wire, err := proto.Marshal(requests[4])
	if err != nil {
		t.Fatalf("marshal: %v", err)
	}
	var decoded casqv1.WorkRequest
	if err := proto.Unmarshal(wire, &decoded); err != nil {
		t.Fatalf("unmarshal: %v", err)
	}
	nack, ok := decoded.GetCommand().(*casqv1.WorkRequest_Nack)
	if !ok || decoded.GetOpen() != nil || decoded.GetRequestId() != 9 {
		t.Fatalf("decoded command = %T (request id %d), want *WorkRequest_Nack", decoded.GetCommand(), decoded.GetRequestId())
	}
	// An explicit zero delay is present (retry at once), unlike an unset one (backoff).
	if !nack.Nack.GetDeadLetter() || nack.Nack.GetReason() != "bad input" || nack.Nack.GetDelay() == nil {
		t.Fatalf("nack after round trip = %v", nack.Nack)
	}

	job := &casqv1.WorkResponse{Event: &casqv1.WorkResponse_Job{Job: sampleJob()}}
	roundTrip(t, job, func() *casqv1.WorkResponse { return &casqv1.WorkResponse{} })
}

func TestQueueConfigPresence(t *testing.T) {
	patch := &casqv1.UpdateQueueRequest{Queue: "q", Config: &casqv1.QueueConfig{
		MaxAttempts: proto.Uint32(0),
		Limits:      &casqv1.QueueLimits{DeadLetterLimit: proto.Uint32(0)},
	}}
	roundTrip(t, patch, func() *casqv1.UpdateQueueRequest { return &casqv1.UpdateQueueRequest{} })
	wire, err := proto.Marshal(patch)
	if err != nil {
		t.Fatalf("marshal: %v", err)
	}
	var decoded casqv1.UpdateQueueRequest
	if err := proto.Unmarshal(wire, &decoded); err != nil {
		t.Fatalf("unmarshal: %v", err)
	}
	cfg := decoded.GetConfig()
	// Explicit zeros survive (set to 0), unset fields stay unset (keep the current value).
	if cfg.MaxAttempts == nil || cfg.GetLimits().DeadLetterLimit == nil {
		t.Fatalf("explicit zeros lost: %v", cfg)
	}
	if cfg.GetLimits().MaxBatch != nil || cfg.GetBackoff() != nil || cfg.GetLeaseTtl() != nil {
		t.Fatalf("unset fields became set: %v", cfg)
	}
}

type rpcShape struct {
	in, out                      string
	clientStreams, serverStreams bool
}

func checkService(t *testing.T, file protoreflect.FileDescriptor, name string, want map[string]rpcShape) {
	t.Helper()
	svc := file.Services().ByName(protoreflect.Name(name))
	if svc == nil {
		t.Fatalf("%s not in file %s", name, file.Path())
	}
	if got := string(svc.FullName()); got != "casq.v1."+name {
		t.Fatalf("service full name = %q", got)
	}
	methods := svc.Methods()
	if methods.Len() != len(want) {
		t.Fatalf("%s has %d methods, want %d", name, methods.Len(), len(want))
	}
	for method, shape := range want {
		m := methods.ByName(protoreflect.Name(method))
		if m == nil {
			t.Fatalf("method %s.%s missing", name, method)
		}
		if string(m.Input().FullName()) != shape.in || string(m.Output().FullName()) != shape.out {
			t.Fatalf("method %s: %s -> %s, want %s -> %s", method, m.Input().FullName(), m.Output().FullName(), shape.in, shape.out)
		}
		if m.IsStreamingClient() != shape.clientStreams || m.IsStreamingServer() != shape.serverStreams {
			t.Fatalf("method %s: client streaming %v, server streaming %v; want %v, %v",
				method, m.IsStreamingClient(), m.IsStreamingServer(), shape.clientStreams, shape.serverStreams)
		}
	}
}

func unary(name string) rpcShape {
	return rpcShape{in: "casq.v1." + name + "Request", out: "casq.v1." + name + "Response"}
}

func TestServiceDescriptors(t *testing.T) {
	checkService(t, casqv1.File_casq_v1_queue_service_proto, "QueueService", map[string]rpcShape{
		"Enqueue":       unary("Enqueue"),
		"EnqueueStream": {in: "casq.v1.EnqueueStreamRequest", out: "casq.v1.EnqueueStreamResponse", clientStreams: true, serverStreams: true},
		"Claim":         unary("Claim"),
		"Heartbeat":     unary("Heartbeat"),
		"Ack":           unary("Ack"),
		"Nack":          unary("Nack"),
		"Work":          {in: "casq.v1.WorkRequest", out: "casq.v1.WorkResponse", clientStreams: true, serverStreams: true},
		"LookupShards":  unary("LookupShards"),
	})
	getDocument := unary("GetDocument")
	getDocument.serverStreams = true
	checkService(t, casqv1.File_casq_v1_admin_service_proto, "AdminService", map[string]rpcShape{
		"ListQueues":         unary("ListQueues"),
		"GetQueue":           unary("GetQueue"),
		"CreateQueue":        unary("CreateQueue"),
		"UpdateQueue":        unary("UpdateQueue"),
		"DeleteQueue":        unary("DeleteQueue"),
		"CreateSubscription": unary("CreateSubscription"),
		"DeleteSubscription": unary("DeleteSubscription"),
		"PurgeQueue":         unary("PurgeQueue"),
		"ListDeadLetters":    unary("ListDeadLetters"),
		"RedriveDeadLetters": unary("RedriveDeadLetters"),
		"GetDocument":        getDocument,
		"RepairShard":        unary("RepairShard"),
	})

	q := casqv1.QueueService_ServiceDesc
	if q.ServiceName != "casq.v1.QueueService" || len(q.Methods) != 6 || len(q.Streams) != 2 {
		t.Fatalf("QueueService grpc ServiceDesc = %+v", q)
	}
	for i, name := range []string{"EnqueueStream", "Work"} {
		if s := q.Streams[i]; s.StreamName != name || !s.ClientStreams || !s.ServerStreams {
			t.Fatalf("QueueService grpc ServiceDesc stream %d = %+v, want bidirectional %s", i, s, name)
		}
	}
	a := casqv1.AdminService_ServiceDesc
	if a.ServiceName != "casq.v1.AdminService" || len(a.Methods) != 11 || len(a.Streams) != 1 ||
		a.Streams[0].StreamName != "GetDocument" || a.Streams[0].ClientStreams || !a.Streams[0].ServerStreams {
		t.Fatalf("AdminService grpc ServiceDesc = %+v", a)
	}
}

// fakeQueue implements Enqueue, Ack (always a redirect) and a tiny Work
// session; everything else stays unimplemented.
type fakeQueue struct {
	casqv1.UnimplementedQueueServiceServer
}

func (fakeQueue) Enqueue(_ context.Context, req *casqv1.EnqueueRequest) (*casqv1.EnqueueResponse, error) {
	resp := &casqv1.EnqueueResponse{}
	for i, m := range req.GetMessages() {
		resp.Messages = append(resp.Messages, &casqv1.EnqueuedMessage{
			Id:     req.GetQueue() + "/" + string(m.GetPayload()),
			Offset: uint64(i),
		})
	}
	return resp, nil
}

var redirect = &casqv1.LeaderRedirect{
	LeaderAddress: "10.0.0.7:7070",
	LeaderId:      "broker-b",
	Epoch:         12,
	Queue:         "emails",
	Shard:         1,
}

func (fakeQueue) Ack(ctx context.Context, _ *casqv1.AckRequest) (*casqv1.AckResponse, error) {
	if err := grpc.SetTrailer(ctx, metadata.Pairs(casq.LeaderAddressTrailer, redirect.GetLeaderAddress())); err != nil {
		return nil, err
	}
	st, err := status.New(codes.Unavailable, "shard emails/1 is led by broker-b; resend to 10.0.0.7:7070").WithDetails(redirect)
	if err != nil {
		return nil, err
	}
	return nil, st.Err()
}

// Work answers Open with Opened, sends one job per credit, and answers acks.
func (fakeQueue) Work(stream grpc.BidiStreamingServer[casqv1.WorkRequest, casqv1.WorkResponse]) error {
	first, err := stream.Recv()
	if err != nil {
		return err
	}
	open := first.GetOpen()
	if open == nil {
		return status.Error(codes.InvalidArgument, "the first message of a Work stream must be open")
	}
	if err := stream.Send(&casqv1.WorkResponse{RequestId: first.GetRequestId(), Event: &casqv1.WorkResponse_Opened{Opened: &casqv1.WorkOpened{
		SessionId: "s-1", Queue: open.GetQueue(), Subscription: "default", LeaseTtl: durationpb.New(30 * time.Second),
		HeartbeatInterval: durationpb.New(10 * time.Second), MaxCredits: 1000,
		Routing: &casqv1.WorkRouting{ServingShards: []uint32{0}, Shards: []*casqv1.ShardRoute{{Shard: 0}}},
	}}}); err != nil {
		return err
	}
	for i := uint32(0); i < open.GetCredits(); i++ {
		job := sampleJob()
		job.Receipt = "r" + string(rune('0'+i))
		if err := stream.Send(&casqv1.WorkResponse{Event: &casqv1.WorkResponse_Job{Job: job}}); err != nil {
			return err
		}
	}
	for {
		req, err := stream.Recv()
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return err
		}
		ack := req.GetAck()
		if ack == nil {
			continue
		}
		results := make([]*casqv1.AckResult, 0, len(ack.GetReceipts()))
		for _, r := range ack.GetReceipts() {
			results = append(results, &casqv1.AckResult{Receipt: r, Outcome: casqv1.AckOutcome_ACK_OUTCOME_ACKED})
		}
		if err := stream.Send(&casqv1.WorkResponse{RequestId: req.GetRequestId(), Event: &casqv1.WorkResponse_Acked{Acked: &casqv1.WorkAcked{Results: results}}}); err != nil {
			return err
		}
	}
}

func dialFake(t *testing.T) casqv1.QueueServiceClient {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("listen: %v", err)
	}
	srv := grpc.NewServer()
	casqv1.RegisterQueueServiceServer(srv, fakeQueue{})
	go func() { _ = srv.Serve(lis) }()
	t.Cleanup(srv.Stop)
	conn, err := grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatalf("dial: %v", err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	return casqv1.NewQueueServiceClient(conn)
}

func TestUnaryStubsOverLoopback(t *testing.T) {
	client := dialFake(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()

	resp, err := client.Enqueue(ctx, &casqv1.EnqueueRequest{
		Queue:    "emails",
		Messages: []*casqv1.NewMessage{{Payload: []byte("a")}, {Payload: []byte("b")}},
	})
	if err != nil {
		t.Fatalf("Enqueue: %v", err)
	}
	if len(resp.GetMessages()) != 2 || resp.GetMessages()[1].GetId() != "emails/b" || resp.GetMessages()[1].GetOffset() != 1 {
		t.Fatalf("Enqueue response = %v", resp)
	}

	_, err = client.Claim(ctx, &casqv1.ClaimRequest{Queue: "emails", WorkerId: "w"})
	if status.Code(err) != codes.Unimplemented {
		t.Fatalf("Claim on unimplemented server: err = %v, want code Unimplemented", err)
	}
}

func TestRedirectDetailOverLoopback(t *testing.T) {
	client := dialFake(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()

	var trailer metadata.MD
	_, err := client.Ack(ctx, &casqv1.AckRequest{Queue: "emails", Receipts: []string{"r"}}, grpc.Trailer(&trailer))
	st := status.Convert(err)
	if st.Code() != codes.Unavailable {
		t.Fatalf("Ack: err = %v, want code Unavailable", err)
	}
	if got := trailer.Get(casq.LeaderAddressTrailer); len(got) != 1 || got[0] != "10.0.0.7:7070" {
		t.Fatalf("%s trailer = %v", casq.LeaderAddressTrailer, got)
	}
	// The generic way: grpc-go decodes the details of grpc-status-details-bin.
	var found *casqv1.LeaderRedirect
	for _, d := range st.Details() {
		if r, ok := d.(*casqv1.LeaderRedirect); ok {
			found = r
		}
	}
	if !proto.Equal(found, redirect) {
		t.Fatalf("LeaderRedirect detail = %v, want %v", found, redirect)
	}
	// The casq way for clients without googleapis protos: RpcStatus is wire
	// compatible with google.rpc.Status.
	wire, err := proto.Marshal(st.Proto())
	if err != nil {
		t.Fatalf("marshal google.rpc.Status: %v", err)
	}
	var mirror casqv1.RpcStatus
	if err := proto.Unmarshal(wire, &mirror); err != nil {
		t.Fatalf("unmarshal as RpcStatus: %v", err)
	}
	if mirror.GetCode() != int32(codes.Unavailable) || mirror.GetMessage() != st.Message() || len(mirror.GetDetails()) != 1 {
		t.Fatalf("RpcStatus = %v", &mirror)
	}
	if got := mirror.GetDetails()[0].GetTypeUrl(); got != "type.googleapis.com/casq.v1.LeaderRedirect" {
		t.Fatalf("detail type URL = %q", got)
	}
	var decoded casqv1.LeaderRedirect
	if err := anypb.UnmarshalTo(mirror.GetDetails()[0], &decoded, proto.UnmarshalOptions{}); err != nil {
		t.Fatalf("unpack detail: %v", err)
	}
	if !proto.Equal(&decoded, redirect) {
		t.Fatalf("decoded redirect = %v", &decoded)
	}
}

func TestWorkStreamOverLoopback(t *testing.T) {
	client := dialFake(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()

	stream, err := client.Work(ctx)
	if err != nil {
		t.Fatalf("Work: %v", err)
	}
	if err := stream.Send(&casqv1.WorkRequest{RequestId: 1, Command: &casqv1.WorkRequest_Open{Open: &casqv1.WorkOpen{
		Queue: "emails", WorkerId: "w-1", Credits: 2,
	}}}); err != nil {
		t.Fatalf("send open: %v", err)
	}
	first, err := stream.Recv()
	if err != nil {
		t.Fatalf("recv opened: %v", err)
	}
	if first.GetRequestId() != 1 || first.GetOpened().GetHeartbeatInterval().AsDuration() != 10*time.Second ||
		first.GetOpened().GetRouting().GetServingShards()[0] != 0 {
		t.Fatalf("first response = %v, want opened", first)
	}
	var receipts []string
	for range 2 {
		resp, err := stream.Recv()
		if err != nil {
			t.Fatalf("recv job: %v", err)
		}
		if resp.GetJob() == nil || resp.GetRequestId() != 0 {
			t.Fatalf("response = %v, want an unsolicited job", resp)
		}
		receipts = append(receipts, resp.GetJob().GetReceipt())
	}
	if err := stream.Send(&casqv1.WorkRequest{RequestId: 42, Command: &casqv1.WorkRequest_Ack{Ack: &casqv1.WorkAck{Receipts: receipts}}}); err != nil {
		t.Fatalf("send ack: %v", err)
	}
	acked, err := stream.Recv()
	if err != nil {
		t.Fatalf("recv acked: %v", err)
	}
	results := acked.GetAcked().GetResults()
	if acked.GetRequestId() != 42 || len(results) != 2 || results[1].GetReceipt() != "r1" ||
		results[1].GetOutcome() != casqv1.AckOutcome_ACK_OUTCOME_ACKED {
		t.Fatalf("ack reply = %v", acked)
	}
	if err := stream.CloseSend(); err != nil {
		t.Fatalf("close send: %v", err)
	}
	if _, err := stream.Recv(); !errors.Is(err, io.EOF) {
		t.Fatalf("after half-close: err = %v, want io.EOF (status OK)", err)
	}
}
