package fakesys

import (
	"os"
	"syscall"
	"testing"
	"time"
)

// FIFO makes a named pipe at path: a file that blocks whoever opens it
// for reading until a writer comes. Cleanup opens it for writing once, so
// that a reader which did block is let go before the test's directory is
// removed.
func FIFO(tb testing.TB, path string) {
	tb.Helper()
	if err := syscall.Mkfifo(path, 0o600); err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() {
		if f, err := os.OpenFile(path, os.O_WRONLY|syscall.O_NONBLOCK, 0); err == nil {
			f.Close()
		}
	})
}

// Within fails the test when fn has not returned after 5 s, so that a
// reader blocked on a FIFO fails the test rather than hang the run. fn
// only keeps what the call returned, the test checks it after: a call let
// go by FIFO's cleanup may return after the test ended.
func Within(tb testing.TB, what string, fn func()) {
	tb.Helper()
	done := make(chan struct{})
	go func() {
		defer close(done)
		fn()
	}()
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		tb.Fatalf("%s still blocked after 5s", what)
	}
}
