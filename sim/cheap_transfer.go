package sim

import "github.com/pdplane/pdplane/transfer"

// movedPages is what one request's transfer moves from src to dst pages:
// all of them, or only the first under Config.CheapTransfer, which keeps
// the transfer and its notification but not the byte volume.
func (s *Sim) movedPages(src, dst []int) transfer.Pages {
	if s.cfg.CheapTransfer {
		src, dst = src[:min(len(src), 1)], dst[:min(len(dst), 1)]
	}
	return transfer.Pages{SrcPages: src, DstPages: dst}
}

// verifyKV checks that pages hold the prompt's KV (nothing to check under
// Config.CheapTransfer, where none was computed) and counts a mismatch.
func (s *Sim) verifyKV(seeds []uint64, pages []int) *httpError {
	if s.cfg.CheapTransfer {
		return nil
	}
	if err := s.pool.verify(seeds, pages); err != nil {
		s.counters.verifyFailures.Add(1)
		return abortErr("KV cache verification failed: the received KV does not match the prompt", err)
	}
	return nil
}
