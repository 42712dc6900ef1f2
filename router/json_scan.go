package router

import (
	"encoding/binary"
	"encoding/json"
	"strconv"
)

// The router reads request and response bodies without unmarshalling them:
// it validates the JSON in one pass, remembers where each top-level member
// lies, and splices new members into the original bytes. These scanners
// accept exactly what encoding/json.Valid accepts (FuzzScanObject checks it).

// maxJSONDepth matches encoding/json's nesting limit.
const maxJSONDepth = 10000

// jsonSyntaxError says where a body stops being valid JSON.
type jsonSyntaxError struct {
	Offset int
	Msg    string
}

func (e *jsonSyntaxError) Error() string {
	return "invalid JSON at byte " + strconv.Itoa(e.Offset) + ": " + e.Msg
}

func synErr(off int, msg string) error { return &jsonSyntaxError{Offset: off, Msg: msg} }

// jsonMember is one member of a JSON object. Offsets index the scanned
// buffer: the member runs from its key's opening quote to the end of its
// value.
type jsonMember struct {
	key      []byte // the key, unescaped; shares the buffer when it had no escapes
	start    int    // the key's opening quote
	valStart int
	end      int // just past the value
}

func (m *jsonMember) value(b []byte) []byte { return b[m.valStart:m.end] }

func isWS(c byte) bool { return c == ' ' || c == '\t' || c == '\n' || c == '\r' }

func skipWS(b []byte, i int) int {
	for i < len(b) && isWS(b[i]) {
		i++
	}
	return i
}

// scanTopObject validates b as one JSON object (with optional surrounding
// whitespace) and appends its members to ms.
func scanTopObject(b []byte, ms []jsonMember) ([]jsonMember, error) {
	i := skipWS(b, 0)
	if i >= len(b) {
		return ms, synErr(i, "empty body")
	}
	if b[i] != '{' {
		if _, err := scanValue(b, i, 0); err != nil {
			return ms, err
		}
		return ms, synErr(i, "body is not a JSON object")
	}
	end, ms, err := scanObjectMembers(b, i, 1, ms, true)
	if err != nil {
		return ms, err
	}
	if j := skipWS(b, end); j != len(b) {
		return ms, synErr(j, "data after the top-level value")
	}
	return ms, nil
}

// scanObjectMembers validates the object opening at b[i] and, when record is
// set, appends its members to ms; it returns the index just past the closing
// brace.
func scanObjectMembers(b []byte, i, depth int, ms []jsonMember, record bool) (int, []jsonMember, error) {
	if depth > maxJSONDepth {
		return i, ms, synErr(i, "nesting too deep")
	}
	j := skipWS(b, i+1)
	if j < len(b) && b[j] == '}' {
		return j + 1, ms, nil
	}
	for {
		if j >= len(b) {
			return j, ms, synErr(j, "unexpected end in object")
		}
		if b[j] != '"' {
			return j, ms, synErr(j, "expected a member name")
		}
		ks := j
		ke, escaped, err := scanString(b, j)
		if err != nil {
			return ke, ms, err
		}
		j = skipWS(b, ke)
		if j >= len(b) || b[j] != ':' {
			return j, ms, synErr(j, "expected ':' after member name")
		}
		vs := skipWS(b, j+1)
		ve, err := scanValue(b, vs, depth)
		if err != nil {
			return ve, ms, err
		}
		if record {
			key := b[ks+1 : ke-1]
			if escaped {
				key = unescapeString(b[ks:ke])
			}
			ms = append(ms, jsonMember{key: key, start: ks, valStart: vs, end: ve})
		}
		j = skipWS(b, ve)
		if j >= len(b) {
			return j, ms, synErr(j, "unexpected end in object")
		}
		switch b[j] {
		case ',':
			j = skipWS(b, j+1)
		case '}':
			return j + 1, ms, nil
		default:
			return j, ms, synErr(j, "expected ',' or '}' in object")
		}
	}
}

// scanValue validates the value starting at b[i] and returns the index just
// past it.
func scanValue(b []byte, i, depth int) (int, error) {
	if i >= len(b) {
		return i, synErr(i, "unexpected end, expected a value")
	}
	switch c := b[i]; {
	case c == '"':
		end, _, err := scanString(b, i)
		return end, err
	case c == '{':
		return scanObject(b, i, depth+1)
	case c == '[':
		return scanArray(b, i, depth+1, nil)
	case c == 't':
		return scanLiteral(b, i, "true")
	case c == 'f':
		return scanLiteral(b, i, "false")
	case c == 'n':
		return scanLiteral(b, i, "null")
	case c == '-' || (c >= '0' && c <= '9'):
		return scanNumber(b, i)
	}
	return i, synErr(i, "unexpected character")
}

// scanObject validates an object without recording its members.
func scanObject(b []byte, i, depth int) (int, error) {
	end, _, err := scanObjectMembers(b, i, depth, nil, false)
	return end, err
}

// span is a [start, end) range of a buffer.
type span struct{ start, end int }

// scanArray validates the array opening at b[i]; when elems is not nil it
// receives each element's span.
func scanArray(b []byte, i, depth int, elems *[]span) (int, error) {
	if depth > maxJSONDepth {
		return i, synErr(i, "nesting too deep")
	}
	j := skipWS(b, i+1)
	if j < len(b) && b[j] == ']' {
		return j + 1, nil
	}
	for {
		ve, err := scanValue(b, j, depth)
		if err != nil {
			return ve, err
		}
		if elems != nil {
			*elems = append(*elems, span{j, ve})
		}
		j = skipWS(b, ve)
		if j >= len(b) {
			return j, synErr(j, "unexpected end in array")
		}
		switch b[j] {
		case ',':
			j = skipWS(b, j+1)
		case ']':
			return j + 1, nil
		default:
			return j, synErr(j, "expected ',' or ']' in array")
		}
	}
}

func scanLiteral(b []byte, i int, lit string) (int, error) {
	if len(b)-i < len(lit) || string(b[i:i+len(lit)]) != lit {
		return i, synErr(i, "invalid literal")
	}
	return i + len(lit), nil
}

func isDigit(c byte) bool { return c >= '0' && c <= '9' }

func scanNumber(b []byte, i int) (int, error) {
	j := i
	if b[j] == '-' {
		j++
	}
	switch {
	case j < len(b) && b[j] == '0':
		j++
	case j < len(b) && b[j] >= '1' && b[j] <= '9':
		for j < len(b) && isDigit(b[j]) {
			j++
		}
	default:
		return j, synErr(j, "invalid number")
	}
	if j < len(b) && b[j] == '.' {
		j++
		if j >= len(b) || !isDigit(b[j]) {
			return j, synErr(j, "invalid number: digit expected after '.'")
		}
		for j < len(b) && isDigit(b[j]) {
			j++
		}
	}
	if j < len(b) && (b[j] == 'e' || b[j] == 'E') {
		j++
		if j < len(b) && (b[j] == '+' || b[j] == '-') {
			j++
		}
		if j >= len(b) || !isDigit(b[j]) {
			return j, synErr(j, "invalid number: digit expected in exponent")
		}
		for j < len(b) && isDigit(b[j]) {
			j++
		}
	}
	return j, nil
}

// SWAR constants: eight bytes at a time, looking for '"', '\\' or a control
// character, the only bytes that end a run of plain string content.
const (
	swarOnes  = 0x0101010101010101
	swarHighs = 0x8080808080808080
	swarQuote = 0x2222222222222222 // '"'
	swarBack  = 0x5c5c5c5c5c5c5c5c // '\\'
	swarCtl   = 0x2020202020202020 // bytes below 0x20
)

// scanString validates the string opening at b[i] and returns the index just
// past its closing quote and whether it holds escapes.
func scanString(b []byte, i int) (int, bool, error) {
	j := i + 1
	escaped := false
	for {
		for j+8 <= len(b) {
			x := binary.LittleEndian.Uint64(b[j:])
			q := x ^ swarQuote
			s := x ^ swarBack
			if ((q-swarOnes)&^q|(s-swarOnes)&^s|(x-swarCtl)&^x)&swarHighs != 0 {
				break
			}
			j += 8
		}
		if j >= len(b) {
			return j, escaped, synErr(j, "unterminated string")
		}
		c := b[j]
		switch {
		case c == '"':
			return j + 1, escaped, nil
		case c == '\\':
			escaped = true
			j++
			if j >= len(b) {
				return j, escaped, synErr(j, "unterminated string")
			}
			switch b[j] {
			case '"', '\\', '/', 'b', 'f', 'n', 'r', 't':
				j++
			case 'u':
				if len(b)-j < 5 {
					return j, escaped, synErr(j, "short \\u escape")
				}
				for k := 1; k <= 4; k++ {
					if !isHex(b[j+k]) {
						return j + k, escaped, synErr(j+k, "invalid \\u escape")
					}
				}
				j += 5
			default:
				return j, escaped, synErr(j, "invalid escape")
			}
		case c < 0x20:
			return j, escaped, synErr(j, "control character in string")
		default:
			j++
		}
	}
}

func isHex(c byte) bool {
	return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F')
}

// unescapeString decodes a validated JSON string literal (quotes included).
func unescapeString(lit []byte) []byte {
	var s string
	if err := json.Unmarshal(lit, &s); err != nil {
		return lit // unreachable for a validated literal
	}
	return []byte(s)
}

// stringValue returns the content of a validated string literal, unescaped,
// and false when raw is not a string.
func stringValue(raw []byte) (string, bool) {
	if len(raw) < 2 || raw[0] != '"' {
		return "", false
	}
	inner := raw[1 : len(raw)-1]
	for _, c := range inner {
		if c == '\\' {
			return string(unescapeString(raw)), true
		}
	}
	return string(inner), true
}

// find returns the last member with the key (JSON parsers keep the last of
// duplicate keys), or nil.
func find(ms []jsonMember, key string) *jsonMember {
	for i := len(ms) - 1; i >= 0; i-- {
		if string(ms[i].key) == key {
			return &ms[i]
		}
	}
	return nil
}

// scanObjectAt parses the members of an already validated object value that
// opens at b[i], with offsets into b.
func scanObjectAt(b []byte, i int, ms []jsonMember) ([]jsonMember, error) {
	if i >= len(b) || b[i] != '{' {
		return ms, synErr(i, "not an object")
	}
	_, ms, err := scanObjectMembers(b, i, 1, ms, true)
	return ms, err
}

// arrayElems returns the element spans of the array value opening at b[i].
func arrayElems(b []byte, i int, elems []span) ([]span, error) {
	if i >= len(b) || b[i] != '[' {
		return elems, synErr(i, "not an array")
	}
	_, err := scanArray(b, i, 1, &elems)
	return elems, err
}
