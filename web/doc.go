// Package web is pdplane's status page: the page an on-call engineer opens
// first. It serves plain HTML, CSS and JavaScript embedded from assets/ (no
// build step, no CDN, nothing fetched from elsewhere), and the page itself
// reads only what the control plane already publishes: the REST API under
// /api/v1, its event stream, and /metrics.
//
// The package owns the assets and the handler that serves them with a strict
// Content-Security-Policy (no inline script or style), so data rendered on
// the page (peer names, labels, error texts) can never run as code. It must
// not reach into the registry or the router: everything it shows comes over
// HTTP, exactly as an operator's own tools would see it.
package web
