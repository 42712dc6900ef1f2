package pgstore

import "testing"

func TestParseUUID(t *testing.T) {
	var b [16]byte
	if err := parseUUID("0E4f5c1a-1111-4222-8333-44445555666f", &b); err != nil {
		t.Fatal(err)
	}
	want := [16]byte{0x0e, 0x4f, 0x5c, 0x1a, 0x11, 0x11, 0x42, 0x22, 0x83, 0x33, 0x44, 0x44, 0x55, 0x55, 0x66, 0x6f}
	if b != want {
		t.Fatalf("parsed %x, want %x", b, want)
	}
	for _, bad := range []string{"", "0e4f5c1a11114222833344445555666f", "0e4f5c1a-1111-4222-8333-44445555666g",
		"0e4f5c1a-1111-4222-8333_44445555666f", "0e4f5c1a-1111-4222-8333-44445555666f0"} {
		if err := parseUUID(bad, &b); err == nil {
			t.Errorf("parseUUID(%q) accepted", bad)
		}
	}
}
