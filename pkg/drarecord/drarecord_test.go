package drarecord

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

const (
	podA = "7f3c9a62-0b1d-4a8e-9c55-2f6d1e0a4b01"
	podB = "0c4e2d8f-5a7b-4e19-8d3c-6b1f9e2a7c02"
)

func claim(uid, pod, podClaim, name string, devs ...Device) *Claim {
	return &Claim{Version: Version, ClaimUID: uid, ClaimNamespace: "ns", ClaimName: name, PodClaimName: podClaim,
		PodUID: pod, PodNamespace: "ns", PodName: "p", Devices: devs}
}

func dev(req, pci string) Device {
	return Device{Request: req, Pool: "node1", Device: "pci-" + pci, PCIAddress: pci}
}

// A record written is read back whole, replaced by a later Write of the
// same claim, and gone after Remove; removing it again is no error.
func TestWriteLoadRemove(t *testing.T) {
	d := Dir(t.TempDir())
	c := claim("c1", podA, "nics", "p-nics-x1", dev("nics", "0000:00:05.0"))
	if err := d.Write(c); err != nil {
		t.Fatal(err)
	}
	got, ok, err := d.Load("c1")
	if err != nil || !ok || got.PodUID != podA || len(got.Devices) != 1 || got.Devices[0].PCIAddress != "0000:00:05.0" {
		t.Fatalf("Load = %+v, %v, %v", got, ok, err)
	}
	st, err := os.Stat(filepath.Join(string(d), "c1.json"))
	if err != nil || st.Mode().Perm() != filePerm {
		t.Fatalf("record file: %v, mode %v; want %o", err, st, filePerm)
	}
	c.Devices = append(c.Devices, dev("nics", "0000:00:06.0"))
	if err := d.Write(c); err != nil {
		t.Fatal(err)
	}
	if got, _, _ := d.Load("c1"); len(got.Devices) != 2 {
		t.Fatalf("after a second Write: %+v, want 2 devices", got)
	}
	ents, _ := os.ReadDir(string(d))
	if len(ents) != 1 {
		t.Fatalf("directory holds %d files after two writes, want 1 (no temporary files left)", len(ents))
	}
	if err := d.Remove("c1"); err != nil {
		t.Fatal(err)
	}
	if _, ok, err := d.Load("c1"); ok || err != nil {
		t.Fatalf("Load after Remove: ok=%v err=%v", ok, err)
	}
	if err := d.Remove("c1"); err != nil {
		t.Fatalf("Remove of a claim not recorded: %v", err)
	}
}

// Write refuses what the plugin could not use; nothing reaches the disk.
func TestWriteRefusesBadRecords(t *testing.T) {
	d := Dir(t.TempDir())
	for name, c := range map[string]*Claim{
		"old version":    {Version: 0, ClaimUID: "c1", PodUID: podA},
		"path claim UID": claim("../c1", podA, "", "x"),
		"no pod UID":     claim("c1", "", "", "x"),
		"no PCI address": claim("c1", podA, "", "x", Device{Request: "nics"}),
		"no request":     claim("c1", podA, "", "x", Device{PCIAddress: "0000:00:05.0"}),
	} {
		if err := d.Write(c); err == nil {
			t.Errorf("%s: Write accepted %+v", name, c)
		}
	}
	if ents, _ := os.ReadDir(string(d)); len(ents) != 0 {
		t.Fatalf("refused records left %d files", len(ents))
	}
}

// A damaged record, one under another claim's name, a temporary file and
// a file that is not a record never hide the records that are whole.
func TestListSkipsDamagedRecords(t *testing.T) {
	d := Dir(t.TempDir())
	for _, c := range []*Claim{claim("c2", podA, "b", "x"), claim("c1", podB, "a", "y")} {
		if err := d.Write(c); err != nil {
			t.Fatal(err)
		}
	}
	put := func(name, data string) {
		if err := os.WriteFile(filepath.Join(string(d), name), []byte(data), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	put("c3.json", `{"version":1,"claimUID":"c3","podUID":`)
	put("c4.json", `{"version":1,"claimUID":"c9","podUID":"`+podA+`"}`)
	put("c5.json", `{"version":2,"claimUID":"c5","podUID":"`+podA+`"}`)
	put(tmpMark+"c6-123", `garbage`)
	put("inventory.json.bak", `garbage`)
	if err := os.Mkdir(filepath.Join(string(d), "devices"), 0o700); err != nil {
		t.Fatal(err)
	}
	claims, bad, err := d.List()
	if err != nil {
		t.Fatal(err)
	}
	if len(claims) != 2 || claims[0].ClaimUID != "c1" || claims[1].ClaimUID != "c2" {
		t.Fatalf("List = %+v, want c1 and c2 in that order", claims)
	}
	if len(bad) != 3 {
		t.Fatalf("bad = %q, want c3 (truncated), c4 (another claim), c5 (version)", bad)
	}
	for i, want := range []string{"c3.json", "c4.json: holds claim c9", "c5.json"} {
		if !strings.Contains(bad[i], want) {
			t.Errorf("bad[%d] = %q, want it to name %q", i, bad[i], want)
		}
	}
	if claims, bad, err := Dir(filepath.Join(string(d), "none")).List(); claims != nil || bad != nil || err != nil {
		t.Fatalf("List of a missing directory = %v, %v, %v; want nothing", claims, bad, err)
	}
}

// A pod's devices come in the order of its claims' names in the pod, each
// claim's in allocation order, whatever the claim UIDs; other pods'
// devices never show.
func TestPodDevicesOrder(t *testing.T) {
	d := Dir(t.TempDir())
	for _, c := range []*Claim{
		claim("a-uid", podA, "nics2", "p-nics2-q", dev("nics2", "0000:00:09.0")),
		claim("b-uid", podA, "nics1", "p-nics1-z", dev("nics1", "0000:00:07.0"), dev("nics1", "0000:00:06.0")),
		claim("c-uid", podB, "nics0", "q-nics0-a", dev("nics0", "0000:00:05.0")),
		claim("d-uid", podA, "", "fixed", dev("direct", "0000:00:08.0")),
	} {
		if err := d.Write(c); err != nil {
			t.Fatal(err)
		}
	}
	devs, claims, err := d.PodDevices(podA)
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, x := range devs {
		got = append(got, x.PCIAddress)
	}
	want := "0000:00:08.0 0000:00:07.0 0000:00:06.0 0000:00:09.0"
	if strings.Join(got, " ") != want {
		t.Fatalf("PodDevices = %s, want %s", strings.Join(got, " "), want)
	}
	if len(claims) != 3 {
		t.Fatalf("claims = %d, want pod A's 3", len(claims))
	}
	if devs, _, err := d.PodDevices("e5a1c0de-0000-4000-8000-000000000000"); devs != nil || err != nil {
		t.Fatalf("a pod without records: %v, %v", devs, err)
	}
}

// A pod UID that could name a path is refused before anything is read:
// the directory here does not exist, and would make List fail otherwise.
func TestCheckPodUID(t *testing.T) {
	d := Dir("/proc/self/fd/0/not-a-dir")
	for _, uid := range []string{"", "../x", "a/b", "..", ".", "x\x00y", "a b", strings.Repeat("a", 65), "uid.json"} {
		if err := CheckPodUID(uid); err == nil {
			t.Errorf("CheckPodUID(%q) accepted", uid)
		}
		if _, _, err := d.PodDevices(uid); err == nil || !strings.Contains(err.Error(), "pod UID") {
			t.Errorf("PodDevices(%q) = %v, want a refusal of the pod UID", uid, err)
		}
	}
	if err := CheckPodUID(podA); err != nil {
		t.Errorf("CheckPodUID(%q): %v", podA, err)
	}
	for _, uid := range []string{"../c1", "a/b"} {
		if _, _, err := d.Load(uid); err == nil {
			t.Errorf("Load(%q) accepted", uid)
		}
		if err := d.Remove(uid); err == nil {
			t.Errorf("Remove(%q) accepted", uid)
		}
	}
}

// Pick takes the index-th device of a request (its subrequests included),
// or of all the pod's devices; a miss names the pod's own requests only.
func TestPick(t *testing.T) {
	devs := []Device{dev("nics", "A"), dev("gpu-nic/fast", "B"), dev("nics", "C"), dev("gpu-nic/slow", "D")}
	for _, tt := range []struct {
		request string
		index   int
		want    string
	}{
		{"", 0, "A"}, {"", 1, "B"}, {"", 3, "D"},
		{"nics", 0, "A"}, {"nics", 1, "C"},
		{"gpu-nic", 0, "B"}, {"gpu-nic", 1, "D"},
		{"gpu-nic/slow", 0, "D"},
	} {
		got, err := Pick(devs, tt.request, tt.index)
		if err != nil || got.PCIAddress != tt.want {
			t.Errorf("Pick(%q, %d) = %s, %v; want %s", tt.request, tt.index, got.PCIAddress, err, tt.want)
		}
	}
	for _, tt := range []struct {
		request string
		index   int
	}{{"nics", 2}, {"", 4}, {"", -1}, {"gpu", 0}, {"nic", 0}, {"gpu-nic/fa", 0}} {
		_, err := Pick(devs, tt.request, tt.index)
		if err == nil {
			t.Fatalf("Pick(%q, %d) succeeded", tt.request, tt.index)
		}
		if !strings.Contains(err.Error(), `"nics" (2), "gpu-nic/fast" (1), "gpu-nic/slow" (1)`) {
			t.Errorf("Pick(%q, %d): %q does not list the pod's requests", tt.request, tt.index, err)
		}
	}
	_, err := Pick(nil, "nics", 0)
	if err == nil || !strings.Contains(err.Error(), "requests: none") || !strings.Contains(err.Error(), DriverName) {
		t.Errorf("Pick of no devices: %v", err)
	}
	// Another pod's devices are not the pod's: the caller passes only
	// PodDevices, and the error lists what it was given, nothing else.
	_, err = Pick([]Device{dev("mine", "A")}, "theirs", 0)
	if err == nil || strings.Contains(err.Error(), "nics") || !strings.Contains(err.Error(), `"mine" (1)`) {
		t.Errorf("Pick error %v names more than the pod's requests", err)
	}
}
