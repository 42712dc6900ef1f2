package web_test

import (
	"io"
	"net/http"
	"net/http/httptest"
	"regexp"
	"strings"
	"testing"

	"github.com/pdplane/pdplane/web"
)

func get(t *testing.T, h http.Handler, method, target string, hdr map[string]string) (*http.Response, string) {
	t.Helper()
	req := httptest.NewRequest(method, target, nil)
	for k, v := range hdr {
		req.Header.Set(k, v)
	}
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, req)
	res := rec.Result()
	body, err := io.ReadAll(res.Body)
	if err != nil {
		t.Fatal(err)
	}
	return res, string(body)
}

func TestHandlerServesIndexWithSecurityHeaders(t *testing.T) {
	t.Parallel()
	h := web.Handler()
	res, body := get(t, h, http.MethodGet, "/", nil)
	if res.StatusCode != http.StatusOK {
		t.Fatalf("GET / = %d, want 200", res.StatusCode)
	}
	if got := res.Header.Get("Content-Security-Policy"); got != web.ContentSecurityPolicy {
		t.Errorf("Content-Security-Policy = %q, want %q", got, web.ContentSecurityPolicy)
	}
	for _, directive := range []string{"default-src 'self'", "script-src 'self'", "style-src 'self'", "object-src 'none'", "frame-ancestors 'none'"} {
		if !strings.Contains(web.ContentSecurityPolicy, directive) {
			t.Errorf("policy lacks %q", directive)
		}
	}
	if strings.Contains(web.ContentSecurityPolicy, "unsafe-inline") {
		t.Error("policy allows inline code")
	}
	if got := res.Header.Get("X-Content-Type-Options"); got != "nosniff" {
		t.Errorf("X-Content-Type-Options = %q, want nosniff", got)
	}
	if got := res.Header.Get("Content-Type"); got != "text/html; charset=utf-8" {
		t.Errorf("Content-Type = %q", got)
	}
	if got := res.Header.Get("Cache-Control"); got != "no-cache" {
		t.Errorf("index Cache-Control = %q, want no-cache", got)
	}
	if !strings.Contains(body, "<title>pdplane") {
		t.Errorf("index does not look like the status page:\n%s", body)
	}
	// The page must not carry inline script or style: the policy would
	// block it, so it would be dead code at best.
	for _, bad := range []*regexp.Regexp{
		regexp.MustCompile(`<script(\s[^>]*)?>[^<]`), regexp.MustCompile(`<style`), regexp.MustCompile(`\sstyle=`),
		regexp.MustCompile(`\son[a-z]+=`), regexp.MustCompile(`https?://`),
	} {
		if loc := bad.FindStringIndex(body); loc != nil {
			t.Errorf("index has %q at byte %d", body[loc[0]:loc[1]], loc[0])
		}
	}
}

func TestHandlerServesVersionedAssets(t *testing.T) {
	t.Parallel()
	h := web.Handler()
	_, index := get(t, h, http.MethodGet, "/", nil)
	refs := regexp.MustCompile(`(?:src|href)="(assets/[^"]+)"`).FindAllStringSubmatch(index, -1)
	if len(refs) < 3 {
		t.Fatalf("index references %d assets, want the script, the stylesheet and the icon", len(refs))
	}
	wantType := map[string]string{".js": "text/javascript; charset=utf-8", ".css": "text/css; charset=utf-8", ".svg": "image/svg+xml"}
	for _, ref := range refs {
		url := "/" + strings.ReplaceAll(ref[1], "&amp;", "&")
		res, body := get(t, h, http.MethodGet, url, nil)
		if res.StatusCode != http.StatusOK || body == "" {
			t.Errorf("GET %s = %d with %d bytes", url, res.StatusCode, len(body))
			continue
		}
		ext := url[strings.LastIndex(url, "."):strings.Index(url, "?")]
		if got := res.Header.Get("Content-Type"); got != wantType[ext] {
			t.Errorf("GET %s: Content-Type = %q, want %q", url, got, wantType[ext])
		}
		if got := res.Header.Get("Cache-Control"); !strings.Contains(got, "immutable") {
			t.Errorf("GET %s: Cache-Control = %q, want a long-lived versioned asset", url, got)
		}
		if res.Header.Get("Content-Security-Policy") == "" || res.Header.Get("X-Content-Type-Options") != "nosniff" {
			t.Errorf("GET %s lacks the security headers", url)
		}
		etag := res.Header.Get("ETag")
		if etag == "" {
			t.Errorf("GET %s has no ETag", url)
			continue
		}
		again, _ := get(t, h, http.MethodGet, url, map[string]string{"If-None-Match": etag})
		if again.StatusCode != http.StatusNotModified {
			t.Errorf("GET %s with If-None-Match = %d, want 304", url, again.StatusCode)
		}
	}
	// Without the current version the asset is still served, but must be
	// revalidated: it may be older or newer than what the caller expects.
	res, _ := get(t, h, http.MethodGet, "/assets/app.js?v=old", nil)
	if res.StatusCode != http.StatusOK || res.Header.Get("Cache-Control") != "no-cache" {
		t.Errorf("GET app.js with a stale version = %d, Cache-Control %q", res.StatusCode, res.Header.Get("Cache-Control"))
	}
}

func TestHandlerRefusesUnknownPathsAndMethods(t *testing.T) {
	t.Parallel()
	h := web.Handler()
	for _, tc := range []struct {
		method, target string
		want           int
	}{
		{http.MethodGet, "/assets/nope.js", http.StatusNotFound},
		{http.MethodGet, "/assets/", http.StatusNotFound},
		{http.MethodGet, "/assets/../handler.go", http.StatusNotFound},
		{http.MethodGet, "/index.html", http.StatusNotFound},
		{http.MethodGet, "/favicon.ico", http.StatusNotFound},
		{http.MethodPost, "/", http.StatusMethodNotAllowed},
		{http.MethodDelete, "/assets/app.js", http.StatusMethodNotAllowed},
		{http.MethodHead, "/", http.StatusOK},
	} {
		res, _ := get(t, h, tc.method, tc.target, nil)
		if res.StatusCode != tc.want {
			t.Errorf("%s %s = %d, want %d", tc.method, tc.target, res.StatusCode, tc.want)
		}
		if res.Header.Get("Content-Security-Policy") == "" {
			t.Errorf("%s %s lacks the Content-Security-Policy", tc.method, tc.target)
		}
	}
}
