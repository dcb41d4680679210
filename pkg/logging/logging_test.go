package logging

import (
	"bytes"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// capture replaces *f (os.Stdout or os.Stderr) with a pipe while fn runs and
// returns what was written to it.
func capture(t *testing.T, f **os.File, fn func()) string {
	t.Helper()
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	saved := *f
	*f = w
	var buf bytes.Buffer
	done := make(chan struct{})
	go func() {
		io.Copy(&buf, r)
		close(done)
	}()
	defer func() {
		*f = saved
		w.Close()
		<-done
		r.Close()
	}()
	fn()
	*f = saved
	w.Close()
	<-done
	return buf.String()
}

func logAll(l *Logger) {
	l.Debugf("debug %d", 1)
	l.Infof("info %d", 2)
	l.Warnf("warn %d", 3)
	l.Errorf("error %d", 4)
}

func TestParseLevel(t *testing.T) {
	for in, want := range map[string]int{
		"": LevelInfo, "info": LevelInfo, "INFO": LevelInfo, "bogus": LevelInfo,
		"debug": LevelDebug, "Debug": LevelDebug,
		"warn": LevelWarn, "warning": LevelWarn, "WARN": LevelWarn,
		"error": LevelError, "ERROR": LevelError,
	} {
		if got := ParseLevel(in); got != want {
			t.Errorf("ParseLevel(%q) = %d, want %d", in, got, want)
		}
	}
}

func TestLevelsFilter(t *testing.T) {
	tests := []struct {
		level   string
		present []string
		absent  []string
	}{
		{"debug", []string{"debug 1", "info 2", "warn 3", "error 4"}, nil},
		{"", []string{"info 2", "warn 3", "error 4"}, []string{"debug 1"}},
		{"info", []string{"info 2", "warn 3", "error 4"}, []string{"debug 1"}},
		{"warn", []string{"warn 3", "error 4"}, []string{"debug 1", "info 2"}},
		{"error", []string{"error 4"}, []string{"debug 1", "info 2", "warn 3"}},
	}
	for _, tt := range tests {
		t.Run(tt.level, func(t *testing.T) {
			var buf bytes.Buffer
			logAll(NewWriter(&buf, tt.level))
			out := buf.String()
			for _, p := range tt.present {
				if !strings.Contains(out, p) {
					t.Errorf("level %q: %q missing from\n%s", tt.level, p, out)
				}
			}
			for _, a := range tt.absent {
				if strings.Contains(out, a) {
					t.Errorf("level %q: %q should be filtered out of\n%s", tt.level, a, out)
				}
			}
			if n := strings.Count(out, "\n"); n != len(tt.present) {
				t.Errorf("level %q: %d lines, want %d", tt.level, n, len(tt.present))
			}
		})
	}
}

var fileLine = regexp.MustCompile(`^(\S+) (DEBUG|INFO|WARN|ERROR) \[c1\] (.*)$`)

// inDir makes dir, the node's log directory, a new temporary one for the
// test.
func inDir(t *testing.T) string {
	t.Helper()
	saved := dir
	dir = t.TempDir()
	t.Cleanup(func() { dir = saved })
	return dir
}

func TestFileFormat(t *testing.T) {
	path := filepath.Join(inDir(t), "rdma-netns.log")
	l := New(path, "debug", "[c1] ")
	l.stderr = io.Discard
	before := time.Now().Add(-time.Second)
	logAll(l)
	// A second logger on the same path appends rather than truncates, as
	// every CNI call opens the file anew.
	l2 := New(path, "info", "[c1] ")
	l2.stderr = io.Discard
	l2.Infof("second call")

	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSuffix(string(data), "\n"), "\n")
	wantTags := []string{"DEBUG", "INFO", "WARN", "ERROR", "INFO"}
	wantMsgs := []string{"debug 1", "info 2", "warn 3", "error 4", "second call"}
	if len(lines) != len(wantTags) {
		t.Fatalf("got %d lines, want %d:\n%s", len(lines), len(wantTags), data)
	}
	for i, line := range lines {
		m := fileLine.FindStringSubmatch(line)
		if m == nil {
			t.Errorf("line %q does not match %v", line, fileLine)
			continue
		}
		ts, err := time.Parse(time.RFC3339Nano, m[1])
		if err != nil || ts.Before(before) {
			t.Errorf("line %q: bad timestamp (%v)", line, err)
		}
		if m[2] != wantTags[i] || m[3] != wantMsgs[i] {
			t.Errorf("line %q: tag %s msg %q, want %s %q", line, m[2], m[3], wantTags[i], wantMsgs[i])
		}
	}
	if st, err := os.Stat(path); err != nil || st.Mode().Perm() != 0o600 {
		t.Errorf("log file mode %v (%v), want 0600", st.Mode(), err)
	}
}

func TestWarningsAndErrorsGoToStderr(t *testing.T) {
	for _, level := range []string{"debug", "info", "warn"} {
		t.Run(level, func(t *testing.T) {
			var file, stderr bytes.Buffer
			l := NewWriter(&file, level)
			l.prefix = "[abc] "
			l.stderr = &stderr
			logAll(l)
			want := "rdma-netns: warn: [abc] warn 3\nrdma-netns: error: [abc] error 4\n"
			if stderr.String() != want {
				t.Errorf("stderr = %q, want %q", stderr.String(), want)
			}
		})
	}
	t.Run("error", func(t *testing.T) {
		var stderr bytes.Buffer
		l := NewWriter(io.Discard, "error")
		l.stderr = &stderr
		logAll(l)
		if want := "rdma-netns: error: error 4\n"; stderr.String() != want {
			t.Errorf("stderr = %q, want %q", stderr.String(), want)
		}
	})
	t.Run("no log file", func(t *testing.T) {
		// Without a log file, warnings still reach the runtime.
		var stderr bytes.Buffer
		l := New("", "info", "")
		l.stderr = &stderr
		logAll(l)
		if want := "rdma-netns: warn: warn 3\nrdma-netns: error: error 4\n"; stderr.String() != want {
			t.Errorf("stderr = %q, want %q", stderr.String(), want)
		}
	})
}

func TestNewUsesProcessStderr(t *testing.T) {
	var l *Logger
	out := capture(t, &os.Stderr, func() {
		l = New("", "debug", "")
		logAll(l)
	})
	if want := "rdma-netns: warn: warn 3\nrdma-netns: error: error 4\n"; out != want {
		t.Errorf("stderr = %q, want %q", out, want)
	}
}

// Stdout carries the CNI result: a single stray byte corrupts it.
func TestNothingOnStdout(t *testing.T) {
	dir := inDir(t)
	out := capture(t, &os.Stdout, func() {
		stderr := capture(t, &os.Stderr, func() {
			for _, l := range []*Logger{
				New(filepath.Join(dir, "ok.log"), "debug", "[p] "),
				New("", "debug", ""),
				New(filepath.Join(dir, "missing", "dir", "x.log"), "debug", ""),
				NewWriter(io.Discard, "debug"),
				Discard(),
				nil,
			} {
				logAll(l)
			}
		})
		if stderr == "" {
			t.Error("expected warnings on stderr")
		}
	})
	if out != "" {
		t.Errorf("stdout received %q", out)
	}
}

func TestUnopenableLogFile(t *testing.T) {
	dir := inDir(t)
	outside := t.TempDir()
	if err := os.Mkdir(filepath.Join(dir, "a-dir.log"), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Mkfifo(filepath.Join(dir, "fifo.log"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(filepath.Join(outside, "target"), filepath.Join(dir, "link.log")); err != nil {
		t.Fatal(err)
	}
	for name, path := range map[string]string{
		"a directory":       filepath.Join(dir, "a-dir.log"),
		"a FIFO, no reader": filepath.Join(dir, "fifo.log"),
		"a symbolic link":   filepath.Join(dir, "link.log"),
		"missing directory": filepath.Join(outside, "no", "such", "dir", "x.log"),
	} {
		t.Run(name, func(t *testing.T) {
			var l *Logger
			stderr := capture(t, &os.Stderr, func() {
				l = New(path, "debug", "")
				if l == nil {
					t.Fatal("New returned nil")
				}
				logAll(l)
			})
			if !strings.Contains(stderr, "cannot open log file "+path) {
				t.Errorf("stderr %q does not report the log file", stderr)
			}
			// Logging carries on: warnings and errors still reach stderr.
			if !strings.Contains(stderr, "rdma-netns: error: error 4") || !strings.Contains(stderr, "rdma-netns: warn: warn 3") {
				t.Errorf("stderr %q lacks the logged warnings", stderr)
			}
			if strings.Contains(stderr, "info 2") {
				t.Errorf("info went to stderr: %q", stderr)
			}
		})
	}
	// Nothing was created through the link, nor a directory made outside
	// the node's.
	if ents, _ := os.ReadDir(outside); len(ents) != 0 {
		t.Errorf("written outside the log directory: %v", ents)
	}
}

// Allowed takes a plain name directly in the node's directory, however the
// path is spelled, and nothing else.
func TestAllowed(t *testing.T) {
	dir := inDir(t)
	for path, want := range map[string]bool{
		dir + "/rdma-net.log":               true,
		dir + "//x.log":                     true,
		dir + "/./x.log":                    true,
		dir:                                 false,
		dir + "/":                           false,
		dir + "/sub/x.log":                  false,
		dir + "/../x.log":                   false,
		dir + "/../../../etc/ld.so.preload": false,
		"/etc/ld.so.preload":                false,
		"x.log":                             false,
	} {
		if got := Allowed(path); got != want {
			t.Errorf("Allowed(%q) = %v, want %v", path, got, want)
		}
	}
}

func TestDiscardAndNil(t *testing.T) {
	var nilLogger *Logger
	logAll(nilLogger) // must not panic
	out := capture(t, &os.Stderr, func() { logAll(Discard()) })
	if out != "" {
		t.Errorf("Discard wrote %q to stderr", out)
	}
}

func TestConcurrentLinesStayWhole(t *testing.T) {
	var buf bytes.Buffer
	l := NewWriter(&buf, "debug")
	var wg sync.WaitGroup
	const goroutines, per = 8, 200
	for g := 0; g < goroutines; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < per; i++ {
				l.Infof("goroutine %d line %d %s", g, i, strings.Repeat("x", 100))
			}
		}()
	}
	wg.Wait()
	lines := strings.Split(strings.TrimSuffix(buf.String(), "\n"), "\n")
	if len(lines) != goroutines*per {
		t.Fatalf("got %d lines, want %d", len(lines), goroutines*per)
	}
	re := regexp.MustCompile(`^\S+ INFO goroutine \d+ line \d+ x{100}$`)
	for _, line := range lines {
		if !re.MatchString(line) {
			t.Fatalf("interleaved line %q", line)
		}
	}
}
