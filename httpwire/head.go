package httpwire

import (
	"bufio"
	"fmt"
	"net/http"
	"net/textproto"
	"strconv"
	"strings"
	"sync"
)

// An answer's head (status line and header section, RFC 9112 §4 and §5) is
// read here into one string: the header map's keys and values are pieces
// of it, so that a head costs four allocations (the string, the values'
// backing array, the map and the Response) rather than one or two per
// field as net/textproto's reader spends. Its rules are textproto's, with
// two differences that RFC 9112 leaves to a gateway: a field line folded
// onto the next (obs-fold, §5.2) fails the answer (it may instead be
// unfolded; no engine folds), and whitespace between a field name and its
// colon is removed (§5.1: a proxy must).

// headBufs lends the buffers a request's head is written into and an
// answer's head is read into: a connection keeps none, as one held by a
// long stream would keep it for nothing.
var headBufs = sync.Pool{New: func() any { b := make([]byte, 0, 512); return &b }}

// HeadBuf and PutHeadBuf lend and return one; an odd large one (a head
// near maxHead) is not kept.
func HeadBuf() *[]byte { return headBufs.Get().(*[]byte) }

func PutHeadBuf(bp *[]byte, b []byte) {
	if cap(b) <= 64<<10 {
		*bp = b[:0]
		headBufs.Put(bp)
	}
}

// readHead is readHeadInto with a lent buffer.
func readHead(br *bufio.Reader, status bool) (string, error) {
	bp := HeadBuf()
	head, buf, err := readHeadInto(br, *bp, status)
	PutHeadBuf(bp, buf)
	return head, err
}

// readHeadInto reads one head, up to and including its empty line, into
// buf (which it returns, grown) and returns it as a string. A head starts
// with its status line, never empty; a trailer section (§7.1.2) with no
// status line (status false) may be its empty line alone.
func readHeadInto(br *bufio.Reader, buf []byte, status bool) (string, []byte, error) {
	buf = buf[:0]
	lineStart := 0
	for {
		part, err := br.ReadSlice('\n')
		buf = append(buf, part...)
		switch err {
		case nil:
		case bufio.ErrBufferFull:
			continue // a line longer than the buffer: read on (the budget bounds it)
		default:
			return "", buf, unexpectedEOF(err)
		}
		line := buf[lineStart:]
		empty := len(line) == 1 || len(line) == 2 && line[0] == '\r'
		if empty && (lineStart > 0 || !status) { // a head's first line is its status line
			return string(buf), buf, nil
		}
		lineStart = len(buf)
	}
}

// nextLine cuts s's first line, without its CRLF or LF.
func nextLine(s string) (line, rest string) {
	i := strings.IndexByte(s, '\n')
	if i < 0 {
		return s, ""
	}
	line, rest = s[:i], s[i+1:]
	return strings.TrimSuffix(line, "\r"), rest
}

// parseHead parses a head read by readHeadInto.
func parseHead(head string, req *http.Request) (*http.Response, error) {
	line, fields := nextLine(head)
	// status-line = HTTP-version SP status-code SP [ reason-phrase ], with
	// HTTP-version = "HTTP/" DIGIT "." DIGIT, case-sensitive (§2.3); only
	// major version 1 is spoken here.
	proto, status, ok := strings.Cut(line, " ")
	if !ok || len(proto) != len("HTTP/1.1") || !strings.HasPrefix(proto, "HTTP/1.") || !isDigit(proto[7]) {
		return nil, fmt.Errorf("upstream answer: not an HTTP/1.x status line: %.64q", line)
	}
	code, _, _ := strings.Cut(status, " ")
	if len(code) != 3 || !isDigit(code[0]) || !isDigit(code[1]) || !isDigit(code[2]) || code < "100" || code > "599" {
		// RFC 9110 §15: three digits, 100 to 599.
		return nil, fmt.Errorf("upstream answer: malformed status code in %.64q", line)
	}
	n, _ := strconv.Atoi(code)
	hdr, err := parseFields(fields)
	if err != nil {
		return nil, err
	}
	// Not a piece of the head, which a long answer would keep.
	switch proto {
	case "HTTP/1.1":
		proto = "HTTP/1.1"
	case "HTTP/1.0":
		proto = "HTTP/1.0"
	}
	return &http.Response{
		Status:     strings.TrimRight(status, " "),
		StatusCode: n,
		Proto:      proto,
		ProtoMajor: 1,
		ProtoMinor: int(proto[7] - '0'),
		Header:     hdr,
		Request:    req,
	}, nil
}

const maxFieldsHint = 32

// parseFields parses a header section (§5), ending with its empty line.
func parseFields(s string) (http.Header, error) {
	// Sized for the fields at once, up to a bound: a head of a million
	// one-letter lines must not size a map for a million keys.
	lines := min(strings.Count(s, "\n")-1, maxFieldsHint) // the last is the empty line
	h := make(http.Header, max(lines, 0))
	vals := make([]string, max(lines, 0))
	for {
		line, rest := nextLine(s)
		if line == "" {
			return h, nil
		}
		s = rest
		if line[0] == ' ' || line[0] == '\t' {
			return nil, fmt.Errorf("upstream answer: folded header line (obs-fold) %.64q", line)
		}
		name, value, ok := strings.Cut(line, ":")
		name = strings.TrimRight(name, " \t")
		if !ok || name == "" || !validFieldName(name) {
			return nil, fmt.Errorf("upstream answer: malformed header line %.64q", line)
		}
		value = strings.Trim(value, " \t")
		for i := 0; i < len(value); i++ {
			if !validFieldValueByte(value[i]) {
				return nil, fmt.Errorf("upstream answer: malformed header line %.64q", line)
			}
		}
		addField(h, &vals, textproto.CanonicalMIMEHeaderKey(name), value) // the name itself, no copy, when already canonical
	}
}

// addField adds value under key: a new key's value takes the next slot of
// vals, so that a head's values share one array rather than a slice a
// field (vals grows by a slot when a head has more fields than counted).
func addField(h http.Header, vals *[]string, key, value string) {
	if vv, ok := h[key]; ok {
		h[key] = append(vv, value)
		return
	}
	if len(*vals) == 0 {
		*vals = make([]string, 1)
	}
	(*vals)[0] = value
	h[key], *vals = (*vals)[:1:1], (*vals)[1:]
}

// validFieldName: a token (RFC 9110 §5.1, §5.6.2).
func validFieldName(s string) bool {
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case 'a' <= c && c <= 'z', 'A' <= c && c <= 'Z', '0' <= c && c <= '9':
		case strings.IndexByte("!#$%&'*+-.^_`|~", c) >= 0:
		default:
			return false
		}
	}
	return true
}

// validFieldValueByte: field-vchar, SP or HTAB (RFC 9110 §5.5); obs-text
// (bytes 0x80 and up) is allowed. Control bytes, a lone CR among them, and
// DEL are not.
func validFieldValueByte(c byte) bool {
	return c >= 0x20 && c != 0x7f || c == '\t'
}
