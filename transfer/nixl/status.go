package nixl

import (
	"errors"
	"fmt"
)

// Status is a nixl_capi_status_t: what every C API call returns.
type Status int32

// Statuses of the C API. 1.5.x returns the first seven; the others are
// defined by newer releases, which map each NIXL error to its own code.
const (
	StatusSuccess          Status = 0
	StatusInProgress       Status = 1
	StatusInvalidParam     Status = -1
	StatusBackend          Status = -2
	StatusInvalidState     Status = -3
	StatusException        Status = -4
	StatusNoTelemetry      Status = -5
	StatusNotFound         Status = -6
	StatusNotPosted        Status = -7
	StatusMismatch         Status = -8
	StatusNotAllowed       Status = -9
	StatusRepostActive     Status = -10
	StatusUnknown          Status = -11
	StatusNotSupported     Status = -12
	StatusRemoteDisconnect Status = -13
	StatusCanceled         Status = -14
)

// Sentinels for the status classes; *StatusError matches them with
// errors.Is.
var (
	ErrInvalidParam     = errors.New("nixl: invalid parameter")
	ErrBackend          = errors.New("nixl: backend error")
	ErrInvalidState     = errors.New("nixl: invalid state")
	ErrException        = errors.New("nixl: exception")
	ErrNoTelemetry      = errors.New("nixl: no telemetry")
	ErrNotFound         = errors.New("nixl: not found")
	ErrNotPosted        = errors.New("nixl: not posted")
	ErrMismatch         = errors.New("nixl: mismatch")
	ErrNotAllowed       = errors.New("nixl: not allowed")
	ErrRepostActive     = errors.New("nixl: repost of an active request")
	ErrUnknown          = errors.New("nixl: unknown error")
	ErrNotSupported     = errors.New("nixl: not supported")
	ErrRemoteDisconnect = errors.New("nixl: remote disconnected")
	ErrCanceled         = errors.New("nixl: canceled")
	// ErrUnexpectedStatus matches statuses this package does not know.
	ErrUnexpectedStatus = errors.New("nixl: unexpected status")
)

// sentinel returns the class of an error status, or nil.
func sentinel(s Status) error {
	switch s {
	case StatusInvalidParam:
		return ErrInvalidParam
	case StatusBackend:
		return ErrBackend
	case StatusInvalidState:
		return ErrInvalidState
	case StatusException:
		return ErrException
	case StatusNoTelemetry:
		return ErrNoTelemetry
	case StatusNotFound:
		return ErrNotFound
	case StatusNotPosted:
		return ErrNotPosted
	case StatusMismatch:
		return ErrMismatch
	case StatusNotAllowed:
		return ErrNotAllowed
	case StatusRepostActive:
		return ErrRepostActive
	case StatusUnknown:
		return ErrUnknown
	case StatusNotSupported:
		return ErrNotSupported
	case StatusRemoteDisconnect:
		return ErrRemoteDisconnect
	case StatusCanceled:
		return ErrCanceled
	}
	return nil
}

// String names the status.
func (s Status) String() string {
	switch s {
	case StatusSuccess:
		return "success"
	case StatusInProgress:
		return "in progress"
	}
	if e := sentinel(s); e != nil {
		return e.Error()[len("nixl: "):]
	}
	return fmt.Sprintf("status %d", int32(s))
}

// StatusError is a C API call that returned an error status.
type StatusError struct {
	Func   string // the C function, e.g. "nixl_capi_create_xfer_req"
	Status Status // what it returned
}

// Error names the function and the status.
func (e *StatusError) Error() string {
	return fmt.Sprintf("%s: %s (%d)", e.Func, e.Status, int32(e.Status))
}

// Unwrap returns the sentinel of the status class, so errors.Is(err,
// ErrNotFound) works.
func (e *StatusError) Unwrap() error {
	if s := sentinel(e.Status); s != nil {
		return s
	}
	return ErrUnexpectedStatus
}

// check turns a status into an error; success and in-progress are not
// errors.
func check(fn string, s Status) error {
	if s == StatusSuccess || s == StatusInProgress {
		return nil
	}
	return &StatusError{Func: fn, Status: s}
}
