// Package scripts holds the tests of the test VM's shell scripts that run
// without a VM (make unit).
package scripts

import (
	"bufio"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// kernelSet runs kernel-set.sh against apt-cache outputs recorded in
// testdata/kernel-set/DAY (testdata/kernel-set/apt-cache answers from them).
func kernelSet(t *testing.T, day string, env ...string) (map[string]string, string, error) {
	t.Helper()
	for _, tool := range []string{"bash", "dpkg"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Skipf("kernel-set.sh needs %s (Debian's): %v", tool, err)
		}
	}
	fake, _ := filepath.Abs("testdata/kernel-set/apt-cache")
	fixture, _ := filepath.Abs(filepath.Join("testdata/kernel-set", day))
	cmd := exec.Command("bash", "kernel-set.sh")
	cmd.Env = append(os.Environ(), "APT_CACHE="+fake, "APT_FIXTURE="+fixture, "VM_KERNEL_VERSION=")
	cmd.Env = append(cmd.Env, env...)
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	set := map[string]string{}
	// The script prints bash's %q; these values only quote spaces and
	// punctuation in NOTE, which the test does not compare.
	sc := bufio.NewScanner(strings.NewReader(string(out)))
	for sc.Scan() {
		if k, v, ok := strings.Cut(sc.Text(), "="); ok {
			set[k] = v
		}
	}
	return set, stderr.String(), err
}

// held reports whether the recorded archive of DAY offers PKG at VERSION:
// what `apt-get download PKG=VERSION` needs.
func held(t *testing.T, day, pkg, version string) bool {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("testdata/kernel-set", day, "madison_"+pkg))
	if err != nil {
		return false
	}
	for _, line := range strings.Split(string(b), "\n") {
		f := strings.Split(line, "|")
		if len(f) >= 2 && strings.TrimSpace(f[0]) == pkg && strings.TrimSpace(f[1]) == version {
			return true
		}
	}
	return false
}

// downloads is what vm-prepare.sh asks apt-get download for.
func downloads(set map[string]string) [][2]string {
	return [][2]string{
		{set["IMAGE_PKG"], set["KVER"]},
		{set["HEADERS_PKG"], set["KVER"]},
		{set["COMMON_PKG"], set["KVER"]},
		{set["KBUILD_PKG"], set["KBUILD_VER"]},
		{set["SOURCE_PKG"], set["SOURCE_VER"]},
	}
}

func TestKernelSetTheArchiveHolds(t *testing.T) {
	for _, tc := range []struct {
		day, pin                 string
		image, kver, kbuild, src string
	}{
		// 2026-11-28: the signed image still at -2, kbuild only at -3.
		{day: "window-2026-11-28", image: "linux-image-6.1.0-56-amd64", kver: "6.1.192-2", kbuild: "6.1.192-3", src: "6.1.192-2"},
		{day: "ordinary", image: "linux-image-6.1.0-56-amd64", kver: "6.1.192-2", kbuild: "6.1.192-2", src: "6.1.192-2"},
		{day: "main-only", image: "linux-image-6.1.0-50-amd64", kver: "6.1.176-1", kbuild: "6.1.176-1", src: "6.1.176-1"},
		// No source of the new kernel's release at all: the older image
		// whose whole set is there.
		{day: "no-source", image: "linux-image-6.1.0-50-amd64", kver: "6.1.176-1", kbuild: "6.1.176-1", src: "6.1.176-1"},
		{day: "window-2026-11-28", pin: "6.1.176-1", image: "linux-image-6.1.0-50-amd64", kver: "6.1.176-1", kbuild: "6.1.176-1", src: "6.1.176-1"},
	} {
		name := tc.day
		if tc.pin != "" {
			name += "/pinned-" + tc.pin
		}
		t.Run(name, func(t *testing.T) {
			set, stderr, err := kernelSet(t, tc.day, "VM_KERNEL_VERSION="+tc.pin)
			if err != nil {
				t.Fatalf("kernel-set.sh: %v: %s", err, stderr)
			}
			if set["IMAGE_PKG"] != tc.image || set["KVER"] != tc.kver || set["KBUILD_VER"] != tc.kbuild || set["SOURCE_VER"] != tc.src {
				t.Errorf("chose %s %s, kbuild %s, source %s; want %s %s, kbuild %s, source %s",
					set["IMAGE_PKG"], set["KVER"], set["KBUILD_VER"], set["SOURCE_VER"], tc.image, tc.kver, tc.kbuild, tc.src)
			}
			for _, d := range downloads(set) {
				if !held(t, tc.day, d[0], d[1]) {
					t.Errorf("chose %s=%s, which the archive does not offer: apt-get download fails", d[0], d[1])
				}
			}
		})
	}
}

// d0fd326's vm-prepare.sh asked for all five packages at the image's
// version; on 2026-11-28 that set was not in the archive. The check above
// must say so (it is what failed make demo on a new machine).
func TestKernelSetOldRuleFailsTheWindow(t *testing.T) {
	set, stderr, err := kernelSet(t, "window-2026-11-28")
	if err != nil {
		t.Fatalf("kernel-set.sh: %v: %s", err, stderr)
	}
	old := map[string]string{}
	for k, v := range set {
		old[k] = v
	}
	old["KBUILD_VER"], old["SOURCE_VER"] = set["KVER"], set["KVER"]
	var missing []string
	for _, d := range downloads(old) {
		if !held(t, "window-2026-11-28", d[0], d[1]) {
			missing = append(missing, d[0]+"="+d[1])
		}
	}
	if len(missing) != 1 || missing[0] != "linux-kbuild-6.1=6.1.192-2" {
		t.Errorf("the image's version for every package: missing %v, want [linux-kbuild-6.1=6.1.192-2]", missing)
	}
}

func TestKernelSetFailsInOneLine(t *testing.T) {
	for _, tc := range []struct{ name, day, pin, want string }{
		{"no lists", "none", "", "run apt-get update"},
		{"a pin the archive lacks", "window-2026-11-28", "6.1.99-1", "offered: 6.1.176-1 6.1.192-2"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			set, stderr, err := kernelSet(t, tc.day, "VM_KERNEL_VERSION="+tc.pin)
			if err == nil {
				t.Fatalf("kernel-set.sh passed with %v", set)
			}
			if n := strings.Count(strings.TrimRight(stderr, "\n"), "\n"); n != 0 || !strings.Contains(stderr, tc.want) {
				t.Errorf("stderr %q: want one line containing %q", stderr, tc.want)
			}
		})
	}
}
