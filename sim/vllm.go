package sim

import (
	"context"
	"errors"
	"fmt"
	"net/http"

	"github.com/pdplane/pdplane/pdproto"
	"github.com/pdplane/pdplane/registry"
	"github.com/pdplane/pdplane/transfer"
)

// vLLM's PD protocol (NixlConnector). The router first sends the prefill
// the request with max_tokens=1 and kv_transfer_params.do_remote_decode; the
// prefill computes the prompt's KV, holds those blocks, and answers one
// token with kv_transfer_params naming its engine, blocks, side-channel
// address and request id. The router sends the decode the original request
// with those params; the decode fetches the prefill's agent from the side
// channel, READs the blocks into its own pages (NIXL's pull model) with the
// notification "done:<request id>" that tells the prefill to free them,
// verifies the bytes and generates.

// vllmPrefill serves a prefill.
func (s *Sim) vllmPrefill(ctx context.Context, q *genRequest) (*answer, func(), *httpError) {
	kv := q.kv
	if kv == nil || !kv.DoRemoteDecode {
		return s.local(ctx, q)
	}
	st := s.state.Load()
	prompt := q.prompts[0]
	seeds := promptSeeds(prompt)
	t, e := s.waitTurn(ctx, prompt)
	if e != nil {
		return nil, nil, e
	}
	pages, ok := s.pool.alloc(s.pool.pagesFor(len(prompt)))
	if !ok {
		t.done()
		return nil, nil, errPoolFull
	}
	if e := s.compute(ctx, t, prompt, seeds, pages); e != nil {
		s.pool.release(pages)
		return nil, nil, e
	}
	id := q.rid + "-" + s.nextID()
	s.held.hold(id, pages, s.pool, s.cfg.RoomTimeout, func() {
		s.counters.roomTimeouts.Add(1)
		s.log.Warn().Str("request", id).Msg("held blocks timed out before a decode read them")
	})
	s.kickPoller()
	engine, host, port, cached := st.name, s.host, s.bootstrapPort, 0
	ans := &answer{
		seqs: []seq{newSeq(prompt, seeds, 1, "length")},
		kv: &pdproto.KVTransferParams{
			DoRemotePrefill: true, DoRemoteDecode: false,
			RemoteEngineID: &engine, RemoteBlockIDs: [][]int{append([]int(nil), pages...)},
			RemoteHost: &host, RemotePort: &port, RemoteRequestID: id, TPSize: 1, DCPSize: 1, PPSize: 1,
			RemoteNumTokens: len(prompt), TransferMode: "pull", RemotePrefillCachedTokens: &cached,
		},
	}
	return ans, nil, nil
}

// vllmCheck refuses a request whose kv_transfer_params this engine cannot
// serve, before anything is accepted.
func (s *Sim) vllmCheck(q *genRequest) *httpError {
	if q.model != s.cfg.Model {
		// OpenAIServing._check_model (vllm/entrypoints/openai/engine/serving.py).
		return &httpError{status: http.StatusNotFound, typ: "NotFoundError", param: "model",
			msg: fmt.Sprintf("The model `%s` does not exist. Valid aliases: %s.", q.model, s.cfg.Model)}
	}
	if limit := s.maxModelLen(); len(q.prompts) > 0 && len(q.prompts[0]) > limit {
		// The renderer's context-length check, before anything is
		// scheduled or streamed (vllm/renderers, "maximum context length").
		n := len(q.prompts[0])
		return &httpError{status: http.StatusBadRequest, typ: "BadRequestError", param: "input_tokens",
			msg: fmt.Sprintf("This model's maximum context length is %d tokens. However, your prompt contains at least %d input tokens, "+
				"which exceeds this limit even without any output tokens. Please reduce the length of the input prompt. (parameter=input_tokens, value=%d)",
				limit, n, n)}
	}
	kv := q.kv
	if s.cfg.Role == registry.RolePrefill {
		if kv == nil || !kv.DoRemoteDecode {
			return nil
		}
		switch {
		case kv.DoRemotePrefill:
			return badRequestErr(badf("kv_transfer_params.do_remote_prefill", "a prefill cannot take a remote prefill's KV"))
		case q.stream:
			return badRequestErr(badf("stream", "a prefill with do_remote_decode answers non-streamed"))
		case q.batch || len(q.prompts) != 1:
			return badRequestErr(badf("prompt", "a PD request carries one prompt"))
		}
		return nil
	}
	if kv == nil || !kv.DoRemotePrefill {
		if kv != nil && kv.DoRemoteDecode {
			return badRequestErr(badf("kv_transfer_params.do_remote_decode", "this engine is a decode"))
		}
		return nil
	}
	switch {
	case kv.RemoteEngineID == nil || *kv.RemoteEngineID == "":
		return badRequestErr(badf("kv_transfer_params.remote_engine_id", "is required"))
	case kv.RemoteHost == nil || *kv.RemoteHost == "":
		return badRequestErr(badf("kv_transfer_params.remote_host", "is required"))
	case kv.RemotePort == nil || *kv.RemotePort < 1 || *kv.RemotePort > 65535:
		return badRequestErr(badf("kv_transfer_params.remote_port", "is required"))
	case kv.RemoteRequestID == "":
		return badRequestErr(badf("kv_transfer_params.remote_request_id", "is required"))
	case q.batch || len(q.prompts) != 1:
		return badRequestErr(badf("prompt", "a PD request carries one prompt"))
	}
	if len(kv.RemoteBlockIDs) != 1 {
		return badRequestErr(badf("kv_transfer_params.remote_block_ids", "%d KV cache groups, want 1", len(kv.RemoteBlockIDs)))
	}
	if n := s.pool.pagesFor(len(q.prompts[0])); len(kv.RemoteBlockIDs[0]) != n {
		return badRequestErr(badf("kv_transfer_params.remote_block_ids", "%d blocks for a prompt of %d tokens (%d pages)", len(kv.RemoteBlockIDs[0]), len(q.prompts[0]), n))
	}
	return nil
}

// vllmDecode serves a decode.
func (s *Sim) vllmDecode(ctx context.Context, q *genRequest) (*answer, func(), *httpError) {
	kv := q.kv
	if kv == nil || !kv.DoRemotePrefill {
		return s.local(ctx, q)
	}
	prompt := q.prompts[0]
	if s.Fault() == FaultRecompute {
		s.counters.transferErrors.Add(1)
		s.releaseBlocks(*kv.RemoteHost, *kv.RemotePort, kv.RemoteRequestID)
		return s.local(ctx, q)
	}
	seeds := promptSeeds(prompt)
	n := s.pool.pagesFor(len(prompt))
	s.queued.Add(1)
	defer s.queued.Add(-1)
	info, err := s.fetchAgent(ctx, *kv.RemoteHost, *kv.RemotePort, *kv.RemoteEngineID)
	if err != nil {
		if ctx.Err() != nil {
			return nil, nil, errCancelled
		}
		s.counters.transferErrors.Add(1)
		return nil, nil, kvLoadFailed(err)
	}
	st := s.state.Load()
	pages, ok := s.pool.alloc(n)
	if !ok {
		return nil, nil, errPoolFull
	}
	release := func() { s.pool.release(pages) }
	if !s.cfg.CheapTransfer {
		s.pool.poison(pages)
	}
	moved := s.movedPages(pages, kv.RemoteBlockIDs[0])
	if err := s.readKV(ctx, st, &info, moved.SrcPages, moved.DstPages, notifDone+kv.RemoteRequestID); err != nil {
		release()
		s.releaseBlocks(*kv.RemoteHost, *kv.RemotePort, kv.RemoteRequestID)
		if ctx.Err() != nil {
			return nil, nil, errCancelled
		}
		var mk *transfer.MissingMemKindError
		if errors.As(err, &mk) {
			// Reported to the agent as what it is; answered in vLLM's
			// words, which never carry SGLang's message.
			return nil, nil, kvLoadFailed(s.transferFailed(s.PeerID() != "", s.PeerID(), st.name, err).cause)
		}
		if errors.Is(err, transfer.ErrUnknownAgent) || errors.Is(err, transfer.ErrStranger) || errors.Is(err, transfer.ErrPeerGone) {
			s.sides.forget(info.EngineID)
		}
		s.counters.transferErrors.Add(1)
		return nil, nil, kvLoadFailed(err)
	}
	s.counters.transfers.Add(1)
	s.counters.promptTransferred.Add(int64(len(prompt)))
	s.counters.bytesMoved.Add(int64(len(moved.SrcPages) * s.pool.itemLen * s.pool.regions))
	if err := s.verifyKV(seeds, pages); err != nil {
		release()
		return nil, nil, err
	}
	return &answer{seqs: []seq{q.seqFor(prompt, seeds, q.maxTokens)}}, release, nil
}

// kvLoadFailed is how vLLM answers a request whose KV could not be loaded
// (a failed NIXL handshake or READ) under kv_load_failure_policy=fail: the
// request finishes with an error, which the OpenAI server turns into
// "Internal server error" (500, or an error event once streaming). Under
// kv_load_failure_policy=recompute the decode would compute the prompt
// itself and hide the failure: FaultRecompute.
func kvLoadFailed(cause error) *httpError {
	return abortErr(pdproto.VLLMGenerationError, cause)
}

// readKV READs the prefill's blocks into pages, each READ carrying notif
// (with its part suffix on the mixed-segments path). It returns only once no
// transfer uses pages any more.
func (s *Sim) readKV(ctx context.Context, st *agentState, info *agentInfo, pages, blocks []int, notif string) error {
	p := info.peer()
	r, release, err := st.reads.Acquire(p)
	if err != nil {
		return fmt.Errorf("load prefill %s: %w", info.AgentName, err)
	}
	defer release()
	plan, err := transfer.BuildPlan(st.source, r.Dest, transfer.Pages{SrcPages: pages, DstPages: blocks}, notif)
	if err != nil {
		return fmt.Errorf("plan READ from %s: %w", info.AgentName, err)
	}
	reqs := make([]transfer.Request, 0, len(plan.Steps))
	var errs []error
	for _, stp := range plan.Steps {
		if stp.List >= len(r.Prepared) {
			errs = append(errs, fmt.Errorf("step for list %d of %d prepared: %w", stp.List, len(r.Prepared), transfer.ErrInvalidDescs))
			break
		}
		req, err := r.Prepared[stp.List].Post(ctx, transfer.OpRead, stp.LocalIdx, stp.DstIdx, []byte(stp.Notif))
		if err != nil {
			errs = append(errs, fmt.Errorf("READ from %s: %w", info.AgentName, err))
			break
		}
		reqs = append(reqs, req)
	}
	for _, req := range reqs {
		if err := req.Wait(ctx); err != nil {
			errs = append(errs, fmt.Errorf("READ from %s: %w", info.AgentName, err))
		}
	}
	return errors.Join(errs...)
}
