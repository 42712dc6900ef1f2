//go:build !linux

package httpwire

import "errors"

// Watcher is Linux's (epoll): elsewhere streams are not taken over and
// stay on net/http's connections.
type Watcher struct{}

func NewWatcher() (*Watcher, error) {
	return nil, errors.New("connection takeover needs Linux")
}

func (*Watcher) add(*Stream) error { return errors.New("connection takeover needs Linux") }
func (*Watcher) remove(*Stream)    {}
func (*Watcher) Stop()             {}
func (*Watcher) stopped() bool     { return true }
