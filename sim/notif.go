package sim

import (
	"errors"
	"strconv"
	"time"

	"github.com/pdplane/pdplane/transfer"
)

// pollNotifs drains the transfer backend's notifications and dispatches
// them: "room:<room>" to the decode room waiting for its KV, "done:<id>" to
// the vLLM prefill's held blocks. It polls only while something waits, and
// sleeps on the kick channel otherwise; it ends with the sim.
func (s *Sim) pollNotifs() {
	t := time.NewTimer(time.Hour)
	t.Stop()
	for {
		if s.decRooms.active.Load() == 0 && s.held.active.Load() == 0 {
			select {
			case <-s.kick:
			case <-s.ctx.Done():
				return
			}
		}
		s.drainNotifs()
		t.Reset(s.cfg.NotifPollInterval)
		select {
		case <-t.C:
		case <-s.kick:
		case <-s.ctx.Done():
			t.Stop()
			return
		}
	}
}

// kickPoller makes the poller drain now (and start polling, if it slept).
func (s *Sim) kickPoller() {
	select {
	case s.kick <- struct{}{}:
	default:
	}
}

func (s *Sim) drainNotifs() {
	st := s.state.Load()
	if st == nil {
		return
	}
	ns, err := st.backend.GetNotifs()
	if err != nil {
		if !errors.Is(err, transfer.ErrClosed) {
			s.log.Warn().Err(err).Msg("get notifications")
		}
		return
	}
	for _, n := range ns {
		kind, id, total, ok := parseNotif(string(n.Msg))
		if !ok {
			s.log.Debug().Str("from", n.Agent).Bytes("msg", n.Msg).Msg("unknown notification")
			continue
		}
		switch kind {
		case notifRoom:
			room, err := strconv.ParseUint(id, 10, 64)
			if err != nil {
				continue
			}
			s.decRooms.notify(room, total)
		case notifDone:
			s.held.done(id, total, s.pool)
		}
	}
}
