package casq_test

// casq serve processes for the Go SDK's tests: start one, read the address
// it prints, keep its last output lines for failure messages.

import (
	"bufio"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"time"
)

// broker is one casq serve process.
type broker struct {
	addr string
	cmd  *exec.Cmd
	log  *lockedLines
}

// lockedLines keeps the last lines a broker printed, for failure messages.
type lockedLines struct {
	mu    sync.Mutex
	lines []string
}

func (l *lockedLines) add(s string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.lines = append(l.lines, s)
	if len(l.lines) > 50 {
		l.lines = l.lines[1:]
	}
}

func (l *lockedLines) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return strings.Join(l.lines, "\n")
}

// casqBin is the casq launcher the tests run: CASQ_TEST_BIN when set (`npm
// test` installs the build once, see test/support/install-built-casq.ts),
// else the checkout's (the TypeScript source through tsx).
func casqBin(root string) string {
	if bin := os.Getenv("CASQ_TEST_BIN"); bin != "" {
		return bin
	}
	return filepath.Join(root, "server", "bin", "casq.js")
}

// startBroker starts `casq serve --store store --listen listen` (plus args)
// and waits for its address; its output goes to log.
func startBroker(root, store, listen string, log *lockedLines, args ...string) (*broker, error) {
	cmd := exec.Command("node", append([]string{casqBin(root), "serve",
		"--store", store, "--listen", listen, "--log-level", "warn"}, args...)...)
	cmd.Dir = root
	out, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	cmd.Stderr = cmd.Stdout
	cmd.WaitDelay = 5 * time.Second
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	b := &broker{cmd: cmd, log: log}
	found := make(chan string, 1)
	go func() {
		re := regexp.MustCompile(`listening on (\S+)`)
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			line := sc.Text()
			b.log.add(line)
			if m := re.FindStringSubmatch(line); m != nil {
				select {
				case found <- m[1]:
				default:
				}
			}
		}
		close(found)
	}()
	select {
	case addr, ok := <-found:
		if !ok {
			return b, fmt.Errorf("exited before printing its address:\n%s", b.log)
		}
		b.addr = addr
		return b, nil
	case <-time.After(30 * time.Second):
		return b, fmt.Errorf("did not print its address within 30 s:\n%s", b.log)
	}
}
