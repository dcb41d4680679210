// Package logging is the plugin's leveled logger. Stdout carries the CNI
// result, so nothing here ever writes to it.
package logging

import (
	"fmt"
	"io"
	"os"
	"strings"
	"sync"
	"time"
)

// Levels, from quiet to chatty.
const (
	LevelError = iota
	LevelWarn
	LevelInfo
	LevelDebug
)

// Logger writes to an optional log file; warnings and errors also go to
// stderr, which container runtimes record next to the failed CNI call.
type Logger struct {
	mu     sync.Mutex
	level  int
	file   io.Writer
	stderr io.Writer
	prefix string
}

// ParseLevel maps a logLevel setting to a level; "" and anything it does
// not know mean info (a CNI call must not fail over its log level).
func ParseLevel(s string) int {
	l, _ := Level(s)
	return l
}

// Level maps a level name to a level, with an error (and info) for a name
// it does not know; "" is info.
func Level(s string) (int, error) {
	switch strings.ToLower(s) {
	case "error":
		return LevelError, nil
	case "warn", "warning":
		return LevelWarn, nil
	case "", "info":
		return LevelInfo, nil
	case "debug":
		return LevelDebug, nil
	}
	return LevelInfo, fmt.Errorf("log level %q: want error, warn, info or debug", s)
}

// New opens path for appending (when set). A log file that cannot be opened
// must not fail the CNI call, so that is reported on stderr and ignored.
func New(path, level, prefix string) *Logger {
	l := &Logger{level: ParseLevel(level), stderr: os.Stderr, prefix: prefix}
	if path != "" {
		f, err := os.OpenFile(path, os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o600)
		if err != nil {
			fmt.Fprintf(os.Stderr, "rdma-netns: cannot open log file %s: %v\n", path, err)
		} else {
			l.file = f
		}
	}
	return l
}

// NewWriter logs to w only; tests use it.
func NewWriter(w io.Writer, level string) *Logger {
	return &Logger{level: ParseLevel(level), file: w, stderr: io.Discard}
}

// Discard drops everything.
func Discard() *Logger { return &Logger{level: LevelError, stderr: io.Discard} }

func (l *Logger) logf(level int, tag, format string, args ...any) {
	if l == nil || level > l.level {
		return
	}
	msg := fmt.Sprintf(format, args...)
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.file != nil {
		fmt.Fprintf(l.file, "%s %s %s%s\n", time.Now().Format(time.RFC3339Nano), tag, l.prefix, msg)
	}
	if level <= LevelWarn {
		fmt.Fprintf(l.stderr, "rdma-netns: %s: %s%s\n", strings.ToLower(tag), l.prefix, msg)
	}
}

func (l *Logger) Errorf(format string, args ...any) { l.logf(LevelError, "ERROR", format, args...) }
func (l *Logger) Warnf(format string, args ...any)  { l.logf(LevelWarn, "WARN", format, args...) }
func (l *Logger) Infof(format string, args ...any)  { l.logf(LevelInfo, "INFO", format, args...) }
func (l *Logger) Debugf(format string, args ...any) { l.logf(LevelDebug, "DEBUG", format, args...) }
