package router

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"
	"unicode/utf8"
)

func TestScanTopObject(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		in   string
		keys []string
		ok   bool
	}{
		{"empty object", `{}`, nil, true},
		{"members", ` {"a":1, "b" : [true,false,null], "c":{"d":"e"}} `, []string{"a", "b", "c"}, true},
		{"escaped key", `{"m\u006fdel":"x"}`, []string{"model"}, true},
		{"numbers", `{"a":-0.5e+10,"b":0,"c":12.25E-3}`, []string{"a", "b", "c"}, true},
		{"long string", `{"a":"` + strings.Repeat("abcdefgh", 100) + `\"q\"\\"}`, []string{"a"}, true},
		{"unicode", `{"a":"héllo wörld ✓"}`, []string{"a"}, true},
		{"not object", `[1,2]`, nil, false},
		{"empty", ``, nil, false},
		{"trailing", `{} x`, nil, false},
		{"trailing comma", `{"a":1,}`, nil, false},
		{"leading zero", `{"a":01}`, nil, false},
		{"bad escape", `{"a":"\x"}`, nil, false},
		{"control char", "{\"a\":\"x\ny\"}", nil, false},
		{"unterminated", `{"a":"abc`, nil, false},
		{"bad literal", `{"a":tru}`, nil, false},
		{"missing colon", `{"a" 1}`, nil, false},
		{"dot no digit", `{"a":1.}`, nil, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			ms, err := scanTopObject([]byte(tt.in), nil)
			if (err == nil) != tt.ok {
				t.Fatalf("err = %v, want ok=%t", err, tt.ok)
			}
			if !tt.ok {
				return
			}
			var keys []string
			for _, m := range ms {
				keys = append(keys, string(m.key))
			}
			if strings.Join(keys, ",") != strings.Join(tt.keys, ",") {
				t.Fatalf("keys = %v, want %v", keys, tt.keys)
			}
		})
	}
}

func TestScanDepth(t *testing.T) {
	t.Parallel()
	deep := `{"a":` + strings.Repeat("[", maxJSONDepth-1) + strings.Repeat("]", maxJSONDepth-1) + `}`
	if _, err := scanTopObject([]byte(deep), nil); err != nil || !json.Valid([]byte(deep)) {
		t.Fatalf("depth %d: err=%v valid=%t", maxJSONDepth, err, json.Valid([]byte(deep)))
	}
	tooDeep := `{"a":` + strings.Repeat("[", maxJSONDepth) + strings.Repeat("]", maxJSONDepth) + `}`
	if _, err := scanTopObject([]byte(tooDeep), nil); err == nil || json.Valid([]byte(tooDeep)) {
		t.Fatalf("depth %d: err=%v valid=%t", maxJSONDepth+1, err, json.Valid([]byte(tooDeep)))
	}
}

// FuzzScanObject checks that the scanner accepts exactly what encoding/json
// accepts, and finds the same members with the same values.
func FuzzScanObject(f *testing.F) {
	for _, s := range []string{
		`{}`, `{"model":"m","messages":[{"role":"user","content":"hi"}],"stream":true}`,
		`{"a":"\ud83d\ude00","b":1e5,"c":[{},[]]}`, `{"text":["a","b"],"sampling_params":{"n":2}}`,
		`[1]`, `{"a":1,"a":2}`, "{\"a\":\"\xff\"}", `{"a":"x\u0000"}`, `  {"k" : null }  `,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		ms, err := scanTopObject(b, nil)
		valid := json.Valid(b)
		isObj := valid && bytes.HasPrefix(bytes.TrimLeft(b, " \t\r\n"), []byte("{"))
		if (err == nil) != isObj {
			t.Fatalf("scan err=%v, json.Valid=%t object=%t for %q", err, valid, isObj, b)
		}
		if err != nil {
			return
		}
		var want map[string]json.RawMessage
		if err := json.Unmarshal(b, &want); err != nil {
			t.Fatalf("unmarshal: %v", err)
		}
		got := map[string]json.RawMessage{}
		for _, m := range ms {
			got[validUTF8(m.key)] = m.value(b) // last duplicate wins, as in encoding/json
		}
		if len(got) != len(want) {
			t.Fatalf("members %d, want %d", len(got), len(want))
		}
		for k, v := range want {
			g, ok := got[k]
			if !ok {
				t.Fatalf("missing key %q", k)
			}
			var a, c bytes.Buffer
			_ = json.Compact(&a, g)
			_ = json.Compact(&c, v)
			if !bytes.Equal(a.Bytes(), c.Bytes()) {
				t.Fatalf("key %q: value %s, want %s", k, g, v)
			}
		}
	})
}

// validUTF8 replaces each invalid byte with U+FFFD, as encoding/json does
// (engines written in Python refuse such keys; the router only reads ASCII
// ones).
func validUTF8(b []byte) string {
	var sb strings.Builder
	for len(b) > 0 {
		r, n := utf8.DecodeRune(b)
		if r == utf8.RuneError && n == 1 {
			sb.WriteRune(utf8.RuneError)
		} else {
			sb.Write(b[:n])
		}
		b = b[n:]
	}
	return sb.String()
}

func BenchmarkScanTopObject(b *testing.B) {
	body := []byte(`{"model":"m","stream":true,"max_tokens":128,"messages":[{"role":"system","content":"` +
		strings.Repeat("You are a helpful assistant. ", 1000) + `"},{"role":"user","content":"hello"}]}`)
	b.SetBytes(int64(len(body)))
	ms := make([]jsonMember, 0, 16)
	for b.Loop() {
		var err error
		if ms, err = scanTopObject(body, ms[:0]); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkJSONValid(b *testing.B) {
	body := []byte(`{"model":"m","stream":true,"max_tokens":128,"messages":[{"role":"system","content":"` +
		strings.Repeat("You are a helpful assistant. ", 1000) + `"},{"role":"user","content":"hello"}]}`)
	b.SetBytes(int64(len(body)))
	for b.Loop() {
		if !json.Valid(body) {
			b.Fatal("invalid")
		}
	}
}
