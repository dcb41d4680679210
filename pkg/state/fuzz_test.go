package state

import (
	"bytes"
	"errors"
	"testing"
)

func FuzzDecodeRecord(f *testing.F) {
	seeds := []string{
		`{"version":1,"network":"rdma-net","containerID":"` + k8sContainerID + `","ifName":"net1","netns":"/var/run/netns/cni-1","rdmaDevice":"mlx5_0","state":"attached","created":"2025-01-02T03:04:05.123456789Z"}`,
		`{"version":1,"network":"n","containerID":"c","ifName":"net1","netns":"/proc/1/ns/net","rdmaDevice":"mlx5_0","podDevName":"rdma0","devPath":"/sys/devices/pci0000:00/0000:00:02.0","pciAddress":"0000:00:02.0","rule":"pci","state":"moving","created":"2025-01-02T03:04:05+02:00"}`,
		`{"version":2}`,
		`{"version":1,"network":"../x","containerID":"c","ifName":"net1","netns":"/n","rdmaDevice":"mlx5_0","state":"attached","created":"0001-01-01T00:00:00Z"}`,
		`null`,
		`[]`,
		`{`,
		``,
	}
	for _, s := range seeds {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		r, err := DecodeRecord(data)
		if err != nil {
			if !errors.Is(err, ErrCorrupt) {
				t.Fatalf("DecodeRecord error %v does not match ErrCorrupt", err)
			}
			return
		}
		// Whatever decodes must be something Put would write...
		if err := r.validate(); err != nil {
			t.Fatalf("decoded record fails validation: %v", err)
		}
		enc, err := r.encode()
		if err != nil {
			t.Fatalf("decoded record does not encode: %v", err)
		}
		// ...and must survive a round trip unchanged.
		r2, err := DecodeRecord(enc)
		if err != nil {
			t.Fatalf("re-decoding %s: %v", enc, err)
		}
		if !r2.Created.Equal(r.Created) {
			t.Fatalf("Created changed in round trip: %v -> %v", r.Created, r2.Created)
		}
		enc2, err := r2.encode()
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(enc, enc2) {
			t.Fatalf("round trip not stable:\n%s\n%s", enc, enc2)
		}
		c1, c2 := *r, *r2
		c1.Created = c2.Created
		if c1 != c2 {
			t.Fatalf("round trip changed the record: %+v -> %+v", r, r2)
		}
	})
}
