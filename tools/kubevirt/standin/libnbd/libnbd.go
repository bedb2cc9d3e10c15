// Package libnbd declares what KubeVirt's NBD client (pkg/storage/nbdclient, the changed-block export virt-launcher
// serves for backups) names of libnbd's Go bindings, so that virt-launcher compiles without them: the module proxy
// here refuses libguestfs.org/libnbd. Nothing here talks NBD: Create fails, so a backup's block map or read in this
// build fails loudly at its first step. Written for Ferry's lab, not copied from libnbd.
package libnbd

import "errors"

// The metadata contexts and extent states KubeVirt names, with libnbd's values.
const (
	CONTEXT_BASE_ALLOCATION   = "base:allocation"
	CONTEXT_QEMU_DIRTY_BITMAP = "qemu:dirty-bitmap:"

	STATE_HOLE  = uint32(0x01)
	STATE_ZERO  = uint32(0x02)
	STATE_DIRTY = uint32(0x01)
)

// ErrNotBuilt is what every call returns.
var ErrNotBuilt = errors.New("libnbd is not built into this virt-launcher (the lab's build has no NBD client)")

// LibnbdError is the error type libnbd's calls return.
type LibnbdError struct {
	Op     string
	Errmsg string
}

func (e *LibnbdError) Error() string { return e.Op + ": " + e.Errmsg }

// LibnbdExtent is one extent of a 64-bit block status reply.
type LibnbdExtent struct {
	Length uint64
	Flags  uint64
}

// Libnbd is a handle; none can be made here.
type Libnbd struct{}

// PreadOptargs are Pread's optional arguments.
type PreadOptargs struct{}

// BlockStatus64Optargs are BlockStatus64's optional arguments.
type BlockStatus64Optargs struct{}

// Extent64Callback receives one metacontext's extents.
type Extent64Callback func(metacontext string, offset uint64, entries []LibnbdExtent, err *int) int

// Create always fails: see ErrNotBuilt.
func Create() (*Libnbd, error) { return nil, ErrNotBuilt }

func (h *Libnbd) AddMetaContext(name string) error { return ErrNotBuilt }

func (h *Libnbd) CanMetaContext(name string) (bool, error) { return false, ErrNotBuilt }

func (h *Libnbd) SetExportName(name string) error { return ErrNotBuilt }

func (h *Libnbd) ConnectUnix(path string) error { return ErrNotBuilt }

func (h *Libnbd) GetSize() (uint64, error) { return 0, ErrNotBuilt }

func (h *Libnbd) Pread(buf []byte, offset uint64, optargs *PreadOptargs) error { return ErrNotBuilt }

func (h *Libnbd) BlockStatus64(count uint64, offset uint64, extent Extent64Callback, optargs *BlockStatus64Optargs) error {
	return ErrNotBuilt
}

func (h *Libnbd) Close() *LibnbdError { return nil }
