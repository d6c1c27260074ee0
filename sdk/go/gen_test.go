package casq_test

// These tests prove that the generated Go code of the casq.v1 API works: the
// messages survive binary and JSON round trips, the descriptors describe the
// service, and the gRPC stubs carry real calls over loopback TCP.

import (
	"context"
	"net"
	"testing"
	"time"

	casqv1 "github.com/casq/casq/sdk/go/gen/casq/v1"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"
)

func sampleMessage() *casqv1.Message {
	return &casqv1.Message{
		Id:          "01J0000000000000000000000",
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
		Attempt:     2,
		TraceContext: &casqv1.TraceContext{
			Traceparent: "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
			Tracestate:  "vendor=value",
		},
	}
}

func TestMessageBinaryRoundTrip(t *testing.T) {
	in := sampleMessage()
	wire, err := proto.Marshal(in)
	if err != nil {
		t.Fatalf("marshal: %v", err)
	}
	out := &casqv1.Message{}
	if err := proto.Unmarshal(wire, out); err != nil {
		t.Fatalf("unmarshal: %v", err)
	}
	if !proto.Equal(in, out) {
		t.Fatalf("binary round trip changed the message:\n in: %v\nout: %v", in, out)
	}
}

func TestMessageJSONRoundTrip(t *testing.T) {
	in := sampleMessage()
	js, err := protojson.Marshal(in)
	if err != nil {
		t.Fatalf("marshal json: %v", err)
	}
	out := &casqv1.Message{}
	if err := protojson.Unmarshal(js, out); err != nil {
		t.Fatalf("unmarshal json %s: %v", js, err)
	}
	if !proto.Equal(in, out) {
		t.Fatalf("JSON round trip changed the message:\n in: %v\nout: %v", in, out)
	}
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

func TestServiceDescriptor(t *testing.T) {
	svc := casqv1.File_casq_v1_queue_service_proto.Services().ByName("QueueService")
	if svc == nil {
		t.Fatal("QueueService not in file descriptor")
	}
	if got := string(svc.FullName()); got != "casq.v1.QueueService" {
		t.Fatalf("service full name = %q", got)
	}
	want := map[string][2]string{
		"Enqueue": {"casq.v1.EnqueueRequest", "casq.v1.EnqueueResponse"},
		"Claim":   {"casq.v1.ClaimRequest", "casq.v1.ClaimResponse"},
		"Ack":     {"casq.v1.AckRequest", "casq.v1.AckResponse"},
	}
	methods := svc.Methods()
	if methods.Len() != len(want) {
		t.Fatalf("QueueService has %d methods, want %d", methods.Len(), len(want))
	}
	for name, io := range want {
		m := methods.ByName(protoreflect.Name(name))
		if m == nil {
			t.Fatalf("method %s missing", name)
		}
		if string(m.Input().FullName()) != io[0] || string(m.Output().FullName()) != io[1] {
			t.Fatalf("method %s: %s -> %s, want %s -> %s", name, m.Input().FullName(), m.Output().FullName(), io[0], io[1])
		}
	}
	if casqv1.QueueService_ServiceDesc.ServiceName != "casq.v1.QueueService" || len(casqv1.QueueService_ServiceDesc.Methods) != len(want) {
		t.Fatalf("grpc ServiceDesc = %s with %d methods", casqv1.QueueService_ServiceDesc.ServiceName, len(casqv1.QueueService_ServiceDesc.Methods))
	}
}

// enqueueOnly implements Enqueue and leaves the other RPCs unimplemented.
type enqueueOnly struct {
	casqv1.UnimplementedQueueServiceServer
}

func (enqueueOnly) Enqueue(_ context.Context, req *casqv1.EnqueueRequest) (*casqv1.EnqueueResponse, error) {
	resp := &casqv1.EnqueueResponse{}
	for i, m := range req.GetMessages() {
		resp.Messages = append(resp.Messages, &casqv1.EnqueuedMessage{
			Id:     req.GetQueue() + "/" + string(m.GetPayload()),
			Offset: uint64(i),
		})
	}
	return resp, nil
}

func TestGRPCStubsOverLoopback(t *testing.T) {
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("listen: %v", err)
	}
	srv := grpc.NewServer()
	casqv1.RegisterQueueServiceServer(srv, enqueueOnly{})
	go func() { _ = srv.Serve(lis) }()
	t.Cleanup(srv.Stop)

	conn, err := grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatalf("dial: %v", err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	client := casqv1.NewQueueServiceClient(conn)

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

	_, err = client.Ack(ctx, &casqv1.AckRequest{Queue: "emails", Receipts: []string{"r"}})
	if status.Code(err) != codes.Unimplemented {
		t.Fatalf("Ack on unimplemented server: err = %v, want code Unimplemented", err)
	}
}
