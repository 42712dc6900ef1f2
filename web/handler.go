package web

import (
	"bytes"
	"crypto/sha256"
	"embed"
	"encoding/hex"
	"fmt"
	"html/template"
	"io/fs"
	"mime"
	"net/http"
	"path"
	"strings"
	"time"
)

//go:embed assets
var assets embed.FS

// ContentSecurityPolicy is sent with every response. It forbids inline
// script and style and every origin but the page's own, so markup that
// slipped into the page through data could neither run nor load anything.
const ContentSecurityPolicy = "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; " +
	"connect-src 'self'; object-src 'none'; base-uri 'none'; frame-ancestors 'none'"

// Cache lifetimes. The page itself is revalidated on every load (it is
// small, and it names the current assets); assets are requested under a
// content hash, so a versioned URL never changes meaning and can be kept.
const (
	cachePage      = "no-cache"
	cacheVersioned = "public, max-age=31536000, immutable"
)

// Handler returns the status page: index.html at / and its assets under
// /assets/. Only GET and HEAD are served; anything else under the handler is
// 404. It is meant to be mounted at the root of the server, after the API,
// /metrics and the health endpoints.
func Handler() http.Handler {
	h, err := newHandler(assets)
	if err != nil {
		// The assets are compiled in; a failure here is a bug in this
		// package, caught by its tests, never a run-time condition.
		panic(fmt.Sprintf("web: %v", err))
	}
	return h
}

// file is one asset, read once at start.
type file struct {
	body        []byte
	contentType string
	hash        string // hex prefix of the SHA-256 of body
}

type handler struct {
	index  file
	assets map[string]file // by URL path, "/assets/app.js"
}

func newHandler(fsys fs.FS) (*handler, error) {
	h := &handler{assets: map[string]file{}}
	err := fs.WalkDir(fsys, "assets", func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() || p == "assets/index.html" {
			return err
		}
		body, err := fs.ReadFile(fsys, p)
		if err != nil {
			return err
		}
		h.assets["/"+p] = newFile(body, contentType(p))
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("read assets: %w", err)
	}
	src, err := fs.ReadFile(fsys, "assets/index.html")
	if err != nil {
		return nil, fmt.Errorf("read index: %w", err)
	}
	// Asset references in index.html carry the asset's hash, so a browser
	// may cache them for good and still never runs an old script against a
	// new page.
	tmpl, err := template.New("index").Funcs(template.FuncMap{
		"asset": func(name string) (string, error) {
			f, ok := h.assets["/assets/"+name]
			if !ok {
				return "", fmt.Errorf("index.html names a missing asset %q", name)
			}
			return "assets/" + name + "?v=" + f.hash, nil
		},
	}).Parse(string(src))
	if err != nil {
		return nil, fmt.Errorf("parse index: %w", err)
	}
	var buf bytes.Buffer
	if err := tmpl.Execute(&buf, nil); err != nil {
		return nil, fmt.Errorf("render index: %w", err)
	}
	h.index = newFile(buf.Bytes(), "text/html; charset=utf-8")
	return h, nil
}

func newFile(body []byte, ctype string) file {
	sum := sha256.Sum256(body)
	return file{body: body, contentType: ctype, hash: hex.EncodeToString(sum[:8])}
}

// contentType is fixed here for the kinds of files the page uses, so it does
// not depend on the host's MIME tables (nosniff makes a wrong one fatal).
func contentType(name string) string {
	switch path.Ext(name) {
	case ".js":
		return "text/javascript; charset=utf-8"
	case ".css":
		return "text/css; charset=utf-8"
	case ".svg":
		return "image/svg+xml"
	case ".html":
		return "text/html; charset=utf-8"
	}
	if t := mime.TypeByExtension(path.Ext(name)); t != "" {
		return t
	}
	return "application/octet-stream"
}

func (h *handler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	hdr := w.Header()
	hdr.Set("Content-Security-Policy", ContentSecurityPolicy)
	hdr.Set("X-Content-Type-Options", "nosniff")
	hdr.Set("Referrer-Policy", "no-referrer")
	hdr.Set("X-Frame-Options", "DENY")

	var f file
	cache := cachePage
	switch p := r.URL.Path; {
	case p == "/":
		f = h.index
	case strings.HasPrefix(p, "/assets/"):
		a, ok := h.assets[p]
		if !ok {
			http.NotFound(w, r)
			return
		}
		f = a
		if r.URL.Query().Get("v") == a.hash {
			cache = cacheVersioned
		}
	default:
		http.NotFound(w, r)
		return
	}
	if r.Method != http.MethodGet && r.Method != http.MethodHead {
		hdr.Set("Allow", "GET, HEAD")
		http.Error(w, "method not allowed", http.StatusMethodNotAllowed)
		return
	}
	hdr.Set("Content-Type", f.contentType)
	hdr.Set("Cache-Control", cache)
	hdr.Set("ETag", `"`+f.hash+`"`)
	// ServeContent answers If-None-Match with 304 and handles HEAD and
	// ranges; the zero modification time leaves Last-Modified out.
	http.ServeContent(w, r, "", time.Time{}, bytes.NewReader(f.body))
}
