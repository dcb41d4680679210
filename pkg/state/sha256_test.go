package state

import (
	"crypto/sha256"
	"math/rand/v2"
	"testing"
)

// Record file names must stay what crypto/sha256 made them, or an upgraded
// plugin would no longer find the records of pods attached before it.
func TestSum256(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	// Every length across the padding boundaries (55/56/64 bytes) and a few
	// blocks further, then random longer inputs.
	var inputs [][]byte
	for n := 0; n <= 200; n++ {
		b := make([]byte, n)
		for i := range b {
			b[i] = byte(rng.Uint32())
		}
		inputs = append(inputs, b)
	}
	for i := 0; i < 50; i++ {
		b := make([]byte, rng.IntN(5000))
		for j := range b {
			b[j] = byte(rng.Uint32())
		}
		inputs = append(inputs, b)
	}
	for _, in := range inputs {
		if got, want := sum256(in), sha256.Sum256(in); got != want {
			t.Fatalf("sum256 of %d bytes = %x, crypto/sha256 says %x", len(in), got, want)
		}
	}
}

func FuzzSum256(f *testing.F) {
	f.Add([]byte("net\x00c0ffee\x00net1"))
	f.Fuzz(func(t *testing.T, in []byte) {
		if got, want := sum256(in), sha256.Sum256(in); got != want {
			t.Fatalf("sum256(%q) = %x, crypto/sha256 says %x", in, got, want)
		}
	})
}
