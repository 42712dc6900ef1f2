package router

import (
	"context"
	"net/http"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"
)

// tracerScope names the router's tracer.
const tracerScope = "github.com/pdplane/pdplane/router"

// logTraceID is the log field linking a request line to its trace.
const logTraceID = "trace_id"

// Span attribute keys. Standard HTTP names where OpenTelemetry's semantic
// conventions have one; pdplane.* for the router's own.
const (
	attrHTTPMethod   = attribute.Key("http.request.method")
	attrHTTPRoute    = attribute.Key("http.route")
	attrHTTPStatus   = attribute.Key("http.response.status_code")
	attrURLFull      = attribute.Key("url.full")
	attrBodySize     = attribute.Key("http.response.body.size")
	attrRequestID    = attribute.Key("pdplane.request_id")
	attrModel        = attribute.Key("pdplane.model")
	attrOutcome      = attribute.Key("pdplane.outcome")
	attrAttempts     = attribute.Key("pdplane.attempts")
	attrAttempt      = attribute.Key("pdplane.attempt")
	attrRetry        = attribute.Key("pdplane.retry")
	attrRetryAfter   = attribute.Key("pdplane.retry.after_failure")
	attrEngine       = attribute.Key("pdplane.engine")
	attrPrefill      = attribute.Key("pdplane.prefill")
	attrDecode       = attribute.Key("pdplane.decode")
	attrPair         = attribute.Key("pdplane.pair")
	attrLeg          = attribute.Key("pdplane.leg")
	attrPeerID       = attribute.Key("pdplane.peer.id")
	attrPeerName     = attribute.Key("pdplane.peer.name")
	attrGeneration   = attribute.Key("pdplane.peer.generation")
	attrFailure      = attribute.Key("pdplane.failure")
	attrFailureLeg   = attribute.Key("pdplane.failure.leg")
	attrCancelled    = attribute.Key("pdplane.cancelled")
	attrAnswerKept   = attribute.Key("pdplane.answer.bytes_kept")
	spanNameAttempt  = "attempt"
	spanNamePrefix   = "POST "
	traceparentField = "Traceparent"
	tracestateField  = "Tracestate"
)

// traceContext is W3C Trace Context: traceparent and tracestate, which
// SGLang and vLLM read from a request's headers when their own tracing is
// on, so that their spans join the router's trace. SGLang (--enable-trace
// --otlp-traces-endpoint): TokenizerManager._trace_request_start in
// python/sglang/srt/managers/tokenizer_manager.py passes
// extract_trace_headers(request.headers) to trace_req_start as the
// request's external_trace_header. vLLM (--otlp-traces-endpoint): the
// OpenAI server reads them with extract_trace_headers in vllm/tracing.py
// and starts its llm_request span under extract_trace_context's parent.
var traceContext propagation.TraceContext

// startSpan opens the request's server span, continuing the client's trace
// when its request carries a traceparent. Only called with tracing on.
func (d *dispatch) startSpan() {
	ctx := traceContext.Extract(d.r.Context(), propagation.HeaderCarrier(d.r.Header))
	d.tctx, d.span = d.rt.tracer.Start(ctx, spanNamePrefix+d.route.path(), trace.WithSpanKind(trace.SpanKindServer),
		trace.WithAttributes(attrHTTPMethod.String(http.MethodPost), attrHTTPRoute.String(d.route.path()), attrRequestID.String(d.rid)))
}

// endSpan closes the request's span with what became of it.
func (d *dispatch) endSpan() {
	s := d.span
	model := ""
	if d.q != nil {
		model = d.q.model
	}
	s.SetAttributes(attrHTTPStatus.Int(d.status), attrOutcome.String(d.outcome), attrModel.String(model),
		attrAttempts.Int(d.attempts), attrPrefill.String(d.prefill), attrDecode.String(d.decode))
	if d.status >= http.StatusInternalServerError {
		s.SetStatus(codes.Error, d.outcome)
	}
	s.End()
}

// traceID is the request's trace ID for its log lines; "" with tracing off.
func (d *dispatch) traceID() string {
	if d.span == nil {
		return ""
	}
	return d.span.SpanContext().TraceID().String()
}

// startAttempt opens the span of one attempt on pr, a child of the
// request's; a retry's says which failure it follows.
func (d *dispatch) startAttempt(attempt int, pr *pair) {
	if d.span == nil {
		return
	}
	attrs := []attribute.KeyValue{attrAttempt.Int(attempt), attrRetry.Bool(attempt > 1),
		attrEngine.String(string(pr.p.ep.protocol)), attrPair.String(pr.p.peer.Name + "/" + pr.d.peer.Name),
		attrPrefill.String(pr.p.peer.Name), attrDecode.String(pr.d.peer.Name), attrModel.String(d.q.model)}
	if d.lastFail != nil {
		attrs = append(attrs, attrRetryAfter.String(d.lastFail.kind.String()))
	}
	_, d.attemptSpan = d.rt.tracer.Start(d.tctx, spanNameAttempt, trace.WithAttributes(attrs...))
}

// endAttempt closes the attempt's span, recording its failure.
func (d *dispatch) endAttempt(f *failure) {
	if d.attemptSpan == nil {
		return
	}
	if f != nil {
		setFailure(d.attemptSpan, f)
	}
	d.attemptSpan.End()
}

// setFailure records f on span.
func setFailure(span trace.Span, f *failure) {
	span.SetAttributes(attrFailure.String(f.kind.String()), attrFailureLeg.String(f.leg.String()))
	if f.status != 0 {
		span.SetAttributes(attrHTTPStatus.Int(f.status))
	}
	if f.kind == failClientGone {
		return
	}
	if f.err != nil {
		span.RecordError(f.err)
	}
	span.SetStatus(codes.Error, f.kind.String())
}

// injectSpan puts the trace context of ctx (the leg's span) into an engine
// request's headers.
func injectSpan(ctx context.Context, h http.Header) {
	traceContext.Inject(ctx, propagation.HeaderCarrier(h))
}

// passedTrace is the client's own traceparent and tracestate, passed on
// unchanged to engines with tracing off ("" when absent).
func (d *dispatch) passedTrace() (tp, ts string) {
	if tp = d.r.Header.Get(traceparentField); tp != "" {
		ts = d.r.Header.Get(tracestateField)
	}
	return tp, ts
}

// spanContext is the attempt's span context, for the registry reports the
// attempt causes; invalid with tracing off.
func (d *dispatch) spanContext() trace.SpanContext {
	if d.attemptSpan == nil {
		return trace.SpanContext{}
	}
	return d.attemptSpan.SpanContext()
}
