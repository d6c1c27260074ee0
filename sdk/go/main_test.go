package casq_test

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
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
	if spec := os.Getenv(crashWorkerEnv); spec != "" {
		// A child process of the crashWorker scenario step, not a test run.
		os.Exit(crashWorkerMain(spec))
	}
	os.Exit(runWithServer(m))
}

func runWithServer(m *testing.M) int {
	_, file, _, _ := runtime.Caller(0)
	root := filepath.Join(filepath.Dir(file), "..", "..")
	cmd := exec.Command("node", filepath.Join(root, "server", "bin", "casq.js"),
		"serve", "--store", "memory:", "--listen", "127.0.0.1:0", "--log-level", "warn")
	cmd.Dir = root
	pr, pw := io.Pipe()
	cmd.Stdout, cmd.Stderr = pw, pw
	if err := cmd.Start(); err != nil {
		fmt.Fprintln(os.Stderr, "start casq server:", err)
		return 1
	}
	defer func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		_ = pw.Close()
	}()
	found := make(chan string, 1)
	go func() {
		re := regexp.MustCompile(`listening on (\S+)`)
		sc := bufio.NewScanner(pr)
		for sc.Scan() {
			if mm := re.FindStringSubmatch(sc.Text()); mm != nil {
				select {
				case found <- mm[1]:
				default:
				}
			} else if os.Getenv("CASQ_TEST_VERBOSE") != "" {
				fmt.Fprintln(os.Stderr, "server:", sc.Text())
			}
		}
	}()
	select {
	case serverAddr = <-found:
	case <-time.After(30 * time.Second):
		fmt.Fprintln(os.Stderr, "casq server did not print its address")
		return 1
	}
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
