package cririg

import "testing"

// SkipUnlessExclusive skips a test written for the exclusive-mode VM.
func SkipUnlessExclusive(t testing.TB) {
	t.Helper()
	if NetnsMode() != "exclusive" {
		t.Skip("the exclusive-mode VM's test")
	}
}

// MustNetworkOf is NetworkOf for a test, which fails when handler's network
// cannot be read.
func MustNetworkOf(t testing.TB, handler string) Network {
	t.Helper()
	n, err := NetworkOf(handler)
	if err != nil {
		t.Fatal(err)
	}
	return n
}
