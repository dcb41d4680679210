// Package logtest is a log that the goroutines of the code under test
// write while the test reads it.
package logtest

import (
	"bytes"
	"strings"
	"sync"
)

// Buffer is an io.Writer for a logger, safe for concurrent use.
type Buffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (b *Buffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.Write(p)
}

// String is everything written so far.
func (b *Buffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.String()
}

// Lines are the lines written so far, empty ones left out.
func (b *Buffer) Lines() []string {
	return strings.FieldsFunc(b.String(), func(r rune) bool { return r == '\n' })
}
