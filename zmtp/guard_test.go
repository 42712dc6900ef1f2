package zmtp

import (
	"bytes"
	"encoding/binary"
	"strings"
	"testing"
)

// TestGuardFollowsFrames: the guard follows a stream however it is cut
// into reads (here a byte at a time): the greeting, a short frame, a long
// one within the limit, then refuses the header of one over it before its
// last size byte is handed on.
func TestGuardFollowsFrames(t *testing.T) {
	var stream bytes.Buffer
	stream.Write(make([]byte, zmtpGreetingLen))
	stream.Write([]byte{0x04, 5}) // a command of 5 bytes
	stream.WriteString("READY")
	stream.Write([]byte{0x01, 0}) // an empty frame, more to come
	long := binary.BigEndian.AppendUint64([]byte{0x02}, 300)
	stream.Write(long)
	stream.Write(make([]byte, 300))
	ok := stream.Len()
	stream.Write(binary.BigEndian.AppendUint64([]byte{0x02}, 1001))
	g := &guard{max: 1000, greeting: zmtpGreetingLen}
	for i, b := range stream.Bytes() {
		err := g.follow([]byte{b})
		last := i == stream.Len()-1
		if err != nil && !last || err == nil && last {
			t.Fatalf("byte %d of %d (frames end at %d): %v", i, stream.Len(), ok, err)
		}
		if last && !strings.Contains(err.Error(), "1001 bytes") {
			t.Fatalf("refusal %q does not name the size", err)
		}
	}
}

// TestGuardCountsAMessagesFrames: frames within the limit one by one
// are refused once their message passes it; the next message starts
// from nothing.
func TestGuardCountsAMessagesFrames(t *testing.T) {
	g := &guard{max: 1000}
	frame := func(flags byte, n int) []byte { return append([]byte{flags, byte(n)}, make([]byte, n)...) }
	for i := range 3 { // 3 × 250 bytes, the last without MORE: 750 in all
		flags := byte(zmtpMoreFlag)
		if i == 2 {
			flags = 0
		}
		if err := g.follow(frame(flags, 250)); err != nil {
			t.Fatalf("frame %d of a 750-byte message: %v", i+1, err)
		}
	}
	for i := range 4 { // 4 × 250 with MORE: the 4th reaches 1000, within
		if err := g.follow(frame(zmtpMoreFlag, 250)); err != nil {
			t.Fatalf("frame %d of the next message: %v", i+1, err)
		}
	}
	if err := g.follow(frame(0, 1)); err == nil {
		t.Fatal("the byte that takes a message to 1001 passed")
	}
}
