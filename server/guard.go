package server

import (
	"mime"
	"net"
	"net/http"
	"net/url"
	"slices"
	"strings"

	"github.com/go-chi/chi/v5"
	"github.com/pdplane/pdplane/httpwire"
)

// Problem types of the request guards.
const (
	ProblemForbiddenOrigin  = problemBase + "cross-origin"
	ProblemUnsupportedMedia = problemBase + "unsupported-media-type"
	ProblemMisdirected      = problemBase + "misdirected-request"
	ProblemMethodNotAllowed = problemBase + "method-not-allowed"
)

// probeMethods are the methods tried when an Allow header is built.
var probeMethods = []string{
	http.MethodGet, http.MethodHead, http.MethodPost, http.MethodPut,
	http.MethodPatch, http.MethodDelete, http.MethodOptions,
}

// isWrite reports whether a method changes state.
func isWrite(method string) bool {
	switch method {
	case http.MethodGet, http.MethodHead, http.MethodOptions, http.MethodTrace:
		return false
	}
	return true
}

func isAPI(r *http.Request) bool { return strings.HasPrefix(r.URL.Path, "/api/") }

// checkHost refuses a Host header that is not in Config.AllowedHosts, so
// that a browser page whose own name was rebound to this server's address
// (DNS rebinding) reaches nothing. It answers 421 Misdirected Request: this
// server is not the one for that authority, which is the truth from the
// client's side, and 403 would suggest a credential could help.
//
// An open control plane (no tokens) that listens on loopback only
// (Config.Loopback) serves only loopback names (loopbackHosts, and any
// loopback IP) besides AllowedHosts: there a rebound name is all a page
// would need to read every registration with its secrets.
func (s *Server) checkHost(next http.Handler) http.Handler {
	loopback := s.open() && s.cfg.Loopback
	if len(s.cfg.AllowedHosts) == 0 && !loopback {
		return next
	}
	allowed := s.cfg.AllowedHosts
	if loopback {
		allowed = append(slices.Clone(loopbackHosts), allowed...)
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !hostAllowed(allowed, r.Host) && !(loopback && loopbackIP(r.Host)) {
			s.metrics.rejected.WithLabelValues(rejectHost).Inc()
			writeProblem(w, &Problem{Type: ProblemMisdirected, Title: "Misdirected request", Status: http.StatusMisdirectedRequest,
				Detail: "host " + quoteHost(r.Host) + " is not served here (see --allowed-hosts)", Field: "Host"})
			return
		}
		next.ServeHTTP(w, r)
	})
}

// loopbackHosts are the names an open control plane on loopback answers
// to, with any port.
var loopbackHosts = []string{"localhost", "127.0.0.1", "::1"}

// loopbackIP reports whether the Host header is a loopback IP literal
// (127.0.0.0/8, ::1), with or without a port.
func loopbackIP(hostport string) bool {
	host := hostport
	if h, _, err := net.SplitHostPort(hostport); err == nil {
		host = h
	}
	ip := net.ParseIP(strings.Trim(host, "[]"))
	return ip != nil && ip.IsLoopback()
}

// hostAllowed matches a Host header against entries that are either a bare
// host (any port) or host:port (that port only), case-insensitively.
func hostAllowed(allowed []string, hostport string) bool {
	hostport = strings.ToLower(strings.TrimSuffix(hostport, "."))
	host := hostport
	if h, _, err := net.SplitHostPort(hostport); err == nil {
		host = h
	}
	host = strings.TrimSuffix(strings.Trim(host, "[]"), ".")
	for _, a := range allowed {
		a = strings.ToLower(a)
		if _, _, err := net.SplitHostPort(a); err == nil {
			if a == hostport {
				return true
			}
			continue
		}
		if strings.Trim(a, "[]") == host {
			return true
		}
	}
	return false
}

// quoteHost keeps a hostile Host header from spilling into the detail.
func quoteHost(h string) string {
	if len(h) > 256 {
		h = h[:256] + "…"
	}
	return `"` + strings.ToValidUTF8(h, "�") + `"`
}

// isGeneration reports whether r is for the router's OpenAI and SGLang
// routes, which spend the fleet's GPUs.
func isGeneration(r *http.Request) bool {
	return strings.HasPrefix(r.URL.Path, "/v1/") || r.URL.Path == "/generate"
}

// crossSite reports whether a browser says r comes from a page of another
// origin: Sec-Fetch-Site other than same-origin or none (a link typed or
// bookmarked), or, from a browser that does not send it, an Origin that is
// not the Host. A client that is not a browser sends neither.
func crossSite(r *http.Request) bool {
	switch r.Header.Get("Sec-Fetch-Site") {
	case "same-origin", "none":
		return false
	case "":
	default: // cross-site, same-site (another port of localhost is one)
		return true
	}
	origin := r.Header.Get("Origin")
	if origin == "" {
		return false
	}
	u, err := url.Parse(origin)
	return err != nil || u.Host == "" || !strings.EqualFold(u.Host, r.Host)
}

// guardCrossSite refuses requests a page of another origin makes a browser
// send, when they carry no Authorization (a page cannot add one without a
// preflight this server never grants): on the generation routes always,
// since a text/plain or form POST needs no preflight and spends the
// fleet's GPUs as a chat completion does; on every route when the control
// plane is open (no tokens), where nothing else stands between such a page
// and the registry. A top-level navigation by GET (a link to the status
// page) reads nothing back to the page and is let through.
func (s *Server) guardCrossSite(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("Authorization") != "" || !(s.open() || isGeneration(r)) || !crossSite(r) ||
			(r.Method == http.MethodGet || r.Method == http.MethodHead) && r.Header.Get("Sec-Fetch-Mode") == "navigate" {
			next.ServeHTTP(w, r)
			return
		}
		s.metrics.rejected.WithLabelValues(rejectCrossOrigin).Inc()
		const detail = "a request from a page of another origin is refused here unless it carries an Authorization header"
		switch {
		case isAPI(r):
			writeProblem(w, &Problem{Type: ProblemForbiddenOrigin, Title: "Cross-origin request refused", Status: http.StatusForbidden,
				Detail: detail, Field: "Origin"})
		case isGeneration(r):
			// The OpenAI error format of these routes (router/api_error.go).
			w.Header().Set("Content-Type", "application/json")
			w.Header().Set("X-Content-Type-Options", "nosniff")
			w.WriteHeader(http.StatusForbidden)
			_, _ = w.Write([]byte(`{"error":{"message":"` + detail + `","type":"invalid_request_error","param":"Origin","code":"cross_origin"}}` + "\n"))
		default:
			w.Header().Set("X-Content-Type-Options", "nosniff")
			http.Error(w, detail, http.StatusForbidden)
		}
	})
}

// guardWrites protects the control plane's writes from browsers on other
// origins. A page elsewhere can make the browser send a "simple" POST (a
// text/plain or form body, no preflight) with no token configured or with
// ambient credentials, so writes on /api/* are refused when the browser says
// they are cross-origin (Sec-Fetch-Site, or an Origin whose host is not the
// Host header: http.CrossOriginProtection's rules), and a write with a body
// must declare it as JSON, which no cross-origin page can do without a
// preflight that this server never grants. Clients that are not browsers
// send neither header and are unaffected.
func (s *Server) guardWrites(next http.Handler) http.Handler {
	cop := http.NewCrossOriginProtection()
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !isAPI(r) || !isWrite(r.Method) {
			next.ServeHTTP(w, r)
			return
		}
		if err := cop.Check(r); err != nil {
			s.metrics.rejected.WithLabelValues(rejectCrossOrigin).Inc()
			writeProblem(w, &Problem{Type: ProblemForbiddenOrigin, Title: "Cross-origin write refused", Status: http.StatusForbidden,
				Detail: "writes must come from this server's own origin or from a client that is not a browser", Field: "Origin"})
			return
		}
		if httpwire.HasBody(r) {
			if !isJSONMediaType(r.Header.Get("Content-Type")) {
				s.metrics.rejected.WithLabelValues(rejectMediaType).Inc()
				w.Header().Set("Accept-Post", "application/json")
				writeProblem(w, &Problem{Type: ProblemUnsupportedMedia, Title: "Unsupported media type", Status: http.StatusUnsupportedMediaType,
					Detail: "the request body must be sent as Content-Type: application/json", Field: "Content-Type"})
				return
			}
		}
		next.ServeHTTP(w, r)
	})
}

// refuseTrace answers TRACE (and CONNECT, which this server never proxies)
// with 405 before routing: echoing a request back serves only attacks on
// the headers it carries.
func (s *Server) refuseTrace(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodTrace || r.Method == http.MethodConnect {
			s.methodNotAllowed(w, r)
			return
		}
		next.ServeHTTP(w, r)
	})
}

// methodNotAllowed answers 405 with the Allow header listing the methods
// the path does serve; problem+json on /api/*. chi's own 405 lists them, but
// a custom handler does not receive the list, so it is found by asking the
// router about each method.
func (s *Server) methodNotAllowed(w http.ResponseWriter, r *http.Request) {
	var allow []string
	for _, m := range probeMethods {
		if s.mux.Match(chi.NewRouteContext(), m, r.URL.Path) {
			allow = append(allow, m)
		}
	}
	w.Header().Set("Allow", strings.Join(allow, ", "))
	detail := r.Method + " is not served on " + r.URL.Path
	if len(allow) > 0 {
		detail += "; allowed: " + strings.Join(allow, ", ")
	}
	if isAPI(r) {
		writeProblem(w, &Problem{Type: ProblemMethodNotAllowed, Title: "Method not allowed", Status: http.StatusMethodNotAllowed, Detail: detail})
		return
	}
	w.Header().Set("X-Content-Type-Options", "nosniff")
	http.Error(w, detail, http.StatusMethodNotAllowed)
}

// isJSONMediaType says whether a Content-Type names application/json, with
// or without parameters (RFC 9110 §8.3.1); the plain form, which nearly
// every client sends, is known without parsing.
func isJSONMediaType(ct string) bool {
	if ct == "application/json" {
		return true
	}
	mt, _, err := mime.ParseMediaType(ct)
	return err == nil && mt == "application/json"
}
