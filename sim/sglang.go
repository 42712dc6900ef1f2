package sim

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"strconv"
	"time"

	"github.com/pdplane/pdplane/pdproto"
	"github.com/pdplane/pdplane/transfer"
)

// SGLang's PD protocol. The router POSTs the same body, carrying the
// prefill's bootstrap address and a room, to the prefill and the decode at
// once. The decode allocates pages for the prompt and sends them to the
// prefill's rank over SGLang's bootstrap plane (sglang_wire.go); the
// prefill computes the prompt's KV, WRITEs it into those pages with SGLang's
// KV notification tag and answers the router; the decode waits for the
// notification, verifies the bytes and generates.

// sglangPrefill serves a prefill: every prompt of the request computed and
// sent to the decode of its room; the answer is one token per prompt, with
// the prompt's logprobs when asked.
func (s *Sim) sglangPrefill(ctx context.Context, q *genRequest) (*answer, func(), *httpError) {
	st := s.state.Load()
	ans := &answer{seqs: make([]seq, len(q.prompts))}
	e := runAll(len(q.prompts), func(i int) *httpError {
		seeds := promptSeeds(q.prompts[i])
		if e := s.prefillRoom(ctx, st, q.rid, q.prompts[i], seeds, q.bootstrap[i]); e != nil {
			return e
		}
		sq := newSeq(q.prompts[i], seeds, 1, "length")
		sq.inputLogprobs = true
		ans.seqs[i] = sq
		return nil
	})
	if e != nil {
		return nil, nil, e
	}
	return ans, nil, nil
}

// prefillRoom computes one prompt into fresh pages, waits for the room's
// decode and sends the pages to it. The pages are freed only after the
// transfer is over, whatever happens to the request meanwhile. Its failures
// are SGLang's aborts, in SGLang's words.
func (s *Sim) prefillRoom(ctx context.Context, st *agentState, rid string, prompt []int, seeds []uint64, bs bootstrap) *httpError {
	transferFailed := func(exception string, cause error) *httpError {
		return abortErr(pdproto.SGLangPrefillTransferFailed(0, rid, bs.room, exception), cause)
	}
	if bs.host == FakeBootstrapHost {
		return nil
	}
	t, e := s.waitTurn(ctx, prompt)
	if e != nil {
		s.preRooms.fail(bs.room)
		return e
	}
	pages, ok := s.pool.alloc(s.pool.pagesFor(len(prompt)))
	if !ok {
		t.done()
		s.preRooms.fail(bs.room)
		return errPoolFull
	}
	defer s.pool.release(pages)
	if e := s.compute(ctx, t, prompt, seeds, pages); e != nil {
		s.preRooms.fail(bs.room)
		return e
	}
	s.queued.Add(1)
	dst, err := s.preRooms.waitDecode(ctx, bs.room, s.cfg.RoomTimeout)
	s.queued.Add(-1)
	if err == nil && s.Fault() == FaultStallTransfer {
		<-ctx.Done() // the transfer never makes progress; only the client ends it
		s.preRooms.fail(bs.room)
		return errCancelled
	}
	switch {
	case err == nil:
	case ctx.Err() != nil:
		return errCancelled
	case errors.Is(err, errRoomTimeout):
		s.counters.roomTimeouts.Add(1)
		return abortErr(pdproto.SGLangPrefillBootstrapFailed(0, rid, bs.room,
			fmt.Sprintf("Request %d timed out after %s: no decode joined the room", bs.room, s.cfg.RoomTimeout)), err)
	default:
		return transferFailed("the decode left the room", err)
	}
	a, ok := s.decodes.get(dst.AgentName)
	if !ok {
		// SGLang: a KeyError in the transfer worker; the decode is not told.
		err := errors.New("unknown decode agent " + dst.AgentName + ": its KV args never came")
		return transferFailed(err.Error(), err)
	}
	done := make(chan error, 1)
	err = st.worker.Submit(transfer.Job{
		Peer:  a.peer(),
		Pages: s.movedPages(pages, dst.Pages),
		Notif: sglangKVNotif(bs.room),
		Room:  bs.room,
		Done:  func(err error) { done <- err },
	})
	if err != nil {
		// The worker refused the job (full, or closed by a
		// re-registration): nothing about the decode is known to be wrong.
		if errors.Is(err, transfer.ErrQueueFull) {
			return &httpError{status: http.StatusServiceUnavailable, msg: "KV transfer queue full", typ: "ServiceUnavailable", cause: err}
		}
		return transferFailed("the KV transfer worker is unavailable", err)
	}
	if err = <-done; err != nil {
		// A decode whose agent was replaced meanwhile is not reported: its
		// old agent is gone, and reporting it would only undo the healing.
		e := s.transferFailed(s.decodes.current(a.endpointKey(), a.AgentName), "", a.AgentName, err)
		e.msg = pdproto.SGLangPrefillTransferFailed(0, rid, bs.room, e.msg)
		return e
	}
	s.counters.transfers.Add(1)
	s.counters.bytesMoved.Add(int64(len(s.movedPages(pages, dst.Pages).SrcPages) * s.pool.itemLen * s.pool.regions))
	return nil
}

// sglangDecode serves a decode: for every prompt, pages allocated and
// posted to the room's prefill, the KV awaited and verified; then the
// generation. The pages stay held until the answer is written.
func (s *Sim) sglangDecode(ctx context.Context, q *genRequest) (*answer, func(), *httpError) {
	releases := make([]func(), len(q.prompts))
	release := func() {
		for _, r := range releases {
			if r != nil {
				r()
			}
		}
	}
	ans := &answer{seqs: make([]seq, len(q.prompts))}
	e := runAll(len(q.prompts), func(i int) *httpError {
		seeds := promptSeeds(q.prompts[i])
		rel, e := s.decodeRoom(ctx, s.stateFor(q.bootstrap[i].port), q.rid, seeds, q.bootstrap[i])
		releases[i] = rel
		if e != nil {
			return e
		}
		ans.seqs[i] = q.seqFor(q.prompts[i], seeds, q.maxTokens)
		return nil
	})
	if e != nil {
		release()
		return nil, nil, e
	}
	return ans, release, nil
}

// decodeRoom gets one prompt's KV through room bs.room and verifies it; the
// returned release frees the room's pages (once the prefill is done with
// them too). Like SGLang's NIXL decode, which only polls for its KV's
// notifications, it is not told when its prefill failed: it waits out the
// room timeout (SGLANG_DISAGGREGATION_WAITING_TIMEOUT, 300 s in SGLang)
// and aborts with SGLang's "Decode transfer failed" message.
func (s *Sim) decodeRoom(ctx context.Context, st *agentState, rid string, seeds []uint64, bs bootstrap) (func(), *httpError) {
	if bs.host == FakeBootstrapHost {
		return nil, nil // SGLang fakes the transfer for health probes
	}
	pages, ok := s.pool.alloc(s.pool.pagesFor(len(seeds)))
	if !ok {
		return nil, errPoolFull
	}
	if !s.cfg.CheapTransfer {
		s.pool.poison(pages)
	}
	room, ok := s.decRooms.add(bs.room, pages)
	if !ok {
		s.pool.release(pages)
		return nil, badRequestErr(badf("bootstrap_room", "room %d is already in use on this decode", bs.room))
	}
	release := func() { s.decRooms.release(room, s.pool) }
	s.kickPoller()
	s.bg.Go(func() {
		defer s.decRooms.release(room, s.pool)
		if err := s.exchangeRoom(st, bs, room); err != nil {
			room.settle(err)
			return
		}
		// The prefill may WRITE into the pages until its own room timeout
		// and transfer timeout have passed: they are not handed to another
		// request before the KV came or that time is over.
		tm := time.NewTimer(s.cfg.RoomTimeout + s.cfg.TransferTimeout + time.Second)
		defer tm.Stop()
		select {
		case <-room.notified:
		case <-tm.C:
		case <-s.ctx.Done():
		}
	})
	s.queued.Add(1)
	err := room.wait(ctx, s.cfg.RoomTimeout)
	s.queued.Add(-1)
	if err != nil {
		switch {
		case ctx.Err() != nil:
			return release, errCancelled
		case errors.Is(err, errRoomTimeout):
			s.counters.roomTimeouts.Add(1)
			return release, abortErr(pdproto.SGLangDecodeTransferFailed(0, rid, bs.room,
				fmt.Sprintf("KVTransferError(bootstrap_room=%d): Request %d timed out after %s waiting for its KV", bs.room, bs.room, s.cfg.RoomTimeout)), err)
		default:
			return release, abortErr(pdproto.SGLangDecodeTransferFailed(0, rid, bs.room, "KVTransferError(bootstrap_room="+
				strconv.FormatUint(bs.room, 10)+"): "+err.Error()), err)
		}
	}
	if err := s.verifyKV(seeds, pages); err != nil {
		return release, err
	}
	s.counters.transfers.Add(1)
	s.counters.received(net.JoinHostPort(bs.host, strconv.Itoa(bs.port)))
	s.counters.bytesMoved.Add(int64(len(s.movedPages(pages, pages).SrcPages) * s.pool.itemLen * s.pool.regions))
	return release, nil
}
