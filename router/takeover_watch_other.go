//go:build !linux

package router

import "errors"

// connWatcher is Linux's (epoll): elsewhere streams are not taken over and
// stay on net/http's connections.
type connWatcher struct{}

func newConnWatcher() (*connWatcher, error) {
	return nil, errors.New("connection takeover needs Linux")
}

func (*connWatcher) add(*takenConn) error { return errors.New("connection takeover needs Linux") }
func (*connWatcher) remove(*takenConn)    {}
func (*connWatcher) stop()                {}
func (*connWatcher) stopped() bool        { return true }
