package install

import (
	"bufio"
	"bytes"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// The test binary stands in for rdma-netns: it is what os.Executable
// returns in Main, so the copy it installs must answer CNI VERSION like the
// plugin, and it runs Main itself for the tests that need a process.
func TestMain(m *testing.M) {
	switch {
	case os.Getenv("CNI_COMMAND") == "VERSION":
		io.Copy(io.Discard, os.Stdin)
		fmt.Print(`{"cniVersion":"1.0.0","supportedVersions":["0.4.0","1.0.0"]}`)
		os.Exit(0)
	case len(os.Args) == 3 && os.Args[1] == "--check-config":
		// Stands in for rdma-netns-nri --check-config (its own tests,
		// and the VM's install test, run the real one).
		data, _ := os.ReadFile(os.Args[2])
		if strings.Contains(string(data), "--bad") {
			fmt.Println("rdma-netns-nri: flag provided but not defined: -bad")
			os.Exit(1)
		}
		fmt.Println(NRIConfigOK, "memlock unlimited, /dev/shm 1Gi")
		os.Exit(0)
	case os.Getenv("INSTALL_TEST_RUN_MAIN") != "":
		os.Exit(Main(os.Args[1:], "test", os.Stdout, os.Stderr))
	}
	os.Exit(m.Run())
}

func self(t *testing.T) string {
	t.Helper()
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	return exe
}

func writeFile(t *testing.T, path, content string, mode os.FileMode) {
	t.Helper()
	if err := os.WriteFile(path, []byte(content), mode); err != nil {
		t.Fatal(err)
	}
}

// entries lists dir, to show that no temporary file is left behind.
func entries(t *testing.T, dir string) []string {
	t.Helper()
	des, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, de := range des {
		names = append(names, de.Name())
	}
	return names
}

func sameContent(t *testing.T, a, b string) bool {
	t.Helper()
	x, err := os.ReadFile(a)
	if err != nil {
		t.Fatal(err)
	}
	y, err := os.ReadFile(b)
	if err != nil {
		t.Fatal(err)
	}
	return bytes.Equal(x, y)
}

func TestInstallFresh(t *testing.T) {
	dir := t.TempDir()
	version, err := Install(self(t), dir, "rdma-netns")
	if err != nil {
		t.Fatal(err)
	}
	if version != "0.4.0, 1.0.0" {
		t.Errorf("reported versions %q, want those the copy answered", version)
	}
	target := filepath.Join(dir, "rdma-netns")
	fi, err := os.Stat(target)
	if err != nil {
		t.Fatal(err)
	}
	if fi.Mode() != 0o755 {
		t.Errorf("mode %v, want -rwxr-xr-x", fi.Mode())
	}
	if !sameContent(t, self(t), target) {
		t.Error("installed file differs from the binary")
	}
	if got := entries(t, dir); len(got) != 1 {
		t.Errorf("directory holds %v, want only rdma-netns", got)
	}
}

// A plugin run in progress holds the old file open (the kernel maps it):
// the old inode must survive the replacement intact.
func TestInstallReplacesAtomically(t *testing.T) {
	dir := t.TempDir()
	target := filepath.Join(dir, "rdma-netns")
	writeFile(t, target, "old plugin", 0o700)
	running, err := os.Open(target)
	if err != nil {
		t.Fatal(err)
	}
	defer running.Close()
	before, _ := running.Stat()

	if _, err := Install(self(t), dir, "rdma-netns"); err != nil {
		t.Fatal(err)
	}
	after, err := os.Stat(target)
	if err != nil {
		t.Fatal(err)
	}
	if os.SameFile(before, after) {
		t.Fatal("the old file was overwritten in place, not replaced: a plugin run in progress would read the new bytes")
	}
	if after.Mode() != 0o755 || !sameContent(t, self(t), target) {
		t.Errorf("after replacing: mode %v, content of the binary %v", after.Mode(), sameContent(t, self(t), target))
	}
	old, err := io.ReadAll(running)
	if err != nil || string(old) != "old plugin" {
		t.Errorf("the open old file reads %q, %v", old, err)
	}
	if got := entries(t, dir); len(got) != 1 {
		t.Errorf("directory holds %v, want only rdma-netns", got)
	}
}

// unchanged checks that a failed install left the old binary and nothing
// else.
func unchanged(t *testing.T, dir, content string) {
	t.Helper()
	got, err := os.ReadFile(filepath.Join(dir, "rdma-netns"))
	if err != nil || string(got) != content {
		t.Errorf("old binary now reads %q, %v; want %q", got, err, content)
	}
	if names := entries(t, dir); len(names) != 1 {
		t.Errorf("directory holds %v, want only the old rdma-netns", names)
	}
}

func wantError(t *testing.T, err error, parts ...string) {
	t.Helper()
	if err == nil {
		t.Fatalf("installed, want an error containing %q", parts)
	}
	for _, p := range parts {
		if !strings.Contains(err.Error(), p) {
			t.Errorf("error %q does not contain %q", err, p)
		}
	}
	t.Logf("error: %v", err)
}

func TestInstallBadDestination(t *testing.T) {
	missing := filepath.Join(t.TempDir(), "opt/cni/bin")
	_, err := Install(self(t), missing, "rdma-netns")
	wantError(t, err, missing, "does not exist", "mount the host's CNI bin directory")
	if _, err := os.Stat(missing); !os.IsNotExist(err) {
		t.Errorf("install created %s: %v", missing, err)
	}

	file := filepath.Join(t.TempDir(), "rdma-netns")
	writeFile(t, file, "old plugin", 0o755)
	_, err = Install(self(t), file, "rdma-netns")
	wantError(t, err, file, "is not a directory")
}

// mountTmpfs mounts a fresh tmpfs on a temporary directory: a filesystem
// the test can make read-only or noexec. Root ignores mode bits, so only a
// mount makes a directory unwritable for it.
func mountTmpfs(t *testing.T, flags uintptr) string {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("mounting a tmpfs needs root (make unit runs as root)")
	}
	dir := t.TempDir()
	if err := syscall.Mount("tmpfs", dir, "tmpfs", flags, "size=64m,mode=0755"); err != nil {
		t.Fatalf("mount tmpfs on %s: %v", dir, err)
	}
	t.Cleanup(func() { syscall.Unmount(dir, syscall.MNT_DETACH) })
	return dir
}

func TestInstallReadOnly(t *testing.T) {
	dir := mountTmpfs(t, 0)
	writeFile(t, filepath.Join(dir, "rdma-netns"), "old plugin", 0o755)
	if err := syscall.Mount("", dir, "", syscall.MS_REMOUNT|syscall.MS_RDONLY, ""); err != nil {
		t.Fatal(err)
	}
	_, err := Install(self(t), dir, "rdma-netns")
	wantError(t, err, "cannot create a file in "+dir, "read-only", "readOnly: false")
	unchanged(t, dir, "old plugin")
}

func TestInstallCopyDoesNotRun(t *testing.T) {
	dir := mountTmpfs(t, syscall.MS_NOEXEC)
	writeFile(t, filepath.Join(dir, "rdma-netns"), "old plugin", 0o755)
	_, err := Install(self(t), dir, "rdma-netns")
	wantError(t, err, "does not run CNI VERSION", "noexec", "unchanged")
	unchanged(t, dir, "old plugin")
}

func TestInstallCopyIsNotAPlugin(t *testing.T) {
	src := filepath.Join(t.TempDir(), "script")
	writeFile(t, src, "#!/bin/sh\necho hello\n", 0o755)
	dir := t.TempDir()
	writeFile(t, filepath.Join(dir, "rdma-netns"), "old plugin", 0o755)
	_, err := Install(src, dir, "rdma-netns")
	wantError(t, err, `answers CNI VERSION with "hello\n"`, "unchanged")
	unchanged(t, dir, "old plugin")
}

func runMain(args ...string) (int, string, string) {
	var stdout, stderr bytes.Buffer
	rc := Main(args, "v0.0.0-test", &stdout, &stderr)
	return rc, stdout.String(), stderr.String()
}

func TestMainCommandLine(t *testing.T) {
	dir := t.TempDir()
	rc, out, errOut := runMain("--dest", dir, "--name", "other")
	if rc != 0 || out != fmt.Sprintf("installed %s (v0.0.0-test, CNI versions 0.4.0, 1.0.0)\n", filepath.Join(dir, "other")) {
		t.Fatalf("exit %d, stdout %q, stderr %q", rc, out, errOut)
	}
	if _, err := os.Stat(filepath.Join(dir, "other")); err != nil {
		t.Fatal(err)
	}

	rc, _, errOut = runMain("--dest", filepath.Join(dir, "missing"))
	if rc != 1 || !strings.Contains(errOut, "rdma-netns install: destination directory") {
		t.Errorf("missing destination: exit %d, stderr %q", rc, errOut)
	}
	for _, args := range [][]string{
		{"--dest", dir, "extra"},
		{"--name", "../rdma-netns", "--dest", dir},
		{"--name", "", "--dest", dir},
		{"--destination", dir},
	} {
		if rc, _, errOut := runMain(args...); rc != 2 || errOut == "" {
			t.Errorf("%q: exit %d, stderr %q; want a usage error", args, rc, errOut)
		}
	}
	if rc, _, errOut := runMain("--help"); rc != 0 || !strings.Contains(errOut, "Usage: rdma-netns install") {
		t.Errorf("--help: exit %d, %q", rc, errOut)
	}
	if got := entries(t, dir); len(got) != 1 {
		t.Errorf("directory holds %v after the failed runs", got)
	}
}

// --then-wait keeps the process (a DaemonSet's container) alive after the
// install until the kubelet's SIGTERM, then exits 0.
func TestThenWait(t *testing.T) {
	dir := t.TempDir()
	cmd := exec.Command(self(t), "--dest", dir, "--then-wait")
	cmd.Env = append(os.Environ(), "INSTALL_TEST_RUN_MAIN=1")
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	line, err := bufio.NewReader(stdout).ReadString('\n')
	if err != nil || !strings.HasPrefix(line, "installed ") {
		cmd.Process.Kill()
		t.Fatalf("first line %q, %v", line, err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	select {
	case err := <-exited:
		t.Fatalf("exited after installing (%v), want it to wait", err)
	case <-time.After(300 * time.Millisecond):
	}
	cmd.Process.Signal(syscall.SIGTERM)
	select {
	case err := <-exited:
		if err != nil {
			t.Errorf("after SIGTERM: %v, want exit 0", err)
		}
	case <-time.After(10 * time.Second):
		cmd.Process.Kill()
		t.Fatal("still running 10s after SIGTERM")
	}
}

// --nri installs the NRI plugin and its configuration (the flags after
// the install flags), both checked by the copy, replacing a copy under
// another index; running it again changes nothing; flags the plugin
// rejects leave everything as it was.
func TestInstallNRI(t *testing.T) {
	dir := t.TempDir()
	cni, plugins, confd := filepath.Join(dir, "bin"), filepath.Join(dir, "plugins"), filepath.Join(dir, "conf.d")
	os.Mkdir(cni, 0o755)
	os.Mkdir(plugins, 0o755)
	writeFile(t, filepath.Join(plugins, "50-rdma-netns-nri"), "old", 0o755)
	writeFile(t, filepath.Join(plugins, "20-other-plugin"), "theirs", 0o755)
	args := []string{"--dest", cni, "--nri", self(t), "--nri-plugin-dir", plugins, "--nri-conf-dir", confd, "--", "--memlock", "unlimited", "--shm-size", "1Gi"}
	for range 2 {
		rc, out, errOut := runMain(args...)
		if rc != 0 || !strings.Contains(out, "installed "+filepath.Join(plugins, "10-rdma-netns-nri")+" and "+filepath.Join(confd, "10-rdma-netns-nri.conf")+" (memlock unlimited, /dev/shm 1Gi)") {
			t.Fatalf("exit %d, stdout %q, stderr %q", rc, out, errOut)
		}
		if got := entries(t, plugins); strings.Join(got, " ") != "10-rdma-netns-nri 20-other-plugin" {
			t.Fatalf("plugin directory holds %v", got)
		}
		if got := entries(t, confd); strings.Join(got, " ") != "10-rdma-netns-nri.conf" {
			t.Fatalf("configuration directory holds %v", got)
		}
	}
	conf, _ := os.ReadFile(filepath.Join(confd, "10-rdma-netns-nri.conf"))
	if !strings.HasSuffix(string(conf), "\n--memlock\nunlimited\n--shm-size\n1Gi\n") {
		t.Fatalf("configuration:\n%s", conf)
	}
	fi, err := os.Stat(filepath.Join(plugins, "10-rdma-netns-nri"))
	if err != nil || fi.Mode().Perm() != 0o755 {
		t.Fatalf("installed plugin: %v, %v", fi, err)
	}

	before, _ := os.ReadFile(filepath.Join(confd, "10-rdma-netns-nri.conf"))
	rc, _, errOut := runMain("--dest", cni, "--nri", self(t), "--nri-plugin-dir", plugins, "--nri-conf-dir", confd, "--nri-index", "30", "--", "--bad")
	if rc != 1 || !strings.Contains(errOut, "the NRI plugin rejects its flags: rdma-netns-nri: flag provided but not defined: -bad") {
		t.Fatalf("bad flags: exit %d, stderr %q", rc, errOut)
	}
	after, _ := os.ReadFile(filepath.Join(confd, "10-rdma-netns-nri.conf"))
	if got := entries(t, plugins); strings.Join(got, " ") != "10-rdma-netns-nri 20-other-plugin" || !bytes.Equal(before, after) {
		t.Fatalf("a rejected configuration changed the directories: %v", got)
	}
	if got := entries(t, confd); len(got) != 1 {
		t.Fatalf("temporary files left: %v", got)
	}
	for _, bad := range [][]string{
		{"--dest", cni, "--", "--shm-size", "1Gi"},
		{"--dest", cni, "--nri", self(t), "--nri-index", "1", "--nri-plugin-dir", plugins},
	} {
		if rc, _, errOut := runMain(bad...); rc == 0 || errOut == "" {
			t.Errorf("%q: exit %d, stderr %q; want an error", bad, rc, errOut)
		}
	}
}
