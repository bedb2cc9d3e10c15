// Package libnbd declares what CDI's VDDK import source (pkg/importer/vddk-datasource_amd64.go) names of libnbd's
// Go bindings, so that CDI's importer compiles without cgo. Nothing here talks NBD: Create fails, so a VDDK import
// in this build fails loudly at its first step. Written for Ferry's lab, not copied from libnbd.
package libnbd

import "errors"

// CmdFlag is a command flag (libnbd's LIBNBD_CMD_FLAG_*).
type CmdFlag uint32

// The flag and extent states CDI names, with libnbd's values.
const (
	CMD_FLAG_REQ_ONE = CmdFlag(0x08)

	STATE_HOLE = uint32(0x01)
	STATE_ZERO = uint32(0x02)
)

// ErrNotBuilt is what every call returns.
var ErrNotBuilt = errors.New("libnbd is not built into this cdi-importer (the lab's build has no VDDK source)")

// LibnbdError is the error type libnbd's calls return.
type LibnbdError struct {
	Op     string
	Errmsg string
}

func (e *LibnbdError) Error() string { return e.Op + ": " + e.Errmsg }

// Libnbd is a handle; none can be made here.
type Libnbd struct{}

// PreadOptargs are Pread's optional arguments.
type PreadOptargs struct {
	FlagsSet bool
	Flags    CmdFlag
}

// BlockStatusOptargs are BlockStatus's optional arguments.
type BlockStatusOptargs struct {
	FlagsSet bool
	Flags    CmdFlag
}

// ExtentCallback receives one metacontext's extents: pairs of length and state.
type ExtentCallback func(metacontext string, offset uint64, entries []uint32, err *int) int

// Create always fails: see ErrNotBuilt.
func Create() (*Libnbd, error) { return nil, ErrNotBuilt }

func (h *Libnbd) AddMetaContext(name string) error { return ErrNotBuilt }

func (h *Libnbd) ConnectUri(uri string) error { return ErrNotBuilt }

func (h *Libnbd) GetSize() (uint64, error) { return 0, ErrNotBuilt }

func (h *Libnbd) Pread(buf []byte, offset uint64, optargs *PreadOptargs) error { return ErrNotBuilt }

func (h *Libnbd) BlockStatus(count uint64, offset uint64, extent ExtentCallback, optargs *BlockStatusOptargs) error {
	return ErrNotBuilt
}

func (h *Libnbd) Close() *LibnbdError { return nil }
