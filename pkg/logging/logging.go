// Package logging is the plugin's leveled logger. Stdout carries the CNI
// result, so nothing here ever writes to it.
package logging

import (
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
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

// Dir is the node's directory for the plugin's log files. A network's
// logFile names a file in it and nowhere else: the runtime runs the plugin
// as root, and a network's author who could name any path would have it
// append lines to any file of the node (/etc/ld.so.preload, a cron file)
// or create one anywhere.
const Dir = "/var/log/rdma-netns"

// dir is Dir but in this package's tests.
var dir = Dir

// Allowed reports whether path names a file directly in Dir: a plain name
// after it, however the path is spelled.
func Allowed(path string) bool {
	clean := filepath.Clean(path)
	parent, name := filepath.Split(clean)
	return filepath.Clean(parent) == dir && name != "" && name != "." && name != ".." && !strings.ContainsRune(name, 0)
}

// New opens path for appending (when set). A log file that cannot be opened
// must not fail the call, so that is reported on stderr and ignored. A
// symbolic link, a FIFO or anything but a regular file at path is refused
// without blocking. Which paths a caller may name is the caller's rule:
// the CNI plugin takes only Allowed ones from a network's configuration.
func New(path, level, prefix string) *Logger {
	l := &Logger{level: ParseLevel(level), stderr: os.Stderr, prefix: prefix}
	if path == "" {
		return l
	}
	f, err := open(path)
	if err != nil {
		fmt.Fprintf(os.Stderr, "rdma-netns: cannot open log file %s: %v\n", path, err)
		return l
	}
	l.file = f
	return l
}

// open opens path for appending, creating Dir (0700) first for a file in
// it: the node's directory for the plugin's logs.
func open(path string) (*os.File, error) {
	if Allowed(path) {
		if err := os.MkdirAll(dir, 0o700); err != nil {
			return nil, err
		}
	}
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_APPEND|os.O_CREATE|syscall.O_NOFOLLOW|syscall.O_NONBLOCK|syscall.O_CLOEXEC, 0o600)
	if err != nil {
		return nil, err
	}
	if st, err := f.Stat(); err != nil || !st.Mode().IsRegular() {
		f.Close()
		return nil, fmt.Errorf("not a regular file")
	}
	return f, nil
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
