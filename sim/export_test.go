package sim

// KVEventsSubscribed reports whether some subscriber of s's KV events
// takes topic: a PUB socket drops what it publishes before a subscription
// arrives, so tests wait for it before they make the events they expect.
func KVEventsSubscribed(s *Sim, topic string) bool {
	if s.events == nil {
		return false
	}
	s.events.mu.Lock()
	defer s.events.mu.Unlock()
	for sub := range s.events.subs {
		if sub.subscribed([]byte(topic)) {
			return true
		}
	}
	return false
}
