// Command s3-fake is the S3-compatible server casq's tests run against:
// gofakes3 (in-memory backend) behind a thin shim that makes its conditional
// writes behave like AWS S3 in the two places where gofakes3 v1.2.0 does not.
//
// gofakes3 already checks PutObject's If-Match / If-None-Match: * atomically
// (the check and the write happen under the backend's lock), answering 412
// PreconditionFailed on a lost race. What it lacks, and this shim adds:
//
//   - DeleteObject with If-Match: gofakes3 ignores the header and deletes
//     unconditionally. The shim answers 412 PreconditionFailed when the etag
//     differs and 404 NoSuchKey when the key is missing, as AWS does.
//   - PutObject with If-Match on a missing key: gofakes3 answers 412; AWS (and
//     moto) answer 404 NoSuchKey. The shim answers 404 so that the client's
//     mapping of that case is exercised against a real server.
//
// To keep these extra checks atomic with respect to every other write, all
// mutating requests (PUT, POST, DELETE) are serialised by one mutex. That is
// a test server: throughput is not the point, correctness of CAS is.
//
// Flags: -addr (default 127.0.0.1:0, a free loopback port), -bucket (created
// at start). The first line on stdout is "listening on http://HOST:PORT".
// With -exit-on-stdin-eof the server exits when its stdin closes, so a test
// runner that dies (even by SIGKILL) never leaves it behind.
package main

import (
	"crypto/rand"
	"encoding/hex"
	"encoding/xml"
	"flag"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"os"
	"strings"
	"sync"

	"github.com/johannesboyne/gofakes3"
	"github.com/johannesboyne/gofakes3/backend/s3mem"
)

type s3Error struct {
	XMLName   xml.Name `xml:"Error"`
	Code      string   `xml:"Code"`
	Message   string   `xml:"Message"`
	Resource  string   `xml:"Resource"`
	RequestID string   `xml:"RequestId"`
}

func writeError(w http.ResponseWriter, r *http.Request, status int, code, message string) {
	id := make([]byte, 8)
	_, _ = rand.Read(id)
	w.Header().Set("Content-Type", "application/xml")
	w.WriteHeader(status)
	_, _ = io.WriteString(w, xml.Header)
	_ = xml.NewEncoder(w).Encode(s3Error{Code: code, Message: message, Resource: r.URL.Path, RequestID: hex.EncodeToString(id)})
}

func unquote(etag string) string {
	return strings.TrimSuffix(strings.TrimPrefix(strings.TrimSpace(etag), `"`), `"`)
}

// casShim serialises writes and enforces the conditions gofakes3 skips.
type casShim struct {
	mu      sync.Mutex
	backend *s3mem.Backend
	next    http.Handler
}

func (s *casShim) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.Method == http.MethodGet || r.Method == http.MethodHead {
		s.next.ServeHTTP(w, r)
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()

	ifMatch := r.Header.Get("If-Match")
	bucket, key, isObject := strings.Cut(strings.TrimPrefix(r.URL.Path, "/"), "/")
	query := r.URL.Query()
	conditional := ifMatch != "" && isObject && key != "" && !query.Has("versionId") && !query.Has("uploadId")
	if conditional && (r.Method == http.MethodDelete || r.Method == http.MethodPut) {
		object, err := s.backend.HeadObject(bucket, key)
		switch {
		case gofakes3.HasErrorCode(err, gofakes3.ErrNoSuchKey):
			writeError(w, r, http.StatusNotFound, "NoSuchKey", "The specified key does not exist.")
			return
		case err != nil:
			s.next.ServeHTTP(w, r) // let gofakes3 report NoSuchBucket and friends
			return
		case unquote(ifMatch) != hex.EncodeToString(object.Hash):
			if r.Method == http.MethodDelete {
				writeError(w, r, http.StatusPreconditionFailed, "PreconditionFailed",
					"At least one of the pre-conditions you specified did not hold")
				return
			}
			// PUT: gofakes3 checks the etag itself, atomically.
		}
	}
	s.next.ServeHTTP(w, r)
}

func main() {
	addr := flag.String("addr", "127.0.0.1:0", "address to listen on")
	bucket := flag.String("bucket", "", "bucket to create at start")
	exitOnStdinEOF := flag.Bool("exit-on-stdin-eof", false, "exit when stdin closes")
	quiet := flag.Bool("quiet", true, "log only errors")
	flag.Parse()

	backend := s3mem.New()
	if *bucket != "" {
		if err := backend.CreateBucket(*bucket); err != nil && !gofakes3.IsAlreadyExists(err) {
			log.Fatalf("create bucket %s: %v", *bucket, err)
		}
	}
	options := []gofakes3.Option{gofakes3.WithAutoBucket(false)}
	if *quiet {
		options = append(options, gofakes3.WithLogger(gofakes3.StdLog(log.New(os.Stderr, "", log.LstdFlags), gofakes3.LogErr)))
	}
	faker := gofakes3.New(backend, options...)

	listener, err := net.Listen("tcp", *addr)
	if err != nil {
		log.Fatalf("listen on %s: %v", *addr, err)
	}
	fmt.Printf("listening on http://%s\n", listener.Addr().String())

	if *exitOnStdinEOF {
		go func() {
			_, _ = io.Copy(io.Discard, os.Stdin)
			os.Exit(0)
		}()
	}
	server := &http.Server{Handler: &casShim{backend: backend, next: faker.Server()}}
	log.Fatal(server.Serve(listener))
}
