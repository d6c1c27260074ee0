package casq_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"runtime"
	"strings"
	"testing"
	"time"

	casq "github.com/casq/casq/sdk/go"
)

// serverAddr is the address of the casq server TestMain started.
var serverAddr string

func TestMain(m *testing.M) {
	os.Exit(runWithServer(m))
}

func runWithServer(m *testing.M) int {
	_, file, _, _ := runtime.Caller(0)
	root := filepath.Join(filepath.Dir(file), "..", "..")
	log := &lockedLines{}
	b, err := startBroker(root, "memory:", "127.0.0.1:0", log)
	if b != nil {
		defer func() {
			_ = b.cmd.Process.Kill()
			_ = b.cmd.Wait()
			if os.Getenv("CASQ_TEST_VERBOSE") != "" {
				fmt.Fprintf(os.Stderr, "server output:\n%s\n", log)
			}
		}()
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "start casq server:", err)
		return 1
	}
	serverAddr = b.addr
	return m.Run()
}

func dial(t testing.TB) *casq.Client {
	t.Helper()
	c, err := casq.Dial(context.Background(), casq.Options{Brokers: []string{serverAddr}, Timeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	return c
}

func queueName(t testing.TB) string {
	name := strings.ToLower(regexp.MustCompile(`[^a-zA-Z0-9]`).ReplaceAllString(t.Name(), "-"))
	return fmt.Sprintf("go-%.60s-%d", name, time.Now().UnixNano())
}
