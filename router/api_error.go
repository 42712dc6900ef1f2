package router

import (
	"net/http"
	"strconv"
)

// Codes of the errors the router itself answers with. They are stable: clients
// and dashboards may match on them.
const (
	codeInvalidAPIKey   = "invalid_api_key"
	codeModelNotFound   = "model_not_found"
	codeModelRequired   = "model_required"
	codeBodyTooLarge    = "request_too_large"
	codeNoRoute         = "no_route"
	codeUpstreamError   = "upstream_error"
	codeUpstreamTimeout = "upstream_timeout"
	codeOverloaded      = "upstream_overloaded"
	codeStreamBroken    = "upstream_stream_error"
	codeUnsupported     = "unsupported_route"
	codeRouterBusy      = "router_busy"
	codeBodyTimeout     = "request_timeout"
)

func (e *apiError) Error() string { return e.Message }

// appendJSON writes the error as OpenAI does: {"error": {...}}.
func (e *apiError) appendJSON(b []byte) []byte {
	b = append(b, `{"error":{"message":`...)
	b = strconv.AppendQuote(b, e.Message)
	b = append(b, `,"type":`...)
	b = strconv.AppendQuote(b, e.Type)
	b = append(b, `,"param":`...)
	if e.Param == "" {
		b = append(b, "null"...)
	} else {
		b = strconv.AppendQuote(b, e.Param)
	}
	b = append(b, `,"code":`...)
	if e.Code == "" {
		b = append(b, "null"...)
	} else {
		b = strconv.AppendQuote(b, e.Code)
	}
	return append(b, "}}"...)
}

// write sends the error as the whole response.
func (e *apiError) write(w http.ResponseWriter) {
	h := w.Header()
	h.Set("Content-Type", "application/json")
	h.Set("Cache-Control", "no-store")
	w.WriteHeader(e.Status)
	_, _ = w.Write(e.appendJSON(make([]byte, 0, 160+len(e.Message))))
}

// sseEvent renders the error as the SSE event that ends a stream which
// already sent its first byte.
func (e *apiError) sseEvent() []byte {
	b := append(make([]byte, 0, 200), "data: "...)
	b = e.appendJSON(b)
	return append(b, "\n\n"...)
}

func serverError(status int, msg, code string) *apiError {
	return &apiError{Status: status, Message: msg, Type: "server_error", Code: code}
}
